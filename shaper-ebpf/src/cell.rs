//! Metering one frame: find or create its key's state, resolve its policy (`policy`),
//! then pass, drop, or charge the source's cell and, with an aggregate, the prefix's cell.
//! The same code serves both families: it takes the map (IPv4 or IPv6 keys) by reference.
//!
//! Cells are shared by all CPUs, so every update is a bounded compare-and-swap loop around
//! the shared GCRA decision; counters are atomic adds (per-policy ones are per-CPU).

use aya_ebpf::maps::LruHashMap;
use shaper_common::{
    gcra::{self, Limit},
    maps::{
        ACTION_DROP, ACTION_PASS, AdmissionCells, CAS_TRIES, Cell, Config, Outcomes, PolicyStats,
        SourceState,
    },
};

use shaper_ebpf::atomic;

use crate::{
    counters::bump,
    maps::{ADMISSION, POLICY_STATS},
    policy::{self, Rule},
};

/// BPF_NOEXIST: create only; a concurrent creator wins and we meter against its cell.
const BPF_NOEXIST: u64 = 1;
/// What the kernel returns (negated) when a BPF_NOEXIST insert finds the key.
const EEXIST: i32 = 17;

#[derive(Clone, Copy)]
pub enum Verdict {
    Pass,
    Drop,
}

/// What became of a metered frame, for the counters.
#[derive(Clone, Copy)]
pub enum Outcome {
    Passed,
    Dropped,
    /// Passed in monitor mode; enforcement would have dropped it.
    WouldDrop,
}

impl Outcome {
    pub fn verdict(self) -> Verdict {
        match self {
            Self::Dropped => Verdict::Drop,
            Self::Passed | Self::WouldDrop => Verdict::Pass,
        }
    }
}

/// What became of a metered frame, and whether its key had a cell of its own.
#[derive(Clone, Copy)]
pub struct Metered {
    pub outcome: Outcome,
    /// The key was refused a cell by new-source admission: the frame was metered in its
    /// policy's shared cell of unadmitted frames.
    pub unadmitted: bool,
}

/// What a passed frame charged the aggregate cell: its TAT and the ticks added, so a
/// frame metered twice can give them back.
#[derive(Clone, Copy)]
struct Charged {
    tat: *mut u64,
    ticks: u64,
}

/// Why a frame did not conform.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refused {
    Source,
    Aggregate,
}

/// What became of a key new to the table.
enum New {
    /// Its entry was created with this frame already metered in it.
    Created(Outcome, Option<Refused>),
    /// Another CPU created it meanwhile: meter the frame against that entry.
    Exists(*mut SourceState),
    /// Admission refused it one: meter the frame in the policy's shared cell.
    Unadmitted(*mut AdmissionCells),
    /// The map could not take the entry: pass the frame unmetered.
    Untracked,
}

/// Meters a `len`-byte frame of `key`'s, in `map`, at `now` (ticks); `lookup` finds the
/// key's policy slot when the key is new or its cached slot is stale.
#[inline(always)]
pub fn meter<K>(
    map: &LruHashMap<K, SourceState>,
    key: &K,
    len: u32,
    now: u64,
    config: &Config,
    lookup: impl FnOnce() -> u32,
) -> Metered {
    // SAFETY: `state` points into the map value, valid for this program run; the fields
    // other CPUs write are accessed atomically.
    unsafe {
        let (state, rule) = match map.get_ptr_mut(key) {
            Some(state) => (
                state,
                policy::rule(config, policy::resolve(state, config, lookup)),
            ),
            None => {
                let rule = policy::rule(config, lookup());
                match create(map, key, config, &rule, len, now) {
                    New::Created(outcome, refused) => {
                        count_policy(rule.slot, outcome, refused, len, false);
                        return Metered {
                            outcome,
                            unadmitted: false,
                        };
                    }
                    New::Exists(state) => (state, rule),
                    New::Unadmitted(cells) => {
                        return unadmitted(&raw mut (*cells).unadmitted, &rule, len, now);
                    }
                    New::Untracked => {
                        bump(|c| c.untracked_packets += 1);
                        return Metered {
                            outcome: Outcome::Passed,
                            unadmitted: false,
                        };
                    }
                }
            }
        };
        let (outcome, refused, _) = decide(&raw mut (*state).cell, &rule, len, now);
        count_source(state, outcome, len);
        count_policy(rule.slot, outcome, refused, len, false);
        Metered {
            outcome,
            unadmitted: false,
        }
    }
}

