//! The per-source tables: arrays of buckets of ways (`shaper_common::sources`).
//!
//! A known key's frame pays the hash of its key, one call ([`shaper_find4`],
//! [`shaper_find6`]: the scan of the eight ways, verified once, whose answer is one scalar,
//! so the rest of the frame's path is one path for the verifier whichever way matched) and
//! an inlined array lookup. A key new to the table, admitted, is given a way by
//! [`shaper_claim4`] or [`shaper_claim6`] under the bucket's lock: a free way, else one
//! whose cell is idle (its TAT at or behind now: a fresh cell would be identical; the
//! key's counters leave with it), else none, and the key is metered as one refused by
//! admission (in its policy's shared unadmitted cell). So a flood cannot evict a source
//! that is being metered, and the table never holds a key twice: a key is given a way only
//! under the lock, after a scan of the bucket under it.
//!
//! A way given to a key is marked busy first (its key word, or its tag), its key and state
//! written, then its key word or tag published with a compare-and-swap (a full barrier).
//! A lookup matches an IPv4 way by its key word alone (one aligned 64-bit load); an IPv6
//! way by its tag, the whole key, and its tag again (unchanged), so a way half-written for
//! another key never matches. A CPU that found a way just before it was taken from its idle
//! key may still count that key's frame in it: one frame, in a way whose cell was idle.

use shaper_common::{
    maps::SourceState,
    sources::{
        SOURCE_FREE, SOURCE_LOCKED, SOURCE_V4_BUSY, SOURCE_V6_BUSY, SOURCE_WAYS, SourceBucket6,
        bucket_of, tag_v6, word_v4,
    },
};
use shaper_ebpf::atomic;

use crate::maps::{SOURCES, SOURCES6, source_bucket_count};

/// What a find or a claim answers when the key has no way: [`shaper_find4`] and
/// [`shaper_find6`] found none; [`shaper_claim4`] and [`shaper_claim6`] found no free or
/// idle way, or another CPU held the bucket's lock. Any other answer is a way:
/// its bucket times [`SOURCE_WAYS`] plus the way, with [`CLAIMED_NEW`] if the claim gave
/// it to the key (rather than finding the key there, put by another CPU).
pub const NO_WAY: u64 = u64::MAX;
pub const CLAIMED_NEW: u64 = 1 << 40;
const WAY_MASK: u64 = SOURCE_WAYS as u64 - 1;
/// Bits of an answer that name the way (bucket and way).
const POSITION: u64 = CLAIMED_NEW - 1;

const _: () = assert!(SOURCE_WAYS == 8);

/// The state of the way an answer names, if it names one.
#[inline(always)]
pub fn state_v4(answer: u64) -> Option<*mut SourceState> {
    if answer == NO_WAY {
        return None;
    }
    let position = answer & POSITION;
    let way = (position & WAY_MASK) as usize;
    let bucket = SOURCES.get_ptr_mut((position >> 3) as u32)?;
    // SAFETY: a live map value; `way` < SOURCE_WAYS.
    Some(unsafe { &raw mut (*bucket).states[way] })
}

/// The same in the IPv6 table.
#[inline(always)]
pub fn state_v6(answer: u64) -> Option<*mut SourceState> {
    if answer == NO_WAY {
        return None;
    }
    let position = answer & POSITION;
    let way = (position & WAY_MASK) as usize;
    let bucket = SOURCES6.get_ptr_mut((position >> 3) as u32)?;
    // SAFETY: a live map value; `way` < SOURCE_WAYS.
    Some(unsafe { &raw mut (*bucket).states[way] })
}

/// The way of IPv4 `key` (whose hash is `hash`), or [`NO_WAY`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_find4(key: u32, hash: u64) -> u64 {
    let index = bucket_of(hash, source_bucket_count());
    let Some(bucket) = SOURCES.get_ptr_mut(index) else {
        return NO_WAY;
    };
    let word = word_v4(key);
    for i in 0..SOURCE_WAYS {
        // SAFETY: a live map value; an aligned u64.
        if unsafe { atomic::load(&raw const (*bucket).keys[i]) } == word {
            return position(index, i);
        }
    }
    NO_WAY
}

