//! `cargo xtask test`: setup, then formatting, lints, host tests and (as root) kernel tests, in
//! that order, stopping at the first failure.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context as _, Result, bail};

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
    let mut tally = Tally::default();
    let result = run_all(args, &mut tally);
    // One closing line over every test binary, in the plain form CI reads.
    println!("summary: {} passed, {} failed", tally.passed, tally.failed);
    result
}

fn run_all(args: &Args, tally: &mut Tally) -> Result<ExitCode> {
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
    // One thread: the tests share the kernel (namespaces, interfaces, qdiscs).
    tally.run(
        workspace::cargo()
            .args(["test", "--workspace", "--", "--ignored", "--test-threads=1"])
            .args(&args.kernel_test_args),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Tests counted over all `cargo test` runs, from libtest's `test result:` lines.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    passed: u64,
    failed: u64,
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

    /// `test result: ok. 5 passed; 0 failed; 2 ignored; ...`
    fn count(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                _ => {}
            }
        }
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
