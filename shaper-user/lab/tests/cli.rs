//! The `shaper` command end to end, against the real kernel: attach, re-attach, detach, and
//! every way an attach can be refused.
//!
//! Everything happens inside a [`Lab`] (two throwaway network namespaces joined by a veth
//! pair): shaper is always run with `-n <lab rx namespace>`, so the machine's own interfaces
//! are never touched. Each test has its own lab, and an `AttachGuard` for anything it may
//! have attached, so a failing assertion still leaves nothing attached or pinned.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use common::{
    TempFile, assert_limited, error_line, guard, nobody_binary, replay, shaper_ok, stats,
};
use serde_json::Value;
use shaper_lab::{
    bins::shaper as shaper_bin,
    lab::{Flow, FlowResult, Lab, Netns, RunOptions, run_udp_with},
};

/// Where shaper pins, spelled out here rather than taken from the code under test.
const PIN_ROOT: &str = "/sys/fs/bpf/shaper";

/// The default `--max-sources`.
const DEFAULT_MAX_SOURCES: u64 = 262_144;

/// An interface name no lab creates.
const MISSING_IFACE: &str = "nosuchif0";

/// An interface made inside a lab's rx namespace whose driver has no native XDP support
/// (see [`add_no_xdp_iface`]).
const DUMMY_IFACE: &str = "shdum0";

// ---------------------------------------------------------------------------------------
// Running shaper

/// `shaper -n <rx ns> ARGS...`.
fn shaper(lab: &Lab, args: &[&str]) -> Output {
    common::shaper(lab.rx_ns(), args)
}

/// `shaper -n <rx ns> ARGS...`, which must succeed; returns its standard output.
fn ok(lab: &Lab, args: &[&str]) -> String {
    shaper_ok(lab.rx_ns(), args)
}

/// Runs a command other than shaper to completion.
fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// UDP traffic through the lab, all of it counted by the receiver, every send's time kept.
fn run_udp(lab: &Lab, flows: &[Flow], duration: Duration) -> Vec<FlowResult> {
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(lab, flows, duration, &options).expect("traffic");
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    report.flows
}

/// `attach IFACE` followed by `rest`.
fn attach_args<'a>(iface: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["attach", iface];
    args.extend_from_slice(rest);
    args
}

/// Asserts that the command failed with one line that contains every one of `needles`.
fn assert_refused(out: &Output, what: &str, needles: &[&str]) {
    let line = error_line(out, what);
    for needle in needles {
        assert!(
            line.contains(needle),
            "{what}: the error should mention {needle:?}: {line}"
        );
    }
    eprintln!("{what}: {line}");
}

/// The `-j status IFACE` row of an attached interface.
fn status(lab: &Lab, iface: &str) -> Value {
    let out = ok(lab, &["-j", "status", iface]);
    let rows: Vec<Value> = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("status JSON does not parse ({e}): {out}"));
    assert_eq!(rows.len(), 1, "status {iface} lists one row: {out}");
    rows.into_iter().next().expect("one row")
}

fn u64_field(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key:?} in {v}"))
}

/// Asserts the policy `status` shows: rate, burst and XDP mode.
fn assert_policy(lab: &Lab, iface: &str, rate_bps: u64, burst_bytes: u64, xdp_mode: &str) {
    let row = status(lab, iface);
    assert_eq!(u64_field(&row, "rate_bits_per_sec"), rate_bps, "{row}");
    assert_eq!(u64_field(&row, "burst_bytes"), burst_bytes, "{row}");
    assert_eq!(row["xdp_mode"], xdp_mode, "{row}");
}

/// Asserts how `status` says frames are keyed: address and prefix lengths.
fn assert_keys(lab: &Lab, iface: &str, key: &str, prefix_v4: u64, prefix_v6: u64) {
    let row = status(lab, iface);
    assert_eq!(row["key"], key, "{row}");
    assert_eq!(u64_field(&row, "prefix_v4_bits"), prefix_v4, "{row}");
    assert_eq!(u64_field(&row, "prefix_v6_bits"), prefix_v6, "{row}");
}

// ---------------------------------------------------------------------------------------
// What is on the interface and on bpffs

/// The pins of shaper on `iface` in the lab's rx namespace.
fn pin_dir(lab: &Lab, iface: &str) -> PathBuf {
    ns_pin_dir(lab.rx_ns()).join(iface)
}

/// The directory holding every pin dir of one named namespace.
fn ns_pin_dir(ns: &str) -> PathBuf {
    Path::new(PIN_ROOT).join("netns").join(ns)
}

