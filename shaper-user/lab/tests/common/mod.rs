//! What the kernel tests that drive the `shaper` binary share.

use std::process::{Command, Output};

pub use shaper_lab::bins::shaper as shaper_bin;

/// Runs `shaper -n NS ARGS...`.
pub fn shaper(ns: &str, args: &[&str]) -> Output {
    Command::new(shaper_bin())
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("run shaper")
}

/// Runs `shaper -n NS ARGS...`, which must succeed (else panics with its error line);
/// returns its standard output.
pub fn shaper_ok(ns: &str, args: &[&str]) -> String {
    let out = shaper(ns, args);
    assert!(
        out.status.success(),
        "shaper {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("shaper's output is UTF-8")
}

/// Detaches shaper from an interface on drop, so a failing assertion leaves nothing
/// attached or pinned.
pub struct Detach {
    pub ns: String,
    pub iface: String,
}

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = shaper(&self.ns, &["detach", &self.iface]);
    }
}

/// Attaches shaper (`attach IFACE --rate RATE --burst BURST`), panicking with its error
/// line if it fails; detached again when the guard drops.
pub fn attach(ns: &str, iface: &str, rate: &str, burst: &str) -> Detach {
    attach_with(ns, iface, rate, burst, &[])
}

/// [`attach`] with more options (`--prefix-v4 24`, ...).
pub fn attach_with(ns: &str, iface: &str, rate: &str, burst: &str, more: &[&str]) -> Detach {
    let guard = Detach {
        ns: ns.to_owned(),
        iface: iface.to_owned(),
    };
    let mut args = vec!["attach", iface, "--rate", rate, "--burst", burst];
    args.extend_from_slice(more);
    shaper_ok(ns, &args);
    guard
}
