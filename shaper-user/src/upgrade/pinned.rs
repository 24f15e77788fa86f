//! Which layout a directory of pins has (`shaper_common::layout`), checked map by map the
//! way libbpf checks a pinned map before it reuses one: type, key and value size, size
//! and flags. (aya 0.14 reuses a pinned map without looking.)

use std::{io, path::Path};

use aya::maps::{Array, Map, MapData};
use shaper_common::{
    layout::{self, LAYOUT_VERSION, LAYOUTS, Layout, MapLayout},
    maps::PIN_LAYOUT,
};

use crate::bpf;

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot read the pins of {label} at {path}")]
    Read {
        label: String,
        path: String,
        source: io::Error,
    },
    #[error(
        "{label} was attached by a newer shaper (pin layout {version}; this one knows up to {LAYOUT_VERSION}): use that shaper, or detach and attach again (which refills every source's bucket)"
    )]
    Newer { label: String, version: u32 },
    #[error(
        "the pins of {label} match no layout this shaper knows ({mismatch}): detach and attach again (which refills every source's bucket)"
    )]
    Unknown { label: String, mismatch: String },
}

/// What the kernel says of the map pinned at `path`, or `None` if nothing is pinned there.
fn pinned_map(path: &Path) -> io::Result<Option<bpf::MapInfo>> {
    match bpf::map_info(path) {
        Ok(info) => Ok(Some(info)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why the map pinned as `m.pin` in `dir` is not `m`, if it is not.
fn check_map(dir: &Path, m: &MapLayout) -> io::Result<Option<String>> {
    Ok(mismatch(m, pinned_map(&dir.join(m.pin))?))
}

/// Why `found` (what is pinned as `m.pin`; `None`: nothing) is not `m`, if it is not.
pub fn mismatch(m: &MapLayout, found: Option<bpf::MapInfo>) -> Option<String> {
    let Some(found) = found else {
        return Some(format!("no map '{}'", m.pin));
    };
    if m.matches(
        found.map_type,
        found.key_size,
        found.value_size,
        found.max_entries,
        found.flags,
    ) {
        return None;
    }
    let (what, has, wants) = [
        ("type", found.map_type, m.map_type),
        ("key size", found.key_size, m.key_size),
        ("value size", found.value_size, m.value_size),
        ("size", found.max_entries, m.max_entries),
        ("flags", found.flags, m.flags),
    ]
    .into_iter()
    .find(|(_, has, wants)| has != wants)
    .unwrap_or(("size", found.max_entries, m.max_entries));
    Some(format!("map '{}' has {what} {has}, not {wants}", m.pin))
}

/// How many times this process has checked the layout of an attachment's pins (every
/// map of it): for the tests and the bench of a change ([`crate::change`]).
static LAYOUT_CHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many layout checks this process has made so far.
pub fn layout_checks() -> u64 {
    LAYOUT_CHECKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts one layout check.
pub(crate) fn count_layout_check() {
    LAYOUT_CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many of `l`'s maps the pins in `dir` lack or have otherwise, and the first.
fn check_layout(dir: &Path, l: &Layout) -> io::Result<Option<(usize, String)>> {
    let mut first = None;
    let mut differ = 0;
    for m in l.maps {
        if let Some(why) = check_map(dir, m)? {
            differ += 1;
            first.get_or_insert_with(|| format!("layout {}: {why}", l.version));
        }
    }
    Ok(first.map(|why| (differ, why)))
}

/// The layout of the pins in `dir` (an attachment's, labelled `label` in errors), every
/// one of its maps checked.
pub fn identify(dir: &Path, label: &str) -> Result<&'static Layout, LayoutError> {
    count_layout_check();
    let read = |source| LayoutError::Read {
        label: label.to_owned(),
        path: dir.display().to_string(),
        source,
    };
    let unknown = |mismatch| LayoutError::Unknown {
        label: label.to_owned(),
        mismatch,
    };
    let version_pin = dir.join(PIN_LAYOUT);
    if pinned_map(&version_pin).map_err(read)?.is_none() {
        // Before layouts were numbered: recognised by their maps. Failing that, the
        // nearest one says what is wrong.
        let mut nearest: Option<(usize, String)> = None;
        for l in LAYOUTS.iter().filter(|l| !l.versioned()) {
            match check_layout(dir, l).map_err(read)? {
                None => return Ok(l),
                Some(differ) => {
                    if nearest.as_ref().is_none_or(|n| differ.0 < n.0) {
                        nearest = Some(differ);
                    }
                }
            }
        }
        return Err(unknown(nearest.map(|n| n.1).unwrap_or_default()));
    }
    let version_map = layout::current()
        .map(PIN_LAYOUT)
        .expect("the current layout is versioned");
    if let Some(why) = check_map(dir, version_map).map_err(read)? {
        return Err(unknown(why));
    }
    let version = read_version(&version_pin).map_err(read)?;
    if version > LAYOUT_VERSION {
        return Err(LayoutError::Newer {
            label: label.to_owned(),
            version,
        });
    }
    let l = layout::layout(version)
        .filter(|l| l.versioned())
        .ok_or_else(|| unknown(format!("its '{PIN_LAYOUT}' map says {version}")))?;
    match check_layout(dir, l).map_err(read)? {
        None => Ok(l),
        Some((_, why)) => Err(unknown(why)),
    }
}

/// The version recorded in the map pinned at `path` (checked to be the version map).
fn read_version(path: &Path) -> io::Result<u32> {
    let data = MapData::from_fd(bpf::obj_get(path)?).map_err(io::Error::other)?;
    let map = Map::from_map_data(data).map_err(io::Error::other)?;
    let array: Array<MapData, u32> = Array::try_from(map).map_err(io::Error::other)?;
    array.get(&0, 0).map_err(io::Error::other)
}
