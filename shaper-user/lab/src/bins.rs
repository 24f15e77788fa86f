//! The `shaper` binary the tests, the demo and the benchmarks drive.
//!
//! It belongs to another package (`shaper-user`), so cargo gives this one no
//! `CARGO_BIN_EXE_shaper`: it is found beside the running executable, as cargo lays out its
//! target directory (`target/<profile>/shaper`, with test binaries in
//! `target/<profile>/deps/`), or at `$SHAPER_BIN`. `cargo xtask test` builds it first,
//! and the earlier builds the upgrade tests attach with ([`crate::old_builds`]).

use std::{
    env,
    path::{Path, PathBuf},
    sync::LazyLock,
};

use anyhow::{Context as _, Result, ensure};

use crate::old_builds;

/// The environment variable that names the `shaper` binary explicitly.
pub const SHAPER_BIN_VAR: &str = "SHAPER_BIN";

/// The directory of the running executable's profile (`target/<profile>`).
fn profile_dir() -> Result<PathBuf> {
    let exe = env::current_exe().context("cannot find this executable's path")?;
    let dir = exe.parent().context("an executable has a directory")?;
    Ok(if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    }
    .to_path_buf())
}

/// Where the `shaper` binary is, checked to exist.
pub fn locate() -> Result<PathBuf> {
    let path = match env::var_os(SHAPER_BIN_VAR) {
        Some(path) => PathBuf::from(path),
        None => profile_dir()?.join("shaper"),
    };
    ensure!(
        path.is_file(),
        "no shaper binary at {}: build it first (`cargo build -p shaper-user`, which `cargo \
         xtask test` does), or name it in ${SHAPER_BIN_VAR}",
        path.display()
    );
    Ok(path)
}

static SHAPER: LazyLock<Result<PathBuf, String>> =
    LazyLock::new(|| locate().map_err(|e| format!("{e:#}")));

/// [`locate`] for the tests: panics with what to do if there is no binary.
pub fn shaper() -> &'static Path {
    match &*SHAPER {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// Where `cargo xtask bench` builds the baseline ([`old_builds::BASELINE`], for release)
/// in the running executable's target directory.
pub fn baseline_dir() -> Result<PathBuf> {
    let target = profile_dir()?
        .parent()
        .context("the profile directory has a parent")?
        .to_path_buf();
    Ok(old_builds::release_dir(
        &target,
        old_builds::BASELINE.commit,
    ))
}

/// The `shaper` built from an earlier commit that writes pin `layout`, as `cargo xtask
/// test` builds it ([`crate::old_builds`]); panics with what to do if it is missing.
pub fn old_shaper(layout: u32) -> PathBuf {
    let build = old_builds::OLD_BUILDS
        .iter()
        .find(|b| b.layout == layout)
        .unwrap_or_else(|| panic!("no old build writes pin layout {layout}"));
    let target = profile_dir()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .expect("the test runs from the target directory");
    // `cargo xtask test` builds them beside the tests: one being built is waited for.
    old_builds::wait_for_build(&target, build.commit);
    let bin = old_builds::binary(&target, build.commit);
    assert!(
        bin.is_file(),
        "no shaper of commit {} at {}: `cargo xtask test` builds it",
        build.commit,
        bin.display()
    );
    bin
}
