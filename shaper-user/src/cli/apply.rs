//! `shaper apply -f FILE.toml [--check]`: make the interfaces a file names look as it says.

use std::path::{Path, PathBuf};

use super::Scope;
use anyhow::{Context as _, Result};
use shaper_user::{
    apply::{self, Applied},
    attach::Attached,
    config_file,
    pins::Direction,
    policy::PolicySet,
    request::AttachRequest,
    system,
};

/// Set interfaces, their default rates and their prefix policies from a TOML file, as one
/// all-or-nothing change (see `shaper config show` for the format)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The configuration file
    #[arg(short = 'f', long = "file", value_name = "FILE.toml")]
    pub file: PathBuf,
    /// Only check the file (syntax, values, policies); touch nothing, need no privileges
    #[arg(long)]
    pub check: bool,
}

/// Reads and checks the file; the error names its line and field.
pub fn read(file: &Path, direction: Direction) -> Result<Vec<AttachRequest>> {
    let name = file.display().to_string();
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {name}"))?;
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
    let _lock = system::lock()?;
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
