//! `cargo xtask mutants --scope kernel --in-place`: mutation testing of the kernel crate
//! (`shaper-ebpf/src`, the benchmark's object left out), each mutant tested by the root
//! `BPF_PROG_TEST_RUN` suites that guard it ([`SUITES`]).
//!
//! cargo-mutants only lists the mutants (`--list --json --diff`); this driver tests them,
//! because cargo-mutants' own loop would rebuild and relink shaper-user and every test
//! binary for each (the object is embedded in them) in a copy of the tree with a target
//! directory of its own. Here, once: the workspace's binaries and the suites' test
//! binaries, and a baseline run that must pass. Then for each mutant: its diff applied to
//! this checkout's file, the kernel object alone built (as shaper-user/build.rs builds it,
//! into the same `target/ebpf/`), each suite run against it through
//! `shaper_user::object::OBJECT_VAR` (honoured by debug builds only) until one fails, and
//! the file put back as it was. A mutant the object does not build for is unviable; one
//! whose suite runs past `--timeout` seconds is a timeout (killed: it did not pass).
//!
//! In place, so only with `--in-place`: never on a checkout anyone else builds in (they
//! would build the mutants). It refuses to start when `shaper-ebpf/src` has changes of
//! its own; a run stopped by a signal can leave one mutant in place: `git checkout
//! shaper-ebpf/src` puts it back. Everything runs under `nice -n 19`.

use std::{
    fs,
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use super::Args;
use crate::{cmd, host, workspace};

/// The suites run against each mutant, quickest first (a mutant stops at the first that
/// fails it). All in `shaper-user/lab/tests`, run as root with `--ignored
/// --test-threads=1`.
pub const SUITES: &[&str] = &[
    "shape_test_run",
    "test_run",
    "policy_test_run",
    "parse_golden",
    "contention",
    "colour_test_run",
    "admission_test_run",
    "source_table_test_run",
];

/// The kernel crate's files cargo-mutants mutates; the benchmark's object (`bench/`),
/// which shaper never loads, is left out.
const PACKAGE: &str = "shaper-ebpf";
const EXCLUDE: &str = "shaper-ebpf/src/bench/**";

/// What became of one mutant.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Caught,
    Missed,
    Timeout,
    Unviable,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Self::Caught => "caught",
            Self::Missed => "missed",
            Self::Timeout => "timeout",
            Self::Unviable => "unviable",
        }
    }
}

const OUTCOMES: [Outcome; 4] = [
    Outcome::Caught,
    Outcome::Missed,
    Outcome::Timeout,
    Outcome::Unviable,
];

/// Runs the kernel scope; whether it missed nothing and nothing timed out.
pub fn run(args: &Args) -> Result<bool> {
    ensure!(
        args.in_place,
        "the kernel scope mutates this checkout's shaper-ebpf/src itself, one mutant at a \
         time: pass --in-place, in a worktree no one else builds in"
    );
    ensure!(
        host::is_root()?,
        "the kernel scope runs root tests: run it as root"
    );
    let root = workspace::root();
    let changed = cmd::stdout(Command::new("git").current_dir(root).args([
        "status",
        "--porcelain",
        "--",
        "shaper-ebpf/src",
    ]))?;
    ensure!(
        changed.trim().is_empty(),
        "shaper-ebpf/src has changes of its own (commit or put them back first):\n{changed}"
    );
    println!(
        "mutating kernel: shaper-ebpf/src (not bench/), each mutant tested by {}",
        SUITES.join(", ")
    );
    let mutants = list(args)?;
    println!("{} mutants", mutants.len());
    if args.mutants_args.iter().any(|a| a == "--list") {
        for m in &mutants {
            println!("{}", m["name"].as_str().unwrap_or_default());
        }
        return Ok(true);
    }
    let out = workspace::target_dir().join("mutants/kernel/mutants.out");
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    fs::create_dir_all(out.join("log"))?;
    for outcome in OUTCOMES {
        fs::write(out.join(format!("{}.txt", outcome.name())), "")?;
    }

    cmd::run(&mut niced(workspace::build_bins()))?;
    let tests = test_binaries()?;
    let started = Instant::now();
    let object = build_object(&out.join("log/baseline.log"))?
        .context("the kernel object does not build unmutated (see log/baseline.log)")?;
    let (baseline, secs, _) = test(&tests, &object, args.timeout, &out.join("log/baseline.log"))?;
    ensure!(
        baseline == Outcome::Missed,
        "the suites fail without a mutant (see {}): nothing to measure",
        out.join("log/baseline.log").display()
    );
    println!("baseline: build and suites pass, tests {secs:.1} s");

    let mut records = Vec::new();
    let run = test_each(&mutants, &tests, &object, args, &out, &mut records);
    // The unmutated object back in target/ebpf, whatever happened.
    let rebuilt = build_object(&out.join("log/restore.log"));
    run?;
    rebuilt?.context("the unmutated kernel object does not build (see log/restore.log)")?;

    let count = |o: Outcome| records.iter().filter(|r| r.0 == o).count();
    println!(
        "mutants of kernel: {} caught, {} missed, {} timed out, {} unviable, in {:.0} s \
         (the missed: {})",
        count(Outcome::Caught),
        count(Outcome::Missed),
        count(Outcome::Timeout),
        count(Outcome::Unviable),
        started.elapsed().as_secs_f64(),
        out.join("missed.txt").display()
    );
    Ok(count(Outcome::Missed) == 0 && count(Outcome::Timeout) == 0)
}

