//! `shaper stats IFACE [--top N]`: global counters and the sources dropped most.

use super::Scope;
use super::outcomes::{OutcomeFields, SightingFields, Unadmitted};
use anyhow::{Result, bail};
use serde::Serialize;
use shaper_common::{
    maps::{CAS_TRIES, Counters, DEFAULT_SLOT, MODE_MONITOR, MODE_SHAPE, SourceState},
    shape::{bucket_bounds_ns, percentile_ns},
};
use shaper_user::{
    colour::{self, Colours},
    maps::{self, KeyNet, Pinned},
    pins::Attachment,
    policy::{Mode, PolicyTable},
    request, sources,
    subscriber::SubscriberTable,
    units::Delay,
};
use std::collections::HashMap;

/// Show counters for IFACE and its top sources by dropped bytes.
///
/// The interface's counters: packets and bytes passed, dropped and would drop (monitor
/// mode); the frames of unadmitted keys (refused a bucket of their own under a flood),
/// which are in none of those; the keys given a bucket; what passed untouched by kind
/// (not IP, PPPoE control, a third VLAN tag, malformed); with shape mode, what was held
/// back, marked CE and dropped past the horizon, and how long packets were held; and on
/// which try each compare-and-swap charge won. Then the --top sources by dropped bytes,
/// each with its policy. Every IP frame is counted once. Counters carried over by an
/// upgrade are included. With -j, JSON whose keys carry their unit.
///
/// With an excess rate or a packet rate (policy set --excess-rate, --packet-rate), the
/// same frames by colour, as a bandwidth profile counts them: green (passed unmarked:
/// passed minus yellow), yellow (passed with the excess DSCP) and red (dropped or would
/// drop, whatever refused them), of which those over the packet rate; per source too
/// (-j: green_packets, yellow_packets, red_packets, packet_rate_refused_packets, and
/// their _bytes).
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    pub iface: String,
    /// How many sources to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// The counters of one subscriber (shaper-subscriber(8)) instead: its frames passed
    /// (of which marked yellow by its excess rate), dropped and would drop, by colour
    #[arg(long, value_name = "ID", conflicts_with = "top")]
    pub subscriber: Option<String>,
}

const EXAMPLES: &str = "\
Examples:
  shaper stats eth0 --top 10
      The counters and the 10 sources dropped most.
  shaper -j stats eth0 --direction egress
      The egress attachment's counters as JSON.
  shaper -j stats eth0 | jq '.totals | {green_bytes, yellow_bytes, red_bytes}'
      What a bandwidth profile (--excess-rate) delivered unmarked, marked and refused.
  shaper -j stats eth0 --direction egress --subscriber c1042
      Subscriber c1042's download counters as JSON.
";

#[derive(Debug, Serialize)]
struct Totals {
    #[serde(flatten)]
    outcomes: OutcomeFields,
    /// The same frames, unadmitted ones included, by colour (`shaper_user::colour`).
    #[serde(flatten)]
    colours: Colours,
    /// Of the red frames, those the packet rate refused.
    packet_rate_refused_packets: u64,
    packet_rate_refused_bytes: u64,
    ipv4_packets: u64,
    ipv6_packets: u64,
    not_ip_packets: u64,
    not_ip_bytes: u64,
    pppoe_other_packets: u64,
    pppoe_other_bytes: u64,
    vlan_too_deep_packets: u64,
    vlan_too_deep_bytes: u64,
    malformed_packets: u64,
    malformed_bytes: u64,
    #[serde(flatten)]
    unadmitted: Unadmitted,
    /// Keys given a cell.
    new_sources: u64,
    #[serde(flatten)]
    sightings: SightingFields,
    #[serde(flatten)]
    cas_won: CasWon,
    cas_exhausted_packets: u64,
    untracked_packets: u64,
    unconfigured_packets: u64,
    #[serde(flatten)]
    shaping: Shaping,
}

