//! Subscribers: an id, an optional name, prefixes of either family and a plan; every frame
//! of any of its prefixes (in one attachment's direction) draws from one bucket, the
//! subscriber's cell in `SHAPER_SUBS` ([`Subscriber`]).
//!
//! A plan is a policy slot marked as one ([`Policy::plan`]): what a policy carries, its
//! aggregate being the subscriber's rate and burst and its per-source limit the per-address
//! one; identical plans share a slot, freed when no subscriber points at it. A subscriber's
//! prefixes are routes of the prefix tries whose value is its index with `SUBSCRIBER_BIT`.
//!
//! A change writes that subscriber alone: its entry, its routes, its plan's slot if the plan
//! is new. A plan change is one write of its entry (its keys keep the cached route, and the
//! kernel carries its cell over to the new rate: no refill); a change of its prefixes moves
//! the policy generation on, as a policy change does. Its prefixes are kept too, as a copy,
//! in a record at its index ([`prefixes`]): a removal or a change of prefixes finds them
//! there, each checked by a lookup, rather than in the tries read whole.
//!
//! Overlaps that would let a subscriber's traffic escape its bucket are refused: a prefix of
//! another subscriber or a prefix policy equal to or inside one of its prefixes, and its
//! prefix inside another subscriber's. A subscriber's prefix inside a prefix policy is
//! allowed: the longest prefix wins, and it is the subscriber's.

mod index;
pub mod known;
pub mod place;
pub mod plan;
pub mod prefixes;
pub mod record;
mod sync;

use std::borrow::BorrowMut;

use aya::maps::{Array, MapData, MapError};
use ipnet::IpNet;
use shaper_common::{
    config::PolicyLimits,
    maps::{
        ACTION_LIMIT, MODE_ENFORCE, MODE_SHAPE, Outcomes, PIN_SUBSCRIBERS, Policy, SUBSCRIBER_BIT,
        SUBSCRIBER_ID_BYTES, SUBSCRIBER_NAME_BYTES, Subscriber,
    },
};

use crate::{
    maps::{Pinned, PinnedMapError},
    policy::{PolicyError, PolicyTable, table::keyed_whole},
};

pub use index::Index;
pub use record::Entry;
pub use sync::{Batch, Summary};

#[derive(Debug, thiserror::Error)]
pub enum SubscriberError {
    #[error("invalid subscriber id '{0}': 1 to 32 bytes of letters, digits and . _ - : /")]
    Id(String),
    #[error("invalid subscriber name '{0}': at most 24 bytes, no control characters")]
    Name(String),
    #[error("subscriber {0} has no prefix")]
    NoPrefix(String),
    #[error("{prefix} is listed twice")]
    Duplicate { prefix: IpNet },
    #[error("{prefix} is longer than the /{key_len} keys are masked to, so it could never match")]
    LongerThanKey { prefix: IpNet, key_len: u32 },
    #[error("invalid plan of subscriber {id}: {reason}")]
    Plan { id: String, reason: String },
    #[error("{0}")]
    Overlap(String),
    #[error(
        "no room for the subscribers' new plans: {room} of the {max} policy slots are free (prefix policies and plans share them; --max-policies, fixed at attach)"
    )]
    PlanRoom { room: usize, max: usize },
    #[error("no subscriber {0}")]
    NotFound(String),
    /// The daemon's [`Index`] named an entry that is not subscriber `0` as it has it.
    #[error("subscriber {0}'s entry is not as the index has it")]
    Stale(String),
    #[error(
        "no room for another subscriber ({room} in use, the --max-subscribers of the attachment); detach and attach again with a larger --max-subscribers"
    )]
    Full { room: u32 },
    #[error("cannot {what}")]
    Map { what: String, source: MapError },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Pinned(#[from] PinnedMapError),
    #[error(transparent)]
    Records(#[from] record::RecordsError),
}

fn map_err(what: impl Into<String>) -> impl FnOnce(MapError) -> SubscriberError {
    let what = what.into();
    move |source| SubscriberError::Map { what, source }
}

/// A subscriber as an operator states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberSpec {
    pub id: String,
    /// Empty for none.
    pub name: String,
    pub prefixes: Vec<IpNet>,
    /// Its plan: `aggregate_*` the subscriber's rate and burst, `rate_bps` and
    /// `burst_bytes` each address's (or each key's: a /64 in IPv6 by default).
    pub plan: PolicyLimits,
}

/// A subscriber in force: its index, what it was set to, and what its frames became.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub index: u32,
    pub spec: SubscriberSpec,
    pub plan_slot: u32,
    pub outcomes: Outcomes,
    /// Of its passed frames, those its excess rate passed (yellow, marked): packets, bytes.
    pub yellow: (u64, u64),
}

/// A subscriber's counts (what `/metrics` gives of the busiest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    pub id: String,
    pub outcomes: Outcomes,
    /// Of its passed frames, those its excess rate passed: packets, bytes.
    pub yellow: (u64, u64),
}

fn counts_of(s: &Entry) -> Counts {
    Counts {
        id: unpadded(&s.id),
        outcomes: s.outcomes,
        yellow: (s.yellow_packets, s.yellow_bytes),
    }
}

impl Counts {
    /// Bytes refused: dropped, or would drop in monitor mode.
    pub fn refused_bytes(&self) -> u64 {
        self.outcomes.dropped_bytes + self.outcomes.would_drop_bytes
    }
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Added,
    Changed,
    Unchanged,
    Removed,
}

fn check_id(id: &str) -> Result<(), SubscriberError> {
    let ok = !id.is_empty()
        && id.len() <= SUBSCRIBER_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SubscriberError::Id(id.to_owned()))
    }
}

fn check_name(name: &str) -> Result<(), SubscriberError> {
    if name.len() > SUBSCRIBER_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(SubscriberError::Name(name.to_owned()));
    }
    Ok(())
}

fn padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

