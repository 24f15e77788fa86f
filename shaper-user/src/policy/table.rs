//! An interface's policy maps, and changing them as one step.
//!
//! Every change, from one `policy set` to a whole `apply`, goes through
//! [`PolicyTable::replace_all`]: the new set of prefix policies is validated in full
//! first; then new policies are written into free slots (invisible until a prefix points
//! at them), changed ones are rewritten in place (so their sources keep their cells, and
//! the kernel carries each cell over to a new rate), the prefix tries are updated, and the
//! generation is bumped so every source resolves its prefix again on its next packet.
//! Slots freed by the change are cleared last and not reused within it. If any map write
//! fails, the steps already taken are undone in reverse.

use std::collections::{BTreeMap, BTreeSet};

use aya::{
    Ebpf,
    maps::{
        Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuValues,
        lpm_trie::{Key, LpmTrie},
    },
};
use ipnet::IpNet;
use shaper_common::{
    config::ConfigError,
    maps::{
        AdmissionCells, Cell, Config, DEFAULT_SLOT, Ipv4Key, Ipv6Key, MAP_ADMISSION,
        MAP_AGGREGATES, MAP_CONFIG, MAP_POLICIES, MAP_POLICY_STATS, MAP_POLICY_STATS_CARRIED,
        MAP_PREFIXES_V4, MAP_PREFIXES_V6, MAX_POLICIES, PerCpuSum as _, Policy, PolicyStats,
        sum_per_cpu,
    },
};

use super::spec::{PolicySpec, family_and_bytes};
use crate::{
    pins::Attachment,
    upgrade::{self, UpgradeError},
};

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("invalid policy for {prefix}: {reason}")]
    Invalid { prefix: IpNet, reason: ConfigError },
    #[error("{prefix} is listed twice")]
    Duplicate { prefix: IpNet },
    #[error("{prefix} is longer than the /{key_len} sources are keyed by, so it could never match")]
    LongerThanKey { prefix: IpNet, key_len: u32 },
    #[error("no policy for {0}")]
    NotFound(IpNet),
    #[error("too many policies: {asked} asked for, room for {room}")]
    Full { asked: usize, room: usize },
    #[error("cannot count the possible CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("cannot open map {what}")]
    Open { what: String, source: MapError },
    #[error("cannot {what}")]
    Map { what: String, source: MapError },
    #[error(transparent)]
    Layout(#[from] UpgradeError),
}

fn map_err(what: impl Into<String>) -> impl FnOnce(MapError) -> PolicyError {
    let what = what.into();
    move |source| PolicyError::Map { what, source }
}

/// A policy in force, with the slot it lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Installed {
    pub slot: u32,
    pub spec: PolicySpec,
}

/// What a change did, for the operator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<IpNet>,
    pub changed: Vec<IpNet>,
    pub removed: Vec<IpNet>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The maps that hold an interface's settings and policies.
pub struct PolicyTable {
    config: Array<MapData, Config>,
    policies: Array<MapData, Policy>,
    v4: LpmTrie<MapData, Ipv4Key, u32>,
    v6: LpmTrie<MapData, Ipv6Key, u32>,
    aggregates: Array<MapData, Cell>,
    admission: Array<MapData, AdmissionCells>,
    stats: PerCpuArray<MapData, PolicyStats>,
    /// What upgrades carried over from the counters of earlier programs, by slot.
    carried: HashMap<MapData, u32, PolicyStats>,
}

/// The map entry of a spec, or why it cannot be one.
fn map_entry(spec: &PolicySpec) -> Result<Policy, PolicyError> {
    spec.to_policy().map_err(|reason| PolicyError::Invalid {
        prefix: spec.prefix,
        reason,
    })
}

/// A prefix as the key of its family's LPM trie.
enum TrieKey {
    V4(Key<Ipv4Key>),
    V6(Key<Ipv6Key>),
}

fn trie_key(prefix: &IpNet) -> TrieKey {
    let (family, bytes) = family_and_bytes(prefix);
    let len = u32::from(prefix.prefix_len());
    if family == 4 {
        // The address bytes in network order read as a native u32, as `Ipv4Key` is.
        let addr = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        TrieKey::V4(Key::new(len, addr))
    } else {
        TrieKey::V6(Key::new(len, bytes))
    }
}

