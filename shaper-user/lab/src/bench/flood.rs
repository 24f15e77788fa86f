//! A spoofed flood against shaper with and without new-source admission, an nft meter and
//! iptables hashlimit (their tables as large as shaper's default map), tbf and htb, in the
//! same routed lab ([`Lab::routed`]) with the same traffic: three real sources (one at twice
//! its limit, two at half) and a flood of 60-byte frames, each from a source never used
//! before, as fast as one sender thread writes them (`lab::raw`, spoofed). shaper, the nft
//! meter and hashlimit sit on the router's input veth, tbf and htb on its egress, as in the
//! accuracy case ([`super::accuracy`]). The receiver counts at its own veth, behind the
//! router, so every limiter has had its say on what it counts.
//!
//! (An earlier version sent the flood straight onto the receiver's veth, to a MAC address
//! that was not the veth's, and counted there with a packet socket. A packet socket sees a
//! frame before tc ingress, netfilter's netdev ingress hook and the IP stack: the nft meter
//! and hashlimit were counted before they ran, and hashlimit in PREROUTING never saw a frame
//! at all, since the IP stack drops a frame for another host before PREROUTING. Both showed
//! 100% of the flood through. Only XDP runs before the packet socket.)
//!
//! Beside the spoofed flood, through shaper with no admission flag (the default: a new key
//! gets a cell on its second sighting, or on its first within the first-sighting
//! allowance): floods from a pool of 1,000 and of 100,000 addresses that each repeat, as
//! fast as the sender goes (each address is a source like any other), the pool of 1,000
//! again under the remedy, an aggregate on a policy for all of IPv4, and a warm start:
//! 20,000 sources, every one new, each sending a 1,000-byte frame a second.
//!
//! Reported per configuration: the flood's frames that reached the receiver, what the
//! under-limit sources lost at the receiver, the keys created (for shaper, how many of
//! them a fresh address's false admission, and the frames the flood's sources lost to
//! admission, per source), and the softirq time
//! (exact, [`super::softirq`]) per flood frame: NET_RX, where the router receives and
//! forwards (and a qdisc enqueues), and all vectors (a throttled qdisc dequeues in NET_TX).

use std::{net::Ipv4Addr, path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result, ensure};
use serde::Serialize;
use shaper_common::bench::NET_RX_SOFTIRQ;

use super::{
    accuracy::{Installed, Limiter},
    peers::{self, Peer},
    softirq::SoftirqClock,
};
use crate::{
    frame,
    lab::{
        Lab, Late,
        raw::{RawFlow, RawResult, Sources, run_raw},
    },
};

const RATE_BPS: u64 = 8_000_000;
const FRAME: usize = 1000;
const FLOOD_FRAME: usize = 60;
const SECONDS: u64 = 4;

/// The configurations compared: a label, what is set up, and the flood.
const CONFIGS: [(&str, Setup, Flood); 11] = [
    (
        "shaper, default (no admission flag)",
        Setup::Shaper(&[]),
        Flood::Spoofed,
    ),
    (
        "shaper, --new-sources 100",
        Setup::Shaper(&["--new-sources", "100"]),
        Flood::Spoofed,
    ),
    (
        "shaper, admission unlimited",
        Setup::Shaper(&["--new-sources", "unlimited"]),
        Flood::Spoofed,
    ),
    ("nft meter", Setup::Peer(peers::Kind::Nft), Flood::Spoofed),
    (
        "hashlimit",
        Setup::Peer(peers::Kind::Hashlimit),
        Flood::Spoofed,
    ),
    (
        "tbf (one bucket for all sources)",
        Setup::Tc(Limiter::Tbf),
        Flood::Spoofed,
    ),
    (
        "htb (a class per real source, a default class)",
        Setup::Tc(Limiter::Htb),
        Flood::Spoofed,
    ),
    (
        "shaper, default, a pool of 1,000 addresses",
        Setup::Shaper(&[]),
        Flood::Pool(1000),
    ),
    (
        "shaper, default, a pool of 100,000 addresses",
        Setup::Shaper(&[]),
        Flood::Pool(100_000),
    ),
    (
        "shaper, default, a pool of 1,000 under a 16 Mbit/s aggregate on 0.0.0.0/0",
        Setup::ShaperAggregate,
        Flood::Pool(1000),
    ),
    (
        "shaper, default, a warm start of 20,000 sources",
        Setup::Shaper(&[]),
        Flood::WarmStart(WARM_SOURCES),
    ),
];

/// Sources of the warm start, each sending one frame of [`FRAME`] bytes a second.
pub const WARM_SOURCES: u32 = 20_000;

/// shaper with these attach flags beyond rate and burst, shaper with no flag and a policy
/// for all of IPv4 at the same rate with an aggregate ([`AGGREGATE`]), a peer on the
/// router's input veth, or a tc qdisc on its egress.
#[derive(Clone, Copy)]
enum Setup {
    Shaper(&'static [&'static str]),
    ShaperAggregate,
    Peer(peers::Kind),
    Tc(Limiter),
}