/// Adds the frame to the key's own counters, atomically: every CPU shares them.
///
/// # Safety
/// `state` points to a live map value, or to a value of this program's own.
#[inline(always)]
unsafe fn count_source(state: *mut SourceState, outcome: Outcome, len: u32) {
    unsafe {
        let (packets, bytes) = outcome_counters(&raw mut (*state).outcomes, outcome);
        atomic::add(packets, 1);
        atomic::add(bytes, u64::from(len));
    }
}

/// The rule's verdict on a frame metered in `cell`, charging the cell (and the
/// aggregate) if it passes.
///
/// # Safety
/// `cell` points to a live map value.
#[inline(always)]
unsafe fn decide(
    cell: *mut Cell,
    rule: &Rule,
    len: u32,
    now: u64,
) -> (Outcome, Option<Refused>, Option<Charged>) {
    let (refused, charged) = match rule.action {
        ACTION_PASS => (None, None),
        ACTION_DROP => (Some(Refused::Source), None),
        _ => match unsafe { charge(cell, rule, len, now) } {
            Ok(charged) => (None, charged),
            Err(refused) => (Some(refused), None),
        },
    };
    let outcome = match refused {
        None => Outcome::Passed,
        Some(_) if rule.monitor => Outcome::WouldDrop,
        Some(_) => Outcome::Dropped,
    };
    (outcome, refused, charged)
}

/// Meters the frame of a key refused a cell: all such frames of a policy share `cell`,
/// at the policy's per-source limit.
///
/// # Safety
/// `cell` points to a live map value.
#[inline(always)]
unsafe fn unadmitted(cell: *mut Cell, rule: &Rule, len: u32, now: u64) -> Metered {
    let (outcome, refused, _) = unsafe { decide(cell, rule, len, now) };
    count_policy(rule.slot, outcome, refused, len, true);
    Metered {
        outcome,
        unadmitted: true,
    }
}

/// A key new to the table: its entry, created with its policy slot resolved and this
/// frame already metered in its fresh cell, if admission lets it have one.
///
/// The entry is inserted and not looked up again: a lookup would mark it referenced,
/// and the kernel's LRU evicts unreferenced entries first, so the entry of a key seen
/// once (a spoofed source) goes before those of sources that keep sending. A refusal
/// costs the admission cell's check and nothing else: no insert, no second lookup.
///
/// # Safety
/// Map values only are dereferenced.
#[inline(always)]
unsafe fn create<K>(
    map: &LruHashMap<K, SourceState>,
    key: &K,
    config: &Config,
    rule: &Rule,
    len: u32,
    now: u64,
) -> New {
    let admission = rule.admission;
    if admission.limited() {
        let Some(cells) = ADMISSION.get_ptr_mut(rule.admission_slot) else {
            return New::Untracked;
        };
        // SAFETY: `cells` points to a live map value.
        if !unsafe { take(&raw mut (*cells).admit, &admission.limit, 1, now, 0) } {
            // The policy's own shared cell, wherever its admission is metered.
            let own = if rule.admission_slot == rule.slot {
                Some(cells)
            } else {
                ADMISSION.get_ptr_mut(rule.slot)
            };
            return own.map_or(New::Untracked, New::Unadmitted);
        }
    }
    let mut state = SourceState {
        policy: policy::cache_word(config, rule.slot),
        ..SourceState::default()
    };
    // SAFETY: `state` is this program's own; the aggregate cell is a live map value.
    let (outcome, refused, charged) = unsafe { decide(&raw mut state.cell, rule, len, now) };
    unsafe { count_source(&raw mut state, outcome, len) };
    match map.insert(key, state, BPF_NOEXIST) {
        Ok(()) => {
            bump(|c| c.new_sources += 1);
            if let Some(stats) = POLICY_STATS.get_ptr_mut(rule.slot) {
                // SAFETY: this CPU's entry (see `count_policy`).
                unsafe { (*stats).new_sources += 1 };
            }
            New::Created(outcome, refused)
        }
        // Another CPU created it first: give back what the aggregate was charged for the
        // fresh cell, and meter against that CPU's entry.
        Err(e) if e == -EEXIST => {
            if let Some(Charged { tat, ticks }) = charged {
                // SAFETY: the aggregate's TAT, a live map value.
                unsafe { atomic::add(tat, ticks.wrapping_neg()) };
            }
            map.get_ptr_mut(key).map_or(New::Untracked, New::Exists)
        }
        Err(_) => New::Untracked,
    }
}

