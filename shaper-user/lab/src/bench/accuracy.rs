//! Rate accuracy, time series and softirq CPU cost in the namespace lab, for shaper and the
//! Linux incumbents (tbf, htb per source on egress, htb per source on an ifb for ingress).
//!
//! The lab is routed ([`Lab::routed`]): senders, a forwarding namespace, the receiver.
//! shaper's XDP program sits on the receiver's veth; tbf and htb on the router's egress
//! towards the receiver; ifb+htb on the receiver's veth ingress. Every limiter thus sees
//! packets that have left their sending socket, as on a real link (a queue in the senders'
//! own namespace would hold their socket buffers and throttle the senders to the limit).
//!
//! Every run builds its limiter, sends paced UDP through the lab ([`run_udp_with`]) and
//! removes the limiter again (a Drop guard: shaper detached, qdiscs and the ifb deleted),
//! all inside the lab's namespaces; the lab itself goes when dropped.
//!
//! - Accuracy: each source offers 2× the limit (where the generator reaches it; the row's
//!   `note` says when not, and the offered figure is always what was actually sent). The
//!   expected bytes are what an exact limiter lets through while it is busy: rate × (from
//!   the start of sending to the last arrival) + burst, per source (summed) or for the
//!   aggregate (tbf). A policer is busy while the senders send; a queueing limiter goes on
//!   delivering its backlog after they stop, which the receiver sees (it counts for 0.5 s
//!   after the senders stop) and which the last arrival time covers. Where a source offered
//!   less than that, it is what the source sent.
//! - Time series: delivered rate per source in 100 ms bins under 3× overload.
//! - CPU: exact softirq time ([`SoftirqClock`]) per million packets at a fixed offered
//!   load, with a limit over and under it, for shaper, htb and no limiter.
//!
//! Spreading over the CPUs: senders are pinned round-robin to the CPUs this process may use
//! ([`RunOptions::spread_cpus`]; one source is split over two sockets so that it too uses
//! both). On a veth the receive path (forwarding, XDP, the IP stack up to the receiving
//! socket) runs in softirq on the sending CPU, so that spreads the limiters' work over both
//! CPUs as well; no RPS is set up.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};

use aya::{Ebpf, programs::xdp::XdpMode};
use shaper_common::bench::{NET_RX_SOFTIRQ, NET_TX_SOFTIRQ, PROG_NOOP};
use shaper_user::netns;

use super::{AccuracyResults, AccuracyRow, CpuCost, TimeSeries, softirq::SoftirqClock};
use crate::{
    lab::{Flow, FlowResult, Lab, RunOptions, RunReport, ns, run_udp_with},
    testrun,
};

/// What [`run`] measures and how long.
#[derive(Clone, Debug)]
pub struct AccuracyOptions {
    /// The `shaper` command.
    pub shaper: PathBuf,
    /// A smoke run: one configuration per limiter, very short runs (seconds in all).
    pub quick: bool,
    /// Sending time of each run (3 s gives a full sweep of about 10 minutes). In quick mode
    /// at most 0.4 s is used.
    pub seconds: f64,
    /// Restricts the run (for investigating one configuration); `None` runs everything.
    pub only: Option<Only>,
}

/// A part of the lab benchmarks: accuracy rows matching the filters (an empty filter
/// matches all), and the time series and CPU cost if asked for.
#[derive(Clone, Debug, Default)]
pub struct Only {
    pub rates_bps: Vec<u64>,
    pub frames: Vec<u32>,
    pub sources: Vec<usize>,
    /// Skip the accuracy sweep altogether.
    pub no_sweep: bool,
    pub series: bool,
    pub cpu: bool,
}

