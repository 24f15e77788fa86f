//! Shape mode (EDT on tc egress, held back by sch_fq) with real TCP: iperf3 through the
//! routed lab, held on the router's egress towards the receiver (a router holding a
//! customer's download), shaped against policed at the same rate, with and without ECN.
//! What it asserts is function (dropped, held back, marked, held to the rate), never
//! timing: it runs in emulated guests;
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

use shaper_lab::bench::tcp::{
    BURST, Mode, RATE, RATE_BPS, SECS, WIRE_OVER_PAYLOAD, lab_with_fq, measure,
};
use shaper_lab::bins::shaper as shaper_bin;

/// A count from the totals, which must be there.
fn count(t: &serde_json::Value, key: &str) -> u64 {
    t[key].as_u64().unwrap_or_else(|| panic!("{key} in {t}"))
}

/// The values of the egress samples of `series` in a scrape, in order.
fn egress_samples<'a>(scrape: &'a str, series: &str) -> Vec<&'a str> {
    let start = format!("{series}{{");
    scrape
        .lines()
        .filter(|l| l.starts_with(&start) && l.contains("direction=\"egress\""))
        .map(|l| l.rsplit_once(' ').expect("a sample has a value").1)
        .collect()
}

/// The delay histogram of a scrape's egress series (`shaper_shape_delay_seconds`): its
/// buckets' counts in order, its `_count` and its `_sum`.
fn delay_histogram(scrape: &str) -> (Vec<u64>, u64, f64) {
    const NAME: &str = "shaper_shape_delay_seconds";
    let buckets = egress_samples(scrape, &format!("{NAME}_bucket"))
        .iter()
        .map(|v| v.parse().expect("a bucket's count"))
        .collect();
    let one = |suffix: &str| {
        let values = egress_samples(scrape, &format!("{NAME}_{suffix}"));
        assert_eq!(values.len(), 1, "one {NAME}_{suffix}: {values:?}");
        values[0].to_owned()
    };
    (
        buckets,
        one("count").parse().unwrap(),
        one("sum").parse().unwrap(),
    )
}

/// The most a shaped flow may put on the wire over the run, as a rate: the rate, and
/// once the burst and a horizon's backlog (50 ms). fq releasing packets at their stamps
/// keeps TCP under it; fq ignoring them would let TCP run at the line's speed. An upper
/// bound: a slow (emulated) machine only stays further under it.
fn most_wire_bps() -> f64 {
    let burst: f64 = BURST.trim_end_matches('k').parse::<f64>().unwrap() * 1024.0;
    let horizon_bytes = RATE_BPS / 8.0 * 0.050;
    RATE_BPS + (burst + horizon_bytes) * 8.0 / f64::from(SECS)
}

/// Function, not timing: policing drops, shaping holds back (fq releasing the packets at
/// their stamps keeps the flow within the rate) and drops nothing but beyond the
/// horizon. The rates, retransmits and round trips these lead to are the bench's
/// (`bench --only tcp`); the stamps themselves are checked exactly in shape_test_run.rs.
#[test]
#[ignore = "needs root and sch_fq: runs in the kernel matrix (cargo xtask test --kernel 6.12)"]
fn shaped_tcp_is_held_to_the_rate_and_policed_tcp_is_dropped() {
    let lab = lab_with_fq("shape").unwrap();
    // No ECN in either: what shaping does for TCP that cannot be told of congestion but by
    // loss.
    let policed = measure(shaper_bin(), &lab, Mode::Police).unwrap();
    let shaped = measure(shaper_bin(), &lab, Mode::Shape).unwrap();
    let (p, t) = (&policed.totals, &shaped.totals);
    println!(
        "{RATE} for {SECS} s: policed {:.3} Mbit/s goodput, {} dropped; shaped {:.3} Mbit/s, {} held back, {} horizon drops, {} dropped",
        policed.tcp.goodput_bps / 1e6,
        count(p, "dropped_packets"),
        shaped.tcp.goodput_bps / 1e6,
        count(t, "shaped_packets"),
        count(t, "horizon_dropped_packets"),
        count(t, "dropped_packets"),
    );
    assert!(
        count(p, "dropped_packets") > 0,
        "policing dropped nothing: {p}"
    );
    assert_eq!(count(p, "shaped_packets"), 0, "policing held back: {p}");
    assert!(count(t, "shaped_packets") > 0, "nothing was held back: {t}");
    // The scrape's delay histogram counts each frame held back once, cumulatively: its
    // buckets never fall, the last (+Inf) is its count, and that is the kernel's count of
    // frames held back (a counter of its own); policing holds nothing back, so it has none.
    let (buckets, held, sum) = delay_histogram(&shaped.scrape);
    println!("shaped: delay buckets {buckets:?}, count {held}, sum {sum} s");
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "the delay histogram is not cumulative: {buckets:?}"
    );
    assert_eq!(
        buckets.last(),
        Some(&held),
        "the +Inf bucket is not the count"
    );
    assert_eq!(held, count(t, "shaped_packets"), "the histogram's count");
    assert!(sum > 0.0, "frames held back for no time at all: {sum}");
    assert_eq!(delay_histogram(&policed.scrape).1, 0, "policing held back");
    let wire = shaped.tcp.goodput_bps * WIRE_OVER_PAYLOAD;
    assert!(
        wire <= most_wire_bps(),
        "shaped: {wire:.0} bit/s on the wire, over the {:.0} the rate allows: did fq hold the packets?",
        most_wire_bps()
    );
    assert!(wire > 0.0, "the shaped flow carried nothing");
}

/// Function, not timing: an ECN-capable flow held back past the threshold is marked CE
/// (fewer marks than packets held), and still held to the rate.
#[test]
#[ignore = "needs root and sch_fq: runs in the kernel matrix (cargo xtask test --kernel 6.12)"]
fn ecn_capable_flows_held_past_the_threshold_are_marked() {
    let lab = lab_with_fq("shape-ecn").unwrap();
    let run = measure(shaper_bin(), &lab, Mode::ShapeEcn).unwrap();
    let (tcp, t) = (run.tcp, run.totals);
    println!(
        "ECN, {RATE} for {SECS} s: {:.3} Mbit/s goodput; shaped {} pkts, CE marked {}, horizon drops {}",
        tcp.goodput_bps / 1e6,
        t["shaped_packets"],
        t["ce_marked_packets"],
        t["horizon_dropped_packets"],
    );
    let (marked, shaped) = (count(&t, "ce_marked_packets"), count(&t, "shaped_packets"));
    assert!(marked > 0, "nothing marked: {t}");
    assert!(marked <= shaped, "{marked} marked of {shaped} held: {t}");
    let wire = tcp.goodput_bps * WIRE_OVER_PAYLOAD;
    assert!(wire <= most_wire_bps(), "{wire:.0} bit/s on the wire");
}
