//! GCRA cells shared by every CPU, and the rule's decision on one frame ([`decide`]).
//!
//! A cell is a 64-bit TAT that every CPU updates with a bounded compare-and-swap loop
//! ([`publish`]): decide on the TAT read, swap in the new one only if nobody changed it
//! meanwhile, otherwise decide again on what was found. The cell also records the scale of
//! the limit it is expressed in, so a rate change carries its backlog over
//! ([`carry_over`], `shaper_common::rescale`).
//!
//! What is rare is a global function, verified once rather than in every caller's state:
//! a compare-and-swap's retries ([`shaper_retry`]) and a cell's carry-over to a new rate
//! ([`shaper_carry_over`]). The rest is inlined into each meter: on the hot path a call
//! costs more than the arithmetic.

use shaper_common::{
    gcra::{self, Limit},
    maps::{ACTION_DROP, ACTION_PASS, CAS_TRIES, Cell, Counters, PolicyStats},
    shape::delay_ticks,
};

use shaper_ebpf::atomic;

use crate::{
    maps::{COUNTERS, POLICY_STATS},
    outcome::{self, AGGREGATE, BLOCKED, Metered, Outcome, Reason, SOURCE},
    policy::Rule,
};

/// How [`decide`] counts a frame in its policy's counters.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// In the policy's own counters.
    Policy,
    /// In those of the policy's unadmitted frames.
    Unadmitted,
    /// Not at all: the caller counts it ([`count_policy`]) once it knows it should.
    Later,
}