/// A step taken, and how to take it back.
enum Undo {
    Slot(u32, Policy),
    Unroute(IpNet),
    Route(IpNet, u32),
}

/// Removes every route of `trie` (the `family` prefix trie) that `keep` refuses.
fn prune<K: aya::Pod>(
    trie: &mut LpmTrie<MapData, K, u32>,
    family: &str,
    keep: impl Fn(&Key<K>) -> bool,
) -> Result<(), PolicyError> {
    let keys: Vec<Key<K>> = trie
        .keys()
        .collect::<Result<_, _>>()
        .map_err(map_err(format!("read the {family} prefix trie")))?;
    for key in keys.iter().filter(|k| !keep(k)) {
        trie.remove(key).map_err(map_err(format!(
            "remove a route from the {family} prefix trie"
        )))?;
    }
    Ok(())
}

fn open_pin<T: TryFrom<Map, Error = MapError>>(path: std::path::PathBuf) -> Result<T, PolicyError> {
    let open_err = |source| PolicyError::Open {
        what: path.display().to_string(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(open_err)?;
    let map = Map::from_map_data(data).map_err(open_err)?;
    T::try_from(map).map_err(open_err)
}

fn take<T: TryFrom<Map, Error = MapError>>(ebpf: &mut Ebpf, name: &str) -> Result<T, PolicyError> {
    let open_err = |source| PolicyError::Open {
        what: name.to_owned(),
        source,
    };
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| open_err(MapError::InvalidName { name: name.into() }))?;
    T::try_from(map).map_err(open_err)
}

impl PolicyTable {
    /// The pinned maps of an attachment; refused unless they have this shaper's layout.
    pub fn open(at: &Attachment) -> Result<Self, PolicyError> {
        upgrade::require_current(at)?;
        Ok(Self {
            config: open_pin(at.config())?,
            policies: open_pin(at.policies())?,
            v4: open_pin(at.prefixes_v4())?,
            v6: open_pin(at.prefixes_v6())?,
            aggregates: open_pin(at.aggregates())?,
            admission: open_pin(at.admission())?,
            stats: open_pin(at.policy_stats())?,
            carried: open_pin(at.policy_stats_carried())?,
        })
    }

    /// The maps of a loaded object, taken out of it (for `test_run` and benchmarks).
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, PolicyError> {
        Ok(Self {
            config: take(ebpf, MAP_CONFIG)?,
            policies: take(ebpf, MAP_POLICIES)?,
            v4: take(ebpf, MAP_PREFIXES_V4)?,
            v6: take(ebpf, MAP_PREFIXES_V6)?,
            aggregates: take(ebpf, MAP_AGGREGATES)?,
            admission: take(ebpf, MAP_ADMISSION)?,
            stats: take(ebpf, MAP_POLICY_STATS)?,
            carried: take(ebpf, MAP_POLICY_STATS_CARRIED)?,
        })
    }

    pub fn config(&self) -> Result<Config, PolicyError> {
        self.config.get(&0, 0).map_err(map_err("read the config"))
    }

    /// Replaces the interface's settings and default policy. The policy generation in
    /// force, and the prefix counts that go with it, are kept: a default change needs no
    /// new prefix lookups.
    pub fn set_config(&mut self, config: &Config) -> Result<(), PolicyError> {
        let current = self.config()?;
        let config = if current.active != 0 {
            Config {
                policy_gen: current.policy_gen,
                prefixes_v4: current.prefixes_v4,
                prefixes_v6: current.prefixes_v6,
                ..*config
            }
        } else {
            *config
        };
        self.config
            .set(0, config, 0)
            .map_err(map_err("write the config"))
    }

    /// Every prefix policy in force, IPv4 first, in address then length order. The
    /// array is read in batches: a scrape of the metrics lists it.
    pub fn list(&self) -> Result<Vec<Installed>, PolicyError> {
        use aya::maps::IterableMap as _;
        let mut found = Vec::new();
        for (slot, p) in crate::maps::read_batched::<u32, Policy>(self.policies.map())
            .map_err(map_err("read the policies"))?
        {
            if slot == DEFAULT_SLOT {
                continue;
            }
            if let Some(spec) = PolicySpec::from_policy(&p) {
                found.push(Installed { slot, spec });
            }
        }
        found.sort_by_key(|i| i.spec.prefix);
        Ok(found)
    }

    /// A slot's counters, summed over CPUs, with what upgrades carried over added
    /// ([`DEFAULT_SLOT`]: the default policy's).
    pub fn stats(&self, slot: u32) -> Result<PolicyStats, PolicyError> {
        let per_cpu = self
            .stats
            .get(&slot, 0)
            .map_err(map_err("read the policy counters"))?;
        let mut stats: PolicyStats = sum_per_cpu(per_cpu.iter());
        match self.carried.get(&slot, 0) {
            Ok(carried) => stats.add(&carried),
            Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(map_err("read the carried policy counters")(e)),
        }
        Ok(stats)
    }

    /// Adds `spec`, or replaces the policy of its prefix.
    pub fn set(&mut self, spec: PolicySpec) -> Result<Changes, PolicyError> {
        let mut specs: Vec<PolicySpec> = self
            .list()?
            .into_iter()
            .map(|i| i.spec)
            .filter(|s| s.prefix != spec.prefix)
            .collect();
        specs.push(spec);
        self.replace_all(&specs)
    }

    /// Removes the policy of `prefix`.
    pub fn del(&mut self, prefix: IpNet) -> Result<Changes, PolicyError> {
        let current: Vec<PolicySpec> = self.list()?.into_iter().map(|i| i.spec).collect();
        if !current.iter().any(|s| s.prefix == prefix) {
            return Err(PolicyError::NotFound(prefix));
        }
        let rest: Vec<PolicySpec> = current.into_iter().filter(|s| s.prefix != prefix).collect();
        self.replace_all(&rest)
    }

    /// Checks `specs` as the policy set of an interface whose keys are masked to
    /// `key_prefixes` (IPv4, IPv6 lengths), without touching anything.
    pub fn validate(specs: &[PolicySpec], key_prefixes: (u32, u32)) -> Result<(), PolicyError> {
        let mut seen = BTreeSet::new();
        for spec in specs {
            if !seen.insert(spec.prefix) {
                return Err(PolicyError::Duplicate {
                    prefix: spec.prefix,
                });
            }
            map_entry(spec)?;
            let key_len = match spec.prefix {
                IpNet::V4(_) => key_prefixes.0,
                IpNet::V6(_) => key_prefixes.1,
            };
            if u32::from(spec.prefix.prefix_len()) > key_len {
                return Err(PolicyError::LongerThanKey {
                    prefix: spec.prefix,
                    key_len,
                });
            }
        }
        if specs.len() > (MAX_POLICIES - 1) as usize {
            return Err(PolicyError::Full {
                asked: specs.len(),
                room: (MAX_POLICIES - 1) as usize,
            });
        }
        Ok(())
    }

    /// Makes `specs` the interface's prefix policies, as one change (see the module docs).
    pub fn replace_all(&mut self, specs: &[PolicySpec]) -> Result<Changes, PolicyError> {
        let config = self.config()?;
        Self::validate(specs, (config.prefix_v4, config.prefix_v6))?;
        let current: BTreeMap<IpNet, Installed> = self
            .list()?
            .into_iter()
            .map(|i| (i.spec.prefix, i))
            .collect();
        let wanted: BTreeMap<IpNet, &PolicySpec> = specs.iter().map(|s| (s.prefix, s)).collect();
        let mut changes = Changes::default();
        let used: BTreeSet<u32> = current.values().map(|i| i.slot).collect();
        let mut free = (1..MAX_POLICIES).filter(|slot| !used.contains(slot));
        let mut added = Vec::new();
        for (prefix, spec) in &wanted {
            match current.get(prefix) {
                None => {
                    let slot = free.next().ok_or(PolicyError::Full {
                        asked: specs.len(),
                        room: (MAX_POLICIES - 1) as usize - used.len(),
                    })?;
                    added.push((slot, **spec));
                    changes.added.push(*prefix);
                }
                Some(i) if i.spec != **spec => changes.changed.push(*prefix),
                Some(_) => {}
            }
        }
        let removed: Vec<Installed> = current
            .values()
            .filter(|i| !wanted.contains_key(&i.spec.prefix))
            .copied()
            .collect();
        changes.removed = removed.iter().map(|i| i.spec.prefix).collect();
        if changes.is_empty() {
            return Ok(changes);
        }

        let mut undo = Vec::new();
        let result = self.carry_out(&current, &wanted, &added, &removed, &mut undo);
        if let Err(e) = result {
            // Best effort: the original error is the one worth reporting.
            for step in undo.into_iter().rev() {
                let _ = match step {
                    Undo::Slot(slot, p) => self.write_slot(slot, &p),
                    Undo::Unroute(prefix) => self.unroute(prefix),
                    Undo::Route(prefix, slot) => self.route(prefix, slot),
                };
            }
            let _ = self.bump_generation(current.keys());
            return Err(e);
        }
        Ok(changes)
    }

    fn carry_out(
        &mut self,
        current: &BTreeMap<IpNet, Installed>,
        wanted: &BTreeMap<IpNet, &PolicySpec>,
        added: &[(u32, PolicySpec)],
        removed: &[Installed],
        undo: &mut Vec<Undo>,
    ) -> Result<(), PolicyError> {
        // New policies into free slots, with a fresh aggregate cell and counters: nothing
        // points at them yet.
        for (slot, spec) in added {
            undo.push(Undo::Slot(*slot, Policy::default()));
            self.reset_slot(*slot)?;
            self.write_slot(*slot, &map_entry(spec)?)?;
            crate::crash::point("policy-step");
        }
        // Changed policies in place: their sources keep their cells.
        for (prefix, installed) in current {
            if let Some(spec) = wanted.get(prefix).filter(|s| ***s != installed.spec) {
                let old = self
                    .policies
                    .get(&installed.slot, 0)
                    .map_err(map_err("read the policies"))?;
                undo.push(Undo::Slot(installed.slot, old));
                self.write_slot(installed.slot, &map_entry(spec)?)?;
                crate::crash::point("policy-step");
            }
        }
        for (slot, spec) in added {
            undo.push(Undo::Unroute(spec.prefix));
            self.route(spec.prefix, *slot)?;
            crate::crash::point("policy-step");
        }
        for gone in removed {
            undo.push(Undo::Route(gone.spec.prefix, gone.slot));
            self.unroute(gone.spec.prefix)?;
            crate::crash::point("policy-step");
        }
        self.bump_generation(wanted.keys())?;
        crate::crash::point("policy-step");
        // Sources still caching a removed slot resolve again on their next packet; one
        // reading the slot meanwhile finds it unused and takes the default.
        for gone in removed {
            self.write_slot(gone.slot, &Policy::default())?;
        }
        Ok(())
    }

    /// Every slot in use, with its entry as written (for [`PolicyTable::restore`]).
    pub fn slots(&self) -> Result<Vec<(u32, Policy)>, PolicyError> {
        let mut found = Vec::new();
        for slot in 1..MAX_POLICIES {
            let p = self
                .policies
                .get(&slot, 0)
                .map_err(map_err("read the policies"))?;
            if p.in_use != 0 {
                found.push((slot, p));
            }
        }
        Ok(found)
    }

    /// Puts back the settings `config` and exactly the policies `slots` (as
    /// [`PolicyTable::slots`] read them before a change), whatever a change interrupted at
    /// any step left: each slot gets its entry again (a policy kept in its slot keeps its
    /// sources' cells, its aggregate and counters), each prefix its route, routes and slots
    /// the change added go, and the generation moves on so every source resolves again.
    pub fn restore(&mut self, config: &Config, slots: &[(u32, Policy)]) -> Result<(), PolicyError> {
        let wanted: BTreeMap<u32, PolicySpec> = slots
            .iter()
            .filter_map(|(slot, p)| PolicySpec::from_policy(p).map(|s| (*slot, s)))
            .collect();
        for (slot, p) in slots {
            self.write_slot(*slot, p)?;
        }
        for (slot, spec) in &wanted {
            self.route(spec.prefix, *slot)?;
        }
        // The routes to keep: (family, length, key bits).
        let routes: BTreeSet<(u8, u32, u128)> = wanted
            .values()
            .map(|s| match trie_key(&s.prefix) {
                TrieKey::V4(k) => (4, k.prefix_len(), u128::from(k.data())),
                TrieKey::V6(k) => (6, k.prefix_len(), u128::from_ne_bytes(k.data())),
            })
            .collect();
        prune(&mut self.v4, "IPv4", |k| {
            routes.contains(&(4, k.prefix_len(), u128::from(k.data())))
        })?;
        prune(&mut self.v6, "IPv6", |k| {
            routes.contains(&(6, k.prefix_len(), u128::from_ne_bytes(k.data())))
        })?;
        for (slot, _) in self.slots()? {
            if !wanted.contains_key(&slot) {
                self.write_slot(slot, &Policy::default())?;
            }
        }
        let generation = self.config()?.policy_gen;
        self.config
            .set(
                0,
                Config {
                    policy_gen: generation,
                    ..*config
                },
                0,
            )
            .map_err(map_err("write the config"))?;
        self.bump_generation(wanted.values().map(|s| &s.prefix))
    }

    fn write_slot(&mut self, slot: u32, p: &Policy) -> Result<(), PolicyError> {
        self.policies
            .set(slot, p, 0)
            .map_err(map_err(format!("write policy slot {slot}")))
    }

    /// Zeroes a slot's aggregate cell, admission cells and counters (carried ones too),
    /// for a policy new to it.
    fn reset_slot(&mut self, slot: u32) -> Result<(), PolicyError> {
        self.aggregates
            .set(slot, Cell::default(), 0)
            .map_err(map_err(format!("reset aggregate cell {slot}")))?;
        self.admission
            .set(slot, AdmissionCells::default(), 0)
            .map_err(map_err(format!("reset admission cells {slot}")))?;
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| PolicyError::Cpus(e))?;
        let zeros = PerCpuValues::try_from(vec![PolicyStats::default(); cpus])
            .map_err(PolicyError::Cpus)?;
        self.stats
            .set(slot, zeros, 0)
            .map_err(map_err(format!("reset policy counters {slot}")))?;
        match self.carried.remove(&slot) {
            Ok(()) => Ok(()),
            // Nothing was carried for it (aya reports the kernel's ENOENT as it is).
            Err(MapError::SyscallError(e)) if e.io_error.kind() == std::io::ErrorKind::NotFound => {
                Ok(())
            }
            Err(e) => Err(map_err(format!("reset carried policy counters {slot}"))(e)),
        }
    }

    /// Points `prefix` at `slot` in its family's trie.
    fn route(&mut self, prefix: IpNet, slot: u32) -> Result<(), PolicyError> {
        let err = map_err(format!("add {prefix} to the prefix trie"));
        match trie_key(&prefix) {
            TrieKey::V4(key) => self.v4.insert(&key, slot, 0).map_err(err),
            TrieKey::V6(key) => self.v6.insert(&key, slot, 0).map_err(err),
        }
    }

    /// Removes `prefix` from its family's trie.
    fn unroute(&mut self, prefix: IpNet) -> Result<(), PolicyError> {
        let err = map_err(format!("remove {prefix} from the prefix trie"));
        match trie_key(&prefix) {
            TrieKey::V4(key) => self.v4.remove(&key).map_err(err),
            TrieKey::V6(key) => self.v6.remove(&key).map_err(err),
        }
    }

    /// Tells every source to look its prefix up again on its next packet, and records
    /// how many of `prefixes` (the policies now routed) each family has.
    fn bump_generation<'a>(
        &mut self,
        prefixes: impl Iterator<Item = &'a IpNet>,
    ) -> Result<(), PolicyError> {
        let mut config = self.config()?;
        let (v4, v6): (Vec<&IpNet>, Vec<&IpNet>) =
            prefixes.partition(|p| matches!(p, IpNet::V4(_)));
        // At most MAX_POLICIES of each.
        config.prefixes_v4 = v4.len() as u32;
        config.prefixes_v6 = v6.len() as u32;
        // 0 is what an unresolved source carries: skip it.
        config.policy_gen = match config.policy_gen.wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.config
            .set(0, config, 0)
            .map_err(map_err("write the config"))
    }
}
