//! The earlier `shaper` builds the upgrade tests attach with, and the baseline the bench
//! measures against (`shaper-user/lab/src/old_builds.rs`), built once each from their
//! commits.
//!
//! Each commit is exported with `git archive` (CI is a full clone, so every commit is
//! there) into `target/old-shaper/src/COMMIT` and built there with its own lock file, in a
//! target directory all old builds share (`target/old-shaper/target`: their dependencies
//! are mostly the same crates, built once); what was built is then copied out and the
//! sources removed: the debug binary to `target/old-shaper/COMMIT/shaper` (upgrade tests),
//! the release binary and its kernel object to `target/old-shaper/COMMIT/release/` (bench).
//! A build already there is not built again.
//!
//! Old commits build their kernel programs with `rustup run nightly` (aya-build's default,
//! or their own build script): whatever nightly is installed, which on a fresh machine is
//! newer than the LLVM bpf-linker reads. They are built with a `rustup` first on PATH
//! (`target/old-shaper/bin/rustup`) that runs the pinned toolchain
//! ([`workspace::EBPF_TOOLCHAIN`]) where they ask for `nightly`, as today's build does.

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::{cmd, host, vm::json_string, workspace};

#[path = "../../shaper-user/lab/src/old_builds.rs"]
#[expect(
    dead_code,
    reason = "`wait_for_build` is the upgrade tests', waiting on the locks taken here"
)]
mod old_builds;

/// Builds the old shaper the kernel matrix's guests need (they upgrade from the newest old
/// build only) unless it is built.
pub fn build_newest() -> Result<()> {
    let newest = old_builds::OLD_BUILDS
        .last()
        .context("the list of old builds is empty")?;
    let lock = lock(newest.commit)?;
    build_one(newest, lock, &mut io::stdout())
}

/// Builds `build`'s debug `shaper` unless it is built, holding `lock` (its commit's) until
/// it is; cargo's progress goes to `log`.
fn build_one(build: &old_builds::OldBuild, lock: fs::File, log: &mut dyn Write) -> Result<()> {
    let bin = old_builds::binary(&workspace::target_dir(), build.commit);
    if bin.is_file() {
        return Ok(());
    }
    writeln!(
        log,
        "building the shaper of commit {} (pin layout {}) for the upgrade tests",
        build.commit, build.layout
    )?;
    let built = build_commit(build.commit, false, log)?;
    copy_whole(&built.shaper, &bin)?;
    remove_sources(build.commit)?;
    drop(lock);
    Ok(())
}

/// The old builds the upgrade tests attach with, being built in a thread of their own
/// ([`build_all_beside`]).
pub struct Building {
    /// Returns how long the builds took (waiting for another run's included).
    thread: thread::JoinHandle<(Duration, Result<()>)>,
    log: PathBuf,
}

/// Starts building, in a thread, every old shaper the upgrade tests need that is not built
/// yet, newest first: `cargo xtask test` runs its host tests and kernel tests meanwhile,
/// and an upgrade test that needs one waits on its lock (`old_builds::wait_for_build`),
/// which this takes for every build before it returns. A build another run holds (the
/// kernel matrix beside, building the newest) is waited for in the thread. Cargo's output
/// goes to `target/old-shaper/build.log`, printed if a build fails.
pub fn build_all_beside() -> Result<Building> {
    let target = workspace::target_dir();
    let mut todo = Vec::new();
    for build in old_builds::OLD_BUILDS.iter().rev() {
        if old_builds::binary(&target, build.commit).is_file() {
            continue;
        }
        let file = lock_file(build.commit)?;
        let held = file.try_lock().is_ok();
        todo.push((*build, file, held));
    }
    let log = old_builds::dir(&target).join("build.log");
    let mut out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    if !todo.is_empty() {
        println!(
            "building {} old shaper(s) for the upgrade tests beside the tests (log: {})",
            todo.len(),
            log.display()
        );
    }
    let started = Instant::now();
    let thread = thread::spawn(move || {
        let built = todo.into_iter().try_for_each(|(build, file, held)| {
            if !held {
                file.lock()?;
            }
            build_one(&build, file, &mut out)
        });
        (started.elapsed(), built)
    });
    Ok(Building { thread, log })
}

impl Building {
    /// Waits for the builds to end; how long they took, and whether they all succeeded.
    pub fn wait(self) -> (Duration, Result<()>) {
        let (took, result) = self.thread.join().unwrap_or_else(|_| {
            (
                Duration::ZERO,
                Err(anyhow!("the old builds' thread panicked")),
            )
        });
        if let Err(err) = &result {
            let log = fs::read_to_string(&self.log).unwrap_or_default();
            println!("{log}");
            println!("the old builds for the upgrade tests failed: {err:#}");
        }
        (took, result)
    }
}

