//! The earlier `shaper` builds the upgrade tests attach with
//! (`shaper-user/lab/src/old_builds.rs`), built once each from their commits.
//!
//! Each commit is exported with `git archive` (CI is a full clone, so every commit is
//! there) into `target/old-shaper/src/COMMIT` and built there with its own lock file, in a
//! target directory all old builds share (`target/old-shaper/target`: their dependencies
//! are mostly the same crates, built once); the binary is then copied to
//! `target/old-shaper/COMMIT/shaper` and the sources removed. A binary already there is
//! not built again.

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{cmd, workspace};

#[path = "../../shaper-user/lab/src/old_builds.rs"]
mod old_builds;

/// Builds every old shaper that is not built yet.
pub fn build_all() -> Result<()> {
    let target = workspace::target_dir();
    for build in old_builds::OLD_BUILDS {
        let bin = old_builds::binary(&target, build.commit);
        if bin.is_file() {
            continue;
        }
        println!(
            "building the shaper of commit {} (pin layout {}) for the upgrade tests",
            build.commit, build.layout
        );
        let dir = old_builds::dir(&target);
        let src = dir.join("src").join(build.commit);
        export(build.commit, &src)?;
        cmd::run(
            Command::new("cargo")
                .current_dir(&src)
                .env("CARGO_TARGET_DIR", dir.join("target"))
                .args(["build", "--locked", "-p", "shaper-user", "--bin", "shaper"]),
        )?;
        let built = dir.join("target/debug/shaper");
        let parent = bin.parent().context("a binary has a directory")?;
        fs::create_dir_all(parent)?;
        // Copied under another name and renamed: a binary at `bin` is always whole.
        let partial = parent.join("shaper.partial");
        fs::copy(&built, &partial)
            .with_context(|| format!("copying {} to {}", built.display(), partial.display()))?;
        fs::rename(&partial, &bin)?;
        fs::remove_dir_all(&src)?;
    }
    Ok(())
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
            "could not export commit {commit} (git archive: {archived}, tar: {tar}): the upgrade tests need the repository's history"
        );
    }
    Ok(())
}
