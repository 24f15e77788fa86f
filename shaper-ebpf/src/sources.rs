//! The per-source tables: arrays of buckets of ways (`shaper_common::sources`), a key in
//! one of its two buckets.
//!
//! A known key's frame pays the hash of its key, one call ([`shaper_find4`],
//! [`shaper_find6`]: the scan of its first bucket's eight ways, then its second's, verified
//! once, whose answer is one scalar, so the rest of the frame's path is one path for the
//! verifier whichever way matched) and an inlined array lookup. A key new to the table,
//! admitted, is given a way by [`shaper_claim4`] or [`shaper_claim6`] under its buckets'
//! locks: a free way of the bucket with more of them, else one whose cell is idle (its
//! TAT at or behind now: a fresh cell would be identical; the key's counters leave with
//! it), else none, and the key is metered as one refused by admission (in its policy's
//! shared unadmitted cell). So a flood cannot evict a source that is being metered, and the
//! table never holds a key twice: a key is given a way only under both its buckets' locks,
//! after a scan of both buckets under them. A CPU that finds a lock taken waits for it (a
//! claim holds it for a few hundred instructions), so two CPUs' first frames of one key
//! both land in its one cell; only if the holder stays away past a bound does the frame
//! go to the unadmitted cell (the key's next frame tries again).
//!
//! A way given to a key is marked busy first (its key word, or its tag), its key and state
//! written, then its key word or tag published with a compare-and-swap (a full barrier).
//! A lookup matches an IPv4 way by its key word alone (one aligned 64-bit load); an IPv6
//! way by its tag, the whole key, and its tag again (unchanged), so a way half-written for
//! another key never matches. A CPU that found a way just before it was taken from its idle
//! key may still count that key's frame in it: one frame, in a way whose cell was idle.

use aya_ebpf::{cty::c_void, helpers::generated::bpf_loop};
use shaper_common::{
    maps::SourceState,
    sources::{
        SOURCE_FREE, SOURCE_LOCKED, SOURCE_V4_BUSY, SOURCE_V6_BUSY, SOURCE_WAYS, SourceBucket4,
        SourceBucket6, bucket_of, second_bucket_of, tag_v6, word_v4,
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

/// The way of IPv4 `key` (whose hash is `hash`) in its first bucket, then its second, or
/// [`NO_WAY`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_find4(key: u32, hash: u64) -> u64 {
    let buckets = source_bucket_count();
    let word = word_v4(key);
    for index in [bucket_of(hash, buckets), second_bucket_of(hash, buckets)] {
        let Some(bucket) = SOURCES.get_ptr_mut(index) else {
            return NO_WAY;
        };
        // SAFETY: a live map value.
        let i = unsafe { scan4(bucket, word) };
        if i < SOURCE_WAYS {
            return position(index, i);
        }
    }
    NO_WAY
}

/// The way of the IPv6 key of halves `hi`, `lo` (whose hash is `hash`), or [`NO_WAY`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_find6(hi: u64, lo: u64, hash: u64) -> u64 {
    let buckets = source_bucket_count();
    let tag = tag_v6(hash);
    for index in [bucket_of(hash, buckets), second_bucket_of(hash, buckets)] {
        let Some(bucket) = SOURCES6.get_ptr_mut(index) else {
            return NO_WAY;
        };
        // SAFETY: a live map value.
        let i = unsafe { scan6(bucket, tag, hi, lo) };
        if i < SOURCE_WAYS {
            return position(index, i);
        }
    }
    NO_WAY
}

/// The way of IPv4 `bucket` whose key word is `word`, or [`SOURCE_WAYS`].
///
/// # Safety
/// `bucket` points to a live map value.
#[inline(always)]
unsafe fn scan4(bucket: *mut SourceBucket4, word: u64) -> usize {
    for i in 0..SOURCE_WAYS {
        // SAFETY: the caller's; an aligned u64.
        if unsafe { atomic::load(&raw const (*bucket).keys[i]) } == word {
            return i;
        }
    }
    SOURCE_WAYS
}

