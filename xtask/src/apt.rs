//! apt for kernel packages of a Debian release other than this machine's, without touching
//! this machine's apt: a private state (package lists and cache) and sources list under
//! `target/apt/RELEASE/`, passed to each `apt-get` and `apt-cache` as options. The rest of
//! this machine's apt configuration (proxies, keyrings in `/usr/share/keyrings`) applies.

use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result};

use crate::{host, workspace};

/// A Debian release and where its packages come from.
pub struct Release {
    pub name: &'static str,
    /// `sources.list` lines.
    pub sources: &'static [&'static str],
}

/// Debian 11: its last kernels are 5.10.
pub const BULLSEYE: Release = Release {
    name: "bullseye",
    sources: &[
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main",
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bullseye-security main",
    ],
};

/// The options that make apt use `release`'s private state (made if missing), or this
/// machine's own; as root, with downloads written as root.
pub fn options(release: Option<&Release>) -> Result<Vec<String>> {
    let mut options = Vec::new();
    if host::is_root()? {
        // apt's download user (_apt) cannot write to a root-owned target/.
        options.extend(["-o".to_owned(), "APT::Sandbox::User=root".to_owned()]);
    }
    let Some(release) = release else {
        return Ok(options);
    };
    let dir: PathBuf = workspace::target_dir().join("apt").join(release.name);
    let (state, cache, parts) = (dir.join("state"), dir.join("cache"), dir.join("parts"));
    for d in [
        state.join("lists/partial"),
        cache.join("archives/partial"),
        parts.clone(),
    ] {
        fs::create_dir_all(&d).with_context(|| format!("could not create {}", d.display()))?;
    }
    let list = dir.join("sources.list");
    fs::write(&list, release.sources.join("\n") + "\n")
        .with_context(|| format!("could not write {}", list.display()))?;
    for (name, path) in [
        ("Dir::State", &state),
        ("Dir::Cache", &cache),
        ("Dir::Etc::SourceList", &list),
        ("Dir::Etc::SourceParts", &parts),
    ] {
        options.extend(["-o".to_owned(), format!("{name}={}", path.display())]);
    }
    Ok(options)
}
