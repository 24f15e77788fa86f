//! Softirq time per vector and CPU, for the benchmark's CPU cost figures
//! (`shaper_common::bench`).

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map},
    maps::PerCpuArray,
    programs::BtfTracePointContext,
};
use shaper_common::bench::{NR_SOFTIRQS, SoftirqTime};

/// Softirq time per CPU.
#[map(name = "SHAPER_SOFTIRQ")]
static SOFTIRQ: PerCpuArray<SoftirqTime> = PerCpuArray::with_max_entries(1, 0);

/// `softirq_entry(unsigned int vec_nr)`: note the time.
#[btf_tracepoint(function = "softirq_entry")]
pub fn shaper_softirq_entry(_ctx: BtfTracePointContext) -> i32 {
    if let Some(t) = SOFTIRQ.get_ptr_mut(0) {
        // SAFETY: this CPU's entry; softirqs do not nest on one CPU and BPF programs do
        // not preempt each other on it.
        unsafe { (*t).entered_ns = bpf_ktime_get_ns() };
    }
    0
}

/// `softirq_exit(unsigned int vec_nr)`: add the time since entry to the vector.
#[btf_tracepoint(function = "softirq_exit")]
pub fn shaper_softirq_exit(ctx: BtfTracePointContext) -> i32 {
    let vec: u32 = ctx.arg(0);
    let vec = vec as usize;
    let Some(t) = SOFTIRQ.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: as above.
    let t = unsafe { &mut *t };
    // An exit without a seen entry (tracing started mid-softirq) is skipped.
    if t.entered_ns != 0 && vec < NR_SOFTIRQS {
        // SAFETY: a helper with no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        t.ns[vec] += now.saturating_sub(t.entered_ns);
        t.runs[vec] += 1;
    }
    t.entered_ns = 0;
    0
}