/// Burst for every limiter, bytes (shaper's `--burst 64k`; tbf and htb get the same).
pub const BURST_BYTES: u64 = 65_536;
/// Queue the queueing limiters get, as time at their rate (tbf's customary `latency 50ms`).
const QUEUE_SECS: f64 = 0.05;
/// How long the receiver goes on counting after the senders stop (queued traffic).
const DRAIN: Duration = Duration::from_millis(500);
/// Most sending time one run may have.
const MAX_SECONDS: f64 = 60.0;
/// Sending time of each quick run.
const QUICK_SECONDS: f64 = 0.4;
/// Time bins of the time series.
const BIN: Duration = Duration::from_millis(100);
/// Offered load is this multiple of the limit in the accuracy sweep...
const OVERLOAD: u64 = 2;
/// ...and in the time series.
const SERIES_OVERLOAD: u64 = 3;
/// A run counts as at the asked-for overload when it offered at least this share of it.
const REACHED: f64 = 0.95;

const RATES_BPS: [u64; 4] = [1_000_000, 10_000_000, 100_000_000, 1_000_000_000];
const FRAMES: [u32; 3] = [64, 512, 1500];
const SOURCES: [usize; 3] = [1, 4, 64];

/// CPU cost: sources, packets per second each, frame size...
const CPU_SOURCES: usize = 4;
const CPU_PPS_PER_SOURCE: u64 = 25_000;
const CPU_FRAME: u32 = 64;
/// ...the limits per source of the two loads (1 Mbit/s passes about 2 kpps of the 25 kpps a
/// source offers; 1 Gbit/s passes all of it)...
const CPU_LOADS: [(&str, u64); 2] = [("over", 1_000_000), ("under", 1_000_000_000)];
/// ...and the sending time (softirq time is exact, but the load must settle).
const CPU_SECONDS: f64 = 10.0;

/// A rate limiter under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limiter {
    /// shaper's XDP program on the rx veth, per source.
    Shaper,
    /// tbf on the tx veth's egress, one aggregate bucket.
    Tbf,
    /// htb on the tx veth's egress, one class per source (u32 match on the source address).
    Htb,
    /// htb per source on an ifb that the rx veth's ingress redirects to.
    IfbHtb,
    /// Nothing (the CPU baseline).
    None,
}

impl Limiter {
    fn name(self) -> &'static str {
        match self {
            Limiter::Shaper => "shaper",
            Limiter::Tbf => "tbf",
            Limiter::Htb => "htb",
            Limiter::IfbHtb => "ifb+htb",
            Limiter::None => "none",
        }
    }

    fn behaviour(self) -> &'static str {
        match self {
            Limiter::Shaper | Limiter::None => "drops",
            Limiter::Tbf | Limiter::Htb | Limiter::IfbHtb => "queues",
        }
    }

    /// One bucket for all sources instead of one per source.
    fn aggregate(self) -> bool {
        self == Limiter::Tbf
    }
}

const ACCURACY_LIMITERS: [Limiter; 4] =
    [Limiter::Shaper, Limiter::Tbf, Limiter::Htb, Limiter::IfbHtb];

