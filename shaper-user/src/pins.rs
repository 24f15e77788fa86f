//! Where an attachment's pins live on bpffs.
//!
//! `/sys/fs/bpf/shaper/IFACE/` for an interface of the initial network namespace, and
//! `/sys/fs/bpf/shaper/netns/NETNS/IFACE/` for one in a named namespace (`shaper -n`).
//! Each directory holds the XDP link and the maps (`shaper_common::maps::PIN_*`).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use shaper_common::maps::{
    PIN_ADMISSION, PIN_AGGREGATES, PIN_CONFIG, PIN_COUNTERS, PIN_LINK, PIN_POLICIES,
    PIN_POLICY_STATS, PIN_PREFIXES_V4, PIN_PREFIXES_V6, PIN_ROOT, PIN_SOURCES, PIN_SOURCES6,
};

const NETNS_DIR: &str = "netns";

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

    /// Removes every pin of this attachment and the directories left empty, up to and
    /// including the root. Missing pins are not an error: this also cleans up after a
    /// failed attach.
    pub fn remove_pins(&self) -> io::Result<()> {
        let dir = self.dir();
        match fs::read_dir(&dir) {
            Ok(entries) => {
                for entry in entries {
                    fs::remove_file(entry?.path())?;
                }
                fs::remove_dir(&dir)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
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

/// Every attachment with pins on this host, in all namespaces, sorted.
pub fn list_all() -> io::Result<Vec<Attachment>> {
    let mut found = Vec::new();
    for iface in subdirs(Path::new(PIN_ROOT))? {
        if iface == NETNS_DIR {
            continue;
        }
        found.push(Attachment::new(&iface, None));
    }
    for ns in subdirs(&Path::new(PIN_ROOT).join(NETNS_DIR))? {
        for iface in subdirs(&Path::new(PIN_ROOT).join(NETNS_DIR).join(&ns))? {
            found.push(Attachment::new(&iface, Some(&ns)));
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
