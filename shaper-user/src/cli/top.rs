//! `shaper top IFACE [--subscribers]`: the keys (or subscribers) of an attachment by their
//! current rate, in the manner of iftop: read the counters every second, show what changed
//! per second, sort with a key. Without a terminal, one snapshot (two reads a second
//! apart), as text or JSON.

use std::{
    io::IsTerminal as _,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use ratatui::{
    DefaultTerminal, Frame,
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Paragraph, Row, Table},
};
use serde::Serialize;
use shaper_common::maps::Config;
use shaper_user::{
    maps::KeyNet,
    pins::Attachment,
    request,
    sources::{self, Change, RowKey, Sample, SortKey, SourceRate, SourcesError, TotalRates},
};

use super::Scope;

/// Live view of IFACE's sources by current rate, passed and dropped per second (q quits;
/// r, p, d sort by rate, passed, dropped); without a terminal, one snapshot
///
/// In the manner of iftop: the counters are read every second, and each source is shown
/// with its current rate (all it sent: passed, dropped and would drop), passed and
/// dropped per second, marked (passed yellow by an excess rate, its DSCP rewritten: see
/// shaper-policy(8) --excess-rate), and its policy (default, or the prefix, as
/// shaper-policy(8) list names it), under the interface's totals per second. With -j,
/// each row and the totals also carry the colours: green (passed unmarked), yellow
/// (marked) and red (refused), in bits and packets per second. Without a terminal (stdout not a
/// tty) it prints one snapshot of two reads a second apart and exits; -j prints that
/// snapshot as JSON.
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    pub iface: String,
    /// The order of the rows at the start
    #[arg(long, value_enum, default_value_t = SortArg::Rate)]
    pub sort: SortArg,
    /// Rows of subscribers (shaper-subscriber(8)) instead of keys: each one's frames, over
    /// all of its prefixes, named by its plan's rate
    #[arg(long)]
    pub subscribers: bool,
}

const EXAMPLES: &str = "\
Examples:
  shaper top eth0
      Watch eth0's sources live, busiest first.
  shaper top eth0 --sort dropped | head -20
      One snapshot of the sources dropped most.
  shaper top eth0 --direction egress --subscribers
      The subscribers downloading most, live.
";

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SortArg {
    Rate,
    Passed,
    Dropped,
}

impl From<SortArg> for SortKey {
    fn from(s: SortArg) -> Self {
        match s {
            SortArg::Rate => Self::Rate,
            SortArg::Passed => Self::Passed,
            SortArg::Dropped => Self::Dropped,
        }
    }
}

/// How often the counters are read.
const INTERVAL: Duration = Duration::from_secs(1);

pub fn run(args: &Args, scope: Scope<'_>, json: bool) -> Result<()> {
    let at = scope.at(&args.iface);
    if !at.exists() {
        bail!("shaper is not attached to {}", at.label());
    }
    let sort = SortKey::from(args.sort);
    if args.subscribers {
        return view::<String>(&at, sort, json);
    }
    view::<KeyNet>(&at, sort, json)
}

/// What a row of `top` is: a key, or a subscriber (`--subscribers`).
trait Rows: RowKey {
    /// What a row holds, as its title and its JSON field call it.
    fn title(config: &Config) -> &'static str;
    /// The title of the second column: what the row is limited by.
    const POLICY: &'static str;
    /// The rows as the header counts them.
    const TRACKED: &'static str;
    const SUBSCRIBERS: bool;
    fn read(at: &Attachment) -> Result<Sample<Self>, SourcesError>;
}

impl Rows for KeyNet {
    fn title(config: &Config) -> &'static str {
        if request::key_name(config.key_by) == "dst" {
            "destination"
        } else {
            "source"
        }
    }
    const POLICY: &'static str = "policy";
    const TRACKED: &'static str = "keys tracked";
    const SUBSCRIBERS: bool = false;
    fn read(at: &Attachment) -> Result<Sample<Self>, SourcesError> {
        Sample::read(at)
    }
}

