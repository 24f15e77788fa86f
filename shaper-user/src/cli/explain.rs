//! `shaper explain --rate R --burst B`: the rate and burst in every unit an operator
//! reasons in, with warnings, before anything is enforced. Needs no privileges.

use anyhow::Result;
use serde::Serialize;
use shaper_user::{
    explain::{Explanation, FULL_FRAME_BYTES, Profile, QUOTED_FRAME_BYTES, explain, profile},
    units::{Packets, Rate, Size, human_bytes, human_rate},
};

use super::meter2;

/// What a rate and burst mean: bytes/s, time per byte and per frame, the burst in
/// milliseconds, and warnings (needs no privileges, touches nothing)
///
/// The rate in bits and bytes per second, the time one byte and one full-size frame take
/// at it, the burst in bytes, in full-size frames and in milliseconds of the rate (how
/// long an idle bucket takes to refill), and warnings: a burst below one full-size frame
/// (refused by attach), or too small for one TCP flow to reach the rate over a typical
/// round trip. Rates and sizes are written as tc(8) writes them.
///
/// With the second meter's flags of attach and policy set (--excess-rate, --excess-burst,
/// --excess-dscp: a bandwidth profile; --packet-rate, --packet-burst), also what they mean
/// for frames of --frame-size: the frames a second each byte rate passes, the packet rate
/// in bits a second and its burst in bytes at that size, the size below which the packet
/// rate binds before the byte rates, and what a source sending flat out gets unmarked
/// (green) and marked (yellow).
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper explain --rate 10mbit --burst 64k
      What 10 Mbit/s with a 64 KiB burst allows.
  shaper -j explain --rate 1gbit --burst 1m
      The same as JSON.
  shaper explain --rate 10mbit --burst 64k --excess-rate 10mbit --excess-burst 64k --excess-dscp cs1
      A bandwidth profile: 10 Mbit/s unmarked, 10 Mbit/s more marked CS1.
  shaper explain --rate 10mbit --burst 64k --packet-rate 2k --packet-burst 200 --frame-size 64
      What 2000 frames a second come to in minimum-size frames, and which limit binds.
")]
pub struct Args {
    /// Rate in tc syntax: bits per second (10mbit, 1gbit) or bytes per second (10mbps)
    #[arg(long)]
    pub rate: Rate,
    /// Burst in tc syntax, bytes (64k, 1514b)
    #[arg(long)]
    pub burst: Size,
    #[command(flatten)]
    pub meter2: meter2::SecondMeter,
    /// The frame size the second meter's figures are for, as shaper counts a frame (from
    /// the Ethernet header, without the FCS)
    #[arg(long, value_name = "SIZE", default_value_t = Size::from_bytes(FULL_FRAME_BYTES))]
    pub frame_size: Size,
}

/// `-j`: the rate and burst's arithmetic, and the second meter's if one was given.
#[derive(Serialize)]
struct Json {
    #[serde(flatten)]
    explanation: Explanation,
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<Profile>,
}

pub fn run(args: &Args, json: bool) -> Result<()> {
    let e = explain(args.rate, args.burst);
    let m = args.meter2.limits()?;
    let p = (m.excess_rate_bps != 0 || m.packet_rate != 0)
        .then(|| profile(args.rate, &m, args.frame_size));
    if json {
        let out = Json {
            explanation: e,
            profile: p,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "rate   {} = {} bit/s = {:.0} bytes/s",
        args.rate, e.rate_bps, e.rate_bytes_per_sec
    );
    println!(
        "       one byte takes {}, one {QUOTED_FRAME_BYTES}-byte frame {}",
        duration(e.byte_time_ns * 1e-9),
        duration(e.frame_1500_time_us * 1e-6)
    );
    println!(
        "burst  {} = {} bytes = {} of traffic at the rate, and the time an idle bucket takes to refill ({} full-size {FULL_FRAME_BYTES}-byte frames)",
        args.burst,
        e.burst_bytes,
        duration(e.burst_ms * 1e-3),
        e.burst_full_frames
    );
    let tcp: Vec<String> = e
        .tcp_bursts
        .iter()
        .map(|t| format!("{} at {} ms", human_bytes(t.burst_bytes), t.rtt_ms))
        .collect();
    println!(
        "tcp    one flow needs a burst of about rate × RTT: {}",
        tcp.join(", ")
    );
    if let Some(p) = &p {
        print_profile(p);
    }
    for w in &e.warnings {
        println!("warning: {w}");
    }
    Ok(())
}

fn print_profile(p: &Profile) {
    println!(
        "frames {}-byte: the rate passes {:.0} a second",
        p.frame_bytes, p.committed_frames_per_sec
    );
    if let Some(dscp) = &p.excess_dscp {
        println!(
            "excess {} burst {}: {:.0} frames a second more, marked {dscp} (passed; downstream drops them first under congestion)",
            Rate::from_bps(p.excess_rate_bps),
            Size::from_bytes(p.excess_burst_bytes),
            p.excess_frames_per_sec
        );
    }
    if let Some(below) = p.packet_rate_binds_below_bytes {
        println!(
            "pkts   {}/s burst {} = {} and {} bytes at this size; the packet rate binds below {below:.0}-byte frames",
            Packets::from_count(p.packet_rate),
            Packets::from_count(p.packet_burst),
            human_rate(p.packet_rate_bps.round() as u64),
            p.packet_burst_bytes
        );
    }
    println!(
        "flat   one source at most: {} passed, {} unmarked, {} marked ({} binds)",
        human_rate(p.passed_bps.round() as u64),
        human_rate(p.green_bps.round() as u64),
        human_rate(p.yellow_bps.round() as u64),
        p.binding
    );
}

/// Seconds in the unit that reads best: `800 ns`, `1.20 ms`, `52.4 ms`, `2.00 s`.
fn duration(secs: f64) -> String {
    let (value, unit) = if secs >= 1.0 {
        (secs, "s")
    } else if secs >= 1e-3 {
        (secs * 1e3, "ms")
    } else if secs >= 1e-6 {
        (secs * 1e6, "µs")
    } else {
        (secs * 1e9, "ns")
    };
    if value >= 100.0 {
        format!("{value:.0} {unit}")
    } else if value >= 10.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.2} {unit}")
    }
}
