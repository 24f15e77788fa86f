//! Metering one frame of a key: find its state, or admit a key new to the table; resolve
//! its policy (`policy`); let the rule decide (`cell`); count it in the key's counters;
//! sample it for `shaper watch` if it was refused (`watch`).
//!
//! A known key's frame is metered without a single function call: [`meter`] is inlined
//! into the entry point, the rule's decision into it, one copy for both families (and
//! another for the cells of keys new to the table: a fresh one, or the shared cell of the
//! policy's unadmitted frames). On the hot path a BPF-to-BPF call costs a call
//! and a return, which mitigations of speculative execution can make dear. What is rare is
//! a global function of its own, verified once: new-source admission ([`shaper_admit`]),
//! a key created by two CPUs at once ([`shaper_meter_raced`]), a lost compare-and-swap
//! (`cell::shaper_retry`), a rate change (`cell::shaper_carry_over`), a sample
//! (`watch::shaper_sample`). A global function takes only scalars and pointers to memory
//! and returns one scalar.

use core::{mem::MaybeUninit, ptr};

use shaper_common::maps::{Cell, Config, Counters, Ipv4Key, SourceState};

use shaper_ebpf::atomic;

use crate::{
    cell::{Count, count_policy, decide, take},
    key::join,
    maps::{ADMISSION, AGGREGATES, CONFIG, FIRSTS, POLICY_STATS, SOURCES, SOURCES6},
    meter2::{self, shaper_meter2, shaper_meter2_prepare},
    outcome::{Metered, Outcome, outcome_counters},
    policy,
    trace::{self, Sighting},
    watch,
};

/// BPF_NOEXIST: create only; a concurrent creator wins and we meter against its cell.
const BPF_NOEXIST: u64 = 1;
/// What the kernel returns (negated) when a BPF_NOEXIST insert finds the key.
const EEXIST: i32 = 17;

/// A frame's key, as the entry point read it: an IPv6 key travels as two `u64` halves (its
/// bytes in memory order, as `u64::from_ne_bytes` reads them).
#[derive(Clone, Copy)]
pub enum Key {
    V4(Ipv4Key),
    V6(u64, u64),
}

impl Key {
    /// The key's state in its family's table, if it has one.
    #[inline(always)]
    fn state(self) -> Option<*mut SourceState> {
        match self {
            Self::V4(key) => SOURCES.get_ptr_mut(key),
            Self::V6(hi, lo) => SOURCES6.get_ptr_mut(join(hi, lo)),
        }
    }

    /// Creates the key's entry, unless another CPU did first.
    #[inline(always)]
    fn insert(self, state: &SourceState) -> Result<(), i32> {
        match self {
            Self::V4(key) => SOURCES.insert(key, state, BPF_NOEXIST),
            Self::V6(hi, lo) => SOURCES6.insert(join(hi, lo), state, BPF_NOEXIST),
        }
    }

    /// The slot of the policy covering the key (`policy`).
    #[inline(always)]
    fn slot(self, config: &Config) -> u32 {
        match self {
            Self::V4(key) => policy::slot_v4(&key, config),
            Self::V6(hi, lo) => policy::slot_v6(&join(hi, lo), config),
        }
    }

    /// The hash that places the key's trace (`trace`).
    #[inline(always)]
    fn hash(self, config: &Config) -> u64 {
        match self {
            Self::V4(key) => trace::hash_v4(key, config),
            Self::V6(hi, lo) => trace::hash_v6(hi, lo, config),
        }
    }

    /// The halves and family `watch::shaper_sample` and `meter2::shaper_meter2` take.
    #[inline(always)]
    pub fn halves(self) -> (u64, u64, u8) {
        match self {
            Self::V4(key) => (u64::from(key), 0, 4),
            Self::V6(hi, lo) => (hi, lo, 6),
        }
    }
}

