//! `shaper config show IFACE`: the running configuration as a file `apply` takes back.

use super::Scope;
use anyhow::Result;
use shaper_user::config_file;

/// The running configuration as TOML
///
/// The configuration of an attached interface, as the file shaper-apply(8) takes: what
/// a host runs can be kept, compared and put back as a file.
#[derive(Debug, clap::Subcommand)]
#[command(after_long_help = "\
Examples:
  shaper config show eth1 > eth1.toml
      Keep eth1's running configuration as a file.
")]
pub enum Command {
    Show(ShowArgs),
}

/// Print IFACE's settings, default rate and policies as a file for `shaper apply -f`
///
/// Every setting is spelled out, so the file applied back changes nothing, and the
/// running configuration of a host can be kept, compared and restored as a file.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  shaper config show eth1
      eth1's ingress attachment as an [[interface]] table.
  shaper config show eth0 --direction egress >> /etc/shaper/shaper.toml
      Add eth0's egress attachment to the service's file.
")]
pub struct ShowArgs {
    pub iface: String,
}

pub fn run(command: &Command, scope: Scope<'_>) -> Result<()> {
    match command {
        Command::Show(args) => {
            print!("{}", config_file::render(&scope.at(&args.iface))?);
            Ok(())
        }
    }
}
