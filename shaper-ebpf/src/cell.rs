//! GCRA cells shared by every CPU, and the rule's decision on one frame
//! ([`shaper_decide`]).
//!
//! A cell is a 64-bit TAT that every CPU updates with a bounded compare-and-swap loop
//! ([`publish`]): decide on the TAT read, swap in the new one only if nobody changed it
//! meanwhile, otherwise decide again on what was found. The cell also records the scale of
//! the limit it is expressed in, so a rate change carries its backlog over
//! ([`carry_over`], `shaper_common::rescale`).
//!
//! [`decide`] is the rule's decision, inlined into the hot path of each family's meter;
//! [`shaper_decide`] is the same as a global function, which the verifier checks once
//! with any cell and any policy slot, for the colder paths of new keys (a fresh cell, the
//! shared cell of unadmitted frames, in both families).

use shaper_common::{
    gcra::{self, Limit},
    maps::{ACTION_DROP, ACTION_PASS, CAS_TRIES, Cell, Counters, PolicyStats},
    shape::delay_ticks,
};

use shaper_ebpf::atomic;

use crate::{
    maps::{CONFIG, POLICY_STATS},
    outcome::{self, AGGREGATE, BLOCKED, Metered, Outcome, Reason, SOURCE},
    policy::{self, Rule},
};

/// `shaper_decide`'s `slot_flags`: the frame is an unadmitted one (counted apart).
pub const DECIDE_UNADMITTED: u64 = 1 << 32;
/// `shaper_decide`'s `slot_flags`: leave the policy's counters to the caller.
pub const DECIDE_UNCOUNTED: u64 = 1 << 33;

/// The rule of policy slot `slot_flags as u32` on a `len`-byte frame metered in `cell` at
/// `now` (ticks): pass, drop, or charge the cell and, if the policy has one, its prefix's
/// aggregate cell; counted in the policy's counters (those of unadmitted frames with
/// [`DECIDE_UNADMITTED`]) and, for the compare-and-swap, in `counters`. Returns a
/// [`Metered`]: for a charged aggregate, what it was charged, so a caller that finds the
/// frame must be metered elsewhere after all can give it back.
///
/// A global function: `cell` and `counters` may be null as far as the verifier knows.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_decide(
    cell: *mut Cell,
    counters: *mut Counters,
    slot_flags: u64,
    len: u32,
    now: u64,
) -> u64 {
    decide(cell, counters, slot_flags, len, now)
}

/// [`shaper_decide`], inlined where a call would cost the hot path (a known key's meter).
#[inline(always)]
pub fn decide(
    cell: *mut Cell,
    counters: *mut Counters,
    slot_flags: u64,
    len: u32,
    now: u64,
) -> u64 {
    let slot = slot_flags as u32;
    let Some(config) = CONFIG.get(0) else {
        return Metered::UNTRACKED.0;
    };
    if cell.is_null() || counters.is_null() {
        return Metered::UNTRACKED.0;
    }
    let rule = policy::rule(config, slot);
    // SAFETY: `cell` and `counters` are live map values, or values on a caller's stack.
    let charged = match rule.action {
        ACTION_PASS => Ok(Charged::Source(0)),
        ACTION_DROP => Err(BLOCKED),
        _ => unsafe { charge(cell, &rule, len, now, &mut *counters) },
    };
    let (outcome, reason) = match charged {
        Ok(_) => (Outcome::Passed, SOURCE),
        Err(reason) if rule.monitor => (Outcome::WouldDrop, reason),
        Err(reason) => (Outcome::Dropped, reason),
    };
    let mut metered = match charged {
        Ok(Charged::Source(delay)) => Metered::new(outcome, reason, delay),
        Ok(Charged::Aggregate(cost)) => Metered::new(outcome, reason, 0).charged_aggregate(cost),
        Err(_) => Metered::new(outcome, reason, 0),
    };
    if slot_flags & DECIDE_UNADMITTED != 0 {
        metered = metered.unadmitted();
    }
    if slot_flags & DECIDE_UNCOUNTED == 0 {
        count_policy(slot, metered, len);
    }
    metered.0
}

/// What a frame that conformed was charged.
#[derive(Clone, Copy)]
enum Charged {
    /// Its own cell only: it is held back this many ticks (shaping; 0 when policing).
    Source(u64),
    /// Its own cell and its prefix's aggregate, which was charged this many ticks.
    Aggregate(u64),
}

/// Charges `len` bytes to `cell` under `limit` if they conform, the burst tolerance
/// stretched by `slack` ticks (shaping's horizon; 0 when policing): how many ticks the
/// frame is held back (0 when policing), or `None` if it does not conform.
///
/// # Safety
/// `cell` points to a live map value, or to a value on a caller's stack.
#[inline(always)]
pub unsafe fn take(
    cell: *mut Cell,
    limit: &Limit,
    len: u32,
    now: u64,
    slack: u64,
    counters: &mut Counters,
) -> Option<u64> {
    unsafe {
        carry_over(cell, limit, now);
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        let new = limit.admit_within(old, now, len, slack)?;
        publish(tat, old, new, limit, len, now, slack, counters)
            .map(|(new, _)| delay_ticks(new, now, limit.tau_ticks))
    }
}

