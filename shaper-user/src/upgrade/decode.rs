//! Reading the settings and counters of pins of any known layout as today's types.
//!
//! A map whose layout is today's is read as it is; one that changed since is read with the
//! frozen types of its layout (`layout1`, `layout3` to `layout6`) and carried into today's. A layout with no
//! decoder for a changed map cannot be upgraded from, and says so.

use std::{collections::BTreeMap, path::Path};

use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray},
};
use shaper_common::{
    layout::{self, Layout},
    maps::{
        Config, Counters, DEFAULT_SLOT, PIN_CONFIG, PIN_COUNTERS, PIN_COUNTERS_CARRIED,
        PIN_POLICIES, PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED, PerCpuSum, Policy, PolicyStats,
        sum_per_cpu,
    },
};

use super::{
    layout1, layout3, layout4, layout5,
    layout6::{Config6, Counters6, Policy6, PolicyStats6},
};

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("cannot read {path}")]
    Read { path: String, source: MapError },
    #[error("this shaper cannot read map '{pin}' of pin layout {version}")]
    NoDecoder { pin: &'static str, version: u32 },
}

/// What userspace writes: the interface's settings and its prefix policies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub config: Config,
    /// The slots in use.
    pub policies: Vec<(u32, Policy)>,
}

impl Settings {
    /// Whether the default policy or a prefix policy has a second meter.
    pub fn has_meter2(&self) -> bool {
        self.config.meter2.any() || self.policies.iter().any(|(_, p)| p.meter2.any())
    }
}

/// What the program counted: the global counters and those of the default policy and each
/// policy in force that counted anything, summed over CPUs, with what earlier upgrades
/// carried added in. (A slot's counters are zeroed when a policy takes it, so those of
/// unused slots mean nothing.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub counters: Counters,
    pub policy_stats: BTreeMap<u32, PolicyStats>,
}

fn open(path: &Path) -> Result<Map, DecodeError> {
    let err = |source| DecodeError::Read {
        path: path.display().to_string(),
        source,
    };
    Map::from_map_data(MapData::from_pin(path).map_err(err)?).map_err(err)
}

fn read_err(path: &Path) -> impl FnOnce(MapError) -> DecodeError + '_ {
    move |source| DecodeError::Read {
        path: path.display().to_string(),
        source,
    }
}

fn array<T: Pod>(path: &Path) -> Result<Array<MapData, T>, DecodeError> {
    Array::try_from(open(path)?).map_err(read_err(path))
}

/// Every entry of the array pinned at `path`, in index order.
fn array_entries<T: Pod>(path: &Path) -> Result<Vec<T>, DecodeError> {
    let map = array::<T>(path)?;
    map.iter()
        .collect::<Result<Vec<T>, _>>()
        .map_err(read_err(path))
}

/// Entries `indices` of the per-CPU array pinned at `path` as today's type (`now`), each
/// summed over CPUs.
fn per_cpu_sums<T: Pod, U: PerCpuSum>(
    path: &Path,
    indices: &[u32],
    now: impl Fn(&T) -> U,
) -> Result<Vec<(u32, U)>, DecodeError> {
    let map: PerCpuArray<MapData, T> =
        PerCpuArray::try_from(open(path)?).map_err(read_err(path))?;
    indices
        .iter()
        .map(|&i| {
            let values = map.get(&i, 0).map_err(read_err(path))?;
            Ok((i, sum_per_cpu(&values.iter().map(&now).collect::<Vec<U>>())))
        })
        .collect()
}

/// Every entry of the hash map pinned at `path` (keyed by slot) as today's type (`now`).
fn hash_entries<T: Pod, U>(
    path: &Path,
    now: impl Fn(&T) -> U,
) -> Result<Vec<(u32, U)>, DecodeError> {
    let map: HashMap<MapData, u32, T> = HashMap::try_from(open(path)?).map_err(read_err(path))?;
    map.iter()
        .map(|entry| {
            entry
                .map(|(slot, v)| (slot, now(&v)))
                .map_err(read_err(path))
        })
        .collect()
}

