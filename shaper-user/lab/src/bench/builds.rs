//! The two builds the bench measures side by side, in one run: today's (this workspace's
//! object and `shaper`) and the baseline (`old_builds::BASELINE`, built for release from
//! its commit by `cargo xtask bench`).
//!
//! Both objects are loaded by the same code and configured with the same values. The
//! baseline has the same map names, but its own pin layout: what the bench writes
//! (settings, cells, the watch control) must have today's layout there for the per-packet
//! cases, which [`Build::configurable`] checks (the programs' own figures, verification
//! and attach, need no settings written), and what it reads back (the counters) is decoded
//! by the product's own upgrade decoders for that layout ([`Build::counters`]).

use std::{
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, Result, ensure};
use aya::{Ebpf, EbpfLoader};
use shaper_common::{
    layout::{self, Holds, LAYOUT_VERSION, Layout},
    maps::{Config, Counters},
};
use shaper_user::{
    object::{self, Sizes},
    upgrade::{Settings, read_counts},
};

use crate::{old_builds, testrun};

/// One build of the kernel programs and the `shaper` command.
#[derive(Debug)]
pub struct Build {
    /// How tables name it: `today` or the baseline's short commit.
    pub label: String,
    /// The baseline's full commit; `None` for today's (the run's git revision).
    pub commit: Option<String>,
    /// The pin layout its maps have.
    pub layout: &'static Layout,
    /// The object file's bytes, 8-byte aligned as the ELF parser needs them.
    object: Vec<u64>,
    object_len: usize,
    pub shaper: PathBuf,
}

/// Copies `bytes` into 8-byte aligned storage.
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_ne_bytes(b);
    }
    words
}

impl Build {
    /// This workspace's object and `shaper`.
    pub fn today(shaper: &Path) -> Self {
        Build {
            label: "today".to_owned(),
            commit: None,
            layout: layout::current(),
            object: aligned(object::EBPF_OBJECT),
            object_len: object::EBPF_OBJECT.len(),
            shaper: shaper.to_owned(),
        }
    }

    /// The baseline's release build in `dir` (`old_builds::release_dir`).
    pub fn baseline(dir: &Path) -> Result<Self> {
        let b = old_builds::BASELINE;
        let path = dir.join(old_builds::RELEASE_OBJECT);
        let bytes = fs::read(&path).with_context(|| {
            format!(
                "no baseline object at {} (`cargo xtask bench` builds commit {} there)",
                path.display(),
                b.commit
            )
        })?;
        let shaper = dir.join(old_builds::RELEASE_SHAPER);
        ensure!(
            shaper.is_file(),
            "no baseline shaper at {} (`cargo xtask bench` builds it)",
            shaper.display()
        );
        let layout = layout::layout(b.layout)
            .with_context(|| format!("pin layout {} is unknown to this build", b.layout))?;
        Ok(Build {
            label: b.commit[..7].to_owned(),
            commit: Some(b.commit.to_owned()),
            layout,
            object: aligned(&bytes),
            object_len: bytes.len(),
            shaper,
        })
    }

    /// Whether the bench can configure this build with today's types: every map it
    /// writes (settings, cells, the watch control) is today's. If not, why.
    pub fn configurable(&self) -> Result<()> {
        writes_as_today(self.layout)
    }

    pub fn object(&self) -> &[u8] {
        // SAFETY: `object_len` bytes of `object` were copied from the file; u64 has no
        // padding and u8 no alignment.
        unsafe { std::slice::from_raw_parts(self.object.as_ptr().cast(), self.object_len) }
    }

    /// The object loaded with its per-key maps sized as `sizes` says, its programs not
    /// yet: as `shaper attach` loads it (an older build's object lacks the maps it did not
    /// have yet; their sizes are then ignored).
    pub fn load(&self, sizes: Sizes) -> Result<Ebpf> {
        let mut loader = EbpfLoader::new();
        sizes.apply_as(
            &mut loader,
            self.layout.version >= object::SOURCE_TABLES_LAYOUT,
        );
        loader
            .load(self.object())
            .with_context(|| format!("loading the object of {}", self.label))
    }

