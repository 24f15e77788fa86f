//! Faults: what `status`, `stats`, `policy`, `apply` and `detach` say and do when the
//! interface or its namespace is deleted while attached, the source map is full, bpffs is
//! not mounted, two commands run at once, a command is killed half way (at each step, and
//! at random times), or a command runs without privileges. Every failure is one line and a
//! non-zero exit, and changes nothing; a killed change is rolled back whole by the next
//! command, which says so.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    fs,
    net::Ipv4Addr,
    os::{
        fd::{AsFd as _, AsRawFd as _},
        unix::process::ExitStatusExt as _,
    },
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use common::{
    TempFile, attach, attach_with, error_line, guard, nobody_binary, shaper, shaper_ok, stats,
};
use serde_json::Value;
use shaper_common::maps::{PIN_PREFIXES_V4, PIN_PREFIXES_V6, PIN_ROOT, PIN_SOURCES};
use shaper_common::{config::PolicyLimits, layout};
use shaper_lab::{
    bins::shaper as shaper_bin,
    cli::AttachGuard,
    lab::{Flow, Lab, Netns, RunOptions, run_udp_with},
    rng::Rng,
};
use shaper_user::{
    bpf, change,
    crash::CRASH_AT_VAR,
    journal::JOURNAL_PATH,
    link, maps, netns,
    pins::{Attachment, Direction},
    policy::{Action, CheckedPolicy, PolicySpec, PolicyTable, parse_prefix},
    system::LOCK_PATH,
    upgrade,
};

/// Asserts a failure in one line holding every one of `needles`.
fn assert_refused(out: &Output, what: &str, needles: &[&str]) {
    let line = error_line(out, what);
    for needle in needles {
        assert!(line.contains(needle), "{what}: no {needle:?} in: {line}");
    }
}

fn assert_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pin_dir(ns: &str, iface: &str) -> PathBuf {
    Path::new(PIN_ROOT).join("netns").join(ns).join(iface)
}

/// Adds a veth pair `a`/`b` in `netns`, both up.
fn add_veth(netns: &Netns, a: &str, b: &str) {
    netns
        .ip(&["link", "add", a, "type", "veth", "peer", "name", b])
        .unwrap_or_else(|e| panic!("{e:#}"));
    for dev in [a, b] {
        netns
            .ip(&["link", "set", dev, "up"])
            .unwrap_or_else(|e| panic!("{e:#}"));
    }
}

fn interface_toml(iface: &str, rate: &str, policies: &[(&str, &str)]) -> String {
    let mut text =
        format!("[[interface]]\nname = \"{iface}\"\nrate = \"{rate}\"\nburst = \"64k\"\n");
    for (prefix, rate) in policies {
        text += &format!(
            "\n[[interface.policy]]\nprefix = \"{prefix}\"\nrate = \"{rate}\"\nburst = \"64k\"\n"
        );
    }
    text
}

/// What an interface holds: `config show` (settings and every policy) and the routes of
/// its prefix tries (which `config show` does not show: a route left to a freed slot
/// would send a later policy's sources astray), or `detached` when shaper is not attached
/// to it; and whether an XDP program is on it.
fn state(netns: &Netns, iface: &str) -> (String, bool) {
    let out = shaper(netns.name(), &["config", "show", iface]);
    let config = if out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        for trie in [PIN_PREFIXES_V4, PIN_PREFIXES_V6] {
            let pin = pin_dir(netns.name(), iface).join(trie);
            let out = Command::new("bpftool")
                .args(["-j", "map", "dump", "pinned"])
                .arg(&pin)
                .output()
                .unwrap();
            let dump = assert_ok(&out, "bpftool map dump");
            let mut routes: Vec<String> = serde_json::from_str::<Vec<Value>>(&dump)
                .unwrap_or_else(|e| panic!("bpftool's JSON ({e}): {dump}"))
                .iter()
                .map(|entry| format!("{} -> {}", entry["key"], entry["value"]))
                .collect();
            routes.sort();
            text += &format!("\n{trie}: {routes:?}");
        }
        text
    } else {
        "detached".to_owned()
    };
    let link = netns
        .ip_output(&["-j", "-d", "link", "show", "dev", iface])
        .unwrap_or_else(|e| panic!("{e:#}"));
    (config, link.contains("\"xdp\""))
}

/// The `-j status IFACE` row (other tests' attachments on this host are left out of it).
fn status_row(ns: &str, iface: &str) -> Value {
    let rows: Vec<Value> = serde_json::from_str(&shaper_ok(ns, &["-j", "status", iface])).unwrap();
    assert_eq!(rows.len(), 1);
    rows[0].clone()
}

// ---------------------------------------------------------------------------------------
// An interface or a namespace deleted while attached

/// The kernel detaches the program when the interface goes; the pins stay. `status` says
/// the interface is gone, `stats` and `policy list` still read the last counts, `policy
/// set` and `apply` refuse in one line, and `detach` removes the pins.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn interface_deleted_while_attached() {
    let lab = Lab::new("fz-ifdel", 1).unwrap();
    let (ns, rx) = (lab.rx_ns(), lab.rx_netns());
    add_veth(rx, "fzd0", "fzd1");
    let guard = attach(ns, "fzd0", "8mbit", "64k");
    shaper_ok(
        ns,
        &["policy", "set", "fzd0", "10.0.0.0/8", "--action", "pass"],
    );
    rx.ip(&["link", "del", "fzd0"]).unwrap();

    let text = shaper_ok(ns, &["status", "fzd0"]);
    assert!(text.contains("interface gone"), "{text}");
    assert_eq!(status_row(ns, "fzd0")["interface_present"], false);
    shaper_ok(ns, &["stats", "fzd0"]);
    let list = shaper_ok(ns, &["policy", "list", "fzd0"]);
    assert!(list.contains("10.0.0.0/8"), "{list}");

    let what = "policy set on a deleted interface";
    assert_refused(
        &shaper(
            ns,
            &["policy", "set", "fzd0", "11.0.0.0/8", "--action", "pass"],
        ),
        what,
        &["fzd0", "gone", "detach"],
    );
    assert_refused(
        &shaper(ns, &["policy", "del", "fzd0", "10.0.0.0/8"]),
        "policy del on a deleted interface",
        &["fzd0", "gone"],
    );
    let file = TempFile::new("ifdel", &interface_toml("fzd0", "4mbit", &[]));
    assert_refused(
        &shaper(ns, &["apply", "-f", file.path()]),
        "apply on a deleted interface",
        &["fzd0", "does not exist"],
    );
    assert_eq!(
        shaper_ok(ns, &["policy", "list", "fzd0"]),
        list,
        "{what} changed the policies"
    );

    let out = guard.detach().unwrap();
    assert!(out.contains("detached"), "{out}");
    assert!(!pin_dir(ns, "fzd0").exists());
}

/// An attach over the pins of a deleted interface, made again, links the program again
/// over them (its cells kept). Killed at each step of that, the next command puts the pins
/// back as it found them, the maps the same maps: the link taken off, the settings and
/// policies as they were, never the pins removed (which would drop every cell); the next
/// attach links again over them. On XDP, and on egress with clsact and TCX.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_killed_attach_over_a_deleted_interfaces_pins_keeps_them() {
    let lab = Lab::new("fz-relink", 1).unwrap();
    let (ns, rx) = (lab.rx_ns(), lab.rx_netns());
    let hooks: [(&str, Direction, &[&str]); 3] = [
        ("ingress", Direction::Ingress, &[]),
        ("egress", Direction::Egress, &["--tc-mode", "clsact"]),
        ("egress", Direction::Egress, &["--tc-mode", "tcx"]),
    ];
    for (direction, toward, more) in hooks {
        let what = format!("{direction} {more:?}");
        add_veth(rx, "fzr0", "fzr1");
        let guard = common::attach_toward(ns, "fzr0", direction, "8mbit", "64k", more);
        let run = |args: &[&str]| {
            let mut all = vec!["--direction", direction];
            all.extend_from_slice(args);
            all.iter().map(|a| a.to_string()).collect::<Vec<_>>()
        };
        let ok = |args: &[&str]| {
            let all = run(args);
            shaper_ok(ns, &all.iter().map(String::as_str).collect::<Vec<_>>())
        };
        ok(&["policy", "set", "fzr0", "10.0.0.0/8", "--action", "pass"]);
        let at = Attachment::toward("fzr0", Some(ns), toward);
        let sources = || bpf::map_info(&at.dir().join(PIN_SOURCES)).map(|m| m.id);
        // In the namespace: a clsact filter is found by the interface's index there.
        let liveness = || {
            let at = at.clone();
            let said = netns::run_in(ns, move || format!("{:?}", link::liveness(&at)));
            said.unwrap()
        };
        let before = sources().unwrap();
        // The program linked: relinking links the same one again, nothing loaded.
        let program = || {
            let link = bpf::obj_get(&at.link());
            match link {
                Ok(link) => bpf::xdp_link_info(link.as_fd()).unwrap().prog_id,
                Err(_) => bpf::prog_id(bpf::obj_get(&at.tc_prog()).unwrap().as_fd()).unwrap(),
            }
        };
        let linked = program();
        let config = ok(&["config", "show", "fzr0"]);
        rx.ip(&["link", "del", "fzr0"]).unwrap();
        add_veth(rx, "fzr0", "fzr1");

        let mut again = vec!["attach", "fzr0", "--rate", "8mbit", "--burst", "64k"];
        again.extend_from_slice(more);
        let again = run(&again);
        let again: Vec<&str> = again.iter().map(String::as_str).collect();
        for step in ["journal-written", "attach-attached", "attach-linked"] {
            killed_at(ns, step, &again);
            let all = run(&["status", "fzr0"]);
            let out = shaper(ns, &all.iter().map(String::as_str).collect::<Vec<_>>());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stderr.contains("interrupted"),
                "{what}: status after attach killed at {step}: {stderr}"
            );
            assert_eq!(
                sources().ok(),
                Some(before),
                "{what}: attach killed at {step}: the pins were not kept"
            );
            assert_eq!(liveness(), "Gone", "{what}: attach killed at {step}");
            assert_eq!(ok(&["config", "show", "fzr0"]), config, "{what} {step}");
        }
        let said = shaper_ok(ns, &again);
        assert!(said.contains("again over its pins"), "{what}: {said}");
        assert_eq!(sources().unwrap(), before, "{what}");
        assert_eq!(liveness(), "Live", "{what}");
        assert_eq!(program(), linked, "{what}: another program linked");
        guard.detach().unwrap();
        rx.ip(&["link", "del", "fzr0"]).unwrap();
    }
}

