//! Reading an attachment's pinned maps, for `status`, `stats` and the checks of an update.
//! (Writes go through [`crate::policy::PolicyTable`], which keeps the policy generation.)

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray};
use shaper_common::maps::{
    Config, Counters, Ipv4Key, Ipv6Key, PerCpuSum as _, SourceState, sum_per_cpu,
};

use crate::{
    pins::Attachment,
    upgrade::{self, UpgradeError},
};

#[derive(Debug, thiserror::Error)]
pub enum PinnedMapError {
    #[error("cannot open pinned map {path}")]
    Open { path: String, source: MapError },
    #[error("cannot read pinned map {path}")]
    Read { path: String, source: MapError },
    #[error(transparent)]
    Layout(#[from] UpgradeError),
}

fn open(path: &Path) -> Result<Map, PinnedMapError> {
    let data = MapData::from_pin(path).map_err(|source| PinnedMapError::Open {
        path: path.display().to_string(),
        source,
    })?;
    Map::from_map_data(data).map_err(|source| PinnedMapError::Open {
        path: path.display().to_string(),
        source,
    })
}

fn read_err(path: &Path) -> impl FnOnce(MapError) -> PinnedMapError + '_ {
    move |source| PinnedMapError::Read {
        path: path.display().to_string(),
        source,
    }
}

/// The attachment's policy entry; refused unless its pins have this shaper's layout.
pub fn read_config(at: &Attachment) -> Result<Config, PinnedMapError> {
    upgrade::require_current(at)?;
    let path = at.config();
    let array: Array<MapData, Config> = Array::try_from(open(&path)?).map_err(read_err(&path))?;
    array.get(&0, 0).map_err(read_err(&path))
}

/// The global counters, summed over CPUs, with what upgrades carried over from earlier
/// programs added.
pub fn read_counters(at: &Attachment) -> Result<Counters, PinnedMapError> {
    let path = at.counters();
    let array: PerCpuArray<MapData, Counters> =
        PerCpuArray::try_from(open(&path)?).map_err(read_err(&path))?;
    let per_cpu = array.get(&0, 0).map_err(read_err(&path))?;
    let mut counters: Counters = sum_per_cpu(per_cpu.iter());
    let path = at.counters_carried();
    let carried: Array<MapData, Counters> =
        Array::try_from(open(&path)?).map_err(read_err(&path))?;
    counters.add(&carried.get(&0, 0).map_err(read_err(&path))?);
    Ok(counters)
}

/// The size of the per-source map (`--max-sources` at attach time).
pub fn sources_capacity(at: &Attachment) -> Result<u32, PinnedMapError> {
    let path = at.sources();
    let map = open(&path)?;
    let data: &MapData = match &map {
        Map::LruHashMap(data) => data,
        _ => {
            return Err(PinnedMapError::Open {
                path: path.display().to_string(),
                source: MapError::InvalidMapType { map_type: 0 },
            });
        }
    };
    Ok(data.info().map_err(read_err(&path))?.max_entries())
}

/// Every tracked IPv4 key with its cell and counters.
pub fn read_sources(at: &Attachment) -> Result<Vec<(Ipv4Addr, SourceState)>, PinnedMapError> {
    read_keys::<Ipv4Key, _>(&at.sources(), |key| Ipv4Addr::from(key.to_ne_bytes()))
}

/// Every tracked IPv6 key with its cell and counters.
pub fn read_sources6(at: &Attachment) -> Result<Vec<(Ipv6Addr, SourceState)>, PinnedMapError> {
    read_keys::<Ipv6Key, _>(&at.sources6(), Ipv6Addr::from)
}

fn read_keys<K: aya::Pod, A>(
    path: &Path,
    addr: impl Fn(K) -> A,
) -> Result<Vec<(A, SourceState)>, PinnedMapError> {
    let map: HashMap<MapData, K, SourceState> =
        HashMap::try_from(open(path)?).map_err(read_err(path))?;
    let mut sources = Vec::new();
    for entry in map.iter() {
        match entry {
            Ok((key, state)) => sources.push((addr(key), state)),
            // An LRU entry evicted between listing its key and reading it: skip it.
            Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(read_err(path)(e)),
        }
    }
    Ok(sources)
}

/// A tracked key as an operator reads it: the address, or the network when keys are
/// masked to a shorter prefix (`198.51.100.0/24`, `2001:db8:1:2::/64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyNet {
    pub addr: IpAddr,
    pub prefix: u32,
}

impl fmt::Display for KeyNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix >= full {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

/// Every tracked key of both families, as networks of the configured prefixes.
pub fn read_all_keys(
    at: &Attachment,
    config: &Config,
) -> Result<Vec<(KeyNet, SourceState)>, PinnedMapError> {
    let v4 = read_sources(at)?.into_iter().map(|(a, s)| {
        let net = KeyNet {
            addr: a.into(),
            prefix: config.prefix_v4,
        };
        (net, s)
    });
    let v6 = read_sources6(at)?.into_iter().map(|(a, s)| {
        let net = KeyNet {
            addr: a.into(),
            prefix: config.prefix_v6,
        };
        (net, s)
    });
    Ok(v4.chain(v6).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_print_with_a_prefix_only_when_aggregated() {
        let net = |addr: &str, prefix| KeyNet {
            addr: addr.parse().unwrap(),
            prefix,
        };
        assert_eq!(net("198.51.100.7", 32).to_string(), "198.51.100.7");
        assert_eq!(net("198.51.100.0", 24).to_string(), "198.51.100.0/24");
        assert_eq!(net("2001:db8::", 64).to_string(), "2001:db8::/64");
        assert_eq!(net("2001:db8::1", 128).to_string(), "2001:db8::1");
    }
}