impl Rows for String {
    fn title(_: &Config) -> &'static str {
        "subscriber"
    }
    const POLICY: &'static str = "plan";
    const TRACKED: &'static str = "subscribers";
    const SUBSCRIBERS: bool = true;
    fn read(at: &Attachment) -> Result<Sample<Self>, SourcesError> {
        Sample::subscribers(at)
    }
}

/// The live view on a terminal, otherwise one snapshot.
fn view<K: Rows>(at: &Attachment, sort: SortKey, json: bool) -> Result<()> {
    if json || !std::io::stdout().is_terminal() {
        return snapshot::<K>(at, sort, json);
    }
    let first = K::read(at)?;
    let mut terminal = ratatui::init();
    let result = live(&mut terminal, at, first, sort);
    ratatui::restore();
    result
}

/// Two reads `INTERVAL` apart, printed once.
fn snapshot<K: Rows>(at: &Attachment, sort: SortKey, json: bool) -> Result<()> {
    let before = K::read(at)?;
    std::thread::sleep(INTERVAL);
    let after = K::read(at)?;
    let (totals, rows) = sources::rates(&before, &after, sort);
    if json {
        let mut top = Snapshot {
            interface: at.iface.clone(),
            netns: at.netns.clone(),
            direction: at.direction.name(),
            key: request::key_name(after.config.key_by),
            interval_secs: totals.metered.secs,
            sort: sort.name(),
            totals: TotalsJson {
                metered: Rates::from(&totals.metered),
                colours: ColourRates::from(&totals.all),
                unadmitted_rate_bits_per_sec: totals.unadmitted.rate_bits_per_sec(),
                unadmitted_passed_bits_per_sec: totals.unadmitted.passed_bits_per_sec(),
                unadmitted_dropped_bits_per_sec: totals.unadmitted.dropped_bits_per_sec(),
            },
            sources_tracked: (!K::SUBSCRIBERS).then_some(after.sources.len()),
            subscribers_tracked: K::SUBSCRIBERS.then_some(after.sources.len()),
            sources: None,
            subscribers: None,
        };
        let json_rows: Vec<SourceJson> = rows
            .iter()
            .map(|r| SourceJson {
                source: (!K::SUBSCRIBERS).then(|| r.key.to_string()),
                policy: (!K::SUBSCRIBERS).then(|| r.policy.clone()),
                subscriber: K::SUBSCRIBERS.then(|| r.key.to_string()),
                plan: K::SUBSCRIBERS.then(|| r.policy.clone()),
                rates: Rates::from(&r.change),
                colours: ColourRates::from(&r.change),
            })
            .collect();
        if K::SUBSCRIBERS {
            top.subscribers = Some(json_rows);
        } else {
            top.sources = Some(json_rows);
        }
        println!("{}", serde_json::to_string_pretty(&top)?);
        return Ok(());
    }
    for line in header(at, &after, &totals, sort) {
        println!("{line}");
    }
    println!("{}", columns(&after).join(" "));
    for r in &rows {
        println!("{}", cells(r).join(" "));
    }
    Ok(())
}

#[derive(Serialize)]
struct Snapshot {
    interface: String,
    netns: Option<String>,
    direction: &'static str,
    key: &'static str,
    interval_secs: f64,
    sort: &'static str,
    totals: TotalsJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    sources_tracked: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subscribers_tracked: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sources: Option<Vec<SourceJson>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subscribers: Option<Vec<SourceJson>>,
}

#[derive(Serialize)]
struct TotalsJson {
    #[serde(flatten)]
    metered: Rates,
    /// Unadmitted frames included.
    #[serde(flatten)]
    colours: ColourRates,
    unadmitted_rate_bits_per_sec: f64,
    unadmitted_passed_bits_per_sec: f64,
    unadmitted_dropped_bits_per_sec: f64,
}

