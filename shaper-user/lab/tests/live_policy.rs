//! Prefix policies with live traffic through the real XDP program on a veth, driven with
//! the real `shaper` binary: a two-level hierarchy, rate changes in the middle of traffic,
//! and monitor mode against enforcement.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    net::IpAddr,
    thread,
    time::{Duration, Instant},
};

use common::{assert_limited, assert_near, attach, limit_gives, replay, shaper_ok, stats};
use shaper_lab::lab::{Flow, FlowResult, Lab, RunOptions, run_udp_with};

const FRAME: u32 = 1_000;

/// [`shaper_ok`] in the lab's rx namespace.
fn ok(lab: &Lab, args: &[&str]) -> String {
    shaper_ok(lab.rx_ns(), args)
}

/// The prefix policy every test here sets on 198.18.0.0/24 (the lab's sources).
fn set_policy(lab: &Lab, limits: &[&str]) {
    let mut args = vec!["policy", "set", lab.rx_iface(), "198.18.0.0/24"];
    args.extend_from_slice(limits);
    ok(lab, &args);
}

/// `policy list -j`'s row of 198.18.0.0/24.
fn policy_row(lab: &Lab) -> serde_json::Value {
    let rows: serde_json::Value =
        serde_json::from_str(&ok(lab, &["-j", "policy", "list", lab.rx_iface()])).unwrap();
    let row = rows[1].clone();
    assert_eq!(row["prefix"], "198.18.0.0/24", "{rows}");
    row
}

fn field(row: &serde_json::Value, name: &str) -> u64 {
    row[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {row}"))
}

/// UDP traffic through the lab, all of it counted by the receiver, every send's time kept
/// ([`replay`]).
fn run_udp(lab: &Lab, flows: &[Flow], duration: Duration) -> Vec<FlowResult> {
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(lab, flows, duration, &options).unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    report.flows
}

const PER_SOURCE_BPS: u64 = 4_000_000;
const PER_SOURCE_BURST: u64 = 16_384;
const AGGREGATE_BPS: u64 = 10_000_000;
const AGGREGATE_BURST: u64 = 32_768;
const HIERARCHY: [&str; 8] = [
    "--rate",
    "4mbit",
    "--burst",
    "16k",
    "--aggregate-rate",
    "10mbit",
    "--aggregate-burst",
    "32k",
];

/// Four sources at twice their 4 mbit cap: 32 mbit against the /24's 10 mbit. The
/// aggregate binds (each source gets about 2.5 mbit, under its cap).
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_prefix_aggregate_holds_the_prefix_and_each_source_to_its_cap() {
    // Short enough that the burst is more than 1% of what passes.
    const SECONDS: u64 = 2;
    let lab = Lab::new("hier", 4).unwrap();
    // The default would let everything through: the policy is what limits.
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "1gbit", "64k");
    set_policy(&lab, &HIERARCHY);
    let flows = lab.flows(&[2 * PER_SOURCE_BPS; 4], FRAME);
    let results = run_udp(&lab, &flows, Duration::from_secs(SECONDS));

    let all: Vec<&FlowResult> = results.iter().collect();
    let replayed = replay(
        &all,
        Some((PER_SOURCE_BPS, PER_SOURCE_BURST)),
        Some((AGGREGATE_BPS, AGGREGATE_BURST)),
    );
    for (r, &mine) in results.iter().zip(&replayed) {
        println!(
            "{}: offered {:.2} Mbit/s, received {:.3} Mbit/s (replayed: {mine} bytes)",
            r.src,
            r.sent_bps() / 1e6,
            r.received_bps() / 1e6
        );
        assert!(r.sent_bps() > 7e6, "{} did not offer 8 mbit", r.src);
        let cap = limit_gives(PER_SOURCE_BPS, PER_SOURCE_BURST, &[r]);
        assert!(
            r.received_l2_bytes as f64 <= cap,
            "{} got {} bytes, over its cap's {cap:.0}",
            r.src,
            r.received_l2_bytes
        );
    }
    let total: u64 = results.iter().map(|r| r.received_l2_bytes).sum();
    assert_limited(
        "the /24 received",
        total,
        replayed.iter().sum(),
        (AGGREGATE_BPS, AGGREGATE_BURST),
        &all,
    );
    // shaper counts the aggregate's refusals under the policy.
    assert!(field(&policy_row(&lab), "aggregate_refused_packets") > 0);
}

