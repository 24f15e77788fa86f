//! `shaper run` against the kubelet's ConfigMap volume mechanics: the kubelet never
//! writes `shaper.toml` itself. It lays the volume out as
//!
//! ```text
//! ..2025_01_01_00_00_00.000000001/shaper.toml    the content, in a timestamped directory
//! ..data -> ..2025_01_01_00_00_00.000000001      the version in force
//! shaper.toml -> ..data/shaper.toml              what the container reads
//! ```
//!
//! and updates it by writing a new timestamped directory, pointing a `..data_tmp` symlink
//! at it, renaming that over `..data` (atomic), and removing the old directory. A
//! watcher of `shaper.toml`'s own events sees none of it; the daemon must apply each
//! swap, once, and refuse a broken one in one line.

use std::{fs, os::unix::fs::symlink, path::Path};

use shaper_lab::cli::AttachGuard;
use shaper_lab::{
    daemon::{Daemon, config, scratch},
    lab::Lab,
};

/// A ConfigMap volume laid out and updated as the kubelet's AtomicWriter does.
struct Volume<'a> {
    dir: &'a Path,
    version: u32,
}

impl<'a> Volume<'a> {
    fn new(dir: &'a Path, text: &str) -> Self {
        let mut volume = Volume { dir, version: 0 };
        volume.swap(text);
        symlink("..data/shaper.toml", dir.join("shaper.toml")).unwrap();
        volume
    }

    /// Writes `text` as a new version and swaps `..data` to it.
    fn swap(&mut self, text: &str) {
        let old = self.current();
        self.version += 1;
        let name = format!("..2025_01_01_00_00_{:02}.000000001", self.version);
        fs::create_dir(self.dir.join(&name)).unwrap();
        fs::write(self.dir.join(&name).join("shaper.toml"), text).unwrap();
        symlink(&name, self.dir.join("..data_tmp")).unwrap();
        fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }

    fn current(&self) -> Option<String> {
        fs::read_link(self.dir.join("..data"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    }
}

fn rate(lab: &Lab, iface: &str) -> u64 {
    let out = shaper_lab::cli::run(
        shaper_lab::bins::shaper(),
        lab.rx_ns(),
        &["-j", "status", iface],
    )
    .unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    rows[0]["rate_bits_per_sec"].as_u64().unwrap()
}

/// Three swaps of `..data` (a new rate, a broken file, a good one again): each reloads
/// the daemon once, the broken one is refused and changes nothing.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn each_configmap_swap_is_applied_once() {
    let lab = Lab::new("kubelet", 1).unwrap_or_else(|e| panic!("cannot create lab: {e:#}"));
    let iface = lab.rx_iface().to_owned();
    let _guard = AttachGuard::new(shaper_lab::bins::shaper(), lab.rx_ns(), &iface);
    let dir = scratch("kubelet");
    let mut volume = Volume::new(&dir, &config(&iface, "8mbit"));
    let mut daemon = Daemon::start(lab.rx_ns(), &dir.join("shaper.toml"), &["--no-metrics"]);
    assert_eq!(rate(&lab, &iface), 8_000_000);

    volume.swap(&config(&iface, "4mbit"));
    daemon.wait_for("RELOADING=1");
    let said = daemon.wait_for("READY=1");
    assert!(said.contains(&format!("{iface} updated")), "{said}");
    assert_eq!(rate(&lab, &iface), 4_000_000);

    volume.swap(&config(&iface, "2mbit").replace("64k", "lots"));
    daemon.wait_for("RELOADING=1");
    let said = daemon.wait_for("READY=1");
    assert!(
        said.contains("refused") && said.contains("shaper.toml:4:"),
        "{said}"
    );
    assert_eq!(rate(&lab, &iface), 4_000_000);

    volume.swap(&config(&iface, "2mbit"));
    daemon.wait_for("RELOADING=1");
    daemon.wait_for("READY=1");
    assert_eq!(rate(&lab, &iface), 2_000_000);

    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    let reloads = log.matches("the file changed").count();
    assert_eq!(reloads, 3, "one reload per swap: {log}");
    let _ = fs::remove_dir_all(&dir);
}