    /// The global counters of a loaded object of this build, as today's type.
    pub fn counters(&self, ebpf: &Ebpf) -> Result<Counters> {
        if self.layout.version == LAYOUT_VERSION {
            testrun::counters(ebpf)
        } else {
            counters_by_layout(ebpf, self.layout)
        }
    }
}

/// Checks that every map the bench writes in an object of layout `l` (settings, cells,
/// the watch control) is the same map as today's, so today's types write it right.
fn writes_as_today(l: &Layout) -> Result<()> {
    let now = layout::current();
    for m in l.maps {
        if matches!(m.holds, Holds::Settings | Holds::Cells | Holds::Events) {
            ensure!(
                now.map(m.pin) == Some(m),
                "map {} of pin layout {} is not today's: the bench cannot configure the baseline with today's types",
                m.name,
                l.version
            );
        }
    }
    Ok(())
}

/// Per-key maps of `max_sources` keys, as `shaper attach` makes them where no policy has a
/// second meter (whose maps then take one entry).
pub fn single_rate(max_sources: u32) -> Sizes {
    Sizes {
        max_sources,
        meter2: false,
        max_subscribers: shaper_common::maps::DEFAULT_MAX_SUBSCRIBERS,
        max_policies: shaper_common::maps::DEFAULT_MAX_POLICIES,
    }
}

/// Numbers the pin directories of this process.
static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A directory of bpffs holding pins of the bench's own, removed with them when dropped.
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// [`Build::counters`] of an older layout: the counters maps are pinned for a moment in a
/// directory of the bench's own and read as `shaper` reads an attachment of that layout
/// ([`read_counts`]: its frozen types, carried into today's).
fn counters_by_layout(ebpf: &Ebpf, l: &'static Layout) -> Result<Counters> {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let dir = PinDir(PathBuf::from(format!(
        "/sys/fs/bpf/shaper-bench-{}-{n}",
        std::process::id()
    )));
    fs::create_dir_all(&dir.0).with_context(|| format!("creating {}", dir.0.display()))?;
    for m in l.maps {
        if matches!(m.holds, Holds::Counters | Holds::Carried) {
            let map = ebpf
                .map(m.name)
                .with_context(|| format!("map {} missing from the object", m.name))?;
            map.pin(dir.0.join(m.pin))
                .with_context(|| format!("pinning {} in {}", m.name, dir.0.display()))?;
        }
    }
    let settings = Settings {
        config: Config::default(),
        policies: Vec::new(),
    };
    Ok(read_counts(&dir.0, l, &settings)?.counters)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use shaper_common::maps::PROG_XDP;

    use super::*;
    use crate::{
        frame,
        testrun::{XDP_PASS, open, test_run},
    };

    #[test]
    fn the_object_keeps_its_bytes_aligned() {
        let b = Build::today(Path::new("shaper"));
        assert_eq!(b.object(), object::EBPF_OBJECT);
        assert!((b.object().as_ptr() as usize).is_multiple_of(8));
        assert_eq!(b.label, "today");
    }

    #[test]
    fn todays_layout_writes_as_today() {
        writes_as_today(layout::current()).unwrap();
        // Layout 1's policies are not today's.
        assert!(writes_as_today(layout::layout(1).unwrap()).is_err());
    }

    /// The counters read through pins and the upgrade's decoders (the way an older
    /// layout's are read) are those read directly, and nothing is left pinned.
    #[test]
    #[ignore = "loads programs: run as root by `cargo xtask test`"]
    fn counters_read_by_layout_are_the_counters() -> Result<()> {
        let b = Build::today(Path::new("shaper"));
        let mut ebpf = open(b.load(single_rate(1024))?)?;
        let f = frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), 64);
        for _ in 0..3 {
            test_run(&mut ebpf, PROG_XDP, &f, 1, XDP_PASS)?;
        }
        let direct = b.counters(&ebpf)?;
        assert_eq!(direct.ipv4_packets, 3);
        assert_eq!(direct.new_sources, 1);
        assert_eq!(counters_by_layout(&ebpf, b.layout)?, direct);
        let left = fs::read_dir("/sys/fs/bpf")?
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("shaper-bench-{}-", std::process::id()))
            })
            .count();
        assert_eq!(left, 0, "pins left behind");
        Ok(())
    }
}
