//! Where an attachment's pins live on bpffs.
//!
//! `/sys/fs/bpf/shaper/IFACE/` for an interface of the initial network namespace, and
//! `/sys/fs/bpf/shaper/netns/NETNS/IFACE/` for one in a named namespace (`shaper -n`).
//! Each directory holds the link and the maps (`shaper_common::maps::PIN_*`, as the
//! layout table `shaper_common::layout` lists them) of the interface's ingress; its
//! egress has the same pins one level down, in `IFACE/egress/`, so that ingress pins stay
//! where earlier builds put them. Beside each, `...:new` holds the pins of an upgrade
//! under way (`crate::upgrade`); no interface name has a colon.

use std::{
    fs, io,
    path::{Component, Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use shaper_common::maps::{
    PIN_ADMISSION, PIN_AGGREGATES, PIN_CONFIG, PIN_COUNTERS, PIN_COUNTERS_CARRIED, PIN_EVENTS,
    PIN_LAYOUT, PIN_LINK, PIN_POLICIES, PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED,
    PIN_PREFIXES_V4, PIN_PREFIXES_V6, PIN_ROOT, PIN_SOURCES, PIN_SOURCES6, PIN_TC_PROG,
    PIN_UPGRADE_PROG, PIN_WATCH,
};

use crate::owned::{self, Sharing, Untrusted};

const NETNS_DIR: &str = "netns";
/// Appended to an interface's name for the directory an upgrade stages its pins in. The
/// kernel refuses a colon in interface names, so it can never be an attachment's.
const STAGING_SUFFIX: &str = ":new";

/// The subdirectory of an interface's pins that holds those of its egress.
const EGRESS_DIR: &str = "egress";

/// The longest network namespace name `ip netns` takes (NAME_MAX).
const NETNS_NAME_MAX: usize = 255;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(
        "invalid interface name '{0}' (1 to 15 bytes, not '.' or '..', without '/', ':' or spaces)"
    )]
    BadIface(String),
    #[error(
        "an interface named '{NETNS_DIR}' is refused outside a named namespace (its pin directory would be that of the named namespaces)"
    )]
    ReservedIface,
    #[error(
        "invalid network namespace name '{0}' (as `ip netns` takes: 1 to 255 bytes, not '.' or '..', without '/')"
    )]
    BadNetns(String),
    #[error(
        "unsafe pin directory: {0}; shaper pins only where root alone can write (remove it, and mount bpffs with mode=0700)"
    )]
    Untrusted(Untrusted),
    #[error("cannot make the pin directory {path}: {error}")]
    Make { path: String, error: io::Error },
}

impl From<Untrusted> for PinError {
    fn from(e: Untrusted) -> Self {
        Self::Untrusted(e)
    }
}

/// Refuses what the kernel would refuse as an interface name (`dev_valid_name`): it
/// becomes a path under the pin root, so `..` or a `/` must never get that far.
pub fn check_iface_name(name: &str) -> Result<(), PinError> {
    // The kernel's isspace(), 0xa0 included.
    let bad = |b: u8| matches!(b, b'/' | b':' | 0 | b' ' | b'\t'..=b'\r' | 0xa0);
    let ok = !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name.bytes().any(bad);
    ok.then_some(())
        .ok_or_else(|| PinError::BadIface(name.to_owned()))
}

/// Refuses what `ip netns` would refuse as a namespace name (and a NUL byte).
pub fn check_netns_name(name: &str) -> Result<(), PinError> {
    let ok = !name.is_empty()
        && name.len() <= NETNS_NAME_MAX
        && name != "."
        && name != ".."
        && !name.bytes().any(|b| b == b'/' || b == 0);
    ok.then_some(())
        .ok_or_else(|| PinError::BadNetns(name.to_owned()))
}

