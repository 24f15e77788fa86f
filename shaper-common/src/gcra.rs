//! GCRA, the leaky bucket as a meter, charged in bytes.
//!
//! One cell per key holds a single 64-bit *theoretical arrival time* (TAT): the time at
//! which the bucket would be empty again if nothing else arrived. A packet of `len`
//! bytes costs `len × T` where `T` is the time one byte takes at the configured rate.
//! It conforms when, after adding its cost, the bucket is no more than `τ` ahead of now,
//! where `τ` is the cost of `burst` bytes:
//!
//! ```text
//! new_tat = max(tat, now) + cost
//! conform  ⇔  new_tat − now ≤ τ        (then store new_tat; otherwise leave tat alone)
//! ```
//!
//! From idle, exactly `burst` bytes pass at once; after that, `rate` bytes per second.
//! A packet larger than `burst` costs more than `τ` and never conforms: it is dropped.
//!
//! # Units
//! Time is counted in *ticks* of 1/64 ns (`now_ticks = ns << 6`). Sub-nanosecond ticks
//! are needed at high rates: at 100 Gbit/s a 64-byte frame lasts 5.12 ns, so charging
//! whole nanoseconds would be off by up to 20% per packet.
//!
//! The time one byte takes is a 32.32 fixed-point number of ticks ([`Limit`]), so the
//! rate itself is exact to about 1 part in 10^10 across 8 bit/s … 100 Tbit/s.
//!
//! A packet's cost is a whole number of ticks plus a remainder below one tick. Rounding
//! the remainder the same way every time would bias every packet alike (0.32 tick per
//! 64-byte frame at 100 Gbit/s: 16 frames too few out of a 1 MiB burst), so the
//! remainder is rounded up with a probability equal to its size (*dithering*). The
//! expected cost is then exact and rounding errors grow only as √n instead of n. The
//! dither comes from a hash of (tat, now): it needs no helper call and no extra state,
//! and it is deterministic for a given history, so tests can replay it.
//!
//! # Wrapping
//! A u64 of ticks wraps after 2^58 ns ≈ 9.1 years of uptime. All comparisons are wrapping
//! differences read as signed, so the wrap itself is harmless. A TAT that is ahead of now
//! by more than [`STALE_AHEAD_TICKS`] cannot have been produced by any valid limit (τ is
//! capped at [`MAX_TAU_TICKS`]): it is a cell idle for longer than half the wrap period,
//! and is treated as idle.

/// log2 of ticks per nanosecond.
pub const TICK_SHIFT: u32 = 6;
/// Ticks per second: 64 × 10^9.
pub const TICKS_PER_SEC: u64 = 1_000_000_000 << TICK_SHIFT;

/// Slowest supported rate: one byte per second.
pub const MIN_RATE_BPS: u64 = 8;
/// Fastest supported rate: 100 Tbit/s.
pub const MAX_RATE_BPS: u64 = 100_000_000_000_000;
/// Frames are charged at most this many bytes; it bounds `len × ticks_per_byte` below
/// 2^64 at the slowest rate (2^18 × 2^36 < 2^55).
pub const MAX_FRAME_BYTES: u32 = 1 << 18;
/// Largest burst tolerance a limit may have: 2^60 ticks ≈ 208 days of traffic at the rate.
pub const MAX_TAU_TICKS: u64 = 1 << 60;
/// A TAT further ahead of now than this is stale (see the module docs), never a full bucket.
pub const STALE_AHEAD_TICKS: u64 = 1 << 62;

/// A byte rate and burst, in the form the per-packet path needs: the time one byte takes,
/// in 32.32 fixed-point ticks, and τ, the cost of `burst` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limit {
    /// Whole ticks per byte.
    pub byte_ticks: u64,
    /// Fraction of a tick per byte, in units of 2^-32 tick.
    pub byte_ticks_frac: u32,
    pub _pad: u32,
    /// Burst tolerance τ in ticks: the cost of `burst` bytes, rounded up.
    pub tau_ticks: u64,
}

const _: () = assert!(size_of::<Limit>() == 24);

impl Limit {
    /// Cost of a frame of `len` bytes, in ticks: the whole ticks, plus one more when the
    /// sub-tick remainder exceeds `dither` (so with a uniform `dither` the expected cost is
    /// exact).
    ///
    /// `len` is clamped to [`MAX_FRAME_BYTES`], which keeps every product below 2^64 for
    /// any rate in range; no u128 arithmetic, so this compiles for BPF.
    #[inline(always)]
    pub fn cost(&self, len: u32, dither: u32) -> u64 {
        let len = if len > MAX_FRAME_BYTES {
            MAX_FRAME_BYTES
        } else {
            len
        } as u64;
        let frac = len * self.byte_ticks_frac as u64;
        let round_up = (frac as u32 > dither) as u64;
        len * self.byte_ticks + (frac >> 32) + round_up
    }

