//! `cargo xtask bench`: shaper next to the incumbents (tc's tbf and htb, ifb for ingress) on
//! the same machine, in one run. Each figure is measured in the same run as its baseline.
//!
//! - `builds`: today's build and the baseline (the previous build, from its commit),
//!   measured side by side in one run.
//! - `programs`, `attach`, `kernels`: per kernel, what the verifier makes of each program
//!   of both builds (instructions walked, sizes, BTF functions, load time; `bpf_info` and
//!   `btf` read what aya does not) and how long a whole `shaper attach` takes;
//!   `results-kernels.json`, one entry per kernel, and the docs' kernel table generated
//!   from it (`--only kernel`; in a guest with `cargo xtask bench --kernel K`).
//! - `per_packet`: cost per packet with BPF_PROG_TEST_RUN next to a no-op XDP program,
//!   for both builds; `colour`: the second meter's rows (green, yellow, red, packet rate)
//!   against the single-rate pass of the same runs, today's build only.
//! - `scale`: per-packet cost and kernel memory as tracked sources grow.
//! - `accuracy`: delivered rate against rate × time + burst in the namespace lab, for
//!   shaper and its peers (`peers`: an nft meter, iptables hashlimit; tc's tbf and htb),
//!   on ingress and on egress (shaper's tc program and an nft meter in netdev egress),
//!   with per-source time series, softirq CPU cost, how a late traffic generator's clumps
//!   meet a policer, and the peers' excess as the measuring time grows.
//! - `coa`: RADIUS CoA-Requests at a fixed rate to `shaper run` at 100,000 subscribers:
//!   latency as the sender and the daemon's histogram see it, scrapes meanwhile; then
//!   Disconnect-Requests one at a time (`--only coa`, results-coa.md); `accounting`:
//!   the daemon's CPU with RADIUS accounting at 100,000 subscribers and without
//!   (`--only coa` or `accounting`, results-accounting.md).
//! - `provision`: whole commands at 16,383 prefix policies and at 1,000,000 subscribers
//!   (apply from nothing, one change, one `set`; `--only provision`,
//!   results-provision.md).
//! - `tcp`: iperf3 TCP policed against shaped (sch_fq), with and without ECN
//!   (`--only tcp`, results-tcp.md; in a guest with `cargo xtask bench --kernel 6.12`).
//! - `report`: writes `bench/results.md`, `bench/results.json` and the plots; `current`:
//!   whether they measured today's kernel programs (or `bench/stale.toml` says why not).

/// The kernel figures' files in the results directory ([`kernels`] writes them, [`report`]
/// links them): here, so neither module imports the other.
pub const KERNELS_JSON: &str = "results-kernels.json";
pub const KERNELS_MARKDOWN: &str = "results-kernels.md";

pub mod accounting;
pub mod accuracy;
pub mod attach;
mod bpf_info;
mod btf;
pub mod builds;
pub mod coa;
pub mod colour;
pub mod cpus;
pub mod current;
pub mod exact;
pub mod flood;
pub mod kernels;
pub mod peers;
pub mod per_packet;
pub mod population;
pub mod programs;
pub mod provision;
pub mod report;
pub mod scale;
pub mod softirq;
pub mod spread;
pub mod subscriber;
pub mod tcp;

use std::net::IpAddr;

use serde::Serialize;

/// One rate-accuracy measurement: one limiter, one configuration, one run.
#[derive(Clone, Debug, Serialize)]
pub struct AccuracyRow {
    /// "shaper", "nft", "hashlimit", "shaper egress", "nft egress", "tbf", "htb".
    pub limiter: String,
    /// Whether over-limit traffic is dropped at once ("drops") or queued first ("queues").
    pub behaviour: String,
    /// The limit per source (per aggregate for tbf), bits per second.
    pub rate_bps: u64,
    /// The burst the limiter was given (hashlimit's is at least a second of its rate).
    pub burst_bytes: u64,
    pub frame_bytes: u32,
    pub sources: u32,
    /// What the generator actually offered per source, L2 bits per second.
    pub offered_bps_per_source: f64,
    /// L2 bytes the receiver got, summed over sources, and what the limit allows.
    pub delivered_bytes: u64,
    pub expected_bytes: f64,
    /// (delivered − expected) / expected × 100.
    pub error_pct: f64,
    /// L2 bytes an exact limiter of its kind delivers of the same recorded sends
    /// ([`exact`]: GCRA for a policer, a token bucket behind a byte FIFO for tbf and htb).
    pub exact_bytes: u64,
    /// (delivered − exact) / exact × 100: how far the limiter is from exact.
    pub from_exact_pct: f64,
    /// (exact − expected) / expected × 100: how far exact is from rate × time + burst
    /// (whole frames, not bytes; a queue's backlog).
    pub exact_error_pct: f64,
    pub seconds: f64,
    /// Anything a reader must know, e.g. that the generator could not offer 2× the limit.
    pub note: Option<String>,
    /// Whether the error measures the limiter: the generator reached 1.5× the limit, no
    /// send was refused, and the lab lost nothing on the way.
    pub comparable: bool,
    /// Whether every limiter's run of this configuration was `comparable`: only such
    /// configurations go into the headline, so every limiter is averaged over the same ones.
    pub config_comparable: bool,
}