/// Checks every directory from bpffs's root down to `dir` (under the pin root) that
/// exists, without following symlinks: bpffs's root root's, and writable by others only
/// with the sticky bit (its default, 1777); the pin root and each directory below it
/// root's and writable by no one else. Checked top down, so that once a directory
/// passes, no one else can replace what is in it before it is used.
pub fn check_dirs(dir: &Path) -> Result<(), PinError> {
    let root = Path::new(PIN_ROOT);
    let bpffs = root.parent().unwrap_or(Path::new("/"));
    let below = relative(dir)?;
    if owned::check_dir(bpffs, Sharing::Sticky)?.is_none() {
        return Ok(());
    }
    let mut path = root.to_path_buf();
    if owned::check_dir(&path, Sharing::None)?.is_none() {
        return Ok(());
    }
    for part in below.components() {
        path.push(part);
        if owned::check_dir(&path, Sharing::None)?.is_none() {
            break;
        }
    }
    Ok(())
}

/// `dir` below the pin root, made of names only (no `..`, no `.`).
fn relative(dir: &Path) -> Result<&Path, PinError> {
    let untrusted = || {
        PinError::Untrusted(Untrusted {
            path: dir.display().to_string(),
            problem: owned::Problem::NotNames,
        })
    };
    let below = dir.strip_prefix(PIN_ROOT).map_err(|_| untrusted())?;
    if below
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(untrusted());
    }
    Ok(below)
}

/// Makes `dir` and every directory above it up to the pin root that is missing, each
/// mode 0700, after checking those there ([`check_dirs`]); the pin root is set to 0700 if
/// it is looser (an earlier build made it 0755).
pub fn make_dirs(dir: &Path) -> Result<(), PinError> {
    check_dirs(dir)?;
    let make_err = |path: &Path| {
        let path = path.display().to_string();
        move |error| PinError::Make { path, error }
    };
    let root = Path::new(PIN_ROOT);
    let mut path = root.to_path_buf();
    make_dir(&path)?;
    let root_mode = owned::check_dir(root, Sharing::None)?.map(|m| {
        use std::os::unix::fs::PermissionsExt as _;
        m.permissions().mode() & 0o777
    });
    if root_mode.is_some_and(|m| m != 0o700) {
        owned::set_dir_mode(root, 0o700).map_err(make_err(root))?;
    }
    for part in relative(dir)?.components() {
        path.push(part);
        make_dir(&path)?;
    }
    Ok(())
}

/// Makes the directory `path` (mode 0700) if it is not there, and checks it.
fn make_dir(path: &Path) -> Result<(), PinError> {
    use std::os::unix::fs::DirBuilderExt as _;
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(PinError::Make {
            path: path.display().to_string(),
            error: e,
        }),
        _ => match owned::check_dir(path, Sharing::None)? {
            Some(_) => Ok(()),
            None => Err(PinError::Make {
                path: path.display().to_string(),
                error: io::ErrorKind::NotFound.into(),
            }),
        },
    }
}

/// Checks bpffs's root and the pin root ([`check_dirs`]): before any command reads or
/// writes a pin.
pub fn check_root() -> Result<(), PinError> {
    check_dirs(Path::new(PIN_ROOT))
}

/// Which traffic of an interface: each direction has its own attachment, settings,
/// policies and sources.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Direction {
    /// What it receives.
    #[default]
    Ingress,
    /// What it sends.
    Egress,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

/// One direction of an interface shaper is (or is to be) attached to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub iface: String,
    /// The named network namespace, or `None` for the initial one.
    pub netns: Option<String>,
    pub direction: Direction,
}

impl Attachment {
    /// The interface's ingress.
    pub fn new(iface: &str, netns: Option<&str>) -> Self {
        Self::toward(iface, netns, Direction::Ingress)
    }

    pub fn toward(iface: &str, netns: Option<&str>, direction: Direction) -> Self {
        Self {
            iface: iface.to_owned(),
            netns: netns.map(str::to_owned),
            direction,
        }
    }

    /// The interface's pin directory: its ingress pins, and its egress directory.
    fn iface_dir(&self) -> PathBuf {
        let root = Path::new(PIN_ROOT);
        match &self.netns {
            None => root.join(&self.iface),
            Some(ns) => root.join(NETNS_DIR).join(ns).join(&self.iface),
        }
    }