/// Whether any XDP program is attached to `iface` in `ns` (`ip -d` shows an `xdp` key).
fn xdp_on(ns: &Netns, iface: &str) -> bool {
    let out = ns
        .ip_output(&["-j", "-d", "link", "show", "dev", iface])
        .unwrap_or_else(|e| panic!("ip link show {iface}: {e:#}"));
    let links: Vec<Value> = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("ip -j output does not parse ({e}): {out}"));
    assert_eq!(links.len(), 1, "ip link show dev {iface}: {out}");
    links[0].get("xdp").is_some()
}

/// After a refused command: no program on the lab's veth (nor on `iface`, if it exists)
/// and no pins for `iface` or anywhere under the lab's namespace.
fn assert_untouched(lab: &Lab, iface: &str, what: &str) {
    assert!(
        !lab.xdp_attached().expect("ip link show"),
        "{what}: an XDP program is attached to {}",
        lab.rx_iface()
    );
    if iface != lab.rx_iface() && iface != MISSING_IFACE {
        assert!(
            !xdp_on(lab.rx_netns(), iface),
            "{what}: an XDP program is attached to {iface}"
        );
    }
    let dir = pin_dir(lab, iface);
    assert!(!dir.exists(), "{what}: {} was left behind", dir.display());
    let ns_dir = ns_pin_dir(lab.rx_ns());
    assert!(
        !ns_dir.exists(),
        "{what}: {} was left behind",
        ns_dir.display()
    );
}

/// Drops the lab and checks that its namespaces and any pins of theirs are gone.
fn remove_lab(lab: Lab) {
    let names = [lab.rx_ns().to_owned(), lab.tx_ns().to_owned()];
    drop(lab);
    let out = run(Command::new("ip").args(["netns", "list"]));
    assert!(
        out.status.success(),
        "ip netns list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = String::from_utf8_lossy(&out.stdout);
    for name in &names {
        assert!(
            !list.contains(name.as_str()),
            "namespace {name} is still there: {list}"
        );
        let dir = ns_pin_dir(name);
        assert!(!dir.exists(), "{} was left behind", dir.display());
    }
}

/// Adds [`DUMMY_IFACE`] to `netns` and sets it up: a dummy interface, or where the
/// kernel has no dummy driver, a bridge without ports. Neither driver implements native
/// XDP; both take generic XDP and have a 1500-byte MTU. Inside the lab's namespace, it
/// goes with the lab.
fn add_no_xdp_iface(netns: &Netns) {
    let added = ["dummy", "bridge"]
        .into_iter()
        .find(|kind| {
            netns
                .ip(&["link", "add", DUMMY_IFACE, "type", kind])
                .is_ok()
        })
        .expect("the kernel has neither a dummy nor a bridge driver");
    netns
        .ip(&["link", "set", "dev", DUMMY_IFACE, "up"])
        .unwrap_or_else(|e| panic!("set the {added} {DUMMY_IFACE} up: {e:#}"));
}

fn new_lab(tag: &str) -> Lab {
    Lab::new(tag, 1).unwrap_or_else(|e| panic!("cannot create lab {tag}: {e:#}"))
}

/// Whether /sys/fs/bpf is a bpffs mount in this process's mount namespace.
fn bpffs_mounted() -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").expect("read /proc/self/mounts");
    mounts.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&"/sys/fs/bpf") && fields.get(2) == Some(&"bpf")
    })
}

// ---------------------------------------------------------------------------------------
// Tests