/// Whether new-source admission gives a key new to the table a cell.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Admitted {
    /// Not: a first sighting, or over the admission rate.
    Not,
    /// Its policy has no admission: every new key gets a cell.
    Freely,
    /// On its second sighting (the doorkeeper found its trace), within the admission rate.
    Again,
    /// On its first sighting, within the first-sighting allowance and the admission rate.
    First,
}

/// Meters a `len`-byte frame of `key` at `now` (ticks) under `config`, counted in this
/// CPU's global `counters`: what became of it, and the slot of its policy.
#[inline(always)]
pub fn meter(
    key: Key,
    len: u32,
    now: u64,
    config: &Config,
    counters: &mut Counters,
) -> (Metered, u32) {
    let (metered, slot) = match key.state() {
        Some(state) => {
            // SAFETY: a live map value.
            let slot = unsafe { policy::resolve(state, config, || key.slot(config)) };
            (
                known::<true>(state, key, config, slot, len, now, counters),
                slot,
            )
        }
        None => {
            let slot = key.slot(config);
            (new_key(key, config, slot, len, now, counters), slot)
        }
    };
    if watch::watched(metered, now) {
        let (hi, lo, family) = key.halves();
        watch::shaper_sample(hi, lo, watch::info(metered, slot, len, family), now);
    }
    (metered, slot)
}

/// The rule of policy `slot` on a `len`-byte frame of `key` metered in `cell` at `now`,
/// counted as `count` says: `cell::decide`; or, if `SECOND` and the policy has a second
/// meter, `meter2::shaper_meter2`. The rule's one byte is all a policy without one pays:
/// no call, no lookup. A caller that is itself a global function passes `false` (a third
/// frame of calls would not fit the stack) and must not meter such a policy.
///
/// # Safety
/// `cell` points to a live map value, or to a value of this program's own.
#[expect(
    clippy::too_many_arguments,
    reason = "the frame's whole state, inlined"
)]
#[inline(always)]
unsafe fn metered<const SECOND: bool>(
    cell: *mut Cell,
    key: Key,
    config: &Config,
    slot: u32,
    count: Count,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    let rule = policy::rule(config, slot);
    if SECOND && rule.meter2.any() {
        let (hi, lo, family) = key.halves();
        let frame = meter2::frame(len, slot, family, count);
        let mut metered = shaper_meter2(cell, hi, lo, frame, now);
        if metered == meter2::AGAIN {
            shaper_meter2_prepare(cell, hi, lo, frame, now);
            metered = shaper_meter2(cell, hi, lo, frame, now);
        }
        return if metered == meter2::AGAIN {
            Metered::UNTRACKED
        } else {
            Metered(metered)
        };
    }
    // SAFETY: the caller's.
    unsafe { decide(cell, &rule, slot, count, len, now, counters) }
}

/// Meters the frame of a key with an entry of its own, `state` (a live map value), under
/// policy `slot`: the hot path ([`metered`] says what `SECOND` is).
#[inline(always)]
fn known<const SECOND: bool>(
    state: *mut SourceState,
    key: Key,
    config: &Config,
    slot: u32,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    // SAFETY: a live map value (found by this program run).
    unsafe {
        let cell = &raw mut (*state).cell;
        let metered = metered::<SECOND>(cell, key, config, slot, Count::Policy, len, now, counters);
        count_source(state, metered.outcome(), len);
        metered
    }
}