/// The way of IPv6 `bucket` that holds the key of `tag`, `hi`, `lo`, or [`SOURCE_WAYS`].
///
/// # Safety
/// `bucket` points to a live map value.
#[inline(always)]
unsafe fn scan6(bucket: *mut SourceBucket6, tag: u32, hi: u64, lo: u64) -> usize {
    for i in 0..SOURCE_WAYS {
        // SAFETY: the caller's.
        if unsafe { matches6(bucket, i, tag, hi, lo) } {
            return i;
        }
    }
    SOURCE_WAYS
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

/// How many times a CPU tries a bucket's lock held by another before it gives up: a claim
/// holds it for a scan of two buckets and a way's writes; the bound is for a holder the
/// hypervisor stopped.
const LOCK_TRIES: u32 = 1 << 14;

/// Takes a bucket's lock if it is free.
///
/// # Safety
/// `lock` points into a live map value.
#[inline(always)]
unsafe fn try_lock(lock: *mut u64) -> bool {
    // SAFETY: the caller's.
    unsafe { atomic::load(lock) == 0 && atomic::compare_exchange(lock, 0, SOURCE_LOCKED).is_ok() }
}

/// The lock a [`wait_for_lock`] waits for, and whether it took it.
#[repr(C)]
struct LockWait {
    lock: *mut u64,
    taken: u64,
}

/// One try of a wait, as `bpf_loop` calls it: 1 (stop) once the lock is taken.
extern "C" fn wait_for_lock(_try: u32, wait: *mut c_void) -> i64 {
    let wait = wait.cast::<LockWait>();
    // SAFETY: `bpf_loop` passes the caller's LockWait, whose lock points into a live map
    // value.
    unsafe {
        if try_lock((*wait).lock) {
            (*wait).taken = 1;
            return 1;
        }
    }
    0
}

/// Takes a bucket's lock, waiting (a bounded while) for another CPU to give it back. The
/// wait is `bpf_loop`'s, whose callback the verifier walks once, not once a try.
///
/// # Safety
/// `lock` points into a live map value.
#[inline(always)]
unsafe fn lock(lock: *mut u64) -> bool {
    // SAFETY: the caller's.
    if unsafe { try_lock(lock) } {
        return true;
    }
    let mut wait = LockWait { lock, taken: 0 };
    // SAFETY: a callback of bpf_loop's signature; `wait` outlives the call.
    unsafe {
        bpf_loop(
            LOCK_TRIES,
            wait_for_lock as *mut c_void,
            (&raw mut wait).cast(),
            0,
        );
    }
    wait.taken == 1
}

/// Runs `claim` (given whether the key's two buckets `a`, `b` are two) with both buckets'
/// locks held, taken lower index first so that two CPUs claiming keys of the same two
/// buckets wait in one order; [`NO_WAY`] if a lock stayed taken.
///
/// # Safety
/// `lock_a` and `lock_b` point into the live map values of buckets `a` and `b`.
#[inline(always)]
unsafe fn locked(
    (lock_a, a): (*mut u64, u32),
    (lock_b, b): (*mut u64, u32),
    claim: impl FnOnce(bool) -> u64,
) -> u64 {
    let two = a != b;
    let (one, other) = if a <= b {
        (lock_a, lock_b)
    } else {
        (lock_b, lock_a)
    };
    // SAFETY: the caller's; each lock taken is given back on every path.
    unsafe {
        if !lock(one) {
            return NO_WAY;
        }
        if two && !lock(other) {
            unlock(one);
            return NO_WAY;
        }
        let answer = claim(two);
        if two {
            unlock(other);
        }
        unlock(one);
        answer
    }
}

/// Gives a bucket's lock back.
///
/// # Safety
/// `lock` points into a live map value, whose lock this CPU holds.
#[inline(always)]
unsafe fn unlock(lock: *mut u64) {
    // SAFETY: the caller's.
    unsafe { core::ptr::write_volatile(lock, 0) }
}

/// What a bucket has room for at `now`, packed: how many of its ways are free (bits 0–7),
/// the first of them (bits 8–15, [`SOURCE_WAYS`] if none), and the first way whose cell
/// is idle (bits 16–23, [`SOURCE_WAYS`] if none). One scalar for the verifier, whatever the
/// ways hold: inlined, the two buckets' scans would multiply each other's paths.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_room4(index: u32, now: u64) -> u64 {
    let Some(bucket) = SOURCES.get_ptr_mut(index) else {
        return NO_ROOM;
    };
    // SAFETY: a live map value, its words aligned.
    unsafe {
        room(
            |i| atomic::load(&raw const (*bucket).keys[i & 7]) == SOURCE_FREE,
            &raw const (*bucket).states,
            now,
        )
    }
}

