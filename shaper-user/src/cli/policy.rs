//! `shaper policy set|del|list IFACE ...`: per-prefix policies on an attached interface.

use super::Scope;
use anyhow::{Result, bail};
use serde::Serialize;
use shaper_common::{
    config::{Meter2Limits, PolicyLimits},
    maps::DEFAULT_SLOT,
};
use shaper_user::{
    admission, change,
    colour::Colours,
    pins::Attachment,
    policy::{Action, CheckedPolicy, Installed, Mode, PolicySpec, PolicyTable, parse_prefix},
    units::{Rate, Size},
};

use super::{
    attach::check_burst_fits,
    meter2, new_sources,
    outcomes::{OutcomeFields, SightingFields, Unadmitted},
};

/// Per-prefix policies: limits, exemptions and blocks, longest prefix wins
///
/// The attach rate is the default policy. A prefix policy overrides it for the sources
/// in a prefix, IPv4 or IPv6; where prefixes nest, the longest one covering a source
/// wins. A policy limits each source (--rate, --burst), and may add one bucket the whole
/// prefix shares (--aggregate-rate, --aggregate-burst: a packet must fit both, and one
/// refused by either is charged to neither); or exempts the prefix (--action pass: never
/// limited, still counted), or blocks it (--action drop). --mode monitor drops nothing
/// for the prefix and counts what would be dropped; --mode shape (egress, with sch_fq)
/// holds it back instead.
///
/// Changes apply while attached, to sources already seen on their next packet: nobody is
/// detached, no packet goes unmetered, and a new rate rescales each bucket's backlog
/// (never refills it). A policy prefix may not be longer than the key prefix
/// (--prefix-v4, --prefix-v6 of attach), except inside the ranges keyed per address
/// (link-local, unspecified, multicast: fe80::1/128, ::/128, 0.0.0.0/32), nor have host
/// bits set, as ip route refuses.
/// Up to attach's --max-policies per interface (1024 by default, at most 16383),
/// subscribers' plans included. The file of shaper-apply(8) sets them all at once.
#[derive(Debug, clap::Subcommand)]
#[command(after_long_help = EXAMPLES)]
pub enum Command {
    Set(SetArgs),
    Del(DelArgs),
    List(ListArgs),
}

const EXAMPLES: &str = "\
Examples:
  shaper policy set eth0 203.0.113.0/24 --rate 4mbit --burst 64k --aggregate-rate 10mbit --aggregate-burst 128k
      Each address of the /24 up to 4 Mbit/s, the whole /24 up to 10 Mbit/s.
  shaper policy set eth0 192.0.2.0/28 --action pass
      Never limit the /28; still count it.
  shaper policy set eth0 fe80::/10 --rate 1mbit --burst 16k --aggregate-rate 10mbit --aggregate-burst 64k
      Each link-local address up to 1 Mbit/s, all of them together up to 10 Mbit/s.
  shaper policy set eth0 fe80::1/128 --action pass
      Never limit the gateway's link-local address (a spoofer can drain its bucket).
  shaper policy list eth0
      Every policy with its counters, the default first.
";

/// Add a policy for PREFIX, or replace the one it has; sources already seen keep their
/// state (a new rate rescales their buckets, never refills them)
///
/// --rate and --burst are per source (per key: an address, or a /64 in IPv6); with
/// --action limit (the default) both are needed, with pass or drop neither.
/// --new-sources gives the prefix a new-source admission of its own; without it, the
/// prefix's new sources count against the interface's. Either way its unadmitted frames
/// share one bucket of the prefix's own, at its per-source rate and burst.
#[derive(Debug, clap::Args)]
#[command(after_long_help = SET_EXAMPLES)]
pub struct SetArgs {
    pub iface: String,
    /// 203.0.113.0/24, 2001:db8::/48, or one address (a /32 or /128)
    pub prefix: String,
    /// What to do with the prefix's sources
    #[arg(long, value_enum, default_value_t = Action::Limit)]
    pub action: Action,
    /// Rate per source, in tc units (with --action limit)
    #[arg(long)]
    pub rate: Option<Rate>,
    /// Burst per source, in tc units (with --action limit)
    #[arg(long)]
    pub burst: Option<Size>,
    /// Rate the whole prefix shares, on top of the per-source rate
    #[arg(long, requires = "aggregate_burst")]
    pub aggregate_rate: Option<Rate>,
    /// Burst the whole prefix shares
    #[arg(long, requires = "aggregate_rate")]
    pub aggregate_burst: Option<Size>,
    /// monitor: drop nothing for this prefix, count what would be dropped
    #[arg(long, value_enum, default_value_t = Mode::Enforce)]
    pub mode: Mode,
    #[command(flatten)]
    pub new_sources: new_sources::Flags,
    #[command(flatten)]
    pub meter2: meter2::SecondMeter,
}

