//! `cargo xtask mutants`: mutation testing with cargo-mutants over the code whose tests run
//! on the host: `shaper-common` (the GCRA arithmetic, layouts, rescaling, shaping) and the
//! userspace library's logic that has unit tests ([`SCOPES`]). Each mutant (one function's
//! body replaced, one operator swapped, ...) is built and tested in a copy of the tree, with
//! the tests of the package it is in; a mutant no test fails is "missed".
//!
//! Not part of `.ci/run`: a run takes tens of minutes. Results land in
//! `target/mutants/<scopes>/mutants.out/` (`caught.txt`, `missed.txt`, `timeout.txt`,
//! `unviable.txt`, `outcomes.json`); docs/contributing/testing.md keeps the last counts and
//! why each missed mutant left is left.
//!
//! The kernel crate (`--scope kernel --in-place`, never part of `all`) is mutated by a
//! driver of its own ([`kernel`]): its tests load it into a kernel, as root. Modules of
//! shaper-user guarded only by root tests (`policy/table.rs`'s restore, the journal) are
//! out of scope.

use std::{fs, process::ExitCode};

use anyhow::{Context as _, Result};

use crate::{cmd, setup, workspace};

mod kernel;

/// A set of files to mutate, and the tests cargo-mutants runs for them: those of the
/// package the file is in, with `test_args`.
pub struct Scope {
    /// What `--scope` calls it.
    pub name: &'static str,
    /// The files, relative to the root (globs as cargo-mutants reads them).
    files: &'static [&'static str],
    /// Passed to `cargo test` after the package.
    test_args: &'static [&'static str],
    why: &'static str,
}

/// The kernel crate's scope: its files and tests are [`kernel`]'s.
pub const KERNEL: Scope = Scope {
    name: "kernel",
    files: &["shaper-ebpf/src/**/*.rs"],
    test_args: &[],
    why: "the kernel programs, tested by the root BPF_PROG_TEST_RUN suites",
};

/// The scopes whose tests run on the host (`all`).
pub const SCOPES: &[Scope] = &[
    Scope {
        name: "common",
        files: &["shaper-common/src/**/*.rs"],
        test_args: &[],
        why: "the GCRA arithmetic, configuration scaling and rescaling, shape mode's stamps, \
              pinned layouts: unit tests against a simulated clock (`cargo test -p \
              shaper-common`)",
    },
    Scope {
        name: "user",
        files: &[
            "shaper-user/src/units.rs",
            "shaper-user/src/policy/spec.rs",
            "shaper-user/src/config_file/model.rs",
            "shaper-user/src/metrics.rs",
            "shaper-user/src/upgrade/mod.rs",
            "shaper-user/src/upgrade/layout*.rs",
            "shaper-user/src/admission.rs",
            "shaper-user/src/sources.rs",
        ],
        // The unit tests beside the code: the package's integration test (the .deb's
        // parts under promtool and the like) guards none of these files.
        test_args: &["--lib"],
        why: "the userspace library's logic with unit tests: units, policy specs, the \
              configuration model, metrics rendering, upgrade decoding of every earlier \
              layout, admission and source keys (`cargo test -p shaper-user --lib`)",
    },
];

#[derive(clap::Args)]
pub struct Args {
    /// Which files: `common`, `user`, `kernel` (comma-separated), or `all` (common and
    /// user: kernel needs root and --in-place)
    #[arg(long, default_value = "all", value_parser = scopes)]
    pub scope: Scopes,
    /// Mutate this checkout's files themselves (the kernel scope requires it): only in a
    /// worktree no one else builds in, since every build there builds the mutant
    #[arg(long)]
    pub in_place: bool,
    /// Seconds a mutant's tests may take before it counts as a timeout (kernel: each suite)
    #[arg(long, default_value_t = 60)]
    pub timeout: u32,
    /// Options passed on to cargo-mutants, e.g. `-- --list` or `-- --re 'gcra'`
    #[arg(last = true)]
    pub mutants_args: Vec<String>,
}

#[derive(Clone)]
pub struct Scopes(pub Vec<&'static Scope>);

pub fn scopes(arg: &str) -> Result<Scopes, String> {
    if arg == "all" {
        return Ok(Scopes(SCOPES.iter().collect()));
    }
    arg.split(',')
        .map(|name| {
            SCOPES
                .iter()
                .chain([&KERNEL])
                .find(|s| s.name == name.trim())
                .ok_or_else(|| {
                    let names: Vec<&str> = SCOPES.iter().chain([&KERNEL]).map(|s| s.name).collect();
                    format!("no scope '{name}': {}, or all", names.join(", "))
                })
        })
        .collect::<Result<_, _>>()
        .map(Scopes)
}

pub fn run(args: &Args) -> Result<ExitCode> {
    setup::run(setup::For::Mutants)?;
    let mut clean = true;
    for scope in &args.scope.0 {
        clean &= if scope.name == KERNEL.name {
            kernel::run(args)?
        } else {
            run_scope(scope, args)?
        };
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs cargo-mutants over one scope; whether it missed nothing and nothing timed out.
fn run_scope(scope: &Scope, args: &Args) -> Result<bool> {
    println!("mutating {}: {}", scope.name, scope.why);
    let output = workspace::target_dir().join("mutants").join(scope.name);
    // cargo-mutants makes its output directory, not the directories above it.
    fs::create_dir_all(&output)?;
    let mut mutants = workspace::cargo();
    mutants.arg("mutants");
    if args.in_place {
        // Asked for: this checkout is the caller's alone (cargo-mutants refuses --jobs
        // with it).
        mutants.arg("--in-place");
    } else {
        // A copy of the tree (others may be building this one), with a target directory
        // of its own, built without debug info to keep it small.
        mutants.args(["--jobs", "1"]);
    }
    mutants
        .args(["--timeout", &args.timeout.to_string()])
        .args(["--build-timeout", "900"])
        .arg("--output")
        .arg(&output)
        // Test code cargo-mutants does not see as such (`#[cfg(all(test, feature =
        // "user"))]` modules): mutating a test only slows the run.
        .args(["--exclude-re", "tests::"])
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_PROFILE_TEST_DEBUG", "0");
    for arg in scope.test_args {
        mutants.arg(format!("--cargo-test-arg={arg}"));
    }
    for file in scope.files {
        mutants.args(["--file", file]);
    }
    mutants.args(&args.mutants_args);
    // cargo-mutants exits non-zero when it missed a mutant (2) or one timed out (3): the
    // counts are the result, printed below, so only a failure to run at all is an error.
    let line = cmd::display(&mutants);
    println!("$ {line}");
    let status = mutants
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    let listed = |name: &str| {
        fs::read_to_string(output.join("mutants.out").join(name))
            .map(|text| text.lines().filter(|l| !l.trim().is_empty()).count())
            .ok()
    };
    let (Some(caught), Some(missed), Some(timeout), Some(unviable)) = (
        listed("caught.txt"),
        listed("missed.txt"),
        listed("timeout.txt"),
        listed("unviable.txt"),
    ) else {
        // --list and the like write no outcomes.
        return Ok(status.success());
    };
    println!(
        "mutants of {}: {caught} caught, {missed} missed, {timeout} timed out, {unviable} \
         unviable (the missed: {})",
        scope.name,
        output.join("mutants.out/missed.txt").display()
    );
    Ok(missed == 0 && timeout == 0)
}