/// The mutants cargo-mutants lists for the crate, with their diffs.
fn list(args: &Args) -> Result<Vec<Value>> {
    let mut list = workspace::cargo();
    list.args([
        "mutants",
        "--list",
        "--json",
        "--diff",
        "--package",
        PACKAGE,
    ])
    .args(["--exclude", EXCLUDE, "--exclude-re", "tests::"])
    .args(args.mutants_args.iter().filter(|a| *a != "--list"));
    let text = cmd::stdout(&mut list)?;
    let value: Value = serde_json::from_str(&text).context("cargo mutants --list --json")?;
    value
        .as_array()
        .cloned()
        .context("cargo mutants --list --json printed no list")
}

/// Tests each mutant, appending each outcome to its file as it comes (a run stopped
/// early keeps what it found).
fn test_each(
    mutants: &[Value],
    tests: &[(String, PathBuf)],
    object: &Path,
    args: &Args,
    out: &Path,
    records: &mut Vec<(Outcome, Value)>,
) -> Result<()> {
    for (i, mutant) in mutants.iter().enumerate() {
        let name = mutant["name"].as_str().context("a mutant without a name")?;
        let file = mutant["file"].as_str().context("a mutant without a file")?;
        let diff = mutant["diff"].as_str().context("a mutant without a diff")?;
        let log = out.join(format!("log/{:03}.log", i + 1));
        let began = Instant::now();
        let applied = Applied::new(&workspace::root().join(file), diff)?;
        let build = build_object(&log)?;
        let built = began.elapsed().as_secs_f64();
        let (outcome, test_secs, by) = match build {
            None => (Outcome::Unviable, 0.0, None),
            Some(_) => test(tests, object, args.timeout, &log)?,
        };
        drop(applied);
        println!(
            "{}/{} {name}: {}{} (build {built:.1} s, tests {test_secs:.1} s)",
            i + 1,
            mutants.len(),
            outcome.name().to_uppercase(),
            by.as_deref()
                .map(|s| format!(" by {s}"))
                .unwrap_or_default()
        );
        append(&out.join(format!("{}.txt", outcome.name())), name)?;
        records.push((
            outcome,
            json!({
                "name": name,
                "outcome": outcome.name(),
                "build_secs": built,
                "test_secs": test_secs,
                "suite": by,
                "log": log.strip_prefix(out).unwrap_or(&log),
            }),
        ));
        let all: Vec<&Value> = records.iter().map(|r| &r.1).collect();
        fs::write(
            out.join("outcomes.json"),
            serde_json::to_string_pretty(&json!({ "outcomes": all }))?,
        )?;
    }
    Ok(())
}

fn append(path: &Path, line: &str) -> Result<()> {
    let mut file = fs::OpenOptions::new().append(true).open(path)?;
    writeln!(file, "{line}")?;
    Ok(())
}

/// A mutant's diff applied to its file; the file's earlier text written back on drop.
struct Applied {
    path: PathBuf,
    before: Vec<u8>,
}

impl Applied {
    fn new(path: &Path, diff: &str) -> Result<Self> {
        let before = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let applied = Self {
            path: path.to_owned(),
            before,
        };
        // patch with the file named: cargo-mutants' `+++` line names the mutation.
        let mut patch = Command::new("patch")
            .args([
                "--quiet",
                "--force",
                "--no-backup-if-mismatch",
                "--reject-file=-",
            ])
            .arg(path)
            .stdin(Stdio::piped())
            .spawn()
            .context("cannot run patch")?;
        patch
            .stdin
            .take()
            .context("patch's stdin")?
            .write_all(diff.as_bytes())?;
        let status = patch.wait()?;
        ensure!(status.success(), "patch failed on {}", path.display());
        Ok(applied)
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        if let Err(e) = fs::write(&self.path, &self.before) {
            eprintln!(
                "cannot put {} back ({e}): `git checkout` it",
                self.path.display()
            );
        }
    }
}