/// Charges `len` bytes to `cell` under `limit` if they conform, the burst tolerance
/// stretched by `slack` ticks (shaping's horizon; 0 when policing): whether they did.
///
/// # Safety
/// `cell` points to a live map value.
#[inline(always)]
unsafe fn take(cell: *mut Cell, limit: &Limit, len: u32, now: u64, slack: u64) -> bool {
    unsafe {
        carry_over(cell, limit, now);
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        limit
            .admit_within(old, now, len, slack)
            .and_then(|new| publish(tat, old, new, limit, len, now, slack))
            .is_some()
    }
}

/// Charges the frame to the source's cell and, if the rule has one, to the aggregate
/// cell: both or neither (what the aggregate was charged is returned). The source's decision is taken first without charging; then the
/// aggregate is charged; then the source's decision is published, and if that fails after
/// all (another CPU used up the room meanwhile) the aggregate is refunded.
///
/// # Safety
/// `cell` points to a live map value.
#[inline(always)]
unsafe fn charge(
    cell: *mut Cell,
    rule: &Rule,
    len: u32,
    now: u64,
) -> Result<Option<Charged>, Refused> {
    unsafe {
        let (aggregate, limit) = (rule.aggregate_cell, rule.aggregate_limit);
        if aggregate.is_null() {
            return take(cell, rule.limit, len, now, rule.slack)
                .then_some(None)
                .ok_or(Refused::Source);
        }
        carry_over(cell, rule.limit, now);
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        let new = rule.limit.admit(old, now, len).ok_or(Refused::Source)?;
        carry_over(aggregate, limit, now);
        let aggregate_tat = &raw mut (*aggregate).tat;
        let aggregate_old = atomic::load(aggregate_tat);
        let aggregate_new = limit
            .admit(aggregate_old, now, len)
            .ok_or(Refused::Aggregate)?;
        // With an aggregate a rule never shapes (userspace refuses shape mode with an
        // aggregate rate): both cells are policed.
        let cost = publish(
            aggregate_tat,
            aggregate_old,
            aggregate_new,
            limit,
            len,
            now,
            0,
        )
        .ok_or(Refused::Aggregate)?;
        if publish(tat, old, new, rule.limit, len, now, 0).is_some() {
            return Ok(Some(Charged {
                tat: aggregate_tat,
                ticks: cost,
            }));
        }
        atomic::add(aggregate_tat, cost.wrapping_neg());
        Err(Refused::Source)
    }
}

