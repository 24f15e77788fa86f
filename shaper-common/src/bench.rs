//! What the benchmark's kernel object (`shaper-ebpf-bench`, built from `shaper-ebpf`'s
//! `bench/main.rs`) and the lab share. The product never loads this object.
//!
//! - A no-op XDP program: the baseline per-packet costs are given against.
//! - Softirq time accounting: two tracing programs on the kernel's
//!   `softirq_entry`/`softirq_exit` tracepoints add up, per CPU and per softirq vector, the
//!   nanoseconds spent in softirq context. This kernel has no CONFIG_IRQ_TIME_ACCOUNTING,
//!   so `/proc/stat`'s softirq column is only sampled at the timer tick; this is exact.

/// An XDP program that passes everything: the baseline for per-packet cost figures.
pub const PROG_NOOP: &str = "shaper_noop";

/// The floor: parse, clock, one LRU hash lookup, one compare-and-swap. What any per-source
/// XDP meter must at least do; the second baseline for per-packet cost figures.
pub const PROG_FLOOR: &str = "shaper_floor";
/// The floor's LRU hash map (IPv4 source address to a u64) and its size.
pub const MAP_FLOOR: &str = "SHAPER_FLOOR";
pub const FLOOR_ENTRIES: u32 = 1024;

/// The softirq tracing programs.
pub const PROG_SOFTIRQ_ENTRY: &str = "shaper_softirq_entry";
pub const PROG_SOFTIRQ_EXIT: &str = "shaper_softirq_exit";
/// The per-CPU array map (one [`SoftirqTime`] entry) the programs write.
pub const MAP_SOFTIRQ: &str = "SHAPER_SOFTIRQ";

/// Softirq vectors the kernel has (`NR_SOFTIRQS`): HI, TIMER, NET_TX, NET_RX, BLOCK,
/// IRQ_POLL, TASKLET, SCHED, HRTIMER, RCU.
pub const NR_SOFTIRQS: usize = 10;
pub const NET_TX_SOFTIRQ: usize = 2;
pub const NET_RX_SOFTIRQ: usize = 3;
/// Names of the vectors, as `/proc/softirqs` prints them.
pub const SOFTIRQ_NAMES: [&str; NR_SOFTIRQS] = [
    "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU",
];

/// One CPU's softirq time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftirqTime {
    /// `bpf_ktime_get_ns` at the current softirq's entry; 0 outside one (softirqs do not
    /// nest on one CPU, so one slot is enough).
    pub entered_ns: u64,
    /// Nanoseconds spent in each vector's handler.
    pub ns: [u64; NR_SOFTIRQS],
    /// Handler runs per vector.
    pub runs: [u64; NR_SOFTIRQS],
}

const _: () = assert!(size_of::<SoftirqTime>() == 8 + 16 * NR_SOFTIRQS);

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], integers only, no implicit padding (size asserted above).
unsafe impl aya::Pod for SoftirqTime {}
