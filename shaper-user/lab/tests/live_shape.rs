//! Shape mode (EDT on tc egress, held back by sch_fq) with real TCP: iperf3 through the
//! routed lab, held on the router's egress towards the receiver (a router holding a
//! customer's download), shaped against policed at the same rate, with and without ECN;
//! (attach's refusal where sch_fq does not hold the device's packets is in
//! live_egress.rs, which runs on this machine too.)
//!
//! Routed, because a drop on the sender's own egress is no loss to TCP: the stack sees
//! the packet refused and sends it again later, without counting a retransmission (it
//! shows only as lost throughput).
//!
//! This machine's kernel has no sch_fq, so the TCP tests run in the kernel matrix's
//! guests only (`cargo xtask test --kernel 6.12 -- live_shape`), where it is a module; the
//! rate is one the emulated guest carries easily.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use common::{attach_toward, shaper_ok};
use shaper_lab::lab::Lab;

const EGRESS: &str = "egress";
/// What the flows are held to: a rate the emulated guest carries with room to spare.
const RATE_BPS: f64 = 4_000_000.0;
const RATE: &str = "4mbit";
const BURST: &str = "32k";
const SECS: u32 = 10;
/// A full-size TCP segment on the wire (Ethernet and IPv4 and TCP with timestamps) over
/// what iperf3 counts of it: shaper charges wire bytes, iperf3 reports payload.
const WIRE_OVER_PAYLOAD: f64 = 1514.0 / 1448.0;

