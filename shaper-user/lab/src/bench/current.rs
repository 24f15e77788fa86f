//! Whether the committed results measured today's kernel programs.
//!
//! A run records a digest of the kernel programs' sources ([`kernel_sources`]) in
//! `results.json` (`machine.kernel_sources_sha256`). Each change to those sources since
//! then must either come with a new run or be listed in `bench/stale.toml` with why it
//! was not measured and which figures it makes stale: the unit test below fails
//! otherwise, so a kernel change never lands with figures silently measured on another
//! program.
//!
//! The digest is of the sources, not the object file: the object embeds the paths it was
//! built at (its debug info), so it differs from one checkout to another for the same
//! programs. The sources are everything under `shaper-ebpf/` and `shaper-common/src/` and
//! their manifests (the toolchain is pinned in `shaper-ebpf/rust-toolchain.toml`, the
//! kernel crates' versions with `=` in the workspace's manifest).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

/// The results' directory, the stale list's name in it, and the sources' roots, relative
/// to the workspace's root.
pub const RESULTS_DIR: &str = "bench";
pub const STALE_FILE: &str = "stale.toml";
const SOURCES: &[&str] = &[
    "shaper-ebpf",
    "shaper-common/src",
    "shaper-common/Cargo.toml",
];

/// The workspace's root (this crate is `shaper-user/lab`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// SHA-256, in hex, of every file under the kernel programs' sources of the workspace at
/// `root`: each file's path relative to `root`, its length and its bytes, in path order.
pub fn kernel_sources(root: &Path) -> Result<String> {
    let mut files = Vec::new();
    for source in SOURCES {
        collect(root, &root.join(source), &mut files)?;
    }
    files.sort();
    let mut hash = Sha256::new();
    for relative in &files {
        let bytes = std::fs::read(root.join(relative))
            .with_context(|| format!("cannot read {}", relative.display()))?;
        hash.update(relative.as_os_str().as_encoded_bytes());
        hash.update([0]);
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The files under `path` (or `path` itself), relative to `root`; build outputs (a
/// `target` directory) left out.
fn collect(root: &Path, path: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if meta.is_file() {
        files.push(path.strip_prefix(root)?.to_owned());
        return Ok(());
    }
    if !meta.is_dir() || path.file_name().is_some_and(|n| n == "target") {
        return Ok(());
    }
    for entry in std::fs::read_dir(path)? {
        collect(root, &entry?.path(), files)?;
    }
    Ok(())
}

/// `bench/stale.toml`: the kernel sources since the last run, each with why it was not
/// measured.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaleList {
    #[serde(default)]
    pub stale: Vec<Stale>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stale {
    /// [`kernel_sources`] of the change.
    pub sources_sha256: String,
    /// The commit that made the change, or what it is called.
    pub change: String,
    /// Which figures it makes stale ("all kernel figures", "per-packet", ...).
    pub stale: String,
    /// Why the bench was not run again.
    pub why: String,
}

/// Whether the sources digest `digest` was measured (`measured`, from results.json) or is
/// listed in `list` with a reason; the one-line error saying what to do otherwise.
pub fn check(digest: &str, measured: Option<&str>, list: &StaleList) -> Result<()> {
    if measured == Some(digest) {
        return Ok(());
    }
    if let Some(s) = list.stale.iter().find(|s| s.sources_sha256 == digest) {
        if s.why.trim().is_empty() || s.stale.trim().is_empty() {
            bail!(
                "{RESULTS_DIR}/{STALE_FILE}: {} says no why or no stale",
                s.change
            );
        }
        return Ok(());
    }
    bail!(
        "the kernel programs' sources (sha256 {digest}) are not the ones \
         {RESULTS_DIR}/results.json measured ({}): run `cargo xtask bench`, or list them in \
         {RESULTS_DIR}/{STALE_FILE} with the figures they make stale and why",
        measured.unwrap_or("none recorded")
    )
}

/// The digest `results.json` in `dir` recorded, if any.
pub fn measured(dir: &Path) -> Result<Option<String>> {
    let path = dir.join("results.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    Ok(json["machine"]["kernel_sources_sha256"]
        .as_str()
        .map(str::to_owned))
}

/// The stale list in `dir` (none: empty).
pub fn stale_list(dir: &Path) -> Result<StaleList> {
    let path = dir.join(STALE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text).with_context(|| format!("in {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StaleList::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed results measured today's kernel programs, or `bench/stale.toml`
    /// says why not.
    #[test]
    fn the_committed_bench_measured_these_kernel_programs_or_says_why_not() {
        let root = workspace_root();
        let dir = root.join(RESULTS_DIR);
        let digest = kernel_sources(&root).unwrap();
        let measured = measured(&dir).unwrap();
        let list = stale_list(&dir).unwrap();
        if let Err(e) = check(&digest, measured.as_deref(), &list) {
            panic!("{e}");
        }
    }

    #[test]
    fn a_digest_neither_measured_nor_listed_is_refused() {
        let list: StaleList = toml::from_str(
            "[[stale]]\nsources_sha256 = \"b\"\nchange = \"x\"\nstale = \"all\"\nwhy = \"y\"\n",
        )
        .unwrap();
        assert!(check("a", Some("a"), &list).is_ok());
        assert!(check("b", Some("a"), &list).is_ok());
        let e = check("c", Some("a"), &list).unwrap_err().to_string();
        assert!(e.contains("sha256 c") && e.contains("stale.toml"), "{e}");
        let blank: StaleList = toml::from_str(
            "[[stale]]\nsources_sha256 = \"c\"\nchange = \"x\"\nstale = \"all\"\nwhy = \" \"\n",
        )
        .unwrap();
        assert!(check("c", None, &blank).is_err());
    }

    #[test]
    fn the_digest_follows_a_change_of_the_sources() {
        let dir = std::env::temp_dir().join(format!("shaper-digest-{}", std::process::id()));
        let src = dir.join("shaper-ebpf/src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(dir.join("shaper-common/src")).unwrap();
        std::fs::write(dir.join("shaper-common/Cargo.toml"), "x").unwrap();
        std::fs::write(src.join("a.rs"), "one").unwrap();
        let first = kernel_sources(&dir).unwrap();
        std::fs::write(src.join("a.rs"), "two").unwrap();
        let second = kernel_sources(&dir).unwrap();
        std::fs::create_dir_all(dir.join("shaper-ebpf/target")).unwrap();
        std::fs::write(dir.join("shaper-ebpf/target/out"), "built").unwrap();
        let third = kernel_sources(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_ne!(first, second);
        assert_eq!(second, third, "build outputs are not sources");
    }
}