#[derive(Serialize)]
struct SourceJson {
    /// The address, or `network/prefix` when keys are aggregated.
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    /// `default`, or the prefix of the policy, as `policy list` names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<String>,
    /// With --subscribers: the subscriber's id, and its plan's rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    subscriber: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<String>,
    #[serde(flatten)]
    rates: Rates,
    #[serde(flatten)]
    colours: ColourRates,
}

/// The frames by colour (`shaper_user::colour`): green passed unmarked, yellow passed
/// marked by an excess rate, red refused.
#[derive(Serialize)]
struct ColourRates {
    green_bits_per_sec: f64,
    green_packets_per_sec: f64,
    yellow_bits_per_sec: f64,
    yellow_packets_per_sec: f64,
    red_bits_per_sec: f64,
    red_packets_per_sec: f64,
}

impl From<&Change> for ColourRates {
    fn from(c: &Change) -> Self {
        Self {
            green_bits_per_sec: c.green_bits_per_sec(),
            green_packets_per_sec: c.green_packets_per_sec(),
            yellow_bits_per_sec: c.yellow_bits_per_sec(),
            yellow_packets_per_sec: c.yellow_packets_per_sec(),
            red_bits_per_sec: c.red_bits_per_sec(),
            red_packets_per_sec: c.red_packets_per_sec(),
        }
    }
}

#[derive(Serialize)]
struct Rates {
    rate_bits_per_sec: f64,
    passed_bits_per_sec: f64,
    passed_packets_per_sec: f64,
    dropped_bits_per_sec: f64,
    dropped_packets_per_sec: f64,
    would_drop_bits_per_sec: f64,
    would_drop_packets_per_sec: f64,
}

impl From<&Change> for Rates {
    fn from(c: &Change) -> Self {
        Self {
            rate_bits_per_sec: c.rate_bits_per_sec(),
            passed_bits_per_sec: c.passed_bits_per_sec(),
            passed_packets_per_sec: c.passed_packets_per_sec(),
            dropped_bits_per_sec: c.dropped_bits_per_sec(),
            dropped_packets_per_sec: c.dropped_packets_per_sec(),
            would_drop_bits_per_sec: c.would_drop_bits_per_sec(),
            would_drop_packets_per_sec: c.would_drop_packets_per_sec(),
        }
    }
}