/// Builds the bench's baseline ([`old_builds::BASELINE`]) for release unless it is built;
/// returns its directory (`shaper` and `shaper-ebpf`).
pub fn build_baseline() -> Result<PathBuf> {
    let build = old_builds::BASELINE;
    let _lock = lock(build.commit)?;
    let dir = old_builds::release_dir(&workspace::target_dir(), build.commit);
    let shaper = dir.join(old_builds::RELEASE_SHAPER);
    let object = dir.join(old_builds::RELEASE_OBJECT);
    if shaper.is_file() && object.is_file() {
        return Ok(dir);
    }
    println!(
        "building the shaper of commit {} (pin layout {}) for release: the bench's baseline",
        build.commit, build.layout
    );
    let built = build_commit(build.commit, true, &mut io::stdout())?;
    // The object first: a binary in place says the build is whole.
    copy_whole(&built.object, &object)?;
    copy_whole(&built.shaper, &shaper)?;
    remove_sources(build.commit)?;
    Ok(dir)
}

/// Takes `commit`'s lock ([`old_builds::lock_path`]), waiting for it: two runs at once
/// (`.ci/run` runs the host tests and the kernel matrix side by side) would otherwise export
/// and build the same commit into the same directories together, and an upgrade test must
/// not take a binary being built. Released when the file is dropped.
fn lock(commit: &str) -> Result<fs::File> {
    let file = lock_file(commit)?;
    if file.try_lock().is_err() {
        println!("waiting for another run's build of commit {commit}");
        file.lock()
            .with_context(|| format!("locking the build of commit {commit}"))?;
    }
    Ok(file)
}

fn lock_file(commit: &str) -> Result<fs::File> {
    let path = old_builds::lock_path(&workspace::target_dir(), commit);
    fs::create_dir_all(path.parent().context("a lock file in a directory")?)?;
    fs::File::create(&path).with_context(|| format!("creating {}", path.display()))
}

/// What building one commit produced, in the shared target directory.
struct Built {
    shaper: PathBuf,
    /// The kernel object shaper-user's build script built (and the binary embeds).
    object: PathBuf,
}

