//! What became of a metered frame, in the one `u64` the metering functions return.
//!
//! The metering functions are global BPF functions (see `meter`), which the verifier checks
//! once each, and a global function may return only a scalar: everything its caller needs
//! to know is packed into [`Metered`]'s bits.

use shaper_common::maps::{
    Outcomes, REASON_AGGREGATE, REASON_BLOCKED, REASON_PACKET_RATE, REASON_SOURCE,
};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
}

/// What became of a metered frame, for the counters.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Dropped,
    /// Passed in monitor mode; enforcement would have dropped it.
    WouldDrop,
}

impl Outcome {
    #[inline(always)]
    pub fn verdict(self) -> Verdict {
        match self {
            Self::Dropped => Verdict::Drop,
            Self::Passed | Self::WouldDrop => Verdict::Pass,
        }
    }
}

/// Why a frame did not conform: `REASON_SOURCE`, `REASON_AGGREGATE`, `REASON_BLOCKED` or
/// `REASON_PACKET_RATE` (`shaper_common::maps`, as `shaper watch` reports it).
pub type Reason = u8;
pub const SOURCE: Reason = REASON_SOURCE;
pub const AGGREGATE: Reason = REASON_AGGREGATE;
pub const BLOCKED: Reason = REASON_BLOCKED;
pub const PACKET_RATE: Reason = REASON_PACKET_RATE;

/// A metered frame, packed:
///
/// | bits  | what |
/// | ----- | ---- |
/// | 0–1   | [`Outcome`]: 0 passed, 1 dropped, 2 would drop |
/// | 2–4   | the [`Reason`] it was refused (meaningless when passed) |
/// | 5     | unadmitted: its key was refused a cell (new-source admission) |
/// | 6     | untracked: no cell could be had for it, passed unmetered |
/// | 7     | the amount is what the prefix's aggregate cell was charged |
/// | 8     | remark: passed yellow by the excess meter (`meter2`), its DSCP to be rewritten |
/// | 9     | metered by the second meter (`meter2`): its policy has one |
/// | 10–63 | the amount: ticks the frame is held back (shaping), or see bit 7 |
///
/// The amount fits: a delay is at most the horizon (10 s, 2^40 ticks), a charge at most
/// `MAX_FRAME_BYTES` bytes at the slowest rate (under 2^18 × 2^36 ticks).
#[derive(Clone, Copy)]
pub struct Metered(pub u64);

const OUTCOME_BITS: u64 = 0b11;
const REASON_SHIFT: u32 = 2;
const REASON_BITS: u64 = 0b111;
const UNADMITTED: u64 = 1 << 5;
const UNTRACKED: u64 = 1 << 6;
const CHARGED_AGGREGATE: u64 = 1 << 7;
const REMARK: u64 = 1 << 8;
const SECOND: u64 = 1 << 9;
const AMOUNT_SHIFT: u32 = 10;

impl Metered {
    /// A frame passed unmetered: no cell could be had for its key.
    pub const UNTRACKED: Self = Self(UNTRACKED);

    #[inline(always)]
    pub fn new(outcome: Outcome, reason: Reason, delay_ticks: u64) -> Self {
        let outcome = match outcome {
            Outcome::Passed => 0,
            Outcome::Dropped => 1,
            Outcome::WouldDrop => 2,
        };
        Self(
            outcome
                | (u64::from(reason) & REASON_BITS) << REASON_SHIFT
                | delay_ticks << AMOUNT_SHIFT,
        )
    }

    /// The same, passed yellow by the excess meter, its DSCP to be rewritten.
    #[inline(always)]
    pub fn remark(self) -> Self {
        Self(self.0 | REMARK)
    }

    /// Whether the entry point rewrites the frame's DSCP.
    #[inline(always)]
    pub fn remarks(self) -> bool {
        self.0 & REMARK != 0
    }

    /// The same, metered by the second meter (`meter2`).
    #[inline(always)]
    pub fn second(self) -> Self {
        Self(self.0 | SECOND)
    }

    /// The same, its amount being what the aggregate cell was charged, in ticks.
    #[inline(always)]
    pub fn charged_aggregate(self, cost: u64) -> Self {
        Self(self.0 & ((1 << AMOUNT_SHIFT) - 1) | CHARGED_AGGREGATE | cost << AMOUNT_SHIFT)
    }

    /// The same, metered in the shared cell of its policy's unadmitted frames.
    #[inline(always)]
    pub fn unadmitted(self) -> Self {
        Self(self.0 | UNADMITTED)
    }

    #[inline(always)]
    pub fn outcome(self) -> Outcome {
        match self.0 & OUTCOME_BITS {
            0 => Outcome::Passed,
            1 => Outcome::Dropped,
            _ => Outcome::WouldDrop,
        }
    }

    #[inline(always)]
    pub fn reason(self) -> Reason {
        ((self.0 >> REASON_SHIFT) & REASON_BITS) as Reason
    }

    #[inline(always)]
    pub fn is_unadmitted(self) -> bool {
        self.0 & UNADMITTED != 0
    }

    #[inline(always)]
    pub fn is_untracked(self) -> bool {
        self.0 & UNTRACKED != 0
    }

    /// How long the frame is held back, in ticks (0: it may leave now).
    #[inline(always)]
    pub fn delay_ticks(self) -> u64 {
        if self.0 & CHARGED_AGGREGATE != 0 {
            0
        } else {
            self.0 >> AMOUNT_SHIFT
        }
    }
}

/// The packet and byte counters of `outcome` in `o`.
///
/// # Safety
/// `o` points to live counters: a map value, or a value of this program's own.
#[inline(always)]
pub unsafe fn outcome_counters(o: *mut Outcomes, outcome: Outcome) -> (*mut u64, *mut u64) {
    unsafe {
        match outcome {
            Outcome::Passed => (&raw mut (*o).passed_packets, &raw mut (*o).passed_bytes),
            Outcome::Dropped => (&raw mut (*o).dropped_packets, &raw mut (*o).dropped_bytes),
            Outcome::WouldDrop => (
                &raw mut (*o).would_drop_packets,
                &raw mut (*o).would_drop_bytes,
            ),
        }
    }
}

/// Adds a frame of `bytes` to the counters of `outcome` in `o`, which only this CPU
/// updates (a per-CPU map entry).
#[inline(always)]
pub fn count_outcome(o: &mut Outcomes, outcome: Outcome, bytes: u64) {
    // SAFETY: `o` is a live, exclusive reference.
    unsafe {
        let (packets, total) = outcome_counters(o, outcome);
        *packets += 1;
        *total += bytes;
    }
}
