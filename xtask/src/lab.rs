//! `cargo xtask demo|bench|lab|fuzz`: build the release binaries and hand over to shaper-lab,
//! which needs root to load eBPF programs and create network namespaces.

use std::process::{Command, ExitCode};

use anyhow::{Result, bail};

use crate::{cmd, host, setup, workspace};

/// Runs `shaper-lab <subcommand> --shaper <shaper> <args>` on freshly built release binaries
/// (`fuzz` runs no shaper command, so it gets no `--shaper`).
pub fn run(subcommand: &str, args: &[String]) -> Result<ExitCode> {
    // Before setup and the build, so a non-root run fails at once instead of after minutes.
    if !host::is_root()? {
        bail!(
            "`cargo xtask {subcommand}` needs root (shaper-lab loads eBPF programs and creates network namespaces)"
        );
    }
    setup::run()?;
    cmd::run(workspace::cargo().args([
        "build",
        "--release",
        "-p",
        "shaper-user",
        "-p",
        "shaper-lab",
        "--bins",
    ]))?;

    let release = workspace::target_dir().join("release");
    let mut lab = Command::new(release.join("shaper-lab"));
    lab.arg(subcommand);
    if subcommand != "fuzz" {
        lab.arg("--shaper").arg(release.join("shaper"));
    }
    // The committed results live in the workspace's bench/, wherever this is run from.
    if subcommand == "bench" && !args.iter().any(|a| a == "--out" || a.starts_with("--out=")) {
        lab.arg("--out").arg(workspace::root().join("bench"));
    }
    lab.args(args);
    // shaper-lab keeps the caller's current directory, so relative paths in `args` work.
    Err(cmd::exec(&mut lab))
}
