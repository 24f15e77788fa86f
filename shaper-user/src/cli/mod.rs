//! The `shaper` command line: one module per subcommand.

pub mod apply;
pub mod attach;
pub mod completions;
pub mod config;
pub mod detach;
pub mod explain;
pub mod man;
pub mod meter2;
pub mod new_sources;
pub mod outcomes;
pub mod policy;
pub mod run;
pub mod stats;
pub mod status;
pub mod subscriber;
pub mod top;
pub mod watch;

use clap::{Parser, Subcommand};
use shaper_user::{
    pins::{Attachment, Direction},
    setting::Setting,
};

/// Per-source byte-rate limiting in the kernel (XDP), held with GCRA.
///
/// shaper holds every source address on a Linux interface to a byte rate, in the kernel,
/// at line rate: each source (IPv4 address, or IPv6 /64) has one GCRA cell, a single
/// theoretical arrival time, in a BPF LRU hash map, updated by every CPU with
/// compare-and-swap. Over the limit, a frame is dropped on arrival (XDP, ingress), or on
/// egress (tc) dropped or held back (shape mode). Prefix policies give other rates to
/// other prefixes, exempt or block them, and hold a prefix to an aggregate rate; monitor
/// mode counts what would be dropped and drops nothing; new-source admission bounds what
/// a flood of spoofed sources gets. The limits stay in force after the command exits:
/// the programs and maps are pinned under /sys/fs/bpf/shaper/.
///
/// Each command has its page: shaper-attach(8), shaper-policy(8), shaper-apply(8), ...
/// Rates and sizes are written as tc(8) writes them: 10mbit, 1gbit, 10mbps (bytes per
/// second); 64k (65536 bytes), 1514b. Every error is one line naming the bad value, with
/// a non-zero exit, and changes nothing. Commands that change an attachment take a
/// host-wide lock; one killed half way is rolled back whole by the next shaper command.
/// shaper needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (and CAP_SYS_ADMIN for
/// -n), and bpffs mounted at /sys/fs/bpf.
#[derive(Debug, Parser)]
#[command(name = "shaper", version, after_long_help = EXAMPLES)]
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
    #[command(subcommand)]
    Subscriber(subscriber::Command),
    Apply(apply::Args),
    #[command(subcommand)]
    Config(config::Command),
    Explain(explain::Args),
    Run(run::Args),
    Watch(watch::Args),
    #[command(hide = true)]
    Completions(completions::Args),
    #[command(hide = true)]
    Man(man::Args),
}

const EXAMPLES: &str = "\
Examples:
  shaper explain --rate 10mbit --burst 64k
      What a rate and burst mean, before anything is enforced.
  shaper attach eth0 --rate 10mbit --burst 64k
      Hold every source sending to eth0 to 10 Mbit/s.
  shaper stats eth0
      What passed and what was dropped, and the sources dropped most.
  shaper detach eth0
      Remove it.
";

/// Where a command acts: the namespace (`-n`) and the direction (`--direction`) it was
/// given.
impl Command {
    /// The interface the command names, if it names one.
    pub fn iface(&self) -> Option<&str> {
        match self {
            Self::Attach(a) => Some(&a.iface),
            Self::Detach(a) => Some(&a.iface),
            Self::Status(a) => a.iface.as_deref(),
            Self::Stats(a) => Some(&a.iface),
            Self::Top(a) => Some(&a.iface),
            Self::Watch(a) => Some(&a.iface),
            Self::Policy(policy::Command::Set(a)) => Some(&a.iface),
            Self::Policy(policy::Command::Del(a)) => Some(&a.iface),
            Self::Policy(policy::Command::List(a)) => Some(&a.iface),
            Self::Subscriber(subscriber::Command::Set(a)) => Some(&a.iface),
            Self::Subscriber(subscriber::Command::Import(a)) => Some(&a.iface),
            Self::Subscriber(subscriber::Command::Del(a)) => Some(&a.iface),
            Self::Subscriber(subscriber::Command::List(a)) => Some(&a.iface),
            Self::Subscriber(subscriber::Command::Show(a)) => Some(&a.iface),
            Self::Config(config::Command::Show(a)) => Some(&a.iface),
            Self::Apply(_)
            | Self::Explain(_)
            | Self::Run(_)
            | Self::Completions(_)
            | Self::Man(_) => None,
        }
    }
}

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
