//! `cargo xtask test`: setup, then formatting, lints, host tests and (as root) kernel tests, in
//! that order, stopping at the first failure.

use std::process::ExitCode;

use anyhow::Result;

use crate::{cmd, host, old_shaper, phases::Phases, setup, tally::Tally, vm, workspace};

#[derive(clap::Args)]
pub struct Args {
    /// Stop after the host tests, and succeed without running the kernel tests
    #[arg(long)]
    pub host_only: bool,
    /// Where the kernel tests run: `host` (this machine's kernel, after fmt, clippy and the
    /// host tests), or Debian 11's `5.10` or Debian 12's `6.1`, `6.12` (comma-separated) or `all`, each under QEMU
    /// (only the kernel tests that do not depend on timing; nothing else)
    #[arg(long, default_value = "host", value_parser = kernels, conflicts_with = "host_only")]
    pub kernel: Kernels,
    /// Test filter and libtest options for the kernel tests, e.g. `-- live_rate`
    #[arg(last = true, conflicts_with = "host_only")]
    pub kernel_test_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let mut tally = Tally::default();
    let mut phases = Phases::default();
    let result = run_all(args, &mut tally, &mut phases);
    phases.finish();
    // One closing line over every test binary, in the plain form CI reads.
    println!("summary: {} passed, {} failed", tally.passed, tally.failed);
    result
}

/// What `--kernel` chose.
#[derive(Clone)]
pub enum Kernels {
    /// This machine's kernel.
    Host,
    /// Debian kernels in QEMU guests.
    Guests(Vec<&'static vm::Series>),
}

pub fn kernels(arg: &str) -> Result<Kernels, String> {
    match arg {
        "host" => return Ok(Kernels::Host),
        "all" => return Ok(Kernels::Guests(vm::SERIES.iter().collect())),
        _ => {}
    }
    let mut series = Vec::new();
    for name in arg.split(',') {
        let Some(one) = vm::series_named(name.trim()) else {
            let names: Vec<&str> = vm::SERIES.iter().map(|s| s.name).collect();
            return Err(format!(
                "no kernel '{name}': host, {}, or all",
                names.join(", ")
            ));
        };
        if !series.iter().any(|s: &&vm::Series| s.name == one.name) {
            series.push(one);
        }
    }
    Ok(Kernels::Guests(series))
}

fn run_all(args: &Args, tally: &mut Tally, phases: &mut Phases) -> Result<ExitCode> {
    let setup_for = match args.kernel {
        Kernels::Host => setup::For::Test,
        Kernels::Guests(_) => setup::For::Matrix,
    };
    phases.time("setup", || setup::run(setup_for))?;
    if let Kernels::Guests(series) = &args.kernel {
        // Formatting, lints and host tests are the same whatever the kernel: the host run
        // (`cargo xtask test`) has them.
        phases.time("old build (the guests' upgrades)", old_shaper::build_newest)?;
        let (counted, code) = vm::run(series, &args.kernel_test_args, phases)?;
        tally.passed += counted.passed;
        tally.failed += counted.failed;
        return Ok(code);
    }
    phases.time("fmt + clippy", || {
        cmd::run(workspace::cargo().args(["fmt", "--all", "--check"]))?;
        cmd::run(workspace::cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    phases.time("build", || {
        // The lab's tests drive the `shaper` binary, which is another package's.
        cmd::run(&mut workspace::build_bins())?;
        cmd::run(workspace::cargo().args(["test", "--workspace", "--no-run"]))
    })?;
    let root = host::is_root()?;
    // The earlier builds the upgrade tests attach with, built beside the tests that follow
    // (each upgrade test waits for the one it needs): they are only needed as root.
    let building = if root && !args.host_only {
        Some(old_shaper::build_all_beside()?)
    } else {
        None
    };
    // Kernel tests are #[ignore]d, so this runs only what needs no privileges. Every test
    // binary runs even after one fails (`--no-fail-fast`): a run shows all its failures.
    phases.time("host tests", || {
        tally.run(workspace::cargo().args(["test", "--workspace", "--no-fail-fast"]))
    })?;

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
    // One thread: the tests share the kernel (namespaces, interfaces, qdiscs). Those that
    // need what this kernel lacks run in the guests only.
    let mut cargo = workspace::cargo();
    cargo.args([
        "test",
        "--workspace",
        "--no-fail-fast",
        "--",
        "--ignored",
        "--test-threads=1",
    ]);
    for test in vm::guest_only_tests() {
        println!("left to the kernel matrix (--kernel): {test}");
        cargo.args(["--skip", test]);
    }
    cargo.args(&args.kernel_test_args);
    let tested = phases.time("kernel tests on host", || tally.run(&mut cargo));
    if let Some(building) = building {
        let (took, built) = building.wait();
        phases.record("old builds (beside the tests)", took, built.is_ok());
        built?;
    }
    tested?;
    Ok(ExitCode::SUCCESS)
}
