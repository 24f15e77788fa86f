//! What shaper needs of the kernel (`shaper_user::kernel`): on a kernel that has it, the
//! probes find nothing missing and attach works; on an older one, attach refuses with one
//! line naming every feature the kernel lacks and the oldest kernel that has them all,
//! and changes nothing. The kernel matrix runs this under a kernel of each kind (5.10
//! lacks all three features).

use std::{path::Path, process::Command};

use shaper_lab::{bins, cli::AttachGuard, lab::Lab};
use shaper_user::{journal::JOURNAL_PATH, kernel, pins::Attachment};

/// (major, minor) of a release such as `5.10.0-46-amd64`.
fn version(release: &str) -> (u32, u32) {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// What attach must say a kernel of `version` lacks, as it says it.
fn missing(version: (u32, u32)) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if version < (5, 12) {
        missing.push("BPF atomic compare-and-exchange (BPF_CMPXCHG, 5.12)");
    }
    if version < (5, 18) {
        missing.push("multi-buffer XDP (xdp.frags, 5.18)");
        missing.push("bpf_xdp_get_buff_len (5.18)");
    }
    missing
}

#[test]
fn releases_are_read_as_major_and_minor() {
    assert_eq!(version("5.10.0-46-amd64"), (5, 10));
    assert_eq!(version("6.12.57+deb12-amd64"), (6, 12));
    assert_eq!(missing((5, 10)).len(), 3);
    assert_eq!(missing((5, 15)).len(), 2);
    assert!(missing((6, 1)).is_empty());
}

#[test]
#[ignore = "needs root: loads programs, attaches XDP and creates network namespaces (cargo xtask test)"]
fn attach_refuses_a_kernel_without_what_shaper_needs_in_one_line_and_changes_nothing() {
    let release = kernel::release();
    let missing = missing(version(&release));
    let lab = Lab::new("kern", 1).unwrap();
    let shaper = bins::shaper();
    let mut guard = AttachGuard::new(shaper, lab.rx_ns(), lab.rx_iface());
    let probed = kernel::check();
    println!("kernel {release}: {probed:?}");
    if missing.is_empty() {
        probed.unwrap();
        guard
            .attach(&["--rate", "8mbit", "--burst", "64k"])
            .unwrap();
        assert!(lab.xdp_attached().unwrap());
        guard.detach().unwrap();
        return;
    }
    let out = Command::new(shaper)
        .args(["-n", lab.rx_ns(), "attach", lab.rx_iface()])
        .args(["--rate", "8mbit", "--burst", "64k"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("attach: {}", stderr.trim());
    assert!(!out.status.success());
    let (first, last) = missing.split_at(missing.len() - 1);
    let list = if first.is_empty() {
        last[0].to_owned()
    } else {
        format!("{} and {}", first.join(", "), last[0])
    };
    assert_eq!(
        stderr,
        format!("shaper: kernel {release} lacks {list}; shaper needs 5.18 or later\n")
    );
    // Nothing attached, pinned or journalled.
    assert!(!lab.xdp_attached().unwrap());
    let at = Attachment::new(lab.rx_iface(), Some(lab.rx_ns()));
    assert!(!at.dir().exists(), "{} was made", at.dir().display());
    assert!(!Path::new(JOURNAL_PATH).exists());
    let status = guard.run(&["-j", "status"]).unwrap();
    assert_eq!(status.trim(), "[]", "{status}");
}
