//! The per-source tables `SHAPER_SOURCES` (IPv4) and `SHAPER_SOURCES6` (IPv6): arrays of
//! buckets of [`SOURCE_WAYS`] ways, each way a key and its [`SourceState`] (issue 35).
//!
//! A key's two buckets are picked by a seeded hash of the key ([`hash_v4`], [`hash_v6`],
//! seeded by [`Config::trace_seed`](crate::maps::Config::trace_seed): a flood cannot aim at
//! a source's bucket; [`bucket_of`], [`second_bucket_of`]); it lives in one of their ways,
//! or nowhere. The kernel finds a
//! key by comparing the ways' key words (IPv4) or tags and then the whole key (IPv6), and
//! claims a way for a new one under the buckets' lock words: a free way of the bucket with
//! more of them, else one whose cell is idle (its TAT at or behind now, so a fresh cell would be the same), else none (the
//! key is metered in its policy's shared unadmitted cell). So a table costs its keys and
//! states and nothing else: no kernel hash-table entry, no LRU list.
//!
//! Userspace reads and writes them through one module (`shaper_user::table`), with the
//! same hash and the same words.

use core::mem::offset_of;

use crate::maps::SourceState;

/// Ways of a bucket.
pub const SOURCE_WAYS: usize = 8;

/// An IPv4 way's key word: [`SOURCE_V4_LIVE`] with the key ([`crate::maps::Ipv4Key`]) in
/// the low 32 bits; [`SOURCE_FREE`] for a free way; [`SOURCE_V4_BUSY`] while the way is
/// being given to a key (under the bucket's lock). No key's word is either.
pub const SOURCE_FREE: u64 = 0;
pub const SOURCE_V4_LIVE: u64 = 1 << 32;
pub const SOURCE_V4_BUSY: u64 = 1 << 33;

/// An IPv6 way's tag: `SOURCE_FREE` (0) for a free way, [`SOURCE_V6_BUSY`] while the way is
/// being given to a key, otherwise the key's [`tag_v6`] (odd). Its key is written while the
/// tag is busy, and a lookup matches a way only if its tag is the key's both before and
/// after the whole key compared equal.
pub const SOURCE_V6_BUSY: u32 = 2;

/// The bucket lock word: 0 free, [`SOURCE_LOCKED`] while a CPU gives a way to a key.
pub const SOURCE_LOCKED: u64 = 1;

/// A bucket of `SHAPER_SOURCES`: the lock, the key words (one cache line), the states.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceBucket4 {
    pub lock: u64,
    pub keys: [u64; SOURCE_WAYS],
    pub states: [SourceState; SOURCE_WAYS],
}

const _: () = assert!(size_of::<SourceBucket4>() == 648);
const _: () = assert!(offset_of!(SourceBucket4, keys) == 8);
const _: () = assert!(offset_of!(SourceBucket4, states) == 72);

/// A bucket of `SHAPER_SOURCES6`: the lock, the tags, the keys as two halves in memory
/// order (`u64::from_ne_bytes` of bytes 0–7 and 8–15 of [`crate::maps::Ipv6Key`]), the
/// states.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceBucket6 {
    pub lock: u64,
    pub tags: [u32; SOURCE_WAYS],
    pub keys: [[u64; 2]; SOURCE_WAYS],
    pub states: [SourceState; SOURCE_WAYS],
}

const _: () = assert!(size_of::<SourceBucket6>() == 744);
const _: () = assert!(offset_of!(SourceBucket6, tags) == 8);
const _: () = assert!(offset_of!(SourceBucket6, keys) == 40);
const _: () = assert!(offset_of!(SourceBucket6, states) == 168);

/// Bytes a tracked source costs: under 96 in either family.
const _: () = assert!(size_of::<SourceBucket4>() / SOURCE_WAYS == 81);
const _: () = assert!(size_of::<SourceBucket6>() / SOURCE_WAYS == 93);

/// The buckets of a table of room for `max_sources` keys: `max_sources / SOURCE_WAYS`
/// rounded up (at least one). Not a power of two: a key's bucket is its hash scaled to the
/// number of buckets ([`bucket_of`]), so a million sources cost a million ways, not 2^20.
pub const fn source_buckets(max_sources: u32) -> u32 {
    let buckets = max_sources.div_ceil(SOURCE_WAYS as u32);
    if buckets == 0 { 1 } else { buckets }
}

/// The keys a table of `buckets` buckets has room for.
pub const fn source_room(buckets: u32) -> u32 {
    buckets.saturating_mul(SOURCE_WAYS as u32)
}

