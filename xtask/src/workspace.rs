//! Where the workspace and its build output are, and how to run cargo on the workspace.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The toolchain the kernel programs are built with: the channel
/// `shaper-ebpf/rust-toolchain.toml` pins, which shaper-user/build.rs reads (a test checks
/// they agree). A dated nightly whose LLVM is bpf-linker's (22): a newer nightly writes
/// bitcode bpf-linker 0.13 cannot read (`ERROR llvm: Invalid record`).
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

/// The workspace root: the parent of this crate's directory, fixed at compile time so xtask
/// works from any current directory.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask's manifest directory has a parent")
}

/// The test-only package (`shaper-lab`: the lab, the benchmarks, the kernel integration
/// tests), relative to the root.
pub const LAB_DIR: &str = "shaper-user/lab";

/// Builds every binary of the workspace (dev profile): the lab's tests drive the `shaper`
/// binary of another package, which `cargo test` alone does not build.
pub fn build_bins() -> Command {
    let mut cmd = cargo();
    cmd.args(["build", "--workspace", "--bins"]);
    cmd
}

/// Cargo's target directory for the workspace: `CARGO_TARGET_DIR` if set (relative to the root,
/// since that is where we run cargo), else `<root>/target`.
pub fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root().join(dir),
        _ => root().join("target"),
    }
}

/// A `cargo` command run in the workspace root, so workspace commands mean this workspace
/// whatever the caller's current directory.
pub fn cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root());
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_toolchain_is_the_one_the_build_runs() {
        let file = include_str!("../../shaper-ebpf/rust-toolchain.toml");
        assert!(
            file.lines()
                .any(|line| line.trim() == format!("channel = \"{EBPF_TOOLCHAIN}\"")),
            "shaper-ebpf/rust-toolchain.toml pins another channel than EBPF_TOOLCHAIN ({EBPF_TOOLCHAIN})"
        );
    }
}
