//! `shaper detach IFACE`: remove the program and every pin.

use super::Scope;
use anyhow::Result;
use shaper_user::change;

/// Detach shaper from IFACE and remove its pins.
///
/// Takes the program off the interface (its bpf_link unpinned; on clsact, its filter
/// deleted, and the clsact qdisc too if shaper added it and no other shaper attachment of
/// the interface uses it) and removes every pin of the attachment: its sources, policies
/// and counters are gone. Works on the pins alone, so also once the interface or its
/// namespace is gone. On an interface without shaper it says so and exits non-zero.
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    pub iface: String,
}

const EXAMPLES: &str = "\
Examples:
  shaper detach eth0
      Remove shaper from what eth0 receives.
  shaper -n lab detach veth1 --direction egress
      Remove the egress attachment of veth1 in the namespace lab.
";

pub fn run(args: &Args, scope: Scope<'_>) -> Result<()> {
    let at = scope.at(&args.iface);
    change::detach(&at)?;
    println!("detached from {}", at.label());
    Ok(())
}
