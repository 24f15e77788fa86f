//! The per-source tables (`SHAPER_SOURCES`, `SHAPER_SOURCES6`) as their keys and states:
//! the one place that knows their layout of buckets and ways (`shaper_common::sources`).
//! Readers take the occupied ways ([`each_v4`], [`each_v6`], [`read_v4`], [`read_v6`]);
//! warm starts, upgrades and tests place keys ([`write_v4`], [`write_v6`]) where the
//! kernel would look for them.

use std::collections::BTreeSet;

use aya::maps::{MapData, MapError};
use shaper_common::{
    maps::{Ipv4Key, Ipv6Key, SourceState},
    sources::{
        SOURCE_FREE, SOURCE_V4_LIVE, SOURCE_V6_BUSY, SOURCE_WAYS, SourceBucket4, SourceBucket6,
        bucket_of, halves, hash_v4, hash_v6, join, second_bucket_of, source_room, tag_v6, word_v4,
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
/// (no CPU runs the old program any more): for each key of `old` (the old map as the old
/// program left it), its way in the table `map` gets the later of the two theoretical
/// arrival times and the frames the old program counted since the copy (`copied`: each
/// key's state as it was copied); a key the old program made since the copy is placed as
/// it is. The buckets changed are written whole: a frame the new program meters in one of
/// them between their read and their write is lost (the same race as the subscribers'
/// top-up of layout 8). Returns the keys placed or topped up, and those left out.
pub fn top_up_v4(
    map: &MapData,
    seed: u64,
    old: &[(Ipv4Key, SourceState)],
    copied: &std::collections::HashMap<Ipv4Key, SourceState>,
) -> Result<Placed, MapError> {
    let mut table: Vec<SourceBucket4> = read_batched::<u32, SourceBucket4>(map)?
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    let mut changed = BTreeSet::new();
    let mut placed = Placed::default();
    for (k, o) in old {
        let word = word_v4(*k);
        let spot = place(
            &table,
            hash_v4(*k, seed),
            |b, i| b.keys[i] == word,
            |b, i| b.keys[i] == SOURCE_FREE,
        );
        let Some((index, i)) = spot else {
            placed.full += 1;
            continue;
        };
        let bucket = &mut table[index as usize];
        let now = (bucket.keys[i] == word).then_some(bucket.states[i]);
        let Some(merged) = merged(now, o, copied.get(k)) else {
            continue;
        };
        bucket.keys[i] = word;
        bucket.states[i] = merged;
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

/// [`top_up_v4`] for the IPv6 table.
pub fn top_up_v6(
    map: &MapData,
    seed: u64,
    old: &[(Ipv6Key, SourceState)],
    copied: &std::collections::HashMap<Ipv6Key, SourceState>,
) -> Result<Placed, MapError> {
    let mut table: Vec<SourceBucket6> = read_batched::<u32, SourceBucket6>(map)?
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    let mut changed = BTreeSet::new();
    let mut placed = Placed::default();
    for (k, o) in old {
        let key = halves(k);
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
        let now = (bucket.tags[i] == tag && bucket.keys[i] == key).then_some(bucket.states[i]);
        let Some(merged) = merged(now, o, copied.get(k)) else {
            continue;
        };
        bucket.tags[i] = tag;
        bucket.keys[i] = key;
        bucket.states[i] = merged;
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

/// A key's state in the table after a top-up: `now` (its state in the table, if it has a
/// way) with the later TAT of it and `old` (the old map's final state) and the frames `old`
/// counted since `copied`; `old` itself for a key with no way yet. `None`: nothing to add.
fn merged(
    now: Option<SourceState>,
    old: &SourceState,
    copied: Option<&SourceState>,
) -> Option<SourceState> {
    let Some(mut state) = now else {
        return Some(*old);
    };
    let base = copied.copied().unwrap_or_default();
    let (o, b) = (&old.outcomes, &base.outcomes);
    let more = [
        o.passed_packets.saturating_sub(b.passed_packets),
        o.passed_bytes.saturating_sub(b.passed_bytes),
        o.dropped_packets.saturating_sub(b.dropped_packets),
        o.dropped_bytes.saturating_sub(b.dropped_bytes),
        o.would_drop_packets.saturating_sub(b.would_drop_packets),
        o.would_drop_bytes.saturating_sub(b.would_drop_bytes),
    ];
    if more == [0; 6] && old.cell.tat <= state.cell.tat {
        return None;
    }
    let s = &mut state.outcomes;
    s.passed_packets += more[0];
    s.passed_bytes += more[1];
    s.dropped_packets += more[2];
    s.dropped_bytes += more[3];
    s.would_drop_packets += more[4];
    s.would_drop_bytes += more[5];
    state.cell.tat = state.cell.tat.max(old.cell.tat);
    Some(state)
}
