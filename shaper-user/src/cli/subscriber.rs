//! `shaper subscriber set|del|list|show IFACE ...`: subscribers on an attachment.

use super::Scope;
use anyhow::{Result, anyhow, bail};
use serde::Serialize;
use shaper_common::{config::Meter2Limits, dscp::Dscp, maps::Meter2};
use shaper_user::subscriber::plan::PlanParts;
use std::io::IsTerminal as _;

use shaper_user::{
    change, import, libreqos,
    maps::Pinned,
    pins::Attachment,
    policy::{Mode, parse_prefix},
    subscriber::{Changed, Installed, SubscriberTable},
    units::{Delay, Packets, Rate, Size},
};

pub use shaper_user::subscriber::SubscriberSpec;

use super::{attach::check_burst_fits, meter2, outcomes::OutcomeFields};

/// Subscribers: one bucket for all of a customer's prefixes
///
/// A subscriber is an id, an optional name, prefixes of either family (an IPv4 address, an
/// IPv6 delegated prefix, ...) and a plan: every frame of any of its prefixes, in the
/// attachment's direction, draws from one bucket of the subscriber's (--rate, --burst),
/// exact across CPUs; each address (each key: a /64 in IPv6 by default) may also be held to
/// a limit of its own inside it (--per-address-rate, --per-address-burst; without them,
/// the subscriber's). The upload plan is the ingress attachment's (keyed by source), the
/// download plan the egress one's (--direction egress, keyed by destination): set the
/// subscriber on each.
///
/// A subscriber's prefix inside a prefix policy takes its traffic from the policy (the
/// longest prefix wins). A prefix policy or another subscriber's prefix inside a
/// subscriber's prefix, or the same prefix twice, is refused: its traffic would escape the
/// subscriber's bucket. Room for subscribers is set at attach (--max-subscribers).
#[derive(Debug, clap::Subcommand)]
#[command(after_long_help = EXAMPLES)]
pub enum Command {
    Set(SetArgs),
    Del(DelArgs),
    List(ListArgs),
    Show(ShowArgs),
    Import(ImportArgs),
}