/// `12.34 Mbit/s`: bits per second in the largest SI unit below the value.
fn bits(v: f64) -> String {
    let (div, unit) = [(1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")]
        .into_iter()
        .find(|(d, _)| v >= *d)
        .unwrap_or((1.0, "bit/s"));
    format!("{:.2} {unit}", v / div)
}

/// Frames per second, whole.
fn pps(v: f64) -> String {
    format!("{v:.0}/s")
}

/// The lines above the rows: the interface and the sort key, then its totals per second.
fn header<K: Rows>(at: &Attachment, s: &Sample<K>, t: &TotalRates, sort: SortKey) -> [String; 2] {
    let m = &t.metered;
    let mut totals = format!(
        "rate {}  passed {} ({})  dropped {} ({})",
        bits(m.rate_bits_per_sec()),
        bits(m.passed_bits_per_sec()),
        pps(m.passed_packets_per_sec()),
        bits(m.dropped_bits_per_sec()),
        pps(m.dropped_packets_per_sec()),
    );
    if m.counts.would_drop_packets != 0 {
        totals += &format!("  would drop {}", bits(m.would_drop_bits_per_sec()));
    }
    if t.unadmitted.counts.packets() != 0 {
        totals += &format!("  unadmitted {}", bits(t.unadmitted.rate_bits_per_sec()));
    }
    if t.all.yellow.0 != 0 {
        totals += &format!(
            "  marked {} ({})",
            bits(t.all.yellow_bits_per_sec()),
            pps(t.all.yellow_packets_per_sec())
        );
    }
    [
        format!(
            "{} {}: {} {}, sorted by {}",
            at.label(),
            at.direction.name(),
            s.sources.len(),
            K::TRACKED,
            sort.name()
        ),
        totals,
    ]
}

const WIDTHS: [usize; 8] = [24, 20, 14, 14, 10, 14, 10, 14];

/// The column titles.
fn columns<K: Rows>(s: &Sample<K>) -> Vec<String> {
    [
        K::title(&s.config),
        K::POLICY,
        "rate",
        "passed",
        "pkts",
        "dropped",
        "pkts",
        "marked",
    ]
    .iter()
    .zip(WIDTHS)
    .enumerate()
    .map(|(i, (t, w))| pad(i, t, w))
    .collect()
}

/// One row's cells.
fn cells<K: Rows>(r: &SourceRate<K>) -> Vec<String> {
    let c = &r.change;
    let dropped = c.dropped_bits_per_sec() + c.would_drop_bits_per_sec();
    let dropped_pps = c.dropped_packets_per_sec() + c.would_drop_packets_per_sec();
    [
        r.key.to_string(),
        r.policy.clone(),
        bits(c.rate_bits_per_sec()),
        bits(c.passed_bits_per_sec()),
        pps(c.passed_packets_per_sec()),
        bits(dropped),
        pps(dropped_pps),
        bits(c.yellow_bits_per_sec()),
    ]
    .iter()
    .zip(WIDTHS)
    .enumerate()
    .map(|(i, (t, w))| pad(i, t, w))
    .collect()
}

/// Text columns (the first two) left, numbers right.
fn pad(i: usize, t: &str, w: usize) -> String {
    if i < 2 {
        format!("{t:<w$}")
    } else {
        format!("{t:>w$}")
    }
}

/// The live view: a read every `INTERVAL`, keys between.
fn live<K: Rows>(
    terminal: &mut DefaultTerminal,
    at: &Attachment,
    first: Sample<K>,
    mut sort: SortKey,
) -> Result<()> {
    let mut before = first;
    let mut view: Option<View<K>> = None;
    let mut next = Instant::now() + INTERVAL;
    loop {
        terminal.draw(|f| draw(f, at, &before, view.as_ref(), sort))?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()?
                && k.kind == KeyEventKind::Press
            {
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(());
                    }
                    KeyCode::Char('r') => sort = SortKey::Rate,
                    KeyCode::Char('p') => sort = SortKey::Passed,
                    KeyCode::Char('d') => sort = SortKey::Dropped,
                    _ => {}
                }
                if let Some((_, _, rows)) = view.as_mut() {
                    sources::sort(rows, sort);
                }
            }
            continue;
        }
        let after = K::read(at)?;
        let (totals, rows) = sources::rates(&before, &after, sort);
        before = after.clone();
        view = Some((after, totals, rows));
        next = Instant::now() + INTERVAL;
    }
}

/// What the live view shows: the last read, and the rates since the one before.
type View<K> = (Sample<K>, TotalRates, Vec<SourceRate<K>>);

fn draw<K: Rows>(
    f: &mut Frame<'_>,
    at: &Attachment,
    first: &Sample<K>,
    view: Option<&View<K>>,
    sort: SortKey,
) {
    let [top, body, help] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(
        Paragraph::new(Line::from(
            "shaper top: q quit, r sort by rate, p by passed, d by dropped",
        ))
        .style(Style::new().add_modifier(Modifier::DIM)),
        help,
    );
    let Some((sample, totals, rows)) = view else {
        f.render_widget(
            Paragraph::new(format!(
                "{}: {} {}; measuring rates over {} s...",
                at.label(),
                first.sources.len(),
                K::TRACKED,
                INTERVAL.as_secs()
            )),
            top,
        );
        return;
    };
    f.render_widget(
        Paragraph::new(header(at, sample, totals, sort).map(Line::from).to_vec())
            .style(Style::new().add_modifier(Modifier::BOLD)),
        top,
    );
    let widths = WIDTHS.map(|w| Constraint::Length(w as u16));
    let table = Table::new(rows.iter().map(|r| Row::new(cells(r))), widths)
        .header(Row::new(columns(sample)).style(Style::new().add_modifier(Modifier::REVERSED)))
        .block(Block::new());
    f.render_widget(table, body);
}