/// An id or name as a map entry holds it (NUL-padded), as text.
pub(crate) fn unpadded(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl SubscriberSpec {
    /// Checks the subscriber for an attachment whose keys are masked to `key_prefixes`
    /// (IPv4, IPv6 lengths): its plan's policy entry.
    pub fn check(&self, key_prefixes: (u32, u32)) -> Result<Policy, SubscriberError> {
        self.check_shape(key_prefixes)?;
        plan_entry(&self.id, &self.plan)
    }

    /// [`Self::check`] but its plan: its id, name and prefixes.
    pub fn check_shape(&self, key_prefixes: (u32, u32)) -> Result<(), SubscriberError> {
        check_id(&self.id)?;
        check_name(&self.name)?;
        if self.prefixes.is_empty() {
            return Err(SubscriberError::NoPrefix(self.id.clone()));
        }
        for (i, p) in self.prefixes.iter().enumerate() {
            if self.prefixes[..i].contains(p) {
                return Err(SubscriberError::Duplicate { prefix: *p });
            }
            let key_len = match p {
                IpNet::V4(_) => key_prefixes.0,
                IpNet::V6(_) => key_prefixes.1,
            };
            if u32::from(p.prefix_len()) > key_len && !keyed_whole(p) {
                return Err(SubscriberError::LongerThanKey {
                    prefix: *p,
                    key_len,
                });
            }
        }
        Ok(())
    }
}

/// Checks a plan on its own (a configuration file's `[plan.NAME]`): why it cannot be one.
pub fn check_plan(plan: &PolicyLimits) -> Result<(), String> {
    match plan_entry("", plan) {
        Ok(_) => Ok(()),
        Err(SubscriberError::Plan { reason, .. }) => Err(reason),
        Err(e) => Err(e.to_string()),
    }
}

/// The plan's policy entry: a limit with a subscriber's rate (the aggregate), enforced,
/// monitored or shaped; its excess rate and its packet rate, if any, are the subscriber's
/// (its entry's second bucket: one or the other), not each address's. A shaping plan's
/// frames are held back by the subscriber's bucket alone, so it has no excess rate, no
/// packet rate (they police) and no per-address limit of its own.
fn plan_entry(id: &str, plan: &PolicyLimits) -> Result<Policy, SubscriberError> {
    let refuse = |reason: &str| SubscriberError::Plan {
        id: id.to_owned(),
        reason: reason.to_owned(),
    };
    if plan.action != ACTION_LIMIT || plan.aggregate_rate_bps == 0 {
        return Err(refuse("a plan limits: it needs a rate"));
    }
    let m = plan.meter2;
    if m.packet_rate != 0 && m.excess_rate_bps != 0 {
        return Err(refuse(&format!(
            "packet rate {} with an excess rate is not supported for subscribers (a subscriber has one second bucket: an excess rate or a packet rate)",
            m.packet_rate
        )));
    }
    let shape = plan.mode == MODE_SHAPE;
    if shape && m.any() {
        return Err(refuse(
            "mode shape with an excess rate or a packet rate is not supported (they police: mark or drop)",
        ));
    }
    if shape && !plan.per_address_is_whole() {
        return Err(refuse(
            "mode shape takes no per-address limit (the subscriber's bucket alone holds its frames back)",
        ));
    }
    // A prefix policy may not shape with an aggregate; a plan's aggregate is what shapes.
    let checked = PolicyLimits {
        mode: if shape { MODE_ENFORCE } else { plan.mode },
        ..*plan
    };
    let mut entry = Policy::new(4, [0; 16], 0, &checked).map_err(|e| refuse(&e.to_string()))?;
    entry.mode = plan.mode;
    entry.family = 0;
    entry.plan = 1;
    Ok(entry)
}

/// What a plan's entry says of its limits (as [`SubscriberSpec::plan`]).
fn plan_limits(p: &Policy) -> PolicyLimits {
    p.limits()
}

/// Subscriber `index` as in force: its entry `s`, its `prefixes` (sorted here), its plan
/// found among `plans`.
fn installed(
    index: u32,
    s: &Entry,
    mut prefixes: Vec<IpNet>,
    plans: &[(u32, Policy)],
) -> Installed {
    prefixes.sort();
    let plan = plans
        .iter()
        .find(|(slot, _)| *slot == s.plan)
        .map(|(_, p)| plan_limits(p))
        .unwrap_or_default();
    Installed {
        index,
        spec: SubscriberSpec {
            id: unpadded(&s.id),
            name: unpadded(&s.name),
            prefixes,
            plan,
        },
        plan_slot: s.plan,
        outcomes: s.outcomes,
        yellow: (s.yellow_packets, s.yellow_bytes),
    }
}

/// A subscriber's entry and routes as they were before a change, to put back
/// (`crate::journal`).
#[derive(Clone, Debug, Default)]
pub struct Before {
    pub index: u32,
    /// Its entry: a free one (never used, or a removed subscriber's tombstone) if the
    /// subscriber is new.
    pub entry: Entry,
    /// Each prefix the change may touch, with the value it routed to (`None`: no route).
    pub routes: Vec<(IpNet, Option<u32>)>,
    /// Read by lookups, the tries not read whole: the subscriber is new, or moved to other
    /// prefixes (its new ones are checked by lookups too), or its prefixes are those in
    /// force (nothing to check).
    pub by_lookup: bool,
}

impl Before {
    /// The subscriber's prefixes as they were: the routes to it.
    pub fn prefixes(&self) -> impl Iterator<Item = &IpNet> + Clone + '_ {
        let value = Some(self.index | SUBSCRIBER_BIT);
        self.routes
            .iter()
            .filter(move |(_, v)| *v == value)
            .map(|(net, _)| net)
    }
}

/// The count of subscribers on a plan, kept in its entry's `prefix_len` (a plan has no
/// prefix; the kernel reads neither) in a table placed by hash ([`place`]).
fn plan_users(p: &Policy) -> u32 {
    p.prefix_len
}

/// Whether two plan entries are the same plan, whatever their counts of subscribers.
fn same_plan(a: &Policy, b: &Policy) -> bool {
    Policy {
        prefix_len: 0,
        ..*a
    } == Policy {
        prefix_len: 0,
        ..*b
    }
}

/// The host route at the lowest address of `p`: where the walk of the routes inside `p`
/// starts (`PolicyTable::route_after`); `None` if `p` is a host route itself.
fn lowest_host(p: &IpNet) -> Option<IpNet> {
    (p.prefix_len() < p.max_prefix_len())
        .then(|| IpNet::new(p.network(), p.max_prefix_len()).ok())
        .flatten()
}

/// Entries a probe reads before it asks whether the table is full (five runs: 496): a
/// probe that long is rare below 95% full.
const FULL_CHECK_AFTER: u32 = 256;

/// Why a probe stopped short.
enum Stop {
    /// The table is known full ([`SubscriberTable::known_full`]).
    Full,
    Err(SubscriberError),
}

/// How many subscriber entries this process has read from the kernel.
static ENTRIES_READ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many subscriber entries this process has read from the kernel so far: for the
/// tests of what a change reads.
pub fn entries_read() -> u64 {
    ENTRIES_READ.load(std::sync::atomic::Ordering::Relaxed)
}

fn counted(entries: usize) {
    ENTRIES_READ.fetch_add(entries as u64, std::sync::atomic::Ordering::Relaxed);
}

