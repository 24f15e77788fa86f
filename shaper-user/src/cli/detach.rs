//! `shaper detach IFACE`: remove the program and every pin.

use anyhow::Result;
use shaper_user::{loader, pins::Attachment, system};

/// Detach shaper from IFACE and remove its pins.
#[derive(Debug, clap::Args)]
pub struct Args {
    pub iface: String,
}

pub fn run(args: &Args, netns: Option<&str>) -> Result<()> {
    let at = Attachment::new(&args.iface, netns);
    let _lock = system::lock()?;
    loader::detach(&at)?;
    println!("detached from {}", at.label());
    Ok(())
}