/// Whether `pin` is the same map in `l` as in today's layout.
fn as_today(l: &Layout, pin: &str) -> bool {
    l.map(pin)
        .zip(layout::current().map(pin))
        .is_some_and(|(old, today)| old.holds_as(today))
}

fn no_decoder(pin: &'static str, l: &Layout) -> DecodeError {
    DecodeError::NoDecoder {
        pin,
        version: l.version,
    }
}

/// The settings in `dir`, whose pins have layout `l`.
pub fn read_settings(dir: &Path, l: &Layout) -> Result<Settings, DecodeError> {
    let path = dir.join(PIN_POLICIES);
    let all: Vec<Policy> = if as_today(l, PIN_POLICIES) {
        array_entries(&path)?
    } else if l.version == 1 {
        array_entries::<layout1::Policy1>(&path)?
            .iter()
            .map(layout1::Policy1::current)
            .collect()
    } else if matches!(l.version, 2..=5) {
        array_entries::<layout5::Policy5>(&path)?
            .iter()
            .map(layout5::Policy5::current)
            .collect()
    } else if l.version == 6 {
        array_entries::<Policy6>(&path)?
            .iter()
            .map(Policy6::current)
            .collect()
    } else {
        return Err(no_decoder(PIN_POLICIES, l));
    };
    // Slot 0 is the default policy's, which lives in the config.
    let policies: Vec<(u32, Policy)> = (0u32..)
        .zip(all)
        .filter(|(slot, p)| *slot != DEFAULT_SLOT && p.in_use != 0)
        .collect();
    let path = dir.join(PIN_CONFIG);
    let config = if as_today(l, PIN_CONFIG) {
        array::<Config>(&path)?
            .get(&0, 0)
            .map_err(read_err(&path))?
    } else if l.version == 1 {
        let v4 = policies.iter().filter(|(_, p)| p.family == 4).count();
        let prefixes = (v4 as u32, (policies.len() - v4) as u32);
        array::<layout1::Config1>(&path)?
            .get(&0, 0)
            .map_err(read_err(&path))?
            .current(prefixes)
    } else if matches!(l.version, 2..=4) {
        array::<layout4::Config4>(&path)?
            .get(&0, 0)
            .map_err(read_err(&path))?
            .current()
    } else if l.version == 5 {
        array::<layout5::Config5>(&path)?
            .get(&0, 0)
            .map_err(read_err(&path))?
            .current()
    } else if l.version == 6 {
        array::<Config6>(&path)?
            .get(&0, 0)
            .map_err(read_err(&path))?
            .current()
    } else {
        return Err(no_decoder(PIN_CONFIG, l));
    };
    Ok(Settings { config, policies })
}