/// An attachment's subscribers: their map, and the policy maps their plans and routes live
/// in.
pub struct SubscriberTable<P = PolicyTable> {
    subs: Array<MapData, Subscriber>,
    /// Its subscribers' ids and names ([`record`]).
    records: record::Records,
    policies: P,
    /// Every route of the tries as last read, until the next write through
    /// [`Self::pm`]: a change reads them once (they are read key by key, the slow part
    /// of a change at a million subscribers).
    routes: std::cell::OnceCell<Vec<(IpNet, u32)>>,
    /// Whether entry 0 says subscribers are placed by hash ([`place`]), once read.
    hashed: std::cell::Cell<Option<bool>>,
    /// The file of its subscribers' routes as the last batch left them ([`known`]), for
    /// maps opened from pins.
    known: Option<known::Known>,
    /// The routes that file held when [`Self::before`] of a removal read them, to save
    /// again without the subscriber once it is removed.
    known_read: std::cell::RefCell<Option<Vec<(IpNet, u32)>>>,
    /// Its maps were made by the change at hand: every entry is free, and a batch does
    /// not read them ([`Self::made_now`]).
    made_now: bool,
    /// Each subscriber's prefixes by index ([`prefixes`]), for maps opened from pins: the
    /// file's path, and the file once open (made at the first write if there is none).
    prefix_path: Option<std::path::PathBuf>,
    prefix_file: std::cell::OnceCell<Option<prefixes::PrefixFile>>,
}

impl SubscriberTable {
    /// The maps of an attachment's pins as opened (no pin is opened again).
    pub fn of(pinned: &Pinned) -> Result<Self, SubscriberError> {
        let subs: Array<MapData, Subscriber> = pinned.map(PIN_SUBSCRIBERS)?;
        // No room, no subscriber to name: no file (an attachment without subscribers).
        let records = match subs.len() {
            0 | 1 => record::Records::anonymous()?,
            _ => {
                let map_id = pinned.info(PIN_SUBSCRIBERS).map_or(0, |i| i.id);
                record::Records::open(&record::path_of(pinned.at()), map_id)?
            }
        };
        let room = subs.len() > 1;
        Ok(Self {
            known: known::Known::of(pinned),
            prefix_path: room.then(|| prefixes::path_of(pinned.at())),
            ..Self::with_records(subs, PolicyTable::of(pinned)?, records)
        })
    }
}

impl<P: BorrowMut<PolicyTable>> SubscriberTable<P> {
    /// The subscribers' map `subs` beside the policy maps `policies` (of a loaded object:
    /// `test_run` and benchmarks).
    /// (`records`: their ids' and names' file, kept by the caller across tables).
    pub fn new(subs: Array<MapData, Subscriber>, policies: P, records: record::Records) -> Self {
        Self::with_records(subs, policies, records)
    }

    fn with_records(
        subs: Array<MapData, Subscriber>,
        policies: P,
        records: record::Records,
    ) -> Self {
        Self {
            subs,
            records,
            policies,
            routes: std::cell::OnceCell::new(),
            hashed: std::cell::Cell::new(None),
            known: None,
            known_read: std::cell::RefCell::new(None),
            made_now: false,
            prefix_path: None,
            prefix_file: std::cell::OnceCell::new(),
        }
    }

    /// The table of an attachment the change at hand made (its maps new): a batch takes
    /// every entry as free rather than read them (112 MB at a million).
    pub fn made_now(self) -> Self {
        Self {
            made_now: true,
            ..self
        }
    }

    /// Whether its subscribers are placed by hash ([`place::MARKER`] in entry 0).
    fn hashed(&self) -> Result<bool, SubscriberError> {
        if let Some(h) = self.hashed.get() {
            return Ok(h);
        }
        let h = self.room() > 0 && self.entry(0)?.id == place::MARKER;
        self.hashed.set(Some(h));
        Ok(h)
    }

    /// Marks the table as placing by hash (it has no subscriber: none is misplaced).
    fn mark_hashed(&mut self) -> Result<(), SubscriberError> {
        let marker = Entry {
            id: place::MARKER,
            ..Entry::default()
        };
        self.put(0, &marker, None)?;
        self.hashed.set(Some(true));
        Ok(())
    }

    /// Whether the table places by hash, marking it so first if it has no subscriber
    /// (an attachment an older shaper made stays on the whole-table search until then).
    fn hashed_or_mark(&mut self) -> Result<bool, SubscriberError> {
        if self.hashed()? {
            return Ok(true);
        }
        if self.room() == 0 || !self.entries()?.is_empty() {
            return Ok(false);
        }
        self.mark_hashed()?;
        Ok(true)
    }

    /// Looks subscriber `id` up by its hash ([`place::probe`]): a few runs of entries. A
    /// probe that goes on past [`FULL_CHECK_AFTER`] entries asks, once, whether the table
    /// is full ([`Self::known_full`]): if it is, `id` is found by its record instead
    /// ([`Self::find_in_full`]), not by reading the table whole.
    fn probe(&self, id: &str) -> Result<place::Probe, SubscriberError> {
        let (mut read, mut checked) = (0u32, false);
        let probed = place::probe(&padded(id), self.room(), |start, n| {
            if read >= FULL_CHECK_AFTER && !checked {
                checked = true;
                if self.known_full().map_err(Stop::Err)? {
                    return Err(Stop::Full);
                }
            }
            read += n;
            self.run(start, n).map_err(Stop::Err)
        });
        match probed {
            Ok(found) => Ok(found),
            Err(Stop::Err(e)) => Err(e),
            Err(Stop::Full) => self.find_in_full(id),
        }
    }

    /// Whether every entry of a table placed by hash is in use, by its plans' counts of
    /// their subscribers ([`Self::plan_joined`]): one read of the policy slots.
    fn known_full(&self) -> Result<bool, SubscriberError> {
        if !self.hashed()? {
            return Ok(false);
        }
        let plans = self.p().plans()?;
        let n: u64 = plans.iter().map(|(_, p)| u64::from(plan_users(p))).sum();
        Ok(n >= u64::from(self.room()))
    }

    /// [`Self::probe`] of `id` in a table whose every entry is in use: by its record (an
    /// entry in use always has its record: [`record`]), the records read, not the entries,
    /// and the entry it names read and checked; absent (no room) if none is `id`'s. Where
    /// that entry is not `id`'s in use after all, the whole probe.
    fn find_in_full(&self, id: &str) -> Result<place::Probe, SubscriberError> {
        let want = padded::<SUBSCRIBER_ID_BYTES>(id);
        let Some(i) = self.records.find_id(&want)? else {
            return Ok(place::Probe::Absent(None));
        };
        let e = self.entry(i)?;
        if e.in_use != 0 && e.id == want {
            return Ok(place::Probe::Found(i, e));
        }
        place::probe(&want, self.room(), |start, n| self.run(start, n))
    }

    /// The error of entry `index` whose record is not its id's.
    fn disagree(&self, d: record::Disagree) -> SubscriberError {
        record::RecordsError::Other {
            path: self.records.path().display().to_string(),
            what: format!("entry {}'s id is not its record's", d.index),
        }
        .into()
    }

