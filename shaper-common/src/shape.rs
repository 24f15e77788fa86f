//! Shaping arithmetic ([`crate::maps::MODE_SHAPE`]): how long a packet is held back, and
//! the log2 histogram of those delays that the counters keep.
//!
//! A shaped cell is metered by the same GCRA as a policed one, with the burst tolerance
//! stretched by the horizon: a packet conforms if it can leave within the horizon. Its
//! cell is charged as usual (`new_tat = max(tat, now) + cost`), and it may leave once the
//! cell is no more than τ ahead of the clock: at `new_tat − τ`. The delay it is given is
//! therefore `new_tat − now − τ` (zero if that is negative), and since every packet is
//! charged, the long-run rate is exactly the configured one.

/// How many buckets the delay histogram has ([`crate::maps::Counters::shape_delay`]).
pub const DELAY_BUCKETS: usize = 20;
/// log2 of the nanoseconds below which a delay falls in bucket 0 (1.024 µs).
pub const DELAY_BUCKET0_SHIFT: u32 = 10;

/// The delay, in ticks, of a packet whose charge left its cell at `new_tat` at `now`,
/// under a burst tolerance of `tau` ticks: how far past τ the cell is ahead of the clock.
#[inline(always)]
pub fn delay_ticks(new_tat: u64, now: u64, tau: u64) -> u64 {
    let ahead = new_tat.wrapping_sub(now);
    // Read as signed: a TAT behind the clock holds nothing back.
    if ahead as i64 <= tau as i64 {
        0
    } else {
        ahead - tau
    }
}

/// The number of significant bits of `x` (0 for 0), without branches: the bits below the
/// highest are smeared into ones and counted.
#[inline(always)]
pub fn bit_length(x: u64) -> u32 {
    let mut x = x;
    x |= x >> 1;
    x |= x >> 2;
    x |= x >> 4;
    x |= x >> 8;
    x |= x >> 16;
    x |= x >> 32;
    x.count_ones()
}

/// The histogram bucket of a delay of `ns` nanoseconds: 0 below 2^10 ns (1 µs), then
/// bucket `k` for `[2^(k+9), 2^(k+10))` ns, the last taking everything from 2^28 ns
/// (268 ms) up.
#[inline(always)]
pub fn delay_bucket(ns: u64) -> usize {
    let b = bit_length(ns >> DELAY_BUCKET0_SHIFT) as usize;
    if b >= DELAY_BUCKETS {
        DELAY_BUCKETS - 1
    } else {
        b
    }
}

/// The delays bucket `k` holds, in nanoseconds: from, and up to (excluded; `None` for
/// the last bucket, which has no upper bound).
pub fn bucket_bounds_ns(k: usize) -> (u64, Option<u64>) {
    let from = if k == 0 {
        0
    } else {
        1 << (k as u32 + DELAY_BUCKET0_SHIFT - 1)
    };
    let to = (k + 1 < DELAY_BUCKETS).then(|| 1 << (k as u32 + DELAY_BUCKET0_SHIFT));
    (from, to)
}

