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
//! rate is one the emulated guest carries easily. The lab, the flow and the readings are
//! `shaper_lab::bench::tcp`'s, which `bench --only tcp` reports.

use shaper_lab::bench::tcp::{Mode, RATE, RATE_BPS, SECS, WIRE_OVER_PAYLOAD, lab_with_fq, measure};
use shaper_lab::bins::shaper as shaper_bin;

/// A count from the totals, which must be there.
fn count(t: &serde_json::Value, key: &str) -> u64 {
    t[key].as_u64().unwrap_or_else(|| panic!("{key} in {t}"))
}

#[test]
#[ignore = "needs root and sch_fq: runs in the kernel matrix (cargo xtask test --kernel 6.12)"]
fn shaped_tcp_reaches_the_rate_with_fewer_retransmits_than_policed() {
    let lab = lab_with_fq("shape").unwrap();
    // No ECN in either: what shaping does for TCP that cannot be told of congestion but by
    // loss.
    let policed = measure(shaper_bin(), &lab, Mode::Police).unwrap().tcp;
    let run = measure(shaper_bin(), &lab, Mode::Shape).unwrap();
    let (shaped, t) = (run.tcp, run.totals);
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
    let lab = lab_with_fq("shape-ecn").unwrap();
    let run = measure(shaper_bin(), &lab, Mode::ShapeEcn).unwrap();
    let (tcp, t) = (run.tcp, run.totals);
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