    /// Entry `index` with its id and name: one read of each.
    fn entry(&self, index: u32) -> Result<Entry, SubscriberError> {
        let s = self
            .subs
            .get(&index, 0)
            .map_err(map_err("read the subscribers"))?;
        let r = self.records.read_run(index, 1)?;
        record::join(index, &s, &r[0]).map_err(|d| self.disagree(d))
    }

    /// Entries `start..start + n` (fewer where the table ends), with their ids and names.
    fn run(&self, start: u32, n: u32) -> Result<Vec<Entry>, SubscriberError> {
        use aya::maps::IterableMap as _;
        let got = crate::maps::read_run::<Subscriber>(self.subs.map(), start, n)
            .map_err(map_err("read the subscribers"))?;
        counted(got.len());
        let records = self.records.read_run(start, got.len() as u32)?;
        got.iter()
            .zip(&records)
            .enumerate()
            .map(|(k, (s, r))| record::join(start + k as u32, s, r).map_err(|d| self.disagree(d)))
            .collect()
    }

    /// Every record, for the entries `len` of a read of the whole table.
    fn all_records(&self) -> Result<Vec<record::Record>, SubscriberError> {
        Ok(self.records.read_run(0, self.subs.len())?)
    }

    /// Writes entry `index` and its record (`was`: the entry as it is, if known, whose
    /// record is not written again if it is the same): the record first if the entry is in
    /// use, the entry first if not (an entry in use always has its record).
    fn put(&mut self, index: u32, e: &Entry, was: Option<&Entry>) -> Result<(), SubscriberError> {
        let (s, r) = record::split(index, e);
        let same = was.is_some_and(|w| (w.id, w.name) == (e.id, e.name)) || index == 0;
        let write = |t: &mut Self| {
            t.subs
                .set(index, s, 0)
                .map_err(map_err(format!("write subscriber entry {index}")))
        };
        if s.in_use == 0 {
            write(self)?;
        }
        if !same {
            self.records.write(index, &r)?;
        }
        if s.in_use != 0 {
            write(self)?;
        }
        Ok(())
    }

    fn p(&self) -> &PolicyTable {
        self.policies.borrow()
    }

    fn pm(&mut self) -> &mut PolicyTable {
        self.routes.take();
        self.policies.borrow_mut()
    }

    /// Every route of the tries (read once until the next write).
    fn routes(&self) -> Result<&[(IpNet, u32)], SubscriberError> {
        if let Some(routes) = self.routes.get() {
            return Ok(routes);
        }
        let routes = self.p().routes()?;
        Ok(self.routes.get_or_init(|| routes))
    }

    /// Subscribers it has room for.
    fn room(&self) -> u32 {
        self.subs.len().saturating_sub(1)
    }

    /// The file of each subscriber's prefixes ([`prefixes`]), if there is one.
    fn prefix_file(&self) -> Option<&prefixes::PrefixFile> {
        self.prefix_file
            .get_or_init(|| {
                self.prefix_path
                    .as_deref()
                    .and_then(prefixes::PrefixFile::open)
            })
            .as_ref()
    }

    /// Writes `records` ([`prefixes::encode`]d, by index; `whole`: every record, the
    /// others none), the file made first if there is none. A copy: a file that cannot be
    /// made or written is removed, and the changes that follow read the tries.
    fn record_prefixes(&mut self, records: &mut [(u32, [u8; prefixes::RECORD])], whole: bool) {
        let Some(path) = self.prefix_path.clone() else {
            return;
        };
        if self.prefix_file().is_none() {
            self.prefix_file = prefixes::PrefixFile::create(&path).ok().into();
        }
        let len = self.subs.len();
        let written = self.prefix_file().map(|f| match whole {
            true => f.write_all(records, len),
            false => f.write_many(records),
        });
        if !matches!(written, Some(Ok(()))) {
            let _ = std::fs::remove_file(&path);
            self.prefix_file = None.into();
        }
    }

    /// Subscriber `index`'s prefixes as its record holds them ([`prefixes`]), if they are
    /// all of them: as many as `entry` counts (distinct: [`prefixes::decode`]), each a
    /// route to it (one lookup each). The tries are not read.
    fn recorded_prefixes(
        &self,
        index: u32,
        entry: &Entry,
    ) -> Result<Option<Vec<IpNet>>, SubscriberError> {
        let Some(nets) = self.prefix_file().and_then(|f| f.read(index)) else {
            return Ok(None);
        };
        if entry.in_use == 0 || nets.len() != entry.in_use as usize {
            return Ok(None);
        }
        for net in &nets {
            if self.p().exact_route(*net)? != Some(index | SUBSCRIBER_BIT) {
                return Ok(None);
            }
        }
        Ok(Some(nets))
    }

    /// Every entry, free ones too, by index, with its id and name: the table and the
    /// records each read whole.
    fn all(&self) -> Result<Vec<Entry>, SubscriberError> {
        use aya::maps::IterableMap as _;
        let read = crate::maps::read_batched::<u32, Subscriber>(self.subs.map())
            .map_err(map_err("read the subscribers"))?;
        counted(read.len());
        let records = self.all_records()?;
        let mut all = vec![Entry::default(); self.subs.len() as usize];
        for (i, s) in read {
            let r = records.get(i as usize).copied().unwrap_or_default();
            if let Some(e) = all.get_mut(i as usize) {
                *e = record::join(i, &s, &r).map_err(|d| self.disagree(d))?;
            }
        }
        Ok(all)
    }

    /// Every index in use with its entry, read in batches.
    fn entries(&self) -> Result<Vec<(u32, Entry)>, SubscriberError> {
        use aya::maps::IterableMap as _;
        let read = crate::maps::read_batched::<u32, Subscriber>(self.subs.map())
            .map_err(map_err("read the subscribers"))?;
        counted(read.len());
        let records = self.all_records()?;
        read.into_iter()
            .filter(|(i, s)| *i != 0 && s.in_use != 0)
            .map(|(i, s)| {
                let r = records.get(i as usize).copied().unwrap_or_default();
                let e = record::join(i, &s, &r).map_err(|d| self.disagree(d))?;
                Ok((i, e))
            })
            .collect()
    }

    fn find(&self, id: &str) -> Result<Option<(u32, Entry)>, SubscriberError> {
        if self.hashed()? {
            return Ok(match self.probe(id)? {
                place::Probe::Found(i, s) => Some((i, s)),
                place::Probe::Absent(_) => None,
            });
        }
        Ok(self
            .entries()?
            .into_iter()
            .find(|(_, s)| unpadded(&s.id) == id))
    }

    /// The attachment's settings.
    pub fn config(&self) -> Result<shaper_common::maps::Config, SubscriberError> {
        Ok(self.p().config()?)
    }

