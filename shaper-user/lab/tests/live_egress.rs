//! The tc program: egress (and ingress on tc) in the namespace lab, through the real
//! `shaper` binary. Rates per destination and per source on egress; a TSO send charged
//! its wire bytes, the same on tc egress, tc ingress and XDP; TCX and clsact, with the
//! qdiscs left as they were found.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    net::{IpAddr, Ipv6Addr},
    process::Command,
    time::Duration,
};

use common::{assert_limited, attach_toward, replay, shaper, shaper_ok, stats_toward};
use shaper_lab::lab::{Lab, LabOptions, RunOptions, run_udp_with, tcp::send_tcp_to};
use shaper_user::tc::has_tcx;

const EGRESS: &str = "egress";
const INGRESS: &str = "ingress";

/// `tc -n NS qdisc show dev IFACE`.
fn qdiscs(ns: &str, iface: &str) -> String {
    let out = Command::new("tc")
        .args(["-n", ns, "qdisc", "show", "dev", iface])
        .output()
        .expect("run tc");
    assert!(out.status.success(), "tc qdisc show failed");
    String::from_utf8(out.stdout).expect("tc's output is UTF-8")
}

fn tc(ns: &str, args: &[&str]) {
    let out = Command::new("tc")
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("run tc");
    assert!(
        out.status.success(),
        "tc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The attach mode `status -j` shows for one direction of `iface`.
fn attached_mode(ns: &str, iface: &str, direction: &str) -> String {
    let out = shaper_ok(ns, &["--direction", direction, "-j", "status", iface]);
    let rows: serde_json::Value = serde_json::from_str(&out).expect("status -j is JSON");
    rows[0]["xdp_mode"].as_str().expect("xdp_mode").to_owned()
}

#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn egress_holds_each_destination_and_each_source_to_the_rate() {
    const RATE_BPS: u64 = 8_000_000;
    const BURST: u64 = 65_536;
    const FRAME: u32 = 1_000;
    let lab = Lab::new("egress", 4).unwrap();
    let (ns, iface) = (lab.tx_ns(), lab.tx_iface());
    let offered = [5 * RATE_BPS, 5 * RATE_BPS, 5 * RATE_BPS, RATE_BPS / 2];
    let flows = lab.flows(&offered, FRAME);
    // Every send's time kept: the tc program meters each frame in its sender's own send.
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let run = || run_udp_with(&lab, &flows, Duration::from_secs(5), &options);

    // By destination (egress's default): every flow goes to the one receiver, which gets
    // the rate, all senders together.
    let attached = attach_toward(ns, iface, EGRESS, "8mbit", "64k", &[]);
    let report = run().unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    let received: u64 = report.flows.iter().map(|r| r.received_l2_bytes).sum();
    // One key: the destination, every flow's frames through one bucket.
    let all: Vec<_> = report.flows.iter().collect();
    let replayed: u64 = replay(&all, None, Some((RATE_BPS, BURST))).iter().sum();
    assert_limited(
        &format!("{} received (by destination)", lab.rx_addr()),
        received,
        replayed,
        (RATE_BPS, BURST),
        &all,
    );
    let st = stats_toward(ns, iface, EGRESS);
    assert_eq!(st.key(lab.rx_addr()).passed_bytes, received);
    attached.detach().unwrap();

    // By source: each sender gets the rate; the one below it loses nothing.
    let _attached = attach_toward(ns, iface, EGRESS, "8mbit", "64k", &["--key", "src"]);
    let report = run().unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    let st = stats_toward(ns, iface, EGRESS);
    for r in &report.flows[..3] {
        let replayed = replay(&[r], Some((RATE_BPS, BURST)), None)[0];
        assert_limited(
            &format!("{} received (by source)", r.src),
            r.received_l2_bytes,
            replayed,
            (RATE_BPS, BURST),
            &[r],
        );
        assert!(r.sent_l2_bytes > 4 * replayed);
        assert_eq!(st.key(r.src).passed_bytes, r.received_l2_bytes, "{}", r.src);
    }
    // The one below the limit loses nothing (unless its sender, held up by a loaded
    // machine, caught up in one clump larger than the burst: then what the limit passes
    // of its sends, within a frame).
    let quiet = &report.flows[3];
    assert!(quiet.sent_packets > 0);
    let replayed = replay(&[quiet], Some((RATE_BPS, BURST)), None)[0];
    assert!(
        quiet.received_l2_bytes.abs_diff(replayed) <= u64::from(FRAME) + 100,
        "a source below the limit received {} bytes, the limit passes {replayed} of its sends",
        quiet.received_l2_bytes
    );
}

/// The stats key of `addr`: the address, or an IPv6 address's /64.
fn key_of(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("{}/64", Ipv6Addr::from(u128::from(a) & !0 << 64)),
    }
}

