//! `shaper apply -f FILE.toml [--check]`: make the interfaces a file names look as it says.

use std::path::{Path, PathBuf};

use super::Scope;
use anyhow::Result;
use shaper_user::{
    apply::{self, Applied},
    attach::Attached,
    config_file,
    pins::Direction,
    policy::PolicySet,
    request::AttachRequest,
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
/// prefix_v6, max_sources, new_sources, new_sources_burst, ecn_threshold, horizon,
/// excess_rate, excess_burst, excess_dscp, packet_rate and packet_burst, each as attach's
/// flag of that name; an [[interface.policy]] takes prefix, action, rate, burst,
/// aggregate_rate, aggregate_burst, mode, new_sources, new_sources_burst, excess_rate,
/// excess_burst, excess_dscp, packet_rate and packet_burst, as shaper-policy(8) set's
/// flags (excess_rate = "10mbit", excess_dscp = "cs1" or 8, packet_rate = "20k" or
/// 20000). shaper-config(8) show prints a running interface as such a file.
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
    println!(
        "{}: valid: {} interface{}, {policies} polic{}",
        args.file.display(),
        desired.len(),
        if desired.len() == 1 { "" } else { "s" },
        if policies == 1 { "y" } else { "ies" },
    );
    Ok(())
}

pub fn run(args: &Args, scope: Scope<'_>) -> Result<()> {
    let desired = read(&args.file, scope.direction)?;
    let applied = apply::apply(&desired, scope.netns)?;
    for one in &applied {
        println!(
            "{}: {}, {}",
            one.iface,
            outcome(one),
            policies(one.policies)
        );
    }
    Ok(())
}