/// Attach, look at it, pass traffic, re-attach with a new rate (the rate changes, the
/// per-source state stays), detach, and find nothing left.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn attach_reattach_detach() {
    let lab = new_lab("cli-life");
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    let src = lab.sources()[0];
    // Twice the first rate, four times the second: the source is held to the limit.
    let flow = Flow {
        src: src.into(),
        offered_bps: 16_000_000,
        frame_bytes: 1000,
    };

    let out = ok(
        &lab,
        &["attach", &iface, "--rate", "8mbit", "--burst", "64k"],
    );
    eprintln!("attach: {}", out.trim());
    assert!(lab.xdp_attached().expect("ip link show"), "no XDP program");
    let dir = pin_dir(&lab, &iface);
    for pin in ["link", "config", "sources", "sources6", "counters"] {
        assert!(dir.join(pin).exists(), "no {pin} in {}", dir.display());
    }
    // veth has native XDP, so auto picks it.
    assert_policy(&lab, &iface, 8_000_000, 65_536, "native");
    assert_keys(&lab, &iface, "src", 32, 64);

    run_udp(&lab, &[flow], Duration::from_secs(1));
    let before = stats(lab.rx_ns(), &iface).key(src);
    eprintln!("after the first run: {before:?}");
    assert!(before.passed_bytes > 0, "{before:?}");
    assert!(before.dropped_bytes > 0, "{before:?}");

    let out = ok(
        &lab,
        &["attach", &iface, "--rate", "4mbit", "--burst", "32k"],
    );
    assert!(out.contains("updated"), "re-attach output: {out}");
    assert!(lab.xdp_attached().expect("ip link show"), "no XDP program");
    assert_policy(&lab, &iface, 4_000_000, 32_768, "native");
    // Updating in place keeps the source's cell and counters.
    let updated = stats(lab.rx_ns(), &iface).key(src);
    assert!(
        updated.kept(&before),
        "counters went back: {before:?} -> {updated:?}"
    );

    let result = run_udp(&lab, &[flow], Duration::from_secs(2)).remove(0);
    let after = stats(lab.rx_ns(), &iface).key(src);
    eprintln!("after the second run: {after:?}; {result:?}");
    let passed = after.passed_bytes - updated.passed_bytes;
    assert!(after.dropped_bytes > updated.dropped_bytes, "{after:?}");
    // The cell has been idle for longer than the new burst lasts, so the source gets the
    // full new burst plus the new rate for as long as it sent.
    let limit = (4_000_000, 32_768);
    assert_limited(
        "passed at 4mbit",
        passed,
        replay(&[&result], Some(limit), None)[0],
        limit,
        &[&result],
    );
    // What shaper let through is what arrived.
    assert_eq!(result.received_l2_bytes, passed);

    // New-source admission: set, kept by an update that does not name it, lifted.
    let admission = |lab: &Lab| {
        let s = status(lab, &iface);
        (
            u64_field(&s, "new_sources_per_sec"),
            u64_field(&s, "new_sources_burst"),
        )
    };
    // The default: a table's worth at once, a tenth of the table a second.
    assert_eq!(admission(&lab), (26_214, 262_144));
    let base = ["attach", &iface, "--rate", "4mbit", "--burst", "32k"];
    let with = |more: &[&'static str]| [&base[..], more].concat();
    let out = ok(
        &lab,
        &with(&["--new-sources", "500", "--new-sources-burst", "700"]),
    );
    assert!(
        out.ends_with("new sources second sighting, 500/s burst 700\n"),
        "{out}"
    );
    assert_eq!(admission(&lab), (500, 700));
    ok(&lab, &base);
    assert_eq!(admission(&lab), (500, 700));
    ok(&lab, &with(&["--new-sources", "1000"]));
    assert_eq!(admission(&lab), (1000, 1000));
    ok(&lab, &with(&["--new-sources", "unlimited"]));
    assert_eq!(admission(&lab), (0, 0));

    let out = ok(&lab, &["detach", &iface]);
    eprintln!("detach: {}", out.trim());
    assert_untouched(&lab, &iface, "after detach");
    assert_refused(
        &shaper(&lab, &["detach", &iface]),
        "second detach",
        &["not attached"],
    );

    drop(guard);
    remove_lab(lab);
}

/// Every bad value is refused with one line naming it, before anything is attached.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn bad_values_are_refused() {
    let lab = new_lab("cli-badval");
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    let cases: &[(&[&str], &[&str])] = &[
        (&["--rate", "10xbit", "--burst", "64k"], &["10xbit"]),
        (&["--rate", "0", "--burst", "64k"], &["'0'", "rate"]),
        // The CLI names the field and the minimum here, not the value asked for.
        (&["--rate", "5bit", "--burst", "64k"], &["rate", "8bit"]),
        (&["--rate", "8mbit", "--burst", "12q"], &["12q"]),
        // One full-size frame on a 1500-byte MTU is 1514 bytes.
        (&["--rate", "8mbit", "--burst", "1000"], &["1000", "1514"]),
        (
            &["--rate", "8mbit", "--burst", "64k", "--max-sources", "0"],
            &["--max-sources"],
        ),
        (
            &["--rate", "8mbit", "--burst", "64k", "--xdp-mode", "turbo"],
            &["turbo"],
        ),
        (
            &["--rate", "8mbit", "--burst", "64k", "--key", "port"],
            &["--key", "port"],
        ),
        (
            &["--rate", "8mbit", "--burst", "64k", "--prefix-v4", "33"],
            &["--prefix-v4", "33"],
        ),
        (
            &["--rate", "8mbit", "--burst", "64k", "--prefix-v6", "129"],
            &["--prefix-v6", "129"],
        ),
        (
            &["--rate", "8mbit", "--burst", "64k", "--new-sources", "0"],
            &["--new-sources", "'0'"],
        ),
        (
            &[
                "--rate",
                "8mbit",
                "--burst",
                "64k",
                "--new-sources-burst",
                "5",
            ],
            &["--new-sources"],
        ),
    ];
    for &(rest, needles) in cases {
        let what = format!("attach {}", rest.join(" "));
        assert_refused(&shaper(&lab, &attach_args(&iface, rest)), &what, needles);
        assert_untouched(&lab, &iface, &what);
    }
    drop(guard);
    remove_lab(lab);
}

