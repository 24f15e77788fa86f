//! `shaper watch IFACE [--rate N] [--burst N] [--count N] [--duration D]`: sampled events
//! of refused frames as they happen (see `shaper_user::watch`).

use std::{collections::HashMap, time::Duration};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use shaper_common::maps::{Config, DEFAULT_SLOT, WatchEvent};
use shaper_user::{
    link, maps,
    policy::{Installed, PolicyTable},
    watch::{self, Control, RENEW},
};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};

use super::Scope;

/// Sampled events of refused frames as they happen, until Ctrl-C: time, source,
/// policy, bytes and reason
///
/// The frames are those dropped, those that would be dropped (monitor mode) and those of
/// unadmitted keys. The kernel meters the events to --rate a second, so a flood cannot
/// flood the watcher; the per-packet path pays nothing for it while nobody watches.
///
/// Each event has the time, the key (the source, or the destination with --key dst, as
/// its network when keys are masked to a prefix), the policy it fell under, the frame's
/// bytes and the reason: source_limit (its own bucket was empty, and its excess one too
/// if its policy has an excess rate), aggregate (its prefix's was), blocked, unadmitted,
/// or packet_rate (over its policy's --packet-rate). With -j, one JSON object a line, with action
/// dropped or would_drop.
///
/// The watcher holds a lease in the pinned map watch (its pid, rate and an end time 3 s
/// ahead) and renews it every second; a killed watcher leaves sampling on for at most
/// 3 s. One watcher at a time per attachment: a second is refused, naming the first's
/// pid. Events the ring buffer had no room for are counted and the count printed on exit.
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    pub iface: String,
    /// Events per second at most (1 to 100000); refused frames beyond it are not sampled
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// Events at once above the rate (default: the rate)
    #[arg(long)]
    pub burst: Option<u32>,
    /// Exit after this many events
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Exit after this long: seconds, or with a unit (500ms, 10s, 2m); at most a year
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,
}

/// The longest `--duration`: a year (longer is as good as no `--duration` at all, and far
/// longer would overflow the clock).
const MAX_DURATION: Duration = Duration::from_secs(365 * 86400);

/// How long a watch with no `--duration` lasts: until it is stopped.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86400);

fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("'{s}' is not a duration (e.g. 500ms, 10s, 2m)");
    let (number, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = number.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v <= 0.0 {
        return Err(err());
    }
    if v * scale > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "'{s}' is longer than a year (leave --duration out to watch until stopped)"
        ));
    }
    Duration::try_from_secs_f64(v * scale).map_err(|_| err())
}

const EXAMPLES: &str = "\
Examples:
  shaper watch eth0
      One line per sampled refused frame, until Ctrl-C.
  shaper -j watch eth0 --rate 20 --duration 10s
      JSON lines, at most 20 events a second, for 10 seconds.
";

/// One event, as `-j` prints it (one JSON object a line).
#[derive(Debug, Serialize)]
struct Event {
    time_unix_ns: u64,
    interface: String,
    direction: &'static str,
    /// The key: an address, or `network/prefix` when keys are aggregated; a destination
    /// when keyed by destination.
    source: String,
    /// `default`, or the policy's prefix, as `policy list` shows it.
    policy: String,
    /// What the frame cost (its wire length).
    bytes: u32,
    /// `source_limit`, `aggregate`, `blocked` or `unadmitted`.
    reason: &'static str,
    /// `dropped`, or `would_drop` in monitor mode (passed).
    action: &'static str,
}

/// Policy slot → prefix, read again when the policies change.
struct Policies {
    table: PolicyTable,
    generation: u32,
    names: HashMap<u32, String>,
}

impl Policies {
    fn open(at: &shaper_user::pins::Attachment) -> Result<Self> {
        let table = PolicyTable::open(at)?;
        let mut p = Self {
            table,
            generation: u32::MAX,
            names: HashMap::new(),
        };
        p.refresh()?;
        Ok(p)
    }

    /// Reads the policies again if their generation moved on.
    fn refresh(&mut self) -> Result<()> {
        let generation = self.table.config()?.policy_gen;
        if generation == self.generation {
            return Ok(());
        }
        self.names = self
            .table
            .list()?
            .into_iter()
            .map(|Installed { slot, spec }| (slot, spec.prefix.to_string()))
            .collect();
        self.generation = generation;
        Ok(())
    }

    fn name(&mut self, slot: u32) -> String {
        if slot == DEFAULT_SLOT {
            return "default".into();
        }
        if !self.names.contains_key(&slot) {
            // Set since the last read: read them again (errors leave the slot number).
            self.generation = u32::MAX;
            let _ = self.refresh();
        }
        self.names
            .get(&slot)
            .cloned()
            .unwrap_or_else(|| format!("slot {slot}"))
    }
}