/// Deleting a namespace deletes its veth, which detaches the program; the pins stay
/// under the namespace's name. What works on pins (`status`, `stats`, `policy list`,
/// `detach`) works without the namespace; what needs it refuses in one line saying what
/// is left and how to remove it.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn namespace_deleted_while_attached() {
    let name = format!("fz-nsdel-{}", std::process::id());
    let netns = Netns::create(&name).unwrap();
    add_veth(&netns, "fzn0", "fzn1");
    // Declared after the namespace: the guard's detach must work once it is gone.
    let guard = attach(&name, "fzn0", "8mbit", "64k");
    shaper_ok(
        &name,
        &["policy", "set", "fzn0", "10.0.0.0/8", "--action", "pass"],
    );
    drop(netns);

    let row = status_row(&name, "fzn0");
    assert_eq!(row["interface_present"], false);
    assert_eq!(row["netns"], name.as_str());
    let text = shaper_ok(&name, &["status", "fzn0"]);
    assert!(text.contains("interface gone"), "{text}");
    shaper_ok(&name, &["stats", "fzn0"]);
    assert!(shaper_ok(&name, &["policy", "list", "fzn0"]).contains("10.0.0.0/8"));
    shaper_ok(&name, &["config", "show", "fzn0"]);

    for (what, args) in [
        (
            "policy set",
            vec!["policy", "set", "fzn0", "11.0.0.0/8", "--action", "pass"],
        ),
        (
            "attach",
            vec!["attach", "fzn0", "--rate", "1mbit", "--burst", "64k"],
        ),
    ] {
        assert_refused(
            &shaper(&name, &args),
            &format!("{what} in a deleted namespace"),
            &[&name, "does not exist", "fzn0", "detach"],
        );
    }
    let file = TempFile::new("nsdel", &interface_toml("fzn0", "4mbit", &[]));
    assert_refused(
        &shaper(&name, &["apply", "-f", file.path()]),
        "apply in a deleted namespace",
        &[&name, "does not exist"],
    );

    guard.detach().unwrap();
    assert!(!pin_dir(&name, "fzn0").exists());
    assert!(!Path::new(PIN_ROOT).join("netns").join(&name).exists());
}

// ---------------------------------------------------------------------------------------
// A full source map

/// Sixteen sources, each sending at four times its limit, through a table of one bucket
/// (`--max-sources 4`: eight ways, the table's room rounded up to whole buckets). The first
/// eight take the ways and keep them: their cells are never idle, so no newcomer takes
/// their place and no source is handed a full bucket again. The other eight are metered
/// together in the shared unadmitted cell, as keys admission refused. So what passes is
/// what nine buckets allow, not sixteen (an LRU map evicted and refilled sources here, and
/// passed more than all sixteen limits). Every frame is counted once.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_full_source_map() {
    const SOURCES: usize = 16;
    const ROOM: u64 = 8;
    let lab = Lab::new("fz-full", SOURCES).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface().to_owned());
    let _guard = attach_with(
        ns,
        &iface,
        "1mbit",
        "4k",
        &["--max-sources", "4", "--new-sources", "unlimited"],
    );
    let secs = 1.5;
    let flows = lab.flows(&[4_000_000; SOURCES], 1000);
    let results = shaper_lab::lab::run_udp(&lab, &flows, Duration::from_secs_f64(secs)).unwrap();
    let sent: u64 = results.iter().map(|r| r.sent_packets).sum();
    let received: u64 = results.iter().map(|r| r.received_packets).sum();

    let status: Vec<Value> =
        serde_json::from_str(&shaper_ok(ns, &["-j", "status", &iface])).unwrap();
    let tracked = status[0]["ipv4_sources_tracked"].as_u64().unwrap();
    assert_eq!(
        status[0]["max_sources"].as_u64(),
        Some(ROOM),
        "{}",
        status[0]
    );
    assert!(
        tracked <= ROOM,
        "{tracked} sources tracked in a table of {ROOM}"
    );
    let s = stats(ns, &iface);
    let (passed, dropped, untracked, new, unadmitted) = (
        s.total("passed_packets"),
        s.total("dropped_packets"),
        s.total("untracked_packets"),
        s.total("new_sources"),
        s.total("unadmitted_packets"),
    );
    println!(
        "sent {sent}, received {received}; passed {passed}, dropped {dropped}, untracked {untracked}, unadmitted {unadmitted}; new sources {new}, tracked {tracked}/{ROOM}"
    );
    assert!(
        new <= ROOM + 2,
        "{new} sources given a way: active sources were evicted"
    );
    assert!(unadmitted > 0, "no source found the bucket full");
    // Every IP frame once, whatever became of it; the lab's frames, and at most a few of
    // the kernel's own (IPv6 router solicitations).
    let ip = s.total("ipv4_packets") + s.total("ipv6_packets");
    assert_eq!(
        passed + dropped + untracked + unadmitted,
        ip,
        "frames counted twice or not at all"
    );
    assert!(
        ip >= sent && ip <= sent + 20,
        "{ip} frames counted for {sent} sent"
    );
    let all_passed = passed + s.total("unadmitted_passed_packets");
    assert!(
        received <= all_passed,
        "{received} received, {all_passed} passed"
    );
    // Nine buckets' worth at most (eight sources' own and the shared unadmitted one): no
    // source's bucket was refilled.
    let bucket = (1e6 / 8.0 * secs + 4096.0) / 1042.0;
    let bound = (ROOM + 1) as f64 * bucket;
    assert!(
        (received as f64) < 1.1 * bound,
        "{received} frames passed, over {bound:.0}: buckets refilled"
    );
}

// ---------------------------------------------------------------------------------------
// bpffs not mounted

/// Runs `shaper ARGS` in a private mount namespace where `setup` (a shell command) has
/// changed /sys/fs/bpf; the host's mount is never touched. `after` runs there too.
fn in_private_mounts(setup: &str, after: &str, args: &[&str]) -> Output {
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            r#"{setup} || exit 99; "$0" "$@"; rc=$?; {after}; exit $rc"#
        ))
        .arg(shaper_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(99), "setup failed: {out:?}");
    out
}

/// With a tmpfs over /sys/fs/bpf, every command that needs pins refuses in one line
/// naming bpffs, and the attachment on the real bpffs is untouched. With a new, empty
/// bpffs there, `status` finds nothing attached and `attach` is refused by the kernel
/// (the interface has XDP already) and leaves no pin in it.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn bpffs_not_mounted() {
    let lab = Lab::new("fz-bpffs", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let _guard = attach(&ns, &iface, "8mbit", "64k");
    shaper_ok(
        &ns,
        &["policy", "set", &iface, "10.0.0.0/8", "--action", "pass"],
    );
    let before = state(lab.rx_netns(), &iface);
    let file = TempFile::new("bpffs", &interface_toml(&iface, "4mbit", &[]));
    let tmpfs = "mount -t tmpfs tmpfs /sys/fs/bpf";
    for args in [
        vec!["status"],
        vec!["stats", &iface],
        vec!["policy", "list", &iface],
        vec!["policy", "set", &iface, "11.0.0.0/8", "--action", "pass"],
        vec!["apply", "-f", file.path()],
        vec!["detach", &iface],
        vec!["attach", &iface, "--rate", "1mbit", "--burst", "64k"],
    ] {
        let mut all = vec!["-n", ns.as_str()];
        all.extend_from_slice(&args);
        let out = in_private_mounts(tmpfs, "true", &all);
        assert_refused(
            &out,
            &format!("{args:?} without bpffs"),
            &["bpffs", "/sys/fs/bpf"],
        );
    }
    assert_eq!(
        state(lab.rx_netns(), &iface),
        before,
        "a command without bpffs changed it"
    );

    let empty = "mount -t bpf bpf /sys/fs/bpf";
    let out = in_private_mounts(empty, "true", &["status"]);
    assert!(assert_ok(&out, "status on an empty bpffs").contains("not attached anywhere"));
    let out = in_private_mounts(
        empty,
        // The pin root stays (root's, 0700); nothing in it.
        "test -z \"$(ls -A /sys/fs/bpf/shaper)\" || ls -R /sys/fs/bpf/shaper >&2",
        &[
            "-n", &ns, "attach", &iface, "--rate", "1mbit", "--burst", "64k",
        ],
    );
    assert_refused(
        &out,
        "attach on an empty bpffs",
        &["cannot attach XDP", &iface],
    );
    assert_eq!(state(lab.rx_netns(), &iface), before);
}

// ---------------------------------------------------------------------------------------
// Two commands at once

/// The host lock, held by the test as another shaper command would hold it.
struct HeldLock(#[expect(dead_code, reason = "held for its flock until dropped")] fs::File);

impl HeldLock {
    fn take() -> Self {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_PATH)
            .unwrap();
        // SAFETY: flock on a descriptor we own.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        Self(file)
    }
}