/// What shape mode held back, marked and dropped.
#[derive(Debug, Serialize)]
pub struct Shaping {
    /// Packets given a departure time later than now (also counted as passed).
    pub shaped_packets: u64,
    pub shaped_bytes: u64,
    pub ce_marked_packets: u64,
    /// Dropped rather than held back beyond the horizon (also counted as dropped): the
    /// drops of the policies in shape mode, which drop nothing else.
    pub horizon_dropped_packets: u64,
    pub horizon_dropped_bytes: u64,
}

/// How long shaped packets were held back (`shape_delay` of `stats -j`, beside the
/// totals, which are all counts).
#[derive(Debug, Serialize)]
pub struct ShapeDelay {
    /// Percentiles: the upper bound of the log2 bucket each falls in (`null` when nothing
    /// was shaped).
    pub p50_ns: Option<u64>,
    pub p90_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    /// The sum of the delays (the kernel's count, exact).
    pub sum_ns: u64,
    /// The buckets that counted anything.
    pub histogram: Vec<DelayBucket>,
}

impl ShapeDelay {
    pub fn new(c: &Counters) -> Self {
        let h = &c.shape_delay;
        Self {
            p50_ns: percentile_ns(h, 50),
            p90_ns: percentile_ns(h, 90),
            p99_ns: percentile_ns(h, 99),
            sum_ns: c.shape_delay_ns,
            histogram: h
                .iter()
                .enumerate()
                .filter(|(_, n)| **n != 0)
                .map(|(k, &packets)| {
                    let (from_ns, to_ns) = bucket_bounds_ns(k);
                    DelayBucket {
                        from_ns,
                        to_ns,
                        packets,
                    }
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DelayBucket {
    pub from_ns: u64,
    /// `null` for the last bucket, which has no upper bound.
    pub to_ns: Option<u64>,
    pub packets: u64,
}

impl Shaping {
    /// From the counters and the drops of the policies in shape mode.
    pub fn new(c: &Counters, horizon_dropped: (u64, u64)) -> Self {
        Self {
            shaped_packets: c.shaped_packets,
            shaped_bytes: c.shaped_bytes,
            ce_marked_packets: c.ce_marked_packets,
            horizon_dropped_packets: horizon_dropped.0,
            horizon_dropped_bytes: horizon_dropped.1,
        }
    }
}

/// The packets and bytes the policies and subscribers' plans in shape mode dropped (the
/// default policy's too if the interface shapes): shaping drops only beyond the horizon.
pub fn horizon_dropped(at: &Attachment) -> Result<(u64, u64)> {
    let table = PolicyTable::open(at)?;
    let config = table.config()?;
    let mut slots = Vec::new();
    if config.mode == MODE_SHAPE {
        slots.push(DEFAULT_SLOT);
    }
    for i in table.list()? {
        if i.spec.mode() == Mode::Shape && config.mode != MODE_MONITOR {
            slots.push(i.slot);
        }
    }
    for (slot, p) in table.plans()? {
        if p.mode == MODE_SHAPE && config.mode != MODE_MONITOR {
            slots.push(slot);
        }
    }
    let mut dropped = (0, 0);
    for slot in slots {
        let s = table.stats(slot)?;
        dropped.0 += s.outcomes.dropped_packets + s.unadmitted.dropped_packets;
        dropped.1 += s.outcomes.dropped_bytes + s.unadmitted.dropped_bytes;
    }
    Ok(dropped)
}

/// `≤ 4.19 ms`: a percentile as the bound it is.
fn at_most(ns: Option<u64>) -> String {
    match ns {
        None => "-".to_owned(),
        Some(ns) if ns >= 1_000_000 => format!("≤{:.1}ms", ns as f64 / 1e6),
        Some(ns) => format!("≤{:.0}us", ns as f64 / 1e3),
    }
}

impl From<Counters> for Totals {
    fn from(c: Counters) -> Self {
        Self {
            outcomes: OutcomeFields::new(c.outcomes),
            colours: Colours::new(
                &[&c.outcomes, &c.unadmitted],
                (c.meter2.yellow_packets, c.meter2.yellow_bytes),
            ),
            packet_rate_refused_packets: c.meter2.packet_rate_refused_packets,
            packet_rate_refused_bytes: c.meter2.packet_rate_refused_bytes,
            ipv4_packets: c.ipv4_packets,
            ipv6_packets: c.ipv6_packets,
            not_ip_packets: c.not_ip_packets,
            not_ip_bytes: c.not_ip_bytes,
            pppoe_other_packets: c.pppoe_other_packets,
            pppoe_other_bytes: c.pppoe_other_bytes,
            vlan_too_deep_packets: c.vlan_too_deep_packets,
            vlan_too_deep_bytes: c.vlan_too_deep_bytes,
            malformed_packets: c.malformed_packets,
            malformed_bytes: c.malformed_bytes,
            unadmitted: (&c.unadmitted).into(),
            new_sources: c.new_sources,
            sightings: (&c.sightings).into(),
            cas_won: CasWon::from(c.cas_won),
            cas_exhausted_packets: c.cas_exhausted,
            untracked_packets: c.untracked_packets,
            unconfigured_packets: c.unconfigured_packets,
            shaping: Shaping::new(&c, (0, 0)),
        }
    }
}

/// Charges the compare-and-swap published, by the try that won.
#[derive(Debug, Serialize)]
struct CasWon {
    cas_won_first_try: u64,
    cas_won_after_1_retry: u64,
    cas_won_after_2_retries: u64,
    cas_won_after_3_retries: u64,
}

impl From<[u64; CAS_TRIES]> for CasWon {
    fn from([first, one, two, three]: [u64; CAS_TRIES]) -> Self {
        Self {
            cas_won_first_try: first,
            cas_won_after_1_retry: one,
            cas_won_after_2_retries: two,
            cas_won_after_3_retries: three,
        }
    }
}

#[derive(Debug, Serialize)]
struct Source {
    /// The address, or `network/prefix` when keys are aggregated; a destination when
    /// keyed by destination.
    source: String,
    #[serde(flatten)]
    outcomes: OutcomeFields,
    #[serde(flatten)]
    colours: Colours,
}

#[derive(Debug, Serialize)]
struct Stats {
    interface: String,
    netns: Option<String>,
    /// `ingress` or `egress`.
    direction: &'static str,
    /// `src` or `dst`: which address the sources below are.
    key: &'static str,
    totals: Totals,
    shape_delay: ShapeDelay,
    sources_tracked: usize,
    top_sources: Vec<Source>,
}

/// The `n` keys dropped most, each with its colours (`yellow`: by key).
fn top(
    sources: Vec<(KeyNet, SourceState)>,
    yellow: &HashMap<KeyNet, (u64, u64)>,
    n: usize,
) -> Vec<Source> {
    sources::top_dropped(sources, n)
        .into_iter()
        .map(|(source, outcomes)| Source {
            colours: Colours::new(
                &[&outcomes],
                yellow.get(&source).copied().unwrap_or_default(),
            ),
            source: source.to_string(),
            outcomes: OutcomeFields::new(outcomes),
        })
        .collect()
}

/// The `n` keys dropped most on `iface`, as the JSON `stats -j` shows them (`/top` of
/// `shaper run`'s metrics server).
pub fn top_json(iface: &str, scope: Scope<'_>, n: usize) -> Result<String> {
    #[derive(Serialize)]
    struct Top {
        interface: String,
        netns: Option<String>,
        key: &'static str,
        sources_tracked: usize,
        top_sources: Vec<Source>,
    }
    let at = scope.at(iface);
    if !at.exists() {
        bail!("shaper is not attached to {}", at.label());
    }
    let config = maps::read_config(&at)?;
    let sources = maps::read_all_keys(&at, &config)?;
    let yellow = colour::yellow_by_key(&at, &config)?;
    let top = Top {
        interface: at.iface.clone(),
        netns: at.netns.clone(),
        key: request::key_name(config.key_by),
        sources_tracked: sources.len(),
        top_sources: top(sources, &yellow, n),
    };
    Ok(serde_json::to_string_pretty(&top)?)
}

pub fn run(args: &Args, scope: Scope<'_>, json: bool) -> Result<()> {
    let at = scope.at(&args.iface);
    if !at.exists() {
        bail!("shaper is not attached to {}", at.label());
    }
    if let Some(id) = &args.subscriber {
        return subscriber(&at, id, json);
    }
    let config = maps::read_config(&at)?;
    let counters = maps::read_counters(&at)?;
    let horizon = horizon_dropped(&at)?;
    // The sources last: their counters are the freshest at exit, however long the reads
    // above take (a script that times `stats` calls times them, the policy table included).
    let sources = maps::read_all_keys(&at, &config)?;
    let yellow = colour::yellow_by_key(&at, &config)?;
    let mut stats = Stats {
        interface: at.iface.clone(),
        netns: at.netns.clone(),
        direction: at.direction.name(),
        key: request::key_name(config.key_by),
        totals: counters.into(),
        shape_delay: ShapeDelay::new(&counters),
        sources_tracked: sources.len(),
        top_sources: top(sources, &yellow, args.top),
    };
    stats.totals.shaping = Shaping::new(&counters, horizon);
    if json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let t = &stats.totals;
    let o = &t.outcomes.counts;
    println!("{}:", at.label());
    println!(
        "  passed     {:>12} pkts {:>16} bytes",
        o.passed_packets, o.passed_bytes
    );
    println!(
        "  dropped    {:>12} pkts {:>16} bytes",
        o.dropped_packets, o.dropped_bytes
    );
    if o.would_drop_packets != 0 {
        println!(
            "  would drop {:>12} pkts {:>16} bytes (monitor: passed)",
            o.would_drop_packets, o.would_drop_bytes
        );
    }
    if t.unadmitted.unadmitted_packets != 0 {
        println!(
            "  unadmitted {:>12} pkts {:>16} bytes: passed {} pkts, dropped {} pkts{}",
            t.unadmitted.unadmitted_packets,
            t.unadmitted.unadmitted_bytes,
            t.unadmitted.outcomes.counts.passed_packets,
            t.unadmitted.outcomes.counts.dropped_packets,
            if t.unadmitted.outcomes.counts.would_drop_packets != 0 {
                format!(
                    ", would drop {} pkts",
                    t.unadmitted.outcomes.counts.would_drop_packets
                )
            } else {
                String::new()
            }
        );
    }
    let k = &t.colours;
    if config.meter2.any() || k.yellow_packets != 0 || t.packet_rate_refused_packets != 0 {
        println!(
            "  green      {:>12} pkts {:>16} bytes (passed unmarked)",
            k.green_packets, k.green_bytes
        );
        println!(
            "  yellow     {:>12} pkts {:>16} bytes (passed marked by the excess rate)",
            k.yellow_packets, k.yellow_bytes
        );
        println!(
            "  red        {:>12} pkts {:>16} bytes (refused; {} pkts over the packet rate)",
            k.red_packets, k.red_bytes, t.packet_rate_refused_packets
        );
    }
    println!(
        "  metered    {:>12} IPv4 pkts {:>11} IPv6 pkts",
        t.ipv4_packets, t.ipv6_packets
    );
    for (kind, packets, bytes) in counters.unmetered() {
        let what = kind.replace('_', " ");
        println!("  {what:<12} {packets:>10} pkts {bytes:>16} bytes");
    }
    println!(
        "  sources {} tracked, {} created; untracked {}",
        stats.sources_tracked, t.new_sources, t.untracked_packets
    );
    let s = &t.sightings;
    println!(
        "  new keys   {} seen once; admitted {} on a second sighting, {} on a first; {} traces displaced",
        s.seen_once,
        s.admitted_on_second_sighting,
        s.admitted_on_first_sighting,
        s.traces_displaced
    );
    let w = &t.cas_won;
    println!(
        "  cas won    {} first try, {} after 1 retry, {} after 2, {} after 3; exhausted {}",
        w.cas_won_first_try,
        w.cas_won_after_1_retry,
        w.cas_won_after_2_retries,
        w.cas_won_after_3_retries,
        t.cas_exhausted_packets
    );
    let s = &t.shaping;
    if config.mode == MODE_SHAPE || s.shaped_packets != 0 || s.horizon_dropped_packets != 0 {
        println!(
            "  shaped     {:>12} pkts {:>16} bytes: delay p50 {} p90 {} p99 {}; CE marked {} pkts",
            s.shaped_packets,
            s.shaped_bytes,
            at_most(stats.shape_delay.p50_ns),
            at_most(stats.shape_delay.p90_ns),
            at_most(stats.shape_delay.p99_ns),
            s.ce_marked_packets
        );
        println!(
            "  horizon    {:>12} pkts {:>16} bytes dropped (ECN threshold {}, horizon {})",
            s.horizon_dropped_packets,
            s.horizon_dropped_bytes,
            Delay::from_ns(config.shape.ecn_threshold_ns),
            Delay::from_ns(config.shape.horizon_ns)
        );
    }
    // A column of marked (yellow) frames when any listed source has one.
    let marked = stats
        .top_sources
        .iter()
        .any(|s| s.colours.yellow_packets != 0);
    let yellow = |text: String| if marked { text } else { String::new() };
    if !stats.top_sources.is_empty() {
        println!(
            "  {:<24} {:>12} {:>16} {:>12} {:>16} {:>12}{}",
            if stats.key == "dst" {
                "destination"
            } else {
                "source"
            },
            "passed pkts",
            "passed bytes",
            "dropped pkts",
            "dropped bytes",
            "would drop",
            yellow(format!(" {:>12}", "yellow pkts"))
        );
    }
    for s in &stats.top_sources {
        let o = &s.outcomes.counts;
        println!(
            "  {:<24} {:>12} {:>16} {:>12} {:>16} {:>12}{}",
            s.source,
            o.passed_packets,
            o.passed_bytes,
            o.dropped_packets,
            o.dropped_bytes,
            o.would_drop_packets,
            yellow(format!(" {:>12}", s.colours.yellow_packets))
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct SubscriberStats<'a> {
    interface: &'a str,
    netns: Option<&'a str>,
    direction: &'static str,
    subscriber: &'a str,
    #[serde(flatten)]
    outcomes: OutcomeFields,
    #[serde(flatten)]
    colours: Colours,
}

/// `stats --subscriber ID`: one subscriber's counters.
fn subscriber(at: &Attachment, id: &str, json: bool) -> Result<()> {
    let c = SubscriberTable::of(&Pinned::open(at)?)?.counts(id)?;
    let stats = SubscriberStats {
        interface: &at.iface,
        netns: at.netns.as_deref(),
        direction: at.direction.name(),
        subscriber: id,
        outcomes: OutcomeFields::new(c.outcomes),
        colours: Colours::new(&[&c.outcomes], c.yellow),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let (o, k) = (&c.outcomes, &stats.colours);
    println!("{} subscriber {id}:", at.label());
    for (what, packets, bytes, note) in [
        ("passed", o.passed_packets, o.passed_bytes, ""),
        ("dropped", o.dropped_packets, o.dropped_bytes, ""),
        (
            "would drop",
            o.would_drop_packets,
            o.would_drop_bytes,
            " (monitor: passed)",
        ),
        (
            "green",
            k.green_packets,
            k.green_bytes,
            " (passed unmarked)",
        ),
        (
            "yellow",
            k.yellow_packets,
            k.yellow_bytes,
            " (passed marked by the excess rate)",
        ),
        ("red", k.red_packets, k.red_bytes, " (refused)"),
    ] {
        println!("  {what:<10} {packets:>12} pkts {bytes:>16} bytes{note}");
    }
    Ok(())
}