/// `2026-11-24T16:20:01.123456Z` from nanoseconds since the epoch.
fn utc(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as libc::time_t;
    // SAFETY: an all-zero tm is valid, and gmtime_r only writes it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    unsafe { libc::gmtime_r(&secs, &mut tm) };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        (ns % 1_000_000_000) / 1000
    )
}

fn reason_text(reason: &str) -> &'static str {
    match reason {
        "source_limit" => "over its limit",
        "aggregate" => "over its prefix's aggregate",
        "blocked" => "blocked",
        "unadmitted" => "unadmitted (no cell of its own; the shared cell is full)",
        "packet_rate" => "over its packet rate",
        _ => "unknown reason",
    }
}

pub async fn run(args: &Args, scope: Scope<'_>, json: bool) -> Result<()> {
    let at = scope.at(&args.iface);
    if !at.exists() {
        bail!("shaper is not attached to {}", at.label());
    }
    if !link::is_live(&at) {
        bail!("{}", link::gone(&at));
    }
    let burst = args.burst.unwrap_or(args.rate.max(1));
    let config: Config = maps::read_config(&at)?;
    let mut policies = Policies::open(&at)?;
    let ring = watch::open_events(&at)?;
    let mut control = Control::take(&at, args.rate, burst)?;
    // Events were queued by an earlier watcher's lease: skip them.
    // SAFETY: the ring buffer owns its map's descriptor, open and the same until dropped,
    // and it is dropped with the AsyncFd.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
        .context("cannot poll the events ring buffer")?;
    {
        let ring = ring.get_mut();
        while ring.next().is_some() {}
    }
    // The kernel stamps events with CLOCK_MONOTONIC; print them in UTC.
    let offset = watch::realtime_ns().wrapping_sub(watch::monotonic_ns());
    let mut term = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
    let mut renew = tokio::time::interval(RENEW);
    renew.tick().await;
    let until = tokio::time::Instant::now() + args.duration.unwrap_or(FOREVER);
    let deadline = tokio::time::sleep_until(until);
    tokio::pin!(deadline);
    if !json {
        eprintln!(
            "shaper: watching {} (at most {} events/s, {} at once); Ctrl-C ends",
            at.label(),
            args.rate,
            burst
        );
    }
    let mut seen = 0u64;
    let done = |seen: u64| args.count.is_some_and(|n| seen >= n);
    let result: Result<()> = async {
        while !done(seen) {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard.context("cannot poll the events ring buffer")?;
                    let ring = guard.get_inner_mut();
                    while !done(seen) {
                        let Some(item) = ring.next() else { break };
                        let Some(event) = watch::decode(&item) else { continue };
                        drop(item);
                        print(&event, &at, &config, &mut policies, offset, json)?;
                        seen += 1;
                    }
                    guard.clear_ready();
                }
                _ = renew.tick() => {
                    control.renew()?;
                    let _ = policies.refresh();
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
                () = &mut deadline => break,
            }
        }
        Ok(())
    }
    .await;
    let lost = control.lost();
    control.release()?;
    result?;
    if !json {
        eprintln!(
            "shaper: {seen} events{}",
            if lost > 0 {
                format!("; {lost} lost (the ring buffer was full)")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

fn print(
    e: &WatchEvent,
    at: &shaper_user::pins::Attachment,
    config: &Config,
    policies: &mut Policies,
    offset: u64,
    json: bool,
) -> Result<()> {
    let event = Event {
        time_unix_ns: e.time_ns.wrapping_add(offset),
        interface: at.iface.clone(),
        direction: at.direction.name(),
        source: watch::key_of(e, config).to_string(),
        policy: policies.name(e.slot),
        bytes: e.bytes,
        reason: watch::reason_name(e.reason),
        action: if e.would_drop != 0 {
            "would_drop"
        } else {
            "dropped"
        },
    };
    if json {
        println!("{}", serde_json::to_string(&event)?);
    } else {
        println!(
            "{} {:<28} policy {:<20} {:>6} bytes  {}: {}",
            utc(event.time_unix_ns),
            event.source,
            event.policy,
            event.bytes,
            event.action.replace('_', " "),
            reason_text(event.reason)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_or_seconds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("ten").is_err());
        assert_eq!(parse_duration("8760h"), Ok(MAX_DURATION));
        for long in ["1e19", "8761h", "1e300s"] {
            let e = parse_duration(long).unwrap_err();
            assert!(e.contains("longer than a year"), "{long}: {e}");
        }
    }

    #[test]
    fn times_print_in_utc() {
        assert_eq!(
            utc(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456Z"
        );
    }
}