const EXAMPLES: &str = "\
Examples:
  shaper attach eth0 --rate 1gbit --burst 1m --max-subscribers 100000
      Room for 100,000 subscribers on eth0's uploads.
  shaper subscriber set eth0 c1042 --name 'Smith' --prefix 100.64.0.14 --prefix fdd7:b724:0:100::/56 --rate 20mbit --burst 256k
      Both prefixes share one 20 Mbit/s bucket.
  shaper subscriber list eth0
      Every subscriber with its counters.
  shaper subscriber import eth0 --from libreqos ShapedDevices.csv
      Every circuit of a LibreQoS file as a subscriber (the upload rates on eth0's ingress).
";

/// Add subscriber ID, or replace it: its prefixes and plan
///
/// Writes that subscriber alone. A new plan keeps its bucket (the backlog is carried over
/// to the new rate, never refilled); prefixes added or removed take effect on each key's
/// next frame. --packet-rate is the subscriber's, all its prefixes together, in the bucket
/// an excess rate would use (a plan has one or the other). --mode shape holds the
/// subscriber's frames back in its one bucket's schedule instead of dropping them (ECN
/// marked past the attachment's threshold, dropped past its horizon): on an egress tc
/// attachment with sch_fq, without a per-address limit, excess rate or packet rate.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper subscriber set eth0 c1042 --prefix 100.64.0.14 --prefix fdd7:b724:0:100::/56 --rate 20mbit --burst 256k
      A dual-stack subscriber, 20 Mbit/s over both families.
  shaper subscriber set eth0 c1042 --prefix 100.64.0.14 --prefix fdd7:b724:0:100::/56 --rate 50mbit --burst 512k
      An upgrade of its plan, without a refill.
  shaper --direction egress subscriber set eth0 c1042 --prefix 100.64.0.14 --rate 100mbit --burst 1m --per-address-rate 50mbit --per-address-burst 512k
      Its downloads: 100 Mbit/s in all, 50 Mbit/s to any one address.
  shaper subscriber set eth0 b2077 --prefix 198.51.100.0/29 --prefix 2001:db8:2077::/48 --rate 50mbit --burst 512k --excess-rate 50mbit --excess-burst 512k --excess-dscp af11
      A business circuit: 50 Mbit/s committed, up to 100 Mbit/s with the excess marked AF11.
  shaper subscriber set eth0 c1042 --prefix 100.64.0.14 --prefix fdd7:b724:0:100::/56 --rate 20mbit --burst 256k --packet-rate 20k --packet-burst 2000
      At most 20,000 frames a second too, over both prefixes together (not with --excess-rate).
  shaper --direction egress subscriber set eth0 c1042 --prefix 100.64.0.14 --prefix fdd7:b724:0:100::/56 --rate 100mbit --burst 1m --mode shape
      Its downloads held back to 100 Mbit/s in one schedule, not dropped (tc egress, sch_fq on
      eth0; no --per-address-rate, --excess-rate or --packet-rate).
")]
pub struct SetArgs {
    pub iface: String,
    /// Its id: 1 to 32 letters, digits and . _ - : /
    pub id: String,
    /// A name for people, at most 24 bytes
    #[arg(long, default_value = "")]
    pub name: String,
    /// One of its prefixes (an address is a /32 or /128); give it once a prefix
    #[arg(long = "prefix", required = true)]
    pub prefixes: Vec<String>,
    /// The subscriber's rate: all its prefixes together, in tc units
    #[arg(long)]
    pub rate: Rate,
    /// The subscriber's burst, in tc units
    #[arg(long)]
    pub burst: Size,
    /// Each address's (key's) rate inside the subscriber's [default: --rate, plus
    /// --excess-rate]
    #[arg(long, requires = "per_address_burst")]
    pub per_address_rate: Option<Rate>,
    /// Each address's (key's) burst [default: --burst, plus --excess-burst]
    #[arg(long, requires = "per_address_rate")]
    pub per_address_burst: Option<Size>,
    /// The excess (peak) rate over --rate, in tc units: the subscriber's frames over
    /// --rate and --burst but within this pass, marked with --excess-dscp (a committed
    /// and a peak rate: --rate is the committed one, --rate plus this the peak)
    #[arg(long, value_name = "RATE", requires = "excess_burst")]
    pub excess_rate: Option<Rate>,
    /// The excess burst, in tc units
    #[arg(long, value_name = "SIZE", requires = "excess_rate")]
    pub excess_burst: Option<Size>,
    /// The DSCP written into frames the excess rate passes, ECN bits kept: a name (cs0..cs7,
    /// af11..af43, ef, le) or 0-63 [default: le, RFC 8622's Lower Effort]
    #[arg(long, value_name = "DSCP", requires = "excess_rate")]
    pub excess_dscp: Option<Dscp>,
    /// Frames a second for the subscriber, all its prefixes together, whatever their size
    /// (20000, 20k): a frame passes only if this and the byte rate both allow it
    #[arg(long, value_name = "N", requires = "packet_burst")]
    pub packet_rate: Option<Packets>,
    /// Frames at once for the subscriber, beside --packet-rate
    #[arg(long, value_name = "N", requires = "packet_rate")]
    pub packet_burst: Option<Packets>,
    /// monitor: drop nothing, count what would be dropped; shape (--direction egress,
    /// tc, sch_fq on the device): hold the subscriber's frames back to its rate instead of
    /// dropping them, mark ECN past the attachment's threshold, drop past its horizon
    #[arg(long, value_enum, default_value_t = Mode::Enforce)]
    pub mode: Mode,
}

/// Remove subscriber ID; its prefixes fall back to the policies that cover them, or the
/// default
///
/// Its routes go first (its keys resolve again on their next frame), then its entry and
/// its bucket, then its plan if no other subscriber has it.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper subscriber del eth0 c1042
      Its addresses fall back to the default rate.
")]
pub struct DelArgs {
    pub iface: String,
    pub id: String,
}

/// List the subscribers with their plans and counters
///
/// Each subscriber's id, name, prefixes, rate and burst (and per-address ones), and what
/// its frames became: passed, dropped and would drop, packets and bytes. With -j, JSON
/// whose keys carry their unit.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper subscriber list eth0
      The subscribers of eth0's uploads.
  shaper -j --direction egress subscriber list eth0
      Those of its downloads, as JSON.
")]
pub struct ListArgs {
    pub iface: String,
}

/// Show one subscriber with its plan and counters
///
/// Its id, name, prefixes, rate and burst (and per-address ones), and what its frames
/// became. With -j, one JSON object, as a row of `subscriber list`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper subscriber show eth0 c1042
      Its prefixes, plan and counters.
")]
pub struct ShowArgs {
    pub iface: String,
    pub id: String,
}

/// Set every subscriber of a file (LibreQoS's ShapedDevices.csv), writing only those that
/// changed
///
/// Each circuit (the rows of one Circuit ID) is one subscriber: its IPv4 and IPv6 prefixes,
/// its Circuit Name, and a plan of the direction's rates: on the ingress attachment (the
/// default) the Upload columns, with --direction egress the Download ones. Max Mbps is the
/// rate; with --committed-from-min, Min Mbps is the committed rate and Max - Min the excess
/// rate, marked (--excess-dscp), not dropped. The file has no burst: each lasts --burst-time
/// at its rate, at least 16k. Names are cut to 24 bytes.
///
/// Every row is checked before anything is written: an error names the line and the column,
/// and nothing is applied. Then one change (one lock, one journal) writes the subscribers
/// that differ from those in force, and leaves the rest untouched (no refill). Subscribers
/// not in the file stay, unless --prune. On a terminal, an import over a second shows its
/// progress on stderr; with -j, one JSON object of counts.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper subscriber import eth0 --from libreqos ShapedDevices.csv
      The upload plans of every circuit, on eth0's ingress.
  shaper --direction egress subscriber import eth0 --from libreqos ShapedDevices.csv
      The download plans, on its egress.
  shaper subscriber import eth0 --from libreqos --committed-from-min --prune ShapedDevices.csv
      Min as committed and Max - Min marked; subscribers not in the file removed.
")]
pub struct ImportArgs {
    pub iface: String,
    /// The file's format
    #[arg(long, value_enum)]
    pub from: Format,
    pub file: std::path::PathBuf,
    /// Min Mbps as the committed rate, Max - Min as the excess rate (marked)
    #[arg(long)]
    pub committed_from_min: bool,
    /// The excess rate's mark with --committed-from-min: a name (le, cs1, af11, ...) or 0-63
    #[arg(long, default_value = "le")]
    pub excess_dscp: Dscp,
    /// How long each burst lasts at its rate, in tc time units
    #[arg(long, default_value = "20ms")]
    pub burst_time: Delay,
    /// Remove the subscribers that are not in the file
    #[arg(long)]
    pub prune: bool,
}

/// The formats `import` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// LibreQoS's ShapedDevices.csv
    Libreqos,
}

