//! Exact limiters, replayed on a run's recorded send times: what a limiter of each kind
//! would deliver if it did exactly what it is configured to do, frame by frame. A row's
//! delivery set against its exact limiter's says how far the limiter is from exact; the
//! exact limiter's against rate × time + burst says how far exact itself is from that
//! (whole frames against bytes, a queue's backlog).
//!
//! - [`policer`]: GCRA, the policers' model (shaper, nft, hashlimit): a frame passes when
//!   the theoretical arrival time is at most burst ÷ rate ahead of it, or is dropped.
//! - [`shaper`]: a token bucket of `burst` bytes filling at `rate` with a FIFO of `queue`
//!   bytes in front of it, the queueing limiters' model (tbf, each htb class): a frame that
//!   finds the queue full is dropped; every other frame leaves once the bucket holds its
//!   bytes, after the frames before it.

use std::collections::VecDeque;

/// An exact policer at `rate` bytes/s and `burst` bytes on frames of `frame` bytes sent at
/// `times_ns`. Returns the frames it drops and the smallest burst with which it would drop
/// none (the most the sends ever ran ahead of the rate).
pub fn policer(times_ns: &[u64], frame: f64, rate: f64, burst: f64) -> (u64, f64) {
    let cost = frame / rate; // seconds a frame takes at the rate
    let tolerance = burst / rate;
    let mut tat = 0.0f64;
    let mut dropped = 0;
    // For the burst needed: every frame passes; how far the TAT runs ahead, in bytes.
    let mut tat_all = 0.0f64;
    let mut ahead_max = 0.0f64;
    for &ns in times_ns {
        let t = ns as f64 / 1e9;
        let start = tat.max(t);
        if start + cost - t <= tolerance + 1e-12 {
            tat = start + cost;
        } else {
            dropped += 1;
        }
        tat_all = tat_all.max(t) + cost;
        ahead_max = ahead_max.max((tat_all - t) * rate);
    }
    (dropped, ahead_max)
}

/// An exact queueing shaper (see the module docs) at `rate` bytes/s, a bucket of `burst`
/// bytes (full at the start) and a queue of `queue` bytes, on frames of `frame` bytes sent
/// at `times_ns` (in order). Returns the frames it delivers: all it queues, since a run's
/// drain outlasts any queue here.
pub fn shaper(times_ns: &[u64], frame: f64, rate: f64, burst: f64, queue: f64) -> u64 {
    let mut tokens = burst;
    // When `tokens` was counted, which is when the last frame left.
    let mut last = 0.0f64;
    // Departure times of the frames queued and not yet gone.
    let mut queued: VecDeque<f64> = VecDeque::new();
    let mut delivered = 0;
    for &ns in times_ns {
        let t = ns as f64 / 1e9;
        while queued.front().is_some_and(|&d| d <= t) {
            queued.pop_front();
        }
        if (queued.len() + 1) as f64 * frame > queue {
            continue;
        }
        let start = t.max(last);
        let have = (tokens + rate * (start - last)).min(burst);
        let (depart, left) = if have >= frame {
            (start, have - frame)
        } else {
            (start + (frame - have) / rate, 0.0)
        };
        tokens = left;
        last = depart;
        queued.push_back(depart);
        delivered += 1;
    }
    delivered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policer_passes_paced_frames_and_drops_a_clump() {
        // 1000-byte frames at exactly 1 MB/s: nothing dropped, one frame of burst needed.
        let paced: Vec<u64> = (0..1000).map(|i| i * 1_000_000).collect();
        let (dropped, need) = policer(&paced, 1000.0, 1e6, 4000.0);
        assert_eq!(dropped, 0);
        assert!((need - 1000.0).abs() < 1e-6, "{need}");
        // The same frames, ten at a time every 10 ms: a 4000-byte burst passes 4 of each
        // 10 at once plus what the 10 ms refill (10 frames) allows... the clump of 10 needs
        // a 10-frame burst.
        let clumped: Vec<u64> = (0..1000).map(|i| (i / 10) * 10_000_000).collect();
        let (dropped, need) = policer(&clumped, 1000.0, 1e6, 4000.0);
        assert!(dropped > 0);
        assert!((need - 10_000.0).abs() < 1e-6, "{need}");
        let (dropped, _) = policer(&clumped, 1000.0, 1e6, 10_000.0);
        assert_eq!(dropped, 0);
    }

    #[test]
    fn the_shaper_queues_what_the_bucket_cannot_take_and_drops_beyond_its_queue() {
        // 1000-byte frames at 2 MB/s for 1 s against 1 MB/s, a 4000-byte bucket: with a
        // queue of 10 frames, the bucket's 4 leave at once, then one a millisecond; the
        // queue fills after about 20 ms and from then on one frame in two is dropped.
        let times: Vec<u64> = (0..2000).map(|i| i * 500_000).collect();
        let delivered = shaper(&times, 1000.0, 1e6, 4000.0, 10_000.0);
        // What the rate lets through in the 1 s of sending, plus the bucket, plus the
        // queue's backlog left at the end (it drains after): 1000 + 4 + 10, within a frame.
        assert!((1012..=1015).contains(&delivered), "{delivered}");
        // No queue beyond one frame: a policer with a bucket of 4 frames, exactly.
        let (dropped, _) = policer(&times, 1000.0, 1e6, 4000.0);
        let delivered = shaper(&times, 1000.0, 1e6, 4000.0, 1000.0);
        assert!(
            delivered.abs_diff(2000 - dropped) <= 1,
            "{delivered} against {}",
            2000 - dropped
        );
        // Under the rate: everything.
        let slow: Vec<u64> = (0..100).map(|i| i * 2_000_000).collect();
        assert_eq!(shaper(&slow, 1000.0, 1e6, 4000.0, 1000.0), 100);
    }
}