/// A command waits while another holds the lock, then runs; eight `policy set`s started
/// at once all land (without the lock, each reads the set and writes it back with its own
/// prefix, and some are lost).
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn two_commands_at_once() {
    let lab = Lab::new("fz-lock", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let _guard = attach(&ns, &iface, "8mbit", "64k");

    let held = HeldLock::take();
    let mut child = Command::new(shaper_bin())
        .args([
            "-n",
            &ns,
            "policy",
            "set",
            &iface,
            "10.0.0.0/8",
            "--action",
            "pass",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "policy set ran while the lock was held"
    );
    drop(held);
    assert!(child.wait().unwrap().success());
    assert!(shaper_ok(&ns, &["policy", "list", &iface]).contains("10.0.0.0/8"));
    shaper_ok(&ns, &["policy", "del", &iface, "10.0.0.0/8"]);

    for round in 0..3 {
        let children: Vec<_> = (0..8)
            .map(|i| {
                Command::new(shaper_bin())
                    .args(["-n", &ns, "policy", "set", &iface])
                    .arg(format!("10.{round}.{i}.0/24"))
                    .args(["--action", "pass"])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success());
        }
        let list = shaper_ok(&ns, &["policy", "list", &iface]);
        for i in 0..8 {
            let prefix = format!("10.{round}.{i}.0/24");
            assert!(
                list.contains(&prefix),
                "round {round}: {prefix} was lost:\n{list}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Without privileges

/// As nobody, every command refuses in one line naming what it lacks, and nothing
/// changes: not the attachment, its policies, the pins, nor the journal.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn unprivileged_commands_touch_nothing() {
    let lab = Lab::new("fz-nopriv", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let _guard = attach(&ns, &iface, "8mbit", "64k");
    shaper_ok(
        &ns,
        &["policy", "set", &iface, "10.0.0.0/8", "--action", "pass"],
    );
    let before = state(lab.rx_netns(), &iface);
    let pins: Vec<_> = fs::read_dir(pin_dir(&ns, &iface))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let file = TempFile::new("nopriv", &interface_toml(&iface, "4mbit", &[]));
    let binary = nobody_binary();
    for args in [
        vec!["status"],
        vec!["stats", &iface],
        vec!["policy", "list", &iface],
        vec!["policy", "set", &iface, "11.0.0.0/8", "--action", "pass"],
        vec!["policy", "del", &iface, "10.0.0.0/8"],
        vec!["apply", "-f", file.path()],
        vec!["config", "show", &iface],
        vec!["attach", &iface, "--rate", "1mbit", "--burst", "64k"],
        vec!["detach", &iface],
    ] {
        let mut all = vec!["-n", ns.as_str()];
        all.extend_from_slice(&args);
        let out = binary.command(&all).output().unwrap();
        assert_refused(
            &out,
            &format!("{args:?} as nobody"),
            &["root", "CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"],
        );
    }
    assert_eq!(state(lab.rx_netns(), &iface), before);
    let after: Vec<_> = fs::read_dir(pin_dir(&ns, &iface))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(after, pins);
    assert!(!Path::new(JOURNAL_PATH).exists());
}

// ---------------------------------------------------------------------------------------
// Killed half way

/// Runs `shaper -n NS ARGS` told to kill itself at `step`; asserts it died by SIGKILL.
fn killed_at(ns: &str, step: &str, args: &[&str]) {
    let out = Command::new(shaper_bin())
        .args(["-n", ns])
        .args(args)
        .env(CRASH_AT_VAR, step)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{args:?} at {step} was not killed: {out:?}"
    );
}

/// After a kill: the next command (`status`) rolls back, saying so in one line on
/// stderr naming the command and every interface; returns that line.
/// `attached` is an interface that stays attached throughout, for `status` to show (other
/// tests' attachments on this host are none of this test's).
fn rolled_back_by_status(ns: &str, attached: &str, command: &str, ifaces: &[&str]) -> String {
    let out = shaper(ns, &["status", attached]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "status after a kill: {stderr}");
    assert!(
        stderr.lines().count() == 1 && stderr.contains("interrupted") && stderr.contains(command),
        "status did not say it rolled back `{command}`: {stderr:?}"
    );
    for iface in ifaces {
        assert!(stderr.contains(iface), "{iface} not named: {stderr}");
    }
    assert!(
        !Path::new(JOURNAL_PATH).exists(),
        "the journal is still there"
    );
    stderr
}

/// Each change, killed at each of its steps, is rolled back whole by the next command:
/// the interfaces hold their settings and policies from before it, byte for byte as
/// `config show` prints them, with the program attached as before.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn killed_at_each_step_the_next_command_rolls_back() {
    let lab = Lab::new("fz-steps", 1).unwrap();
    let (ns, rx) = (lab.rx_ns().to_owned(), lab.rx_netns());
    let iface = lab.rx_iface().to_owned();
    add_veth(rx, "fzs0", "fzs1");
    let _new_guard = guard(&ns, "fzs0");
    let _guard = attach(&ns, &iface, "8mbit", "64k");
    shaper_ok(
        &ns,
        &[
            "policy",
            "set",
            &iface,
            "10.0.0.0/8",
            "--rate",
            "1mbit",
            "--burst",
            "64k",
        ],
    );
    shaper_ok(
        &ns,
        &["policy", "set", &iface, "10.1.0.0/16", "--action", "pass"],
    );
    let old = (state(rx, &iface), state(rx, "fzs0"));
    assert_eq!(old.1, ("detached".to_owned(), false));
    let check = |what: &str| {
        assert_eq!(
            (state(rx, &iface), state(rx, "fzs0")),
            old,
            "{what}: not as before"
        );
    };

    let common_steps = ["journal-written", "journal-commit"];
    // A new attachment.
    let attach_new = ["attach", "fzs0", "--rate", "2mbit", "--burst", "64k"];
    for step in common_steps
        .iter()
        .chain(&["attach-pinned", "attach-attached", "attach-linked"])
    {
        killed_at(&ns, step, &attach_new);
        rolled_back_by_status(&ns, &iface, "attach", &["fzs0"]);
        check(&format!("attach killed at {step}"));
        assert!(
            !pin_dir(&ns, "fzs0").exists(),
            "attach killed at {step} left pins"
        );
    }
    // An update of an attachment.
    let update = [
        "attach", &iface, "--rate", "3mbit", "--burst", "64k", "--mode", "monitor",
    ];
    for step in common_steps.iter().chain(&["update-config"]) {
        killed_at(&ns, step, &update);
        rolled_back_by_status(&ns, &iface, "attach", &[&iface]);
        check(&format!("update killed at {step}"));
    }
    // A policy added, one changed, one removed: each map write of the change in turn.
    let set_new = [
        "policy",
        "set",
        &iface,
        "10.2.0.0/16",
        "--rate",
        "2mbit",
        "--burst",
        "64k",
    ];
    let set_changed = [
        "policy",
        "set",
        &iface,
        "10.0.0.0/8",
        "--rate",
        "5mbit",
        "--burst",
        "64k",
    ];
    let del = ["policy", "del", &iface, "10.1.0.0/16"];
    for (command, args, writes) in [
        ("policy set", &set_new[..], 3),
        ("policy set", &set_changed[..], 2),
        ("policy del", &del[..], 2),
    ] {
        let steps = common_steps
            .iter()
            .map(|s| s.to_string())
            .chain((1..=writes).map(|n| format!("policy-step#{n}")));
        for step in steps {
            killed_at(&ns, &step, args);
            rolled_back_by_status(&ns, &iface, command, &[&iface]);
            check(&format!("{args:?} killed at {step}"));
        }
    }
    // Both interfaces in one apply: the attached one changed, the other attached.
    let file = TempFile::new(
        "steps",
        &format!(
            "{}\n{}",
            interface_toml(
                &iface,
                "4mbit",
                &[("10.0.0.0/8", "2mbit"), ("10.3.0.0/16", "1mbit")]
            ),
            interface_toml("fzs0", "2mbit", &[("10.4.0.0/16", "1mbit")])
        ),
    );
    let apply = ["apply", "-f", file.path()];
    let steps = common_steps.iter().map(|s| s.to_string()).chain(
        [
            "update-config",
            "policy-step#1",
            "policy-step#4",
            "apply-interface#1",
            "attach-pinned",
            "attach-attached",
            "attach-linked",
            "apply-interface#2",
        ]
        .map(str::to_owned),
    );
    for step in steps {
        killed_at(&ns, &step, &apply);
        rolled_back_by_status(&ns, &iface, "apply", &[&iface, "fzs0"]);
        check(&format!("apply killed at {step}"));
    }
    // And not killed, it all holds.
    shaper_ok(&ns, &apply);
    assert_ne!(state(rx, &iface), old.0);
    assert!(state(rx, "fzs0").1);
}

/// A policy that passes `prefix`.
/// The subscribers of `iface` as `subscriber list -j` prints them.
fn subscribers(ns: &str, iface: &str) -> Value {
    serde_json::from_str(&shaper_ok(ns, &["-j", "subscriber", "list", iface])).unwrap()
}

/// A LibreQoS file: a header, then `rows`.
fn shaped_devices(rows: &[&str]) -> String {
    let mut text = "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,\
                    Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n"
        .to_owned();
    for row in rows {
        text += row;
        text += "\n";
    }
    text
}

/// `subscriber import` killed after it wrote some of its subscribers (one changed, one
/// added, one removed, a prefix of each family moved from the removed one to the added
/// one) is rolled back whole by the next command: every subscriber, prefix and plan as
/// before.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_import_killed_half_way_is_rolled_back_whole() {
    let lab = Lab::new("fz-import", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let _guard = attach_with(&ns, &iface, "8mbit", "64k", &["--max-subscribers", "16"]);
    let first = TempFile::new(
        "import-a",
        &shaped_devices(&[
            "c1,A,d1,R,P,,\"100.64.0.1, 100.64.0.2\",fdd7:1:0:100::/56,1,1,10,10,",
            "c2,B,d2,R,P,,100.64.0.3,fdd7:2::/48,1,1,20,20,",
            "c2,B,d3,R,P,,100.64.0.4,,1,1,20,20,",
        ]),
    );
    let second = TempFile::new(
        "import-b",
        &shaped_devices(&[
            "c1,A,d1,R,P,,\"100.64.0.1, 100.64.0.2\",fdd7:1:0:100::/56,1,1,10,12.5,",
            "c3,C,d4,R,P,,100.64.0.3,fdd7:2::/48,1,1,30,30,",
        ]),
    );
    fn import<'a>(iface: &'a str, file: &'a TempFile) -> [&'a str; 7] {
        [
            "subscriber",
            "import",
            iface,
            "--from",
            "libreqos",
            "--prune",
            file.path(),
        ]
    }
    shaper_ok(&ns, &import(&iface, &first));
    let before = subscribers(&ns, &iface);
    assert_eq!(before.as_array().unwrap().len(), 2);
    for nth in ["subscriber-step#1", "subscriber-step#2"] {
        killed_at(&ns, nth, &import(&iface, &second));
        rolled_back_by_status(&ns, &iface, "subscriber import", &[&iface]);
        assert_eq!(subscribers(&ns, &iface), before, "killed at {nth}");
    }
    let done = shaper_ok(&ns, &import(&iface, &second));
    assert!(
        done.contains("1 added, 1 changed, 0 unchanged, 1 removed"),
        "{done}"
    );
}

/// An `apply` that reads its LibreQoS file as far as it changed (the rows the last one
/// saved) and moves two circuits to other prefixes, one of each family, killed after it
/// wrote the first, is rolled back whole by the next command: every subscriber and prefix
/// as before; the same apply then moves them both.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_reapply_moving_prefixes_killed_half_way_is_rolled_back_whole() {
    let lab = Lab::new("fz-moves", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let _guard = attach_with(&ns, &iface, "8mbit", "64k", &["--max-subscribers", "16"]);
    let rows = [
        "c1,A,d1,R,P,,100.64.0.1,fdd7:1:0:100::/56,1,1,10,10,",
        "c2,B,d2,R,P,,100.64.0.2,fdd7:2::/48,1,1,20,20,",
        "c3,C,d3,R,P,,100.64.0.3,,1,1,30,30,",
    ];
    let csv = std::env::temp_dir().join(format!("shaper-moves-{}.csv", std::process::id()));
    let write = |rows: &[&str]| fs::write(&csv, shaped_devices(rows)).unwrap();
    let file = TempFile::new(
        "moves",
        &format!(
            "[[interface]]\nname = \"{iface}\"\nrate = \"8mbit\"\nburst = \"64k\"\n\n[interface.libreqos]\nfile = \"{}\"\n",
            csv.display()
        ),
    );
    let apply = ["apply", "-f", file.path()];
    write(&rows);
    shaper_ok(&ns, &apply);
    // Again, read as far as it changed (nothing): a test build dies once done that way.
    killed_at(&ns, "apply-rows", &apply);
    let before = subscribers(&ns, &iface);
    let moved = [
        rows[0],
        "c2,B,d2,R,P,,100.64.0.2,fdd7:22::/48,1,1,20,20,",
        "c3,C,d3,R,P,,100.64.0.33,,1,1,30,30,",
    ];
    write(&moved);
    killed_at(&ns, "subscriber-step#1", &apply);
    rolled_back_by_status(&ns, &iface, "apply", &[&iface]);
    assert_eq!(subscribers(&ns, &iface), before);
    let done = shaper_ok(&ns, &apply);
    assert!(done.contains("0 added, 2 changed, 1 unchanged"), "{done}");
    let after = subscribers(&ns, &iface);
    let prefixes = |id: &str| -> Vec<&str> {
        let s = after
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap();
        s["prefixes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect()
    };
    assert_eq!(prefixes("c2"), ["100.64.0.2/32", "fdd7:22::/48"]);
    assert_eq!(prefixes("c3"), ["100.64.0.33/32"]);
    let _ = fs::remove_file(&csv);
}

fn pass(prefix: &str) -> CheckedPolicy {
    CheckedPolicy::new(PolicySpec {
        prefix: parse_prefix(prefix).unwrap(),
        limits: PolicyLimits {
            action: Action::Pass.value(),
            ..PolicyLimits::default()
        },
    })
    .unwrap()
}

/// A change (`shaper_user::change`) opens each pin of its attachment once and checks
/// their layout once, however much it reads and writes (before it, one `policy set`
/// checked the layout five times and opened about a hundred pins); and a change dropped
/// after it wrote, as when an error is returned half way, is rolled back before the lock
/// is let go: the policies as before, the journal gone.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_change_opens_the_pins_once_and_rolls_back_unless_committed() {
    let lab = Lab::new("fz-once", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let _guard = attach(&ns, &iface, "8mbit", "64k");
    for i in 0..50 {
        let prefix = format!("10.{i}.0.0/16");
        shaper_ok(&ns, &["policy", "set", &iface, &prefix, "--action", "pass"]);
    }
    let at = Attachment::new(&iface, Some(&ns));
    // Each map of the layout, and the link (whether the interface holds the program).
    let each_pin_once = layout::current().maps.len() as u64 + 1;
    for (what, change) in [
        (
            "policy set",
            Box::new(|| drop(change::set_policy(&at, pass("10.99.0.0/16")).unwrap()))
                as Box<dyn Fn()>,
        ),
        (
            "policy del",
            Box::new(|| {
                drop(change::del_policy(&at, parse_prefix("10.99.0.0/16").unwrap()).unwrap())
            }),
        ),
    ] {
        let (pins, checks) = (bpf::pins_opened(), upgrade::layout_checks());
        change();
        assert_eq!(
            (bpf::pins_opened() - pins, upgrade::layout_checks() - checks),
            (each_pin_once, 1),
            "{what}: (pins opened, layout checks)"
        );
    }

    let list = || {
        let table = PolicyTable::open(&at).unwrap();
        (table.config().unwrap(), table.list().unwrap())
    };
    let before = list();
    let prepared = change::begin("test", std::slice::from_ref(&at)).unwrap();
    let mut table = PolicyTable::of(prepared.pinned(&at).unwrap()).unwrap();
    let change = prepared.journal().unwrap();
    table.set(pass("10.200.0.0/16")).unwrap();
    table.del(parse_prefix("10.0.0.0/16").unwrap()).unwrap();
    assert_ne!(list().1, before.1, "nothing was written");
    assert!(
        Path::new(JOURNAL_PATH).exists(),
        "written without a journal"
    );
    drop(change);
    let after = list();
    assert_eq!(after.1, before.1, "not rolled back");
    assert!(!Path::new(JOURNAL_PATH).exists(), "the journal is left");
}

/// Sends a few frames from `src` (well within every burst) and returns what became of
/// them, (passed, dropped), as the source's counters in the pinned map say: read there,
/// not with a command, which would roll an interrupted change back first.
fn verdicts(lab: &Lab, src: Ipv4Addr) -> (u64, u64) {
    let at = Attachment::new(lab.rx_iface(), Some(lab.rx_ns()));
    let counts = |_: &Lab| {
        maps::read_sources(&at)
            .unwrap()
            .into_iter()
            .find(|(key, _)| *key == src)
            .map_or((0, 0), |(_, s)| {
                (s.outcomes.passed_packets, s.outcomes.dropped_packets)
            })
    };
    let before = counts(lab);
    let flow = Flow {
        src: src.into(),
        offered_bps: 80_000,
        frame_bytes: 1000,
    };
    let report = run_udp_with(
        lab,
        &[flow],
        Duration::from_millis(500),
        &RunOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let sent = report.flows[0].sent_packets;
    let after = counts(lab);
    let got = (after.0 - before.0, after.1 - before.1);
    assert!(sent > 0);
    assert_eq!(got.0 + got.1, sent, "{src}: {sent} sent, {got:?} metered");
    got
}

/// A policy change killed after the kernel already resolves sources by it: the traffic
/// it met meanwhile goes by the half-made change, and once the next command has rolled
/// it back, every source, the ones that met it included, is metered by the policies from
/// before (its cached slot resolved again), and a new source too (its family's prefix
/// count right). `config show` alone would not tell: sources keep a stale slot unseen
/// until a frame comes.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn traffic_after_a_rollback_meets_the_policies_from_before() {
    let lab = Lab::new("fz-traffic", 3).unwrap();
    let ns = lab.rx_ns().to_owned();
    let iface = lab.rx_iface().to_owned();
    let [s0, s1, s2] = [0, 1, 2].map(|i| lab.sources()[i]);
    let _guard = attach(&ns, &iface, "8mbit", "64k");
    let [a, b, c, _] = s0.octets();
    let block = format!("{a}.{b}.{c}.0/24");
    shaper_ok(&ns, &["policy", "set", &iface, &block, "--action", "drop"]);
    let (pass_s0, pass_s1) = (format!("{s0}/32"), format!("{s1}/32"));
    shaper_ok(
        &ns,
        &["policy", "set", &iface, &pass_s1, "--action", "pass"],
    );
    const ALL_DROPPED: fn(u64, u64) -> bool = |p, d| p == 0 && d > 0;
    const ALL_PASSED: fn(u64, u64) -> bool = |p, d| p > 0 && d == 0;
    let expect = |src: Ipv4Addr, want: fn(u64, u64) -> bool, what: &str| {
        let (p, d) = verdicts(&lab, src);
        assert!(want(p, d), "{what}: {src} passed {p}, dropped {d}");
    };
    expect(s0, ALL_DROPPED, "before");
    expect(s1, ALL_PASSED, "before");

    // A policy added for s0, killed after the generation moved on (its third write): s0
    // meets it, then the rollback takes it away.
    let add = ["policy", "set", &iface, &pass_s0, "--action", "pass"];
    killed_at(&ns, "policy-step#3", &add);
    expect(
        s0,
        ALL_PASSED,
        "the added policy, killed after its last write",
    );
    rolled_back_by_status(&ns, &iface, "policy set", &[&iface]);
    expect(s0, ALL_DROPPED, "the added policy rolled back");
    expect(s1, ALL_PASSED, "the added policy rolled back");

    // s1's policy removed, killed after the generation moved on (its second write): s1
    // meets the block, then the rollback gives its policy back.
    let del = ["policy", "del", &iface, &pass_s1];
    killed_at(&ns, "policy-step#2", &del);
    expect(
        s1,
        ALL_DROPPED,
        "the removed policy, killed after its last write",
    );
    rolled_back_by_status(&ns, &iface, "policy del", &[&iface]);
    expect(s1, ALL_PASSED, "the removed policy rolled back");
    expect(s0, ALL_DROPPED, "the removed policy rolled back");
    // A source never seen before finds its prefix too.
    expect(s2, ALL_DROPPED, "a new source after the rollbacks");
}

/// `tc -n NS qdisc show dev IFACE` and `tc -n NS filter show dev IFACE egress`.
fn tc_state(ns: &str, iface: &str) -> String {
    let mut text = String::new();
    for args in [
        &["qdisc", "show", "dev", iface][..],
        &["filter", "show", "dev", iface, "egress"][..],
    ] {
        let out = Command::new("tc")
            .args(["-n", ns])
            .args(args)
            .output()
            .unwrap();
        text += &String::from_utf8_lossy(&out.stdout);
    }
    text
}

/// An egress attach or update killed at each step is rolled back whole as well: the
/// egress pins (a directory inside the interface's) go, and the clsact qdisc and filter a
/// new clsact attachment added; the ingress attachment beside them stays as it was.
#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn an_egress_change_killed_at_each_step_is_rolled_back() {
    let lab = Lab::new("fz-egress", 1).unwrap();
    let (ns, rx) = (lab.rx_ns().to_owned(), lab.rx_netns());
    let iface = lab.rx_iface().to_owned();
    let _ingress = attach(&ns, &iface, "8mbit", "64k");
    let _egress = AttachGuard::toward(shaper_bin(), &ns, &iface, "egress");
    let ingress = state(rx, &iface);
    let tc = tc_state(&ns, &iface);
    let egress_dir = pin_dir(&ns, &iface).join("egress");
    for mode in ["clsact", "auto"] {
        let args = [
            "--direction",
            "egress",
            "attach",
            &iface,
            "--rate",
            "2mbit",
            "--burst",
            "64k",
            "--tc-mode",
            mode,
        ];
        for step in [
            "journal-written",
            "attach-pinned",
            "attach-attached",
            "journal-commit",
        ] {
            killed_at(&ns, step, &args);
            rolled_back_by_status(&ns, &iface, "attach", &[&iface]);
            let what = format!("egress attach --tc-mode {mode} killed at {step}");
            assert_eq!(state(rx, &iface), ingress, "{what}: ingress changed");
            assert!(!egress_dir.exists(), "{what}: left egress pins");
            assert_eq!(tc_state(&ns, &iface), tc, "{what}: left tc state");
        }
    }
    let args = [
        "--direction",
        "egress",
        "attach",
        &iface,
        "--rate",
        "2mbit",
        "--burst",
        "64k",
    ];
    shaper_ok(&ns, &args);
    let show = ["--direction", "egress", "config", "show", &iface];
    let egress = shaper_ok(&ns, &show);
    let update = [
        "--direction",
        "egress",
        "attach",
        &iface,
        "--rate",
        "3mbit",
        "--burst",
        "64k",
    ];
    for step in ["journal-written", "update-config", "journal-commit"] {
        killed_at(&ns, step, &update);
        rolled_back_by_status(&ns, &iface, "attach", &[&iface]);
        assert_eq!(
            shaper_ok(&ns, &show),
            egress,
            "egress update killed at {step}"
        );
        assert_eq!(state(rx, &iface), ingress, "egress update killed at {step}");
    }
}

/// Kills at random times during `attach`, `policy set` and `apply`: afterwards each
/// interface holds the old state or the new one in full, never a mix; when the next
/// command says it rolled back, the old one.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn killed_at_random_times_old_or_new_whole() {
    let lab = Lab::new("fz-random", 1).unwrap();
    let (ns, rx) = (lab.rx_ns().to_owned(), lab.rx_netns());
    let iface = lab.rx_iface().to_owned();
    add_veth(rx, "fzr0", "fzr1");
    let _new_guard = guard(&ns, "fzr0");
    let _guard = attach(&ns, &iface, "8mbit", "64k");
    let restore: Vec<String> = (0..20).map(|i| format!("10.{i}.0.0/16")).collect();
    for p in &restore {
        shaper_ok(&ns, &["policy", "set", &iface, p, "--action", "pass"]);
    }
    let both = |rx: &Netns| (state(rx, &iface), state(rx, "fzr0"));
    let old = both(rx);
    let file = TempFile::new(
        "random",
        &format!(
            "{}\n{}",
            interface_toml(
                &iface,
                "4mbit",
                &[("10.0.0.0/8", "2mbit"), ("10.30.0.0/16", "1mbit")]
            ),
            interface_toml("fzr0", "2mbit", &[("10.4.0.0/16", "1mbit")])
        ),
    );
    let set = [
        "policy",
        "set",
        &iface,
        "10.40.0.0/16",
        "--rate",
        "1mbit",
        "--burst",
        "64k",
    ];
    let attach_new = ["attach", "fzr0", "--rate", "2mbit", "--burst", "64k"];
    let apply = ["apply", "-f", file.path()];
    // How to go back to the old state from the new one.
    let undo_set = ["policy", "del", &iface, "10.40.0.0/16"];
    let detach_new = ["detach", "fzr0"];
    let mut rng = Rng::new(13);
    let mut outcomes = std::collections::BTreeMap::new();
    for (name, args) in [
        ("policy set", &set[..]),
        ("attach", &attach_new[..]),
        ("apply", &apply[..]),
    ] {
        // How long the command takes, to spread the kills over it.
        let start = Instant::now();
        shaper_ok(&ns, args);
        let took = start.elapsed();
        let new = both(rx);
        assert_ne!(new, old);
        let back_to_old = |rx: &Netns| {
            match name {
                "policy set" => drop(shaper_ok(&ns, &undo_set)),
                "attach" => drop(shaper_ok(&ns, &detach_new)),
                _ => {
                    let f = TempFile::new("random-back", &interface_toml(&iface, "8mbit", &[]));
                    shaper_ok(&ns, &["apply", "-f", f.path()]);
                    for p in &restore {
                        shaper_ok(&ns, &["policy", "set", &iface, p, "--action", "pass"]);
                    }
                    let _ = shaper(&ns, &["detach", "fzr0"]);
                }
            }
            assert_eq!(both(rx), old, "{name}: could not go back");
        };
        back_to_old(rx);
        for _ in 0..12 {
            let delay =
                Duration::from_secs_f64(took.as_secs_f64() * (rng.below(1000) as f64 / 1000.0));
            let mut child = Command::new(shaper_bin())
                .args(["-n", &ns])
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(delay);
            let _ = child.kill();
            let status = child.wait().unwrap();
            let out = shaper(&ns, &["status", &iface]);
            let said = String::from_utf8_lossy(&out.stderr).contains("rolled back");
            let now = both(rx);
            let outcome = if now == old {
                "old"
            } else if now == new {
                "new"
            } else {
                panic!("{name} killed after {delay:?} ({status}) left a mix: {now:?}")
            };
            assert!(
                !(said && outcome == "new"),
                "{name}: rolled back, yet the new state holds"
            );
            *outcomes
                .entry((
                    name,
                    outcome,
                    if said { "rolled back" } else { "-" },
                    status.success(),
                ))
                .or_insert(0) += 1;
            if outcome == "new" {
                back_to_old(rx);
            }
        }
    }
    println!("kills (command, state after, said, finished before the kill): {outcomes:?}");
}

/// Subscribers' ids and names are kept beside their entries (the entries hold a hash of
/// the id), in a root-only file per attachment: made by `attach`, written by each change
/// and put back by the rollback of a killed one, checked against the entries by every
/// read (a record that is not its entry's id, or no file, is refused in one line, nothing
/// invented and nothing changed), removed by `detach`. IPv4 and IPv6 prefixes each.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn subscribers_ids_and_names_are_state_beside_the_entries() {
    use shaper_user::subscriber::record;
    use std::os::unix::fs::{FileExt as _, MetadataExt as _};

    let lab = Lab::new("fz-ids", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let guard = attach_with(&ns, &iface, "8mbit", "64k", &["--max-subscribers", "8"]);
    let at = Attachment::new(&iface, Some(&ns));
    let path = record::path_of(&at);
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&path), 0o600, "{}", path.display());
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    let set = |id: &str, name: &str, n: u32| {
        let (v4, v6) = (format!("100.64.0.{n}/32"), format!("fdd7:{n}::/56"));
        let args = [
            "subscriber",
            "set",
            &iface,
            id,
            "--name",
            name,
            "--prefix",
            &v4,
            "--prefix",
            &v6,
            "--rate",
            "10mbit",
            "--burst",
            "64k",
        ];
        args.map(str::to_owned)
    };
    let run = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        shaper_ok(&ns, &args)
    };
    run(&set("s1", "Alice", 1));
    run(&set("s2", "Bob Smith", 2));
    let before = subscribers(&ns, &iface);
    let names: Vec<&str> = before
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Alice", "Bob Smith"]);

    // A change of the name alone killed after it wrote: the record is put back.
    let carol = set("s1", "Carol", 1);
    let carol: Vec<&str> = carol.iter().map(String::as_str).collect();
    killed_at(&ns, "subscriber-step#1", &carol);
    rolled_back_by_status(&ns, &iface, "subscriber set", &[&iface]);
    assert_eq!(subscribers(&ns, &iface), before, "the name put back");

    // A record that is not its entry's id: refused, not guessed.
    let index = {
        let pinned = maps::Pinned::open(&at).unwrap();
        shaper_user::subscriber::SubscriberTable::of(&pinned)
            .unwrap()
            .get("s1")
            .unwrap()
            .index
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let at_record = u64::from(index) * record::RECORD as u64;
    let mut kept = [0u8; record::RECORD];
    file.read_exact_at(&mut kept, at_record).unwrap();
    file.write_all_at(b"zz\0", at_record).unwrap();
    let list = ["-j", "subscriber", "list", &iface];
    let refused = shaper(&ns, &list);
    assert_refused(
        &refused,
        "a record not its entry's",
        &[
            &format!("entry {index}'s id is not its record's"),
            &path.display().to_string(),
        ],
    );
    // Another subscriber's probe reads that entry too (a table of 8 is one run).
    let show = shaper(&ns, &["subscriber", "show", &iface, "s2"]);
    assert_refused(&show, "a probe past it", &["is not its record's"]);
    file.write_all_at(&kept, at_record).unwrap();
    assert_eq!(subscribers(&ns, &iface), before);

    // No file: every command that names subscribers says so; nothing is written.
    let away = path.with_extension("away");
    fs::rename(&path, &away).unwrap();
    let missing = path.display().to_string();
    assert_refused(
        &shaper(&ns, &list),
        "no records",
        &["are missing", &missing],
    );
    let s3 = set("s3", "Dan", 3);
    let s3: Vec<&str> = s3.iter().map(String::as_str).collect();
    assert_refused(
        &shaper(&ns, &s3),
        "a set without records",
        &["are missing", &missing],
    );
    assert!(!path.exists(), "not made up again");
    fs::rename(&away, &path).unwrap();
    assert_eq!(subscribers(&ns, &iface), before, "nothing changed");
    run(&set("s3", "Dan", 3));

    // Detach removes it.
    drop(guard);
    assert!(!path.exists(), "{} left after detach", path.display());
}