/// Meters the frame of a key new to the table under policy `slot`: in a fresh cell of its
/// own, whose entry is then created, if new-source admission lets it have one; otherwise
/// in the shared cell of its policy's unadmitted frames.
#[inline(always)]
fn new_key(
    key: Key,
    config: &Config,
    slot: u32,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    // Written only for a key that is given a cell: zeroing it costs a call to memset.
    let mut fresh = MaybeUninit::<SourceState>::uninit();
    let admitted = admit(key, config, slot, now, counters);
    let (cell, count) = if admitted == Admitted::Not {
        let Some(cells) = ADMISSION.get_ptr_mut(slot) else {
            return Metered::UNTRACKED;
        };
        // SAFETY: a live map value.
        (unsafe { &raw mut (*cells).unadmitted }, Count::Unadmitted)
    } else {
        let fresh = fresh.write(SourceState {
            policy: policy::cache_word(config, slot),
            ..SourceState::default()
        });
        // Counted in the policy's counters once the entry is in: if another CPU created it
        // meanwhile, the frame is metered (and counted) in that CPU's entry instead.
        (&raw mut fresh.cell, Count::Later)
    };
    // SAFETY: a live map value or this program's own.
    let metered = unsafe { metered::<true>(cell, key, config, slot, count, len, now, counters) };
    if admitted == Admitted::Not {
        return metered;
    }
    // SAFETY: written above, for a key given a cell.
    let fresh = unsafe { fresh.assume_init_mut() };
    created(key, fresh, admitted, metered, slot, len, now, counters)
}

/// The entry of a key new to the table, `fresh`, whose cell has metered its first frame
/// (`metered`): inserted, and counted. If another CPU created the key first, what the
/// aggregate was charged for the fresh cell is given back and the frame is metered in that
/// CPU's entry instead (by `meter2::shaper_meter2` again if it metered the first time:
/// `shaper_meter_raced` calling it would be a third frame of calls).
///
/// The entry is inserted and not looked up again: a lookup would mark it referenced, and
/// the kernel's LRU evicts unreferenced entries first.
#[expect(
    clippy::too_many_arguments,
    reason = "the frame's whole state, inlined"
)]
#[inline(always)]
fn created(
    key: Key,
    fresh: &mut SourceState,
    admitted: Admitted,
    metered: Metered,
    slot: u32,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    // SAFETY: this program's own.
    unsafe { count_source(fresh, metered.outcome(), len) };
    match key.insert(fresh) {
        Ok(()) => {
            count_policy(slot, metered, len);
            let again = u64::from(admitted == Admitted::Again);
            let first = u64::from(admitted == Admitted::First);
            counters.new_sources += 1;
            counters.sightings.admitted += again;
            counters.sightings.first_admitted += first;
            if let Some(stats) = POLICY_STATS.get_ptr_mut(slot) {
                // SAFETY: this CPU's entry (see `cell::count_policy`).
                unsafe {
                    (*stats).new_sources += 1;
                    (*stats).sightings.admitted += again;
                    (*stats).sightings.first_admitted += first;
                }
            }
            metered
        }
        Err(e) if e == -EEXIST => {
            let refund = metered.aggregate_charge();
            if refund != 0
                && let Some(aggregate) = AGGREGATES.get_ptr_mut(slot)
            {
                // SAFETY: the aggregate's TAT, a live map value.
                unsafe { atomic::add(&raw mut (*aggregate).tat, refund.wrapping_neg()) };
            }
            let Some(state) = key.state() else {
                return Metered::UNTRACKED;
            };
            if metered.is_second() {
                let (hi, lo, family) = key.halves();
                let frame = meter2::frame(len, slot, family, Count::Policy);
                // SAFETY: a live map value. Its cells are made (by this frame), and
                // scarcely charged under another rate since.
                let metered =
                    match shaper_meter2(unsafe { &raw mut (*state).cell }, hi, lo, frame, now) {
                        meter2::AGAIN => Metered::UNTRACKED,
                        metered => Metered(metered),
                    };
                // SAFETY: a live map value.
                unsafe { count_source(state, metered.outcome(), len) };
                return metered;
            }
            Metered(shaper_meter_raced(
                state,
                slot,
                len,
                now,
                ptr::from_mut(counters),
            ))
        }
        Err(_) => Metered::UNTRACKED,
    }
}