pub fn run(command: &Command, scope: Scope<'_>, json: bool) -> Result<()> {
    match command {
        Command::Import(args) => import(args, scope, json),
        Command::Set(args) => set(args, scope),
        Command::Del(args) => del(args, scope),
        Command::List(args) => show(&args.iface, None, scope, json),
        Command::Show(args) => show(&args.iface, Some(&args.id), scope, json),
    }
}

/// The subscriber `set` asks for.
fn spec(args: &SetArgs) -> Result<SubscriberSpec> {
    let prefixes = args
        .prefixes
        .iter()
        .map(|p| parse_prefix(p))
        .collect::<Result<Vec<_>, _>>()?;
    check_burst_fits("--burst", args.burst, &args.iface)?;
    if let Some(b) = args.per_address_burst {
        check_burst_fits("--per-address-burst", b, &args.iface)?;
    }
    let plan = PlanParts {
        rate_bps: args.rate.bits_per_sec(),
        burst_bytes: args.burst.bytes(),
        per_address: args
            .per_address_rate
            .zip(args.per_address_burst)
            .map(|(r, b)| (r.bits_per_sec(), b.bytes())),
        excess: excess(args)?,
        mode: args.mode.value(),
    };
    Ok(SubscriberSpec {
        id: args.id.clone(),
        name: args.name.clone(),
        prefixes,
        plan: plan.limits(),
    })
}

