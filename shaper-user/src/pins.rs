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
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use shaper_common::maps::{
    PIN_ADMISSION, PIN_AGGREGATES, PIN_CONFIG, PIN_COUNTERS, PIN_COUNTERS_CARRIED, PIN_EVENTS,
    PIN_LAYOUT, PIN_LINK, PIN_POLICIES, PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED,
    PIN_PREFIXES_V4, PIN_PREFIXES_V6, PIN_ROOT, PIN_SOURCES, PIN_SOURCES6, PIN_TC_PROG,
    PIN_UPGRADE_PROG, PIN_WATCH,
};

const NETNS_DIR: &str = "netns";
/// Appended to an interface's name for the directory an upgrade stages its pins in. The
/// kernel refuses a colon in interface names, so it can never be an attachment's.
const STAGING_SUFFIX: &str = ":new";

/// The subdirectory of an interface's pins that holds those of its egress.
const EGRESS_DIR: &str = "egress";

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
    /// directories left empty, up to and including the root. Missing pins are not an
    /// error: this also cleans up after a failed attach.
    pub fn remove_pins(&self) -> io::Result<()> {
        remove_dir_of_pins(&self.staging())?;
        let dir = self.dir();
        remove_dir_of_pins(&dir)?;
        // Parents go only when empty; another attachment's pins keep them.
        let mut parent = dir.parent();
        while let Some(p) = parent {
            if fs::remove_dir(p).is_err() || p == Path::new(PIN_ROOT) {
                break;
            }
            parent = p.parent();
        }
        Ok(())
    }
}

/// Removes the pins in `dir`, and `dir` unless another direction's pins are below it;
/// nothing if it does not exist.
pub fn remove_dir_of_pins(dir: &Path) -> io::Result<()> {
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
    if dir.join(EGRESS_DIR).is_dir() {
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