    /// Every subscriber in force, by id: each one's routes grouped once (not searched
    /// for each subscriber: a list at 100,000 subscribers is one pass).
    pub fn list(&self) -> Result<Vec<Installed>, SubscriberError> {
        let mut routes: std::collections::HashMap<u32, Vec<IpNet>> = Default::default();
        for (net, index) in self.p().subscriber_routes()? {
            routes.entry(index).or_default().push(net);
        }
        let plans = self.p().plans()?;
        let mut found: Vec<Installed> = self
            .entries()?
            .into_iter()
            .map(|(index, s)| {
                let prefixes = routes.remove(&index).unwrap_or_default();
                installed(index, &s, prefixes, &plans)
            })
            .collect();
        found.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
        Ok(found)
    }

    /// How many subscribers are in force, and the counts of the `n` of them that refused
    /// the most bytes, then passed the most (then by id): their entries read in batches,
    /// no route (the daemon's background count, not a scrape).
    pub fn busiest(&self, n: usize) -> Result<(usize, Vec<Counts>), SubscriberError> {
        let mut all: Vec<Counts> = self.entries()?.iter().map(|(_, s)| counts_of(s)).collect();
        let in_force = all.len();
        let order = |c: &Counts| {
            (
                std::cmp::Reverse((c.refused_bytes(), c.outcomes.passed_bytes)),
                c.id.clone(),
            )
        };
        if n < all.len() {
            all.select_nth_unstable_by_key(n, order);
            all.truncate(n);
        }
        all.sort_by_key(order);
        Ok((in_force, all))
    }

    /// Every subscriber's counts, in index order: their entries read in batches, no
    /// route, no plan (RADIUS accounting's scan).
    pub fn all_counts(&self) -> Result<Vec<Counts>, SubscriberError> {
        Ok(self.entries()?.iter().map(|(_, s)| counts_of(s)).collect())
    }

    /// Each entry in use with its index, handed to `f` as the batches are read (the
    /// entries not in use never copied out of them): nothing collected, nothing
    /// allocated for it (RADIUS accounting's scan).
    pub fn each_entry(&self, mut f: impl FnMut(u32, &Entry)) -> Result<(), SubscriberError> {
        use aya::maps::IterableMap as _;
        const IN_USE: usize = std::mem::offset_of!(Subscriber, in_use);
        let records = self.all_records()?;
        let mut disagree = None;
        crate::maps::each_batched_where::<u32, Subscriber>(
            self.subs.map(),
            |v| v[IN_USE..IN_USE + 4] != [0; 4],
            |i, s| {
                if i == 0 || disagree.is_some() {
                    return;
                }
                let r = records.get(i as usize).copied().unwrap_or_default();
                match record::join(i, &s, &r) {
                    Ok(e) => f(i, &e),
                    Err(d) => disagree = Some(d),
                }
            },
        )
        .map_err(map_err("read the subscribers"))?;
        match disagree {
            Some(d) => Err(self.disagree(d)),
            None => Ok(()),
        }
    }

    /// Every subscriber's counts with its plan's rate (bits per second): no route read.
    pub fn with_plans(&self) -> Result<Vec<(Counts, u64)>, SubscriberError> {
        let plans: std::collections::HashMap<u32, u64> = self
            .p()
            .plans()?
            .into_iter()
            .map(|(slot, p)| (slot, plan_limits(&p).aggregate_rate_bps))
            .collect();
        Ok(self
            .entries()?
            .iter()
            .map(|(_, s)| (counts_of(s), plans.get(&s.plan).copied().unwrap_or(0)))
            .collect())
    }

    /// The counts of subscriber `id`: its entry found among the entries (read in
    /// batches), no route read.
    pub fn counts(&self, id: &str) -> Result<Counts, SubscriberError> {
        check_id(id)?;
        let (_, s) = self
            .find(id)?
            .ok_or_else(|| SubscriberError::NotFound(id.to_owned()))?;
        Ok(counts_of(&s))
    }

    /// The subscriber `id`: one read of the entries and the routes.
    pub fn get(&self, id: &str) -> Result<Installed, SubscriberError> {
        check_id(id)?;
        let (index, s) = self
            .find(id)?
            .ok_or_else(|| SubscriberError::NotFound(id.to_owned()))?;
        let prefixes = self
            .p()
            .subscriber_routes()?
            .into_iter()
            .filter(|(_, i)| *i == index)
            .map(|(net, _)| net)
            .collect();
        Ok(installed(index, &s, prefixes, &self.p().plans()?))
    }

    /// The id of the subscriber whose prefix holds `net` (the longest route covering it,
    /// as the kernel's lookup chooses, is a subscriber's), if any: one lookup.
    pub fn id_holding(&self, net: &IpNet) -> Result<Option<String>, SubscriberError> {
        let Some(value) = self.p().longest_route(*net) else {
            return Ok(None);
        };
        if value & SUBSCRIBER_BIT == 0 {
            return Ok(None);
        }
        let entry = self.entry(value & !SUBSCRIBER_BIT)?;
        Ok((entry.in_use != 0).then(|| unpadded(&entry.id)))
    }

    /// The id of the subscriber of entry `index`, if it is in use: one read.
    pub fn id_at(&self, index: u32) -> Result<Option<String>, SubscriberError> {
        let entry = self.entry(index)?;
        Ok((entry.in_use != 0).then(|| unpadded(&entry.id)))
    }

    /// The entry of subscriber `id` in a table placed by hash, by a probe (a few
    /// entries read); `None` if it is not set, or the table is not placed by hash.
    pub fn index_of(&self, id: &str) -> Result<Option<u32>, SubscriberError> {
        if check_id(id).is_err() || !self.hashed()? {
            return Ok(None);
        }
        Ok(match self.probe(id)? {
            place::Probe::Found(i, _) => Some(i),
            place::Probe::Absent(_) => None,
        })
    }

    /// Whether subscriber `id` is set: one read of the entries.
    pub fn contains(&self, id: &str) -> Result<bool, SubscriberError> {
        Ok(check_id(id).is_ok() && self.find(id)?.is_some())
    }

    /// What [`SubscriberTable::set`] of `spec` (or `del` with `None`) of subscriber `id`
    /// may touch, as it is: to journal before writing. Checks `spec` as `set` would.
    ///
    /// In a table placed by hash ([`place`]), a new subscriber's place and what it may
    /// touch, and a subscriber whose prefixes are those in force, are found by lookups;
    /// otherwise (a change of prefixes, a removal: a subscriber's routes are known only
    /// from the tries) every route is read. A table with no subscriber is marked as placed
    /// by hash first.
    pub fn before(
        &mut self,
        id: &str,
        spec: Option<&SubscriberSpec>,
    ) -> Result<Before, SubscriberError> {
        if spec.is_some() && self.hashed_or_mark()? {
            let (index, entry) = match self.probe(id)? {
                place::Probe::Found(i, s) => (i, s),
                place::Probe::Absent(Some(i)) => (i, self.entry(i)?),
                place::Probe::Absent(None) => {
                    return Err(SubscriberError::Full { room: self.room() });
                }
            };
            if let Some(before) =
                self.before_by_lookup(index, entry, spec.iter().flat_map(|s| &s.prefixes))?
            {
                return Ok(before);
            }
            return self.before_reading(index, entry, spec);
        }
        let (index, entry) = match self.find(id)? {
            Some(found) => found,
            None if spec.is_none() => return Err(SubscriberError::NotFound(id.to_owned())),
            None => (self.free_index()?, Entry::default()),
        };
        self.before_reading(index, entry, spec)
    }

