//! Metering one frame of a key: find or create the key's state, resolve its policy
//! (`policy`), let the rule decide (`cell`), count it in the key's counters, and sample it
//! for `shaper watch` if it was refused (`watch`).
//!
//! A known key's frame is metered without a single function call ([`meter`] is inlined into
//! the entry point, the rule's decision into it, one copy for both families): on the hot
//! path a BPF-to-BPF call costs a call and a return, which mitigations of speculative
//! execution can make dear. What is rare is a global function of its own, verified once:
//! a key new to the table ([`shaper_create_v4`], [`shaper_create_v6`]), a lost
//! compare-and-swap (`cell::shaper_retry`), a rate change (`cell::shaper_carry_over`), a
//! sample (`watch::shaper_sample`). A global function
//! takes only scalars and pointers to memory, so an IPv6 key travels as two `u64` halves,
//! and returns one scalar, a [`Metered`].

use core::ptr;

use aya_ebpf::maps::LruHashMap;
use shaper_common::maps::{Config, Counters, Ipv4Key, Ipv6Key, SourceState};

use shaper_ebpf::atomic;

use crate::{
    cell::{Count, count_policy, decide, take},
    maps::{ADMISSION, AGGREGATES, CONFIG, POLICY_STATS, SOURCES, SOURCES6},
    outcome::{Metered, Outcome, outcome_counters},
    policy, watch,
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

    /// The slot of the policy covering the key (`policy`).
    #[inline(always)]
    fn slot(self, config: &Config) -> u32 {
        match self {
            Self::V4(key) => policy::slot_v4(&key, config),
            Self::V6(hi, lo) => policy::slot_v6(&join(hi, lo), config),
        }
    }

    /// Meters the frame of a key new to its table ([`create`]).
    #[inline(always)]
    fn create(self, slot: u32, len: u32, now: u64, counters: &mut Counters) -> Metered {
        let counters = ptr::from_mut(counters);
        Metered(match self {
            Self::V4(key) => shaper_create_v4(key, slot, len, now, counters),
            Self::V6(hi, lo) => shaper_create_v6(hi, lo, slot_len(slot, len), now, counters),
        })
    }

    /// The halves and family `watch::shaper_sample` takes.
    #[inline(always)]
    fn halves(self) -> (u64, u64, u8) {
        match self {
            Self::V4(key) => (u64::from(key), 0, 4),
            Self::V6(hi, lo) => (hi, lo, 6),
        }
    }
}

/// Meters a `len`-byte frame of `key` at `now` (ticks) under `config`, counted in this
/// CPU's global `counters`. Whatever the family, a known key's frame goes through one
/// inlined copy of the decision.
#[inline(always)]
pub fn meter(key: Key, len: u32, now: u64, config: &Config, counters: &mut Counters) -> Metered {
    let (state, slot) = match key.state() {
        // SAFETY: a live map value.
        Some(state) => unsafe {
            let slot = policy::resolve(state, config, || key.slot(config));
            (Some(state), slot)
        },
        None => (None, key.slot(config)),
    };
    let state = match state {
        Some(state) => Some(state),
        None => {
            let created = key.create(slot, len, now, counters);
            if !created.raced() {
                return sampled(created, key, slot, len, now);
            }
            key.state()
        }
    };
    let metered = match state {
        Some(state) => known(state, config, slot, len, now, counters),
        None => Metered::UNTRACKED,
    };
    sampled(metered, key, slot, len, now)
}

/// `metered`, sampled for `shaper watch` if it was refused while someone watches.
#[inline(always)]
fn sampled(metered: Metered, key: Key, slot: u32, len: u32, now: u64) -> Metered {
    if watch::watched(metered, now) {
        let (hi, lo, family) = key.halves();
        watch::shaper_sample(hi, lo, watch::info(metered, slot, len, family), now);
    }
    metered
}

/// A key new to the IPv4 table, under policy `slot` (see [`create`]); `counters` is this
/// CPU's entry of the global counters. Returns a [`Metered`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_create_v4(
    key: Ipv4Key,
    slot: u32,
    len: u32,
    now: u64,
    counters: *mut Counters,
) -> u64 {
    // SAFETY: a global function's pointer argument is null or points to a whole value:
    // here this CPU's counters.
    let Some(counters) = (unsafe { counters.as_mut() }) else {
        return Metered::UNTRACKED.0;
    };
    create(&SOURCES, &key, slot, len, now, counters).0
}