/// A missing --rate is refused with one line naming it.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn missing_rate_is_named() {
    let lab = new_lab("cli-norate");
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    let what = "attach without --rate";
    assert_refused(
        &shaper(&lab, &["attach", &iface, "--burst", "64k"]),
        what,
        &["--rate"],
    );
    assert_untouched(&lab, &iface, what);
    drop(guard);
    remove_lab(lab);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn missing_interface_is_refused() {
    let lab = new_lab("cli-noif");
    let guard = guard(lab.rx_ns(), MISSING_IFACE);
    let what = "attach to a missing interface";
    assert_refused(
        &shaper(
            &lab,
            &["attach", MISSING_IFACE, "--rate", "8mbit", "--burst", "64k"],
        ),
        what,
        &[MISSING_IFACE],
    );
    assert_untouched(&lab, MISSING_IFACE, what);
    drop(guard);
    remove_lab(lab);
}

/// Without root (no capabilities at all) shaper says what it needs and touches nothing.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn unprivileged_is_refused() {
    let lab = new_lab("cli-noroot");
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    let binary = nobody_binary();
    let out = run(&mut binary.command(&[
        "-n",
        lab.rx_ns(),
        "attach",
        &iface,
        "--rate",
        "8mbit",
        "--burst",
        "64k",
    ]));
    let what = "attach as nobody";
    assert_refused(
        &out,
        what,
        &["root", "CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"],
    );
    assert_untouched(&lab, &iface, what);
    drop(binary);
    drop(guard);
    remove_lab(lab);
}

/// Runs the built shaper as root with only `caps` (e.g. `+bpf,+net_admin`: bounding,
/// inheritable and ambient sets) in the lab's receiving namespace, entered with nsenter
/// (`-n` would need CAP_SYS_ADMIN for setns), as the systemd unit runs it.
fn shaper_with_caps(lab: &Lab, caps: &str, args: &[&str]) -> Output {
    let all = format!("-all,{caps}");
    run(Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", lab.rx_ns()))
        .args(["setpriv", "--reuid", "0"])
        .args([
            format!("--bounding-set={all}"),
            format!("--inh-caps={all}"),
            format!("--ambient-caps={all}"),
        ])
        .arg(shaper_bin())
        .args(args))
}

/// The capabilities shaper.service grants (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN) are
/// enough to attach, change and detach; without CAP_PERFMON (which the verifier needs
/// to accept the program) shaper says so and touches nothing.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn the_units_capabilities_suffice() {
    let lab = new_lab("cli-caps");
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    let attach = attach_args(&iface, &["--rate", "8mbit", "--burst", "64k"]);
    let out = shaper_with_caps(&lab, "+bpf,+net_admin", &attach);
    let what = "attach without CAP_PERFMON";
    assert_refused(&out, what, &["(missing CAP_PERFMON)"]);
    assert_untouched(&lab, &iface, what);
    let unit = "+bpf,+perfmon,+net_admin";
    for args in [
        attach.clone(),
        attach_args(&iface, &["--rate", "4mbit", "--burst", "64k"]),
        vec!["status", &iface],
        vec!["detach", &iface],
    ] {
        let out = shaper_with_caps(&lab, unit, &args);
        assert!(
            out.status.success(),
            "{args:?} with {unit}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_untouched(&lab, &iface, "after detach");
    drop(guard);
    remove_lab(lab);
}

/// Without bpffs at /sys/fs/bpf (unmounted in a private mount namespace of the command
/// only) shaper says so and touches nothing.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn missing_bpffs_is_refused() {
    assert!(bpffs_mounted(), "/sys/fs/bpf must be bpffs to begin with");
    let lab = new_lab("cli-nobpffs");
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    // `$0` is the shaper binary and `$@` its arguments; the unmount stays inside the new,
    // private mount namespace.
    let out = run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"umount /sys/fs/bpf && exec "$0" "$@""#)
        .arg(shaper_bin())
        .args(["-n", lab.rx_ns()])
        .args(["attach", &iface, "--rate", "8mbit", "--burst", "64k"]));
    assert!(
        bpffs_mounted(),
        "the unmount reached this mount namespace: /sys/fs/bpf is no longer bpffs"
    );
    let what = "attach without bpffs";
    assert_refused(&out, what, &["bpffs", "/sys/fs/bpf"]);
    assert_untouched(&lab, &iface, what);
    drop(guard);
    remove_lab(lab);
}