    /// The GCRA decision for a frame of `len` bytes arriving at `now` (ticks) on a cell
    /// whose TAT is `tat`: `Some(new_tat)` to pass it and store `new_tat`, `None` to drop
    /// it and leave the cell alone.
    #[inline(always)]
    pub fn admit(&self, tat: u64, now: u64, len: u32) -> Option<u64> {
        conform(tat, now, self.cost(len, dither(tat, now)), self.tau_ticks)
    }

    /// [`Limit::admit`] with the burst tolerance stretched by `slack` ticks: shaping
    /// passes a packet that can leave within `slack` (its horizon, see [`crate::shape`]);
    /// policing passes 0.
    #[inline(always)]
    pub fn admit_within(&self, tat: u64, now: u64, len: u32, slack: u64) -> Option<u64> {
        conform(
            tat,
            now,
            self.cost(len, dither(tat, now)),
            self.tau_ticks.wrapping_add(slack),
        )
    }
}

/// A well-spread 32-bit value from the cell's history: splitmix64's finalizer of
/// `tat ^ now`. A bare multiplicative hash is not enough: successive TATs differ by the
/// previous cost, which makes its output a Weyl sequence whose step depends on the last
/// rounding, and that feedback biases the rounding.
#[inline(always)]
pub fn dither(tat: u64, now: u64) -> u32 {
    let mut x = tat ^ now;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as u32
}

/// Converts a clock reading in nanoseconds (`bpf_ktime_get_ns`, CLOCK_MONOTONIC) to ticks.
#[inline(always)]
pub const fn ticks_from_ns(ns: u64) -> u64 {
    ns << TICK_SHIFT
}

/// Whether a cell with TAT `tat` is empty at `now`: the TAT is behind now (signed
/// negative: idle), or further ahead than [`STALE_AHEAD_TICKS`] (stale, see the module
/// docs).
#[inline(always)]
pub fn drained(tat: u64, now: u64) -> bool {
    let ahead = tat.wrapping_sub(now);
    ahead as i64 <= 0 || ahead > STALE_AHEAD_TICKS
}

/// The time a packet's cost is added to: the TAT, or now if the cell is [`drained`].
#[inline(always)]
pub fn base(tat: u64, now: u64) -> u64 {
    if drained(tat, now) { now } else { tat }
}

/// The GCRA decision for one packet.
///
/// Returns the cell's new TAT when the packet conforms (the caller stores it, with a
/// compare-and-swap against `tat`), `None` when it must be dropped (the cell is not
/// charged). Never overflows or traps: every step is a wrapping operation whose
/// operands are bounded as the module docs explain.
#[inline(always)]
pub fn conform(tat: u64, now: u64, cost: u64, tau: u64) -> Option<u64> {
    let new_tat = base(tat, now).wrapping_add(cost);
    if new_tat.wrapping_sub(now) <= tau {
        Some(new_tat)
    } else {
        None
    }
}

/// Why a rate and burst cannot form a [`Limit`].
#[cfg(feature = "user")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitError {
    RateTooLow,
    RateTooHigh,
    BurstZero,
    /// The burst lasts longer at this rate than [`MAX_TAU_TICKS`] allows.
    BurstTooLong,
}

#[cfg(feature = "user")]
impl LimitError {
    /// Which of the two values asked for is wrong: `"rate"` or `"burst"`.
    pub fn field(self) -> &'static str {
        match self {
            Self::RateTooLow | Self::RateTooHigh => "rate",
            Self::BurstZero | Self::BurstTooLong => "burst",
        }
    }
}

#[cfg(feature = "user")]
impl core::fmt::Display for LimitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::RateTooLow => "rate is below the minimum of 8bit (one byte per second)",
            Self::RateTooHigh => "rate is above the maximum of 100tbit",
            Self::BurstZero => "burst must be greater than zero",
            Self::BurstTooLong => "burst lasts more than 208 days at this rate",
        })
    }
}

