//! `shaper stats IFACE [--top N]`: global counters and the sources dropped most.

use std::net::Ipv4Addr;

use anyhow::{Result, bail};
use serde::Serialize;
use shaper_common::maps::{Counters, SourceState};
use shaper_user::{maps, pins::Attachment};

/// Show counters for IFACE and its top sources by dropped bytes.
#[derive(Debug, clap::Args)]
pub struct Args {
    pub iface: String,
    /// How many sources to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

#[derive(Debug, Serialize)]
struct Totals {
    passed_packets: u64,
    passed_bytes: u64,
    dropped_packets: u64,
    dropped_bytes: u64,
    not_ipv4_packets: u64,
    not_ipv4_bytes: u64,
    malformed_packets: u64,
    malformed_bytes: u64,
    new_sources: u64,
    cas_exhausted_packets: u64,
    untracked_packets: u64,
    unconfigured_packets: u64,
}

impl From<Counters> for Totals {
    fn from(c: Counters) -> Self {
        Self {
            passed_packets: c.passed_packets,
            passed_bytes: c.passed_bytes,
            dropped_packets: c.dropped_packets,
            dropped_bytes: c.dropped_bytes,
            not_ipv4_packets: c.not_ipv4_packets,
            not_ipv4_bytes: c.not_ipv4_bytes,
            malformed_packets: c.malformed_packets,
            malformed_bytes: c.malformed_bytes,
            new_sources: c.new_sources,
            cas_exhausted_packets: c.cas_exhausted,
            untracked_packets: c.untracked_packets,
            unconfigured_packets: c.unconfigured_packets,
        }
    }
}

#[derive(Debug, Serialize)]
struct Source {
    source: Ipv4Addr,
    passed_packets: u64,
    passed_bytes: u64,
    dropped_packets: u64,
    dropped_bytes: u64,
}

#[derive(Debug, Serialize)]
struct Stats {
    interface: String,
    netns: Option<String>,
    totals: Totals,
    sources_tracked: usize,
    top_sources: Vec<Source>,
}

fn top(mut sources: Vec<(Ipv4Addr, SourceState)>, n: usize) -> Vec<Source> {
    sources.sort_by(|a, b| {
        (b.1.dropped_bytes, b.1.passed_bytes, a.0).cmp(&(a.1.dropped_bytes, a.1.passed_bytes, b.0))
    });
    sources
        .into_iter()
        .take(n)
        .map(|(source, s)| Source {
            source,
            passed_packets: s.passed_packets,
            passed_bytes: s.passed_bytes,
            dropped_packets: s.dropped_packets,
            dropped_bytes: s.dropped_bytes,
        })
        .collect()
}

pub fn run(args: &Args, netns: Option<&str>, json: bool) -> Result<()> {
    let at = Attachment::new(&args.iface, netns);
    if !at.exists() {
        bail!("shaper is not attached to {}", at.label());
    }
    let sources = maps::read_sources(&at)?;
    let stats = Stats {
        interface: at.iface.clone(),
        netns: at.netns.clone(),
        totals: maps::read_counters(&at)?.into(),
        sources_tracked: sources.len(),
        top_sources: top(sources, args.top),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let t = &stats.totals;
    println!("{}:", at.label());
    println!(
        "  passed     {:>12} pkts {:>16} bytes",
        t.passed_packets, t.passed_bytes
    );
    println!(
        "  dropped    {:>12} pkts {:>16} bytes",
        t.dropped_packets, t.dropped_bytes
    );
    println!(
        "  not ipv4   {:>12} pkts {:>16} bytes",
        t.not_ipv4_packets, t.not_ipv4_bytes
    );
    println!(
        "  malformed  {:>12} pkts {:>16} bytes",
        t.malformed_packets, t.malformed_bytes
    );
    println!(
        "  sources {} tracked, {} seen; cas exhausted {}, untracked {}",
        stats.sources_tracked, t.new_sources, t.cas_exhausted_packets, t.untracked_packets
    );
    if !stats.top_sources.is_empty() {
        println!(
            "  {:<15} {:>12} {:>16} {:>12} {:>16}",
            "source", "passed pkts", "passed bytes", "dropped pkts", "dropped bytes"
        );
    }
    for s in &stats.top_sources {
        println!(
            "  {:<15} {:>12} {:>16} {:>12} {:>16}",
            s.source, s.passed_packets, s.passed_bytes, s.dropped_packets, s.dropped_bytes
        );
    }
    Ok(())
}