/// The `q`-th percentile (0..=100) of the delays a histogram counted, as the upper bound
/// of the bucket it falls in (so at most twice the true value, never below it); the last
/// bucket, unbounded, reports its lower bound. `None` when nothing was counted.
pub fn percentile_ns(hist: &[u64; DELAY_BUCKETS], q: u32) -> Option<u64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    // The rank of the percentile, 1-based, rounded up: the smallest count of packets
    // that holds at least q% of them.
    let rank = (u128::from(total) * u128::from(q.min(100)))
        .div_ceil(100)
        .max(1) as u64;
    let mut seen = 0;
    for (k, &n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let (from, to) = bucket_bounds_ns(k);
            return Some(to.unwrap_or(from));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    #[cfg(feature = "user")]
    use crate::gcra::{Limit, TICKS_PER_SEC};

    /// Offers `offered_bps` of 1500-byte packets for one second to a cell shaped to
    /// `rate_bps` with a burst of `burst`, `horizon` ticks: the departure time of each
    /// packet passed (ticks), and how many were dropped.
    #[cfg(feature = "user")]
    fn shape(rate_bps: u64, burst: u64, offered_bps: u64, horizon: u64) -> (Vec<u64>, u64) {
        let limit = Limit::new(rate_bps, burst).unwrap();
        let gap = 1500 * 8 * TICKS_PER_SEC / offered_bps;
        let start = 1u64 << 40;
        let (mut tat, mut departures, mut dropped) = (0u64, Vec::new(), 0);
        for i in 0..offered_bps / (1500 * 8) {
            let now = start + i * gap;
            match limit.admit_within(tat, now, 1500, horizon) {
                Some(new_tat) => {
                    tat = new_tat;
                    let delay = delay_ticks(new_tat, now, limit.tau_ticks);
                    assert!(delay <= horizon, "packet {i} held {delay} ticks");
                    departures.push(now + delay);
                }
                None => dropped += 1,
            }
        }
        (departures, dropped)
    }

    #[cfg(feature = "user")]
    #[test]
    fn shaped_packets_leave_at_the_rate_and_none_beyond_the_horizon() {
        let ms = TICKS_PER_SEC / 1000;
        // 1.25× the rate for a second: 250 ms of excess, far beyond a 50 ms horizon.
        let (rate, burst) = (8_000_000u64, 15_000u64);
        let (departures, dropped) = shape(rate, burst, 10_000_000, 50 * ms);
        assert!(dropped > 0);
        // Once the burst is spent (the 10 packets it holds gain 0.3 ms each on the cell
        // per 1.2 ms gap: 50 packets), departures are spaced by one packet's time at the
        // rate (1.5 ms), never closer (to within the dithered tick).
        let spacing = 1500 * 8 * TICKS_PER_SEC / rate;
        for pair in departures[50..].windows(2) {
            assert!(pair[1] - pair[0] + 1 >= spacing, "{pair:?}");
        }
        // Sent = rate × time + burst, to within one packet.
        let span = departures.last().unwrap() - departures[0];
        let sent = departures.len() as u64 * 1500;
        let allowed = (rate / 8) * span / TICKS_PER_SEC + burst + 1500;
        assert!(
            sent <= allowed && sent + 3000 >= allowed,
            "{sent} vs {allowed}"
        );
        // Under the rate nothing is held back.
        let (departures, dropped) = shape(rate, burst, 4_000_000, 50 * ms);
        assert_eq!(dropped, 0);
        let gap = 1500 * 8 * TICKS_PER_SEC / 4_000_000;
        assert!(departures.windows(2).all(|p| p[1] - p[0] == gap));
        // No horizon: shaping is policing.
        let policed = shape(rate, burst, 10_000_000, 0);
        let gap = 1500 * 8 * TICKS_PER_SEC / 10_000_000;
        assert!(policed.0.windows(2).all(|p| p[1] - p[0] >= gap));
    }

    #[test]
    fn bit_length_matches_the_leading_zeros() {
        for x in [
            0u64,
            1,
            2,
            3,
            4,
            1023,
            1024,
            1 << 40,
            u64::MAX,
            (1 << 63) + 5,
        ] {
            assert_eq!(bit_length(x), 64 - x.leading_zeros(), "{x}");
        }
    }

    #[test]
    fn delays_fall_in_their_buckets() {
        assert_eq!(delay_bucket(0), 0);
        assert_eq!(delay_bucket(1023), 0);
        assert_eq!(delay_bucket(1024), 1);
        assert_eq!(delay_bucket(2047), 1);
        assert_eq!(delay_bucket(2048), 2);
        // 5 ms (the default ECN threshold) and 50 ms (the default horizon).
        assert_eq!(delay_bucket(5_000_000), 13);
        assert_eq!(delay_bucket(50_000_000), 16);
        assert_eq!(delay_bucket(1 << 28), DELAY_BUCKETS - 1);
        assert_eq!(delay_bucket(u64::MAX), DELAY_BUCKETS - 1);
        for k in 0..DELAY_BUCKETS {
            let (from, to) = bucket_bounds_ns(k);
            assert_eq!(delay_bucket(from), k);
            if let Some(to) = to {
                assert_eq!(delay_bucket(to - 1), k);
                assert_eq!(delay_bucket(to), k + 1);
            }
        }
    }

    #[test]
    fn percentiles_are_bucket_upper_bounds() {
        let mut h = [0u64; DELAY_BUCKETS];
        assert_eq!(percentile_ns(&h, 50), None);
        h[3] = 90; // [4096, 8192) ns
        h[13] = 9; // [4.19, 8.39) ms
        h[DELAY_BUCKETS - 1] = 1;
        assert_eq!(percentile_ns(&h, 0), Some(8192));
        assert_eq!(percentile_ns(&h, 50), Some(8192));
        assert_eq!(percentile_ns(&h, 90), Some(8192));
        assert_eq!(percentile_ns(&h, 91), Some(1 << 23));
        assert_eq!(percentile_ns(&h, 99), Some(1 << 23));
        assert_eq!(percentile_ns(&h, 100), Some(1 << 28));
    }

    #[test]
    fn the_delay_is_what_the_cell_is_ahead_beyond_tau() {
        let (now, tau) = (1_000_000u64, 5_000u64);
        assert_eq!(delay_ticks(now + 4_000, now, tau), 0);
        assert_eq!(delay_ticks(now + 5_000, now, tau), 0);
        assert_eq!(delay_ticks(now + 7_500, now, tau), 2_500);
        // A cell behind the clock (idle) holds nothing back.
        assert_eq!(delay_ticks(now - 10, now, tau), 0);
        // Across the wrap of the clock.
        assert_eq!(
            delay_ticks(9_000u64.wrapping_sub(1), u64::MAX - 1_000, tau),
            5_000
        );
    }
}