#[cfg(feature = "user")]
impl Limit {
    /// The limit for `rate_bps` bits per second and `burst_bytes` bytes.
    pub fn new(rate_bps: u64, burst_bytes: u64) -> Result<Self, LimitError> {
        if rate_bps < MIN_RATE_BPS {
            return Err(LimitError::RateTooLow);
        }
        if rate_bps > MAX_RATE_BPS {
            return Err(LimitError::RateTooHigh);
        }
        if burst_bytes == 0 {
            return Err(LimitError::BurstZero);
        }
        // ticks per byte = 8 × TICKS_PER_SEC / rate_bps, as 32.32 fixed point, rounded.
        let num = 8 * u128::from(TICKS_PER_SEC);
        let rate = u128::from(rate_bps);
        let fixed = ((num << 32) + rate / 2) / rate;
        let mut limit = Self {
            byte_ticks: (fixed >> 32) as u64,
            byte_ticks_frac: fixed as u32,
            _pad: 0,
            tau_ticks: 0,
        };
        // τ is the cost of `burst` bytes rounded up, the most a `burst`-byte packet can be
        // charged, so a single packet of exactly `burst` bytes always conforms from idle.
        let tau = u128::from(burst_bytes) * u128::from(limit.byte_ticks)
            + (u128::from(burst_bytes) * u128::from(limit.byte_ticks_frac)).div_ceil(1 << 32);
        if tau > u128::from(MAX_TAU_TICKS) {
            return Err(LimitError::BurstTooLong);
        }
        limit.tau_ticks = tau as u64;
        Ok(limit)
    }
}

