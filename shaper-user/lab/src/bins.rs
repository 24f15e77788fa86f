//! The `shaper` binary the tests, the demo and the benchmarks drive.
//!
//! It belongs to another package (`shaper-user`), so cargo gives this one no
//! `CARGO_BIN_EXE_shaper`: it is found beside the running executable, as cargo lays out its
//! target directory (`target/<profile>/shaper`, with test binaries in
//! `target/<profile>/deps/`), or at `$SHAPER_BIN`. `cargo xtask test` builds it first.

use std::{
    env,
    path::{Path, PathBuf},
    sync::LazyLock,
};

use anyhow::{Context as _, Result, ensure};

/// The environment variable that names the `shaper` binary explicitly.
pub const SHAPER_BIN_VAR: &str = "SHAPER_BIN";

/// Where the `shaper` binary is, checked to exist.
pub fn locate() -> Result<PathBuf> {
    let path = match env::var_os(SHAPER_BIN_VAR) {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = env::current_exe().context("cannot find this executable's path")?;
            let dir = exe.parent().context("an executable has a directory")?;
            let profile_dir = if dir.ends_with("deps") {
                dir.parent().unwrap_or(dir)
            } else {
                dir
            };
            profile_dir.join("shaper")
        }
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