/// splitmix64's finalizer: every bit of the input moves every bit of the output.
#[inline(always)]
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The hash of an IPv4 key under `seed` (the doorkeeper's traces use it too).
#[inline(always)]
pub fn hash_v4(key: u32, seed: u64) -> u64 {
    mix(u64::from(key) ^ seed)
}

/// The hash of an IPv6 key given as its halves (bytes in memory order); never the hash of
/// an IPv4 key but by chance.
#[inline(always)]
pub fn hash_v6(hi: u64, lo: u64, seed: u64) -> u64 {
    mix(mix(hi ^ seed) ^ lo ^ (1 << 63))
}

/// The bucket of a key of `hash` in a table of `buckets` buckets: the hash's high half
/// (the traces take their bucket from the low one) scaled to `0..buckets` with a multiply
/// and a shift, no division.
#[inline(always)]
pub fn bucket_of(hash: u64, buckets: u32) -> u32 {
    (((hash >> 32) * u64::from(buckets)) >> 32) as u32
}

/// The second bucket of a key of `hash`: a key lives in whichever of its two buckets had
/// more free ways when it was given one ("two choices": at 76% of the room, one bucket a
/// key would leave 6% of a random table's keys without a way, two leave 1 in 25,000). The
/// same as the first, now and then: then the key has one.
#[inline(always)]
pub fn second_bucket_of(hash: u64, buckets: u32) -> u32 {
    bucket_of(mix(hash ^ 0x5EC0_4D5E_C04D_5EC0), buckets)
}

/// The tag of an IPv6 key of `hash`: odd, so never free or busy.
#[inline(always)]
pub fn tag_v6(hash: u64) -> u32 {
    hash as u32 | 1
}

/// The key word of an IPv4 key.
#[inline(always)]
pub fn word_v4(key: u32) -> u64 {
    u64::from(key) | SOURCE_V4_LIVE
}

/// The halves of an IPv6 key, as the kernel compares them.
#[inline(always)]
pub fn halves(key: &[u8; 16]) -> [u64; 2] {
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&key[..8]);
    lo.copy_from_slice(&key[8..]);
    [u64::from_ne_bytes(hi), u64::from_ne_bytes(lo)]
}

/// The IPv6 key of its halves.
#[inline(always)]
pub fn join(halves: [u64; 2]) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&halves[0].to_ne_bytes());
    key[8..].copy_from_slice(&halves[1].to_ne_bytes());
    key
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], integers only, no implicit padding (sizes asserted above).
    unsafe impl aya::Pod for super::SourceBucket4 {}
    unsafe impl aya::Pod for super::SourceBucket6 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_a_power_of_two_with_room_for_max_sources() {
        assert_eq!(source_buckets(0), 1);
        assert_eq!(source_buckets(1), 1);
        assert_eq!(source_buckets(8), 1);
        assert_eq!(source_buckets(9), 2);
        assert_eq!(source_buckets(262_144), 32_768);
        assert_eq!(source_buckets(1_000_000), 125_000);
        assert_eq!(source_buckets(1 << 20), 131_072);
        assert_eq!(source_room(source_buckets(1_000_000)), 1_000_000);
        assert_eq!(source_room(source_buckets(1_000_001)), 1_000_008);
    }

    #[test]
    fn every_bucket_is_in_range_and_used() {
        for buckets in [1, 3, 125_000] {
            let mut seen = [false; 3];
            for key in 0..10_000u32 {
                let hash = hash_v4(key, 42);
                for b in [bucket_of(hash, buckets), second_bucket_of(hash, buckets)] {
                    assert!(b < buckets, "{b} of {buckets}");
                    if buckets == 3 {
                        seen[b as usize] = true;
                    }
                }
            }
            assert!(buckets != 3 || seen == [true; 3]);
        }
        assert_eq!(bucket_of(u64::MAX, 125_000), 124_999);
        assert_eq!(bucket_of(0, 125_000), 0);
    }

    #[test]
    fn no_key_word_or_tag_is_free_or_busy() {
        for key in [0, 1, u32::MAX] {
            assert_ne!(word_v4(key), SOURCE_FREE);
            assert_ne!(word_v4(key), SOURCE_V4_BUSY);
        }
        for hash in [0, 1, 2, u64::MAX] {
            assert_ne!(tag_v6(hash), 0);
            assert_ne!(tag_v6(hash), SOURCE_V6_BUSY);
        }
        let key = [7u8; 16];
        assert_eq!(join(halves(&key)), key);
    }
}
