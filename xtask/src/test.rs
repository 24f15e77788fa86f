//! `cargo xtask test`: setup, then formatting, lints, host tests and (as root) kernel tests, in
//! that order, stopping at the first failure.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{cmd, host, old_shaper, setup, vm, workspace};

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
    let result = run_all(args, &mut tally);
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

fn run_all(args: &Args, tally: &mut Tally) -> Result<ExitCode> {
    setup::run(match args.kernel {
        Kernels::Host => setup::For::Test,
        Kernels::Guests(_) => setup::For::Matrix,
    })?;
    if let Kernels::Guests(series) = &args.kernel {
        // Formatting, lints and host tests are the same whatever the kernel: the host run
        // (`cargo xtask test`) has them.
        old_shaper::build_all()?;
        let (counted, code) = vm::run(series, &args.kernel_test_args)?;
        tally.passed += counted.passed;
        tally.failed += counted.failed;
        return Ok(code);
    }
    cmd::run(workspace::cargo().args(["fmt", "--all", "--check"]))?;
    cmd::run(workspace::cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The lab's tests drive the `shaper` binary, which is another package's.
    cmd::run(&mut workspace::build_bins())?;
    // Kernel tests are #[ignore]d, so this runs only what needs no privileges.
    tally.run(workspace::cargo().args(["test", "--workspace"]))?;

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
    // The upgrade tests attach with earlier builds.
    old_shaper::build_all()?;
    // One thread: the tests share the kernel (namespaces, interfaces, qdiscs). Those that
    // need what this kernel lacks run in the guests only.
    let mut cargo = workspace::cargo();
    cargo.args(["test", "--workspace", "--", "--ignored", "--test-threads=1"]);
    for test in vm::guest_only_tests() {
        println!("left to the kernel matrix (--kernel): {test}");
        cargo.args(["--skip", test]);
    }
    tally.run(cargo.args(&args.kernel_test_args))?;
    Ok(ExitCode::SUCCESS)
}

/// Tests counted over all `cargo test` runs, from libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
}

impl Tally {
    /// Runs `cmd` like `cmd::run`, echoing its stdout as it comes while counting.
    fn run(&mut self, cmd: &mut Command) -> Result<()> {
        let line = cmd::display(cmd);
        println!("$ {line}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start `{line}`"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        for out in BufReader::new(stdout).lines() {
            let out = out.context("reading test output")?;
            println!("{out}");
            self.count(&out);
        }
        let status = child.wait()?;
        if !status.success() {
            bail!("`{line}` failed ({status})");
        }
        Ok(())
    }

    /// Adds what a libtest `test result:` line counts; other lines count nothing.
    pub fn count(&mut self, line: &str) {
        if let Some(counted) = Self::of_result_line(line) {
            self.passed += counted.passed;
            self.failed += counted.failed;
        }
    }

    /// The counts of `test result: ok. 5 passed; 0 failed; 2 ignored; ...`, or `None` for
    /// any other line.
    pub fn of_result_line(line: &str) -> Option<Tally> {
        let rest = line.strip_prefix("test result: ")?;
        let mut tally = Tally::default();
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => tally.passed += n,
                "failed" => tally.failed += n,
                _ => {}
            }
        }
        Some(tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_libtest_result_lines() {
        let mut t = Tally::default();
        t.count("test result: ok. 5 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.35s");
        t.count("test result: FAILED. 1 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out");
        t.count("test foo ... ok");
        assert_eq!(
            t,
            Tally {
                passed: 6,
                failed: 3
            }
        );
    }
}
