//! Exact softirq time, machine-wide, from the tracing programs of
//! [`shaper_common::bench`]: attached while a [`SoftirqClock`] lives, detached when it
//! is dropped.

use anyhow::{Context as _, Result};
use aya::{
    Btf, Ebpf,
    maps::{MapData, PerCpuArray},
    programs::BtfTracePoint,
};
use shaper_common::bench::{
    MAP_SOFTIRQ, NR_SOFTIRQS, PROG_SOFTIRQ_ENTRY, PROG_SOFTIRQ_EXIT, SoftirqTime,
};

use crate::testrun::BENCH_OBJECT;

/// Softirq nanoseconds and handler runs per vector, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftirqTotals {
    pub ns: [u64; NR_SOFTIRQS],
    pub runs: [u64; NR_SOFTIRQS],
}

impl SoftirqTotals {
    /// Nanoseconds in all vectors.
    pub fn total_ns(&self) -> u64 {
        self.ns.iter().sum()
    }

    /// What accrued from `earlier` to `self`.
    pub fn since(&self, earlier: &SoftirqTotals) -> SoftirqTotals {
        let mut d = SoftirqTotals::default();
        for v in 0..NR_SOFTIRQS {
            d.ns[v] = self.ns[v].saturating_sub(earlier.ns[v]);
            d.runs[v] = self.runs[v].saturating_sub(earlier.runs[v]);
        }
        d
    }
}

/// The two softirq tracing programs, attached.
pub struct SoftirqClock {
    // The links go with the programs when the object is dropped.
    ebpf: Ebpf,
}

impl SoftirqClock {
    /// Loads and attaches the tracing programs (needs BTF in /sys/kernel/btf/vmlinux).
    pub fn start() -> Result<SoftirqClock> {
        let mut ebpf = aya::EbpfLoader::new()
            .load(BENCH_OBJECT)
            .context("cannot load the bench object")?;
        let btf = Btf::from_sys_fs().context("cannot read the kernel's BTF")?;
        for (prog, tracepoint) in [
            (PROG_SOFTIRQ_ENTRY, "softirq_entry"),
            (PROG_SOFTIRQ_EXIT, "softirq_exit"),
        ] {
            let p: &mut BtfTracePoint = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the object"))?
                .try_into()
                .with_context(|| format!("{prog} is not a BTF tracepoint program"))?;
            p.load(tracepoint, &btf)
                .with_context(|| format!("cannot load {prog}"))?;
            p.attach()
                .with_context(|| format!("cannot attach {prog} to {tracepoint}"))?;
        }
        Ok(SoftirqClock { ebpf })
    }

    /// The totals so far (from the attach on).
    pub fn read(&self) -> Result<SoftirqTotals> {
        let map: PerCpuArray<&MapData, SoftirqTime> = PerCpuArray::try_from(
            self.ebpf
                .map(MAP_SOFTIRQ)
                .with_context(|| format!("map {MAP_SOFTIRQ} missing"))?,
        )?;
        let mut totals = SoftirqTotals::default();
        for cpu in map.get(&0, 0)?.iter() {
            for v in 0..NR_SOFTIRQS {
                totals.ns[v] += cpu.ns[v];
                totals.runs[v] += cpu.runs[v];
            }
        }
        Ok(totals)
    }
}