/// The way of the IPv6 key of halves `hi`, `lo` (whose hash is `hash`), or [`NO_WAY`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_find6(hi: u64, lo: u64, hash: u64) -> u64 {
    let index = bucket_of(hash, source_bucket_count());
    let Some(bucket) = SOURCES6.get_ptr_mut(index) else {
        return NO_WAY;
    };
    let tag = tag_v6(hash);
    for i in 0..SOURCE_WAYS {
        // SAFETY: a live map value.
        if unsafe { matches6(bucket, i, tag, hi, lo) } {
            return position(index, i);
        }
    }
    NO_WAY
}

/// Whether way `i` of IPv6 `bucket` holds the key of `tag`, `hi`, `lo`: its tag before and
/// after the key compared equal.
///
/// # Safety
/// `bucket` points to a live map value.
#[inline(always)]
unsafe fn matches6(bucket: *mut SourceBucket6, i: usize, tag: u32, hi: u64, lo: u64) -> bool {
    let i = i & (SOURCE_WAYS - 1);
    // SAFETY: the caller's; aligned loads.
    unsafe {
        let tags = &raw const (*bucket).tags[i];
        if core::ptr::read_volatile(tags) != tag {
            return false;
        }
        let key = &raw const (*bucket).keys[i];
        core::ptr::read_volatile(&raw const (*key)[0]) == hi
            && core::ptr::read_volatile(&raw const (*key)[1]) == lo
            && core::ptr::read_volatile(tags) == tag
    }
}

/// An answer naming way `way` of bucket `index`.
#[inline(always)]
fn position(index: u32, way: usize) -> u64 {
    u64::from(index) << 3 | way as u64
}

/// Gives IPv4 `key` (of `hash`) a way at `now` (ticks), its state fresh but for its
/// `policy` word: see the module. Returns the way (with [`CLAIMED_NEW`] if it is new to
/// the key) or [`NO_WAY`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_claim4(key: u32, hash: u64, policy: u64, now: u64) -> u64 {
    let index = bucket_of(hash, source_bucket_count());
    let Some(bucket) = SOURCES.get_ptr_mut(index) else {
        return NO_WAY;
    };
    // SAFETY: a live map value, every word of it aligned.
    unsafe {
        let lock = &raw mut (*bucket).lock;
        if atomic::compare_exchange(lock, 0, SOURCE_LOCKED).is_err() {
            return NO_WAY;
        }
        let word = word_v4(key);
        let (mut free, mut idle) = (SOURCE_WAYS, SOURCE_WAYS);
        for i in 0..SOURCE_WAYS {
            let found = atomic::load(&raw const (*bucket).keys[i]);
            if found == word {
                core::ptr::write_volatile(lock, 0);
                return position(index, i);
            }
            if found == SOURCE_FREE {
                free = free.min(i);
            } else if idle == SOURCE_WAYS && is_idle(&raw const (*bucket).states[i], now) {
                idle = i;
            }
        }
        let i = if free < SOURCE_WAYS { free } else { idle };
        if i >= SOURCE_WAYS {
            core::ptr::write_volatile(lock, 0);
            return NO_WAY;
        }
        let i = i & (SOURCE_WAYS - 1);
        let slot = &raw mut (*bucket).keys[i];
        core::ptr::write_volatile(slot, SOURCE_V4_BUSY);
        fresh(&raw mut (*bucket).states[i], policy);
        // A compare-and-swap, a full barrier: the state is written before any CPU can
        // match the word.
        let _ = atomic::compare_exchange(slot, SOURCE_V4_BUSY, word);
        core::ptr::write_volatile(lock, 0);
        position(index, i) | CLAIMED_NEW
    }
}

