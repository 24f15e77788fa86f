//! `shaper apply -f FILE.toml [--check]`: make the interfaces a file names look as it says.

use std::{
    io::IsTerminal as _,
    path::{Path, PathBuf},
};

use super::{Scope, subscriber::Progress};
use anyhow::Result;
use serde::Serialize;
use shaper_user::{
    apply::{self, Applied},
    attach::Attached,
    config_file,
    pins::Direction,
    policy::PolicySet,
    request::AttachRequest,
    subscriber::Summary,
};

/// Set interfaces, their default rates and their prefix policies from a TOML file, as one
/// all-or-nothing change (see `shaper config show` for the format)
///
/// Each interface the file names is made to look as the file says: attached if needed
/// (as shaper-attach(8) would), its default rate, mode and settings set, and the file's
/// policies made its policies (any others removed). What the file leaves out is the
/// default, not what was there: the file is the whole truth for the interfaces it
/// names. Interfaces it does not name are left alone, never detached.
///
/// One change: the whole file is checked first, every error naming the file, the line
/// and the field (isp.toml:12: interface[0].policy[0].rate: ...); if an interface fails
/// part way, the ones already changed are put back. An [[interface]] takes name, rate,
/// burst, and optionally direction, hook, tc_mode, xdp_mode, mode, key, prefix_v4,
/// prefix_v6, max_sources, max_policies, new_sources, new_sources_burst, ecn_threshold, horizon,
/// excess_rate, excess_burst, excess_dscp, packet_rate and packet_burst, each as attach's
/// flag of that name; an [[interface.policy]] takes prefix, action, rate, burst,
/// aggregate_rate, aggregate_burst, mode, new_sources, new_sources_burst, excess_rate,
/// excess_burst, excess_dscp, packet_rate and packet_burst, as shaper-policy(8) set's
/// flags (excess_rate = "10mbit", excess_dscp = "cs1" or 8, packet_rate = "20k" or
/// 20000). shaper-config(8) show prints a running interface as such a file.
///
/// Subscribers: a top-level [plan.NAME] takes rate, burst, per_address_rate,
/// per_address_burst, excess_rate, excess_burst, excess_dscp and mode, as
/// shaper-subscriber(8) set's flags; an [[interface.subscriber]] takes id, name, prefixes
/// (a list) and plan = "NAME", or the plan's fields inline; an [interface.libreqos] takes
/// file (a ShapedDevices.csv, relative to the configuration file), committed_from_min,
/// excess_dscp and burst_time, as subscriber import's flags; an interface takes
/// max_subscribers and prune_subscribers. Only the subscribers that differ from those in
/// force are written (one plan changed: that subscriber alone); those not in the file stay
/// unless prune_subscribers = true. Every subscriber is checked (its plan, its prefixes,
/// overlaps with the file's policies and other subscribers) before anything is written.
/// On a terminal, an apply that takes more than a second shows its progress on stderr;
/// with -j, one JSON array of what was done to each interface (subscribers counted added,
/// changed, unchanged, removed).
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    /// The configuration file
    #[arg(short = 'f', long = "file", value_name = "FILE.toml")]
    pub file: PathBuf,
    /// Only check the file (syntax, values, policies); touch nothing, need no privileges
    #[arg(long)]
    pub check: bool,
}

const EXAMPLES: &str = "\
Examples:
  shaper apply --check -f /etc/shaper/shaper.toml
      Check the file alone: no privileges needed, nothing touched.
  shaper apply -f /etc/shaper/shaper.toml
      Make every interface it names look as it says, or change nothing.
  shaper config show eth1 > eth1.toml && shaper apply -f eth1.toml
      A round trip: the running configuration, applied back, changes nothing.
  shaper apply -f examples/profile.toml
      A bandwidth profile per address: 10 Mbit/s unmarked, 10 Mbit/s more marked CS1.
  shaper -j apply -f examples/isp.toml
      With a subscriber: what was done to each interface, its subscribers counted, as JSON.
