//! New-source admission's doorkeeper: a key new to the table gets a cell on its second
//! sighting, not its first.
//!
//! A real source sends again; a spoofed address almost never does. So a key's first frame
//! leaves a *trace* (a 32-bit tag of the key and a time stamp) in its bucket of
//! `SHAPER_TRACES`, an array indexed by a seeded hash of the key (`TraceBucket`), and is
//! metered as unadmitted; a later frame that finds its own tag there within
//! `TRACE_WINDOW_NS` may have a cell (subject to the admission rate). The check is one
//! array lookup and two cache lines of sixteen ways, and inserts nothing into the source
//! table. A flood of random addresses fills the ways with traces that are never found
//! again and overwrites the oldest, so it cannot fill the array up, and it cannot forge a
//! trace: a fresh key is admitted only if its own 32-bit tag is in its bucket. Two CPUs
//! writing one bucket at once may lose a trace, which costs its key one more unadmitted
//! frame: traces are hints, and every access is a plain aligned 64-bit load or store.

use shaper_common::{
    maps::{Config, Ipv4Key, TRACE_BUCKETS, TRACE_STAMP_SHIFT, TRACE_WAYS, TRACE_WINDOW_NS},
    sources,
};

use crate::maps::TRACES;

/// What the doorkeeper made of a key's frame.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sighting {
    /// Its own trace was found within the window: it may have a cell.
    Again,
    /// None was: its trace was left, in an empty or expired way.
    First,
    /// None was: its trace took the place of another key's live trace.
    Displacing,
}

/// The window in time stamps.
const WINDOW: u32 = (TRACE_WINDOW_NS >> TRACE_STAMP_SHIFT) as u32;

const _: () = assert!(TRACE_BUCKETS.is_power_of_two());

/// The hash of an IPv4 key (`shaper_common::sources::hash_v4`, seeded per attachment).
#[inline(always)]
pub fn hash_v4(key: Ipv4Key, config: &Config) -> u64 {
    sources::hash_v4(key, config.trace_seed)
}

/// The hash of an IPv6 key, given as its halves (`meter::Key::V6`).
#[inline(always)]
pub fn hash_v6(hi: u64, lo: u64, config: &Config) -> u64 {
    sources::hash_v6(hi, lo, config.trace_seed)
}

/// Looks for the trace of the key of `hash` at `now` (ticks), leaving it if it is not
/// there.
#[inline(always)]
pub fn sight(hash: u64, now: u64) -> Sighting {
    match shaper_sight(hash, now) {
        SIGHTED_AGAIN => Sighting::Again,
        SIGHTED_DISPLACING => Sighting::Displacing,
        _ => Sighting::First,
    }
}

/// [`shaper_sight`]'s answers, and [`Sighting::First`] for any other.
const SIGHTED_AGAIN: u32 = 1;
const SIGHTED_DISPLACING: u32 = 2;

/// [`sight`], as a global function: the choice of the way to take forks the verifier's
/// states at each of the sixteen, which its callers need not walk again.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_sight(hash: u64, now: u64) -> u32 {
    let Some(bucket) = TRACES.get_ptr_mut((hash as u32) & (TRACE_BUCKETS - 1)) else {
        // Cannot happen (the index is in range); refuse rather than admit.
        return 0;
    };
    let tag = (hash >> 32) as u32 | 1;
    let stamp = (now >> (TRACE_STAMP_SHIFT + shaper_common::gcra::TICK_SHIFT)) as u32;
    // The way to take if the key is not there: an empty or expired one, else the oldest.
    let (mut free, mut free_age) = (0, 0);
    for i in 0..TRACE_WAYS {
        // SAFETY: `bucket` points to a live map value of TRACE_WAYS ways.
        let way = unsafe { core::ptr::read_volatile(&raw const (*bucket).ways[i]) };
        let age = stamp.wrapping_sub(way as u32);
        let live = way != 0 && age <= WINDOW;
        if live && (way >> 32) as u32 == tag {
            return SIGHTED_AGAIN;
        }
        // An empty or expired way counts as older than any live one.
        let age = if live { age } else { u32::MAX };
        if age > free_age {
            (free, free_age) = (i, age);
        }
    }
    // SAFETY: as above; `free` < TRACE_WAYS.
    unsafe {
        let way = &raw mut (*bucket).ways[free & (TRACE_WAYS - 1)];
        core::ptr::write_volatile(way, u64::from(tag) << 32 | u64::from(stamp));
    }
    if free_age == u32::MAX {
        0
    } else {
        SIGHTED_DISPLACING
    }
}
