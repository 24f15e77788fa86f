//! The per-source tables (`SHAPER_SOURCES`, `SHAPER_SOURCES6`) as their keys and states:
//! the one place that knows their layout of buckets and ways (`shaper_common::sources`).
//! Readers take the occupied ways ([`each_v4`], [`each_v6`], [`read_v4`], [`read_v6`]);
//! warm starts, upgrades and tests place keys ([`write_v4`], [`write_v6`]) where the
//! kernel would look for them.

use std::{
    collections::BTreeSet,
    sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst},
};

use aya::maps::{MapData, MapError};
use shaper_common::{
    maps::{Ipv4Key, Ipv6Key, SourceState},
    sources::{
        SOURCE_FREE, SOURCE_LOCKED, SOURCE_V4_BUSY, SOURCE_V4_LIVE, SOURCE_V6_BUSY, SOURCE_WAYS,
        SourceBucket4, SourceBucket6, bucket_of, halves, hash_v4, hash_v6, join, second_bucket_of,
        source_room, tag_v6, word_v4,
    },
};

use crate::maps::{each_batched_where, read_batched, write_batched};

/// The keys a table of `buckets` buckets has room for (`--max-sources`, rounded up to
/// whole buckets).
pub fn room(buckets: u32) -> u32 {
    source_room(buckets)
}

/// The IPv4 key of an occupied way's key word.
fn key_v4(word: u64) -> Option<Ipv4Key> {
    (word & !u64::from(u32::MAX) == SOURCE_V4_LIVE).then_some(word as u32)
}

/// Each occupied way of an IPv4 bucket.
pub fn ways_v4(bucket: &SourceBucket4) -> impl Iterator<Item = (Ipv4Key, SourceState)> + '_ {
    (0..SOURCE_WAYS).filter_map(|i| key_v4(bucket.keys[i]).map(|k| (k, bucket.states[i])))
}

/// Each occupied way of an IPv6 bucket (its tag odd: neither free nor busy).
pub fn ways_v6(bucket: &SourceBucket6) -> impl Iterator<Item = (Ipv6Key, SourceState)> + '_ {
    (0..SOURCE_WAYS)
        .filter(|&i| bucket.tags[i] & 1 == 1)
        .map(|i| (join(bucket.keys[i]), bucket.states[i]))
}

/// Hands `f` every tracked IPv4 key and its state, read in batches of buckets (the empty
/// ones never copied out).
pub fn each_v4(map: &MapData, mut f: impl FnMut(Ipv4Key, SourceState)) -> Result<(), MapError> {
    each_batched_where::<u32, SourceBucket4>(map, occupied_v4, |_, bucket| {
        for (k, s) in ways_v4(&bucket) {
            f(k, s);
        }
    })
}

/// The same for IPv6 keys.
pub fn each_v6(map: &MapData, mut f: impl FnMut(Ipv6Key, SourceState)) -> Result<(), MapError> {
    each_batched_where::<u32, SourceBucket6>(map, occupied_v6, |_, bucket| {
        for (k, s) in ways_v6(&bucket) {
            f(k, s);
        }
    })
}

/// Every tracked IPv4 key and its state.
pub fn read_v4(map: &MapData) -> Result<Vec<(Ipv4Key, SourceState)>, MapError> {
    let mut all = Vec::new();
    each_v4(map, |k, s| all.push((k, s)))?;
    Ok(all)
}

/// Every tracked IPv6 key and its state.
pub fn read_v6(map: &MapData) -> Result<Vec<(Ipv6Key, SourceState)>, MapError> {
    let mut all = Vec::new();
    each_v6(map, |k, s| all.push((k, s)))?;
    Ok(all)
}

/// Whether a bucket's bytes hold a key (a non-zero key word or tag): the others are not
/// copied out of the batch's buffer.
fn occupied_v4(bytes: &[u8]) -> bool {
    bytes[8..8 + 8 * SOURCE_WAYS].iter().any(|&b| b != 0)
}

fn occupied_v6(bytes: &[u8]) -> bool {
    bytes[8..8 + 4 * SOURCE_WAYS].iter().any(|&b| b != 0)
}

/// Keys [`write_v4`] or [`write_v6`] could not place: their bucket's ways were all taken.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Placed {
    pub placed: usize,
    pub full: usize,
}