/// Subscribers are placed by their id's hash (`shaper_user::subscriber::place`), on an
/// attachment of 8 so that ids collide: three ids of one home go to it and the two
/// entries after it; the first removed leaves a tombstone (not in use, its id kept) and the
/// later two are still found, set and removed; a new id of the same home takes the
/// tombstone, and killed half way is rolled back to it exactly (the third still found);
/// a full table refuses one more in one line; and a table without the marker (as an older
/// shaper placed it, first free) is searched whole and still served. IPv4 and IPv6
/// prefixes each.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn subscribers_placed_by_hash_collide_leave_tombstones_and_roll_back() {
    use aya::maps::{Array, MapData};
    use shaper_common::maps::{PIN_SUBSCRIBERS, Subscriber};
    use shaper_user::subscriber::{SubscriberTable, place, record};

    const ROOM: u32 = 8;
    let lab = Lab::new("fz-hash", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let _guard = attach_with(&ns, &iface, "8mbit", "64k", &["--max-subscribers", "8"]);
    let at = Attachment::new(&iface, Some(&ns));
    let entry = |i: u32| -> Subscriber {
        let pinned = maps::Pinned::open(&at).unwrap();
        let subs: Array<MapData, Subscriber> = pinned.map(PIN_SUBSCRIBERS).unwrap();
        subs.get(&i, 0).unwrap()
    };
    let index = |id: &str| {
        let pinned = maps::Pinned::open(&at).unwrap();
        SubscriberTable::of(&pinned)
            .unwrap()
            .get(id)
            .map(|s| s.index)
    };
    // Each plan's count of subscribers (in its entry's prefix_len) is the number of
    // entries in use on it.
    let counts_hold = |when: &str| {
        let pinned = maps::Pinned::open(&at).unwrap();
        let subs: Array<MapData, Subscriber> = pinned.map(PIN_SUBSCRIBERS).unwrap();
        let on = |slot: u32| {
            (1..=ROOM)
                .filter(|i| {
                    let e = subs.get(i, 0).unwrap();
                    e.in_use != 0 && e.plan == slot
                })
                .count() as u32
        };
        for (slot, p) in PolicyTable::of(&pinned).unwrap().plans().unwrap() {
            assert_eq!(p.prefix_len, on(slot), "plan slot {slot}'s count {when}");
        }
    };
    // Three ids of one home, and a fourth for the tombstone.
    let mut same: Vec<String> = Vec::new();
    let want = place::home(b"h0", ROOM);
    for n in 0.. {
        let id = format!("h{n}");
        if place::home(id.as_bytes(), ROOM) == want {
            same.push(id);
        }
        if same.len() == 4 {
            break;
        }
    }
    let set = |id: &str, n: u32, rate: &str| {
        let (v4, v6) = (format!("100.64.0.{n}/32"), format!("fdd7:{n}::/56"));
        shaper_ok(
            &ns,
            &[
                "subscriber",
                "set",
                &iface,
                id,
                "--prefix",
                &v4,
                "--prefix",
                &v6,
                "--rate",
                rate,
                "--burst",
                "64k",
            ],
        )
    };
    let (a, b, c, d) = (&same[0], &same[1], &same[2], &same[3]);
    for (n, id) in [a, b, c].into_iter().enumerate() {
        assert!(set(id, n as u32 + 1, "10mbit").contains("added"));
    }
    let h1 = place::after(want, ROOM);
    let h2 = place::after(h1, ROOM);
    assert_eq!(
        (index(a).unwrap(), index(b).unwrap(), index(c).unwrap()),
        (want, h1, h2),
        "a chain from their home"
    );
    assert_eq!(
        entry(0).id_hash,
        record::marker_hash(),
        "the table is marked"
    );
    // Each entry counts its routes (the kernel tests it against zero alone).
    assert_eq!(entry(want).in_use, 2);

    // The first removed: a tombstone; the later ones found, changed, removed.
    shaper_ok(&ns, &["subscriber", "del", &iface, a]);
    let tomb = entry(want);
    assert_eq!(
        (tomb.in_use, tomb.id_hash),
        (0, record::id_hash(a.as_bytes())),
        "a tombstone"
    );
    assert!(set(b, 2, "20mbit").contains("changed"));
    assert_eq!(index(b).unwrap(), h1);
    // A new one of the same home takes the tombstone; `a` is not found.
    counts_hold("after a plan change");
    assert!(set(d, 4, "10mbit").contains("added"));
    assert_eq!(index(d).unwrap(), want);
    assert!(index(a).is_err());

    // `b` removed, then a new id of the home placed in its tombstone on a new plan,
    // killed after its plan's slot and its entry were written: rolled back to the
    // tombstone exactly, the plan's slot freed (the journal held that slot alone, of the
    // plan's window), `c` past it still found.
    shaper_ok(&ns, &["subscriber", "del", &iface, b]);
    let b_tomb = entry(h1);
    let list_before = subscribers(&ns, &iface);
    let plans = || {
        let pinned = maps::Pinned::open(&at).unwrap();
        PolicyTable::of(&pinned).unwrap().plans().unwrap()
    };
    let plans_before = plans();
    killed_at(
        &ns,
        "subscriber-step#1",
        &[
            "subscriber",
            "set",
            &iface,
            a,
            "--prefix",
            "100.64.0.9/32",
            "--prefix",
            "fdd7:9::/56",
            "--rate",
            "30mbit",
            "--burst",
            "64k",
        ],
    );
    rolled_back_by_status(&ns, &iface, "subscriber set", &[&iface]);
    assert_eq!(entry(h1), b_tomb, "the tombstone put back");
    assert_eq!(subscribers(&ns, &iface), list_before);
    assert_eq!(plans(), plans_before, "the new plan's slot freed");
    assert_eq!(index(c).unwrap(), h2);
    shaper_ok(&ns, &["subscriber", "del", &iface, c]);
    counts_hold("after a rollback");

    // Full: 8 in use, the 9th refused in one line, nothing changed.
    let mut n = 10;
    while subscribers(&ns, &iface).as_array().unwrap().len() < ROOM as usize {
        set(&format!("f{n}"), n, "10mbit");
        n += 1;
    }
    let full = subscribers(&ns, &iface);
    let out = shaper(
        &ns,
        &[
            "subscriber",
            "set",
            &iface,
            "one-more",
            "--prefix",
            "100.64.1.1/32",
            "--prefix",
            "fdd7:100::/56",
            "--rate",
            "10mbit",
            "--burst",
            "64k",
        ],
    );
    assert_refused(
        &out,
        "a 9th subscriber",
        &["no room for another subscriber"],
    );
    assert_eq!(subscribers(&ns, &iface), full);
    counts_hold("when full");
    // The daemon's way (a RADIUS CoA and Disconnect, through its kept index): the counts
    // follow too.
    {
        use shaper_user::{change::Edit, system};
        let mut kept = change::Kept::default();
        let faster = |p: &PolicyLimits| PolicyLimits {
            aggregate_rate_bps: p.aggregate_rate_bps * 2,
            ..*p
        };
        // One edit as the listener makes it: under the lock, through the kept index.
        fn coa(at: &Attachment, kept: &mut change::Kept, edit: Edit<'_>) {
            let edits = change::begin_edits(
                "test",
                std::slice::from_ref(at),
                system::lock().unwrap(),
                kept,
            )
            .unwrap();
            edits.apply(&[(at.clone(), edit)]).unwrap();
        }
        for edit in [
            Edit::Plan {
                id: d.clone(),
                plan: &faster,
            },
            Edit::Plan {
                id: "f10".to_owned(),
                plan: &faster,
            },
            Edit::Del {
                id: "f11".to_owned(),
            },
        ] {
            coa(&at, &mut kept, edit);
            counts_hold("after a CoA");
        }
        set("f11", 11, "10mbit");
        // The index is read again only after a change that may have touched its
        // attachment: not after one of another attachment (each change logs the
        // attachments it may touch in the lock's file); after one of it, one that logs
        // nothing (an older shaper's), or a detach of it (not of another attachment).
        let mut again = || {
            let edit = Edit::Plan {
                id: "f10".to_owned(),
                plan: &faster,
            };
            coa(&at, &mut kept, edit);
            kept.reads()
        };
        let read = again();
        assert_eq!(again(), read, "nothing changed");
        let egress = ["--direction", "egress"];
        let attach = ["attach", &iface, "--rate", "8mbit", "--burst", "64k"];
        shaper_ok(&ns, &[&egress[..], &attach[..]].concat());
        let _egress = AttachGuard::toward(shaper_bin(), &ns, &iface, "egress");
        let policy = ["policy", "set", &iface, "10.9.0.0/16", "--action", "pass"];
        shaper_ok(&ns, &[&egress[..], &policy[..]].concat());
        assert_eq!(again(), read, "another attachment's changes");
        {
            let lock = system::lock().unwrap();
            lock.bump(lock.generation().unwrap()).unwrap();
        }
        assert_eq!(again(), read + 1, "a change that logs nothing");
        shaper_ok(&ns, &[&egress[..], &["detach", &iface][..]].concat());
        assert_eq!(again(), read + 1, "another attachment's detach");
        set("f11", 11, "20mbit");
        assert_eq!(again(), read + 2, "its own attachment's change");
    }
    // Every one still found by its probe, the last one's chain the longest.
    for s in full.as_array().unwrap() {
        let id = s["id"].as_str().unwrap();
        assert!(index(id).is_ok(), "{id}");
    }

    // Without the marker (an older shaper's table, placed first free): searched whole.
    {
        let pinned = maps::Pinned::open(&at).unwrap();
        let mut subs: Array<MapData, Subscriber> = pinned.map(PIN_SUBSCRIBERS).unwrap();
        subs.set(0, Subscriber::default(), 0).unwrap();
    }
    shaper_ok(&ns, &["subscriber", "del", &iface, d]);
    assert_eq!(
        entry(want),
        Subscriber::default(),
        "no tombstone without the marker"
    );
    // A new one goes to the first free entry, whatever its home.
    assert!(set("late", 40, "30mbit").contains("added"));
    assert_eq!(index("late").unwrap(), want);
    assert!(set("late", 40, "40mbit").contains("changed"));
    for s in subscribers(&ns, &iface).as_array().unwrap() {
        let id = s["id"].as_str().unwrap().to_owned();
        shaper_ok(&ns, &["subscriber", "del", &iface, &id]);
    }
    assert_ne!(entry(0).id_hash, record::marker_hash());
    // Empty: the next change marks it.
    assert!(set(a, 1, "10mbit").contains("added"));
    assert_eq!(entry(0).id_hash, record::marker_hash());
    assert_eq!(index(a).unwrap(), want);

    // A set of the same prefixes is known by lookups (each one a route of its own, as
    // many as the entry counts); fewer prefixes, or one inside a route of its own, is a
    // change of prefixes.
    let prefixes_of = |id: &str| -> Vec<String> {
        let all = subscribers(&ns, &iface);
        let s = all
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap();
        let mut p: Vec<String> = serde_json::from_value(s["prefixes"].clone()).unwrap();
        p.sort();
        p
    };
    let set_prefixes = |prefixes: &[&str]| {
        let mut args = vec![
            "subscriber",
            "set",
            &iface,
            a,
            "--rate",
            "10mbit",
            "--burst",
            "64k",
        ];
        for p in prefixes {
            args.extend(["--prefix", p]);
        }
        shaper_ok(&ns, &args)
    };
    for prefixes in [
        &["100.64.0.1/32"][..],
        &["100.64.0.0/24", "fdd7:1::/56"],
        &["100.64.0.0/25", "fdd7:1::/56"],
        &["100.64.0.0/25", "fdd7:1::/64"],
    ] {
        set_prefixes(prefixes);
        assert_eq!(prefixes_of(a), prefixes, "set to {prefixes:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Each subscriber's prefixes by record: a removal or a change of prefixes without the tries

/// Subscriber `id` over `prefixes`, 10 Mbit/s.
fn sub_spec(id: &str, prefixes: &[&str]) -> shaper_user::subscriber::SubscriberSpec {
    shaper_user::subscriber::SubscriberSpec {
        id: id.to_owned(),
        name: String::new(),
        prefixes: prefixes.iter().map(|p| parse_prefix(p).unwrap()).collect(),
        plan: PolicyLimits {
            action: shaper_common::maps::ACTION_LIMIT,
            rate_bps: 10_000_000,
            burst_bytes: 64_000,
            aggregate_rate_bps: 10_000_000,
            aggregate_burst_bytes: 64_000,
            ..PolicyLimits::default()
        },
    }
}

/// Every route of `at`'s tries, as (prefix, value).
fn all_routes(at: &Attachment) -> std::collections::BTreeSet<(String, u32)> {
    let table = PolicyTable::open(at).unwrap();
    let routes = table.routes().unwrap();
    routes
        .into_iter()
        .map(|(p, v)| (p.to_string(), v))
        .collect()
}

/// `routes` less `gone`'s prefixes, with `now`'s added to the value `gone` had.
fn routes_after(
    routes: &std::collections::BTreeSet<(String, u32)>,
    gone: &[&str],
    now: &[&str],
) -> std::collections::BTreeSet<(String, u32)> {
    let value = routes
        .iter()
        .find(|(p, _)| p == gone[0])
        .map(|(_, v)| *v)
        .unwrap();
    let was: Vec<&(String, u32)> = routes.iter().filter(|(_, v)| *v == value).collect();
    assert_eq!(
        was.len(),
        gone.len(),
        "{gone:?} are all of its routes: {was:?}"
    );
    let mut out: std::collections::BTreeSet<_> = routes
        .iter()
        .filter(|(p, _)| !gone.contains(&p.as_str()))
        .cloned()
        .collect();
    out.extend(now.iter().map(|p| (p.to_string(), value)));
    out
}

/// How many times `f` read a prefix trie whole.
fn tries_read_by(f: impl FnOnce()) -> u64 {
    let before = shaper_user::policy::table::tries_read();
    f();
    shaper_user::policy::table::tries_read() - before
}

/// A removal and a change of prefixes, one at a time, find the subscriber's prefixes in
/// its record (`subscriber::prefixes`), written by every change of its routes (a batch's
/// and a single one's), and read no trie, however stale the routes the last batch saved:
/// each removes exactly that subscriber's routes, IPv4 and IPv6, and a change of
/// prefixes checks its overlaps by lookups (its own prefix inside a new one passed over,
/// another's refused). A subscriber with more prefixes than a record holds, a record
/// that is not all of them (fewer, one twice, another's, garbage) and a missing file all
/// read the tries and still remove exactly the right routes; the next change makes the
/// file again, root-only.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_subscribers_prefixes_are_found_by_record_not_by_reading_the_tries() {
    use shaper_user::subscriber::{SubscriberTable, prefixes};
    use std::os::unix::fs::MetadataExt as _;

    let lab = Lab::new("fz-pfx", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let guard = attach_with(&ns, &iface, "8mbit", "64k", &["--max-subscribers", "64"]);
    let at = Attachment::new(&iface, Some(&ns));
    let path = prefixes::path_of(&at);
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    let s1 = ["100.64.1.1/32", "fdd7:1::/56"];
    let s2 = ["100.64.2.1/32", "fdd7:2::/56"];
    let s3 = ["100.64.3.0/29", "fdd7:3::/48"];
    // 14 prefixes: more than a record holds.
    let big: Vec<String> = (1..=13)
        .map(|i| format!("100.64.9.{i}/32"))
        .chain(["fdd7:9::/56".to_owned()])
        .collect();
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    let batch = [
        sub_spec("s1", &s1),
        sub_spec("s2", &s2),
        sub_spec("s3", &s3),
        sub_spec("big", &big),
    ];
    change::set_subscribers(&at, &batch, false, &mut |_, _| {}).unwrap();
    // Routes changed since the batch: the routes it saved are stale.
    shaper_ok(
        &ns,
        &["policy", "set", &iface, "10.9.0.0/16", "--action", "pass"],
    );
    let s4 = ["100.64.4.1/32", "fdd7:4::/56"];
    change::set_subscriber(&at, &sub_spec("s4", &s4)).unwrap();

    let del = |id: &str, gone: &[&str]| {
        let before = all_routes(&at);
        let reads = tries_read_by(|| {
            change::del_subscriber(&at, id).unwrap();
        });
        assert_eq!(
            all_routes(&at),
            routes_after(&before, gone, &[]),
            "del {id}"
        );
        reads
    };
    assert_eq!(del("s1", &s1), 0, "a batch's subscriber: its record");
    assert_eq!(del("s4", &s4), 0, "a single set's subscriber: its record");
    // The daemon's Disconnect, through an index it has just read (no prefixes in it):
    // from the record too.
    {
        use shaper_user::{change::Edit, system};
        let s7 = ["100.64.7.1/32", "fdd7:7::/56"];
        change::set_subscriber(&at, &sub_spec("s7", &s7)).unwrap();
        let before = all_routes(&at);
        let mut kept = change::Kept::default();
        let reads = tries_read_by(|| {
            let lock = system::lock().unwrap();
            let edits =
                change::begin_edits("test", std::slice::from_ref(&at), lock, &mut kept).unwrap();
            let del = Edit::Del {
                id: "s7".to_owned(),
            };
            edits.apply(&[(at.clone(), del)]).unwrap();
        });
        assert_eq!(reads, 0, "a Disconnect: its record");
        assert_eq!(all_routes(&at), routes_after(&before, &s7, &[]));
    }

    // A change of prefixes: its own /32 inside its new /28 is passed over.
    let s2_now = ["100.64.2.0/28", "fdd7:2::/56", "fdd7:22::/56"];
    let before = all_routes(&at);
    let reads = tries_read_by(|| {
        change::set_subscriber(&at, &sub_spec("s2", &s2_now)).unwrap();
    });
    assert_eq!(reads, 0, "a change of prefixes: its record");
    let gone = ["100.64.2.1/32", "fdd7:2::/56"];
    assert_eq!(all_routes(&at), routes_after(&before, &gone, &s2_now));
    // Another's prefix, a policy's, or one inside it: refused by lookups, nothing changed.
    let before = all_routes(&at);
    for (bad, says) in [
        ("100.64.9.1/32", "subscriber big's prefix 100.64.9.1/32"),
        ("10.9.0.0/16", "policy 10.9.0.0/16"),
        ("100.64.9.0/24", "subscriber big's prefix 100.64.9."),
        ("fdd7:3::/56", "inside subscriber s3's prefix fdd7:3::/48"),
        ("fdd7::/16", "is inside subscriber s2's prefix fdd7::/16"),
    ] {
        let mut prefixes = s2_now.to_vec();
        prefixes.push(bad);
        let mut err = String::new();
        let reads = tries_read_by(|| {
            err = change::set_subscriber(&at, &sub_spec("s2", &prefixes))
                .unwrap_err()
                .to_string();
        });
        assert_eq!(reads, 0, "{bad}");
        assert!(err.contains(says), "{bad}: {err}");
        assert_eq!(all_routes(&at), before, "{bad}");
    }
    assert_eq!(
        del("s2", &s2_now),
        0,
        "after a change of prefixes: its record"
    );
    assert!(del("big", &big) > 0, "more than a record holds: the tries");

    // A record that is not all of its prefixes: the tries, and exactly its routes go.
    let write_record = |bytes: &[u8]| {
        let index = SubscriberTable::of(&maps::Pinned::open(&at).unwrap())
            .unwrap()
            .index_of("s3")
            .unwrap()
            .unwrap();
        let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        use std::os::unix::fs::FileExt as _;
        file.write_all_at(bytes, u64::from(index) * prefixes::RECORD as u64)
            .unwrap();
    };
    let net = |p: &str| parse_prefix(p).unwrap();
    change::set_subscriber(&at, &sub_spec("s5", &s1)).unwrap();
    for (what, record) in [
        ("fewer", prefixes::encode(&[net(s3[0])])),
        ("one twice", prefixes::encode(&[net(s3[0]), net(s3[0])])),
        ("another's", prefixes::encode(&[net(s1[0]), net(s1[1])])),
        ("garbage", [0x5a; prefixes::RECORD]),
    ] {
        change::set_subscriber(&at, &sub_spec("s3", &s3)).unwrap();
        write_record(&record);
        assert!(del("s3", &s3) > 0, "{what}: the tries");
    }
    change::set_subscriber(&at, &sub_spec("s3", &s3)).unwrap();
    fs::remove_file(&path).unwrap();
    assert!(del("s3", &s3) > 0, "no file: the tries");
    // The next change makes it again, root-only, and the next removal reads it.
    change::set_subscriber(&at, &sub_spec("s3", &s3)).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(del("s3", &s3), 0, "the file made again");
    // One set before the file was made again has no record in it: the tries.
    assert!(del("s5", &s1) > 0, "no record");

    // A change of prefixes killed once written, before its commit: rolled back, its
    // record put back with its routes (not left naming the prefixes rolled back).
    let s6 = ["100.64.6.1/32", "fdd7:6::/56"];
    change::set_subscriber(&at, &sub_spec("s6", &s6)).unwrap();
    let moved = [
        "subscriber",
        "set",
        &iface,
        "s6",
        "--prefix",
        "100.64.7.1/32",
        "--prefix",
        "fdd7:7::/56",
        "--rate",
        "10mbit",
        "--burst",
        "64k",
    ];
    killed_at(&ns, "journal-commit", &moved);
    rolled_back_by_status(&ns, &iface, "subscriber set", &[&iface]);
    assert_eq!(del("s6", &s6), 0, "rolled back: its record");
    // A removal killed once written: rolled back whole, with the one policy slot it
    // journals, its plan's: one of two on it, and the last on its own.
    change::set_subscriber(&at, &sub_spec("s8", &s1)).unwrap();
    change::set_subscriber(&at, &sub_spec("s10", &s2)).unwrap();
    let mut own_plan = sub_spec("s9", &s4);
    own_plan.plan.aggregate_rate_bps = 20_000_000;
    change::set_subscriber(&at, &own_plan).unwrap();
    let plans = || {
        let pinned = maps::Pinned::open(&at).unwrap();
        PolicyTable::of(&pinned).unwrap().plans().unwrap()
    };
    for id in ["s8", "s9"] {
        let then = (all_routes(&at), plans(), subscribers(&ns, &iface));
        killed_at(&ns, "journal-commit", &["subscriber", "del", &iface, id]);
        rolled_back_by_status(&ns, &iface, "subscriber del", &[&iface]);
        let now = (all_routes(&at), plans(), subscribers(&ns, &iface));
        assert_eq!(now, then, "del {id} rolled back");
        assert_eq!(del(id, if id == "s8" { &s1 } else { &s4 }), 0, "{id}");
    }

    // Gone with the attachment; none for an attachment without room for subscribers.
    guard.detach().unwrap();
    assert!(!path.exists(), "{} left by detach", path.display());
    let _guard = attach(&ns, &iface, "8mbit", "64k");
    assert!(!path.exists(), "{} made without room", path.display());
}

/// A full table (every entry in use, as its plans' counts say) refuses a new subscriber
/// without reading every entry: a probe that goes on asks whether the table is full, and
/// then finds the id by its record; a subscriber as far from its home as the table is
/// long is found the same way, changed and removed. Its prefixes IPv4 and IPv6.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_full_table_refuses_a_new_subscriber_without_reading_every_entry() {
    use shaper_user::subscriber::{entries_read, place};
    const ROOM: u32 = 2048;

    let lab = Lab::new("fz-full", 1).unwrap();
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let room = ROOM.to_string();
    let _guard = attach_with(&ns, &iface, "8mbit", "64k", &["--max-subscribers", &room]);
    let at = Attachment::new(&iface, Some(&ns));
    // Every id's home the first entry: placed in order, the last one at the last entry,
    // a probe the length of the table from its home.
    let ids: Vec<String> = (0..)
        .map(|n| format!("c{n}"))
        .filter(|id| place::home(id.as_bytes(), ROOM) == 1)
        .take(ROOM as usize)
        .collect();
    let prefixes = |k: usize| {
        [
            format!("100.64.{}.{}/32", k / 256, k % 256),
            format!("fdd7:{k:x}::/56"),
        ]
    };
    let specs: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(k, id)| {
            let p = prefixes(k);
            sub_spec(id, &[&p[0], &p[1]])
        })
        .collect();
    change::set_subscribers(&at, &specs, false, &mut |_, _| {}).unwrap();
    let read_by = |f: &mut dyn FnMut()| {
        let before = entries_read();
        f();
        entries_read() - before
    };

    let mut err = String::new();
    let new = sub_spec("new", &["100.65.0.1/32", "fdd8::/56"]);
    let read = read_by(&mut || err = change::set_subscriber(&at, &new).unwrap_err().to_string());
    assert!(err.contains("no room for another subscriber"), "{err}");
    assert!(
        read < u64::from(ROOM) / 2,
        "refused after reading {read} entries"
    );

    let last = ids.last().unwrap();
    let mine = prefixes(ROOM as usize - 1);
    let moved = sub_spec(last, &[&mine[0], "fdd7:ffff::/56"]);
    let read = read_by(&mut || {
        change::set_subscriber(&at, &moved).unwrap();
    });
    assert!(
        read < u64::from(ROOM) / 2,
        "found after reading {read} entries"
    );
    let routes = all_routes(&at);
    let value = |p: &str| routes.iter().find(|(r, _)| r == p).map(|(_, v)| *v);
    assert_eq!(value("fdd7:ffff::/56"), value(&mine[0]));
    assert_eq!(value(&mine[1]), None);
    let before = all_routes(&at);
    let read = read_by(&mut || {
        change::del_subscriber(&at, last).unwrap();
    });
    assert!(
        read < u64::from(ROOM) / 2,
        "removed after reading {read} entries"
    );
    assert_eq!(
        all_routes(&at),
        routes_after(&before, &[&mine[0], "fdd7:ffff::/56"], &[])
    );
    // Room again: the new one fits.
    change::set_subscriber(&at, &new).unwrap();
}