/// Delivered rate over time in fixed bins, per source, for one limiter.
#[derive(Clone, Debug, Serialize)]
pub struct TimeSeries {
    pub limiter: String,
    pub rate_bps: u64,
    pub bin_ms: u32,
    /// Per source: delivered L2 bits per second in each bin.
    pub per_source: Vec<(IpAddr, Vec<f64>)>,
}

/// Softirq CPU time per million packets handled at a fixed offered load, measured exactly
/// (the softirq tracepoints, [`softirq`]), machine-wide.
#[derive(Clone, Debug, Serialize)]
pub struct CpuCost {
    /// "shaper", "nft", "hashlimit", "shaper egress", "nft egress", "tbf", "htb", "none".
    pub limiter: String,
    /// Which repetition (0, 1, 2): the limiters take turns within each.
    pub rep: usize,
    /// "over": the limit passes a few percent of the offered load, the limiter drops the
    /// rest; "under": the limit is far above it, everything passes.
    pub load: String,
    pub rate_bps_per_source: u64,
    pub offered_pps: f64,
    /// Packets sent (each met the limiter) and packets the receiver got.
    pub packets: u64,
    pub delivered_packets: u64,
    pub seconds: f64,
    /// Softirq time over the run, all vectors, and the receive (NET_RX) and transmit
    /// (NET_TX) vectors alone.
    pub softirq_ns: u64,
    pub net_rx_ns: u64,
    pub net_tx_ns: u64,
    pub softirq_ms_per_mpkt: f64,
    /// Frames lost in the lab's path (veth ring or backlog full) and datagrams the
    /// receiving socket dropped: the kernel's own counts, not the limiter's doing.
    pub lab_lost_packets: u64,
    /// Anything a reader must know (frames lost in the lab's path, a short run).
    pub note: Option<String>,
}

/// Many sources offering less than their limit, more in all than the lab carries, through
/// shaper, with the generator catching up late frames or skipping them ([`crate::lab::Late`]);
/// the same send record replayed through an exact policer.
#[derive(Clone, Debug, Serialize)]
pub struct LateRow {
    /// "catch-up" or "skip".
    pub late: String,
    pub rate_bps: u64,
    pub burst_bytes: u64,
    pub frame_bytes: u32,
    pub sources: u32,
    /// Per source, what was asked and what was sent (L2 bits per second).
    pub asked_bps_per_source: f64,
    pub sent_bps_per_source: f64,
    /// Frames skipped by the generator (skip), in all.
    pub skipped_packets: u64,
    pub sent_packets: u64,
    pub received_packets: u64,
    /// What the receiver did not get of what was sent, through shaper.
    pub shaper_loss_pct: f64,
    /// What an exact policer (GCRA at the same rate and burst, on the send times) drops.
    pub exact_policer_loss_pct: f64,
    /// The burst an exact policer would need to drop nothing, largest over the sources,
    /// and the median source's.
    pub burst_needed_max_bytes: f64,
    pub burst_needed_median_bytes: f64,
    pub note: Option<String>,
}

/// One overloaded source through a policer for longer and longer: what gets through beyond
/// rate × time + the burst asked for.
#[derive(Clone, Debug, Serialize)]
pub struct DurationRow {
    pub limiter: String,
    pub rate_bps: u64,
    /// The burst asked for (the excess is measured against it) and the one given.
    pub burst_asked_bytes: u64,
    pub burst_given_bytes: u64,
    pub seconds: f64,
    pub offered_bps: f64,
    pub delivered_bytes: u64,
    pub expected_bytes: f64,
    pub excess_bytes: f64,
    pub excess_pct: f64,
}

/// Everything `accuracy` measures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AccuracyResults {
    pub rows: Vec<AccuracyRow>,
    /// Sweep configurations not run, each with why.
    pub dropped: Vec<String>,
    pub series: Vec<TimeSeries>,
    pub cpu: Vec<CpuCost>,
    pub late: Vec<LateRow>,
    pub duration: Vec<DurationRow>,
    /// Cases that failed (the rest of the results stand), each with its error.
    pub failed: Vec<String>,
}
