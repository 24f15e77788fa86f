//! Builds the kernel programs (shaper-ebpf's binaries: `shaper-ebpf`, the product, and
//! `shaper-ebpf-bench`, the lab's) with the pinned nightly toolchain
//! (`shaper-ebpf/rust-toolchain.toml`) and bpf-linker, once for
//! every profile and command (build, check, clippy, test, release): the eBPF build is
//! always a release build, in `target/ebpf/`, whatever this one is. The objects are
//! copied into OUT_DIR, where the loader embeds its own with `include_bytes_aligned!`;
//! the lab finds them through `DEP_SHAPER_EBPF_OUT_DIR` (this package `links` them).
//!
//! Quiet unless there is something to say: cargo's progress lines are not forwarded; the
//! compiler's warnings are (as cargo warnings), and on failure everything it printed.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

const PACKAGE: &str = "shaper-ebpf";
const BINARIES: [&str; 2] = ["shaper-ebpf", "shaper-ebpf-bench"];

fn main() {
    // One line, without a backtrace: what the compiler said is above it.
    if let Err(e) = build() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn build() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest
        .parent()
        .context("shaper-user is in the workspace")?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // The crate's own files; its library (and shaper-common under it) is a
    // build-dependency, which cargo watches.
    println!(
        "cargo::rerun-if-changed={}",
        workspace.join(PACKAGE).display()
    );
    println!("cargo::rerun-if-env-changed=CARGO_TARGET_DIR");
    println!("cargo::metadata=out_dir={}", out_dir.display());

    let target = match env::var("CARGO_CFG_TARGET_ENDIAN")?.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("unsupported endianness {other}"),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH")?;
    let target_dir = ebpf_target_dir(workspace);

    let toolchain = ebpf_toolchain(workspace)?;
    let mut cargo = Command::new("rustup");
    cargo
        .args(["run", &toolchain, "cargo", "build", "--quiet", "--release"])
        .args(["--package", PACKAGE, "--bins", "--target", target])
        .args(["-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(workspace)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            [
                format!("--cfg=bpf_target_arch=\"{arch}\""),
                "-Cdebuginfo=2".to_owned(),
                "-Clink-arg=--btf".to_owned(),
            ]
            .join("\x1f"),
        )
        // The pinned toolchain's own compiler, not this build's (nor clippy's wrapper).
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let output = cargo.output().with_context(|| {
        format!("cannot run {cargo:?} (`cargo xtask setup` installs {toolchain})")
    })?;
    let said = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        eprintln!("{said}");
        bail!(
            "building the kernel programs failed ({}): {cargo:?}",
            output.status
        );
    }
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo::warning={line}");
    }
    let built = target_dir.join(target).join("release");
    for binary in BINARIES {
        let from = built.join(binary);
        std::fs::copy(&from, out_dir.join(binary))
            .with_context(|| format!("cannot copy {}", from.display()))?;
    }
    Ok(())
}

/// `ebpf/` in the workspace's target directory: shared by every profile of this build,
/// apart from the host builds' own directories (cargo locks those while this runs).
fn ebpf_target_dir(workspace: &Path) -> PathBuf {
    let target = match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace.join(dir),
        _ => workspace.join("target"),
    };
    target.join("ebpf")
}

/// The channel `shaper-ebpf/rust-toolchain.toml` pins (`channel = "nightly-YYYY-MM-DD"`).
fn ebpf_toolchain(workspace: &Path) -> Result<String> {
    // In the package's directory, which cargo already watches.
    let file = workspace.join(PACKAGE).join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim_start().strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .next()
        .with_context(|| format!("{} names no channel", file.display()))
}