/// Charges the frame to the source's cell and, if the rule has one, to the aggregate
/// cell: both or neither. The source's decision is taken first without charging; then
/// the aggregate is charged; then the source's decision is published, and if that fails
/// after all (another CPU used up the room meanwhile) the aggregate is refunded.
///
/// # Safety
/// `cell` points to a live map value, or to a value on a caller's stack.
#[inline(always)]
unsafe fn charge(
    cell: *mut Cell,
    rule: &Rule,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Result<Charged, Reason> {
    unsafe {
        let (aggregate, limit) = (rule.aggregate_cell, rule.aggregate_limit);
        if aggregate.is_null() {
            return take(cell, rule.limit, len, now, rule.slack, counters)
                .map(Charged::Source)
                .ok_or(SOURCE);
        }
        carry_over(cell, rule.limit, now);
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        let new = rule.limit.admit(old, now, len).ok_or(SOURCE)?;
        carry_over(aggregate, limit, now);
        let aggregate_tat = &raw mut (*aggregate).tat;
        let aggregate_old = atomic::load(aggregate_tat);
        let aggregate_new = limit.admit(aggregate_old, now, len).ok_or(AGGREGATE)?;
        // With an aggregate a rule never shapes (userspace refuses shape mode with an
        // aggregate rate): both cells are policed.
        let (_, cost) = publish(
            aggregate_tat,
            aggregate_old,
            aggregate_new,
            limit,
            len,
            now,
            0,
            counters,
        )
        .ok_or(AGGREGATE)?;
        if publish(tat, old, new, rule.limit, len, now, 0, counters).is_some() {
            return Ok(Charged::Aggregate(cost));
        }
        atomic::add(aggregate_tat, cost.wrapping_neg());
        Err(SOURCE)
    }
}

/// The bounded compare-and-swap loop: publish `new`, decided on the TAT read as `old`,
/// only if nobody changed the TAT meanwhile; otherwise decide again on what was found.
/// Returns the TAT published and what was charged (in ticks), or `None` if the frame no
/// longer conforms (nothing is written) or every try lost to other CPUs. Each CPU tries
/// [`CAS_TRIES`] times: a failed swap means another CPU made progress on this cell, so
/// exhaustion is rare and only under heavy contention on a single cell. The try that won
/// is counted.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's whole state, kept in registers"
)]
#[inline(always)]
unsafe fn publish(
    tat: *mut u64,
    mut old: u64,
    mut new: u64,
    limit: &Limit,
    len: u32,
    now: u64,
    slack: u64,
    counters: &mut Counters,
) -> Option<(u64, u64)> {
    for try_ in 0..CAS_TRIES {
        match unsafe { atomic::compare_exchange(tat, old, new) } {
            Ok(()) => {
                if let Some(won) = counters.cas_won.get_mut(try_) {
                    *won += 1;
                }
                // What was charged: the new TAT less the base it was charged from.
                return Some((new, new.wrapping_sub(gcra::base(old, now))));
            }
            Err(found) => old = found,
        }
        new = limit.admit_within(old, now, len, slack)?;
    }
    counters.cas_exhausted += 1;
    None
}

/// Brings a cell charged under another limit over to `limit`, keeping its backlog in
/// bytes (`shaper_common::rescale`): a compare, and a call to [`shaper_carry_over`] in
/// the rare case that the cell's scale is not the limit's.
///
/// # Safety
/// `cell` points to a live map value, or to a value on a caller's stack.
#[inline(always)]
unsafe fn carry_over(cell: *mut Cell, limit: &Limit, now: u64) {
    // SAFETY: the caller's.
    if unsafe { atomic::load(&raw const (*cell).scale) } != limit.scale() {
        shaper_carry_over(cell, limit, now);
    }
}

/// The work of [`carry_over`]: one CPU wins the switch of the scale and moves the TAT; a
/// CPU that meters in between sees the TAT not yet moved, for at most a packet. A global
/// function: the rescaling arithmetic, whose many branches would otherwise be walked in
/// every caller's state, is verified once. Returns 1 if this CPU moved the TAT.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_carry_over(cell: *mut Cell, limit: *const Limit, now: u64) -> u32 {
    // SAFETY: a global function's pointer arguments are null or point to whole values:
    // here a live map value or a caller's own.
    let Some(limit) = (unsafe { limit.as_ref() }) else {
        return 0;
    };
    if cell.is_null() {
        return 0;
    }
    let to = limit.scale();
    unsafe {
        let scale = &raw mut (*cell).scale;
        let from = atomic::load(scale);
        if from == to || atomic::compare_exchange(scale, from, to).is_err() {
            return 0;
        }
        let tat = &raw mut (*cell).tat;
        let mut old = atomic::load(tat);
        for _ in 0..CAS_TRIES {
            let new = limit.rescale(old, now, from);
            if new == old {
                return 1;
            }
            match atomic::compare_exchange(tat, old, new) {
                Ok(()) => return 1,
                Err(found) => old = found,
            }
        }
    }
    0
}

/// Adds the frame to its policy's per-CPU counters: those of unadmitted frames, or the
/// policy's own, and the aggregate's refusals.
#[inline(always)]
pub fn count_policy(slot: u32, metered: Metered, len: u32) {
    let (outcome, reason) = (metered.outcome(), metered.reason());
    let Some(stats) = POLICY_STATS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: a per-CPU entry is only touched by programs on this CPU, which do not
    // preempt each other.
    let s: &mut PolicyStats = unsafe { &mut *stats };
    let bytes = u64::from(len);
    let outcomes = if metered.is_unadmitted() {
        &mut s.unadmitted
    } else {
        &mut s.outcomes
    };
    outcome::count_outcome(outcomes, outcome, bytes);
    if outcome != Outcome::Passed && reason == AGGREGATE {
        s.aggregate_refused_packets += 1;
        s.aggregate_refused_bytes += bytes;
    }
}