/// Runs the accuracy sweep, the time series and the CPU cost measurement (in that order)
/// in one namespace lab, printing one progress line per run on stderr.
pub fn run(opts: &AccuracyOptions) -> Result<AccuracyResults> {
    ensure!(
        opts.seconds.is_finite() && opts.seconds > 0.0 && opts.seconds <= MAX_SECONDS,
        "seconds must be in (0, {MAX_SECONDS}], not {}",
        opts.seconds
    );
    ensure!(
        opts.shaper.exists(),
        "no shaper command at {}",
        opts.shaper.display()
    );
    let seconds = if opts.quick {
        opts.seconds.min(QUICK_SECONDS)
    } else {
        opts.seconds
    };
    let duration = Duration::from_secs_f64(seconds);
    let max_sources = if opts.quick { 4 } else { 64 };
    let lab = Lab::routed("bench-acc", max_sources)?;
    let shaper = opts.shaper.as_path();
    let mut results = AccuracyResults::default();

    let (rates, frames, sources): (&[u64], &[u32], &[usize]) = if opts.quick {
        (&[10_000_000], &[1500], &[4])
    } else {
        (&RATES_BPS, &FRAMES, &SOURCES)
    };
    let only = opts.only.as_ref();
    let (rates, frames, sources) = if only.is_some_and(|o| o.no_sweep) {
        (Vec::new(), Vec::new(), Vec::new())
    } else {
        (
            pick(only.map(|o| o.rates_bps.as_slice()), rates),
            pick(only.map(|o| o.frames.as_slice()), frames),
            pick(only.map(|o| o.sources.as_slice()), sources),
        )
    };
    if let Some(&n) = sources.iter().max() {
        ensure!(n <= max_sources, "at most {max_sources} sources, not {n}");
    }
    for &rate_bps in &rates {
        for &frame in &frames {
            for &n in &sources {
                for limiter in ACCURACY_LIMITERS {
                    let row = accuracy_run(&lab, shaper, limiter, rate_bps, frame, n, duration)
                        .with_context(|| {
                            format!(
                                "{} at {rate_bps} bit/s, {frame}-byte frames, {n} sources",
                                limiter.name()
                            )
                        })?;
                    eprintln!("{}", describe_row(&row));
                    results.rows.push(row);
                }
            }
        }
    }

    let series_limiters = if only.is_none_or(|o| o.series) {
        &[Limiter::Shaper, Limiter::Tbf, Limiter::Htb][..]
    } else {
        &[]
    };
    for &limiter in series_limiters {
        let series = time_series(&lab, shaper, limiter, duration)
            .with_context(|| format!("time series for {}", limiter.name()))?;
        eprintln!(
            "series {:<8} {} bins of {} ms per source",
            series.limiter,
            series.per_source.first().map_or(0, |(_, bins)| bins.len()),
            series.bin_ms
        );
        results.series.push(series);
    }

    if only.is_some_and(|o| !o.cpu) {
        return Ok(results);
    }
    let clock = SoftirqClock::start().context("cannot trace softirq time")?;
    let cpu_duration = if opts.quick {
        duration
    } else {
        Duration::from_secs_f64(CPU_SECONDS.max(seconds))
    };
    for (load, rate_bps) in CPU_LOADS {
        for limiter in [Limiter::None, Limiter::Shaper, Limiter::Htb] {
            let cost = cpu_cost(&lab, &clock, shaper, limiter, load, rate_bps, cpu_duration)
                .with_context(|| format!("CPU cost of {} ({load} the limit)", limiter.name()))?;
            eprintln!(
                "cpu    {:<8} {:<5} {:.0} pps offered, {} packets, {} delivered, softirq {:.1} ms/Mpkt{}",
                cost.limiter,
                cost.load,
                cost.offered_pps,
                cost.packets,
                cost.delivered_packets,
                cost.softirq_ms_per_mpkt,
                cost.note
                    .as_ref()
                    .map_or(String::new(), |n| format!("  [{n}]"))
            );
            results.cpu.push(cost);
        }
    }
    Ok(results)
}

/// `wanted` if given and not empty, else `all`.
fn pick<T: Clone>(wanted: Option<&[T]>, all: &[T]) -> Vec<T> {
    match wanted {
        Some(w) if !w.is_empty() => w.to_vec(),
        _ => all.to_vec(),
    }
}

