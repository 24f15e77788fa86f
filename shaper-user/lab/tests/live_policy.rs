//! Prefix policies with live traffic through the real XDP program on a veth, driven with
//! the real `shaper` binary: a two-level hierarchy, rate changes in the middle of traffic,
//! and monitor mode against enforcement.

mod common;

use std::{
    net::IpAddr,
    thread,
    time::{Duration, Instant},
};

use common::{attach, shaper_ok};
use shaper_lab::lab::{Flow, Lab, run_udp};

const FRAME: u32 = 1_000;
const TOLERANCE: f64 = 0.03;

/// [`shaper_ok`] in the lab's rx namespace.
fn ok(lab: &Lab, args: &[&str]) -> String {
    shaper_ok(lab.rx_ns(), args)
}

/// One source's row of `stats -j`.
fn source_row(lab: &Lab, src: IpAddr) -> serde_json::Value {
    let stats: serde_json::Value =
        serde_json::from_str(&ok(lab, &["-j", "stats", lab.rx_iface(), "--top", "1000"])).unwrap();
    stats["top_sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["source"] == src.to_string())
        .cloned()
        .unwrap_or_else(|| panic!("{src} not in stats"))
}

fn field(row: &serde_json::Value, name: &str) -> u64 {
    row[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {row}"))
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_prefix_aggregate_holds_the_prefix_and_each_source_to_its_cap() {
    const PER_SOURCE_BPS: u64 = 4_000_000;
    const AGGREGATE_BPS: u64 = 10_000_000;
    const AGGREGATE_BURST: u64 = 32_768;
    const SECONDS: u64 = 5;
    let lab = Lab::new("hier", 4).unwrap();
    // The default would let everything through: the policy is what limits.
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "1gbit", "64k");
    ok(
        &lab,
        &[
            "policy",
            "set",
            lab.rx_iface(),
            "198.18.0.0/24",
            "--rate",
            "4mbit",
            "--burst",
            "16k",
            "--aggregate-rate",
            "10mbit",
            "--aggregate-burst",
            "32k",
        ],
    );
    let flows: Vec<Flow> = lab
        .sources()
        .iter()
        .map(|&src| Flow {
            src: src.into(),
            offered_bps: 8_000_000,
            frame_bytes: FRAME,
        })
        .collect();
    let results = run_udp(&lab, &flows, Duration::from_secs(SECONDS)).unwrap();

    let secs = results.iter().map(|r| r.offered_secs).fold(0.0, f64::max);
    let total: u64 = results.iter().map(|r| r.received_l2_bytes).sum();
    let expected = AGGREGATE_BPS as f64 / 8.0 * secs + AGGREGATE_BURST as f64;
    let err = (total as f64 - expected) / expected;
    for r in &results {
        println!(
            "{}: offered {:.2} Mbit/s, received {:.3} Mbit/s",
            r.src,
            r.sent_bps() / 1e6,
            r.received_bps() / 1e6
        );
        assert!(r.sent_bps() > 7e6, "{} did not offer 8 mbit", r.src);
        assert!(
            r.received_bps() <= PER_SOURCE_BPS as f64 * (1.0 + TOLERANCE) + 16_384.0 * 8.0 / secs,
            "{} got {:.3} Mbit/s, over its 4 mbit cap",
            r.src,
            r.received_bps() / 1e6
        );
    }
    println!(
        "/24: received {total} bytes over {secs:.3} s, expected {expected:.0} ({:+.3}%)",
        err * 100.0
    );
    assert!(
        err.abs() <= TOLERANCE,
        "/24 error {:+.3}% beyond ±3%",
        err * 100.0
    );
    // shaper counts the aggregate's refusals under the policy.
    let rows: serde_json::Value =
        serde_json::from_str(&ok(&lab, &["-j", "policy", "list", lab.rx_iface()])).unwrap();
    let policy = &rows.as_array().unwrap()[1];
    assert_eq!(policy["prefix"], "198.18.0.0/24");
    assert!(field(policy, "aggregate_refused_packets") > 0);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn rate_changes_mid_traffic_apply_within_a_second_without_a_refill() {
    const BURST: u64 = 65_536;
    let lab = Lab::new("chg", 1).unwrap();
    let src: IpAddr = lab.sources()[0].into();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "1gbit", "64k");
    let set = |rate: &str| {
        ok(
            &lab,
            &[
                "policy",
                "set",
                lab.rx_iface(),
                "198.18.0.0/24",
                "--rate",
                rate,
                "--burst",
                "64k",
            ],
        );
    };
    set("4mbit");
    let flow = Flow {
        src,
        offered_bps: 8_000_000,
        frame_bytes: FRAME,
    };
    let traffic = {
        let lab = &lab;
        thread::scope(|s| {
            let sender = s.spawn(move || run_udp(lab, &[flow], Duration::from_secs(7)).unwrap());
            // Saturate at 4 mbit first, then lower to 1 mbit and raise to 6 mbit; after each,
            // count what passed in the next second with shaper's own per-source counter.
            thread::sleep(Duration::from_secs(2));
            let mut seconds_after = Vec::new();
            let mut old_bps = 4_000_000;
            for (rate, bps) in [("1mbit", 1_000_000u64), ("6mbit", 6_000_000)] {
                let before = field(&source_row(lab, src), "passed_bytes");
                let t0 = Instant::now();
                set(rate);
                // The old rate holds until the command has written the change.
                let at_old = old_bps as f64 / 8.0 * t0.elapsed().as_secs_f64();
                let t1 = Instant::now();
                thread::sleep(Duration::from_secs(1));
                let after = field(&source_row(lab, src), "passed_bytes");
                let at_new = bps as f64 / 8.0 * t1.elapsed().as_secs_f64();
                seconds_after.push((rate, after - before, at_old + at_new));
                old_bps = bps;
                thread::sleep(Duration::from_millis(1_500));
            }
            (sender.join().unwrap(), seconds_after)
        })
    };
    let (results, seconds_after) = traffic;
    assert!(
        results[0].sent_bps() > 7e6,
        "the source did not offer 8 mbit"
    );
    for (rate, passed, at_rate) in seconds_after {
        println!(
            "to {rate}: {passed} bytes passed in the second after the change, the rates alone give {at_rate:.0}, a refill would add {BURST}"
        );
        // The bound: no more than the new rate and the new burst...
        assert!(
            passed as f64 <= (at_rate + BURST as f64) * (1.0 + TOLERANCE),
            "to {rate}: {passed} bytes is more than rate + burst"
        );
        // ...and in fact no burst at all, since the bucket was full and stays full; and the
        // new rate is in force over that second.
        assert!(
            (passed as f64 - at_rate).abs() <= at_rate * TOLERANCE + 2.0 * f64::from(FRAME),
            "to {rate}: {passed} bytes is not the new rate over that second ({at_rate:.0})"
        );
    }
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn monitor_mode_counts_what_enforcement_drops_and_drops_nothing() {
    let lab = Lab::new("mon", 2).unwrap();
    let (monitored, enforced): (IpAddr, IpAddr) =
        (lab.sources()[0].into(), lab.sources()[1].into());
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "1gbit", "64k");
    for (src, mode) in [(monitored, "monitor"), (enforced, "enforce")] {
        ok(
            &lab,
            &[
                "policy",
                "set",
                lab.rx_iface(),
                &src.to_string(),
                "--rate",
                "4mbit",
                "--burst",
                "32k",
                "--mode",
                mode,
            ],
        );
    }
    // The same traffic for both at the same time: twice their limit.
    let flows: Vec<Flow> = [monitored, enforced]
        .iter()
        .map(|&src| Flow {
            src,
            offered_bps: 8_000_000,
            frame_bytes: FRAME,
        })
        .collect();
    let results = run_udp(&lab, &flows, Duration::from_secs(4)).unwrap();
    let m = source_row(&lab, monitored);
    let e = source_row(&lab, enforced);
    let would = field(&m, "would_drop_packets");
    let dropped = field(&e, "dropped_packets");
    println!(
        "monitor: sent {} received {} would drop {would}; enforce: dropped {dropped}",
        results[0].sent_packets, results[0].received_packets
    );
    assert_eq!(field(&m, "dropped_packets"), 0);
    assert_eq!(
        results[0].received_packets, results[0].sent_packets,
        "monitor mode lost packets"
    );
    assert!(dropped > 1_000, "the enforced source was not overloaded");
    let diff = (would as f64 - dropped as f64).abs() / dropped as f64;
    assert!(
        diff <= TOLERANCE,
        "would drop {would} vs dropped {dropped}: {:.2}% apart",
        diff * 100.0
    );
}
