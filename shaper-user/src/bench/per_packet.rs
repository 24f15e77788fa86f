//! Per-packet cost of the kernel programs, measured with BPF_PROG_TEST_RUN in the real
//! kernel, next to a no-op XDP program measured in the same session.
//!
//! The kernel runs a program `repeat` times on one frame and reports the mean time per
//! run; each case is measured `runs` times, interleaved with the others so drift in
//! machine load touches all of them alike, and the median is reported.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use aya::programs::{TestRun as _, TestRunOptions, Xdp};
use serde::Serialize;
use shaper_common::{
    gcra::{Limit, MAX_RATE_BPS},
    maps::{Config, PROG_NOOP, PROG_XDP},
};

use crate::{frame, loader};

#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub case: &'static str,
    pub median_ns_per_packet: f64,
    pub runs_ns_per_packet: Vec<f64>,
}

impl CaseResult {
    /// Packets per second one core could handle at this cost.
    pub fn packets_per_sec(&self) -> f64 {
        1e9 / self.median_ns_per_packet
    }
}

struct Case {
    name: &'static str,
    program: &'static str,
    frame: Vec<u8>,
    /// Policy written before each measurement of this case.
    config: Config,
}

fn config(rate_bps: u64, burst_bytes: u64) -> Result<Config> {
    Ok(Config {
        limit: Limit::new(rate_bps, burst_bytes).map_err(|e| anyhow::anyhow!("{e}"))?,
        rate_bps,
        burst_bytes,
        xdp_mode: 0,
        active: 1,
    })
}

/// Measures the no-op baseline and the shaper program's pass and drop paths on an
/// existing source, and its pass-through of a non-IPv4 frame.
pub fn per_packet(repeat: u32, runs: usize) -> Result<Vec<CaseResult>> {
    let mut ebpf = loader::load(1024)?;
    loader::xdp_program(&mut ebpf, PROG_XDP)?;
    loader::xdp_program(&mut ebpf, PROG_NOOP)?;
    // Never limited: the fastest rate with a burst no run can exhaust.
    let open = config(MAX_RATE_BPS, 1 << 40)?;
    // Always over the limit after the first frame: one byte per second.
    let shut = config(8, 1514)?;
    let cases = [
        Case {
            name: "no-op XDP program (baseline)",
            program: PROG_NOOP,
            frame: frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), 64),
            config: open,
        },
        Case {
            name: "shaper: pass, existing source",
            program: PROG_XDP,
            frame: frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), 64),
            config: open,
        },
        Case {
            name: "shaper: drop, existing source",
            program: PROG_XDP,
            frame: frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 12), 1500),
            config: shut,
        },
        Case {
            name: "shaper: not IPv4, passed untouched",
            program: PROG_XDP,
            frame: frame::ethernet(frame::ETH_P_ARP, &[0; 46]),
            config: open,
        },
    ];
    let mut samples = vec![Vec::with_capacity(runs); cases.len()];
    for _ in 0..runs {
        for (case, samples) in cases.iter().zip(&mut samples) {
            loader::configure(&mut ebpf, &case.config)?;
            let prog: &mut Xdp = ebpf
                .program_mut(case.program)
                .context("program missing")?
                .try_into()?;
            let mut opts = TestRunOptions::new();
            opts.data_in = Some(&case.frame);
            opts.repeat = repeat;
            let result = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
            samples.push(result.duration.as_nanos() as f64);
        }
    }
    Ok(cases
        .iter()
        .zip(samples)
        .map(|(case, mut runs)| {
            let mut sorted = runs.clone();
            sorted.sort_by(f64::total_cmp);
            runs.shrink_to_fit();
            CaseResult {
                case: case.name,
                median_ns_per_packet: sorted[sorted.len() / 2],
                runs_ns_per_packet: runs,
            }
        })
        .collect())
}