/// One hook: a namespace, its interface and the direction attached there.
type Hook<'a> = (&'a str, &'a str, &'a str);

/// What `hook` has passed to the key of `addr` so far, in packets and bytes (nothing if
/// the key is not tracked yet), with nothing dropped.
fn passed(hook: Hook, addr: IpAddr) -> (u64, u64) {
    let (ns, iface, direction) = hook;
    let key = key_of(addr);
    let c = stats_toward(ns, iface, direction)
        .get(&key)
        .unwrap_or_default();
    assert_eq!(c.dropped_packets, 0, "{direction} {key}: dropped");
    (c.passed_packets, c.passed_bytes)
}

/// Frames the link lost between the hooks so far: the sender's veth drops what it cannot
/// hand on (its peer's ring or the backlog full, on a loaded machine), the receiver's what
/// it cannot take.
fn link_drops(tx: Hook, rx: Hook) -> u64 {
    let dropped = |(ns, iface, _): Hook, dir: &str| {
        let out = Command::new("ip")
            .args(["-n", ns, "-s", "-j", "link", "show", "dev", iface])
            .output()
            .expect("run ip");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j is JSON");
        v[0]["stats64"][dir]["dropped"]
            .as_u64()
            .expect("ip -s -j shows stats64 dropped")
    };
    dropped(tx, "tx") + dropped(rx, "rx")
}

/// Sends 4 MiB over TCP to `dst` and returns what `tx` charged `dst` and what `rx` charged
/// the sender for that send, in packets and bytes. A send in which the link dropped a frame
/// is made again, up to three sends: a dropped frame was charged on egress and never
/// arrived, and TCP sent its bytes again, so that send cannot compare the hooks.
fn charged_send(lab: &Lab, tx: Hook, rx: Hook, dst: IpAddr) -> ((u64, u64), (u64, u64)) {
    const BYTES: usize = 4 << 20;
    let delta = |after: (u64, u64), before: (u64, u64)| (after.0 - before.0, after.1 - before.1);
    let mut src = None;
    for send in 1..=3 {
        let e_before = passed(tx, dst);
        let r_before = src.map_or((0, 0), |src| passed(rx, src));
        let drops = link_drops(tx, rx);
        let from = send_tcp_to(lab, dst, BYTES).unwrap();
        let dropped = link_drops(tx, rx) - drops;
        let e = delta(passed(tx, dst), e_before);
        // The first send's source is known once it is made; nothing came from it before.
        let r = delta(passed(rx, from), r_before);
        src = Some(from);
        println!(
            "send {send}: {} charged {} B in {} packets, {} charged {} B in {} packets; \
             the link dropped {dropped} frames",
            tx.2, e.1, e.0, rx.2, r.1, r.0
        );
        if dropped == 0 {
            return (e, r);
        }
    }
    panic!("the link dropped frames in each of three sends: the hooks cannot be compared");
}

/// 4 MiB over TCP: the sender builds GSO packets (veth has TSO) that tc egress sees whole
/// and XDP on the peer sees as the frames they are cut into. The bytes charged must be the
/// same: a GSO packet costs its wire bytes (charging `len` alone would fall short by the
/// headers of every segment but the first, about 4% here).
#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn a_tso_send_is_charged_its_wire_bytes_on_every_hook() {
    tso_send(false);
}

/// The same over IPv6 (TSO6; a test of its own, which the kernel matrix's guests skip).
#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn an_ipv6_tso_send_is_charged_its_wire_bytes_on_every_hook() {
    tso_send(true);
}

fn tso_send(ipv6: bool) {
    let options = LabOptions {
        ipv6,
        ..LabOptions::default()
    };
    let lab = Lab::with("gso", 1, options).unwrap();
    let tx = (lab.tx_ns(), lab.tx_iface(), EGRESS);
    let rx = (lab.rx_ns(), lab.rx_iface(), INGRESS);
    let dst = match lab.rx_addr6() {
        Some(a) => IpAddr::V6(a),
        None => IpAddr::V4(lab.rx_addr()),
    };
    let (rate, burst) = ("10gbit", "16m");

    // tc egress on the sender, XDP on the receiver.
    let egress = attach_toward(tx.0, tx.1, EGRESS, rate, burst, &[]);
    let xdp = attach_toward(rx.0, rx.1, INGRESS, rate, burst, &[]);
    let ((e_packets, e_bytes), (x_packets, x_bytes)) = charged_send(&lab, tx, rx, dst);
    assert!(
        e_packets * 4 < x_packets,
        "the sender sent no GSO packets ({e_packets} packets, {x_packets} frames on the wire)"
    );
    assert_eq!(e_bytes, x_bytes, "tc egress and XDP charged other bytes");
    xdp.detach().unwrap();
    egress.detach().unwrap();

    // tc egress (clsact) on the sender, tc ingress on the receiver: the receiver gets the
    // GSO packets whole (veth passes them on), and charges them from the Ethernet header.
    let _egress = attach_toward(tx.0, tx.1, EGRESS, rate, burst, &["--tc-mode", "clsact"]);
    let _ingress = attach_toward(rx.0, rx.1, INGRESS, rate, burst, &["--hook", "tc"]);
    let ((_, e_bytes), (_, i_bytes)) = charged_send(&lab, tx, rx, dst);
    assert_eq!(
        e_bytes, i_bytes,
        "tc egress and tc ingress charged other bytes"
    );
}

