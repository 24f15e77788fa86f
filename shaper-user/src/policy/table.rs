//! An interface's policy maps, and changing them as one step.
//!
//! Every change, from one `policy set` to a whole `apply`, goes through
//! [`PolicyTable::replace`] with a [`PolicySet`]: each policy is checked once, into its
//! map entry ([`CheckedPolicy`]), and the set as a whole when it is made; then new policies are written into free slots (invisible until a prefix points
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
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use shaper_common::{
    config::ConfigError,
    keys::{PER_ADDRESS_V4, PER_ADDRESS_V6},
    maps::{
        AdmissionCells, Cell, Config, DEFAULT_SLOT, Ipv4Key, Ipv6Key, MAP_ADMISSION,
        MAP_AGGREGATES, MAP_CONFIG, MAP_POLICIES, MAP_POLICY_STATS, MAP_POLICY_STATS_CARRIED,
        MAP_PREFIXES_V4, MAP_PREFIXES_V6, MAX_POLICIES, PIN_ADMISSION, PIN_AGGREGATES, PIN_CONFIG,
        PIN_POLICIES, PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED, PIN_PREFIXES_V4, PIN_PREFIXES_V6,
        PerCpuSum as _, Policy, PolicyStats, SUBSCRIBER_BIT, SUBSCRIBER_PREFIXES, sum_per_cpu,
    },
};

use super::spec::{PolicySpec, family_and_bytes};
use crate::{
    maps::{Pinned, PinnedMapError},
    pins::Attachment,
    refill,
    upgrade::UpgradeError,
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
    #[error(
        "policy {prefix} is inside subscriber prefix {subscriber}: its traffic would escape the subscriber's bucket"
    )]
    InSubscriber { prefix: IpNet, subscriber: IpNet },
    #[error(
        "too many policies: {asked} asked for, room for {room} (the attachment holds {max}: --max-policies, fixed at attach)"
    )]
    Full {
        asked: usize,
        room: usize,
        max: usize,
    },
    #[error("cannot count the possible CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("cannot open map {what}")]
    Open { what: String, source: MapError },
    #[error("cannot {what}")]
    Map { what: String, source: MapError },
    #[error(transparent)]
    Layout(#[from] UpgradeError),
    #[error(transparent)]
    Pinned(#[from] PinnedMapError),
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

    /// What a set of one policy did, as `policy set` and the API say it: `added`,
    /// `changed` or `unchanged`.
    pub fn verb(&self) -> &'static str {
        if !self.added.is_empty() {
            "added"
        } else if !self.changed.is_empty() {
            "changed"
        } else {
            "unchanged"
        }
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

/// A policy checked, with the map entry it is written as: made once per change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckedPolicy {
    spec: PolicySpec,
    entry: Policy,
}

impl CheckedPolicy {
    pub fn new(spec: PolicySpec) -> Result<Self, PolicyError> {
        let entry = spec.to_policy().map_err(|reason| PolicyError::Invalid {
            prefix: spec.prefix,
            reason,
        })?;
        Ok(Self { spec, entry })
    }

    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }
}

/// The prefix policies of an interface, checked as a set: each policy once, no prefix
/// twice, every prefix no longer than the keys, no more than there is room for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySet(Vec<CheckedPolicy>);

impl PolicySet {
    /// `policies` as the set of an interface whose keys are masked to `key_prefixes`
    /// (IPv4, IPv6 lengths).
    pub fn new(
        policies: Vec<CheckedPolicy>,
        key_prefixes: (u32, u32),
    ) -> Result<Self, PolicyError> {
        let mut seen = BTreeSet::new();
        for p in &policies {
            if !seen.insert(p.spec.prefix) {
                return Err(PolicyError::Duplicate {
                    prefix: p.spec.prefix,
                });
            }
        }
        let set = Self(policies);
        set.fits(key_prefixes)?;
        if set.0.len() > MOST {
            return Err(PolicyError::Full {
                asked: set.0.len(),
                room: MOST,
                max: MOST,
            });
        }
        Ok(set)
    }

    /// `specs`, each checked, as a set ([`PolicySet::new`]).
    pub fn of_specs(specs: &[PolicySpec], key_prefixes: (u32, u32)) -> Result<Self, PolicyError> {
        let policies = specs
            .iter()
            .map(|s| CheckedPolicy::new(*s))
            .collect::<Result<_, _>>()?;
        Self::new(policies, key_prefixes)
    }