/// `ip netns exec NS ARGS...`, its output; panics if it fails.
fn exec(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ip netns exec");
    assert!(
        out.status.success(),
        "{args:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// A process killed (and reaped) when dropped: the iperf3 server.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one iperf3 TCP run from tx to rx came to.
#[derive(Debug)]
struct Tcp {
    /// Received payload, bits per second.
    goodput_bps: f64,
    retransmits: u64,
    /// The sender's mean smoothed RTT, microseconds: what the queue shaping keeps in fq
    /// adds to it.
    mean_rtt_us: u64,
}

/// Sets TCP's ECN (`net.ipv4.tcp_ecn`: 1 asks for it, 0 never) in both namespaces.
fn tcp_ecn(lab: &Lab, value: u32) {
    for ns in [lab.tx_ns(), lab.rx_ns()] {
        exec(ns, &["sysctl", "-qw", &format!("net.ipv4.tcp_ecn={value}")]);
    }
}

/// One iperf3 TCP flow from the lab's first source to its receiver for [`SECS`].
fn iperf(lab: &Lab) -> Tcp {
    let _server = Killed(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                lab.rx_ns(),
                "iperf3",
                "-s",
                "-1",
                "-p",
                "5299",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run iperf3 -s"),
    );
    // The server listens within a moment; the client retries the connection meanwhile.
    let rx = lab.rx_addr().to_string();
    let src = lab.sources()[0].to_string();
    let secs = SECS.to_string();
    let mut out = String::new();
    for _ in 0..50 {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                lab.tx_ns(),
                "iperf3",
                "-c",
                &rx,
                "-B",
                &src,
            ])
            .args(["-p", "5299", "-t", &secs, "-J"])
            .stdin(Stdio::null())
            .output()
            .expect("run iperf3 -c");
        if o.status.success() {
            out = String::from_utf8(o.stdout).expect("UTF-8");
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let j: serde_json::Value = serde_json::from_str(&out).expect("iperf3 -J is JSON");
    let end = &j["end"];
    Tcp {
        goodput_bps: end["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or_else(|| panic!("iperf3 -J without end.sum_received: {out}")),
        retransmits: end["sum_sent"]["retransmits"]
            .as_u64()
            .expect("retransmits"),
        mean_rtt_us: end["streams"][0]["sender"]["mean_rtt"]
            .as_u64()
            .unwrap_or_default(),
    }
}

/// `stats -j`'s totals for the egress of the lab's router towards the receiver.
fn totals(lab: &Lab) -> serde_json::Value {
    let (ns, iface) = lab.egress();
    let out = shaper_ok(ns.name(), &["--direction", EGRESS, "-j", "stats", iface]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("stats -j is JSON");
    // The delay's percentiles and histogram, beside the counts.
    let mut t = v["totals"].clone();
    t["shape_delay"] = v["shape_delay"].clone();
    t
}

fn count(t: &serde_json::Value, key: &str) -> u64 {
    t[key].as_u64().unwrap_or_else(|| panic!("{key} in {t}"))
}

/// A routed lab whose router's device towards the receiver has sch_fq as its root qdisc.
fn lab_with_fq(tag: &str) -> Lab {
    let lab = Lab::routed(tag, 1).unwrap();
    let (ns, iface) = lab.egress();
    exec(
        ns.name(),
        &["tc", "qdisc", "replace", "dev", iface, "root", "fq"],
    );
    lab
}

#[test]
#[ignore = "needs root and sch_fq: runs in the kernel matrix (cargo xtask test --kernel 6.12)"]
fn shaped_tcp_reaches_the_rate_with_fewer_retransmits_than_policed() {
    let lab = lab_with_fq("shape");
    let (ns, iface) = lab.egress();
    let ns = ns.name();
    // No ECN: what shaping does for TCP that cannot be told of congestion but by loss.
    tcp_ecn(&lab, 0);

    let policed = {
        let _attached = attach_toward(ns, iface, EGRESS, RATE, BURST, &[]);
        iperf(&lab)
    };
    let _attached = attach_toward(ns, iface, EGRESS, RATE, BURST, &["--mode", "shape"]);
    let shaped = iperf(&lab);
    let t = totals(&lab);
    println!(
        "{RATE} for {SECS} s: policed {:.3} Mbit/s goodput, {} retransmits, mean RTT {} us; shaped {:.3} Mbit/s, {} retransmits, mean RTT {} us; shaped {} pkts, delay p50 {} p90 {} p99 {} ns, horizon drops {}",
        policed.goodput_bps / 1e6,
        policed.retransmits,
        policed.mean_rtt_us,
        shaped.goodput_bps / 1e6,
        shaped.retransmits,
        shaped.mean_rtt_us,
        t["shaped_packets"],
        t["shape_delay"]["p50_ns"],
        t["shape_delay"]["p90_ns"],
        t["shape_delay"]["p99_ns"],
        t["horizon_dropped_packets"],
    );
    println!("delay histogram: {}", t["shape_delay"]["histogram"]);
    // On the wire, the shaped flow gets at least 95% of the rate.
    let wire = shaped.goodput_bps * WIRE_OVER_PAYLOAD;
    assert!(
        wire >= 0.95 * RATE_BPS,
        "shaped: {wire:.0} bit/s on the wire, under 95% of {RATE_BPS}"
    );
    assert!(
        shaped.retransmits < policed.retransmits,
        "shaped {} retransmits, policed {}",
        shaped.retransmits,
        policed.retransmits
    );
    assert!(
        count(&t, "shaped_packets") > 0,
        "nothing was held back: {t}"
    );
    // Held back for real: fq kept the packets until their departure time, which TCP sees
    // as a longer round trip (a stamp that fq ignored would leave the RTT as policed).
    assert!(
        shaped.mean_rtt_us > policed.mean_rtt_us + 2_000,
        "shaped mean RTT {} us, policed {} us: were the packets held back?",
        shaped.mean_rtt_us,
        policed.mean_rtt_us
    );
    // The delay stays under the horizon (50 ms): no packet in a bucket that starts at
    // or beyond it.
    let horizon_ns = 50_000_000;
    for b in t["shape_delay"]["histogram"].as_array().expect("histogram") {
        assert!(
            count(b, "from_ns") < horizon_ns,
            "held back beyond the horizon: {b}"
        );
    }
}

#[test]
#[ignore = "needs root and sch_fq: runs in the kernel matrix (cargo xtask test --kernel 6.12)"]
fn ecn_capable_flows_are_marked_not_dropped() {
    let lab = lab_with_fq("shape-ecn");
    let (ns, iface) = lab.egress();
    let ns = ns.name();
    tcp_ecn(&lab, 1);
    let _attached = attach_toward(ns, iface, EGRESS, RATE, BURST, &["--mode", "shape"]);
    let tcp = iperf(&lab);
    let t = totals(&lab);
    println!(
        "ECN, {RATE} for {SECS} s: {:.3} Mbit/s goodput, {} retransmits, mean RTT {} us; shaped {} pkts, CE marked {}, horizon drops {}, delay p50 {} p99 {} ns",
        tcp.goodput_bps / 1e6,
        tcp.retransmits,
        tcp.mean_rtt_us,
        t["shaped_packets"],
        t["ce_marked_packets"],
        t["horizon_dropped_packets"],
        t["shape_delay"]["p50_ns"],
        t["shape_delay"]["p99_ns"],
    );
    // Marked instead of dropped: TCP slows down on the marks, and the queue stays near the
    // threshold. Slow start can overshoot the horizon before the first marks reach the
    // sender, so a few drops at the start are allowed: at most 1% of the packets, and a
    // hundredth of the marks.
    let (marked, dropped) = (
        count(&t, "ce_marked_packets"),
        count(&t, "horizon_dropped_packets"),
    );
    assert!(marked > 0, "nothing marked: {t}");
    assert!(
        dropped * 100 <= marked && dropped * 100 <= count(&t, "passed_packets"),
        "{dropped} dropped against {marked} marked: {t}"
    );
    // Every drop is a horizon drop.
    assert_eq!(count(&t, "dropped_packets"), dropped, "{t}");
}