const SET_EXAMPLES: &str = "\
Examples:
  shaper policy set eth0 198.51.100.0/24 --rate 2mbit --burst 32k --mode monitor
      Try a lower plan: drop nothing, count what it would drop.
  shaper policy set eth0 2001:db8:bad::/48 --action drop
      Block an IPv6 network.
  shaper policy set eth0 198.18.0.0/15 --rate 2mbit --burst 16k --new-sources 200
      At most 200 new sources a second of the /15 get a bucket of their own.
  shaper policy set eth0 203.0.113.0/24 --rate 10mbit --burst 64k --excess-rate 10mbit --excess-burst 64k --excess-dscp cs1
      A bandwidth profile (RFC 4115): 10 Mbit/s delivered as sent, 10 Mbit/s more marked CS1, the rest dropped.
  shaper policy set eth0 198.51.100.0/24 --rate 10mbit --burst 64k --packet-rate 2k --packet-burst 200
      Also at most 2000 frames a second per source, whatever their size.
";

/// Remove the policy of PREFIX; its sources fall back to the next longest prefix
///
/// The sources it covered are resolved again on their next packet: to the next longest
/// prefix that covers them, or the default policy.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper policy del eth0 203.0.113.0/24
      The /24's sources fall back to the default rate.
")]
pub struct DelArgs {
    pub iface: String,
    pub prefix: String,
}

/// List the policies with their counters (the default policy first)
///
/// Each policy with its action, mode, rates and bursts, its new-source admission (own,
/// or interface when it shares the interface's) and its counters: passed, dropped and
/// would drop packets, keys given a bucket, and unadmitted packets. Counters carried
/// over by an upgrade are included. With -j, JSON whose keys carry their unit.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper policy list eth0
      The policies of eth0, the default first.
  shaper -j policy list eth0 --direction egress
      Those of its egress attachment, as JSON.
")]
pub struct ListArgs {
    pub iface: String,
}

pub fn run(command: &Command, scope: Scope<'_>, json: bool) -> Result<()> {
    match command {
        Command::Set(args) => set(args, scope),
        Command::Del(args) => del(args, scope),
        Command::List(args) => list(args, scope, json),
    }
}

/// The table of an attached interface.
fn open(at: &Attachment) -> Result<PolicyTable> {
    if !at.exists() {
        bail!("shaper is not attached to {}", at.label());
    }
    Ok(PolicyTable::open(at)?)
}

/// The limits `set` asks for, checked against the action.
fn limits(args: &SetArgs) -> Result<PolicyLimits> {
    let action = args.action;
    let limit = action == Action::Limit;
    if !limit {
        for (flag, given) in [
            ("--rate", args.rate.is_some()),
            ("--burst", args.burst.is_some()),
            ("--aggregate-rate", args.aggregate_rate.is_some()),
            ("--excess-rate", args.meter2.excess_rate.is_some()),
            ("--packet-rate", args.meter2.packet_rate.is_some()),
        ] {
            if given {
                bail!("{flag} has no meaning with --action {}", action.name());
            }
        }
    }
    let (rate, burst) = match (limit, args.rate, args.burst) {
        (false, _, _) => (0, 0),
        (true, Some(r), Some(b)) => (r.bits_per_sec(), b.bytes()),
        (true, _, _) => bail!("--action limit needs --rate and --burst"),
    };
    let admission = args.new_sources.of_policy()?;
    Ok(PolicyLimits {
        action: action.value(),
        mode: args.mode.value(),
        rate_bps: rate,
        burst_bytes: burst,
        aggregate_rate_bps: args.aggregate_rate.map_or(0, |r| r.bits_per_sec()),
        aggregate_burst_bytes: args.aggregate_burst.map_or(0, |b| b.bytes()),
        new_sources: admission.new_sources,
        new_sources_burst: admission.new_sources_burst,
        meter2: args.meter2.limits()?,
    })
}