/// The remedy for a pool flood: `policy set IFACE` with these.
const AGGREGATE: [&str; 9] = [
    "0.0.0.0/0",
    "--rate",
    "8mbit",
    "--burst",
    "32k",
    "--aggregate-rate",
    "16mbit",
    "--aggregate-burst",
    "64k",
];

/// What floods beside the real sources: 60-byte frames as fast as one thread sends them,
/// each from an address never used before or from a pool in turn; or a warm start, this
/// many sources each sending a [`FRAME`]-byte frame a second, in turn.
#[derive(Clone, Copy)]
enum Flood {
    Spoofed,
    Pool(u32),
    WarmStart(u32),
}

impl Flood {
    /// The frame's length, the offered rate and the sources.
    fn traffic(self) -> (usize, u64, Sources) {
        match self {
            Self::Spoofed => (FLOOD_FRAME, FLAT_OUT_BPS, Sources::Spoofed),
            Self::Pool(n) => (FLOOD_FRAME, FLAT_OUT_BPS, Sources::Pool(n)),
            Self::WarmStart(n) => (FRAME, u64::from(n) * FRAME as u64 * 8, Sources::Pool(n)),
        }
    }
}

/// Faster than one sender thread goes.
const FLAT_OUT_BPS: u64 = 1_000_000_000;

const BURST: u64 = 32_768;

/// One configuration under the flood.
#[derive(Clone, Debug, Serialize)]
pub struct FloodRow {
    pub limiter: String,
    /// Where it sits: "router input (XDP)", "router input (netdev ingress)", ...
    pub placement: String,
    pub flood_sent_packets: u64,
    pub flood_sent_per_sec: f64,
    /// Flood frames the receiver saw.
    pub flood_received_packets: u64,
    /// Flood frames the receiver saw, of those sent.
    pub flood_passed_pct: f64,
    /// What the two under-limit sources lost between sender and receiver.
    pub real_loss_pct: f64,
    /// Keys given a cell during the flood (shaper's count; the peers do not say).
    pub keys_created: Option<u64>,
    /// Of them, keys of a spoofed flood given a cell on a "second" sighting: a fresh
    /// address that found a trace of its own tag (shaper's doorkeeper).
    pub false_admissions: Option<u64>,
    /// Frames of the flood's sources that admission left to the shared cell and that it
    /// dropped, per source of a pool or warm start (shaper's count).
    pub lost_per_source: Option<f64>,
    /// The burst the limiter had (hashlimit's is at least a second of the rate).
    pub burst_bytes: u64,
    /// NET_RX softirq time over the run, per flood frame sent (machine-wide, the real
    /// sources' few frames included).
    pub net_rx_ns_per_flood_frame: f64,
    /// Softirq time of every vector, per flood frame sent.
    pub softirq_ns_per_flood_frame: f64,
}