/// A few lines with the headline comparisons: mean absolute error per limiter at each
/// rate, the generator's reach at the top rate, and softirq per Mpkt of shaper next to htb.
pub fn summary_lines(results: &AccuracyResults) -> Vec<String> {
    let mut lines = Vec::new();
    let mut rates: Vec<u64> = results.rows.iter().map(|r| r.rate_bps).collect();
    rates.sort_unstable();
    rates.dedup();
    for rate in rates {
        let parts: Vec<String> = ["shaper", "tbf", "htb", "ifb+htb"]
            .iter()
            .filter_map(|&limiter| {
                let rows: Vec<&AccuracyRow> = results
                    .rows
                    .iter()
                    .filter(|r| r.rate_bps == rate && r.limiter == limiter)
                    .collect();
                let loaded: Vec<&AccuracyRow> =
                    rows.iter().copied().filter(|r| r.comparable).collect();
                if rows.is_empty() {
                    return None;
                }
                if loaded.is_empty() {
                    return Some(format!(
                        "{limiter} n/a (0 of {} runs comparable)",
                        rows.len()
                    ));
                }
                let abs: Vec<f64> = loaded.iter().map(|r| r.error_pct.abs()).collect();
                let mean = abs.iter().sum::<f64>() / abs.len() as f64;
                let worst = abs.iter().copied().fold(0.0, f64::max);
                Some(format!(
                    "{limiter} **{mean:.2}%** (worst {worst:.2}%, {}/{} runs)",
                    loaded.len(),
                    rows.len()
                ))
            })
            .collect();
        lines.push(format!(
            "rate error at {} (comparable runs: 2× offered, no send refused, nothing lost outside the limiter): mean |error| {}",
            fmt_rate(rate),
            parts.join(", ")
        ));
    }
    // The generator's reach where it matters most: the top rate with the smallest frames.
    let top_rate = results.rows.iter().map(|r| r.rate_bps).max();
    let small_frame = results.rows.iter().map(|r| r.frame_bytes).min();
    if let (Some(rate), Some(frame)) = (top_rate, small_frame) {
        let reach: Vec<&AccuracyRow> = results
            .rows
            .iter()
            .filter(|r| r.limiter == "shaper" && r.rate_bps == rate && r.frame_bytes == frame)
            .collect();
        if reach.iter().any(|r| !overloaded(r)) {
            let parts: Vec<String> = reach
                .iter()
                .map(|r| {
                    format!(
                        "{} Mbit/s per source ({:.0} kpps) with {} source(s)",
                        fmt_num(r.offered_bps_per_source / 1e6),
                        r.offered_bps_per_source * f64::from(r.sources)
                            / 8.0
                            / f64::from(r.frame_bytes)
                            / 1e3,
                        r.sources
                    )
                })
                .collect();
            lines.push(format!(
                "generator at {}, {frame}-byte frames (2× the limit not reached): offered {}",
                fmt_rate(rate),
                parts.join(", ")
            ));
        }
    }
    for (load, _) in CPU_LOADS {
        let cpu = |name: &str| {
            results
                .cpu
                .iter()
                .find(|c| c.limiter == name && c.load == load)
        };
        let (Some(shaper), Some(htb)) = (cpu("shaper"), cpu("htb")) else {
            continue;
        };
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}", a / b)
            } else {
                "n/a".to_owned()
            }
        };
        let mut line = format!(
            "softirq per Mpkt, {:.0} kpps of {CPU_FRAME}-byte frames {load} the limit: shaper {:.1} ms, htb {:.1} ms; shaper ÷ htb = **{}**",
            shaper.offered_pps / 1e3,
            shaper.softirq_ms_per_mpkt,
            htb.softirq_ms_per_mpkt,
            ratio(shaper.softirq_ms_per_mpkt, htb.softirq_ms_per_mpkt),
        );
        if let Some(none) = cpu("none") {
            let (s, h) = (
                shaper.softirq_ms_per_mpkt - none.softirq_ms_per_mpkt,
                htb.softirq_ms_per_mpkt - none.softirq_ms_per_mpkt,
            );
            line.push_str(&format!(
                " (no limiter {:.1} ms; over it: shaper {s:+.1} ms, htb {h:+.1} ms)",
                none.softirq_ms_per_mpkt
            ));
        }
        lines.push(line);
    }
    lines
}

/// Whether the run offered (about) the asked-for 2× the limit per source.
fn overloaded(row: &AccuracyRow) -> bool {
    row.offered_bps_per_source >= REACHED * (OVERLOAD * row.rate_bps) as f64
}

fn fmt_rate(bps: u64) -> String {
    format!("{} Mbit/s", fmt_num(bps as f64 / 1e6))
}