/// --xdp-mode native on a driver without native XDP (dummy) is refused and leaves
/// nothing; --xdp-mode auto falls back to generic (skb) XDP there.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn native_refused_and_auto_falls_back_to_skb() {
    let lab = new_lab("cli-native");
    let netns = lab.rx_netns();
    add_no_xdp_iface(netns);
    let guard = guard(lab.rx_ns(), DUMMY_IFACE);

    let what = "attach --xdp-mode native without driver support";
    assert_refused(
        &shaper(
            &lab,
            &[
                "attach",
                DUMMY_IFACE,
                "--rate",
                "8mbit",
                "--burst",
                "64k",
                "--xdp-mode",
                "native",
            ],
        ),
        what,
        &["native", DUMMY_IFACE],
    );
    assert_untouched(&lab, DUMMY_IFACE, what);

    ok(
        &lab,
        &[
            "attach",
            DUMMY_IFACE,
            "--rate",
            "8mbit",
            "--burst",
            "64k",
            "--xdp-mode",
            "auto",
        ],
    );
    assert!(
        xdp_on(netns, DUMMY_IFACE),
        "no XDP program on {DUMMY_IFACE}"
    );
    assert_policy(&lab, DUMMY_IFACE, 8_000_000, 65_536, "skb");
    ok(&lab, &["detach", DUMMY_IFACE]);
    assert_untouched(
        &lab,
        DUMMY_IFACE,
        "after detaching from the interface without native XDP",
    );

    drop(guard);
    remove_lab(lab);
}

/// A re-attach that is refused changes nothing: the program, the policy and the map stay
/// as they were.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn refused_reattach_changes_nothing() {
    let lab = new_lab("cli-keep");
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    ok(
        &lab,
        &["attach", &iface, "--rate", "8mbit", "--burst", "64k"],
    );
    assert_policy(&lab, &iface, 8_000_000, 65_536, "native");

    // The conflicting ones also ask for a new rate and burst, so that an update made
    // before the conflict is noticed would show in status.
    let cases: &[(&[&str], &[&str])] = &[
        (&["--rate", "10xbit", "--burst", "64k"], &["10xbit"]),
        (&["--rate", "5bit", "--burst", "32k"], &["rate", "8bit"]),
        (&["--rate", "4mbit", "--burst", "1000"], &["1000", "1514"]),
        (
            &["--rate", "4mbit", "--burst", "32k", "--max-sources", "1000"],
            &["--max-sources", "1000"],
        ),
        (
            &["--rate", "4mbit", "--burst", "32k", "--xdp-mode", "skb"],
            &["skb", "native"],
        ),
        // Cells keyed one way mean nothing keyed another: re-keying needs a detach.
        (
            &["--rate", "4mbit", "--burst", "32k", "--key", "dst"],
            &["--key dst", "src", "detach"],
        ),
        (
            &["--rate", "4mbit", "--burst", "32k", "--prefix-v4", "24"],
            &["--prefix-v4 24", "/32", "detach"],
        ),
        (
            &["--rate", "4mbit", "--burst", "32k", "--prefix-v6", "48"],
            &["--prefix-v6 48", "/64", "detach"],
        ),
    ];
    for &(rest, needles) in cases {
        let what = format!("re-attach {}", rest.join(" "));
        assert_refused(&shaper(&lab, &attach_args(&iface, rest)), &what, needles);
        assert!(
            lab.xdp_attached().expect("ip link show"),
            "{what}: the program is gone"
        );
        assert_policy(&lab, &iface, 8_000_000, 65_536, "native");
        assert_keys(&lab, &iface, "src", 32, 64);
        let row = status(&lab, &iface);
        assert_eq!(u64_field(&row, "max_sources"), DEFAULT_MAX_SOURCES, "{row}");
        assert!(
            pin_dir(&lab, &iface).join("link").exists(),
            "{what}: unpinned"
        );
    }

    ok(&lab, &["detach", &iface]);
    assert_untouched(&lab, &iface, "after detach");
    drop(guard);
    remove_lab(lab);
}

/// Keyed by source /24: the lab's senders share one bucket, `stats` lists the network, and
/// re-attaching with the same keys (said again or left out) updates the rate in place.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn prefix_keys_aggregate_and_show_as_networks() {
    let lab = Lab::new("cli-prefix", 2).unwrap_or_else(|e| panic!("cannot create lab: {e:#}"));
    let iface = lab.rx_iface().to_owned();
    let guard = guard(lab.rx_ns(), &iface);
    let keys = ["--key", "src", "--prefix-v4", "24", "--prefix-v6", "56"];
    let mut args = vec!["attach", &iface, "--rate", "8mbit", "--burst", "64k"];
    args.extend(keys);
    let out = ok(&lab, &args);
    assert!(out.contains("/24"), "attach output: {out}");
    assert_keys(&lab, &iface, "src", 24, 56);

    let flows: Vec<Flow> = lab
        .sources()
        .iter()
        .map(|&src| Flow {
            src: src.into(),
            offered_bps: 2_000_000,
            frame_bytes: 1000,
        })
        .collect();
    let results = run_udp(&lab, &flows, Duration::from_millis(500));
    // Both senders are in 198.18.0.0/24: one cell holds what they sent, under its limit.
    let net = stats(lab.rx_ns(), &iface).key("198.18.0.0/24");
    let received: u64 = results.iter().map(|r| r.received_l2_bytes).sum();
    let sent: u64 = results.iter().map(|r| r.sent_l2_bytes).sum();
    eprintln!("198.18.0.0/24: {net:?}; sent {sent}, received {received} bytes");
    assert_eq!(
        (net.passed_bytes, net.dropped_packets),
        (sent, 0),
        "{net:?}"
    );
    assert_eq!(received, sent);
    let row = status(&lab, &iface);
    assert_eq!(u64_field(&row, "ipv4_sources_tracked"), 1, "{row}");

    // The same keys again, or none: an in-place update.
    let mut again = vec!["attach", &iface, "--rate", "4mbit", "--burst", "64k"];
    again.extend(keys);
    assert!(ok(&lab, &again).contains("updated"));
    assert!(
        ok(
            &lab,
            &["attach", &iface, "--rate", "2mbit", "--burst", "64k"]
        )
        .contains("updated")
    );
    assert_keys(&lab, &iface, "src", 24, 56);
    assert_policy(&lab, &iface, 2_000_000, 65_536, "native");

    ok(&lab, &["detach", &iface]);
    assert_untouched(&lab, &iface, "after detach");
    drop(guard);
    remove_lab(lab);
}