    pub fn dir(&self) -> PathBuf {
        match self.direction {
            Direction::Ingress => self.iface_dir(),
            Direction::Egress => self.iface_dir().join(EGRESS_DIR),
        }
    }

    /// Where an upgrade stages the new pins, and where the old ones go once it has swapped
    /// them in.
    pub fn staging(&self) -> PathBuf {
        let dir = self.dir();
        let mut name = dir.file_name().unwrap_or_default().to_os_string();
        name.push(STAGING_SUFFIX);
        dir.with_file_name(name)
    }

    pub fn link(&self) -> PathBuf {
        self.dir().join(PIN_LINK)
    }
    /// The tc program of a clsact attachment, which has no bpf_link to pin.
    pub fn tc_prog(&self) -> PathBuf {
        self.dir().join(PIN_TC_PROG)
    }
    pub fn config(&self) -> PathBuf {
        self.dir().join(PIN_CONFIG)
    }
    pub fn sources(&self) -> PathBuf {
        self.dir().join(PIN_SOURCES)
    }
    pub fn sources6(&self) -> PathBuf {
        self.dir().join(PIN_SOURCES6)
    }
    pub fn counters(&self) -> PathBuf {
        self.dir().join(PIN_COUNTERS)
    }
    pub fn events(&self) -> PathBuf {
        self.dir().join(PIN_EVENTS)
    }
    pub fn watch(&self) -> PathBuf {
        self.dir().join(PIN_WATCH)
    }
    pub fn policies(&self) -> PathBuf {
        self.dir().join(PIN_POLICIES)
    }
    pub fn prefixes_v4(&self) -> PathBuf {
        self.dir().join(PIN_PREFIXES_V4)
    }
    pub fn prefixes_v6(&self) -> PathBuf {
        self.dir().join(PIN_PREFIXES_V6)
    }
    pub fn aggregates(&self) -> PathBuf {
        self.dir().join(PIN_AGGREGATES)
    }
    pub fn policy_stats(&self) -> PathBuf {
        self.dir().join(PIN_POLICY_STATS)
    }
    pub fn admission(&self) -> PathBuf {
        self.dir().join(PIN_ADMISSION)
    }
    pub fn layout(&self) -> PathBuf {
        self.dir().join(PIN_LAYOUT)
    }
    pub fn counters_carried(&self) -> PathBuf {
        self.dir().join(PIN_COUNTERS_CARRIED)
    }
    pub fn policy_stats_carried(&self) -> PathBuf {
        self.dir().join(PIN_POLICY_STATS_CARRIED)
    }
    pub fn upgrade_prog(&self) -> PathBuf {
        self.dir().join(PIN_UPGRADE_PROG)
    }

    /// The interface's egress pins as an upgrade of its ingress leaves them: the ingress
    /// directory is swapped whole with its staging directory, egress directory and all.
    pub fn egress_in_staging(&self) -> Option<(PathBuf, PathBuf)> {
        let ingress = Self::toward(&self.iface, self.netns.as_deref(), Direction::Ingress);
        let moved = ingress.staging().join(EGRESS_DIR);
        let home = ingress.dir().join(EGRESS_DIR);
        (moved.is_dir() && !home.exists()).then_some((moved, home))
    }

    /// Checks the names (before they become paths) and every directory down to this
    /// attachment's pins and to its staging directory ([`check_dirs`]).
    pub fn check(&self) -> Result<(), PinError> {
        self.check_names()?;
        check_dirs(&self.dir())?;
        check_dirs(&self.staging())
    }

    /// Refuses names that are not an interface's or a namespace's, and an interface
    /// whose pin directory would be another's.
    pub fn check_names(&self) -> Result<(), PinError> {
        check_iface_name(&self.iface)?;
        match &self.netns {
            Some(ns) => check_netns_name(ns),
            None if self.iface == NETNS_DIR => Err(PinError::ReservedIface),
            None => Ok(()),
        }
    }

