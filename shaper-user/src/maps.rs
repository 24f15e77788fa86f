//! Typed access to an attachment's pinned maps, for `status`, `stats` and in-place updates.

use std::{net::Ipv4Addr, path::Path};

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray};
use shaper_common::maps::{Config, Counters, Ipv4Key, SourceState};

use crate::pins::Attachment;

#[derive(Debug, thiserror::Error)]
pub enum PinnedMapError {
    #[error("cannot open pinned map {path}")]
    Open { path: String, source: MapError },
    #[error("cannot read pinned map {path}")]
    Read { path: String, source: MapError },
    #[error("cannot update pinned map {path}")]
    Write { path: String, source: MapError },
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

/// The attachment's policy entry.
pub fn read_config(at: &Attachment) -> Result<Config, PinnedMapError> {
    let path = at.config();
    let array: Array<MapData, Config> = Array::try_from(open(&path)?).map_err(read_err(&path))?;
    array.get(&0, 0).map_err(read_err(&path))
}

/// Replaces the attachment's policy entry; the program sees it on its next packet.
pub fn write_config(at: &Attachment, config: &Config) -> Result<(), PinnedMapError> {
    let path = at.config();
    let mut array: Array<MapData, Config> =
        Array::try_from(open(&path)?).map_err(read_err(&path))?;
    array
        .set(0, config, 0)
        .map_err(|source| PinnedMapError::Write {
            path: path.display().to_string(),
            source,
        })
}

/// The global counters, summed over CPUs.
pub fn read_counters(at: &Attachment) -> Result<Counters, PinnedMapError> {
    let path = at.counters();
    let array: PerCpuArray<MapData, Counters> =
        PerCpuArray::try_from(open(&path)?).map_err(read_err(&path))?;
    let per_cpu = array.get(&0, 0).map_err(read_err(&path))?;
    let mut total = Counters::default();
    for c in per_cpu.iter() {
        total.add(c);
    }
    Ok(total)
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

/// Every tracked source with its cell and counters.
pub fn read_sources(at: &Attachment) -> Result<Vec<(Ipv4Addr, SourceState)>, PinnedMapError> {
    let path = at.sources();
    let map: HashMap<MapData, Ipv4Key, SourceState> =
        HashMap::try_from(open(&path)?).map_err(read_err(&path))?;
    let mut sources = Vec::new();
    for entry in map.iter() {
        match entry {
            Ok((key, state)) => sources.push((Ipv4Addr::from(key.to_ne_bytes()), state)),
            // An LRU entry evicted between listing its key and reading it: skip it.
            Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(read_err(&path)(e)),
        }
    }
    Ok(sources)
}