/// Places `entries` in the IPv4 table `map` under hash seed `seed` (the attachment's
/// [`Config::trace_seed`](shaper_common::maps::Config::trace_seed)) as the kernel would: a
/// key already in one of its two buckets gets the state given there, a new one the first
/// free way of the bucket with more of them. The table is read and the buckets changed
/// written whole: for a table no program is writing (a warm start before the link, an
/// upgrade's new table, a test).
pub fn write_v4(
    map: &MapData,
    seed: u64,
    entries: &[(Ipv4Key, SourceState)],
) -> Result<Placed, MapError> {
    let mut table: Vec<SourceBucket4> = read_batched::<u32, SourceBucket4>(map)?
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    let mut changed = BTreeSet::new();
    let mut placed = Placed::default();
    for &(k, s) in entries {
        let word = word_v4(k);
        let spot = place(
            &table,
            hash_v4(k, seed),
            |b, i| b.keys[i] == word,
            |b, i| b.keys[i] == SOURCE_FREE,
        );
        let Some((index, i)) = spot else {
            placed.full += 1;
            continue;
        };
        let bucket = &mut table[index as usize];
        bucket.keys[i] = word;
        bucket.states[i] = s;
        changed.insert(index);
        placed.placed += 1;
    }
    let out: Vec<_> = changed
        .into_iter()
        .map(|i| (i, table[i as usize]))
        .collect();
    write_batched(map, &out)?;
    Ok(placed)
}

/// [`write_v4`] for the IPv6 table.
pub fn write_v6(
    map: &MapData,
    seed: u64,
    entries: &[(Ipv6Key, SourceState)],
) -> Result<Placed, MapError> {
    let mut table: Vec<SourceBucket6> = read_batched::<u32, SourceBucket6>(map)?
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    let mut changed = BTreeSet::new();
    let mut placed = Placed::default();
    for &(k, s) in entries {
        let key = halves(&k);
        let hash = hash_v6(key[0], key[1], seed);
        let tag = tag_v6(hash);
        let spot = place(
            &table,
            hash,
            |b, i| b.tags[i] == tag && b.keys[i] == key,
            |b, i| b.tags[i] == SOURCE_FREE as u32 || b.tags[i] == SOURCE_V6_BUSY,
        );
        let Some((index, i)) = spot else {
            placed.full += 1;
            continue;
        };
        let bucket = &mut table[index as usize];
        bucket.tags[i] = tag;
        bucket.keys[i] = key;
        bucket.states[i] = s;
        changed.insert(index);
        placed.placed += 1;
    }
    let out: Vec<_> = changed
        .into_iter()
        .map(|i| (i, table[i as usize]))
        .collect();
    write_batched(map, &out)?;
    Ok(placed)
}

/// Where a key of `hash` goes in `table` (bucket, way): the way of one of its two buckets
/// that already holds it (`holds`), else the first free way (`free`) of the one with more
/// of them, the first on a tie, as the kernel's claim picks it.
fn place<B>(
    table: &[B],
    hash: u64,
    holds: impl Fn(&B, usize) -> bool,
    free: impl Fn(&B, usize) -> bool,
) -> Option<(u32, usize)> {
    let buckets = u32::try_from(table.len()).ok()?;
    let a = bucket_of(hash, buckets);
    let b = second_bucket_of(hash, buckets);
    let candidates = if a == b { vec![a] } else { vec![a, b] };
    for &index in &candidates {
        let bucket = table.get(index as usize)?;
        if let Some(i) = (0..SOURCE_WAYS).find(|&i| holds(bucket, i)) {
            return Some((index, i));
        }
    }
    let free_ways = |index: u32| -> Vec<usize> {
        (0..SOURCE_WAYS)
            .filter(|&i| free(&table[index as usize], i))
            .collect()
    };
    let best = candidates
        .iter()
        .copied()
        .rev()
        .max_by_key(|&index| free_ways(index).len())?;
    free_ways(best).first().map(|&i| (best, i))
}

/// Empties the IPv4 table: every bucket written free (for a table no program is writing).
pub fn clear_v4(map: &MapData) -> Result<(), MapError> {
    clear::<SourceBucket4>(map)
}

/// Empties the IPv6 table.
pub fn clear_v6(map: &MapData) -> Result<(), MapError> {
    clear::<SourceBucket6>(map)
}

fn clear<B: aya::Pod + Default>(map: &MapData) -> Result<(), MapError> {
    let buckets = map.info()?.max_entries();
    let empty: Vec<(u32, B)> = (0..buckets).map(|i| (i, B::default())).collect();
    write_batched(map, &empty)
}