";

/// Reads and checks the file; the error names its line and field.
pub fn read(file: &Path, direction: Direction) -> Result<Vec<AttachRequest>> {
    let name = file.display().to_string();
    let text = config_file::read(file)?;
    Ok(config_file::parse(&name, &text, direction)?)
}

/// What was done to one interface, in a word: attached, updated, unchanged, upgraded,
/// relinked (deleted and made again: linked again over its pins).
pub fn outcome(applied: &Applied) -> &'static str {
    match applied.outcome {
        Attached::New { .. } => "attached",
        Attached::Relinked { .. } => "relinked",
        Attached::Updated { grown: Some(_), .. } => "updated",
        Attached::Updated { .. } if applied.changed => "updated",
        Attached::Updated { .. } => "unchanged",
        Attached::Upgraded { .. } => "upgraded",
    }
}

/// "1 policy", "3 policies".
pub fn policies(n: usize) -> String {
    format!("{n} polic{}", if n == 1 { "y" } else { "ies" })
}

/// `--check`: the file alone, before any privilege or namespace is needed.
pub fn check(args: &Args, direction: Direction) -> Result<()> {
    let desired = read(&args.file, direction)?;
    let policies: usize = desired
        .iter()
        .map(|d| d.policies.as_ref().map_or(0, PolicySet::len))
        .sum();
    let subscribers: usize = desired
        .iter()
        .map(|d| d.subscribers.as_ref().map_or(0, |s| s.specs.len()))
        .sum();
    println!(
        "{}: valid: {} interface{}, {policies} polic{}{}",
        args.file.display(),
        desired.len(),
        if desired.len() == 1 { "" } else { "s" },
        if policies == 1 { "y" } else { "ies" },
        match subscribers {
            0 => String::new(),
            1 => ", 1 subscriber".to_owned(),
            n => format!(", {n} subscribers"),
        },
    );
    Ok(())
}

/// ", subscribers: 1 added, 2 changed, 999997 unchanged, 0 removed", or nothing where the
/// file gives the interface none.
pub fn subscribers(summary: Option<&Summary>) -> String {
    summary.map_or(String::new(), |s| {
        format!(
            ", subscribers: {} added, {} changed, {} unchanged, {} removed",
            s.added, s.changed, s.unchanged, s.removed
        )
    })
}

/// One interface of `apply -j`'s array.
#[derive(Serialize)]
struct JsonApplied<'a> {
    interface: &'a str,
    outcome: &'static str,
    policies: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    subscribers: Option<Summary>,
}

pub fn run(args: &Args, scope: Scope<'_>, json: bool) -> Result<()> {
    let name = args.file.display().to_string();
    let text = config_file::read(&args.file)?;
    // A LibreQoS file read as far as it changed since the last apply, if it can be;
    // otherwise whole.
    let desired = config_file::parse_deferring(&name, &text, scope.direction)?;
    let mut progress = Progress::new(!json && std::io::stderr().is_terminal());
    let mut show = |done, total| progress.show(done, total);
    let applied = match apply::apply(&desired, scope.netns, &mut show) {
        Err(apply::ApplyError::Reread(_)) => {
            let desired = config_file::parse(&name, &text, scope.direction)?;
            apply::apply(&desired, scope.netns, &mut show)?
        }
        other => other?,
    };
    progress.finish();
    if json {
        let rows: Vec<JsonApplied> = applied
            .iter()
            .map(|one| JsonApplied {
                interface: &one.iface,
                outcome: outcome(one),
                policies: one.policies,
                subscribers: one.subscribers,
            })
            .collect();
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    for one in &applied {
        println!(
            "{}: {}, {}{}",
            one.iface,
            outcome(one),
            policies(one.policies),
            subscribers(one.subscribers.as_ref())
        );
    }
    Ok(())
}