/// The rule of policy slot `slot` (`rule`) on a `len`-byte frame metered in `cell` at
/// `now` (ticks): pass, drop, or charge the cell and, if the policy has one, its prefix's
/// aggregate cell; counted in the policy's counters as `count` says and, for the
/// compare-and-swap, in `counters`. For a charged aggregate, the [`Metered`] says what it
/// was charged, so a caller that finds the frame must be metered elsewhere after all can
/// give it back. A policy with a second meter is not decided here (`meter::metered`).
/// `CARRY`: whether a cell charged under another rate is carried over first
/// ([`carry_over`]); a caller that passes `false` has checked that none is
/// ([`carried`]), and so adds no frame of calls below its own.
///
/// # Safety
/// `cell` points to a live map value, or to a value on the stack.
#[inline(always)]
pub unsafe fn decide<const CARRY: bool>(
    cell: *mut Cell,
    rule: &Rule,
    slot: u32,
    count: Count,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    let charged = match rule.action {
        ACTION_PASS => Ok(Charged::Source(0)),
        ACTION_DROP => Err(BLOCKED),
        // SAFETY: the caller's.
        _ => unsafe { charge::<CARRY>(cell, rule, len, now, counters) },
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
    if count == Count::Unadmitted {
        metered = metered.unadmitted();
    }
    if count != Count::Later {
        count_policy(slot, metered, len);
    }
    metered
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
/// frame is held back (0 when policing), or `None` if it does not conform. `CARRY` as
/// [`decide`]'s.
///
/// # Safety
/// `cell` points to a live map value, or to a value on a caller's stack.
#[inline(always)]
pub unsafe fn take<const CARRY: bool>(
    cell: *mut Cell,
    limit: &Limit,
    len: u32,
    now: u64,
    slack: u64,
    counters: &mut Counters,
) -> Option<u64> {
    unsafe {
        if CARRY {
            carry_over(cell, limit, now);
        }
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
unsafe fn charge<const CARRY: bool>(
    cell: *mut Cell,
    rule: &Rule,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Result<Charged, Reason> {
    unsafe {
        let (aggregate, limit) = (rule.aggregate_cell, rule.aggregate_limit);
        if aggregate.is_null() {
            return take::<CARRY>(cell, rule.limit, len, now, rule.slack, counters)
                .map(Charged::Source)
                .ok_or(SOURCE);
        }
        if CARRY {
            carry_over(cell, rule.limit, now);
        }
        let tat = &raw mut (*cell).tat;
        let old = atomic::load(tat);
        let new = rule.limit.admit(old, now, len).ok_or(SOURCE)?;
        if CARRY {
            carry_over(aggregate, limit, now);
        }
        let aggregate_tat = &raw mut (*aggregate).tat;
        let aggregate_old = atomic::load(aggregate_tat);
        let aggregate_new = limit.admit(aggregate_old, now, len).ok_or(AGGREGATE)?;
        // With an aggregate a rule never shapes here (userspace refuses shape mode with
        // an aggregate rate; a subscriber's shaping plan is metered by
        // `meter::shaper_subscriber`, its bucket alone): both cells are policed.
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
/// is counted. The first try is inlined here; the retries are [`shaper_retry`]'s, verified
/// once rather than try by try in every caller's state.
#[expect(
    clippy::too_many_arguments,
    reason = "the first try's whole state, kept in registers"
)]
#[inline(always)]
pub unsafe fn publish(
    tat: *mut u64,
    old: u64,
    new: u64,
    limit: &Limit,
    len: u32,
    now: u64,
    slack: u64,
    counters: &mut Counters,
) -> Option<(u64, u64)> {
    // What was charged: the new TAT less the base it was charged from.
    let charged = |old: u64, new: u64| Some((new, new.wrapping_sub(gcra::base(old, now))));
    match unsafe { atomic::compare_exchange(tat, old, new) } {
        Ok(()) => {
            counters.cas_won[0] += 1;
            charged(old, new)
        }
        Err(found) => {
            let mut swap = Swap {
                old: found,
                new: 0,
                slack,
                len,
                _pad: 0,
            };
            if shaper_retry(tat, &raw mut swap, limit, now) == 0 {
                return None;
            }
            charged(swap.old, swap.new)
        }
    }
}

/// A compare-and-swap that lost its first try, as [`publish`] hands it to
/// [`shaper_retry`]: on the caller's stack.
#[repr(C)]
pub struct Swap {
    /// In: the TAT the first try found. Out: the TAT the winning try decided on.
    pub old: u64,
    /// Out: the TAT the winning try published.
    pub new: u64,
    /// The frame's burst stretch (shaping) and length.
    pub slack: u64,
    pub len: u32,
    pub _pad: u32,
}

/// The retries of [`publish`]: decide again on the TAT found, and swap, up to
/// [`CAS_TRIES`] tries in all; 1 if a try won (`swap` says what it published), 0 if the
/// frame no longer conforms or every try lost (counted as exhausted). A global function:
/// rare (another CPU charged the same cell between the read and the swap), and the
/// arithmetic of every try would otherwise be walked in every caller's state.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_retry(
    tat: *mut u64,
    swap: *mut Swap,
    limit: *const Limit,
    now: u64,
) -> u32 {
    // SAFETY: a global function's pointer arguments are null or point to whole values: a
    // live map value's TAT or a caller's own, the caller's `Swap`, a limit in a map value.
    let (Some(swap), Some(limit)) = (unsafe { swap.as_mut() }, unsafe { limit.as_ref() }) else {
        return 0;
    };
    let Some(counters) = COUNTERS.get_ptr_mut(0) else {
        return 0;
    };
    if tat.is_null() {
        return 0;
    }
    // SAFETY: this CPU's entry (see `entry`).
    let counters = unsafe { &mut *counters };
    let mut old = swap.old;
    for try_ in 1..CAS_TRIES {
        let Some(new) = limit.admit_within(old, now, swap.len, swap.slack) else {
            return 0;
        };
        // SAFETY: checked above.
        match unsafe { atomic::compare_exchange(tat, old, new) } {
            Ok(()) => {
                if let Some(won) = counters.cas_won.get_mut(try_) {
                    *won += 1;
                }
                swap.old = old;
                swap.new = new;
                return 1;
            }
            Err(found) => old = found,
        }
    }
    // Every try lost; a frame that no longer conforms anyway is not counted as lost.
    if limit.admit_within(old, now, swap.len, swap.slack).is_some() {
        counters.cas_exhausted += 1;
    }
    0
}

/// Brings a cell charged under another limit over to `limit`, keeping its backlog in
/// bytes (`shaper_common::rescale`): a compare, and a call to [`shaper_carry_over`] in
/// the rare case that the cell's scale is not the limit's.
///
/// # Safety
/// `cell` points to a live map value, or to a value on a caller's stack.
#[inline(always)]
pub unsafe fn carry_over(cell: *mut Cell, limit: &Limit, now: u64) {
    // SAFETY: the caller's.
    if unsafe { atomic::load(&raw const (*cell).scale) } != limit.scale() {
        shaper_carry_over(cell, limit, now);
    }
}

/// Whether `cell`, and the rule's aggregate cell if it has one, are expressed in their
/// limits' scales: nothing for [`decide`] to carry over.
///
/// # Safety
/// `cell` points to a live map value, or to a value on a caller's stack.
#[inline(always)]
pub unsafe fn carried(cell: *mut Cell, rule: &Rule) -> bool {
    // SAFETY: the caller's; the rule's aggregate cell is a live map value.
    unsafe {
        scaled(cell, rule.limit)
            && (rule.aggregate_cell.is_null() || scaled(rule.aggregate_cell, rule.aggregate_limit))
    }
}

/// Whether `cell` is expressed in `limit`'s scale.
///
/// # Safety
/// `cell` points to a live map value, or to a value on a caller's stack.
#[inline(always)]
pub unsafe fn scaled(cell: *mut Cell, limit: &Limit) -> bool {
    // SAFETY: the caller's.
    unsafe { atomic::load(&raw const (*cell).scale) == limit.scale() }
}

/// Carries `cell`, and the rule's aggregate cell if it has one, over to their limits
/// ([`carry_over`]): what [`carried`] checks.
///
/// # Safety
/// As [`carried`].
#[inline(always)]
pub unsafe fn carry_over_rule(cell: *mut Cell, rule: &Rule, now: u64) {
    // SAFETY: the caller's.
    unsafe {
        carry_over(cell, rule.limit, now);
        if !rule.aggregate_cell.is_null() {
            carry_over(rule.aggregate_cell, rule.aggregate_limit, now);
        }
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