/// Exports `commit` and builds its `shaper` (debug, or `release`), with its own lock file.
fn build_commit(commit: &str, release: bool, log: &mut dyn Write) -> Result<Built> {
    let dir = old_builds::dir(&workspace::target_dir());
    let src = dir.join("src").join(commit);
    export(commit, &src)?;
    let shim = pinned_rustup(&dir.join("bin"))?;
    let path = std::env::join_paths(std::iter::once(shim).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let mut cargo = Command::new("cargo");
    cargo
        .current_dir(&src)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        // Only run by the tests, never debugged: no debug info to build and link.
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .args(["build", "--locked", "-p", "shaper-user", "--bin", "shaper"])
        .args(release.then_some("--release"))
        // Cargo's progress and errors go to the terminal; its JSON (stdout) says where
        // the binary and the build script's output are.
        .args(["--message-format=json-render-diagnostics"]);
    let line = cmd::display(&cargo);
    writeln!(log, "$ {line}")?;
    log.flush()?;
    let output = cargo
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    log.write_all(&output.stderr)?;
    if !output.status.success() {
        bail!("`{line}` failed ({})", output.status);
    }
    built(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("`{line}` said nothing of the shaper binary or its object"))
}

/// Writes into `bin` a `rustup` that runs the pinned toolchain where it is asked for
/// `nightly` (`rustup run nightly ...`) and is the real one otherwise; returns `bin`.
fn pinned_rustup(bin: &Path) -> Result<PathBuf> {
    let real = host::find_program("rustup")
        .filter(|found| found.parent() != Some(bin))
        .context("rustup is not on PATH (`cargo xtask setup` needs it)")?;
    let script = format!(
        "#!/bin/sh\n\
         # Written by cargo xtask (xtask/src/old_shaper.rs) for the builds of old commits.\n\
         if [ \"$1\" = run ] && [ \"$2\" = nightly ]; then\n\
         \x20   shift 2\n\
         \x20   exec '{real}' run {toolchain} \"$@\"\n\
         fi\n\
         exec '{real}' \"$@\"\n",
        real = real.display(),
        toolchain = workspace::EBPF_TOOLCHAIN,
    );
    fs::create_dir_all(bin)?;
    let shim = bin.join("rustup");
    fs::write(&shim, script).with_context(|| format!("writing {}", shim.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o755))?;
    Ok(bin.to_owned())
}

/// The `shaper` executable and shaper-user's build script output in cargo's JSON messages.
fn built(messages: &str) -> Option<Built> {
    let mut shaper = None;
    let mut object = None;
    for line in messages.lines() {
        let from_shaper_user = json_string(line, "package_id").is_some_and(|id| {
            // `path+file:///.../shaper-user#0.1.0` (cargo 1.77 on) or
            // `shaper-user 0.1.0 (path+file:///...)`.
            id.contains("/shaper-user#") || id.starts_with("shaper-user ")
        });
        if !from_shaper_user {
            continue;
        }
        match json_string(line, "reason").as_deref() {
            Some("compiler-artifact") => {
                if let Some(exe) = json_string(line, "executable") {
                    shaper = Some(PathBuf::from(exe));
                }
            }
            Some("build-script-executed") => {
                object = json_string(line, "out_dir")
                    .map(|out| Path::new(&out).join(old_builds::RELEASE_OBJECT));
            }
            _ => {}
        }
    }
    Some(Built {
        shaper: shaper?,
        object: object?,
    })
}

/// Copies `from` to `to` under another name and renames it: a file at `to` is always whole.
fn copy_whole(from: &Path, to: &Path) -> Result<()> {
    let parent = to.parent().context("a build output has a directory")?;
    fs::create_dir_all(parent)?;
    let name = to.file_name().context("a build output has a name")?;
    let partial = parent.join(format!("{}.partial", name.to_string_lossy()));
    fs::copy(from, &partial)
        .with_context(|| format!("copying {} to {}", from.display(), partial.display()))?;
    fs::rename(&partial, to)?;
    Ok(())
}

fn remove_sources(commit: &str) -> Result<()> {
    let src = old_builds::dir(&workspace::target_dir())
        .join("src")
        .join(commit);
    fs::remove_dir_all(&src).with_context(|| format!("removing {}", src.display()))
}

/// The tree of `commit`, without the packages an old commit tracked by mistake, in `dst`.
fn export(commit: &str, dst: &Path) -> Result<()> {
    if dst.exists() {
        fs::remove_dir_all(dst)?;
    }
    fs::create_dir_all(dst)?;
    let mut git = Command::new("git")
        .current_dir(workspace::root())
        .args([
            "archive",
            "--format=tar",
            commit,
            "--",
            ".",
            ":(exclude)*.deb",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start git archive")?;
    let stdout = git.stdout.take().context("no stdout")?;
    // `-m`: the files get the time of the export, not the commit's. The old builds share a
    // target directory in which cargo names a workspace crate's artifacts by its path
    // relative to the workspace, the same for every commit, and thinks them fresh if its
    // sources are older than they are: an older commit's sources always would be.
    let tar = Command::new("tar")
        .args(["-x", "-m"])
        .arg("-C")
        .arg(dst)
        .stdin(stdout)
        .status()
        .context("could not start tar")?;
    let archived = git.wait()?;
    if !archived.success() || !tar.success() {
        bail!(
            "could not export commit {commit} (git archive: {archived}, tar: {tar}): the upgrade tests and the bench need the repository's history"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_binary_and_the_object_in_cargos_messages() {
        let messages = [
            r#"{"reason":"build-script-executed","package_id":"path+file:///t/src/c/shaper-common#0.1.0","out_dir":"/t/release/build/shaper-common-1/out"}"#,
            r#"{"reason":"build-script-executed","package_id":"path+file:///t/src/c/shaper-user#0.1.0","linked_libs":[],"out_dir":"/t/release/build/shaper-user-2/out"}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///t/src/c/shaper-user#0.1.0","target":{"name":"shaper"},"executable":"/t/release/shaper","fresh":false}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        let b = built(&messages).unwrap();
        assert_eq!(b.shaper, Path::new("/t/release/shaper"));
        assert_eq!(
            b.object,
            Path::new("/t/release/build/shaper-user-2/out/shaper-ebpf")
        );
        // The older package id form.
        let old = messages.replace(
            "path+file:///t/src/c/shaper-user#0.1.0",
            "shaper-user 0.1.0 (path+file:///t/src/c/shaper-user)",
        );
        assert!(built(&old).is_some());
        // No build script output: nothing to take the object from.
        assert!(built(&messages.lines().skip(2).collect::<Vec<_>>().join("\n")).is_none());
    }
}
