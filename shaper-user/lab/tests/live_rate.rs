//! Live traffic through the real XDP program: two namespaces joined by a veth pair,
//! shaper attached to the receiving end with the real `shaper` binary.

mod common;

use std::{net::IpAddr, time::Duration};

use common::{attach, shaper};
use shaper_lab::lab::{Flow, Lab, run_udp};

/// shaper's own per-source counters: (passed_bytes, dropped_packets).
fn shaper_counts(lab: &Lab, src: IpAddr) -> (u64, u64) {
    let out = shaper(
        lab.rx_ns(),
        &["-j", "stats", lab.rx_iface(), "--top", "100"],
    );
    assert!(out.status.success());
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = stats["top_sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["source"] == src.to_string())
        .unwrap_or_else(|| panic!("{src} not in stats"));
    (
        row["passed_bytes"].as_u64().unwrap(),
        row["dropped_packets"].as_u64().unwrap(),
    )
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn overloaded_sources_get_rate_times_time_plus_burst() {
    const RATE_BPS: u64 = 8_000_000;
    const BURST: u64 = 65_536;
    const FRAME: u32 = 1_000;
    let lab = Lab::new("live", 4).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "8mbit", "64k");
    assert!(lab.xdp_attached().unwrap());

    // Three sources at 5× the limit, and one below it that must lose nothing.
    let offered = [5 * RATE_BPS, 5 * RATE_BPS, 5 * RATE_BPS, RATE_BPS / 2];
    let flows: Vec<Flow> = lab
        .sources()
        .iter()
        .zip(offered)
        .map(|(&src, offered_bps)| Flow {
            src: src.into(),
            offered_bps,
            frame_bytes: FRAME,
        })
        .collect();
    let results = run_udp(&lab, &flows, Duration::from_secs(5)).unwrap();

    for r in &results[..3] {
        let expected = RATE_BPS as f64 / 8.0 * r.offered_secs + BURST as f64;
        let got = r.received_l2_bytes as f64;
        let err = (got - expected) / expected;
        println!(
            "{}: offered {:.2} Mbit/s for {:.3} s, received {} L2 bytes, expected {:.0} ({:+.3}%)",
            r.src,
            r.sent_bps() / 1e6,
            r.offered_secs,
            r.received_l2_bytes,
            expected,
            err * 100.0
        );
        assert!(
            err.abs() <= 0.03,
            "{}: error {:+.3}% beyond ±3%",
            r.src,
            err * 100.0
        );
        // Sanity: it really was overloaded, and shaper's count agrees with the receiver's.
        assert!(r.sent_l2_bytes as f64 > 4.0 * expected);
        let (passed, _) = shaper_counts(&lab, r.src);
        assert!(
            (passed as f64 - got).abs() / got < 0.005,
            "{}: shaper passed {passed} bytes, receiver got {got}",
            r.src
        );
    }

    let quiet = &results[3];
    println!(
        "{}: offered {:.2} Mbit/s, sent {} received {} packets",
        quiet.src,
        quiet.sent_bps() / 1e6,
        quiet.sent_packets,
        quiet.received_packets
    );
    assert!(quiet.sent_packets > 0);
    assert_eq!(
        quiet.received_packets, quiet.sent_packets,
        "a source below the limit lost packets"
    );
    assert_eq!(
        shaper_counts(&lab, quiet.src).1,
        0,
        "shaper dropped a source below the limit"
    );
}