fn set(args: &SetArgs, scope: Scope<'_>) -> Result<()> {
    let prefix = parse_prefix(&args.prefix)?;
    // Names the bad value before anything else is looked at.
    let policy = CheckedPolicy::new(PolicySpec {
        prefix,
        limits: limits(args)?,
    })?;
    let spec = *policy.spec();
    if let Some(burst) = args.burst {
        check_burst_fits("--burst", burst, &args.iface)?;
    }
    if let Some(burst) = args.aggregate_burst {
        check_burst_fits("--aggregate-burst", burst, &args.iface)?;
    }
    let at = scope.at(&args.iface);
    let changes = change::set_policy(&at, policy)?;
    let what = changes.verb();
    println!("{what} {} on {}: {}", prefix, at.label(), describe(&spec));
    Ok(())
}

fn del(args: &DelArgs, scope: Scope<'_>) -> Result<()> {
    let prefix = parse_prefix(&args.prefix)?;
    let at = scope.at(&args.iface);
    change::del_policy(&at, prefix)?;
    println!("removed {prefix} from {}", at.label());
    Ok(())
}

/// `limit 4mbit burst 64k per source, aggregate 10mbit burst 128k`, `pass`, `drop`, with
/// ` (monitor)` when dry-running.
pub fn describe(spec: &PolicySpec) -> String {
    let l = &spec.limits;
    let mut text = match spec.action() {
        Action::Limit => format!(
            "limit {} burst {} per source",
            Rate::from_bps(l.rate_bps),
            Size::from_bytes(l.burst_bytes)
        ),
        a => a.name().to_owned(),
    };
    if l.aggregate_rate_bps != 0 {
        text += &format!(
            ", aggregate {} burst {}",
            Rate::from_bps(l.aggregate_rate_bps),
            Size::from_bytes(l.aggregate_burst_bytes)
        );
    }
    if l.new_sources != 0 {
        text += ", new sources ";
        text += &admission::describe(l.new_sources, l.new_sources_burst);
    }
    text += &meter2::describe(&l.meter2);
    match spec.mode() {
        Mode::Monitor => text += " (monitor)",
        Mode::Shape => text += " (shape)",
        Mode::Enforce => {}
    }
    text
}

#[derive(Debug, Serialize)]
struct Row {
    /// `default` for the interface's default policy.
    prefix: String,
    action: &'static str,
    mode: &'static str,
    rate_bps: u64,
    burst_bytes: u64,
    /// Zero: no aggregate.
    aggregate_rate_bps: u64,
    aggregate_burst_bytes: u64,
    #[serde(flatten)]
    outcomes: OutcomeFields,
    aggregate_refused_packets: u64,
    aggregate_refused_bytes: u64,
    /// Whose new-source admission meters this policy's newcomers: `own`, `interface`
    /// (the default row's), or `unlimited` (the default row only).
    admission: &'static str,
    /// The policy's own admission (the interface's for the default row); zero: none.
    new_sources_per_sec: u64,
    new_sources_burst: u64,
    /// Keys given a cell under this policy.
    new_sources: u64,
    #[serde(flatten)]
    sightings: SightingFields,
    #[serde(flatten)]
    unadmitted: Unadmitted,
    /// The second meter: the excess rate (zero: none), its burst and DSCP; the packet
    /// rate (zero: none) and burst.
    excess_rate_bps: u64,
    excess_burst_bytes: u64,
    excess_dscp: u8,
    packet_rate: u64,
    packet_burst: u64,
    /// The frames above, unadmitted included, green, yellow (marked) and red
    /// (`shaper_user::colour`); and of the red, the packet rate's refusals.
    #[serde(flatten)]
    colours: Colours,
    packet_rate_refused_packets: u64,
    packet_rate_refused_bytes: u64,
}

fn row(prefix: String, spec: &PolicySpec, table: &PolicyTable, slot: u32) -> Result<Row> {
    let s = table.stats(slot)?;
    let l = &spec.limits;
    let admission = match (l.new_sources != 0, slot == DEFAULT_SLOT) {
        (true, _) => "own",
        (false, false) => "interface",
        (false, true) => "unlimited",
    };
    Ok(Row {
        admission,
        prefix,
        action: spec.action().name(),
        mode: spec.mode().name(),
        rate_bps: l.rate_bps,
        burst_bytes: l.burst_bytes,
        aggregate_rate_bps: l.aggregate_rate_bps,
        aggregate_burst_bytes: l.aggregate_burst_bytes,
        outcomes: OutcomeFields::new(s.outcomes),
        aggregate_refused_packets: s.aggregate_refused_packets,
        aggregate_refused_bytes: s.aggregate_refused_bytes,
        new_sources_per_sec: l.new_sources,
        new_sources_burst: l.new_sources_burst,
        new_sources: s.new_sources,
        sightings: (&s.sightings).into(),
        unadmitted: (&s.unadmitted).into(),
        excess_rate_bps: l.meter2.excess_rate_bps,
        excess_burst_bytes: l.meter2.excess_burst_bytes,
        excess_dscp: l.meter2.excess_dscp,
        packet_rate: l.meter2.packet_rate,
        packet_burst: l.meter2.packet_burst,
        colours: Colours::new(
            &[&s.outcomes, &s.unadmitted],
            (s.meter2.yellow_packets, s.meter2.yellow_bytes),
        ),
        packet_rate_refused_packets: s.meter2.packet_rate_refused_packets,
        packet_rate_refused_bytes: s.meter2.packet_rate_refused_bytes,
    })
}