/// A key new to the IPv6 table (see [`create`]); `slot_len` packs the policy slot and the
/// frame's length ([`slot_len`]): a global function takes five arguments at most.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_create_v6(
    hi: u64,
    lo: u64,
    slot_len: u64,
    now: u64,
    counters: *mut Counters,
) -> u64 {
    // SAFETY: as `shaper_create_v4`'s.
    let Some(counters) = (unsafe { counters.as_mut() }) else {
        return Metered::UNTRACKED.0;
    };
    let (slot, len) = ((slot_len >> 32) as u32, slot_len as u32);
    create(&SOURCES6, &join(hi, lo), slot, len, now, counters).0
}

/// The IPv6 key of its halves.
#[inline(always)]
fn join(hi: u64, lo: u64) -> Ipv6Key {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&hi.to_ne_bytes());
    key[8..].copy_from_slice(&lo.to_ne_bytes());
    key
}

/// A policy slot and a frame length in one argument.
#[inline(always)]
fn slot_len(slot: u32, len: u32) -> u64 {
    u64::from(slot) << 32 | u64::from(len)
}

/// Meters the frame of a key with a state of its own (`state`, a live map value): the hot
/// path.
#[inline(always)]
fn known(
    state: *mut SourceState,
    config: &Config,
    slot: u32,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    // SAFETY: a live map value (the lookup that found it was this program run's).
    unsafe {
        let cell = &raw mut (*state).cell;
        let metered = decide(cell, config, slot, Count::Policy, len, now, counters);
        count_source(state, metered.outcome(), len);
        metered
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

/// A key new to `map`: its entry, created with its policy slot resolved and this frame
/// already metered in its fresh cell, if admission lets it have one; otherwise the frame
/// is metered in its policy's shared cell of unadmitted frames.
///
/// The entry is inserted and not looked up again: a lookup would mark it referenced,
/// and the kernel's LRU evicts unreferenced entries first, so the entry of a key seen
/// once (a spoofed source) goes before those of sources that keep sending. A refusal
/// costs the admission cell's check and nothing else: no insert, no second lookup.
#[inline(always)]
fn create<K>(
    map: &LruHashMap<K, SourceState>,
    key: &K,
    slot: u32,
    len: u32,
    now: u64,
    counters: &mut Counters,
) -> Metered {
    let Some(config) = CONFIG.get(0) else {
        return Metered::UNTRACKED;
    };
    if !admitted(config, slot, now, counters) {
        // The policy's own shared cell, wherever its admission is metered.
        let Some(cells) = ADMISSION.get_ptr_mut(slot) else {
            return Metered::UNTRACKED;
        };
        // SAFETY: a live map value.
        return unsafe {
            let cell = &raw mut (*cells).unadmitted;
            decide(cell, config, slot, Count::Unadmitted, len, now, counters)
        };
    }
    let mut state = SourceState {
        policy: policy::cache_word(config, slot),
        ..SourceState::default()
    };
    // Counted in the policy's counters once the entry is in: if another CPU created it
    // meanwhile, the frame is metered (and counted) in that CPU's entry instead.
    // SAFETY: `state` is this program's own.
    let metered = unsafe {
        let metered = decide(
            &raw mut state.cell,
            config,
            slot,
            Count::Later,
            len,
            now,
            counters,
        );
        count_source(&raw mut state, metered.outcome(), len);
        metered
    };
    match map.insert(key, state, BPF_NOEXIST) {
        Ok(()) => {
            count_policy(slot, metered, len);
            counters.new_sources += 1;
            if let Some(stats) = POLICY_STATS.get_ptr_mut(slot) {
                // SAFETY: this CPU's entry (see `cell::count_policy`).
                unsafe { (*stats).new_sources += 1 };
            }
            metered
        }
        // Another CPU created it first: give back what the aggregate was charged for the
        // fresh cell; the caller meters the frame in that CPU's entry.
        Err(e) if e == -EEXIST => {
            let refund = metered.aggregate_charge();
            if refund != 0
                && let Some(aggregate) = AGGREGATES.get_ptr_mut(slot)
            {
                // SAFETY: the aggregate's TAT, a live map value.
                unsafe { atomic::add(&raw mut (*aggregate).tat, refund.wrapping_neg()) };
            }
            Metered::RACED
        }
        Err(_) => Metered::UNTRACKED,
    }
}

/// Whether new-source admission gives a key new to the table under policy `slot` a cell:
/// the policy's own admission, or the interface's, let one more key in at `now`.
#[inline(always)]
fn admitted(config: &Config, slot: u32, now: u64, counters: &mut Counters) -> bool {
    let (admission, admission_slot) = policy::admission(config, slot);
    if !admission.limited() {
        return true;
    }
    let Some(cells) = ADMISSION.get_ptr_mut(admission_slot) else {
        return false;
    };
    // SAFETY: `cells` points to a live map value.
    unsafe {
        take(
            &raw mut (*cells).admit,
            &admission.limit,
            1,
            now,
            0,
            counters,
        )
        .is_some()
    }
}
