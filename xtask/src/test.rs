//! `cargo xtask test`: setup, then formatting, lints, host tests and (as root) kernel tests, in
//! that order, stopping at the first failure.

use std::process::ExitCode;

use anyhow::Result;

use crate::{cmd, host, setup, workspace};

#[derive(clap::Args)]
pub struct Args {
    /// Stop after the host tests, and succeed without running the kernel tests
    #[arg(long)]
    pub host_only: bool,
    /// Test filter and libtest options for the kernel tests, e.g. `-- live_rate`
    #[arg(last = true, conflicts_with = "host_only")]
    pub kernel_test_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    setup::run()?;
    cmd::run(workspace::cargo().args(["fmt", "--all", "--check"]))?;
    cmd::run(workspace::cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Kernel tests are #[ignore]d, so this runs only what needs no privileges.
    cmd::run(workspace::cargo().args(["test", "--workspace"]))?;

    let root = host::is_root()?;
    if !root {
        println!(
            "skipped: kernel tests (they load programs into the kernel and create network namespaces: run as root)"
        );
        // Not running them is a failure unless asked for, so that a green `cargo xtask test`
        // always means everything ran.
        return Ok(if args.host_only {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if args.host_only {
        println!("skipped: kernel tests (--host-only)");
        return Ok(ExitCode::SUCCESS);
    }
    // One thread: the tests share the kernel (namespaces, interfaces, qdiscs).
    cmd::run(
        workspace::cargo()
            .args(["test", "--workspace", "--", "--ignored", "--test-threads=1"])
            .args(&args.kernel_test_args),
    )?;
    Ok(ExitCode::SUCCESS)
}