/// `command` under `nice -n 19`, so other builds on the machine come first.
fn niced(command: Command) -> Command {
    let mut niced = Command::new("nice");
    niced.args(["-n", "19"]).arg(command.get_program());
    niced.args(command.get_args());
    if let Some(dir) = command.get_current_dir() {
        niced.current_dir(dir);
    }
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => niced.env(key, value),
            None => niced.env_remove(key),
        };
    }
    niced
}

/// Builds the suites' test binaries; their names and paths.
fn test_binaries() -> Result<Vec<(String, PathBuf)>> {
    let mut build = workspace::cargo();
    build.args(["test", "--package", "shaper-lab", "--no-run"]);
    build.arg("--message-format=json-render-diagnostics");
    for suite in SUITES {
        build.args(["--test", suite]);
    }
    let text = cmd::stdout(&mut niced(build))?;
    let mut found = Vec::new();
    for line in text.lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let (Some(name), Some(path)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) else {
            continue;
        };
        if SUITES.contains(&name) {
            found.push((name.to_owned(), PathBuf::from(path)));
        }
    }
    found.sort_by_key(|(name, _)| SUITES.iter().position(|s| s == name));
    ensure!(
        found.len() == SUITES.len(),
        "cargo test --no-run built {} of the {} suites",
        found.len(),
        SUITES.len()
    );
    Ok(found)
}

/// Builds the product's kernel object as shaper-user/build.rs does (same toolchain,
/// target, flags and target directory, so its cache serves both), writing what the
/// compiler said to `log`; its path, or None if it does not build.
fn build_object(log: &Path) -> Result<Option<PathBuf>> {
    let target = if cfg!(target_endian = "little") {
        "bpfel-unknown-none"
    } else {
        "bpfeb-unknown-none"
    };
    let dir = workspace::target_dir().join("ebpf");
    let mut cargo = Command::new("rustup");
    cargo
        .args([
            "run",
            workspace::EBPF_TOOLCHAIN,
            "cargo",
            "build",
            "--quiet",
        ])
        .args(["--release", "--package", PACKAGE, "--bin", PACKAGE])
        .args(["--target", target, "-Z", "build-std=core", "--target-dir"])
        .arg(&dir)
        .current_dir(workspace::root())
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            [
                format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
                "-Cdebuginfo=2".to_owned(),
                "-Clink-arg=--btf".to_owned(),
            ]
            .join("\x1f"),
        )
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let log_file = fs::File::create(log)?;
    let status = niced(cargo)
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .status()
        .context("cannot run rustup (cargo xtask setup installs the toolchain)")?;
    Ok(status
        .success()
        .then(|| dir.join(target).join("release").join(PACKAGE)))
}

/// Runs the suites against `object` until one fails (Caught) or runs past `timeout`
/// seconds (Timeout); Missed if all pass. Their output is appended to `log`. The
/// outcome, the seconds taken, and the suite that failed or timed out.
fn test(
    tests: &[(String, PathBuf)],
    object: &Path,
    timeout: u32,
    log: &Path,
) -> Result<(Outcome, f64, Option<String>)> {
    let began = Instant::now();
    for (name, binary) in tests {
        let mut log_file = fs::OpenOptions::new().create(true).append(true).open(log)?;
        writeln!(log_file, "=== {name}")?;
        let mut suite = Command::new("nice");
        suite
            .args(["-n", "19"])
            .arg(binary)
            .args(["--ignored", "--test-threads=1"])
            .current_dir(workspace::root().join(workspace::LAB_DIR))
            // shaper_user::object::OBJECT_VAR (xtask builds nothing of shaper's).
            .env("SHAPER_TEST_OBJECT", object)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            // Its own process group: a timeout kills the suite and whatever it started.
            .process_group(0);
        let mut child = suite
            .spawn()
            .with_context(|| format!("cannot run {}", binary.display()))?;
        let deadline = Instant::now() + Duration::from_secs(timeout.into());
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if Instant::now() > deadline {
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
                child.wait()?;
                break None;
            }
            thread::sleep(Duration::from_millis(50));
        };
        let secs = began.elapsed().as_secs_f64();
        match status {
            None => return Ok((Outcome::Timeout, secs, Some(name.clone()))),
            Some(s) if !s.success() => return Ok((Outcome::Caught, secs, Some(name.clone()))),
            Some(_) => {}
        }
    }
    if tests.is_empty() {
        bail!("no suites to run");
    }
    Ok((Outcome::Missed, began.elapsed().as_secs_f64(), None))
}
