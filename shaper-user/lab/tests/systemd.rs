//! The package's unit under a real systemd as PID 1: `systemd-nspawn -b` boots a Debian
//! root (mmdebstrap, this machine's release, with systemd) inside the lab's receiving
//! namespace, with a bpffs of the test's own as its /sys/fs/bpf; the `.deb` of `cargo xtask
//! dist` is installed in it with dpkg, and systemd drives the unit as on a host:
//!
//! - each of the unit's three capabilities is needed (without one, `systemctl start` fails
//!   and the journal names it), and the three are enough: the daemon runs with exactly
//!   them (its CapEff) and does all it does;
//! - `systemctl start` returns once the interface is attached (Type=notify);
//! - `systemctl restart` takes the attachment over as it is (same program);
//! - `systemctl reload` applies a changed file in place (same program); a broken file is
//!   refused in one journal line naming file:line, and the unit stays active (with
//!   `--no-watch` in a drop-in: otherwise the watcher applies the saved file first);
//! - `systemctl stop` leaves the limits enforcing.
//!
//! Why nspawn rather than a QEMU guest with init=systemd: the unit and systemd's handling
//! of it are the same on any kernel, so the host's real kernel and clock serve (the guests
//! emulate the CPU: booting systemd under TCG takes minutes, and a rate means nothing
//! there); the container boots in under a second, and the root is built once per run
//! (about a minute, cached in target/nspawn/ between runs of one tree).

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use common::assert_near;
use serde_json::Value;
use shaper_lab::{
    daemon::{config, scratch, workspace, xtask},
    lab::{Flow, Lab, RunOptions, run_udp_with},
};

/// What the root holds beyond Essential: systemd, and what the package depends on
/// (procps for the unit's /bin/kill).
const INCLUDE: &str = "--include=systemd,libgcc-s1,procps";

/// A Debian root with systemd, built once (kept in target/nspawn/, marked complete with
/// what it includes).
fn root() -> PathBuf {
    let dir = workspace().join("target/nspawn");
    let root = dir.join("root");
    let done = dir.join("root.done");
    if fs::read_to_string(&done).is_ok_and(|d| d == INCLUDE) {
        return root;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let release = fs::read_to_string("/etc/os-release")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(str::to_owned))
        .unwrap();
    let start = Instant::now();
    let out = Command::new("mmdebstrap")
        .args(["--variant=essential", "--quiet", INCLUDE])
        .arg(&release)
        .arg(&root)
        .output()
        .expect("mmdebstrap (cargo xtask setup installs it)");
    assert!(out.status.success(), "mmdebstrap: {out:?}");
    println!("mmdebstrap {release} with systemd: {:.0?}", start.elapsed());
    fs::write(&done, INCLUDE).unwrap();
    root
}

/// A container booted with systemd as PID 1, powered off and its bpffs unmounted on drop.
struct Container {
    nspawn: Child,
    leader: u32,
    scratch: PathBuf,
}