/// What an upgrade's copy of an old LRU map's keys left behind, added in after the switch
/// (no CPU runs the old program any more) to the live table `map`, mapped into this process
/// (`BPF_F_MMAPABLE`) so every word is written as the program writes it, atomically: for
/// each key of `old` (the old map as the old program left it), the frames it counted since
/// the copy (`copied`: each key's state as it was copied) are added to its way's counters,
/// and its way's theoretical arrival time becomes the later of the two; a key the old
/// program made since the copy is given a free way of its buckets under their locks, as the
/// program gives one. Nothing the new program meters meanwhile is lost. Returns the keys
/// topped up or placed, and those that found both their buckets full.
pub fn top_up_v4(
    map: &MapData,
    seed: u64,
    old: &[(Ipv4Key, SourceState)],
    copied: &std::collections::HashMap<Ipv4Key, SourceState>,
) -> std::io::Result<Placed> {
    let table = Mapped::new(map, size_of::<SourceBucket4>())?;
    let mut placed = Placed::default();
    for (k, o) in old {
        let hash = hash_v4(*k, seed);
        let word = word_v4(*k);
        let holds = |b: u32, i: usize| table.u64_at(b, KEYS4 + 8 * i).load(SeqCst) == word;
        let free = |b: u32, i: usize| table.u64_at(b, KEYS4 + 8 * i).load(SeqCst) == SOURCE_FREE;
        let claim = |b: u32, i: usize, state: &SourceState| {
            let slot = table.u64_at(b, KEYS4 + 8 * i);
            slot.store(SOURCE_V4_BUSY, SeqCst);
            table.write_state(b, STATES4 + STATE * i, state);
            slot.store(word, SeqCst);
        };
        let way = |_: u32, i: usize| STATES4 + STATE * i;
        placed.add(table.top_up(hash, o, copied.get(k), (holds, free, claim, way)));
    }
    Ok(placed)
}

/// [`top_up_v4`] for the IPv6 table.
pub fn top_up_v6(
    map: &MapData,
    seed: u64,
    old: &[(Ipv6Key, SourceState)],
    copied: &std::collections::HashMap<Ipv6Key, SourceState>,
) -> std::io::Result<Placed> {
    let table = Mapped::new(map, size_of::<SourceBucket6>())?;
    let mut placed = Placed::default();
    for (k, o) in old {
        let [hi, lo] = halves(k);
        let hash = hash_v6(hi, lo, seed);
        let tag = tag_v6(hash);
        let holds = |b: u32, i: usize| {
            table.u32_at(b, TAGS6 + 4 * i).load(SeqCst) == tag
                && table.u64_at(b, KEYS6 + 16 * i).load(SeqCst) == hi
                && table.u64_at(b, KEYS6 + 16 * i + 8).load(SeqCst) == lo
        };
        let free = |b: u32, i: usize| table.u32_at(b, TAGS6 + 4 * i).load(SeqCst) == 0;
        let claim = |b: u32, i: usize, state: &SourceState| {
            let t = table.u32_at(b, TAGS6 + 4 * i);
            t.store(SOURCE_V6_BUSY, SeqCst);
            table.u64_at(b, KEYS6 + 16 * i).store(hi, SeqCst);
            table.u64_at(b, KEYS6 + 16 * i + 8).store(lo, SeqCst);
            table.write_state(b, STATES6 + STATE * i, state);
            t.store(tag, SeqCst);
        };
        let way = |_: u32, i: usize| STATES6 + STATE * i;
        placed.add(table.top_up(hash, o, copied.get(k), (holds, free, claim, way)));
    }
    Ok(placed)
}

/// Offsets in a bucket (asserted in `shaper_common::sources`) and in a state.
const KEYS4: usize = 8;
const STATES4: usize = 72;
const TAGS6: usize = 8;
const KEYS6: usize = 40;
const STATES6: usize = 168;
const STATE: usize = size_of::<SourceState>();
const TAT: usize = 0;
const OUTCOMES: usize = 24;

const _: () = assert!(std::mem::offset_of!(SourceBucket4, keys) == KEYS4);
const _: () = assert!(std::mem::offset_of!(SourceBucket4, states) == STATES4);
const _: () = assert!(std::mem::offset_of!(SourceBucket6, tags) == TAGS6);
const _: () = assert!(std::mem::offset_of!(SourceBucket6, keys) == KEYS6);
const _: () = assert!(std::mem::offset_of!(SourceBucket6, states) == STATES6);
const _: () = assert!(std::mem::offset_of!(SourceState, outcomes) == OUTCOMES);

impl Placed {
    fn add(&mut self, topped: Option<bool>) {
        match topped {
            Some(true) => self.placed += 1,
            Some(false) => {}
            None => self.full += 1,
        }
    }
}

/// A table mapped into this process: the buckets the program reads and writes.
struct Mapped {
    base: *mut u8,
    len: usize,
    bucket: usize,
    buckets: u32,
}