    /// Whether shaper is attached here (its link, or its clsact program, is pinned).
    pub fn exists(&self) -> bool {
        self.link().exists() || self.tc_prog().exists()
    }

    /// `eth0`, `eth0 (netns blue)`, `eth0 egress`, `eth0 egress (netns blue)`.
    pub fn label(&self) -> String {
        let name = match self.direction {
            Direction::Ingress => self.iface.clone(),
            Direction::Egress => format!("{} egress", self.iface),
        };
        match &self.netns {
            None => name,
            Some(ns) => format!("{name} (netns {ns})"),
        }
    }

    /// ` --direction egress` for egress, nothing for ingress: what a command printed for
    /// the operator to run names.
    pub fn direction_flag(&self) -> &'static str {
        match self.direction {
            Direction::Ingress => "",
            Direction::Egress => " --direction egress",
        }
    }

    /// Removes every pin of this attachment (and of an upgrade of it under way) and the
    /// directories left empty, up to but not including the pin root (kept, so that no
    /// one else can make it on a bpffs others may write). Missing pins are not an error:
    /// this also cleans up after a failed attach.
    pub fn remove_pins(&self) -> io::Result<()> {
        remove_dir_of_pins(&self.staging())?;
        let dir = self.dir();
        remove_dir_of_pins(&dir)?;
        // Parents go only when empty; another attachment's pins keep them.
        let mut parent = dir.parent();
        while let Some(p) = parent {
            if p == Path::new(PIN_ROOT) || fs::remove_dir(p).is_err() {
                break;
            }
            parent = p.parent();
        }
        Ok(())
    }
}

/// Removes the pins in `dir`, and `dir` unless another direction's pins are below it;
/// nothing if it does not exist. Refuses (`PermissionDenied`) where a directory down to
/// it is not root's alone ([`check_dirs`]).
pub fn remove_dir_of_pins(dir: &Path) -> io::Result<()> {
    check_dirs(dir).map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))?;
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                if !entry.file_type()?.is_dir() {
                    fs::remove_file(entry.path())?;
                }
            }
            match fs::remove_dir(dir) {
                Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => Ok(()),
                r => r,
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `dir` holds pins of its own (not only another direction's directory).
fn has_pins(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
    })
}

/// The attachments of the interface whose pins are at `dir`: its ingress if it has pins
/// of its own, its egress if it has an egress directory.
fn of_iface(iface: &str, netns: Option<&str>, dir: &Path, found: &mut Vec<Attachment>) {
    if has_pins(dir) {
        found.push(Attachment::toward(iface, netns, Direction::Ingress));
    }
    // Not through a symlink (and then `check_dirs` refuses it before use).
    if fs::symlink_metadata(dir.join(EGRESS_DIR)).is_ok_and(|m| m.is_dir()) {
        found.push(Attachment::toward(iface, netns, Direction::Egress));
    }
}

/// Every attachment with pins on this host, in all namespaces, sorted.
pub fn list_all() -> io::Result<Vec<Attachment>> {
    let mut found = Vec::new();
    for iface in subdirs(Path::new(PIN_ROOT))? {
        if iface == NETNS_DIR || iface.ends_with(STAGING_SUFFIX) {
            continue;
        }
        of_iface(&iface, None, &Path::new(PIN_ROOT).join(&iface), &mut found);
    }
    for ns in subdirs(&Path::new(PIN_ROOT).join(NETNS_DIR))? {
        let ns_dir = Path::new(PIN_ROOT).join(NETNS_DIR).join(&ns);
        for iface in subdirs(&ns_dir)? {
            if !iface.ends_with(STAGING_SUFFIX) {
                of_iface(&iface, Some(&ns), &ns_dir.join(&iface), &mut found);
            }
        }
    }
    found.sort_by(|a, b| (&a.netns, &a.iface, a.direction).cmp(&(&b.netns, &b.iface, b.direction)));
    Ok(found)
}

fn subdirs(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(names)
}