/// [`shaper_room4`] for a bucket of the IPv6 table.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_room6(index: u32, now: u64) -> u64 {
    let Some(bucket) = SOURCES6.get_ptr_mut(index) else {
        return NO_ROOM;
    };
    // SAFETY: a live map value, its words aligned.
    unsafe {
        room(
            |i| core::ptr::read_volatile(&raw const (*bucket).tags[i & 7]) == SOURCE_FREE as u32,
            &raw const (*bucket).states,
            now,
        )
    }
}

/// A bucket with no room at all ([`shaper_room4`]).
const NO_ROOM: u64 = (SOURCE_WAYS as u64) << 8 | (SOURCE_WAYS as u64) << 16;

/// [`shaper_room4`]'s scan, of a bucket whose free ways `free` says.
///
/// # Safety
/// `states` point into a live map value.
#[inline(always)]
unsafe fn room(
    free: impl Fn(usize) -> bool,
    states: *const [SourceState; SOURCE_WAYS],
    now: u64,
) -> u64 {
    let (mut count, mut first, mut idle) = (0u64, SOURCE_WAYS as u64, SOURCE_WAYS as u64);
    for i in 0..SOURCE_WAYS {
        if free(i) {
            count += 1;
            first = first.min(i as u64);
        // SAFETY: the caller's.
        } else if idle == SOURCE_WAYS as u64 && unsafe { is_idle(&raw const (*states)[i], now) } {
            idle = i as u64;
        }
    }
    count | first << 8 | idle << 16
}

/// The free ways, first free way and first idle way of a [`shaper_room4`] answer.
#[inline(always)]
fn unpack(room: u64) -> (usize, usize, usize) {
    (
        (room & 0xFF) as usize,
        ((room >> 8) & 0xFF) as usize,
        ((room >> 16) & 0xFF) as usize,
    )
}

/// Which of a key's two buckets gives it which way, of what each has ([`room`]): a free way
/// of the one with more of them (the first on a tie), else an idle way of the first, then
/// of the second; `None` if neither has one.
#[inline(always)]
fn choose(
    first: (usize, usize, usize),
    second: Option<(usize, usize, usize)>,
) -> Option<(bool, usize)> {
    let second = second.unwrap_or((0, SOURCE_WAYS, SOURCE_WAYS));
    if first.0 > 0 && first.0 >= second.0 {
        return Some((false, first.1));
    }
    if second.0 > 0 {
        return Some((true, second.1));
    }
    if first.2 < SOURCE_WAYS {
        return Some((false, first.2));
    }
    (second.2 < SOURCE_WAYS).then_some((true, second.2))
}

/// Gives IPv4 `key` (of `hash`) a way at `now` (ticks), its state fresh but for its
/// `policy` word: see the module. Returns the way (with [`CLAIMED_NEW`] if it is new to
/// the key) or [`NO_WAY`]. Both its buckets' locks are held while the key is looked for
/// and given a way, so two CPUs never give one key two ways.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_claim4(key: u32, hash: u64, policy: u64, now: u64) -> u64 {
    let buckets = source_bucket_count();
    let (a, b) = (bucket_of(hash, buckets), second_bucket_of(hash, buckets));
    let (Some(first), Some(second)) = (SOURCES.get_ptr_mut(a), SOURCES.get_ptr_mut(b)) else {
        return NO_WAY;
    };
    let word = word_v4(key);
    // SAFETY: live map values, every word of them aligned.
    unsafe {
        locked(
            (&raw mut (*first).lock, a),
            (&raw mut (*second).lock, b),
            |two| claim4_locked((first, a), (second, b, two), word, policy, now),
        )
    }
}

