//! Carrying a cell across a change of its limit without refilling it.
//!
//! A cell's TAT is ahead of now by its *backlog*: the bytes it has been charged and not yet
//! drained, times the time one byte takes. When the rate changes, tc and most token-bucket
//! libraries start the new bucket full of tokens, which hands every source a free burst on
//! each reload. Here the backlog in **bytes** is kept: ahead-of-now is multiplied by
//! `new ticks per byte / old ticks per byte`, rounded up, and capped at the new τ (a full
//! bucket at the new size). So lowering a rate leaves a saturated source saturated, raising
//! it lets the source drain faster from where it stood, and a smaller burst trims the
//! backlog to a full bucket of the new size.
//!
//! A cell records which limit its TAT is expressed in as that limit's [`Limit::scale`],
//! ticks per byte in 36.28 fixed point; a cell whose scale differs from its policy's is
//! rescaled before its next decision.

use crate::gcra::{Limit, drained};

/// Fractional bits of [`Limit::scale`]. 36 integer bits hold the slowest rate's 64·10⁹
/// ticks per byte (8 bit/s), and 28 fractional bits resolve the fastest rate's 0.005 ticks
/// per byte (100 Tbit/s) to better than one part in a million.
const SCALE_FRAC_BITS: u32 = 28;

impl Limit {
    /// Ticks per byte in 36.28 fixed point: what a cell records to know which limit its
    /// TAT is expressed in. Never zero for a valid limit, so zero can mean "none yet".
    #[inline(always)]
    pub fn scale(&self) -> u64 {
        (self.byte_ticks << SCALE_FRAC_BITS)
            | u64::from(self.byte_ticks_frac >> (32 - SCALE_FRAC_BITS))
    }

    /// `tat`, charged under the limit of scale `from`, re-expressed under this limit at
    /// `now`: the backlog in bytes kept (rounded up, never down), capped at this limit's τ.
    /// An idle or stale cell, or `from == 0` (a cell never charged), is returned as it is.
    #[inline(always)]
    pub fn rescale(&self, tat: u64, now: u64, from: u64) -> u64 {
        let to = self.scale();
        if from == 0 || from == to || drained(tat, now) {
            return tat;
        }
        let scaled = mul_div_up(tat.wrapping_sub(now), to, from);
        now.wrapping_add(if scaled > self.tau_ticks {
            self.tau_ticks
        } else {
            scaled
        })
    }
}

/// `a × b / c`, rounded up, to within one part in 2²⁶ (1.5·10⁻⁸), with 64-bit operations
/// only (BPF has no 128-bit multiply or divide). Unless `a × b` fits in 64 bits, the
/// numerators are cut to their top significant bits, rounded up (a short one whole, the
/// other to what still fits; two long ones to 31 and 32 bits); the divisor is cut to its
/// top 32, rounded down; so the result is never below the exact quotient. Saturates at
/// `u64::MAX`, which is also what a zero `c` gives.
#[inline(always)]
pub fn mul_div_up(a: u64, b: u64, c: u64) -> u64 {
    if c == 0 {
        return u64::MAX;
    }
    let (la, lb) = (64 - a.leading_zeros(), 64 - b.leading_zeros());
    // Bits kept of each; the total stays at most 63 so rounding up cannot overflow.
    let (ka, kb) = if la + lb <= 64 {
        (la, lb)
    } else if la <= 31 {
        (la, 63 - la)
    } else if lb <= 31 {
        (63 - lb, lb)
    } else {
        (31, 32)
    };
    let (am, ae) = top_bits_up(a, ka);
    let (bm, be) = top_bits_up(b, kb);
    let (cm, ce) = top_bits_down(c, 32);
    // am × bm < 2^64 by the choice of bits; cm ≥ 1 since c ≥ 1.
    let q = (am * bm).div_ceil(cm);
    let shift = (ae + be) as i32 - ce as i32;
    if shift >= 0 {
        let shift = shift as u32;
        if shift >= 64 || q.leading_zeros() < shift {
            u64::MAX
        } else {
            q << shift
        }
    } else {
        let shift = (-shift) as u32;
        if shift >= 64 {
            (q != 0) as u64
        } else {
            // The shift is negative only when c was cut, so cm ≥ 2^31 and q < 2^33.
            (q + (1 << shift) - 1) >> shift
        }
    }
}

/// `(m, e)` with `x ≤ m << e` and `m ≤ 2^bits`: the top `bits` bits of `x`, rounded up.
#[inline(always)]
fn top_bits_up(x: u64, bits: u32) -> (u64, u32) {
    let len = 64 - x.leading_zeros();
    if len <= bits {
        return (x, 0);
    }
    let e = len - bits;
    let lost = x & ((1 << e) - 1);
    ((x >> e) + (lost != 0) as u64, e)
}

/// `(m, e)` with `x ≥ m << e` and `m < 2^bits`: the top `bits` bits of `x`, rounded down.
#[inline(always)]
fn top_bits_down(x: u64, bits: u32) -> (u64, u32) {
    let len = 64 - x.leading_zeros();
    if len <= bits {
        return (x, 0);
    }
    let e = len - bits;
    (x >> e, e)
}