impl Container {
    fn boot(lab: &Lab, deb_dir: &Path) -> Self {
        let root = root();
        let scratch = scratch("nspawn");
        let bpffs = scratch.join("bpffs");
        fs::create_dir_all(&bpffs).unwrap();
        assert!(
            Command::new("mount")
                .args(["-t", "bpf", "bpf"])
                .arg(&bpffs)
                .status()
                .unwrap()
                .success()
        );
        let log = fs::File::create(scratch.join("console")).unwrap();
        let nspawn = Command::new("systemd-nspawn")
            .args(["--quiet", "--boot", "--register=no", "--keep-unit"])
            .args(["--volatile=overlay", "--console=passive"])
            .arg(format!("--machine=shaper-test-{}", std::process::id()))
            .arg("--directory")
            .arg(&root)
            .arg(format!(
                "--network-namespace-path=/run/netns/{}",
                lab.rx_ns()
            ))
            .arg("--capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN")
            .arg("--system-call-filter=bpf")
            .arg(format!("--bind={}:/sys/fs/bpf", bpffs.display()))
            .arg(format!("--bind-ro={}:/mnt/dist", deb_dir.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("systemd-nspawn (systemd-container; cargo xtask setup installs it)");
        let start = Instant::now();
        let mut container = Container {
            leader: 0,
            nspawn,
            scratch,
        };
        // PID 1 of the container: the descendant of nspawn that is systemd.
        while container.leader == 0 {
            container.leader = descendants(container.nspawn.id())
                .into_iter()
                .find(|pid| {
                    fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|comm| comm.trim() == "systemd")
                })
                .unwrap_or(0);
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no systemd in the container after 10 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Up once systemctl reaches it and the boot is over.
        loop {
            let out = container.run(&["systemctl", "is-system-running"]);
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if state == "running" || state == "degraded" {
                println!("booted in {:.1?}: {state}", start.elapsed());
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "systemd is {state:?} after 20 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        container
    }

    /// Runs a command inside (every namespace of PID 1, its root).
    fn run(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn write(&self, path: &str, text: &str) {
        self.ok(&["sh", "-c", &format!("cat > {path} <<'EOF'\n{text}EOF\n")]);
    }

    fn journal(&self) -> String {
        self.ok(&[
            "journalctl",
            "-u",
            "shaper",
            "--no-pager",
            "-o",
            "short",
            "-q",
        ])
    }

    fn show(&self, property: &str) -> String {
        self.ok(&["systemctl", "show", "-P", property, "shaper"])
            .trim()
            .to_owned()
    }

    /// `status -j` of `iface`, read by the installed binary.
    fn status(&self, iface: &str) -> Value {
        let out = self.ok(&["shaper", "-j", "status", iface]);
        serde_json::from_str::<Vec<Value>>(&out).unwrap().remove(0)
    }

    /// Waits (10 s at most) until the journal holds `what` `n` times.
    fn wait_journal(&self, what: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let journal = self.journal();
            if journal.matches(what).count() >= n {
                return journal;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in the journal: {journal}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // nspawn turns SIGTERM into an orderly poweroff of the container.
        let _ = Command::new("kill")
            .arg(self.nspawn.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.nspawn.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.nspawn.kill();
                let _ = self.nspawn.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("umount")
            .arg(self.scratch.join("bpffs"))
            .status();
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

/// Every descendant of process `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let children: Vec<u32> = fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    let mut all = children.clone();
    for child in children {
        all.extend(descendants(child));
    }
    all
}

#[test]
#[ignore = "needs root: systemd-nspawn, XDP programs and network namespaces (cargo xtask test)"]
fn the_unit_under_systemd() {
    let said = xtask(&["dist"]);
    let deb = said
        .lines()
        .find_map(|l| l.strip_prefix("built "))
        .map(PathBuf::from)
        .expect("cargo xtask dist says what it built");
    let lab = Lab::new("nspawn", 1).unwrap_or_else(|e| panic!("cannot create lab: {e:#}"));
    let iface = lab.rx_iface().to_owned();
    let container = Container::boot(&lab, deb.parent().unwrap());
    let installed = format!("/mnt/dist/{}", deb.file_name().unwrap().to_string_lossy());
    container.ok(&["dpkg", "-i", &installed]);
    container.write("/etc/shaper/shaper.toml", &config(&iface, "8mbit"));

    // Each capability is needed: without it the daemon refuses to start, naming it.
    let caps = ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"];
    for missing in caps {
        let others: Vec<&str> = caps.iter().copied().filter(|c| *c != missing).collect();
        container.ok(&["mkdir", "-p", "/run/systemd/system/shaper.service.d"]);
        container.write(
            "/run/systemd/system/shaper.service.d/test.conf",
            &format!(
                "[Service]\nCapabilityBoundingSet=\nCapabilityBoundingSet={0}\n\
                 AmbientCapabilities=\nAmbientCapabilities={0}\nRestart=no\n",
                others.join(" ")
            ),
        );
        container.ok(&["systemctl", "daemon-reload"]);
        let start = container.run(&["systemctl", "start", "shaper"]);
        assert!(!start.status.success(), "started without {missing}");
        let journal = container.wait_journal(&format!("(missing {missing})"), 1);
        assert!(lab.xdp_prog_id().unwrap().is_none(), "{journal}");
        container.ok(&["systemctl", "reset-failed", "shaper"]);
    }
    container.ok(&["rm", "-r", "/run/systemd/system/shaper.service.d"]);
    container.ok(&["systemctl", "daemon-reload"]);

    // Start: when systemctl returns, the interface is attached (READY=1 came after it).
    let start = container.run(&["systemctl", "start", "shaper"]);
    assert!(start.status.success(), "{start:?}: {}", container.journal());
    let program = lab
        .xdp_prog_id()
        .unwrap()
        .expect("attached when systemctl start returned");
    assert_eq!(container.show("ActiveState"), "active");
    assert!(
        container
            .show("StatusText")
            .contains(&format!("{iface} attached"))
    );
    // The three capabilities, and nothing else: bounding set and effective set.
    let main_pid = container.show("MainPID");
    let proc_status = container.ok(&["cat", &format!("/proc/{main_pid}/status")]);
    for field in ["CapEff", "CapBnd", "CapPrm"] {
        let line = proc_status.lines().find(|l| l.starts_with(field)).unwrap();
        // CAP_NET_ADMIN (12), CAP_PERFMON (38), CAP_BPF (39).
        assert!(line.ends_with("000000c000001000"), "{line}");
    }
    assert_eq!(container.status(&iface)["rate_bits_per_sec"], 8_000_000);

    // Reload with a changed file: applied in place, the same program. With --no-watch
    // (in a drop-in, and a restart that takes the attachment over as it is), so that the
    // reload, not the watcher, is what applies it.
    container.ok(&["mkdir", "-p", "/etc/systemd/system/shaper.service.d"]);
    container.write(
        "/etc/systemd/system/shaper.service.d/no-watch.conf",
        "[Service]\nExecStart=\nExecStart=/usr/sbin/shaper run -f /etc/shaper/shaper.toml --no-watch\n",
    );
    container.ok(&["systemctl", "daemon-reload"]);
    container.ok(&["systemctl", "restart", "shaper"]);
    container.wait_journal(&format!("{iface} unchanged"), 1);
    assert_eq!(lab.xdp_prog_id().unwrap(), Some(program));
    container.write("/etc/shaper/shaper.toml", &config(&iface, "4mbit"));
    container.ok(&["systemctl", "reload", "shaper"]);
    container.wait_journal("SIGHUP: applied", 1);
    assert_eq!(container.status(&iface)["rate_bits_per_sec"], 4_000_000);
    assert_eq!(lab.xdp_prog_id().unwrap(), Some(program));

    // A broken file: one journal line naming file:line and the field; still active.
    container.write(
        "/etc/shaper/shaper.toml",
        &config(&iface, "2mbit").replace("64k", "lots"),
    );
    container.ok(&["systemctl", "reload", "shaper"]);
    let journal = container.wait_journal("SIGHUP: reload refused", 1);
    let refused: Vec<&str> = journal.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(refused.len(), 1, "{journal}");
    let refused = refused[0];
    assert!(
        refused.contains("/etc/shaper/shaper.toml:4:") && refused.contains("burst"),
        "{refused}"
    );
    assert_eq!(container.show("ActiveState"), "active");
    assert_eq!(container.status(&iface)["rate_bits_per_sec"], 4_000_000);

    // Stop: the unit is inactive, the limits stay and enforce.
    container.ok(&["systemctl", "stop", "shaper"]);
    assert_eq!(container.show("ActiveState"), "inactive");
    assert_eq!(lab.xdp_prog_id().unwrap(), Some(program));
    let before = container.ok(&["shaper", "-j", "stats", &iface, "--top", "1"]);
    let before: Value = serde_json::from_str(&before).unwrap();
    let report = run_udp_with(
        &lab,
        &[Flow {
            src: lab.sources()[0].into(),
            offered_bps: 8_000_000,
            frame_bytes: 1000,
        }],
        Duration::from_secs(1),
        &RunOptions::default(),
    )
    .expect("traffic");
    let after = container.ok(&["shaper", "-j", "stats", &iface, "--top", "1"]);
    let after: Value = serde_json::from_str(&after).unwrap();
    let passed = after["totals"]["passed_bytes"].as_u64().unwrap()
        - before["totals"]["passed_bytes"].as_u64().unwrap();
    assert_near(
        "passed at 4mbit after systemctl stop",
        passed as f64,
        4e6 / 8.0 * report.flows[0].offered_secs + 65_536.0,
        65_536.0,
    );
    println!("journalctl -u shaper:\n{}", container.journal());
}
