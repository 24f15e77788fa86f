//! The `shaper` command driven from outside, as an operator types it, by the demo and the
//! kernel tests: run in a namespace (`shaper -n NS ...`), a guard that detaches what was
//! attached however the caller ends, `stats -j` read back, and the binary as an
//! unprivileged user can run it.

use std::{
    collections::BTreeMap,
    fmt::Display,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result};
use serde::Deserialize;

use crate::lab::ns::run_command;

/// Runs `SHAPER -n NS ARGS...` and returns its standard output; on failure the error names
/// the command line and carries its standard error.
pub fn run(shaper: &Path, ns: &str, args: &[&str]) -> Result<String> {
    run_command(Command::new(shaper).args(["-n", ns]).args(args))
}

/// shaper on one interface of a namespace: detaches it when dropped, so that a test's
/// failed assertion, the demo's error or a half-done attach leaves no program or pin behind.
///
/// The guard is armed from the start, whoever attaches: through [`AttachGuard::attach`],
/// or by running `attach` (or `apply`) some other way. Declare it after the lab whose
/// namespace it names, so that it drops first.
#[derive(Debug)]
pub struct AttachGuard {
    shaper: PathBuf,
    ns: String,
    iface: String,
    /// `ingress` or `egress`: every command the guard runs names it.
    direction: &'static str,
    /// [`AttachGuard::attach`] succeeded: a detach that fails on drop is worth a warning
    /// (otherwise there may have been nothing to detach).
    attached: bool,
    /// Still to detach on drop (cleared by [`AttachGuard::detach`]).
    armed: bool,
}

impl AttachGuard {
    /// A guard for `iface` in `ns`, driving the binary at `shaper`; attaches nothing.
    pub fn new(shaper: &Path, ns: &str, iface: &str) -> Self {
        Self::toward(shaper, ns, iface, "ingress")
    }

    /// The same for one direction of `iface` (`ingress` or `egress`).
    pub fn toward(shaper: &Path, ns: &str, iface: &str, direction: &'static str) -> Self {
        Self {
            shaper: shaper.to_owned(),
            ns: ns.to_owned(),
            iface: iface.to_owned(),
            direction,
            attached: false,
            armed: true,
        }
    }

    /// `shaper -n NS attach IFACE ARGS...`; returns its output.
    pub fn attach(&mut self, args: &[&str]) -> Result<String> {
        let mut all = vec!["attach", self.iface.as_str()];
        all.extend_from_slice(args);
        let out = self.run(&all)?;
        self.attached = true;
        Ok(out)
    }

    /// Runs another command in the guard's namespace and direction: `shaper -n NS
    /// --direction DIRECTION ARGS...`.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["--direction", self.direction];
        all.extend_from_slice(args);
        run(&self.shaper, &self.ns, &all)
    }

    /// `shaper -n NS detach IFACE` now, failing if it fails; nothing is left for the drop.
    pub fn detach(mut self) -> Result<String> {
        self.armed = false;
        self.run(&["detach", &self.iface])
    }

    pub fn iface(&self) -> &str {
        &self.iface
    }

    pub fn ns(&self) -> &str {
        &self.ns
    }
}

impl Drop for AttachGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // A warning, not a panic: this may run while unwinding, where a second panic would
        // abort, and a detach of an interface the caller already detached fails anyway.
        if let Err(e) = self.run(&["detach", &self.iface])
            && self.attached
        {
            eprintln!(
                "warning: cannot detach shaper from {} in {}: {e:#}",
                self.iface, self.ns
            );
        }
    }
}

/// `shaper -n NS -j stats IFACE` with every key listed ([`stats`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Stats {
    totals: BTreeMap<String, u64>,
    pub sources_tracked: u64,
    top_sources: Vec<KeyRow>,
}

/// A row of `top_sources`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct KeyRow {
    source: String,
    #[serde(flatten)]
    counts: Counts,
}

/// One key's counters, as a row of `stats -j` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Counts {
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
    pub would_drop_packets: u64,
    pub would_drop_bytes: u64,
}

impl Counts {
    /// Whether no counter is below the one in `before`: the key's state was kept, not
    /// made again.
    pub fn kept(&self, before: &Counts) -> bool {
        self.passed_packets >= before.passed_packets
            && self.passed_bytes >= before.passed_bytes
            && self.dropped_packets >= before.dropped_packets
            && self.dropped_bytes >= before.dropped_bytes
            && self.would_drop_packets >= before.would_drop_packets
            && self.would_drop_bytes >= before.would_drop_bytes
    }

    /// Frames counted, whatever became of them.
    pub fn packets(&self) -> u64 {
        self.passed_packets + self.dropped_packets + self.would_drop_packets
    }
}

/// Reads `stats -j` of `iface`'s ingress in `ns`, every key listed.
pub fn stats(shaper: &Path, ns: &str, iface: &str) -> Result<Stats> {
    stats_toward(shaper, ns, iface, "ingress")
}

