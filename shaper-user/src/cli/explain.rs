//! `shaper explain --rate R --burst B`: the rate and burst in every unit an operator
//! reasons in, with warnings, before anything is enforced. Needs no privileges.

use anyhow::Result;
use shaper_user::{
    explain::{FULL_FRAME_BYTES, QUOTED_FRAME_BYTES, explain},
    units::{Rate, Size, human_bytes},
};

/// What a rate and burst mean: bytes/s, time per byte and per frame, the burst in
/// milliseconds, and warnings (needs no privileges, touches nothing)
///
/// The rate in bits and bytes per second, the time one byte and one full-size frame take
/// at it, the burst in bytes, in full-size frames and in milliseconds of the rate (how
/// long an idle bucket takes to refill), and warnings: a burst below one full-size frame
/// (refused by attach), or too small for one TCP flow to reach the rate over a typical
/// round trip. Rates and sizes are written as tc(8) writes them.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper explain --rate 10mbit --burst 64k
      What 10 Mbit/s with a 64 KiB burst allows.
  shaper -j explain --rate 1gbit --burst 1m
      The same as JSON.
")]
pub struct Args {
    /// Rate in tc syntax: bits per second (10mbit, 1gbit) or bytes per second (10mbps)
    #[arg(long)]
    pub rate: Rate,
    /// Burst in tc syntax, bytes (64k, 1514b)
    #[arg(long)]
    pub burst: Size,
}

pub fn run(args: &Args, json: bool) -> Result<()> {
    let e = explain(args.rate, args.burst);
    if json {
        println!("{}", serde_json::to_string_pretty(&e)?);
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
    for w in &e.warnings {
        println!("warning: {w}");
    }
    Ok(())
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
