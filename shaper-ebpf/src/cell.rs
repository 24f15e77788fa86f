//! Metering one frame: find or create its key's state, resolve its policy (`policy`),
//! then pass, drop, or charge the source's cell and, with an aggregate, the prefix's cell.
//! The same code serves both families: it takes the map (IPv4 or IPv6 keys) by reference.
//!
//! Cells are shared by all CPUs, so every update is a bounded compare-and-swap loop around
//! the shared GCRA decision; counters are atomic adds (per-policy ones are per-CPU).

use aya_ebpf::maps::LruHashMap;
use shaper_common::{
    gcra::{self, Limit},
    maps::{ACTION_DROP, ACTION_PASS, Cell, Config, PolicyStats, SourceState},
};

use crate::{
    atomic,
    counters::bump,
    maps::POLICY_STATS,
    policy::{self, Rule},
};

/// How many times a CPU retries when other CPUs keep updating the same cell between its
/// read and its swap. Each failed swap means another CPU made progress on this cell, so
/// exhaustion is rare and only under heavy contention on a single cell.
const CAS_RETRIES: usize = 4;

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

/// Why a frame did not conform.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refused {
    Source,
    Aggregate,
}

/// Meters a `len`-byte frame of `key`'s, in `map`, at `now` (ticks); `lookup` finds the
/// key's policy slot when the cached one is stale.
#[inline(always)]
pub fn meter<K>(
    map: &LruHashMap<K, SourceState>,
    key: &K,
    len: u32,
    now: u64,
    config: &Config,
    lookup: impl FnOnce() -> u32,
) -> Outcome {
    let Some(state) = state_of(map, key) else {
        bump(|c| c.untracked_packets += 1);
        return Outcome::Passed;
    };
    // SAFETY: `state` points into the map value, valid for this program run; the fields
    // other CPUs write are accessed atomically.
    unsafe {
        let slot = policy::resolve(state, config, lookup);
        let rule = policy::rule(config, slot);
        let refused = match rule.action {
            ACTION_PASS => None,
            ACTION_DROP => Some(Refused::Source),
            _ => charge(&raw mut (*state).cell, &rule, len, now).err(),
        };
        let outcome = match refused {
            None => Outcome::Passed,
            Some(_) if rule.monitor => Outcome::WouldDrop,
            Some(_) => Outcome::Dropped,
        };
        let (packets, bytes) = match outcome {
            Outcome::Passed => (
                &raw mut (*state).passed_packets,
                &raw mut (*state).passed_bytes,
            ),
            Outcome::Dropped => (
                &raw mut (*state).dropped_packets,
                &raw mut (*state).dropped_bytes,
            ),
            Outcome::WouldDrop => (
                &raw mut (*state).would_drop_packets,
                &raw mut (*state).would_drop_bytes,
            ),
        };
        atomic::add(packets, 1);
        atomic::add(bytes, u64::from(len));
        count_policy(rule.slot, outcome, refused == Some(Refused::Aggregate), len);
        outcome
    }
}

/// The key's state, created (idle, policy unresolved) on its first frame; `None` if no
/// entry could be made.
#[inline(always)]
fn state_of<K>(map: &LruHashMap<K, SourceState>, key: &K) -> Option<*mut SourceState> {
    if let Some(state) = map.get_ptr_mut(key) {
        return Some(state);
    }
    match map.insert(key, SourceState::default(), BPF_NOEXIST) {
        Ok(()) => bump(|c| c.new_sources += 1),
        // Another CPU created it first: meter against its entry.
        Err(e) if e == -EEXIST => {}
        Err(_) => return None,
    }
    map.get_ptr_mut(key)
}

/// Charges the frame to the source's cell and, if the rule has one, to the aggregate
/// cell: both or neither. The source's decision is taken first without charging; then the
/// aggregate is charged; then the source's decision is published, and if that fails after
/// all (another CPU used up the room meanwhile) the aggregate is refunded.
///
/// # Safety
/// `cell` points to a live map value.
#[inline(always)]
unsafe fn charge(cell: *mut Cell, rule: &Rule, len: u32, now: u64) -> Result<(), Refused> {
    unsafe {
        carry_over(cell, rule.limit, now);
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        let new = rule.limit.admit(old, now, len).ok_or(Refused::Source)?;
        let Some((aggregate, limit)) = rule.aggregate else {
            return publish(tat, old, new, rule.limit, len, now)
                .map(drop)
                .ok_or(Refused::Source);
        };
        carry_over(aggregate, limit, now);
        let aggregate_tat = &raw mut (*aggregate).tat;
        let aggregate_old = atomic::load(aggregate_tat);
        let aggregate_new = limit
            .admit(aggregate_old, now, len)
            .ok_or(Refused::Aggregate)?;
        let cost = publish(aggregate_tat, aggregate_old, aggregate_new, limit, len, now)
            .ok_or(Refused::Aggregate)?;
        if publish(tat, old, new, rule.limit, len, now).is_some() {
            return Ok(());
        }
        atomic::add(aggregate_tat, cost.wrapping_neg());
        Err(Refused::Source)
    }
}

/// The bounded compare-and-swap loop: publish `new`, decided on the TAT read as `old`,
/// only if nobody changed the TAT meanwhile; otherwise decide again on what was found.
/// Returns what was charged (in ticks), or `None` if the frame no longer conforms (nothing
/// is written) or every retry lost to other CPUs.
#[inline(always)]
unsafe fn publish(
    tat: *mut u64,
    mut old: u64,
    mut new: u64,
    limit: &Limit,
    len: u32,
    now: u64,
) -> Option<u64> {
    for _ in 0..CAS_RETRIES {
        match unsafe { atomic::compare_exchange(tat, old, new) } {
            // What was charged: the new TAT less the base it was charged from.
            Ok(()) => return Some(new.wrapping_sub(gcra::base(old, now))),
            Err(found) => old = found,
        }
        new = limit.admit(old, now, len)?;
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
        for _ in 0..CAS_RETRIES {
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

/// Adds the frame to its policy's per-CPU counters.
#[inline(always)]
fn count_policy(slot: u32, outcome: Outcome, by_aggregate: bool, len: u32) {
    let Some(stats) = POLICY_STATS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: a per-CPU entry is only touched by programs on this CPU, which do not
    // preempt each other.
    let s: &mut PolicyStats = unsafe { &mut *stats };
    let bytes = u64::from(len);
    match outcome {
        Outcome::Passed => {
            s.passed_packets += 1;
            s.passed_bytes += bytes;
        }
        Outcome::Dropped => {
            s.dropped_packets += 1;
            s.dropped_bytes += bytes;
        }
        Outcome::WouldDrop => {
            s.would_drop_packets += 1;
            s.would_drop_bytes += bytes;
        }
    }
    if by_aggregate {
        s.aggregate_refused_packets += 1;
        s.aggregate_refused_bytes += bytes;
    }
}
