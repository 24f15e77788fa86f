//! Earlier builds of `shaper`, one for each pin layout an upgrade starts from
//! (`shaper_common::layout`): the upgrade tests attach with them, then upgrade with the
//! build under test. `cargo xtask test` builds each from its commit once (`git archive`,
//! then `cargo build`, in a target directory of their own) into
//! `target/old-shaper/COMMIT/shaper`.
//!
//! `cargo xtask bench` measures today's build against [`BASELINE`], built for release the
//! same way into `target/old-shaper/COMMIT/release/` ([`release_dir`]): its `shaper` binary
//! and its kernel object.
//!
//! xtask includes this file too (`#[path]`), so it uses nothing but std. A new layout adds
//! the last commit of the layout it replaces here.

use std::path::{Path, PathBuf};

/// A released build and the pin layout it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OldBuild {
    pub layout: u32,
    pub commit: &'static str,
}

pub const OLD_BUILDS: &[OldBuild] = &[
    // Prefix policies, before new-source admission.
    OldBuild {
        layout: 1,
        commit: "ddbba43730674b83ff15793cf1518f9ac15d8646",
    },
    // New-source admission, the last before pins carried a layout version.
    OldBuild {
        layout: 2,
        commit: "8260bcafe0dcf273a5eb7c69ce5064c3e01335d4",
    },
    // Layout 3 (f137e58: pins record their layout, before the counters counted the
    // compare-and-swap's wins) has no build here since layout 7's was added, to keep CI's
    // time: it differs from layout 4 by its counters alone, whose decoder (`layout3`) the
    // layout-2 upgrade runs too and its unit tests check field by field.
    // The counters count the compare-and-swap's wins; egress and tc; before `shaper watch`'s
    // maps and shaping.
    OldBuild {
        layout: 4,
        commit: "c17ddaacff0dabe555853d4b951dbea22b288538",
    },
    // `shaper watch` and shaping; the last before the kernel programs were verified in
    // pieces (its counters keep a scratch field for the departure time).
    OldBuild {
        layout: 5,
        commit: "dd8a0a0058f57171920b89bcef1df1e42fbe50d3",
    },
    // The kernel programs verified in pieces and the doorkeeper; the last before the
    // second meter.
    OldBuild {
        layout: 6,
        commit: "b3662dc741b3eceee3216661187cff9a82462f60",
    },
    // The second meter; the last before subscribers.
    OldBuild {
        layout: 7,
        commit: "794f84b480d9ec5ee24c9c448bf8ae7089015ee7",
    },
    // Subscribers, their ids and names in their entries (160 bytes); the last before
    // layout 9 took them out.
    OldBuild {
        layout: 8,
        commit: "d879af3605db6c0ea1278c08d4291d4a61615c8b",
    },
    // Subscribers' ids and names out of their entries (112 bytes); the last before
    // layout 10 sized the policy slots at attach (16,384 of each before).
    OldBuild {
        layout: 9,
        commit: "8c85b48fcc798cc2a5c9b4de448dc10c8c804b86",
    },
    // The policy slots sized at attach; the last before layout 11 made the per-source
    // maps tables of buckets (LRU hash maps before).
    OldBuild {
        layout: 10,
        commit: "2f7e85269157dd8b7638b02d8eb39d11267bdc5a",
    },
];

/// The build `cargo xtask bench` measures today's against, in the same run (issue 21): the
/// last commit before the kernel programs were verified in pieces. Moved forward when a
/// later change is to be measured against its predecessor.
pub const BASELINE: OldBuild = OldBuild {
    layout: 5,
    commit: "dd8a0a0058f57171920b89bcef1df1e42fbe50d3",
};

/// The file names of a release build in [`release_dir`]: the `shaper` binary and the kernel
/// object it embeds (as shaper-user's build script wrote it).
pub const RELEASE_SHAPER: &str = "shaper";
pub const RELEASE_OBJECT: &str = "shaper-ebpf";

/// Where the old builds live under a target directory.
pub fn dir(target_dir: &Path) -> PathBuf {
    target_dir.join("old-shaper")
}

/// The `shaper` binary built from `commit`.
pub fn binary(target_dir: &Path, commit: &str) -> PathBuf {
    dir(target_dir).join(commit).join("shaper")
}

/// The lock `cargo xtask` holds on `commit`'s builds while it makes one (it builds them
/// beside the tests it runs).
pub fn lock_path(target_dir: &Path, commit: &str) -> PathBuf {
    dir(target_dir).join(format!("{commit}.lock"))
}

/// Waits until no run is building `commit` ([`lock_path`]). Returns at once if none is, if
/// there is no lock file, or if the file system cannot lock (a guest's share of the work
/// tree): then the build is there or not, as the caller finds it.
pub fn wait_for_build(target_dir: &Path, commit: &str) {
    if let Ok(file) = std::fs::File::open(lock_path(target_dir, commit)) {
        let _ = file.lock_shared();
    }
}

/// The release build of `commit` ([`RELEASE_SHAPER`], [`RELEASE_OBJECT`]).
pub fn release_dir(target_dir: &Path, commit: &str) -> PathBuf {
    dir(target_dir).join(commit).join("release")
}
