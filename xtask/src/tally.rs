//! Tests counted from libtest's output: the host run (`cargo xtask test`) and the guests of
//! the kernel matrix (`vm`) both read its `test result:` lines.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// Tests counted over all `cargo test` runs, from libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
}

impl Tally {
    /// Runs `cmd` like `cmd::run`, echoing its stdout as it comes while counting.
    pub fn run(&mut self, cmd: &mut Command) -> Result<()> {
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