/// The subscriber's excess rate and packet rate, checked; all zero without their flags.
fn excess(args: &SetArgs) -> Result<Meter2Limits> {
    let mut limits = Meter2Limits::default();
    if let Some((rate, burst)) = args.excess_rate.zip(args.excess_burst) {
        check_burst_fits("--excess-burst", burst, &args.iface)?;
        limits = Meter2Limits {
            excess_rate_bps: rate.bits_per_sec(),
            excess_burst_bytes: burst.bytes(),
            excess_dscp: args.excess_dscp.unwrap_or(Dscp::LE).value(),
            ..limits
        };
        Meter2::new(&limits)
            .map_err(|e| anyhow!("invalid --excess-rate {rate} / --excess-burst {burst}: {e}"))?;
    }
    if let Some((rate, burst)) = args.packet_rate.zip(args.packet_burst) {
        let packets = Meter2Limits {
            packet_rate: rate.count(),
            packet_burst: burst.count(),
            ..Meter2Limits::default()
        };
        Meter2::new(&packets)
            .map_err(|e| anyhow!("invalid --packet-rate {rate} / --packet-burst {burst}: {e}"))?;
        limits.packet_rate = packets.packet_rate;
        limits.packet_burst = packets.packet_burst;
    }
    Ok(limits)
}

fn set(args: &SetArgs, scope: Scope<'_>) -> Result<()> {
    let spec = spec(args)?;
    let at = scope.at(&args.iface);
    let what = match change::set_subscriber(&at, &spec)? {
        Changed::Added => "added",
        Changed::Changed => "changed",
        _ => "unchanged",
    };
    println!(
        "{what} subscriber {} on {}: {}",
        spec.id,
        at.label(),
        describe(&spec)
    );
    Ok(())
}

/// The subscribers of `args.file`, every row checked: errors name the file, line and column.
fn read_file(args: &ImportArgs, scope: Scope<'_>) -> Result<Vec<SubscriberSpec>> {
    let shown = args.file.display();
    let file = std::fs::File::open(&args.file).map_err(|e| anyhow!("cannot open {shown}: {e}"))?;
    let circuits =
        libreqos::read(std::io::BufReader::new(file)).map_err(|e| anyhow!("{shown} {e}"))?;
    let plan = import::Plan {
        direction: scope.direction,
        committed_from_min: args.committed_from_min,
        burst_ns: args.burst_time.ns(),
        excess_dscp: args.excess_dscp.value(),
    };
    if plan.burst_ns == 0 {
        bail!("invalid --burst-time 0: a burst must last");
    }
    import::subscribers(circuits, &plan).map_err(|e| anyhow!("{shown} {e}"))
}

fn import(args: &ImportArgs, scope: Scope<'_>, json: bool) -> Result<()> {
    let specs = read_file(args, scope)?;
    if let Some(smallest) = specs.iter().map(|s| s.plan.aggregate_burst_bytes).min() {
        check_burst_fits("--burst-time", Size::from_bytes(smallest), &args.iface)?;
    }
    let at = scope.at(&args.iface);
    let mut progress = Progress::new(!json && std::io::stderr().is_terminal());
    let summary = change::set_subscribers(&at, &specs, args.prune, &mut |done, total| {
        progress.show(done, total);
    })?;
    progress.finish();
    if json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    println!(
        "imported {} into {}: {} added, {} changed, {} unchanged, {} removed",
        args.file.display(),
        at.label(),
        summary.added,
        summary.changed,
        summary.unchanged,
        summary.removed
    );
    Ok(())
}

/// `written 120000/1000000 subscribers` on stderr, rewritten in place, once the change has
/// taken a second; nothing where `shown` is false (a script, -j).
pub struct Progress {
    shown: bool,
    start: std::time::Instant,
    printed: bool,
}

impl Progress {
    pub fn new(shown: bool) -> Self {
        Self {
            shown,
            start: std::time::Instant::now(),
            printed: false,
        }
    }

    pub fn show(&mut self, done: usize, total: usize) {
        if self.shown && self.start.elapsed() >= std::time::Duration::from_secs(1) {
            eprint!("\rwritten {done}/{total} subscribers");
            self.printed = true;
        }
    }

    pub fn finish(&mut self) {
        if self.printed {
            eprintln!();
        }
    }
}

fn del(args: &DelArgs, scope: Scope<'_>) -> Result<()> {
    let at = scope.at(&args.iface);
    change::del_subscriber(&at, &args.id)?;
    println!("removed subscriber {} from {}", args.id, at.label());
    Ok(())
}