#[cfg(all(test, feature = "user"))]
mod tests {
    use super::*;
    use crate::gcra::{MAX_RATE_BPS, MIN_RATE_BPS, STALE_AHEAD_TICKS, TICKS_PER_SEC};

    fn exact(a: u64, b: u64, c: u64) -> u128 {
        (u128::from(a) * u128::from(b)).div_ceil(u128::from(c))
    }

    #[test]
    fn mul_div_up_is_never_below_and_close_above() {
        let values = [
            1u64,
            2,
            3,
            7,
            1000,
            (1 << 31) - 1,
            1 << 31,
            (1 << 32) + 1,
            123_456_789_012,
            1 << 40,
            (1 << 52) + 12_345,
            1 << 60,
            (1 << 62) - 1,
            u64::MAX / 3,
        ];
        for a in values {
            for b in values {
                for c in values {
                    let got = mul_div_up(a, b, c);
                    let want = exact(a, b, c);
                    if want > u128::from(u64::MAX) {
                        assert_eq!(got, u64::MAX, "{a}×{b}/{c}");
                        continue;
                    }
                    assert!(u128::from(got) >= want, "{a}×{b}/{c}: {got} below {want}");
                    // Within 2^-26 relative, or one unit.
                    let slack = (want >> 26) + 1;
                    assert!(
                        u128::from(got) <= want + slack,
                        "{a}×{b}/{c}: {got} too far above {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn scale_is_ticks_per_byte() {
        let l = Limit::new(8_000, 1500).unwrap(); // 1 ms per byte
        assert_eq!(l.scale(), 64_000_000 << SCALE_FRAC_BITS);
        // Every rate in range has a distinct, non-zero scale that fits.
        let slowest = Limit::new(MIN_RATE_BPS, 1).unwrap().scale();
        let fastest = Limit::new(MAX_RATE_BPS, 1 << 20).unwrap().scale();
        assert!(fastest > 0 && slowest > fastest);
        assert_ne!(
            Limit::new(10_000_000, 1500).unwrap().scale(),
            Limit::new(10_000_001, 1500).unwrap().scale()
        );
    }

    /// The backlog in bytes a cell holds at `now`, under `limit`.
    fn backlog_bytes(limit: &Limit, tat: u64, now: u64) -> f64 {
        let ahead = tat.wrapping_sub(now) as i64;
        if ahead <= 0 {
            return 0.0;
        }
        ahead as f64 / (limit.byte_ticks as f64 + limit.byte_ticks_frac as f64 / 2f64.powi(32))
    }

    #[test]
    fn a_rate_change_keeps_the_backlog_in_bytes() {
        let now = 1_000 * TICKS_PER_SEC;
        for (from_bps, to_bps) in [
            (10_000_000u64, 2_000_000u64),
            (2_000_000, 10_000_000),
            (1_000_000_000, 8_000),
            (8_000, 100_000_000_000),
            (MAX_RATE_BPS, MIN_RATE_BPS),
        ] {
            let burst = 1 << 20;
            let old = Limit::new(from_bps, burst).unwrap();
            let new = Limit::new(to_bps, burst).unwrap();
            // Half a bucket of backlog.
            let tat = now + old.tau_ticks / 2;
            let moved = new.rescale(tat, now, old.scale());
            let before = backlog_bytes(&old, tat, now);
            let after = backlog_bytes(&new, moved, now);
            assert!(
                after >= before - 1e-6 && after <= before * (1.0 + 1e-6) + 1.0,
                "{from_bps} → {to_bps}: {before} bytes became {after}"
            );
        }
    }

    #[test]
    fn a_full_bucket_stays_full_and_is_capped_at_the_new_burst() {
        let now = 77 * TICKS_PER_SEC;
        let old = Limit::new(10_000_000, 65_536).unwrap();
        let full = now + old.tau_ticks;
        // Lower rate, same burst: still exactly full, so no packet passes.
        let slower = Limit::new(2_000_000, 65_536).unwrap();
        let tat = slower.rescale(full, now, old.scale());
        assert_eq!(tat, now + slower.tau_ticks);
        assert!(slower.admit(tat, now, 64).is_none());
        // A smaller burst too: capped at the new, smaller full bucket.
        let small = Limit::new(5_000_000, 8_192).unwrap();
        assert_eq!(small.rescale(full, now, old.scale()), now + small.tau_ticks);
    }

    #[test]
    fn idle_stale_and_uncharged_cells_are_left_alone() {
        let now = 5 * TICKS_PER_SEC;
        let old = Limit::new(10_000_000, 65_536).unwrap();
        let new = Limit::new(1_000_000, 65_536).unwrap();
        for tat in [0, now - 1, now, now.wrapping_add(STALE_AHEAD_TICKS + 1)] {
            assert_eq!(new.rescale(tat, now, old.scale()), tat);
        }
        assert_eq!(new.rescale(now + 1000, now, 0), now + 1000);
        assert_eq!(old.rescale(now + 1000, now, old.scale()), now + 1000);
    }
}