/// The same policy with room in the aggregate: one source at twice its 4 mbit cap and two
/// at half of it, 8 mbit in all against the /24's 10 mbit. The per-source cap binds: the
/// overloaded source gets its 4 mbit and its burst, not the aggregate's room, and the
/// others lose nothing.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn the_per_source_cap_binds_under_an_aggregate_with_room() {
    // Short enough that the burst is more than 1% of what passes.
    const SECONDS: u64 = 2;
    let lab = Lab::new("hiersrc", 3).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "1gbit", "64k");
    set_policy(&lab, &HIERARCHY);
    let offered = [2 * PER_SOURCE_BPS, PER_SOURCE_BPS / 2, PER_SOURCE_BPS / 2];
    let flows = lab.flows(&offered, FRAME);
    let results = run_udp(&lab, &flows, Duration::from_secs(SECONDS));
    let st = stats(lab.rx_ns(), lab.rx_iface());

    let hot = &results[0];
    assert!(
        hot.sent_l2_bytes > 3 * hot.received_l2_bytes / 2,
        "{} was not overloaded",
        hot.src
    );
    let all: Vec<&FlowResult> = results.iter().collect();
    let replayed = replay(
        &all,
        Some((PER_SOURCE_BPS, PER_SOURCE_BURST)),
        Some((AGGREGATE_BPS, AGGREGATE_BURST)),
    );
    assert_limited(
        &format!("{}, at twice its cap, received", hot.src),
        hot.received_l2_bytes,
        replayed[0],
        (PER_SOURCE_BPS, PER_SOURCE_BURST),
        &[hot],
    );
    assert_eq!(st.key(hot.src).passed_bytes, hot.received_l2_bytes);
    // The quiet sources lose nothing to the hot one: each gets what its own cap passes of
    // its sends (all of them, unless a sender held up by a loaded machine caught up in one
    // clump larger than the burst), within a frame.
    for (quiet, &mine) in results[1..].iter().zip(&replayed[1..]) {
        println!(
            "{}: sent {} received {} packets ({} bytes, replayed {mine})",
            quiet.src, quiet.sent_packets, quiet.received_packets, quiet.received_l2_bytes
        );
        assert!(quiet.sent_packets > 0);
        assert!(
            quiet.received_l2_bytes.abs_diff(mine) <= u64::from(FRAME) + 100,
            "{}: received {} bytes, its cap passes {mine} of its sends",
            quiet.src,
            quiet.received_l2_bytes
        );
        assert_eq!(
            st.key(quiet.src).passed_bytes,
            quiet.received_l2_bytes,
            "{}",
            quiet.src
        );
    }
    // Only the sources' own cells refused anything: the aggregate had room throughout,
    // and what the policy dropped is the overloaded source's excess.
    let row = policy_row(&lab);
    assert_eq!(field(&row, "aggregate_refused_packets"), 0, "{row}");
    assert_eq!(
        field(&row, "dropped_packets"),
        st.key(hot.src).dropped_packets,
        "{row}"
    );
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn rate_changes_mid_traffic_apply_within_a_second_without_a_refill() {
    const BURST: u64 = 65_536;
    let lab = Lab::new("chg", 1).unwrap();
    let src: IpAddr = lab.sources()[0].into();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "1gbit", "64k");
    let set = |rate: &str| set_policy(&lab, &["--rate", rate, "--burst", "64k"]);
    set("4mbit");
    let flow = Flow {
        src,
        offered_bps: 8_000_000,
        frame_bytes: FRAME,
    };
    let traffic = {
        let lab = &lab;
        thread::scope(|s| {
            // Two seconds longer than the changes and their seconds take when nothing
            // else runs: a loaded machine's slow commands do not outlast the traffic.
            let sender = s.spawn(move || run_udp(lab, &[flow], Duration::from_secs(9)));
            // Saturate at 4 mbit first, then lower to 1 mbit and raise to 6 mbit; after each,
            // count what passed in the next second with shaper's own per-source counter.
            thread::sleep(Duration::from_secs(2));
            let mut seconds_after = Vec::new();
            let mut old_bps = 4_000_000;
            for (rate, bps) in [("1mbit", 1_000_000u64), ("6mbit", 6_000_000)] {
                let before = stats(lab.rx_ns(), lab.rx_iface()).key(src).passed_bytes;
                let t0 = Instant::now();
                set(rate);
                // The old rate holds until the command has written the change.
                let at_old = old_bps as f64 / 8.0 * t0.elapsed().as_secs_f64();
                let t1 = Instant::now();
                thread::sleep(Duration::from_secs(1));
                let after = stats(lab.rx_ns(), lab.rx_iface()).key(src).passed_bytes;
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
    // The second is measured between two `stats` commands, each of which takes a few
    // milliseconds that are counted at one rate or the other: 3% and two frames, where
    // half a refill's share of the second would allow 4.4% (at 6 mbit) and 26% (at 1).
    const WINDOW_TOLERANCE: f64 = 0.03;
    for (rate, passed, at_rate) in seconds_after {
        let err = (passed as f64 - at_rate) / at_rate;
        let tolerance = WINDOW_TOLERANCE + 2.0 * f64::from(FRAME) / at_rate;
        println!(
            "to {rate}: {passed} bytes passed in the second after the change, the rates alone give {at_rate:.0} ({:+.3}%, tolerance ±{:.2}%), a refill would add {BURST}",
            err * 100.0,
            tolerance * 100.0
        );
        // No burst at all, since the bucket was full and stays full (a refill would add
        // 64k), and the new rate is in force over that second.
        assert!(
            err.abs() <= tolerance,
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
    let results = run_udp(&lab, &flows, Duration::from_secs(4));
    let st = stats(lab.rx_ns(), lab.rx_iface());
    let (m, e) = (st.key(monitored), st.key(enforced));
    println!(
        "monitor: sent {} received {} would drop {}; enforce: sent {} dropped {}",
        results[0].sent_packets,
        results[0].received_packets,
        m.would_drop_packets,
        results[1].sent_packets,
        e.dropped_packets
    );
    // Monitor drops nothing, and every frame of either source was metered once.
    assert_eq!(m.dropped_packets, 0);
    assert_eq!(
        results[0].received_packets, results[0].sent_packets,
        "monitor mode lost packets"
    );
    assert_eq!(m.packets(), results[0].sent_packets);
    assert_eq!(e.packets(), results[1].sent_packets);
    assert!(
        e.dropped_packets > 1_000,
        "the enforced source was not overloaded"
    );
    let limit = (4_000_000, 32_768);
    let replayed = replay(&[&results[1]], Some(limit), None)[0];
    assert_limited(
        "the enforced source passed",
        e.passed_bytes,
        replayed,
        limit,
        &[&results[1]],
    );
    // The meters ran alike: what monitor mode counts as conforming (passed, not would
    // drop) is what the same limit passes of its own sends, the burst and the rate.
    assert_near(
        "the monitored source's conforming bytes, against its replayed sends",
        m.passed_bytes as f64,
        replay(&[&results[0]], Some(limit), None)[0] as f64,
        32_768.0,
    );
}