impl Mapped {
    fn new(map: &MapData, bucket: usize) -> std::io::Result<Self> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let buckets = map.info().map_err(std::io::Error::other)?.max_entries();
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = (bucket * buckets as usize).next_multiple_of(page);
        // SAFETY: a shared mapping of the map's whole array, which the kernel checks.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            base: base.cast(),
            len,
            bucket,
            buckets,
        })
    }

    fn u64_at(&self, b: u32, offset: usize) -> &AtomicU64 {
        assert!(b < self.buckets && offset + 8 <= self.bucket && offset.is_multiple_of(8));
        // SAFETY: in the mapping (checked above), 8-aligned (buckets are multiples of 8
        // bytes from a page), and every CPU accesses it atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(b as usize * self.bucket + offset).cast()) }
    }

    fn u32_at(&self, b: u32, offset: usize) -> &AtomicU32 {
        assert!(b < self.buckets && offset + 4 <= self.bucket && offset.is_multiple_of(4));
        // SAFETY: as `u64_at`.
        unsafe { AtomicU32::from_ptr(self.base.add(b as usize * self.bucket + offset).cast()) }
    }

    fn write_state(&self, b: u32, at: usize, s: &SourceState) {
        let o = &s.outcomes;
        let words = [
            s.cell.tat,
            s.cell.scale,
            s.policy,
            o.passed_packets,
            o.passed_bytes,
            o.dropped_packets,
            o.dropped_bytes,
            o.would_drop_packets,
            o.would_drop_bytes,
        ];
        for (n, w) in words.into_iter().enumerate() {
            self.u64_at(b, at + 8 * n).store(w, SeqCst);
        }
    }

    /// One key's top-up (see [`top_up_v4`]): `Some(true)` if its way changed or it was
    /// given one, `Some(false)` if nothing was left to add, `None` if both its buckets were
    /// full.
    fn top_up(
        &self,
        hash: u64,
        old: &SourceState,
        copied: Option<&SourceState>,
        (holds, free, claim, way): (
            impl Fn(u32, usize) -> bool,
            impl Fn(u32, usize) -> bool,
            impl Fn(u32, usize, &SourceState),
            impl Fn(u32, usize) -> usize,
        ),
    ) -> Option<bool> {
        let (a, b) = (
            bucket_of(hash, self.buckets),
            second_bucket_of(hash, self.buckets),
        );
        let found = [a, b]
            .into_iter()
            .find_map(|x| (0..SOURCE_WAYS).find(|&i| holds(x, i)).map(|i| (x, i)));
        if let Some((x, i)) = found {
            return Some(self.add(x, way(x, i), old, copied));
        }
        // Not in the table: given a free way under the buckets' locks, taken lower index
        // first as the program takes them, and as it gives one (scanning again under them).
        let locks: Vec<u32> = if a == b { vec![a] } else { vec![a, b] };
        let mut order = locks.clone();
        order.sort_unstable();
        for &l in &order {
            while self
                .u64_at(l, 0)
                .compare_exchange(0, SOURCE_LOCKED, SeqCst, SeqCst)
                .is_err()
            {
                std::hint::spin_loop();
            }
        }
        let found = locks
            .iter()
            .find_map(|&x| (0..SOURCE_WAYS).find(|&i| holds(x, i)).map(|i| (x, i)));
        let result = match found {
            Some((x, i)) => Some(self.add(x, way(x, i), old, copied)),
            None => {
                let free_ways = |x: u32| (0..SOURCE_WAYS).filter(|&i| free(x, i)).count();
                let best = locks.iter().copied().rev().max_by_key(|&x| free_ways(x));
                match best.and_then(|x| (0..SOURCE_WAYS).find(|&i| free(x, i)).map(|i| (x, i))) {
                    Some((x, i)) => {
                        claim(x, i, old);
                        Some(true)
                    }
                    None => None,
                }
            }
        };
        for &l in order.iter().rev() {
            self.u64_at(l, 0).store(0, SeqCst);
        }
        result
    }

    /// Adds to the state at `at` of bucket `b` what `old` counted since `copied`, and makes
    /// its TAT the later of the two.
    fn add(&self, b: u32, at: usize, old: &SourceState, copied: Option<&SourceState>) -> bool {
        let base = copied.copied().unwrap_or_default();
        let (o, c) = (&old.outcomes, &base.outcomes);
        let more = [
            o.passed_packets.saturating_sub(c.passed_packets),
            o.passed_bytes.saturating_sub(c.passed_bytes),
            o.dropped_packets.saturating_sub(c.dropped_packets),
            o.dropped_bytes.saturating_sub(c.dropped_bytes),
            o.would_drop_packets.saturating_sub(c.would_drop_packets),
            o.would_drop_bytes.saturating_sub(c.would_drop_bytes),
        ];
        for (n, m) in more.iter().enumerate().filter(|(_, m)| **m != 0) {
            self.u64_at(b, at + OUTCOMES + 8 * n).fetch_add(*m, SeqCst);
        }
        let tat = self.u64_at(b, at + TAT);
        let later = tat.fetch_max(old.cell.tat, SeqCst) < old.cell.tat;
        later || more != [0; 6]
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of `len` bytes.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