/// [`shaper_claim4`] for the IPv6 key of halves `hi`, `lo`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_claim6(hi: u64, lo: u64, hash: u64, policy: u64, now: u64) -> u64 {
    let index = bucket_of(hash, source_bucket_count());
    let Some(bucket) = SOURCES6.get_ptr_mut(index) else {
        return NO_WAY;
    };
    let tag = tag_v6(hash);
    // SAFETY: a live map value, every word of it aligned.
    unsafe {
        let lock = &raw mut (*bucket).lock;
        if atomic::compare_exchange(lock, 0, SOURCE_LOCKED).is_err() {
            return NO_WAY;
        }
        let (mut free, mut idle) = (SOURCE_WAYS, SOURCE_WAYS);
        for i in 0..SOURCE_WAYS {
            if matches6(bucket, i, tag, hi, lo) {
                core::ptr::write_volatile(lock, 0);
                return position(index, i);
            }
            let found = core::ptr::read_volatile(&raw const (*bucket).tags[i]);
            if found == SOURCE_FREE as u32 {
                free = free.min(i);
            } else if idle == SOURCE_WAYS && is_idle(&raw const (*bucket).states[i], now) {
                idle = i;
            }
        }
        let i = if free < SOURCE_WAYS { free } else { idle };
        if i >= SOURCE_WAYS {
            core::ptr::write_volatile(lock, 0);
            return NO_WAY;
        }
        let i = i & (SOURCE_WAYS - 1);
        // Busy before the key is written, the key and state before the tag is published:
        // each tag written with a compare-and-swap, a full barrier.
        set_tag(bucket, i, SOURCE_V6_BUSY);
        let key = &raw mut (*bucket).keys[i];
        core::ptr::write_volatile(&raw mut (*key)[0], hi);
        core::ptr::write_volatile(&raw mut (*key)[1], lo);
        fresh(&raw mut (*bucket).states[i], policy);
        set_tag(bucket, i, tag);
        core::ptr::write_volatile(lock, 0);
        position(index, i) | CLAIMED_NEW
    }
}

/// Sets the tag of way `i` of IPv6 `bucket` to `tag` with a compare-and-swap of the 64-bit
/// word it shares with its neighbour (which no one else writes while the lock is held).
///
/// # Safety
/// `bucket` points to a live map value whose lock this CPU holds.
#[inline(always)]
unsafe fn set_tag(bucket: *mut SourceBucket6, i: usize, tag: u32) {
    const _: () = assert!(SOURCE_WAYS % 2 == 0);
    // SAFETY: the caller's; the tags start 8-aligned (asserted in shaper_common).
    unsafe {
        let pair = (&raw mut (*bucket).tags).cast::<u64>().add((i >> 1) & 3);
        let shift = (i as u64 & 1) * 32;
        let old = atomic::load(pair);
        let new = old & !(0xFFFF_FFFF << shift) | u64::from(tag) << shift;
        let _ = atomic::compare_exchange(pair, old, new);
    }
}

/// Whether the cell of `state` is idle at `now`: its TAT at or behind now, so a fresh cell
/// would decide every frame as it does.
///
/// # Safety
/// `state` points into a live map value.
#[inline(always)]
unsafe fn is_idle(state: *const SourceState, now: u64) -> bool {
    // SAFETY: the caller's.
    unsafe { atomic::load(&raw const (*state).cell.tat) <= now }
}

/// Makes `state` fresh: a zero cell and counters, and `policy`.
///
/// # Safety
/// `state` points into a live map value.
#[inline(always)]
unsafe fn fresh(state: *mut SourceState, policy: u64) {
    // SAFETY: the caller's; aligned stores.
    unsafe {
        core::ptr::write_volatile(&raw mut (*state).cell.tat, 0);
        core::ptr::write_volatile(&raw mut (*state).cell.scale, 0);
        core::ptr::write_volatile(&raw mut (*state).policy, policy);
        let o = &raw mut (*state).outcomes;
        core::ptr::write_volatile(&raw mut (*o).passed_packets, 0);
        core::ptr::write_volatile(&raw mut (*o).passed_bytes, 0);
        core::ptr::write_volatile(&raw mut (*o).dropped_packets, 0);
        core::ptr::write_volatile(&raw mut (*o).dropped_bytes, 0);
        core::ptr::write_volatile(&raw mut (*o).would_drop_packets, 0);
        core::ptr::write_volatile(&raw mut (*o).would_drop_bytes, 0);
    }
}