    /// Refuses a prefix longer than the keys (IPv4, IPv6 lengths) it would be matched
    /// against: it could never match. One inside a range keyed per address
    /// ([`keyed_whole`]: `fe80::1/128`, `ff02::/16`) is matched whole and may be as long.
    pub fn fits(&self, key_prefixes: (u32, u32)) -> Result<(), PolicyError> {
        for p in &self.0 {
            let key_len = match p.spec.prefix {
                IpNet::V4(_) => key_prefixes.0,
                IpNet::V6(_) => key_prefixes.1,
            };
            if u32::from(p.spec.prefix.prefix_len()) > key_len && !keyed_whole(&p.spec.prefix) {
                return Err(PolicyError::LongerThanKey {
                    prefix: p.spec.prefix,
                    key_len,
                });
            }
        }
        Ok(())
    }

    /// The policies, in the order given.
    pub fn specs(&self) -> impl Iterator<Item = &PolicySpec> {
        self.0.iter().map(|p| &p.spec)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether every address of `prefix` is keyed by itself whatever the keys' prefix
/// (`shaper_common::keys`: link-local, unspecified, multicast).
pub fn keyed_whole(prefix: &IpNet) -> bool {
    let v6 = PER_ADDRESS_V6
        .iter()
        .filter_map(|&(addr, len)| Ipv6Net::new(addr.into(), len).ok().map(IpNet::V6));
    let v4 = PER_ADDRESS_V4
        .iter()
        .filter_map(|&(addr, len)| Ipv4Net::new(addr.into(), len).ok().map(IpNet::V4));
    v6.chain(v4).any(|range| range.contains(prefix))
}

/// The most prefix policies an interface may have room for (slot 0 is the default's):
/// `--max-policies` says how many it has ([`PolicyTable::room`]).
const MOST: usize = (MAX_POLICIES - 1) as usize;

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
    Slot(u32, Box<Policy>),
    Unroute(IpNet),
    Route(IpNet, u32),
}

/// Whether the route `k` of `trie` is a subscriber's (`crate::subscriber` restores those).
/// Every route of `trie` (the `family` prefix trie) with its value, in batches
/// (`BPF_MAP_LOOKUP_BATCH`, which prefix tries have from Linux 5.13; shaper needs 5.18): a
/// few system calls for a million routes, where walking the keys takes two a route.
/// How many times this process has read a prefix trie whole ([`entries_of`]): for the
/// tests of a change that finds what it needs by lookups.
static TRIES_READ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times this process has read a prefix trie whole so far.
pub fn tries_read() -> u64 {
    TRIES_READ.load(std::sync::atomic::Ordering::Relaxed)
}

fn entries_of<K: aya::Pod>(
    trie: &LpmTrie<MapData, K, u32>,
    family: &str,
) -> Result<Vec<(Key<K>, u32)>, PolicyError> {
    use aya::maps::IterableMap as _;
    TRIES_READ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::maps::read_batched::<Key<K>, u32>(trie.map())
        .map_err(map_err(format!("read the {family} prefix trie")))
}

fn net_v4(k: &Key<Ipv4Key>) -> Option<IpNet> {
    Ipv4Net::new(k.data().to_ne_bytes().into(), k.prefix_len() as u8)
        .ok()
        .map(IpNet::V4)
}

fn net_v6(k: &Key<Ipv6Key>) -> Option<IpNet> {
    Ipv6Net::new(k.data().into(), k.prefix_len() as u8)
        .ok()
        .map(IpNet::V6)
}

fn key_bytes<K: aya::Pod>(key: &Key<K>) -> Vec<u8> {
    // SAFETY: a trie key is plain bytes (`repr(C, packed)` of a length and a Pod).
    unsafe { std::slice::from_raw_parts((key as *const Key<K>).cast::<u8>(), size_of::<Key<K>>()) }
        .to_vec()
}

/// The key after `key` (`None`: the first) in `trie`'s walk (`BPF_MAP_GET_NEXT_KEY`).
fn next_of<K: aya::Pod>(
    trie: &LpmTrie<MapData, K, u32>,
    key: Option<&Key<K>>,
) -> Result<Option<Key<K>>, PolicyError> {
    use aya::maps::IterableMap as _;
    let mut next = vec![0u8; size_of::<Key<K>>()];
    let key = key.map(key_bytes);
    let found = crate::maps::next_key(trie.map(), key.as_deref(), &mut next)
        .map_err(map_err("walk a prefix trie"))?;
    // SAFETY: the kernel wrote a key of the trie's key size, plain bytes.
    Ok(found.then(|| unsafe { next.as_ptr().cast::<Key<K>>().read_unaligned() }))
}

/// Whether `key` is a route of `trie`: the kernel walks on from a key that is not one as
/// from the start (to the trie's first route), from one that is to the route after it,
/// never the first.
fn is_key<K: aya::Pod>(trie: &LpmTrie<MapData, K, u32>, key: &Key<K>) -> Result<bool, PolicyError> {
    let Some(after) = next_of(trie, Some(key))? else {
        // Nothing after it: it is the last route (a trie with routes walks from a
        // key that is not one to its first).
        return Ok(true);
    };
    let first = next_of(trie, None)?;
    Ok(first.is_none_or(|first| key_bytes(&first) != key_bytes(&after)))
}

/// Removes each route of `routes` (as [`entries_of`] read `trie`, the `family` prefix trie)
/// that `keep` refuses.
fn prune<K: aya::Pod>(
    trie: &mut LpmTrie<MapData, K, u32>,
    family: &str,
    routes: &[(Key<K>, u32)],
    keep: impl Fn(&Key<K>, u32) -> bool,
) -> Result<(), PolicyError> {
    for (key, _) in routes.iter().filter(|(k, v)| !keep(k, *v)) {
        trie.remove(key).map_err(map_err(format!(
            "remove a route from the {family} prefix trie"
        )))?;
    }
    Ok(())
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
    /// (Opens every pin: within a change, [`PolicyTable::of`] its [`Pinned`].)
    pub fn open(at: &Attachment) -> Result<Self, PolicyError> {
        Self::of(&Pinned::open(at)?)
    }

    /// The maps of an attachment's pins as opened (no pin is opened again).
    pub fn of(pinned: &Pinned) -> Result<Self, PolicyError> {
        Ok(Self {
            config: pinned.map(PIN_CONFIG)?,
            policies: pinned.map(PIN_POLICIES)?,
            v4: pinned.map(PIN_PREFIXES_V4)?,
            v6: pinned.map(PIN_PREFIXES_V6)?,
            aggregates: pinned.map(PIN_AGGREGATES)?,
            admission: pinned.map(PIN_ADMISSION)?,
            stats: pinned.map(PIN_POLICY_STATS)?,
            carried: pinned.map(PIN_POLICY_STATS_CARRIED)?,
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

    /// Every slot's counters, as [`PolicyTable::stats`] reads one: two map reads in all,
    /// in batches, whatever the number of policies.
    pub fn all_stats(&self) -> Result<BTreeMap<u32, PolicyStats>, PolicyError> {
        use aya::maps::IterableMap as _;
        let mut all: BTreeMap<u32, PolicyStats> =
            crate::maps::read_batched_summed::<u32, PolicyStats>(self.stats.map())
                .map_err(map_err("read the policy counters"))?
                .into_iter()
                .collect();
        for entry in self.carried.iter() {
            let (slot, carried) = entry.map_err(map_err("read the carried policy counters"))?;
            all.entry(slot).or_default().add(&carried);
        }
        Ok(all)
    }

    /// The counters of `slots` (as [`PolicyTable::all_stats`] has them): one lookup each
    /// where they are few, every slot read in batches otherwise.
    pub fn stats_of(&self, slots: &[u32]) -> Result<BTreeMap<u32, PolicyStats>, PolicyError> {
        // A lookup of one slot's per-CPU counters costs about what a batch costs a
        // thousand slots: batches past that.
        const ONE_BY_ONE: usize = 1024;
        if slots.len() > ONE_BY_ONE {
            let mut all = self.all_stats()?;
            all.retain(|slot, _| slots.contains(slot));
            return Ok(all);
        }
        slots
            .iter()
            .map(|&slot| self.stats(slot).map(|s| (slot, s)))
            .collect()
    }

    /// The policies in force, as they are written (the entries as read: not checked
    /// again).
    fn installed(&self) -> Result<Vec<CheckedPolicy>, PolicyError> {
        Ok(self
            .slots()?
            .into_iter()
            .filter_map(|(_, entry)| {
                PolicySpec::from_policy(&entry).map(|spec| CheckedPolicy { spec, entry })
            })
            .collect())
    }

    /// The key prefixes (IPv4, IPv6 lengths) of the interface.
    fn key_prefixes(&self) -> Result<(u32, u32), PolicyError> {
        let config = self.config()?;
        Ok((config.prefix_v4, config.prefix_v6))
    }

    /// Adds `policy`, or replaces the policy of its prefix.
    pub fn set(&mut self, policy: CheckedPolicy) -> Result<Changes, PolicyError> {
        let mut policies = self.installed()?;
        policies.retain(|p| p.spec.prefix != policy.spec.prefix);
        policies.push(policy);
        self.replace(&PolicySet::new(policies, self.key_prefixes()?)?)
    }

    /// Removes the policy of `prefix`.
    pub fn del(&mut self, prefix: IpNet) -> Result<Changes, PolicyError> {
        let mut policies = self.installed()?;
        if !policies.iter().any(|p| p.spec.prefix == prefix) {
            return Err(PolicyError::NotFound(prefix));
        }
        policies.retain(|p| p.spec.prefix != prefix);
        self.replace(&PolicySet::new(policies, self.key_prefixes()?)?)
    }

    /// Makes `specs`, checked as a set, the interface's prefix policies ([`PolicyTable::replace`]).
    pub fn replace_all(&mut self, specs: &[PolicySpec]) -> Result<Changes, PolicyError> {
        self.replace(&PolicySet::of_specs(specs, self.key_prefixes()?)?)
    }

    /// Makes `set` the interface's prefix policies, as one change (see the module docs).
    pub fn replace(&mut self, set: &PolicySet) -> Result<Changes, PolicyError> {
        set.fits(self.key_prefixes()?)?;
        self.refuse_inside_subscribers(set)?;
        let current: BTreeMap<IpNet, Installed> = self
            .list()?
            .into_iter()
            .map(|i| (i.spec.prefix, i))
            .collect();
        let wanted: BTreeMap<IpNet, &CheckedPolicy> =
            set.0.iter().map(|p| (p.spec.prefix, p)).collect();
        let mut changes = Changes::default();
        // Subscribers' plans hold slots too.
        let used: BTreeSet<u32> = self.slots()?.into_iter().map(|(slot, _)| slot).collect();
        let room = self.room();
        let mut free = (1..=room).filter(|slot| !used.contains(slot));
        let mut added = Vec::new();
        for (prefix, policy) in &wanted {
            match current.get(prefix) {
                None => {
                    let slot = free.next().ok_or(PolicyError::Full {
                        asked: set.len(),
                        room: room as usize - (used.len() - current.len()),
                        max: room as usize,
                    })?;
                    added.push((slot, **policy));
                    changes.added.push(*prefix);
                }
                Some(i) if i.spec != policy.spec => changes.changed.push(*prefix),
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
        wanted: &BTreeMap<IpNet, &CheckedPolicy>,
        added: &[(u32, CheckedPolicy)],
        removed: &[Installed],
        undo: &mut Vec<Undo>,
    ) -> Result<(), PolicyError> {
        // New policies into free slots, with a fresh aggregate cell and counters: nothing
        // points at them yet.
        for (slot, policy) in added {
            undo.push(Undo::Slot(*slot, Box::default()));
            self.reset_slot(*slot)?;
            self.write_slot(*slot, &policy.entry)?;
            crate::crash::point("policy-step");
        }
        // Changed policies in place: their sources keep their cells.
        for (prefix, installed) in current {
            if let Some(policy) = wanted.get(prefix).filter(|p| p.spec != installed.spec) {
                let old = self
                    .policies
                    .get(&installed.slot, 0)
                    .map_err(map_err("read the policies"))?;
                undo.push(Undo::Slot(installed.slot, Box::new(old)));
                self.write_slot(installed.slot, &policy.entry)?;
                crate::crash::point("policy-step");
            }
        }
        for (slot, policy) in added {
            undo.push(Undo::Unroute(policy.spec.prefix));
            self.route(policy.spec.prefix, *slot)?;
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

    /// Refuses a policy of `set` whose prefix is a subscriber's or inside one: its traffic
    /// would escape the subscriber's bucket (`crate::subscriber`). One lookup a policy,
    /// the tries not read: in force, no route is inside a subscriber's prefix but its own,
    /// so the longest route covering a prefix inside one is that subscriber's.
    fn refuse_inside_subscribers(&self, set: &PolicySet) -> Result<(), PolicyError> {
        if self.config()?.prefixes_v4 & SUBSCRIBER_PREFIXES == 0
            && self.config()?.prefixes_v6 & SUBSCRIBER_PREFIXES == 0
        {
            return Ok(());
        }
        for p in set.specs() {
            let Some(v) = self.longest_route(p.prefix) else {
                continue;
            };
            if v & SUBSCRIBER_BIT != 0 {
                return Err(PolicyError::InSubscriber {
                    prefix: p.prefix,
                    subscriber: self.covering_route(p.prefix, v)?,
                });
            }
        }
        Ok(())
    }

    /// The route of value `v` equal to or covering `prefix` (whose lookup answered `v`),
    /// found by lookups of each shorter length: for an error's words.
    pub fn covering_route(&self, prefix: IpNet, v: u32) -> Result<IpNet, PolicyError> {
        for len in (0..=prefix.prefix_len()).rev() {
            let Ok(net) = IpNet::new(prefix.addr(), len).map(|n| n.trunc()) else {
                continue;
            };
            if self.exact_route(net)? == Some(v) {
                return Ok(net);
            }
        }
        Ok(prefix)
    }

    /// Every route of both tries with its value: a policy slot, or a subscriber's index
    /// with `SUBSCRIBER_BIT`.
    pub fn routes(&self) -> Result<Vec<(IpNet, u32)>, PolicyError> {
        let mut found = Vec::new();
        for (k, v) in entries_of(&self.v4, "IPv4")? {
            if let Some(net) = net_v4(&k) {
                found.push((net, v));
            }
        }
        for (k, v) in entries_of(&self.v6, "IPv6")? {
            if let Some(net) = net_v6(&k) {
                found.push((net, v));
            }
        }
        Ok(found)
    }

    /// The value `prefix` routes to if it is a route itself (not only covered by a
    /// shorter one): a lookup, and two steps of the trie's walk (a key that is not a
    /// route walks on from the trie's first; one that is, from itself). No trie read.
    pub fn exact_route(&self, prefix: IpNet) -> Result<Option<u32>, PolicyError> {
        let Some(value) = self.longest_route(prefix) else {
            return Ok(None);
        };
        let is_route = match trie_key(&prefix.trunc()) {
            TrieKey::V4(key) => is_key(&self.v4, &key)?,
            TrieKey::V6(key) => is_key(&self.v6, &key)?,
        };
        Ok(is_route.then_some(value))
    }

    /// The route after `prefix` (a route) in its trie's walk, if any. The walk gives a
    /// node's more specific routes before it, and the routes inside a prefix one after
    /// another, starting from the lowest of the longest length (its network address as
    /// a host route): from there, the routes inside `prefix` are found without reading
    /// the trie.
    pub fn route_after(&self, prefix: IpNet) -> Result<Option<IpNet>, PolicyError> {
        Ok(match trie_key(&prefix.trunc()) {
            TrieKey::V4(key) => next_of(&self.v4, Some(&key))?.and_then(|k| net_v4(&k)),
            TrieKey::V6(key) => next_of(&self.v6, Some(&key))?.and_then(|k| net_v6(&k)),
        })
    }

    /// The subscribers' routes: each prefix with its subscriber's index.
    pub fn subscriber_routes(&self) -> Result<Vec<(IpNet, u32)>, PolicyError> {
        Ok(self
            .routes()?
            .into_iter()
            .filter(|(_, v)| v & SUBSCRIBER_BIT != 0)
            .map(|(net, v)| (net, v & !SUBSCRIBER_BIT))
            .collect())
    }

    /// Points `prefix` at `value` (a subscriber's route, `SUBSCRIBER_BIT` set).
    pub fn route_value(&mut self, prefix: IpNet, value: u32) -> Result<(), PolicyError> {
        self.route(prefix, value)
    }

    /// Removes the route of `prefix`, if there is one.
    pub fn unroute_if_there(&mut self, prefix: IpNet) -> Result<(), PolicyError> {
        match self.unroute(prefix) {
            Err(PolicyError::Map {
                source: MapError::SyscallError(e),
                ..
            }) if e.io_error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// What the kernel's lookup of `prefix` answers: the value of the longest route
    /// covering it (one lookup, the tries not read whole), if any.
    pub fn longest_route(&self, prefix: IpNet) -> Option<u32> {
        match trie_key(&prefix) {
            TrieKey::V4(key) => self.v4.get(&key, 0).ok(),
            TrieKey::V6(key) => self.v6.get(&key, 0).ok(),
        }
    }

    /// The value `prefix` routes to exactly, if any.
    pub fn route_of(&self, prefix: IpNet) -> Option<u32> {
        let value = match trie_key(&prefix) {
            TrieKey::V4(key) => self.v4.get(&key, 0).ok(),
            TrieKey::V6(key) => self.v6.get(&key, 0).ok(),
        }?;
        // A lookup answers the longest prefix covering the key: this one's only if no
        // shorter route answers instead.
        self.routes()
            .ok()?
            .into_iter()
            .any(|(net, v)| net == prefix && v == value)
            .then_some(value)
    }

    /// The plans in force: slots of subscribers' plans ([`Policy::plan`]).
    pub fn plans(&self) -> Result<Vec<(u32, Policy)>, PolicyError> {
        Ok(self
            .slots()?
            .into_iter()
            .filter(|(_, p)| p.plan != 0)
            .collect())
    }

    /// Writes a new plan into a free slot (its aggregate, admission cells and counters
    /// zeroed): its slot.
    pub fn add_plan(&mut self, entry: &Policy) -> Result<u32, PolicyError> {
        let used: BTreeSet<u32> = self.slots()?.into_iter().map(|(slot, _)| slot).collect();
        self.add_plan_among(entry, &used)
    }

    /// [`PolicyTable::add_plan`] where the slots in use are known to be `used` (the
    /// daemon's index, or every slot of the plan's window: no read of every slot). The
    /// plan goes to the first free slot of its window ([`plan_window`]), or the first free
    /// slot anywhere if its window is full.
    pub fn add_plan_among(
        &mut self,
        entry: &Policy,
        used: &BTreeSet<u32>,
    ) -> Result<u32, PolicyError> {
        let room = self.room();
        let slot = plan_window(entry, room)
            .chain(1..=room)
            .find(|slot| !used.contains(slot))
            .ok_or(PolicyError::Full {
                asked: 1,
                room: 0,
                max: room as usize,
            })?;
        self.reset_slot(slot)?;
        self.write_slot(slot, entry)?;
        Ok(slot)
    }

    /// The slots of `plan`'s window ([`plan_window`]) with their entries, in use or not:
    /// one lookup each.
    pub fn window_of(&self, plan: &Policy) -> Result<Vec<(u32, Policy)>, PolicyError> {
        plan_window(plan, self.room())
            .map(|slot| self.slot(slot).map(|p| (slot, p)))
            .collect()
    }

    /// Puts back the settings `config` and the entries of `slots` (as read before a change
    /// that writes no other slot and no policy's route: one subscriber's), leaving every
    /// other slot as it is; the generation moves on so every key resolves again.
    pub fn restore_slots(
        &mut self,
        config: &Config,
        slots: &[(u32, Policy)],
    ) -> Result<(), PolicyError> {
        for (slot, p) in slots {
            self.write_slot(*slot, p)?;
        }
        let policy_gen = match self.config()?.policy_gen.wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.config
            .set(
                0,
                Config {
                    policy_gen,
                    ..*config
                },
                0,
            )
            .map_err(map_err("write the config"))
    }

    /// The entry of policy slot `slot` (one lookup).
    pub fn slot(&self, slot: u32) -> Result<Policy, PolicyError> {
        self.policies
            .get(&slot, 0)
            .map_err(map_err("read the policies"))
    }

    /// Rewrites a plan's entry in place (its count of subscribers: `crate::subscriber`).
    pub fn rewrite_plan(&mut self, slot: u32, entry: &Policy) -> Result<(), PolicyError> {
        self.write_slot(slot, entry)
    }

    /// Frees a plan's slot (no subscriber points at it any more).
    pub fn drop_plan(&mut self, slot: u32) -> Result<(), PolicyError> {
        self.write_slot(slot, &Policy::default())
    }

    /// Tells every source to look its prefix up again, subscribers' prefixes of the
    /// families `v4`, `v6` now in the tries too.
    pub fn subscribers_routed(&mut self, v4: bool, v6: bool) -> Result<(), PolicyError> {
        let mut config = self.config()?;
        if v4 {
            config.prefixes_v4 |= SUBSCRIBER_PREFIXES;
        }
        if v6 {
            config.prefixes_v6 |= SUBSCRIBER_PREFIXES;
        }
        config.policy_gen = match config.policy_gen.wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.config
            .set(0, config, 0)
            .map_err(map_err("write the config"))
    }

    /// The prefix policies and plans the attachment has room for (`--max-policies`): its
    /// policy slots but the default's.
    pub fn room(&self) -> u32 {
        self.policies.len().saturating_sub(1)
    }

    /// Every slot in use, with its entry as written (for [`PolicyTable::restore`]).
    /// Read in batches, as [`PolicyTable::list`]; only the slots in use are copied out.
    pub fn slots(&self) -> Result<Vec<(u32, Policy)>, PolicyError> {
        use aya::maps::IterableMap as _;
        let in_use = std::mem::offset_of!(Policy, in_use);
        let mut found: Vec<(u32, Policy)> =
            crate::maps::read_batched_where::<u32, Policy>(self.policies.map(), |value| {
                value[in_use..in_use + 4] != [0; 4]
            })
            .map_err(map_err("read the policies"))?
            .into_iter()
            .filter(|(slot, p)| *slot != DEFAULT_SLOT && *slot <= self.room() && p.in_use != 0)
            .collect();
        found.sort_by_key(|(slot, _)| *slot);
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
        // Subscribers' routes are theirs to restore (`crate::subscriber`).
        let theirs = |v: u32| v & SUBSCRIBER_BIT != 0;
        let v4 = entries_of(&self.v4, "IPv4")?;
        prune(&mut self.v4, "IPv4", &v4, |k, v| {
            routes.contains(&(4, k.prefix_len(), u128::from(k.data()))) || theirs(v)
        })?;
        let v6 = entries_of(&self.v6, "IPv6")?;
        prune(&mut self.v6, "IPv6", &v6, |k, v| {
            routes.contains(&(6, k.prefix_len(), u128::from_ne_bytes(k.data()))) || theirs(v)
        })?;
        let saved: BTreeSet<u32> = slots.iter().map(|(slot, _)| *slot).collect();
        for (slot, _) in self.slots()? {
            if !saved.contains(&slot) {
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
        // The message made only on an error: a million routes are written one by one.
        let err = |source| PolicyError::Map {
            what: format!("add {prefix} to the prefix trie"),
            source,
        };
        match trie_key(&prefix) {
            TrieKey::V4(key) => refill::refilled_map(|| self.v4.insert(&key, slot, 0)).map_err(err),
            TrieKey::V6(key) => refill::refilled_map(|| self.v6.insert(&key, slot, 0)).map_err(err),
        }
    }

    /// Points each prefix of `routes` at its value, in batches per family, both families
    /// at once: each trie has its own lock in the kernel, so a million routes of each take
    /// the time of one family's on two CPUs. On an error some routes of either family may
    /// be written (the caller's journal puts them back); the IPv4 trie's error is told
    /// first.
    pub fn route_many(&mut self, routes: &[(IpNet, u32)]) -> Result<(), PolicyError> {
        use aya::maps::IterableMap as _;
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (prefix, value) in routes {
            match trie_key(prefix) {
                TrieKey::V4(key) => v4.push((key, *value)),
                TrieKey::V6(key) => v6.push((key, *value)),
            }
        }
        let (v4_map, v6_map) = (self.v4.map(), self.v6.map());
        let (r4, r6) = std::thread::scope(|s| {
            // A thread wherever both families have routes (a thread's start is nothing
            // beside a batch's syscalls).
            let other = (!v4.is_empty() && !v6.is_empty())
                .then(|| s.spawn(|| crate::maps::write_batched(v6_map, &v6)));
            let r4 = crate::maps::write_batched(v4_map, &v4);
            let r6 = match other {
                Some(t) => t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                None => crate::maps::write_batched(v6_map, &v6),
            };
            (r4, r6)
        });
        r4.map_err(map_err("add routes to the IPv4 prefix trie"))?;
        r6.map_err(map_err("add routes to the IPv6 prefix trie"))
    }

    /// Removes `prefix` from its family's trie.
    fn unroute(&mut self, prefix: IpNet) -> Result<(), PolicyError> {
        let err = |source| PolicyError::Map {
            what: format!("remove {prefix} from the prefix trie"),
            source,
        };
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
        // At most MAX_POLICIES of each; whether subscribers have prefixes is kept.
        config.prefixes_v4 = v4.len() as u32 | (config.prefixes_v4 & SUBSCRIBER_PREFIXES);
        config.prefixes_v6 = v6.len() as u32 | (config.prefixes_v6 & SUBSCRIBER_PREFIXES);
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

/// How many slots from its home a subscribers' plan may be placed in ([`plan_window`]).
pub const PLAN_WINDOW: u32 = 32;

/// The slots a subscribers' plan is placed in among `room` (slots 1 to `room`), in the
/// order it takes them: [`PLAN_WINDOW`] slots from its home, an FNV-1a hash of its settings
/// (its entry without its count of subscribers, as plans are compared) modulo `room`, the
/// same in every build. A change finds an identical plan, or the slot a new one takes, by
/// reading these 32 entries, not the whole array; a plan whose window is full goes to the
/// first free slot anywhere (and a change then reads every slot to find it).
pub fn plan_window(plan: &Policy, room: u32) -> impl Iterator<Item = u32> + use<> {
    let settings = Policy {
        prefix_len: 0,
        ..*plan
    };
    // SAFETY: a Pod value is plain bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts((&raw const settings).cast::<u8>(), size_of::<Policy>())
    };
    let hash = crate::fnv::fnv1a(bytes.iter().copied());
    let home = (hash % u64::from(room.max(1))) as u32;
    (0..PLAN_WINDOW.min(room)).map(move |i| (home + i) % room.max(1) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plans_window_is_stable_in_range_and_its_settings_alone() {
        let plan = |rate_bps: u64, users: u32| Policy {
            rate_bps,
            prefix_len: users,
            in_use: 1,
            plan: 1,
            ..Policy::default()
        };
        let window: Vec<u32> = plan_window(&plan(10_000_000, 0), MAX_POLICIES - 1).collect();
        // FNV-1a of the entry's bytes: the placement must not change across builds.
        assert_eq!(window[0], 14_176);
        assert_eq!(window.len(), PLAN_WINDOW as usize);
        // Consecutive, wrapping from the last slot to 1, never the default's.
        for pair in window.windows(2) {
            assert_eq!(pair[1], pair[0] % (MAX_POLICIES - 1) + 1);
        }
        for rate in 1..2000 {
            assert!(
                plan_window(&plan(rate, 0), MAX_POLICIES - 1)
                    .all(|s| (1..MAX_POLICIES).contains(&s))
            );
        }
        // Its count of subscribers is not part of it.
        assert!(plan_window(&plan(10_000_000, 7), MAX_POLICIES - 1).eq(window.iter().copied()));
        assert_ne!(
            plan_window(&plan(20_000_000, 0), MAX_POLICIES - 1).next(),
            Some(window[0])
        );
        // In a smaller room: within it, each slot once, the whole room when it is smaller
        // than a window.
        for room in [1, 2, 31, 32, 1024] {
            for rate in 1..200 {
                let w: Vec<u32> = plan_window(&plan(rate, 0), room).collect();
                assert_eq!(w.len(), room.min(PLAN_WINDOW) as usize, "room {room}");
                assert!(
                    w.iter().all(|s| (1..=room).contains(s)),
                    "room {room}: {w:?}"
                );
                assert_eq!(w.iter().collect::<BTreeSet<_>>().len(), w.len(), "{w:?}");
            }
        }
    }
}