/// [`shaper_claim4`] with the buckets' locks held (`two`: the second is another bucket).
///
/// # Safety
/// Both point to live map values whose locks this CPU holds.
#[inline(always)]
unsafe fn claim4_locked(
    (first, a): (*mut SourceBucket4, u32),
    (second, b, two): (*mut SourceBucket4, u32, bool),
    word: u64,
    policy: u64,
    now: u64,
) -> u64 {
    // SAFETY: the caller's.
    unsafe {
        let i = scan4(first, word);
        if i < SOURCE_WAYS {
            return position(a, i);
        }
        let i = scan4(second, word);
        if two && i < SOURCE_WAYS {
            return position(b, i);
        }
        let room_a = unpack(shaper_room4(a, now));
        let room_b = two.then(|| unpack(shaper_room4(b, now)));
        let Some((in_second, i)) = choose(room_a, room_b) else {
            return NO_WAY;
        };
        let (bucket, index) = if in_second { (second, b) } else { (first, a) };
        let i = i & (SOURCE_WAYS - 1);
        let slot = &raw mut (*bucket).keys[i];
        core::ptr::write_volatile(slot, SOURCE_V4_BUSY);
        fresh(&raw mut (*bucket).states[i], policy);
        // A compare-and-swap, a full barrier: the state is written before any CPU can
        // match the word.
        let _ = atomic::compare_exchange(slot, SOURCE_V4_BUSY, word);
        position(index, i) | CLAIMED_NEW
    }
}

/// [`shaper_claim4`] for the IPv6 key of halves `hi`, `lo`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_claim6(hi: u64, lo: u64, hash: u64, policy: u64, now: u64) -> u64 {
    let buckets = source_bucket_count();
    let (a, b) = (bucket_of(hash, buckets), second_bucket_of(hash, buckets));
    let (Some(first), Some(second)) = (SOURCES6.get_ptr_mut(a), SOURCES6.get_ptr_mut(b)) else {
        return NO_WAY;
    };
    // SAFETY: as in shaper_claim4.
    unsafe {
        locked(
            (&raw mut (*first).lock, a),
            (&raw mut (*second).lock, b),
            |two| claim6_locked((first, a), (second, b, two), (hi, lo, hash), policy, now),
        )
    }
}

/// [`shaper_claim6`] with the buckets' locks held.
///
/// # Safety
/// As [`claim4_locked`].
#[inline(always)]
unsafe fn claim6_locked(
    (first, a): (*mut SourceBucket6, u32),
    (second, b, two): (*mut SourceBucket6, u32, bool),
    (hi, lo, hash): (u64, u64, u64),
    policy: u64,
    now: u64,
) -> u64 {
    let tag = tag_v6(hash);
    // SAFETY: the caller's.
    unsafe {
        let i = scan6(first, tag, hi, lo);
        if i < SOURCE_WAYS {
            return position(a, i);
        }
        let i = scan6(second, tag, hi, lo);
        if two && i < SOURCE_WAYS {
            return position(b, i);
        }
        let room_a = unpack(shaper_room6(a, now));
        let room_b = two.then(|| unpack(shaper_room6(b, now)));
        let Some((in_second, i)) = choose(room_a, room_b) else {
            return NO_WAY;
        };
        let (bucket, index) = if in_second { (second, b) } else { (first, a) };
        let i = i & (SOURCE_WAYS - 1);
        // Busy before the key is written, the key and state before the tag is published:
        // each tag written with a compare-and-swap, a full barrier.
        set_tag(bucket, i, SOURCE_V6_BUSY);
        let key = &raw mut (*bucket).keys[i];
        core::ptr::write_volatile(&raw mut (*key)[0], hi);
        core::ptr::write_volatile(&raw mut (*key)[1], lo);
        fresh(&raw mut (*bucket).states[i], policy);
        set_tag(bucket, i, tag);
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
    const _: () = assert!(SOURCE_WAYS.is_multiple_of(2));
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
