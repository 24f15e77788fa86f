//! `shaper detach IFACE`: remove the program and every pin.

use super::Scope;
use anyhow::Result;
use shaper_user::{detach, system};

/// Detach shaper from IFACE and remove its pins.
#[derive(Debug, clap::Args)]
pub struct Args {
    pub iface: String,
}

pub fn run(args: &Args, scope: Scope<'_>) -> Result<()> {
    let at = scope.at(&args.iface);
    let _lock = system::lock()?;
    detach::detach(&at)?;
    println!("detached from {}", at.label());
    Ok(())
}