// ---------------------------------------------------------------------------------------
// Files and pins only root can touch

/// `setpriv` to nobody (no groups, no capabilities) running `sh -c SCRIPT`, optionally
/// in the mount namespace of `mounts` (entered as root, before dropping privileges).
fn as_nobody(mounts: Option<&PrivateMounts>, script: &str) -> Output {
    let mut cmd = match mounts {
        Some(m) => m.command("setpriv"),
        None => Command::new("setpriv"),
    };
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
        "sh",
        "-c",
        script,
    ]);
    run(&mut cmd)
}

/// Asserts that nobody's `script` failed.
fn nobody_cannot(mounts: Option<&PrivateMounts>, script: &str) {
    let out = as_nobody(mounts, script);
    assert!(
        !out.status.success(),
        "nobody could: {script} ({})",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The lock files and the journal are root's, 0600, even where an earlier build left
/// them 0644 (or a root shell's umask would): nobody cannot open a lock to hold it, nor
/// read what a change is to put back. In a /run of the test's own (the named namespaces
/// carried over), so that no other shaper on the host takes or rolls back these.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn locks_and_journal_only_root_can_open() {
    const LOCK: &str = "/run/shaper.lock";
    const RUN_LOCK: &str = "/run/shaper.run.lock";
    const JOURNAL: &str = "/run/shaper.journal";
    let lab = new_lab("cli-lock");
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let guard = guard(&ns, &iface);
    let run = PrivateMounts::new(PRIVATE_RUN);
    // As an earlier build left them.
    run.sh(&format!(
        "umask 0 && : > {LOCK} && : > {RUN_LOCK} && : > {JOURNAL}.tmp \\
         && chmod 644 {LOCK} {RUN_LOCK} && chmod 666 {JOURNAL}.tmp"
    ));
    // The daemon takes its lock first; this one stops at the missing file.
    let _ = run.shaper(&[
        "-n",
        &ns,
        "run",
        "--no-metrics",
        "-f",
        "/nonexistent/shaper.toml",
    ]);
    // Killed once the journal is written: it stays for the next command.
    let shaper = shaper_bin().to_str().expect("a UTF-8 path").to_owned();
    let out = run
        .command(&shaper)
        .args([
            "-n", &ns, "attach", &iface, "--rate", "8mbit", "--burst", "64k",
        ])
        .env("SHAPER_TEST_CRASH_AT", "journal-written")
        .output()
        .unwrap();
    assert!(!out.status.success(), "not killed: {out:?}");
    for path in [LOCK, RUN_LOCK, JOURNAL] {
        assert_eq!(run.mode_and_owner(path), "600 0", "{path}");
        nobody_cannot(Some(&run), &format!(": < {path}"));
    }
    // The next command rolls the killed one back (and removes the journal); this one
    // then says the interface is not attached (as it was before).
    let out = run.shaper(&["-n", &ns, "status", &iface]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rolled back") && stderr.contains("not attached"),
        "{stderr}"
    );
    assert_eq!(run.sh(&format!("ls {JOURNAL}* 2>/dev/null || true")), "");
    assert_untouched(&lab, &iface, "after the rollback");
    drop(run);
    drop(guard);
    remove_lab(lab);
}

/// A configuration file others can write, or that is not a regular file (a FIFO, which
/// hung the daemon), is refused in one line naming it, by `apply`, `apply --check` and
/// `run`; `watch --duration` past a year too (it panicked).
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn untrusted_files_and_endless_durations_are_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let lab = new_lab("cli-file");
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    let guard = guard(&ns, &iface);
    let text = format!("[[interface]]\nname = \"{iface}\"\nrate = \"8mbit\"\nburst = \"64k\"\n");
    let file = TempFile::new("cli-file", &text);
    fs::set_permissions(&file.0, fs::Permissions::from_mode(0o666)).unwrap();
    let fifo = std::env::temp_dir().join(format!("shaper-test-fifo-{}", std::process::id()));
    let _ = fs::remove_file(&fifo);
    assert!(run(Command::new("mkfifo").arg(&fifo)).status.success());
    let fifo = fifo.to_str().unwrap().to_owned();
    // Its own /run: a daemon another test runs on this host holds the host's run lock.
    let mounts = PrivateMounts::new(PRIVATE_RUN);
    for (path, needle) in [
        (file.path(), "writable by group or others (mode 0666"),
        (&fifo, "not a regular file (a FIFO)"),
    ] {
        for args in [
            vec!["apply", "-f", path],
            vec!["apply", "--check", "-f", path],
            vec!["run", "--no-metrics", "--no-watch", "-f", path],
        ] {
            // Bounded: a FIFO opened to read waits for a writer that never comes.
            let out = run(mounts
                .command("timeout")
                .arg("20")
                .arg(shaper_bin())
                .args(["-n", &ns])
                .args(&args));
            assert_ne!(out.status.code(), Some(124), "{args:?} hung");
            assert_refused(&out, &format!("{args:?}"), &[path, needle]);
        }
    }
    fs::remove_file(&fifo).unwrap();
    drop(mounts);
    assert_untouched(&lab, &iface, "after the refused files");
    // The same file, its owner's alone to write: applied.
    fs::set_permissions(&file.0, fs::Permissions::from_mode(0o644)).unwrap();
    ok(&lab, &["apply", "-f", file.path()]);

    // On an attachment, where the deadline was computed (and overflowed).
    let out = shaper(&lab, &["watch", &iface, "--duration", "1e19"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_refused(
        &out,
        "watch --duration 1e19",
        &["1e19", "longer than a year"],
    );
    ok(&lab, &["detach", &iface]);
    drop(guard);
    remove_lab(lab);
}

/// A private mount namespace, set up by a shell script (`mount -t bpf ...`), held by a
/// `sleep` this test starts and kills: commands run in it through `nsenter`, so what the
/// script mounts over (the host's bpffs, its /run) is never touched. Killing the holder
/// frees what was mounted (a bpffs, and every pin in it: the programs linked through them
/// are detached).
struct PrivateMounts(std::process::Child);

/// A bpffs of its own at /sys/fs/bpf, mounted 1777: the kernel's default, which lets any
/// user make entries at its root.
const PRIVATE_BPFFS: &str = "mount -t bpf -o mode=1777 bpf /sys/fs/bpf";

/// An empty /run of its own (the lock files, the journal), the named network namespaces
/// carried over into it.
const PRIVATE_RUN: &str = "d=$(mktemp -d) && mount --rbind /run/netns $d \\
    && mount -t tmpfs -o mode=0755 tmpfs /run && mkdir /run/netns \\
    && mount --move $d /run/netns && rmdir $d";

impl PrivateMounts {
    fn new(setup: &str) -> Self {
        use std::io::BufRead as _;
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!("{setup} && echo ready && exec sleep 600"))
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read unshare's output");
        let me = Self(child);
        assert_eq!(line.trim(), "ready", "cannot set up the mounts: {setup}");
        me
    }

    /// `program` in the private mount namespace.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.0.id()))
            .args(["--mount", "--"])
            .arg(program)
            .stdin(std::process::Stdio::null());
        cmd
    }

    /// `shaper ARGS...` (as root) in the private mount namespace.
    fn shaper(&self, args: &[&str]) -> Output {
        let mut cmd = self.command(shaper_bin().to_str().expect("a UTF-8 path"));
        run(cmd.args(args))
    }

    /// The permission bits (octal) and owner of `path` there, not following a symlink:
    /// `700 0`.
    fn mode_and_owner(&self, path: &str) -> String {
        self.sh(&format!("stat -c '%a %u' {path}"))
            .trim()
            .to_owned()
    }

    /// `sh -c SCRIPT` as root in the private mount namespace, which must succeed.
    fn sh(&self, script: &str) -> String {
        let out = run(self.command("sh").args(["-c", script]));
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PrivateMounts {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// On a bpffs any user may write at its root (mounted 1777, as by default): a pin root
/// nobody made first is refused; the one shaper makes is root's, 0700, and stays after
/// the last detach; nobody can make, remove or rename anything in it; a symlinked or
/// nobody-owned pin directory and `detach ..` are refused in one line, touching nothing.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn pins_only_root_can_touch() {
    let lab = new_lab("cli-pins");
    let (ns, iface) = (lab.rx_ns().to_owned(), lab.rx_iface().to_owned());
    add_no_xdp_iface(lab.rx_netns());
    let bpffs = PrivateMounts::new(PRIVATE_BPFFS);
    let attach = |name: &str| {
        bpffs.shaper(&[
            "-n", &ns, "attach", name, "--rate", "8mbit", "--burst", "64k",
        ])
    };
    let root = PIN_ROOT;
    let ns_dir = format!("{root}/netns/{ns}");
    let pins = format!("{ns_dir}/{iface}");

    // Made first by nobody, which a 1777 bpffs lets anyone do: refused, nothing attached.
    let out = as_nobody(Some(&bpffs), &format!("mkdir {root}"));
    assert!(out.status.success(), "nobody cannot mkdir on a 1777 bpffs");
    let what = "attach under a pin root nobody made";
    assert_refused(&attach(&iface), what, &[root, "owned by uid 65534"]);
    assert!(!lab.xdp_attached().unwrap(), "{what}: attached");
    bpffs.sh(&format!("rmdir {root}"));

    // Made by shaper: root's, 0700, every directory down to the pins.
    let out = attach(&iface);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for dir in [root, &format!("{root}/netns"), &ns_dir, &pins] {
        assert_eq!(bpffs.mode_and_owner(dir), "700 0", "{dir}");
    }
    nobody_cannot(Some(&bpffs), &format!("mkdir {root}/x"));
    nobody_cannot(Some(&bpffs), &format!("ls {root}"));
    nobody_cannot(Some(&bpffs), &format!("rm -f {pins}/link"));
    nobody_cannot(Some(&bpffs), &format!("mv {root} /sys/fs/bpf/moved"));
    nobody_cannot(Some(&bpffs), &format!("rm -rf {root}"));
    assert!(bpffs.sh(&format!("ls {pins}")).contains("link"));
    assert!(lab.xdp_attached().unwrap());

    // A pin directory that is a symlink to another attachment's: detach refuses, and
    // the other stays attached with its pins.
    let out = attach(DUMMY_IFACE);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bpffs.sh(&format!("ln -s {ns_dir}/{DUMMY_IFACE} {ns_dir}/shsym0"));
    let what = "detach through a symlinked pin directory";
    let out = bpffs.shaper(&["-n", &ns, "detach", "shsym0"]);
    assert_refused(&out, what, &[&format!("{ns_dir}/shsym0"), "symbolic link"]);
    assert!(
        xdp_on(lab.rx_netns(), DUMMY_IFACE),
        "{what}: detached the other"
    );
    assert!(
        bpffs
            .sh(&format!("ls {ns_dir}/{DUMMY_IFACE}"))
            .contains("link")
    );
    bpffs.sh(&format!("rm {ns_dir}/shsym0"));

    // A pin directory nobody owns: refused for a change and for detach, nothing changed.
    bpffs.sh(&format!("chown 65534 {ns_dir}/{DUMMY_IFACE}"));
    for args in [
        vec!["attach", DUMMY_IFACE, "--rate", "1mbit", "--burst", "64k"],
        vec!["detach", DUMMY_IFACE],
    ] {
        let mut all = vec!["-n", ns.as_str()];
        all.extend_from_slice(&args);
        let what = format!("{args:?} on a pin directory nobody owns");
        assert_refused(
            &bpffs.shaper(&all),
            &what,
            &[DUMMY_IFACE, "owned by uid 65534"],
        );
        assert!(xdp_on(lab.rx_netns(), DUMMY_IFACE), "{what}: detached");
    }
    bpffs.sh(&format!("chown 0 {ns_dir}/{DUMMY_IFACE}"));

    // Names that are not names never become paths.
    let top = bpffs.sh("ls -A /sys/fs/bpf");
    for (args, needle) in [
        (vec!["detach", ".."], "invalid interface name '..'"),
        (
            vec!["-n", &ns, "detach", ".."],
            "invalid interface name '..'",
        ),
        (
            vec!["-n", "..", "detach", &iface],
            "invalid network namespace name '..'",
        ),
        (vec!["detach", "netns"], "'netns'"),
        (vec!["detach", "a:new"], "invalid interface name 'a:new'"),
    ] {
        assert_refused(&bpffs.shaper(&args), &format!("{args:?}"), &[needle]);
    }
    assert_eq!(bpffs.sh("ls -A /sys/fs/bpf"), top);

    // The last detach keeps the pin root (else nobody could make it again), still 0700.
    for name in [iface.as_str(), DUMMY_IFACE] {
        let out = bpffs.shaper(&["-n", &ns, "detach", name]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(bpffs.sh(&format!("ls -A {root}")), "");
    assert_eq!(bpffs.mode_and_owner(root), "700 0");
    nobody_cannot(Some(&bpffs), &format!("mkdir {root}/netns"));
    drop(bpffs);
    remove_lab(lab);
}