/// `100.64.0.14/32 fdd7:b724:0:100::/56, 20mbit burst 256k (per address 10mbit burst
/// 64k)`, with ` (monitor)` when dry-running.
pub fn describe(spec: &SubscriberSpec) -> String {
    let p = &spec.plan;
    let prefixes: Vec<String> = spec.prefixes.iter().map(ToString::to_string).collect();
    let mut text = format!(
        "{}, {} burst {}",
        prefixes.join(" "),
        Rate::from_bps(p.aggregate_rate_bps),
        Size::from_bytes(p.aggregate_burst_bytes)
    );
    if (p.rate_bps, p.burst_bytes) != (p.aggregate_rate_bps, p.aggregate_burst_bytes) {
        text += &format!(
            " (per address {} burst {})",
            Rate::from_bps(p.rate_bps),
            Size::from_bytes(p.burst_bytes)
        );
    }
    text += &meter2::describe(&p.meter2);
    match Mode::from_value(p.mode) {
        Mode::Monitor => text += " (monitor)",
        Mode::Shape => text += " (shape)",
        _ => {}
    }
    text
}

#[derive(Debug, Serialize)]
struct Row {
    id: String,
    name: String,
    prefixes: Vec<String>,
    mode: &'static str,
    rate_bps: u64,
    burst_bytes: u64,
    per_address_rate_bps: u64,
    per_address_burst_bytes: u64,
    /// The excess (peak) rate over `rate_bps` (0: none), its burst and DSCP.
    excess_rate_bps: u64,
    excess_burst_bytes: u64,
    excess_dscp: u8,
    /// The packet rate (frames a second, 0: none) and its burst (frames).
    packet_rate: u64,
    packet_burst: u64,
    #[serde(flatten)]
    outcomes: OutcomeFields,
    /// Of the passed frames, those the excess rate passed, marked.
    yellow_packets: u64,
    yellow_bytes: u64,
}

fn row(s: &Installed) -> Row {
    let p = &s.spec.plan;
    Row {
        id: s.spec.id.clone(),
        name: s.spec.name.clone(),
        prefixes: s.spec.prefixes.iter().map(ToString::to_string).collect(),
        mode: Mode::from_value(p.mode).name(),
        rate_bps: p.aggregate_rate_bps,
        burst_bytes: p.aggregate_burst_bytes,
        per_address_rate_bps: p.rate_bps,
        per_address_burst_bytes: p.burst_bytes,
        excess_rate_bps: p.meter2.excess_rate_bps,
        excess_burst_bytes: p.meter2.excess_burst_bytes,
        excess_dscp: p.meter2.excess_dscp,
        packet_rate: p.meter2.packet_rate,
        packet_burst: p.meter2.packet_burst,
        outcomes: OutcomeFields::new(s.outcomes),
        yellow_packets: s.yellow.0,
        yellow_bytes: s.yellow.1,
    }
}

/// The subscribers of `at` (every one, or `id`), read from its pins.
fn installed(at: &Attachment, id: Option<&str>) -> Result<Vec<Installed>> {
    if !at.exists() {
        bail!("shaper is not attached to {}", at.label());
    }
    let table = SubscriberTable::of(&Pinned::open(at)?)?;
    Ok(match id {
        Some(id) => vec![table.get(id)?],
        None => table.list()?,
    })
}

/// What `-j` prints of `list` (an array of rows) or `show` (subscriber `id`'s row): the
/// daemon's API answers the same.
pub fn json(at: &Attachment, id: Option<&str>) -> Result<String> {
    let rows: Vec<Row> = installed(at, id)?.iter().map(row).collect();
    Ok(match id {
        Some(_) => serde_json::to_string(&rows[0])?,
        None => serde_json::to_string(&rows)?,
    })
}

/// `list` (every subscriber) and `show` (subscriber `id`).
fn show(iface: &str, id: Option<&str>, scope: Scope<'_>, json: bool) -> Result<()> {
    let at = scope.at(iface);
    if json {
        println!("{}", self::json(&at, id)?);
        return Ok(());
    }
    let found = installed(&at, id)?;
    let rows: Vec<Row> = found.iter().map(row).collect();
    for (s, r) in found.iter().zip(&rows) {
        let name = if r.name.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.name)
        };
        println!("{}{name}: {}", r.id, describe(&s.spec));
        let o = &s.outcomes;
        println!(
            "  passed {} packets {} bytes (marked {} packets {} bytes), dropped {} packets {} bytes, would drop {} packets {} bytes",
            o.passed_packets,
            o.passed_bytes,
            s.yellow.0,
            s.yellow.1,
            o.dropped_packets,
            o.dropped_bytes,
            o.would_drop_packets,
            o.would_drop_bytes
        );
    }
    Ok(())
}