fn fmt_num(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

fn describe_row(r: &AccuracyRow) -> String {
    format!(
        "accuracy {:<8} {:>9} {:>5} B x{:<3} offered {:>9.3} Mbit/s/src delivered {:>11} expected {:>13.0} error {:+7.2}%{}",
        r.limiter,
        fmt_rate(r.rate_bps),
        r.frame_bytes,
        r.sources,
        r.offered_bps_per_source / 1e6,
        r.delivered_bytes,
        r.expected_bytes,
        r.error_pct,
        r.note
            .as_ref()
            .map_or(String::new(), |n| format!("  [{n}]"))
    )
}

/// The first `n` sources of the lab, each offering `offered_bps` in `frame`-byte frames.
fn flows(lab: &Lab, n: usize, offered_bps: u64, frame: u32) -> Vec<Flow> {
    lab.sources()[..n]
        .iter()
        .map(|&src| Flow {
            src: src.into(),
            offered_bps,
            frame_bytes: frame,
        })
        .collect()
}

fn run_options(bin: Option<Duration>) -> RunOptions {
    RunOptions {
        bin,
        drain: DRAIN,
        spread_cpus: true,
        ..RunOptions::default()
    }
}

fn accuracy_run(
    lab: &Lab,
    shaper: &Path,
    limiter: Limiter,
    rate_bps: u64,
    frame: u32,
    n: usize,
    duration: Duration,
) -> Result<AccuracyRow> {
    let flows = flows(lab, n, OVERLOAD * rate_bps, frame);
    let installed = Installed::new(lab, shaper, limiter, rate_bps, n)?;
    let report = run_udp_with(lab, &flows, duration, &run_options(None))?;
    drop(installed);

    let rate_bytes = rate_bps as f64 / 8.0;
    let burst = BURST_BYTES as f64;
    let busy = |r: &FlowResult| r.offered_secs.max(r.last_arrival_secs);
    let sent_bytes: u64 = report.flows.iter().map(|r| r.sent_l2_bytes).sum();
    let expected = if limiter.aggregate() {
        let busy = report.flows.iter().map(busy).fold(0.0, f64::max);
        (rate_bytes * busy + burst).min(sent_bytes as f64)
    } else {
        report
            .flows
            .iter()
            .map(|r| (rate_bytes * busy(r) + burst).min(r.sent_l2_bytes as f64))
            .sum()
    };
    let delivered: u64 = report.flows.iter().map(|r| r.received_l2_bytes).sum();
    let offered = report.flows.iter().map(|r| r.sent_bps()).sum::<f64>() / n as f64;
    let seconds = report
        .flows
        .iter()
        .map(|r| r.offered_secs)
        .fold(0.0, f64::max);
    let error_pct = if expected > 0.0 {
        (delivered as f64 - expected) / expected * 100.0
    } else {
        0.0
    };
    Ok(AccuracyRow {
        limiter: limiter.name().to_owned(),
        behaviour: limiter.behaviour().to_owned(),
        rate_bps,
        burst_bytes: BURST_BYTES,
        frame_bytes: frame,
        sources: u32::try_from(n).context("too many sources")?,
        offered_bps_per_source: offered,
        delivered_bytes: delivered,
        expected_bytes: expected,
        error_pct,
        seconds,
        note: note(limiter, rate_bps, n, offered, &report),
        comparable: comparable(rate_bps, offered, &report),
    })
}

/// What a reader must know about one run, if anything.
fn note(
    limiter: Limiter,
    rate_bps: u64,
    n: usize,
    offered: f64,
    report: &RunReport,
) -> Option<String> {
    let mut notes = Vec::new();
    let asked = (OVERLOAD * rate_bps) as f64;
    if offered < REACHED * asked {
        notes.push(format!(
            "the generator reached {} Mbit/s per source ({:.2}× the limit, not {OVERLOAD}×)",
            fmt_num(offered / 1e6),
            offered / rate_bps as f64
        ));
        if !limiter.aggregate() && offered < rate_bps as f64 {
            notes.push("below the limit: expected is what was sent".to_owned());
        }
    }
    if limiter.aggregate() && n > 1 {
        notes.push(format!(
            "one aggregate bucket: expected is rate × time + burst for all {n} sources together"
        ));
    }
    let attempted: u64 = report.flows.iter().map(|r| r.attempted_packets).sum();
    let sent: u64 = report.flows.iter().map(|r| r.sent_packets).sum();
    if attempted > 0 && attempted - sent > attempted / 100 {
        notes.push(format!(
            "{:.0}% of sends refused by a full socket buffer (qdisc backpressure), not counted as offered",
            (attempted - sent) as f64 / attempted as f64 * 100.0
        ));
    }
    if report.path_drops > 0 {
        notes.push(format!(
            "the lab's path lost {} frames (veth ring or backlog full: the machine could not \
             carry the load), delivered is short by them",
            report.path_drops
        ));
    }
    if report.receiver_drops > 0 {
        notes.push(format!(
            "the receiving socket overflowed: {} datagrams lost after the limiter, delivered is short by them",
            report.receiver_drops
        ));
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// Whether a run measures the limiter rather than the lab: the overload was reached, no
/// send was refused, and nothing was lost outside the limiter (the same tests `note` words).
fn comparable(rate_bps: u64, offered: f64, report: &RunReport) -> bool {
    let attempted: u64 = report.flows.iter().map(|r| r.attempted_packets).sum();
    let sent: u64 = report.flows.iter().map(|r| r.sent_packets).sum();
    offered >= REACHED * (OVERLOAD * rate_bps) as f64
        && attempted - sent <= attempted / 100
        && report.path_drops == 0
        && report.receiver_drops == 0
}

/// Delivered rate per source in 100 ms bins, 4 sources offering 3× a 10 Mbit/s limit in
/// 1500-byte frames.
fn time_series(
    lab: &Lab,
    shaper: &Path,
    limiter: Limiter,
    duration: Duration,
) -> Result<TimeSeries> {
    const RATE_BPS: u64 = 10_000_000;
    const SOURCES: usize = 4;
    let flows = flows(lab, SOURCES, SERIES_OVERLOAD * RATE_BPS, 1500);
    let installed = Installed::new(lab, shaper, limiter, RATE_BPS, SOURCES)?;
    let report = run_udp_with(lab, &flows, duration, &run_options(Some(BIN)))?;
    drop(installed);
    let bin_secs = BIN.as_secs_f64();
    Ok(TimeSeries {
        limiter: limiter.name().to_owned(),
        rate_bps: RATE_BPS,
        bin_ms: u32::try_from(BIN.as_millis()).context("bin width")?,
        per_source: report
            .flows
            .iter()
            .map(|r| {
                let bps = r
                    .received_bins
                    .iter()
                    .map(|&bytes| bytes as f64 * 8.0 / bin_secs)
                    .collect();
                (r.src, bps)
            })
            .collect(),
    })
}

/// Softirq CPU time per million packets: [`CPU_SOURCES`] sources at [`CPU_PPS_PER_SOURCE`]
/// each of [`CPU_FRAME`]-byte frames, against `rate_bps` per source.
///
/// The time is exact and machine-wide: everything the packets cost in softirq context,
/// from the senders' veth to the receiving socket (the routed lab's forwarding, XDP, an
/// egress qdisc's enqueue and dequeue, ...), plus whatever else the machine did in softirq
/// meanwhile (little, on an otherwise idle machine; `none` shows the floor). Packets are the
/// generator's sent datagrams, each of which met the limiter.
///
/// Every run has an XDP program on the receiving veth, the shaper or else a no-op one:
/// attaching XDP changes how a veth receives (a ring and NAPI instead of the per-CPU
/// backlog), and without it the comparison would measure that change, not the limiters.
fn cpu_cost(
    lab: &Lab,
    clock: &SoftirqClock,
    shaper: &Path,
    limiter: Limiter,
    load: &str,
    rate_bps: u64,
    duration: Duration,
) -> Result<CpuCost> {
    let offered_bps = CPU_PPS_PER_SOURCE * u64::from(CPU_FRAME) * 8;
    let flows = flows(lab, CPU_SOURCES, offered_bps, CPU_FRAME);
    let installed = Installed::new(lab, shaper, limiter, rate_bps, CPU_SOURCES)?;
    let noop = if limiter == Limiter::Shaper {
        None
    } else {
        Some(attach_noop_xdp(lab)?)
    };
    let before = clock.read()?;
    let report = run_udp_with(lab, &flows, duration, &run_options(None))?;
    let spent = clock.read()?.since(&before);
    drop(noop);
    drop(installed);
    let packets: u64 = report.flows.iter().map(|r| r.sent_packets).sum();
    let delivered_packets: u64 = report.flows.iter().map(|r| r.received_packets).sum();
    let secs = report
        .flows
        .iter()
        .map(|r| r.offered_secs)
        .fold(0.0, f64::max);
    let softirq_ns = spent.total_ns();
    let mut notes = Vec::new();
    if report.path_drops > 0 {
        notes.push(format!("the lab's path lost {} frames", report.path_drops));
    }
    if report.receiver_drops > 0 {
        notes.push(format!(
            "the receiving socket overflowed ({} datagrams)",
            report.receiver_drops
        ));
    }
    Ok(CpuCost {
        limiter: limiter.name().to_owned(),
        load: load.to_owned(),
        rate_bps_per_source: rate_bps,
        offered_pps: if secs > 0.0 {
            packets as f64 / secs
        } else {
            0.0
        },
        packets,
        delivered_packets,
        seconds: secs,
        softirq_ns,
        net_rx_ns: spent.ns[NET_RX_SOFTIRQ],
        net_tx_ns: spent.ns[NET_TX_SOFTIRQ],
        softirq_ms_per_mpkt: if packets > 0 {
            softirq_ns as f64 / 1e6 / (packets as f64 / 1e6)
        } else {
            0.0
        },
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// The no-op XDP program attached (native) to the lab's rx veth; detached when the returned
/// object is dropped.
fn attach_noop_xdp(lab: &Lab) -> Result<Ebpf> {
    let iface = lab.rx_iface().to_owned();
    netns::run_in(lab.rx_ns(), move || -> Result<Ebpf> {
        let mut ebpf = testrun::noop()?;
        testrun::xdp_mut(&mut ebpf, PROG_NOOP)?
            .attach(&iface, XdpMode::Driver)
            .with_context(|| format!("cannot attach the no-op XDP program to {iface}"))?;
        Ok(ebpf)
    })?
}

/// A limiter set up in the lab; dropping it removes it (errors ignored: this may run while
/// unwinding, and the lab's namespaces go soon after anyway). Only shaper's pins outlive
/// the namespaces, so its detach matters most.
struct Installed<'a> {
    lab: &'a Lab,
    shaper: &'a Path,
    limiter: Limiter,
}

/// The ifb device's name, inside the rx namespace.
const IFB: &str = "shifb0";

impl<'a> Installed<'a> {
    /// Sets `limiter` up at `rate_bps` (per source for the first `n` sources, or for the
    /// aggregate) with [`BURST_BYTES`].
    fn new(
        lab: &'a Lab,
        shaper: &'a Path,
        limiter: Limiter,
        rate_bps: u64,
        n: usize,
    ) -> Result<Installed<'a>> {
        // The guard exists before the first step, so a failing step undoes the others.
        let installed = Installed {
            lab,
            shaper,
            limiter,
        };
        let queue = queue_bytes(rate_bps);
        let rx = lab.rx_ns();
        let (egress_ns, egress) = lab.egress();
        match limiter {
            Limiter::None => {}
            Limiter::Shaper => {
                let out = Command::new(shaper)
                    .args(["-n", rx, "attach", lab.rx_iface()])
                    .args(["--rate", &format!("{rate_bps}bit")])
                    .args(["--burst", &BURST_BYTES.to_string()])
                    .stdin(Stdio::null())
                    .output()
                    .with_context(|| format!("cannot run {}", shaper.display()))?;
                if !out.status.success() {
                    bail!(
                        "shaper attach failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
            }
            Limiter::Tbf => ns::batch(
                "tc",
                egress_ns.name(),
                &[format!(
                    "qdisc add dev {egress} root handle 1: tbf rate {rate_bps}bit burst {BURST_BYTES} limit {queue}"
                )],
            )?,
            Limiter::Htb => {
                ns::batch("tc", egress_ns.name(), &htb_lines(egress, lab, rate_bps, n))?
            }
            Limiter::IfbHtb => {
                lab.rx_netns().ip(&["link", "add", IFB, "type", "ifb"])?;
                lab.rx_netns().ip(&["link", "set", "dev", IFB, "up"])?;
                let mut lines = vec![
                    format!("qdisc add dev {} handle ffff: ingress", lab.rx_iface()),
                    // u32 `match u32 0 0` is the catch-all (no matchall in this kernel).
                    format!(
                        "filter add dev {} parent ffff: protocol all prio 1 u32 match u32 0 0 \
                         action mirred egress redirect dev {IFB}",
                        lab.rx_iface()
                    ),
                ];
                lines.extend(htb_lines(IFB, lab, rate_bps, n));
                ns::batch("tc", rx, &lines)?;
            }
        }
        Ok(installed)
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        let lab = self.lab;
        let quiet = |cmd: &mut Command| {
            let _ = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        match self.limiter {
            Limiter::None => {}
            Limiter::Shaper => {
                quiet(Command::new(self.shaper).args(["-n", lab.rx_ns(), "detach", lab.rx_iface()]))
            }
            Limiter::Tbf | Limiter::Htb => {
                let (ns, iface) = lab.egress();
                quiet(Command::new("tc").args([
                    "-n",
                    ns.name(),
                    "qdisc",
                    "del",
                    "dev",
                    iface,
                    "root",
                ]));
            }
            Limiter::IfbHtb => {
                quiet(Command::new("tc").args([
                    "-n",
                    lab.rx_ns(),
                    "qdisc",
                    "del",
                    "dev",
                    lab.rx_iface(),
                    "ingress",
                ]));
                quiet(Command::new("ip").args(["-n", lab.rx_ns(), "link", "del", IFB]));
            }
        }
    }
}

/// The queue a queueing limiter gets: [`QUEUE_SECS`] at its rate, at least two full frames.
fn queue_bytes(rate_bps: u64) -> u64 {
    ((rate_bps as f64 / 8.0 * QUEUE_SECS) as u64).max(2 * 1514)
}

/// The classic per-subscriber htb on `dev`: one class per source at `rate ceil rate` with
/// the common burst, a bfifo of [`queue_bytes`] under it, and a u32 filter on the source
/// address. Nothing goes to a default class, so unmatched traffic (none here) would pass.
fn htb_lines(dev: &str, lab: &Lab, rate_bps: u64, n: usize) -> Vec<String> {
    let queue = queue_bytes(rate_bps);
    let mut lines = vec![format!("qdisc add dev {dev} root handle 1: htb")];
    for (i, src) in lab.sources()[..n].iter().enumerate() {
        let id = 0x10 + i;
        lines.push(format!(
            "class add dev {dev} parent 1: classid 1:{id:x} htb rate {rate_bps}bit ceil {rate_bps}bit \
             burst {BURST_BYTES} cburst {BURST_BYTES} quantum 1514"
        ));
        lines.push(format!(
            "qdisc add dev {dev} parent 1:{id:x} handle {id:x}: bfifo limit {queue}"
        ));
        lines.push(format!(
            "filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip src {src}/32 flowid 1:{id:x}"
        ));
    }
    lines
}

/// How long the whole accuracy run takes, roughly, for `opts` (for progress messages).
pub fn estimated(opts: &AccuracyOptions) -> Duration {
    let runs = if opts.quick {
        ACCURACY_LIMITERS.len() + 6
    } else {
        RATES_BPS.len() * FRAMES.len() * SOURCES.len() * ACCURACY_LIMITERS.len() + 6
    };
    let seconds = if opts.quick {
        opts.seconds.min(QUICK_SECONDS)
    } else {
        opts.seconds
    };
    let per_run = seconds + DRAIN.as_secs_f64() + 0.3;
    Duration::from_secs_f64((runs as f64 * per_run).clamp(0.0, 86_400.0))
}