#[cfg(all(test, feature = "user"))]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    const NS: u64 = 1 << TICK_SHIFT;
    const SEC: u64 = TICKS_PER_SEC;

    /// Offers `offered_bps` of `len`-byte frames, evenly spaced at exact (not rounded)
    /// arrival times, for `duration` ticks starting at `start`, against an idle cell;
    /// returns the bytes that conformed.
    fn run(limit: &Limit, start: u64, offered_bps: u64, len: u32, duration: u64) -> u64 {
        let bits = u128::from(len) * 8;
        let packets = u128::from(offered_bps) * u128::from(duration) / (bits * u128::from(SEC));
        let mut tat = start;
        let mut passed = 0u64;
        for i in 0..packets {
            let offset = i * bits * u128::from(SEC) / u128::from(offered_bps);
            let now = start.wrapping_add(offset as u64);
            if let Some(t) = limit.admit(tat, now, len) {
                tat = t;
                passed += u64::from(len);
            }
        }
        passed
    }

    #[test]
    fn long_run_rate_within_half_a_percent() {
        let rates = [
            8_000,
            64_000,
            1_000_000,
            10_000_000,
            100_000_000,
            1_000_000_000,
            10_000_000_000,
            40_000_000_000,
            100_000_000_000,
        ];
        for rate in rates {
            for len in [64u32, 512, 1500, 9000] {
                for overload in [2u64, 10] {
                    let burst = 16 * u64::from(len);
                    let limit = Limit::new(rate, burst).unwrap();
                    // Long enough for 20 000 conforming packets: one packet is 0.005%.
                    let duration =
                        (20_000 * 8 * u128::from(len) * u128::from(SEC) / u128::from(rate)) as u64;
                    let passed = run(&limit, 5 * SEC, rate * overload, len, duration);
                    let at_rate = u128::from(rate) * u128::from(duration) / (8 * u128::from(SEC));
                    let expected = at_rate as u64 + burst;
                    let err = (passed as f64 - expected as f64) / at_rate as f64;
                    assert!(
                        err.abs() < 0.005,
                        "rate {rate} len {len} overload {overload}: passed {passed} expected {expected} ({:.4}%)",
                        err * 100.0
                    );
                }
            }
        }
    }

    /// Dithering: the sub-tick remainder of each frame's cost is rounded up with a
    /// probability equal to its size, so over many frames the ticks charged add up to the
    /// exact cost. Where the remainder is a large part of the cost (a 64-byte frame at 100
    /// Gbit/s costs 327.68 ticks), rounding it the same way every time would charge every
    /// frame 0.32 tick too many or 0.68 too few: 0.1% and 0.2% of the rate. Through
    /// `admit` (the per-packet path), a million conforming frames at twice the rate are
    /// charged their exact cost within 10 parts per million (the dither's own spread is
    /// about 1.5), and pass the rate within one frame and as much.
    #[test]
    fn dithering_charges_the_exact_cost_over_a_long_run() {
        const FRAMES: u64 = 1_000_000;
        // (rate, frame): 327.68, 819.2, 3276.8 and 10922.67 ticks a frame.
        for (rate, len) in [
            (100_000_000_000u64, 64u32),
            (40_000_000_000, 64),
            (10_000_000_000, 64),
            (3_000_000_000, 1000),
        ] {
            let limit = Limit::new(rate, 16 * u64::from(len)).unwrap();
            // The exact cost of a frame at the limit's own rate (its 32.32 ticks a byte),
            // so that only the rounding of each frame's cost is measured.
            let byte_ticks =
                limit.byte_ticks as f64 + f64::from(limit.byte_ticks_frac) / 2f64.powi(32);
            let frame_ticks = byte_ticks * f64::from(len);
            assert!(frame_ticks.fract() > 0.1, "{rate} {len}: nothing to round");
            // Frames at twice the rate, at exact (not rounded) times, from an idle cell.
            let start = 5 * SEC;
            let gap = frame_ticks / 2.0;
            let (mut tat, mut charged, mut passed) = (start, 0u64, 0u64);
            let mut i = 0u64;
            while passed < FRAMES {
                let now = start + (i as f64 * gap) as u64;
                i += 1;
                if let Some(new) = limit.admit(tat, now, len) {
                    charged += new - base(tat, now);
                    tat = new;
                    passed += 1;
                }
            }
            let exact = frame_ticks * FRAMES as f64;
            let err = (charged as f64 - exact) / exact;
            assert!(
                err.abs() < 1e-5,
                "rate {rate} len {len}: {charged} ticks charged for {exact:.0} ({:+.4}%)",
                err * 100.0
            );
            // And what passed is the burst and the rate over the time it took.
            let secs = (i - 1) as f64 * gap / SEC as f64;
            let at_rate = rate as f64 / 8.0 * secs + 16.0 * f64::from(len);
            let bytes = (passed * u64::from(len)) as f64;
            assert!(
                (bytes - at_rate).abs() <= f64::from(len) + 1e-5 * at_rate,
                "rate {rate} len {len}: passed {bytes} bytes, the rate gives {at_rate:.0}"
            );
        }
    }

    #[test]
    fn from_idle_exactly_burst_then_rate() {
        for (rate, burst, len) in [
            (10_000_000u64, 65_536u64, 1500u32),
            (8_000, 3_000, 64),
            (100_000_000_000, 1 << 20, 64),
            (1_000_000_000, 9_000, 9_000),
        ] {
            let limit = Limit::new(rate, burst).unwrap();
            let now = 1_000 * SEC;
            let mut tat = 0;
            let mut passed = 0u64;
            // A burst at one instant: everything that fits in `burst`, nothing more.
            while let Some(t) = limit.admit(tat, now, len) {
                tat = t;
                passed += u64::from(len);
                assert!(passed <= burst + u64::from(len), "runaway burst");
            }
            assert!(
                passed.abs_diff(burst) < u64::from(len),
                "rate {rate} burst {burst} len {len}: passed {passed} at once"
            );
            // Then the rate: the next packet conforms once the bucket has drained enough
            // for it, at tat + cost − τ, and not a tick earlier (cost is one of two values).
            let (floor, ceil) = (limit.cost(len, u32::MAX), limit.cost(len, 0));
            assert!(
                limit
                    .admit(tat, tat + floor - limit.tau_ticks - 1, len)
                    .is_none()
            );
            assert!(
                limit
                    .admit(tat, tat + ceil - limit.tau_ticks, len)
                    .is_some()
            );
        }
    }

    #[test]
    fn packet_larger_than_burst_is_dropped_even_when_idle() {
        for rate in [8_000, 10_000_000, 100_000_000_000] {
            let limit = Limit::new(rate, 1500).unwrap();
            for dither in [0, 1 << 31, u32::MAX] {
                let tau = limit.tau_ticks;
                assert!(conform(0, 10 * SEC, limit.cost(1500, dither), tau).is_some());
                assert!(conform(0, 10 * SEC, limit.cost(1501, dither), tau).is_none());
            }
        }
    }

    #[test]
    fn no_overflow_at_extremes() {
        let lens = [1u32, 64, 1500, 9000, 65_535, MAX_FRAME_BYTES, u32::MAX];
        let rates = [MIN_RATE_BPS, 8_000, 1_000_000_007, MAX_RATE_BPS];
        for rate in rates {
            // The largest burst allowed at this rate, and the smallest.
            let mut bursts = Vec::from([1u64]);
            let max_burst = (u128::from(MAX_TAU_TICKS) * u128::from(rate) / (8 * u128::from(SEC)))
                .min(u128::from(u64::MAX)) as u64;
            // A little under the cap: ticks per byte are rounded, so the cap itself may
            // round either way.
            bursts.push(max_burst - max_burst / 1000);
            for burst in bursts {
                let limit = Limit::new(rate, burst).unwrap();
                for len in lens {
                    // Clock readings: boot, days of idle, years of uptime, near wrap.
                    for now in [0u64, 3 * 86_400 * SEC, 400 * 86_400 * SEC, u64::MAX - 5] {
                        for tat in [
                            0,
                            now,
                            now.wrapping_sub(1),
                            now.wrapping_add(limit.tau_ticks),
                            now.wrapping_add(1 << 61),
                            u64::MAX,
                        ] {
                            // Whatever passes leaves the cell at most τ ahead of now.
                            if let Some(new) = limit.admit(tat, now, len) {
                                assert!(new.wrapping_sub(now) <= limit.tau_ticks);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn days_of_idle_refill_to_burst_not_beyond() {
        let limit = Limit::new(8_000_000, 10_000).unwrap();
        let mut tat = 0;
        let mut now = 7 * 86_400 * SEC; // a week after boot, first packet
        for _ in 0..10 {
            tat = limit.admit(tat, now, 1000).unwrap();
        }
        assert!(limit.admit(tat, now, 1000).is_none());
        now += 30 * 86_400 * SEC; // a month idle
        let mut passed = 0;
        while let Some(t) = limit.admit(tat, now, 1000) {
            tat = t;
            passed += 1;
        }
        assert_eq!(passed, 10);
    }

    #[test]
    fn clock_behind_stored_tat_is_a_full_bucket_not_a_wrap() {
        let limit = Limit::new(8_000_000, 10_000).unwrap();
        let cost = limit.cost(1000, 0); // 1 µs per byte: no remainder to dither
        let now = 50 * SEC;
        let tat = conform(0, now, cost, limit.tau_ticks).unwrap();
        // Another CPU's clock read slightly earlier than the one that set the TAT.
        let earlier = now - 3 * NS;
        let next = conform(tat, earlier, cost, limit.tau_ticks).unwrap();
        assert_eq!(next, tat + cost);
        // Far in the past relative to the TAT: bucket appears full, packet dropped.
        assert!(conform(tat, now - SEC, cost, limit.tau_ticks).is_none());
    }

    #[test]
    fn stale_cells_from_half_a_wrap_ago_are_idle() {
        let limit = Limit::new(8_000_000, 10_000).unwrap();
        let cost = limit.cost(1000, 0);
        let now = 3 * SEC;
        let stale = now.wrapping_add(STALE_AHEAD_TICKS + 1);
        assert_eq!(conform(stale, now, cost, limit.tau_ticks), Some(now + cost));
    }

    #[test]
    fn wrap_of_the_tick_counter_is_seamless() {
        let limit = Limit::new(8_000_000, 4_000).unwrap();
        // Straddle the wrap with a steady 2× overload and count what passes.
        let start = u64::MAX - SEC / 2;
        let passed = run(&limit, start, 16_000_000, 1000, 2 * SEC);
        let expected = 1_000_000 * 2 + 4_000;
        assert!((passed as i64 - expected as i64).unsigned_abs() <= 2 * 1000);
    }

    #[test]
    fn limit_validation() {
        assert_eq!(Limit::new(7, 1000), Err(LimitError::RateTooLow));
        assert_eq!(
            Limit::new(MAX_RATE_BPS + 1, 1000),
            Err(LimitError::RateTooHigh)
        );
        assert_eq!(Limit::new(8_000, 0), Err(LimitError::BurstZero));
        assert_eq!(Limit::new(8, u64::MAX), Err(LimitError::BurstTooLong));
        // 100 Gbit/s: 0.08 ns = 5.12 ticks per byte.
        let l = Limit::new(100_000_000_000, 1500).unwrap();
        assert_eq!(l.byte_ticks, 5);
        // 327.68 ticks: 327 or 328, 328 with probability 0.68.
        assert_eq!((l.cost(64, u32::MAX), l.cost(64, 0)), (327, 328));
        let mean = (0..10_000u64)
            .map(|i| l.cost(64, dither(i * 328, 7 * i)) as f64)
            .sum::<f64>()
            / 10_000.0;
        assert!((mean - 327.68).abs() < 0.02, "mean cost {mean}");
        // 8 kbit/s: 1 ms per byte.
        let l = Limit::new(8_000, 1500).unwrap();
        assert_eq!((l.byte_ticks, l.byte_ticks_frac), (64_000_000, 0));
        assert_eq!(l.tau_ticks, 1500 * 64_000_000);
    }
}
