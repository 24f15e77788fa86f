//! The `shaper` command line: one module per subcommand.

pub mod apply;
pub mod attach;
pub mod completions;
pub mod config;
pub mod detach;
pub mod explain;
pub mod man;
pub mod new_sources;
pub mod outcomes;
pub mod policy;
pub mod run;
pub mod stats;
pub mod status;
pub mod top;
pub mod watch;

use clap::{Parser, Subcommand};
use shaper_user::{
    pins::{Attachment, Direction},
    setting::Setting,
};

/// Per-source byte-rate limiting in the kernel (XDP), held with GCRA.
#[derive(Debug, Parser)]
#[command(name = "shaper", version)]
pub struct Cli {
    /// Run in the named network namespace, as `ip -n NETNS` does.
    #[arg(short = 'n', long, global = true, value_name = "NETNS")]
    pub netns: Option<String>,
    /// Which traffic of the interface: ingress (what it receives) or egress (what it
    /// sends); each is an attachment of its own
    #[arg(long, global = true, value_enum, default_value_t = Direction::Ingress)]
    pub direction: Direction,
    /// Print JSON instead of text (status, stats, policy list, top; watch: JSON lines).
    #[arg(short = 'j', long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Attach(attach::Args),
    Detach(detach::Args),
    Status(status::Args),
    Stats(stats::Args),
    Top(top::Args),
    #[command(subcommand)]
    Policy(policy::Command),
    Apply(apply::Args),
    #[command(subcommand)]
    Config(config::Command),
    /// What a rate and burst mean: bytes/s, time per byte and per frame, the burst in
    /// milliseconds, and warnings (needs no privileges, touches nothing)
    Explain(explain::Args),
    Run(run::Args),
    Watch(watch::Args),
    #[command(hide = true)]
    Completions(completions::Args),
    #[command(hide = true)]
    Man(man::Args),
}

/// Where a command acts: the namespace (`-n`) and the direction (`--direction`) it was
/// given.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    pub netns: Option<&'a str>,
    pub direction: Direction,
}

impl Scope<'_> {
    /// The attachment of `iface` in this scope.
    pub fn at(&self, iface: &str) -> Attachment {
        Attachment::toward(iface, self.netns, self.direction)
    }
}

/// The flag that sets `setting`: `--max-sources`.
pub fn flag(setting: Setting) -> String {
    format!("--{}", setting.name().replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn settings_are_named_by_their_flags() {
        assert_eq!(flag(Setting::MaxSources), "--max-sources");
        assert_eq!(flag(Setting::PrefixV4), "--prefix-v4");
        assert_eq!(flag(Setting::NewSourcesBurst), "--new-sources-burst");
    }

    /// clap checks a command's definition only when it is built: catch clashes (two flag
    /// groups of one name, ...) here rather than in the first run.
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
