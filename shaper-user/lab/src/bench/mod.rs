//! `cargo xtask bench`: shaper next to the incumbents (tc's tbf and htb, ifb for ingress) on
//! the same machine, in one run. Each figure is measured in the same run as its baseline.
//!
//! - `per_packet`: cost per packet with BPF_PROG_TEST_RUN next to a no-op XDP program.
//! - `lru`: the common LRU against per-CPU LRU lists for the source map, under a flood
//!   of new sources from every CPU.
//! - `scale`: per-packet cost and kernel memory as tracked sources grow.
//! - `accuracy`: delivered rate against rate × time + burst in the namespace lab, for
//!   shaper and the incumbents, with per-source time series and softirq CPU cost.
//! - `report`: writes `bench/results.md`, `bench/results.json` and the plots.

pub mod accuracy;
pub mod flood;
pub mod lru;
pub mod per_packet;
pub mod population;
pub mod report;
pub mod scale;
pub mod softirq;
pub mod spread;

use std::net::IpAddr;

use serde::Serialize;

/// One rate-accuracy measurement: one limiter, one configuration, one run.
#[derive(Clone, Debug, Serialize)]
pub struct AccuracyRow {
    /// "shaper", "tbf", "htb", "ifb+htb".
    pub limiter: String,
    /// Whether over-limit traffic is dropped at once ("drops") or queued first ("queues").
    pub behaviour: String,
    /// The limit per source (per aggregate for tbf), bits per second.
    pub rate_bps: u64,
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
    pub seconds: f64,
    /// Anything a reader must know, e.g. that the generator could not offer 2× the limit.
    pub note: Option<String>,
    /// Whether the error measures the limiter: the generator reached the overload asked for,
    /// no send was refused, and the lab lost nothing on the way.
    pub comparable: bool,
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
    /// "shaper", "htb", "none".
    pub limiter: String,
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
    /// Anything a reader must know (frames lost in the lab's path, a short run).
    pub note: Option<String>,
}

/// Everything `accuracy` measures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AccuracyResults {
    pub rows: Vec<AccuracyRow>,
    pub series: Vec<TimeSeries>,
    pub cpu: Vec<CpuCost>,
}
