//! Metering one frame against its key's cell: lookup or create, then a bounded
//! compare-and-swap loop around the shared GCRA decision. The same code serves both
//! families: it takes the map (IPv4 or IPv6 keys) by reference.

use aya_ebpf::maps::LruHashMap;
use shaper_common::{gcra::Limit, maps::SourceState};

use crate::{atomic, counters::bump};

/// How many times a CPU retries when other CPUs keep updating the same cell between its
/// read and its swap. Each failed swap means another CPU made progress on this source,
/// so exhaustion is rare and only under heavy contention on a single source.
const CAS_RETRIES: usize = 4;

/// BPF_NOEXIST: create only; a concurrent creator wins and we meter against its cell.
const BPF_NOEXIST: u64 = 1;
/// What the kernel returns (negated) when a BPF_NOEXIST insert finds the key.
const EEXIST: i32 = 17;

pub enum Verdict {
    Pass,
    Drop,
}

/// Meters a `len`-byte frame of `key`'s, in `map`, at `now` (ticks).
#[inline(always)]
pub fn meter<K>(
    map: &LruHashMap<K, SourceState>,
    key: &K,
    len: u32,
    now: u64,
    limit: &Limit,
) -> Verdict {
    let state = match map.get_ptr_mut(key) {
        Some(state) => state,
        None => match create(map, key, len, now, limit) {
            Created::Done(verdict) => return verdict,
            Created::Raced => match map.get_ptr_mut(key) {
                Some(state) => state,
                None => return untracked(),
            },
            Created::Failed => return untracked(),
        },
    };
    // SAFETY: `state` points into the map value, valid for this program run; every
    // field is accessed atomically because other CPUs share it.
    unsafe {
        let verdict = swap_loop(&raw mut (*state).tat, len, now, limit);
        let (packets, bytes) = match verdict {
            Verdict::Pass => (
                &raw mut (*state).passed_packets,
                &raw mut (*state).passed_bytes,
            ),
            Verdict::Drop => (
                &raw mut (*state).dropped_packets,
                &raw mut (*state).dropped_bytes,
            ),
        };
        atomic::add(packets, 1);
        atomic::add(bytes, u64::from(len));
        verdict
    }
}

/// The bounded compare-and-swap loop: read the TAT, decide, publish the new TAT only if
/// nobody changed it meanwhile. A drop writes nothing.
#[inline(always)]
unsafe fn swap_loop(tat: *mut u64, len: u32, now: u64, limit: &Limit) -> Verdict {
    let mut old = unsafe { atomic::load(tat) };
    for _ in 0..CAS_RETRIES {
        let Some(new) = limit.admit(old, now, len) else {
            return Verdict::Drop;
        };
        match unsafe { atomic::compare_exchange(tat, old, new) } {
            Ok(()) => return Verdict::Pass,
            Err(found) => old = found,
        }
    }
    bump(|c| c.cas_exhausted += 1);
    Verdict::Drop
}

enum Created {
    Done(Verdict),
    /// Another CPU created the cell first.
    Raced,
    Failed,
}

/// First frame of a key: decide against an idle cell and insert the result.
#[inline(always)]
fn create<K>(
    map: &LruHashMap<K, SourceState>,
    key: &K,
    len: u32,
    now: u64,
    limit: &Limit,
) -> Created {
    let len64 = u64::from(len);
    let (verdict, state) = match limit.admit(now, now, len) {
        Some(tat) => (
            Verdict::Pass,
            SourceState {
                tat,
                passed_packets: 1,
                passed_bytes: len64,
                ..SourceState::default()
            },
        ),
        // Only a frame larger than the burst is dropped by an idle cell.
        None => (
            Verdict::Drop,
            SourceState {
                tat: now,
                dropped_packets: 1,
                dropped_bytes: len64,
                ..SourceState::default()
            },
        ),
    };
    match map.insert(key, state, BPF_NOEXIST) {
        Ok(()) => {
            bump(|c| c.new_sources += 1);
            Created::Done(verdict)
        }
        Err(e) if e == -EEXIST => Created::Raced,
        Err(_) => Created::Failed,
    }
}

#[inline(always)]
fn untracked() -> Verdict {
    bump(|c| c.untracked_packets += 1);
    Verdict::Pass
}