#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn clsact_is_added_only_if_absent_and_removed_only_if_shaper_added_it() {
    let lab = Lab::new("clsact", 1).unwrap();
    let (ns, iface) = (lab.tx_ns(), lab.tx_iface());
    let before = qdiscs(ns, iface);
    assert!(!before.contains("clsact"), "{before}");

    // Added by the first clsact attachment, kept while another uses it, removed with the last.
    let egress = attach_toward(ns, iface, EGRESS, "8mbit", "64k", &["--tc-mode", "clsact"]);
    assert!(qdiscs(ns, iface).contains("clsact"));
    let hook = ["--hook", "tc", "--tc-mode", "clsact"];
    let ingress = attach_toward(ns, iface, INGRESS, "8mbit", "64k", &hook);
    assert_eq!(attached_mode(ns, iface, EGRESS), "clsact");
    assert_eq!(attached_mode(ns, iface, INGRESS), "clsact");
    egress.detach().unwrap();
    assert!(
        qdiscs(ns, iface).contains("clsact"),
        "removed under ingress"
    );
    ingress.detach().unwrap();
    assert_eq!(qdiscs(ns, iface), before);

    // One that was there stays, with the operator's own filters.
    tc(ns, &["qdisc", "add", "dev", iface, "clsact"]);
    let with_clsact = qdiscs(ns, iface);
    let egress = attach_toward(ns, iface, EGRESS, "8mbit", "64k", &["--tc-mode", "clsact"]);
    egress.detach().unwrap();
    assert_eq!(qdiscs(ns, iface), with_clsact);
    tc(ns, &["qdisc", "del", "dev", iface, "clsact"]);
}

#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn tcx_where_the_kernel_has_it() {
    let lab = Lab::new("tcx", 1).unwrap();
    let (ns, iface) = (lab.tx_ns(), lab.tx_iface());
    let before = qdiscs(ns, iface);
    if has_tcx() {
        let egress = attach_toward(ns, iface, EGRESS, "8mbit", "64k", &[]);
        assert_eq!(attached_mode(ns, iface, EGRESS), "tcx");
        assert_eq!(qdiscs(ns, iface), before, "TCX added a qdisc");
        egress.detach().unwrap();
    } else {
        let egress = attach_toward(ns, iface, EGRESS, "8mbit", "64k", &[]);
        assert_eq!(attached_mode(ns, iface, EGRESS), "clsact");
        egress.detach().unwrap();
        let args = [
            "--direction",
            EGRESS,
            "attach",
            iface,
            "--rate",
            "8mbit",
            "--burst",
            "64k",
            "--tc-mode",
            "tcx",
        ];
        let out = shaper(ns, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("--tc-mode tcx"), "{err}");
    }
    assert_eq!(qdiscs(ns, iface), before);
}

