//! `shaper config show IFACE`: the running configuration as a file `apply` takes back.

use super::Scope;
use anyhow::Result;
use shaper_user::config_file;

/// The running configuration as TOML
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print IFACE's settings, default rate and policies as a file for `shaper apply -f`
    Show(ShowArgs),
}

#[derive(Debug, clap::Args)]
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