/// Meters a frame in the entry `state` another CPU created while this one was creating it,
/// under policy `slot`: what the inlined meter does for a known key, in a function of its
/// own (rare, and a second inlined copy would cost every frame's verification). Returns a
/// [`Metered`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_meter_raced(
    state: *mut SourceState,
    slot: u32,
    len: u32,
    now: u64,
    counters: *mut Counters,
) -> u64 {
    let Some(config) = CONFIG.get(0) else {
        return Metered::UNTRACKED.0;
    };
    // SAFETY: a global function's pointer arguments are null or point to whole values:
    // here a live map value and this CPU's counters.
    let Some(counters) = (unsafe { counters.as_mut() }) else {
        return Metered::UNTRACKED.0;
    };
    if state.is_null() {
        return Metered::UNTRACKED.0;
    }
    // The key is not looked at: without a second meter, a key's own cell is all there is
    // (`created` meters a frame of a policy with one itself).
    known::<false>(state, Key::V4(0), config, slot, len, now, counters).0
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

/// Whether new-source admission gives `key`, new to the table under policy `slot`, a cell
/// at `now`: freely if the policy (or the interface) has no admission, otherwise
/// [`shaper_admit`]'s answer.
#[inline(always)]
fn admit(key: Key, config: &Config, slot: u32, now: u64, counters: &mut Counters) -> Admitted {
    if !policy::admission(config, slot).0.limited() {
        return Admitted::Freely;
    }
    match shaper_admit(key.hash(config), slot, now, ptr::from_mut(counters)) {
        ADMIT_AGAIN => Admitted::Again,
        ADMIT_FIRST => Admitted::First,
        _ => Admitted::Not,
    }
}

/// [`shaper_admit`]'s answers: the key may have a cell, on its second sighting, or on its
/// first.
const ADMIT_AGAIN: u32 = 1;
const ADMIT_FIRST: u32 = 2;

/// New-source admission of a key (whose trace `hash` places) new to the table under policy
/// `slot`, whose admission is limited. The doorkeeper (`trace`) looks for the key's trace,
/// left by an earlier frame within the window, and leaves it if it is not there; a key
/// seen again may have a cell ([`ADMIT_AGAIN`]), a key seen for the first time only within
/// the first-sighting allowance ([`ADMIT_FIRST`]), and either only if the policy's
/// admission (or the interface's) lets one more key in at `now`. Returns 0 if not. Counts
/// the sightings in `counters` (this CPU's) and the policy's counters.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_admit(hash: u64, slot: u32, now: u64, counters: *mut Counters) -> u32 {
    let Some(config) = CONFIG.get(0) else {
        return 0;
    };
    // SAFETY: a global function's pointer argument is null or points to a whole value:
    // here this CPU's counters.
    let Some(counters) = (unsafe { counters.as_mut() }) else {
        return 0;
    };
    let (admission, admission_slot) = policy::admission(config, slot);
    let sighting = trace::sight(hash, now);
    let answer = if sighting == Sighting::Again {
        ADMIT_AGAIN
    } else {
        let displaced = u64::from(sighting == Sighting::Displacing);
        counters.sightings.first += 1;
        counters.sightings.displaced += displaced;
        if let Some(stats) = POLICY_STATS.get_ptr_mut(slot) {
            // SAFETY: this CPU's entry (see `cell::count_policy`).
            unsafe {
                (*stats).sightings.first += 1;
                (*stats).sightings.displaced += displaced;
            }
        }
        let Some(first) = FIRSTS.get_ptr_mut(admission_slot) else {
            return 0;
        };
        // SAFETY: a live map value.
        if unsafe { take(first, &admission.first, 1, now, 0, counters) }.is_none() {
            return 0;
        }
        ADMIT_FIRST
    };
    let Some(cells) = ADMISSION.get_ptr_mut(admission_slot) else {
        return 0;
    };
    // SAFETY: a live map value.
    let room = unsafe {
        take(
            &raw mut (*cells).admit,
            &admission.limit,
            1,
            now,
            0,
            counters,
        )
    };
    if room.is_some() { answer } else { 0 }
}