#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn egress_has_its_own_settings_and_round_trips_through_apply() {
    let lab = Lab::new("egcfg", 1).unwrap();
    let (ns, iface) = (lab.tx_ns(), lab.tx_iface());
    let _ingress = attach_toward(ns, iface, INGRESS, "4mbit", "64k", &[]);
    let _egress = attach_toward(ns, iface, EGRESS, "8mbit", "128k", &[]);
    let egress_file = shaper_ok(ns, &["--direction", EGRESS, "config", "show", iface]);
    let ingress_file = shaper_ok(ns, &["config", "show", iface]);
    assert!(
        egress_file.contains("direction = \"egress\""),
        "{egress_file}"
    );
    assert!(egress_file.contains("key = \"dst\""), "{egress_file}");
    assert!(egress_file.contains("rate = \"8mbit\""), "{egress_file}");
    assert!(!ingress_file.contains("direction"), "{ingress_file}");
    assert!(ingress_file.contains("rate = \"4mbit\""), "{ingress_file}");
    let dir = std::env::temp_dir().join(format!("shaper-egress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("egress.toml");
    std::fs::write(&file, &egress_file).unwrap();
    let applied = shaper_ok(ns, &["apply", "-f", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        applied.trim(),
        format!("{iface} egress: unchanged, 0 policies")
    );

    // XDP has no egress: refused in one line, nothing attached.
    let (rx, rx_if) = (lab.rx_ns(), lab.rx_iface());
    let out = shaper(
        rx,
        &[
            "--direction",
            EGRESS,
            "attach",
            rx_if,
            "--rate",
            "8mbit",
            "--burst",
            "64k",
            "--hook",
            "xdp",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        err.trim(),
        "shaper: --hook xdp: XDP sees received frames only; egress needs tc"
    );
    let status = shaper(rx, &["--direction", EGRESS, "status", rx_if]);
    assert!(!status.status.success(), "attached after a refusal");
}

/// Shape mode is refused in one line, leaving nothing attached: without sch_fq on the
/// device (this machine's kernel has none; a veth's root qdisc is noqueue anyway), and
/// on ingress.
#[test]
#[ignore = "needs root: loads tc programs and creates network namespaces (cargo xtask test)"]
fn attach_refuses_shape_without_fq_in_one_line() {
    let lab = Lab::new("shape-nofq", 1).unwrap();
    let (ns, iface) = (lab.tx_ns(), lab.tx_iface());
    let refused = |args: &[&str]| {
        let out = shaper(ns, args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} was not refused");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "not one line: {stderr}"
        );
        // Nothing attached in either direction (`status` of the interface, not of every
        // attachment: other tests' may be there).
        for direction in [EGRESS, INGRESS] {
            let out = shaper(ns, &["--direction", direction, "status", iface]);
            let e = String::from_utf8_lossy(&out.stderr);
            assert!(e.contains("not attached"), "{direction}: {e}");
        }
        stderr
    };
    // A veth's root qdisc is noqueue: the error says how to put fq there.
    let e = refused(&[
        "--direction",
        EGRESS,
        "attach",
        iface,
        "--rate",
        "4mbit",
        "--burst",
        "32k",
        "--mode",
        "shape",
    ]);
    assert!(
        e.contains(&format!("tc -n {ns} qdisc replace dev {iface} root fq")),
        "{e}"
    );
    // Ingress (XDP or tc) cannot shape.
    for hook in ["xdp", "tc"] {
        let e = refused(&[
            "attach", iface, "--rate", "4mbit", "--burst", "32k", "--mode", "shape", "--hook", hook,
        ]);
        assert!(e.contains("--direction egress"), "{e}");
    }

    // A subscriber's plan in shape mode, likewise: on ingress (XDP), and on egress without
    // fq; and a shaping plan with a limit of each address's, a packet rate with an excess
    // rate. Each in one line naming the value, nothing set.
    for direction in [INGRESS, EGRESS] {
        let out = shaper(
            ns,
            &[
                "--direction",
                direction,
                "attach",
                iface,
                "--rate",
                "4mbit",
                "--burst",
                "32k",
                "--max-subscribers",
                "4",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let set = |direction: &str, plan: &[&str]| {
        let mut args = vec![
            "--direction",
            direction,
            "subscriber",
            "set",
            iface,
            "c1",
            "--prefix",
            "10.0.0.1",
            "--prefix",
            "fd00:1::/56",
            "--rate",
            "4mbit",
            "--burst",
            "32k",
        ];
        args.extend_from_slice(plan);
        let out = shaper(ns, &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} was not refused");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "not one line: {stderr}"
        );
        let listed = shaper(ns, &["--direction", direction, "subscriber", "list", iface]);
        assert_eq!(
            String::from_utf8_lossy(&listed.stdout),
            "",
            "{args:?}: set after all"
        );
        stderr
    };
    let e = set(INGRESS, &["--mode", "shape"]);
    assert!(e.contains("--direction egress"), "{e}");
    let e = set(EGRESS, &["--mode", "shape"]);
    assert!(
        e.contains(&format!("qdisc replace dev {iface} root fq")),
        "{e}"
    );
    let e = set(
        EGRESS,
        &[
            "--mode",
            "shape",
            "--per-address-rate",
            "1mbit",
            "--per-address-burst",
            "16k",
        ],
    );
    assert!(e.contains("mode shape takes no per-address limit"), "{e}");
    let e = set(
        INGRESS,
        &[
            "--packet-rate",
            "2000",
            "--packet-burst",
            "200",
            "--excess-rate",
            "1mbit",
            "--excess-burst",
            "16k",
        ],
    );
    assert!(e.contains("packet rate 2000 with an excess rate"), "{e}");
    for direction in [INGRESS, EGRESS] {
        let out = shaper(ns, &["--direction", direction, "detach", iface]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