/// The bounded compare-and-swap loop: publish `new`, decided on the TAT read as `old`,
/// only if nobody changed the TAT meanwhile; otherwise decide again on what was found.
/// Returns what was charged (in ticks), or `None` if the frame no longer conforms (nothing
/// is written) or every try lost to other CPUs. Each CPU tries [`CAS_TRIES`] times: a
/// failed swap means another CPU made progress on this cell, so exhaustion is rare and
/// only under heavy contention on a single cell. The try that won is counted.
///
/// Shaping: the retries stay within `slack` ticks past the burst, and the time the frame
/// may leave (the new TAT less τ) is left in this CPU's counters
/// ([`Counters::departure_ticks`](shaper_common::maps::Counters)) for the tc entry point,
/// without a branch: the last charge of a frame is its own cell's.
#[inline(always)]
unsafe fn publish(
    tat: *mut u64,
    mut old: u64,
    mut new: u64,
    limit: &Limit,
    len: u32,
    now: u64,
    slack: u64,
) -> Option<u64> {
    for try_ in 0..CAS_TRIES {
        match unsafe { atomic::compare_exchange(tat, old, new) } {
            Ok(()) => {
                bump(|c| {
                    if let Some(won) = c.cas_won.get_mut(try_) {
                        *won += 1;
                    }
                    c.departure_ticks = new.wrapping_sub(limit.tau_ticks);
                });
                // What was charged: the new TAT less the base it was charged from.
                return Some(new.wrapping_sub(gcra::base(old, now)));
            }
            Err(found) => old = found,
        }
        new = limit.admit_within(old, now, len, slack)?;
    }
    bump(|c| c.cas_exhausted += 1);
    None
}

/// Brings a cell charged under another limit over to `limit`, keeping its backlog in
/// bytes (`shaper_common::rescale`). One CPU wins the switch of the scale and moves the
/// TAT; a CPU that meters in between sees the TAT not yet moved, for at most a packet.
///
/// # Safety
/// `cell` points to a live map value.
#[inline(always)]
unsafe fn carry_over(cell: *mut Cell, limit: &Limit, now: u64) {
    let to = limit.scale();
    unsafe {
        let scale = &raw mut (*cell).scale;
        let from = atomic::load(scale);
        if from == to || atomic::compare_exchange(scale, from, to).is_err() {
            return;
        }
        let tat = &raw mut (*cell).tat;
        let mut old = atomic::load(tat);
        for _ in 0..CAS_TRIES {
            let new = limit.rescale(old, now, from);
            if new == old {
                return;
            }
            match atomic::compare_exchange(tat, old, new) {
                Ok(()) => return,
                Err(found) => old = found,
            }
        }
    }
}

/// Adds the frame to its policy's per-CPU counters: those of unadmitted frames, or the
/// policy's own, and the aggregate's refusals.
#[inline(always)]
fn count_policy(slot: u32, outcome: Outcome, refused: Option<Refused>, len: u32, unadmitted: bool) {
    let Some(stats) = POLICY_STATS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: a per-CPU entry is only touched by programs on this CPU, which do not
    // preempt each other.
    let s: &mut PolicyStats = unsafe { &mut *stats };
    let bytes = u64::from(len);
    let outcomes = if unadmitted {
        &mut s.unadmitted
    } else {
        &mut s.outcomes
    };
    count_outcome(outcomes, outcome, bytes);
    if refused == Some(Refused::Aggregate) {
        s.aggregate_refused_packets += 1;
        s.aggregate_refused_bytes += bytes;
    }
}

/// The packet and byte counters of `outcome` in `o`.
///
/// # Safety
/// `o` points to live counters: a map value, or a value of this program's own.
#[inline(always)]
unsafe fn outcome_counters(o: *mut Outcomes, outcome: Outcome) -> (*mut u64, *mut u64) {
    unsafe {
        match outcome {
            Outcome::Passed => (&raw mut (*o).passed_packets, &raw mut (*o).passed_bytes),
            Outcome::Dropped => (&raw mut (*o).dropped_packets, &raw mut (*o).dropped_bytes),
            Outcome::WouldDrop => (
                &raw mut (*o).would_drop_packets,
                &raw mut (*o).would_drop_bytes,
            ),
        }
    }
}

/// Adds a frame of `bytes` to the counters of `outcome` in `o`, which only this CPU
/// updates (a per-CPU map entry).
#[inline(always)]
pub fn count_outcome(o: &mut Outcomes, outcome: Outcome, bytes: u64) {
    // SAFETY: `o` is a live, exclusive reference.
    unsafe {
        let (packets, total) = outcome_counters(o, outcome);
        *packets += 1;
        *total += bytes;
    }
}