fn shaper(shaper: &Path, ns: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(shaper)
        .args(["-n", ns])
        .args(args)
        .output()
        .with_context(|| format!("running {}", shaper.display()))?;
    ensure!(
        out.status.success(),
        "shaper {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Runs the flood once per configuration, in one lab.
pub fn run(shaper_bin: &Path) -> Result<Vec<FloodRow>> {
    let lab = Lab::routed("bflood", 3)?;
    let (ns, iface) = lab.ingress();
    let (ns, iface) = (ns.name().to_owned(), iface.to_owned());
    // Addressed to the router, which forwards them to the receiver.
    let first_hop = lab.first_hop_mac()?;
    let flow = |src: Ipv4Addr, len, offered_bps, sources| {
        let mut frame = frame::ipv4_udp_to(src, lab.rx_addr(), len);
        frame[..6].copy_from_slice(&first_hop);
        RawFlow {
            frame,
            offered_bps,
            sources,
            late: Late::CatchUp,
        }
    };
    let s = lab.sources();
    let real = [
        flow(s[0], FRAME, 2 * RATE_BPS, Sources::One),
        flow(s[1], FRAME, RATE_BPS / 2, Sources::One),
        flow(s[2], FRAME, RATE_BPS / 2, Sources::One),
    ];
    let clock = SoftirqClock::start()?;
    let mut rows = Vec::new();
    for (label, setup, kind) in CONFIGS {
        let (len, offered_bps, sources) = kind.traffic();
        let mut flows = real.to_vec();
        flows.push(flow(Ipv4Addr::new(10, 64, 0, 0), len, offered_bps, sources));
        let mut peer = None;
        let mut tc = None;
        let (burst, placement) = match setup {
            Setup::Shaper(more) => {
                let burst = BURST.to_string();
                let mut attach = vec!["attach", &iface, "--rate", "8mbit", "--burst", &burst];
                attach.extend_from_slice(more);
                shaper(shaper_bin, &ns, &attach)?;
                (BURST, "router input (XDP)")
            }
            Setup::ShaperAggregate => {
                let burst = BURST.to_string();
                shaper(
                    shaper_bin,
                    &ns,
                    &["attach", &iface, "--rate", "8mbit", "--burst", &burst],
                )?;
                let mut policy = vec!["policy", "set", &iface];
                policy.extend_from_slice(&AGGREGATE);
                shaper(shaper_bin, &ns, &policy)?;
                (BURST, "router input (XDP)")
            }
            Setup::Peer(kind) => {
                peer = Some(Peer::install(kind, &ns, &iface, RATE_BPS, BURST)?);
                let placement = match kind {
                    peers::Kind::Hashlimit => "router input (raw PREROUTING)",
                    _ => "router input (netdev ingress)",
                };
                (peers::burst_given(kind, RATE_BPS, BURST), placement)
            }
            Setup::Tc(limiter) => {
                // Per source for the three real sources (htb), or one bucket (tbf).
                tc = Some(Installed::new(
                    &lab, shaper_bin, limiter, RATE_BPS, BURST, 3,
                )?);
                (BURST, "router egress (qdisc)")
            }
        };
        let is_shaper = matches!(setup, Setup::Shaper(_) | Setup::ShaperAggregate);
        let measured = (|| -> Result<FloodRow> {
            // The real sources get their cells before the flood.
            run_raw(&lab, &flows[..3], Duration::from_secs(1))?;
            let before = clock.read()?;
            let results = run_raw(&lab, &flows, Duration::from_secs(SECONDS))?.flows;
            let spent = clock.read()?.since(&before);
            let net_rx = spent.ns[NET_RX_SOFTIRQ];
            // shaper's counters (the real sources' cells, made in the second before the
            // flood, on their first sightings, included).
            let stats: Option<serde_json::Value> = if is_shaper {
                let args = ["-j", "stats", &iface, "--top", "0"];
                Some(serde_json::from_str(&shaper(shaper_bin, &ns, &args)?)?)
            } else {
                None
            };
            let total = |name: &str| stats.as_ref().and_then(|s| s["totals"][name].as_u64());
            let flood: &RawResult = &results[3];
            let (false_admissions, lost_per_source) = match kind {
                Flood::Spoofed => (total("admitted_on_second_sighting"), None),
                Flood::Pool(n) | Flood::WarmStart(n) => {
                    let sources = u64::from(n).min(flood.sent_packets).max(1);
                    let lost = total("unadmitted_dropped_packets");
                    (None, lost.map(|l| l as f64 / sources as f64))
                }
            };
            let keys_created = total("new_sources");
            let real = &results[1..3];
            let sent: u64 = real.iter().map(|r| r.sent_packets).sum();
            let received: u64 = real.iter().map(|r| r.received_packets).sum();
            Ok(FloodRow {
                limiter: label.to_owned(),
                placement: placement.to_owned(),
                flood_sent_packets: flood.sent_packets,
                flood_sent_per_sec: flood.sent_packets as f64 / flood.offered_secs,
                flood_received_packets: flood.received_packets,
                flood_passed_pct: 100.0 * flood.received_packets as f64
                    / flood.sent_packets.max(1) as f64,
                real_loss_pct: 100.0 * (sent - received.min(sent)) as f64 / sent.max(1) as f64,
                keys_created,
                false_admissions,
                lost_per_source,
                burst_bytes: burst,
                net_rx_ns_per_flood_frame: net_rx as f64 / flood.sent_packets.max(1) as f64,
                softirq_ns_per_flood_frame: spent.total_ns() as f64
                    / flood.sent_packets.max(1) as f64,
            })
        })();
        if is_shaper {
            shaper(shaper_bin, &ns, &["detach", &iface])?;
        }
        drop(peer);
        drop(tc);
        rows.push(measured?);
    }
    Ok(rows)
}

/// The rows as a table.
pub fn summary_lines(rows: &[FloodRow]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<76} {:>12} {:>10} {:>13} {:>11} {:>10} {:>6} {:>11} {:>16} {:>17}",
        "flood (60 B frames; warm start 1000 B)",
        "flood sent",
        "frames/s",
        "flood passed",
        "real lost",
        "keys made",
        "false",
        "lost/source",
        "NET_RX ns/frame",
        "softirq ns/frame"
    )];
    let na = |v: Option<u64>| v.map_or("n/a".to_owned(), |k| k.to_string());
    for r in rows {
        lines.push(format!(
            "{:<76} {:>12} {:>10.0} {:>12.2}% {:>10.2}% {:>10} {:>6} {:>11} {:>16.0} {:>17.0}",
            r.limiter,
            r.flood_sent_packets,
            r.flood_sent_per_sec,
            r.flood_passed_pct,
            r.real_loss_pct,
            na(r.keys_created),
            na(r.false_admissions),
            r.lost_per_source
                .map_or("n/a".to_owned(), |l| format!("{l:.3}")),
            r.net_rx_ns_per_flood_frame,
            r.softirq_ns_per_flood_frame
        ));
    }
    lines
}