/// The counts in `dir`, whose pins have layout `l` and hold `settings`.
pub fn read_counts(dir: &Path, l: &Layout, settings: &Settings) -> Result<Counts, DecodeError> {
    let path = dir.join(PIN_COUNTERS);
    let global = [0];
    let mut counters: Counters = if as_today(l, PIN_COUNTERS) {
        per_cpu_sums(&path, &global, |c: &Counters| *c)?
    } else if l.version == 1 {
        per_cpu_sums(&path, &global, layout1::Counters1::current)?
    } else if matches!(l.version, 2 | 3) {
        per_cpu_sums(&path, &global, layout3::Counters3::current)?
    } else if l.version == 4 {
        per_cpu_sums(&path, &global, layout4::Counters4::current)?
    } else if l.version == 5 {
        per_cpu_sums(&path, &global, layout5::Counters5::current)?
    } else if l.version == 6 {
        per_cpu_sums(&path, &global, Counters6::current)?
    } else {
        return Err(no_decoder(PIN_COUNTERS, l));
    }
    .remove(0)
    .1;
    let path = dir.join(PIN_POLICY_STATS);
    let slots: Vec<u32> = std::iter::once(DEFAULT_SLOT)
        .chain(settings.policies.iter().map(|(slot, _)| *slot))
        .collect();
    let live = if as_today(l, PIN_POLICY_STATS) {
        per_cpu_sums(&path, &slots, |s: &PolicyStats| *s)?
    } else if l.version == 1 {
        per_cpu_sums(&path, &slots, layout1::PolicyStats1::current)?
    } else if matches!(l.version, 2..=5) {
        per_cpu_sums(&path, &slots, layout5::PolicyStats5::current)?
    } else if l.version == 6 {
        per_cpu_sums(&path, &slots, PolicyStats6::current)?
    } else {
        return Err(no_decoder(PIN_POLICY_STATS, l));
    };
    let mut policy_stats: BTreeMap<u32, PolicyStats> = live
        .into_iter()
        .filter(|(_, s)| *s != PolicyStats::default())
        .collect();
    // What upgrades before carried, in the layouts that have it.
    if l.map(PIN_COUNTERS_CARRIED).is_some() {
        let path = dir.join(PIN_COUNTERS_CARRIED);
        let carried = if as_today(l, PIN_COUNTERS_CARRIED) {
            array::<Counters>(&path)?.get(&0, 0)
        } else if l.version == 3 {
            array::<layout3::Counters3>(&path)?
                .get(&0, 0)
                .map(|c| c.current())
        } else if l.version == 4 {
            array::<layout4::Counters4>(&path)?
                .get(&0, 0)
                .map(|c| c.current())
        } else if l.version == 5 {
            array::<layout5::Counters5>(&path)?
                .get(&0, 0)
                .map(|c| c.current())
        } else if l.version == 6 {
            array::<Counters6>(&path)?.get(&0, 0).map(|c| c.current())
        } else {
            return Err(no_decoder(PIN_COUNTERS_CARRIED, l));
        };
        counters.add(&carried.map_err(read_err(&path))?);
    }
    if l.map(PIN_POLICY_STATS_CARRIED).is_some() {
        let path = dir.join(PIN_POLICY_STATS_CARRIED);
        let carried: Vec<(u32, PolicyStats)> = if as_today(l, PIN_POLICY_STATS_CARRIED) {
            hash_entries(&path, |s: &PolicyStats| *s)?
        } else if matches!(l.version, 3..=5) {
            hash_entries(&path, layout5::PolicyStats5::current)?
        } else if l.version == 6 {
            hash_entries(&path, PolicyStats6::current)?
        } else {
            return Err(no_decoder(PIN_POLICY_STATS_CARRIED, l));
        };
        for (slot, stats) in carried {
            if slots.contains(&slot) {
                policy_stats.entry(slot).or_default().add(&stats);
            }
        }
    }
    Ok(Counts {
        counters,
        policy_stats,
    })
}

#[cfg(test)]
mod tests {
    use shaper_common::maps::{METER2_EXCESS, METER2_PACKETS, Meter2};

    use super::*;

    /// Whether an upgrade must size the second meter's maps for every source: a second
    /// meter on the default policy or on any prefix policy.
    #[test]
    fn settings_have_a_second_meter_where_any_policy_has_one() {
        let with = |meters| Meter2 {
            meters,
            ..Meter2::default()
        };
        let policy = |meters| Policy {
            meter2: with(meters),
            ..Policy::default()
        };
        let settings = |default, prefixes: &[u8]| Settings {
            config: Config {
                meter2: with(default),
                ..Config::default()
            },
            policies: (1..).zip(prefixes.iter().map(|&m| policy(m))).collect(),
        };
        assert!(!settings(0, &[]).has_meter2());
        assert!(!settings(0, &[0, 0]).has_meter2());
        assert!(settings(METER2_EXCESS, &[]).has_meter2());
        assert!(settings(0, &[0, METER2_PACKETS]).has_meter2());
    }

    /// A map is read as today's only where its layout is today's.
    #[test]
    fn a_map_is_read_as_todays_only_if_its_layout_is() {
        let today = layout::current();
        let older = layout::layout(6).unwrap();
        assert!(as_today(today, PIN_POLICIES));
        assert!(
            !as_today(older, PIN_POLICIES),
            "layout 6's policies lack the second meter"
        );
        assert!(!as_today(today, "no such map"));
        assert_eq!(
            no_decoder(PIN_POLICIES, older).to_string(),
            format!(
                "this shaper cannot read map 'policies' of pin layout {}",
                older.version
            )
        );
    }
}
