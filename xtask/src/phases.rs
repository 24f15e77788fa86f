//! How long each phase of a `cargo xtask test` run took: printed as a table at its end
//! (whether it passed or not), and appended to the file `$SHAPER_PHASES` names, if set,
//! one `phase<TAB>seconds<TAB>outcome` line each, so that `.ci/run` can print the table of
//! its two runs (host, then the kernel matrix) together.

use std::{
    env,
    fs::OpenOptions,
    io::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Result;

/// The environment variable naming the file phases are appended to.
pub const PHASES_VAR: &str = "SHAPER_PHASES";

/// The phases of one run, in the order they ran.
pub struct Phases {
    done: Vec<Phase>,
    /// When the run began: its total is the wall time since, not the phases' sum (the kernel
    /// matrix's guests run side by side, the old builds beside the tests).
    began: Instant,
}

impl Default for Phases {
    fn default() -> Self {
        Self {
            done: Vec::new(),
            began: Instant::now(),
        }
    }
}

struct Phase {
    name: String,
    took: Duration,
    ok: bool,
}

impl Phases {
    /// Runs `step` as the phase `name`, and records how long it took and whether it
    /// succeeded.
    pub fn time<T>(&mut self, name: &str, step: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let result = step();
        self.done.push(Phase {
            name: name.to_owned(),
            took: start.elapsed(),
            ok: result.is_ok(),
        });
        result
    }

    /// Records a phase timed elsewhere.
    pub fn record(&mut self, name: &str, took: Duration, ok: bool) {
        self.done.push(Phase {
            name: name.to_owned(),
            took,
            ok,
        });
    }

    /// Prints the table, and appends the phases to `$SHAPER_PHASES` if it is set.
    pub fn finish(&self) {
        if self.done.is_empty() {
            return;
        }
        println!();
        println!("phases:");
        for p in &self.done {
            println!("  {}", row(&p.name, p.took, p.ok));
        }
        let total = self.began.elapsed();
        println!(
            "  {}",
            row("total (wall)", total, self.done.iter().all(|p| p.ok))
        );
        let Some(path) = env::var_os(PHASES_VAR).filter(|p| !p.is_empty()) else {
            return;
        };
        let path = PathBuf::from(path);
        let lines: String = self
            .done
            .iter()
            .map(|p| {
                format!(
                    "{}\t{:.1}\t{}\n",
                    p.name,
                    p.took.as_secs_f64(),
                    outcome(p.ok)
                )
            })
            .collect();
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(lines.as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "warning: cannot append the phases to {}: {e}",
                path.display()
            );
        }
    }
}

fn outcome(ok: bool) -> &'static str {
    if ok { "ok" } else { "FAILED" }
}

/// `setup  0m03s  ok`, in columns.
fn row(name: &str, took: Duration, ok: bool) -> String {
    format!("{name:<32} {:>7}  {}", minutes(took), outcome(ok))
}

/// `4m07s`.
pub fn minutes(d: Duration) -> String {
    let secs = d.as_secs();
    format!("{}m{:02}s", secs / 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_minutes() {
        assert_eq!(minutes(Duration::from_secs(247)), "4m07s");
        assert_eq!(
            row("setup", Duration::from_secs(3), true),
            format!("setup{}0m03s  ok", " ".repeat(27 + 1 + 2))
        );
        let mut phases = Phases::default();
        let failed: Result<()> = phases.time("fails", || anyhow::bail!("no"));
        assert!(failed.is_err());
        phases.record("guest 6.1", Duration::from_secs(60), true);
        assert_eq!(phases.done.len(), 2);
        assert!(!phases.done[0].ok && phases.done[1].ok);
    }
}
