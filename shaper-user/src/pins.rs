//! Where an attachment's pins live on bpffs.
//!
//! `/sys/fs/bpf/shaper/IFACE/` for an interface of the initial network namespace, and
//! `/sys/fs/bpf/shaper/netns/NETNS/IFACE/` for one in a named namespace (`shaper -n`).
//! Each directory holds the XDP link and the maps (`shaper_common::maps::PIN_*`, as the
//! layout table `shaper_common::layout` lists them). Beside it, `IFACE:new` holds the
//! pins of an upgrade under way (`crate::upgrade`); no interface name has a colon.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use shaper_common::maps::{
    PIN_ADMISSION, PIN_AGGREGATES, PIN_CONFIG, PIN_COUNTERS, PIN_COUNTERS_CARRIED, PIN_LAYOUT,
    PIN_LINK, PIN_POLICIES, PIN_POLICY_STATS, PIN_POLICY_STATS_CARRIED, PIN_PREFIXES_V4,
    PIN_PREFIXES_V6, PIN_ROOT, PIN_SOURCES, PIN_SOURCES6, PIN_UPGRADE_PROG,
};

const NETNS_DIR: &str = "netns";
/// Appended to an interface's name for the directory an upgrade stages its pins in. The
/// kernel refuses a colon in interface names, so it can never be an attachment's.
const STAGING_SUFFIX: &str = ":new";

/// An interface shaper is (or is to be) attached to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub iface: String,
    /// The named network namespace, or `None` for the initial one.
    pub netns: Option<String>,
}

impl Attachment {
    pub fn new(iface: &str, netns: Option<&str>) -> Self {
        Self {
            iface: iface.to_owned(),
            netns: netns.map(str::to_owned),
        }
    }

    pub fn dir(&self) -> PathBuf {
        let root = Path::new(PIN_ROOT);
        match &self.netns {
            None => root.join(&self.iface),
            Some(ns) => root.join(NETNS_DIR).join(ns).join(&self.iface),
        }
    }

    /// Where an upgrade stages the new pins, and where the old ones go once it has swapped
    /// them in.
    pub fn staging(&self) -> PathBuf {
        let mut name = self.iface.clone();
        name.push_str(STAGING_SUFFIX);
        self.dir().with_file_name(name)
    }

    pub fn link(&self) -> PathBuf {
        self.dir().join(PIN_LINK)
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

    /// Whether shaper is attached here (its link is pinned).
    pub fn exists(&self) -> bool {
        self.link().exists()
    }

    /// `eth0`, or `eth0 (netns blue)`.
    pub fn label(&self) -> String {
        match &self.netns {
            None => self.iface.clone(),
            Some(ns) => format!("{} (netns {ns})", self.iface),
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

/// Removes the pins in `dir`, and `dir`; nothing if it does not exist.
pub fn remove_dir_of_pins(dir: &Path) -> io::Result<()> {
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                fs::remove_file(entry?.path())?;
            }
            fs::remove_dir(dir)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every attachment with pins on this host, in all namespaces, sorted.
pub fn list_all() -> io::Result<Vec<Attachment>> {
    let mut found = Vec::new();
    for iface in subdirs(Path::new(PIN_ROOT))? {
        if iface == NETNS_DIR || iface.ends_with(STAGING_SUFFIX) {
            continue;
        }
        found.push(Attachment::new(&iface, None));
    }
    for ns in subdirs(&Path::new(PIN_ROOT).join(NETNS_DIR))? {
        for iface in subdirs(&Path::new(PIN_ROOT).join(NETNS_DIR).join(&ns))? {
            if !iface.ends_with(STAGING_SUFFIX) {
                found.push(Attachment::new(&iface, Some(&ns)));
            }
        }
    }
    found.sort_by(|a, b| (&a.netns, &a.iface).cmp(&(&b.netns, &b.iface)));
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