    /// [`Self::before`] by lookups, if it can be: subscriber `index` (`entry`) new, or with
    /// `prefixes` (as given) exactly: each a route of its own, as many as its entry counts
    /// (`in_use`). A new one's routes to be are each prefix, and the lowest host route
    /// inside each (the overlap check's walk starts there: [`Self::check_by_lookup`]).
    fn before_by_lookup<'a>(
        &self,
        index: u32,
        entry: Entry,
        prefixes: impl Iterator<Item = &'a IpNet> + Clone,
    ) -> Result<Option<Before>, SubscriberError> {
        let value = index | SUBSCRIBER_BIT;
        let mut routes = Vec::new();
        if entry.in_use == 0 {
            for p in prefixes {
                routes.push((*p, self.p().exact_route(*p)?));
                if let Some(low) = lowest_host(p).filter(|l| !routes.iter().any(|(r, _)| r == l)) {
                    routes.push((low, self.p().exact_route(low)?));
                }
            }
        } else {
            if prefixes.clone().count() != entry.in_use as usize {
                return Ok(None);
            }
            for p in prefixes {
                if self.p().exact_route(*p)? != Some(value) {
                    return Ok(None);
                }
                routes.push((*p, Some(value)));
            }
        }
        Ok(Some(Before {
            index,
            entry,
            routes,
            by_lookup: true,
        }))
    }

    /// [`Self::before`] of the removal of subscriber `index` (`entry`) from the routes
    /// the last batch left ([`known`]), if they are still those in force: as many as its
    /// entry counts, each one its route (one lookup each). The tries are not read.
    fn before_known(&self, index: u32, entry: Entry) -> Result<Option<Before>, SubscriberError> {
        let Some(known) = &self.known else {
            return Ok(None);
        };
        let Some(routes) = known.load(self.p().config()?.policy_gen) else {
            return Ok(None);
        };
        let value = index | SUBSCRIBER_BIT;
        let nets: Vec<IpNet> = routes
            .iter()
            .filter(|(_, i)| *i == index)
            .map(|(net, _)| *net)
            .collect();
        if nets.len() != entry.in_use as usize {
            return Ok(None);
        }
        for net in &nets {
            if self.p().exact_route(*net)? != Some(value) {
                return Ok(None);
            }
        }
        self.known_read.replace(Some(routes));
        Ok(Some(Before {
            index,
            entry,
            routes: nets.into_iter().map(|net| (net, Some(value))).collect(),
            by_lookup: true,
        }))
    }

    /// [`Self::before`] of subscriber `index` (`entry`) from its record of prefixes if it
    /// holds them all ([`Self::before_recorded`]), otherwise from every route of the tries
    /// (a removal from the routes the last batch left, if it can be).
    fn before_reading(
        &self,
        index: u32,
        entry: Entry,
        spec: Option<&SubscriberSpec>,
    ) -> Result<Before, SubscriberError> {
        if let Some(before) = self.before_recorded(index, entry, spec)? {
            return Ok(before);
        }
        if spec.is_none()
            && let Some(before) = self.before_known(index, entry)?
        {
            return Ok(before);
        }
        let routes = self.routes()?;
        let mut touched: Vec<IpNet> = routes
            .iter()
            .filter(|(_, v)| *v == index | SUBSCRIBER_BIT)
            .map(|(net, _)| *net)
            .collect();
        for p in spec.iter().flat_map(|s| &s.prefixes) {
            if !touched.contains(p) {
                touched.push(*p);
            }
        }
        let routes = touched
            .into_iter()
            .map(|net| {
                let value = routes.iter().find(|(r, _)| *r == net).map(|(_, v)| *v);
                (net, value)
            })
            .collect();
        Ok(Before {
            index,
            entry,
            routes,
            by_lookup: false,
        })
    }

    /// [`Self::before`] of subscriber `index` (`entry`, in use) from its record of
    /// prefixes, if it holds them all ([`Self::recorded_prefixes`]): those, and for a
    /// change to `spec`, each of its prefixes and the lowest host route inside each, as
    /// they route (what [`Self::check_by_lookup`] may touch). The tries are not read.
    fn before_recorded(
        &self,
        index: u32,
        entry: Entry,
        spec: Option<&SubscriberSpec>,
    ) -> Result<Option<Before>, SubscriberError> {
        let Some(old) = self.recorded_prefixes(index, &entry)? else {
            return Ok(None);
        };
        let value = Some(index | SUBSCRIBER_BIT);
        let mut routes: Vec<(IpNet, Option<u32>)> = old.into_iter().map(|p| (p, value)).collect();
        for p in spec.iter().flat_map(|s| &s.prefixes) {
            for net in [Some(*p), lowest_host(p)].into_iter().flatten() {
                if !routes.iter().any(|(r, _)| *r == net) {
                    routes.push((net, self.p().exact_route(net)?));
                }
            }
        }
        Ok(Some(Before {
            index,
            entry,
            routes,
            by_lookup: true,
        }))
    }

    fn free_index(&self) -> Result<u32, SubscriberError> {
        let used: std::collections::BTreeSet<u32> =
            self.entries()?.into_iter().map(|(i, _)| i).collect();
        (1..=self.room())
            .find(|i| !used.contains(i))
            .ok_or(SubscriberError::Full { room: self.room() })
    }

    /// A route as an overlap error names it: `policy P` or `subscriber ID's prefix P`
    /// (its subscriber's entry read alone).
    fn what(&self, route: IpNet, value: u32) -> String {
        if value & SUBSCRIBER_BIT == 0 {
            return format!("policy {route}");
        }
        let i = value & !SUBSCRIBER_BIT;
        let id = self
            .entry(i)
            .map_or_else(|_| "?".to_owned(), |s| unpadded(&s.id));
        format!("subscriber {id}'s prefix {route}")
    }

    /// The refusal of `route` (routing to `value`) inside subscriber `spec`'s prefix `p`.
    fn inside(&self, spec: &SubscriberSpec, p: IpNet, route: IpNet, value: u32) -> SubscriberError {
        if route == p {
            return SubscriberError::Overlap(format!(
                "{} is subscriber {}'s prefix too: a prefix is one subscriber's",
                self.what(route, value),
                spec.id
            ));
        }
        SubscriberError::Overlap(format!(
            "{} is inside subscriber {}'s prefix {p}: its traffic would escape the subscriber's bucket",
            self.what(route, value),
            spec.id
        ))
    }

    /// The refusal of subscriber `spec`'s prefix `p` inside another's `route`.
    fn within(&self, spec: &SubscriberSpec, p: IpNet, route: IpNet, value: u32) -> SubscriberError {
        SubscriberError::Overlap(format!(
            "subscriber {}'s prefix {p} is inside {}: its traffic would escape that subscriber's bucket",
            spec.id,
            self.what(route, value)
        ))
    }

    /// Refuses a prefix of `spec` (subscriber `index`) that would let traffic escape a
    /// subscriber's bucket (see the module docs).
    fn check_overlaps(&self, spec: &SubscriberSpec, index: u32) -> Result<(), SubscriberError> {
        for &(route, value) in self.routes()? {
            if value == index | SUBSCRIBER_BIT {
                continue;
            }
            let theirs = value & SUBSCRIBER_BIT != 0;
            for p in &spec.prefixes {
                if p.contains(&route) {
                    return Err(self.inside(spec, *p, route, value));
                }
                if theirs && route.contains(p) {
                    return Err(self.within(spec, *p, route, value));
                }
            }
        }
        Ok(())
    }

    /// [`Self::check_overlaps`] of subscriber `spec` by lookups, no trie read (as
    /// [`Self::before`] read it: `before`, which holds every prefix of a subscriber in
    /// force: its own routes, passed over). For each prefix not its own already: the
    /// longest route covering it (one lookup: a shorter one of another subscriber's would
    /// hold it, which the rule refuses), and the routes inside it, walked from the lowest
    /// host route inside it (routed for the walk if it is not, to the subscriber's index,
    /// which the prefix is about to route to: a new one's entry is not in use yet, and the
    /// kernel gives such a key the default; taken out after, and put back by the journal
    /// if killed), until the walk leaves it.
    fn check_by_lookup(
        &mut self,
        spec: &SubscriberSpec,
        before: &Before,
    ) -> Result<(), SubscriberError> {
        let value = before.index | SUBSCRIBER_BIT;
        let own = (before.entry.in_use != 0).then_some(value);
        let was = |net: &IpNet| {
            before
                .routes
                .iter()
                .find(|(r, _)| r == net)
                .and_then(|(_, v)| *v)
        };
        for p in spec
            .prefixes
            .iter()
            .filter(|p| own.is_none() || was(p) != own)
        {
            if let Some(v) = self.p().longest_route(*p) {
                if self.p().exact_route(*p)?.is_some() {
                    return Err(self.inside(spec, *p, *p, v));
                }
                if v & SUBSCRIBER_BIT != 0 && Some(v) != own {
                    let route = self.p().covering_route(*p, v)?;
                    return Err(self.within(spec, *p, route, v));
                }
            }
            let Some(low) = lowest_host(p) else {
                continue;
            };
            let routed = match was(&low) {
                Some(v) if Some(v) != own => return Err(self.inside(spec, *p, low, v)),
                Some(_) => true,
                None => false,
            };
            if !routed {
                self.pm().route_value(low, value)?;
            }
            let found = self.first_other_inside(*p, low, own);
            if !routed {
                self.pm().unroute_if_there(low)?;
            }
            if let Some((route, v)) = found? {
                return Err(self.inside(spec, *p, route, v));
            }
        }
        Ok(())
    }

    /// [`Self::first_inside`], past the routes to `own` (a subscriber's own).
    fn first_other_inside(
        &self,
        p: IpNet,
        low: IpNet,
        own: Option<u32>,
    ) -> Result<Option<(IpNet, u32)>, SubscriberError> {
        let mut at = low;
        while let Some((route, v)) = self.first_inside(p, at)? {
            if Some(v) != own {
                return Ok(Some((route, v)));
            }
            at = route;
        }
        Ok(None)
    }

    /// The first route inside `p` after `low` (a route, the first of those inside `p` in
    /// the trie's walk), with its value.
    fn first_inside(&self, p: IpNet, low: IpNet) -> Result<Option<(IpNet, u32)>, SubscriberError> {
        let Some(next) = self.p().route_after(low)? else {
            return Ok(None);
        };
        if !p.contains(&next) {
            return Ok(None);
        }
        let v = self.p().exact_route(next)?.unwrap_or_default();
        Ok(Some((next, v)))
    }

    /// Adds subscriber `spec`, or replaces the subscriber of its id: its entry, its routes
    /// and its plan's slot if new. `before` is what [`SubscriberTable::before`] read.
    pub fn set(
        &mut self,
        spec: &SubscriberSpec,
        before: &Before,
    ) -> Result<Changed, SubscriberError> {
        let slots = self.p().slots()?;
        self.set_among(spec, before, &slots)
    }

    /// Every policy slot in use with its entry ([`PolicyTable::slots`]: one read of the
    /// array, which a change journals too).
    pub fn slots(&self) -> Result<Vec<(u32, Policy)>, SubscriberError> {
        Ok(self.p().slots()?)
    }

    /// The policy slots [`Self::set_among`] may write to give `spec` its plan, with their
    /// entries as they are: those of its plan's window (`policy::plan_window`: where an
    /// identical plan is, or a new one goes), in use or not, and the plan `before` has.
    /// `None` where the window has no free slot: the new plan may go anywhere, so every
    /// slot is to be read ([`Self::slots`]).
    pub fn plan_slots(
        &self,
        spec: &SubscriberSpec,
        before: &Before,
    ) -> Result<Option<Vec<(u32, Policy)>>, SubscriberError> {
        let config = self.p().config()?;
        let plan = spec.check((config.prefix_v4, config.prefix_v6))?;
        let mut slots = self.p().window_of(&plan)?;
        if slots.iter().all(|(_, p)| p.in_use != 0) {
            return Ok(None);
        }
        let now = before.entry.plan;
        if before.entry.in_use != 0 && slots.iter().all(|(slot, _)| *slot != now) {
            slots.push((now, self.p().slot(now)?));
        }
        Ok(Some(slots))
    }

    /// [`Self::set`] where the policy slots it may write are known to be `slots`, every
    /// one in use among them or free ([`Self::slots`], or [`Self::plan_slots`]; as the
    /// change journaled them: the array is not read again).
    pub fn set_among(
        &mut self,
        spec: &SubscriberSpec,
        before: &Before,
        slots: &[(u32, Policy)],
    ) -> Result<Changed, SubscriberError> {
        let config = self.p().config()?;
        let entry_plan = spec.check((config.prefix_v4, config.prefix_v6))?;
        let index = before.index;
        let old = before.entry;
        let old_prefixes: Vec<IpNet> = before.prefixes().copied().collect();
        let same_prefixes = old_prefixes.len() == spec.prefixes.len()
            && spec.prefixes.iter().all(|p| old_prefixes.contains(p));
        match (before.by_lookup, old.in_use != 0 && same_prefixes) {
            // Its prefixes are those in force: nothing new to check.
            (true, true) => {}
            (true, false) => self.check_by_lookup(spec, before)?,
            (false, _) => self.check_overlaps(spec, index)?,
        }
        let plan = match slots
            .iter()
            .find(|(_, p)| p.plan != 0 && same_plan(p, &entry_plan))
        {
            Some((slot, _)) => *slot,
            None => {
                let used = slots
                    .iter()
                    .filter(|(_, p)| p.in_use != 0)
                    .map(|(slot, _)| *slot)
                    .collect();
                self.pm().add_plan_among(&entry_plan, &used)?
            }
        };
        let entry = self.entry_for(spec, index, &old, plan)?;
        if old.in_use != 0
            && (entry.plan, entry.id, entry.name) == (old.plan, old.id, old.name)
            && same_prefixes
        {
            return Ok(Changed::Unchanged);
        }
        // The entry first: a new subscriber's before any route points at it.
        self.put(index, &entry, Some(&old))?;
        crate::crash::point("subscriber-step");
        if !same_prefixes {
            for p in &spec.prefixes {
                self.pm().route_value(*p, index | SUBSCRIBER_BIT)?;
            }
            for p in old_prefixes.iter().filter(|p| !spec.prefixes.contains(p)) {
                self.pm().unroute_if_there(*p)?;
            }
            let family = |v4: bool| spec.prefixes.iter().any(|p| p.addr().is_ipv4() == v4);
            self.pm().subscribers_routed(family(true), family(false))?;
        }
        if old.in_use == 0 || old.plan != plan {
            self.plan_joined(plan)?;
        }
        if old.in_use != 0 && old.plan != plan {
            self.plan_left(old.plan)?;
        }
        self.record_prefixes(&mut [(index, prefixes::encode(&spec.prefixes))], false);
        Ok(if old.in_use == 0 {
            Changed::Added
        } else {
            Changed::Changed
        })
    }

    /// Subscriber `spec`'s entry at `index` (`was`: as read before the change) under plan
    /// `slot`: its cell and counts as they are now (the kernel keeps charging meanwhile),
    /// a new subscriber's zeroed.
    fn entry_for(
        &self,
        spec: &SubscriberSpec,
        index: u32,
        was: &Entry,
        slot: u32,
    ) -> Result<Entry, SubscriberError> {
        let now = match was.in_use {
            0 => Entry::default(),
            _ => self.entry(index)?,
        };
        Ok(Entry {
            plan: slot,
            // Its count of prefixes (at least one): a set of the same prefixes is known
            // by lookups ([`Self::before`]); the kernel tests it against zero alone.
            in_use: spec.prefixes.len() as u32,
            id: padded(&spec.id),
            name: padded(&spec.name),
            ..now
        })
    }

    /// Removes subscriber `id` (as `before` read it): its routes, then its entry, then its
    /// plan if no other subscriber has it.
    pub fn del(&mut self, before: &Before) -> Result<Changed, SubscriberError> {
        self.unroute_and_clear(before)?;
        self.plan_left(before.entry.plan)?;
        self.record_prefixes(&mut [(before.index, prefixes::encode(&[]))], false);
        self.remember_without(before.index);
        Ok(Changed::Removed)
    }

    /// Saves the routes [`Self::before_known`] read, less those of subscriber `index`
    /// (removed), for the policy generation the removal ended at; the file goes if they
    /// cannot be saved.
    fn remember_without(&self, index: u32) {
        let (Some(known), Some(routes)) = (&self.known, self.known_read.take()) else {
            return;
        };
        let kept = routes.into_iter().filter(|(_, i)| *i != index);
        let saved = match self.p().config() {
            Ok(config) => known.save(config.policy_gen, kept).is_ok(),
            Err(_) => false,
        };
        if !saved {
            known.drop_file();
        }
    }

    /// Removes the routes of subscriber `before`, then frees its entry ([`Self::freed`]).
    fn unroute_and_clear(&mut self, before: &Before) -> Result<(), SubscriberError> {
        for (p, v) in &before.routes {
            if *v == Some(before.index | SUBSCRIBER_BIT) {
                self.pm().unroute_if_there(*p)?;
            }
        }
        self.pm().subscribers_routed(false, false)?;
        crate::crash::point("subscriber-step");
        let free = self.freed(&before.entry)?;
        self.put(before.index, &free, Some(&before.entry))?;
        Ok(())
    }

    /// The entry a removed subscriber `was` leaves: in a table placed by hash a tombstone
    /// (not in use, its id kept, so the probes past it go on), otherwise a free entry.
    fn freed(&self, was: &Entry) -> Result<Entry, SubscriberError> {
        Ok(match self.hashed()? {
            true => Entry {
                id: was.id,
                ..Entry::default()
            },
            false => Entry::default(),
        })
    }

    /// One more subscriber is on plan `slot`: its count in a table placed by hash (one
    /// read and one write of its entry; journaled with the policy slots).
    fn plan_joined(&mut self, slot: u32) -> Result<(), SubscriberError> {
        if self.hashed()? {
            let mut p = self.p().slot(slot)?;
            p.prefix_len = plan_users(&p) + 1;
            self.pm().rewrite_plan(slot, &p)?;
        }
        Ok(())
    }

    /// One subscriber left plan `slot`: freed if no subscriber has it any more, known
    /// from its count in a table placed by hash, from every entry otherwise.
    fn plan_left(&mut self, slot: u32) -> Result<(), SubscriberError> {
        if self.hashed()? {
            let mut p = self.p().slot(slot)?;
            p.prefix_len = plan_users(&p).saturating_sub(1);
            match p.prefix_len {
                0 => self.pm().drop_plan(slot)?,
                _ => self.pm().rewrite_plan(slot, &p)?,
            }
            return Ok(());
        }
        if self.entries()?.iter().all(|(_, s)| s.plan != slot) {
            self.pm().drop_plan(slot)?;
        }
        Ok(())
    }

    /// Puts back what `before` read: the entry (its cell as it was then), and each route.
    /// The policy generation moves on so every key resolves again.
    pub fn restore(&mut self, before: &Before) -> Result<(), SubscriberError> {
        // The record too: whatever the change wrote, written again.
        self.put(before.index, &before.entry, None)?;
        for (p, v) in &before.routes {
            match v {
                Some(v) => self.pm().route_value(*p, *v)?,
                None => self.pm().unroute_if_there(*p)?,
            }
        }
        self.pm().subscribers_routed(false, false)?;
        let value = Some(before.index | SUBSCRIBER_BIT);
        let own: Vec<IpNet> = match before.entry.in_use {
            0 => Vec::new(),
            _ => before
                .routes
                .iter()
                .filter(|(_, v)| *v == value)
                .map(|(p, _)| *p)
                .collect(),
        };
        self.record_prefixes(&mut [(before.index, prefixes::encode(&own))], false);
        Ok(())
    }
}