/// The rows of `list`, the default policy's first.
fn rows(table: &PolicyTable) -> Result<Vec<Row>> {
    let config = table.config()?;
    let default = PolicySpec {
        prefix: parse_prefix("0.0.0.0/0")?,
        limits: PolicyLimits {
            mode: config.mode,
            rate_bps: config.rate_bps,
            burst_bytes: config.burst_bytes,
            new_sources: config.admission.new_sources,
            new_sources_burst: config.admission.new_sources_burst,
            meter2: config.meter2.limits(),
            ..PolicyLimits::default()
        },
    };
    let mut rows = vec![row("default".into(), &default, table, DEFAULT_SLOT)?];
    for Installed { slot, spec } in table.list()? {
        rows.push(row(spec.prefix.to_string(), &spec, table, slot)?);
    }
    Ok(rows)
}

/// What `list -j` prints of `at`'s policies; with `prefix` (`default`, or a prefix as
/// `list` prints it), that policy's row alone, or `None` if it has none. The daemon's
/// API answers the same.
pub fn json(at: &Attachment, prefix: Option<&str>) -> Result<Option<String>> {
    let table = open(at)?;
    let rows = rows(&table)?;
    Ok(match prefix {
        None => Some(serde_json::to_string_pretty(&rows)?),
        Some(p) => match rows.iter().find(|r| r.prefix == p) {
            Some(r) => Some(serde_json::to_string_pretty(r)?),
            None => None,
        },
    })
}

fn list(args: &ListArgs, scope: Scope<'_>, json: bool) -> Result<()> {
    let table = open(&scope.at(&args.iface))?;
    let rows = rows(&table)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<24} {:<7} {:<8} {:>10} {:>8} {:>10} {:>9} {:>9} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12}",
        "prefix",
        "action",
        "mode",
        "rate",
        "burst",
        "aggr rate",
        "aggr brst",
        "new/s",
        "passed pkts",
        "dropped pkts",
        "would drop",
        "new keys",
        "seen once",
        "unadmitted"
    );
    let or_dash = |v: u64, text: String| if v == 0 { "-".to_owned() } else { text };
    for r in &rows {
        println!(
            "{:<24} {:<7} {:<8} {:>10} {:>8} {:>10} {:>9} {:>9} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12}",
            r.prefix,
            r.action,
            r.mode,
            or_dash(r.rate_bps, Rate::from_bps(r.rate_bps).to_string()),
            or_dash(r.burst_bytes, Size::from_bytes(r.burst_bytes).to_string()),
            or_dash(
                r.aggregate_rate_bps,
                Rate::from_bps(r.aggregate_rate_bps).to_string()
            ),
            or_dash(
                r.aggregate_burst_bytes,
                Size::from_bytes(r.aggregate_burst_bytes).to_string()
            ),
            match r.admission {
                "own" => r.new_sources_per_sec.to_string(),
                other => other.to_owned(),
            },
            r.outcomes.counts.passed_packets,
            r.outcomes.counts.dropped_packets,
            r.outcomes.counts.would_drop_packets,
            r.new_sources,
            r.sightings.seen_once,
            r.unadmitted.unadmitted_packets
        );
        if r.excess_rate_bps != 0 || r.packet_rate != 0 {
            let m = Meter2Limits {
                excess_rate_bps: r.excess_rate_bps,
                excess_burst_bytes: r.excess_burst_bytes,
                excess_dscp: r.excess_dscp,
                packet_rate: r.packet_rate,
                packet_burst: r.packet_burst,
            };
            println!(
                "{:<24} {}: yellow {} pkts, over the packet rate {} pkts",
                "",
                meter2::describe(&m).trim_start_matches(", "),
                r.colours.yellow_packets,
                r.packet_rate_refused_packets
            );
        }
    }
    Ok(())
}