/// Reads `stats -j` of one direction (`ingress`, `egress`) of `iface` in `ns`.
pub fn stats_toward(shaper: &Path, ns: &str, iface: &str, direction: &str) -> Result<Stats> {
    let top = u32::MAX.to_string();
    let args = [
        "--direction",
        direction,
        "-j",
        "stats",
        iface,
        "--top",
        &top,
    ];
    let out = run(shaper, ns, &args)?;
    serde_json::from_str(&out).with_context(|| format!("cannot read stats -j: {out}"))
}

impl Stats {
    /// A counter of `totals` (`passed_bytes`, `new_sources`, ...). Panics if there is no
    /// such counter: a test asked for a name the command does not print.
    pub fn total(&self, name: &str) -> u64 {
        *self
            .totals
            .get(name)
            .unwrap_or_else(|| panic!("stats -j has no totals.{name}: {:?}", self.totals))
    }

    /// Every key (an address, or `network/prefix`) with its counters.
    pub fn keys(&self) -> impl Iterator<Item = (&str, Counts)> {
        self.top_sources
            .iter()
            .map(|row| (row.source.as_str(), row.counts))
    }

    /// The counters of `key`, if it is tracked.
    pub fn get(&self, key: impl Display) -> Option<Counts> {
        let key = key.to_string();
        self.keys().find(|&(k, _)| k == key).map(|(_, c)| c)
    }

    /// The counters of `key`. Panics if it is not tracked.
    pub fn key(&self, key: impl Display) -> Counts {
        let key = key.to_string();
        self.get(&key).unwrap_or_else(|| {
            let keys: Vec<&str> = self.keys().map(|(k, _)| k).collect();
            panic!("{key} is not among the keys in stats: {keys:?}")
        })
    }
}

/// A user and group with no privileges at all (`nobody`/`nogroup`).
pub const NOBODY: u32 = 65534;

/// The shaper binary at a path `nobody` can execute: the build output itself if every
/// directory above it lets others through, else a copy in a temporary directory that is
/// removed on drop (a work tree under a private home directory is out of nobody's reach).
#[derive(Debug)]
pub struct NobodyBinary {
    path: PathBuf,
    temp_dir: Option<PathBuf>,
}

impl NobodyBinary {
    /// `shaper` itself or a world-readable copy of it.
    pub fn new(shaper: &Path) -> Result<Self> {
        if others_can_execute(shaper) {
            return Ok(Self {
                path: shaper.to_owned(),
                temp_dir: None,
            });
        }
        let dir = std::env::temp_dir().join(format!("shaper-nobody-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // Owned from here, so the directory goes even if a later step fails.
        let copy = Self {
            path: dir.join("shaper"),
            temp_dir: Some(dir.clone()),
        };
        let mode = fs::Permissions::from_mode(0o755);
        fs::set_permissions(&dir, mode.clone())
            .with_context(|| format!("cannot chmod {}", dir.display()))?;
        fs::copy(shaper, &copy.path)
            .with_context(|| format!("cannot copy {}", shaper.display()))?;
        fs::set_permissions(&copy.path, mode)
            .with_context(|| format!("cannot chmod {}", copy.path.display()))?;
        anyhow::ensure!(
            others_can_execute(&copy.path),
            "{} is out of others' reach",
            copy.path.display()
        );
        Ok(copy)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The binary run as nobody, with no groups and no capabilities, with `ARGS...` for
    /// shaper. A shell started by `setpriv` runs it, so that nobody finds it as nobody
    /// would: `setpriv` itself may still hold root's capabilities when it starts its
    /// command, and would reach a binary nobody cannot.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".to_owned(),
            "--inh-caps=-all".to_owned(),
            "--".to_owned(),
            "sh".to_owned(),
            "-c".to_owned(),
            r#"exec "$0" "$@""#.to_owned(),
        ])
        .arg(&self.path)
        .args(args)
        .stdin(Stdio::null());
        cmd
    }
}

impl Drop for NobodyBinary {
    fn drop(&mut self) {
        if let Some(dir) = &self.temp_dir
            && let Err(e) = fs::remove_dir_all(dir)
        {
            // A warning, not a panic: this may run while unwinding.
            eprintln!("warning: cannot remove {}: {e}", dir.display());
        }
    }
}

/// Whether a user other than the owner (and not in its group) may run `path`: read and
/// execute on the file, search on every directory above it.
fn others_can_execute(path: &Path) -> bool {
    let mode = |p: &Path| fs::metadata(p).map(|m| m.permissions().mode()).ok();
    let file_ok = mode(path).is_some_and(|m| m & 0o005 == 0o005);
    file_ok
        && path
            .ancestors()
            .skip(1)
            .all(|dir| mode(dir).is_some_and(|m| m & 0o001 != 0))
}
