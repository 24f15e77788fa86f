//! Prefix policies with live traffic through the real XDP program on a veth, driven with
//! the real `shaper` binary: a two-level hierarchy, rate changes in the middle of traffic,
//! and monitor mode against enforcement. Each against the kernel's exact counts and a GCRA
//! replay of every recorded send (tests/common: `replay`, `assert_limited`), not a
//! wall-clock window.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    net::IpAddr,
    thread,
    time::{Duration, Instant},
};

use aya::maps::{Array, Map, MapData};
use common::{
    assert_limited, attach, attach_with, limit_gives, replay, replay_changes, shaper_ok, stats,
};
use shaper_common::maps::Policy;
use shaper_lab::lab::{Flow, FlowResult, Lab, LabOptions, RunOptions, RunReport, run_udp_with};
use shaper_user::{pins::Attachment, policy::PolicyTable};

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
    run_udp_report(lab, flows, duration).flows
}

/// [`run_udp`]'s whole report: the origin of the send offsets too.
fn run_udp_report(lab: &Lab, flows: &[Flow], duration: Duration) -> RunReport {
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(lab, flows, duration, &options).unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    report
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

/// A dual-stack subscriber (`shaper subscriber`): its IPv4 address and an IPv6 /56 that
/// holds the /64s of two of its devices, each of the three sending at 3 times the plan.
/// The subscriber receives its plan once, not once a family or a key: all three draw
/// from its one bucket, within a quarter burst of a GCRA replay of every send with each
/// key's own cell (the per-address limit, the plan's by default) and the subscriber's.
/// The kernel's count of the subscriber's passed bytes is what the receiver got.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_dual_stack_subscriber_receives_its_plan_once() {
    const SECONDS: u64 = 2;
    let options = LabOptions {
        ipv6: true,
        ..LabOptions::default()
    };
    let lab = Lab::with("subds", 3, options).unwrap();
    let _attached = attach_with(
        lab.rx_ns(),
        lab.rx_iface(),
        "1gbit",
        "64k",
        &["--max-subscribers", "16"],
    );
    // 2001:2:0:2::/64 and 2001:2:0:3::/64, the lab's second and third sources, are in
    // 2001:2::/56; the first source's IPv4 address is the subscriber's too.
    let v4 = format!("{}/32", lab.sources()[0]);
    let plan = ["--rate", "4mbit", "--burst", "16k"];
    let mut args = vec![
        "subscriber",
        "set",
        lab.rx_iface(),
        "c1042",
        "--prefix",
        &v4,
        "--prefix",
        "2001:2::/56",
    ];
    args.extend_from_slice(&plan);
    ok(&lab, &args);
    let flow = |src: IpAddr| Flow {
        src,
        offered_bps: 3 * PER_SOURCE_BPS,
        frame_bytes: FRAME,
    };
    let v4 = [flow(lab.sources()[0].into())];
    let v6 = [
        flow(lab.sources6()[1].into()),
        flow(lab.sources6()[2].into()),
    ];
    let results = run_udp_both(&lab, &v4, &v6, Duration::from_secs(SECONDS));
    let all: Vec<&FlowResult> = results.iter().collect();
    let plan = (PER_SOURCE_BPS, PER_SOURCE_BURST);
    let replayed = replay(&all, Some(plan), Some(plan));
    for r in &results {
        println!(
            "{}: offered {:.2} Mbit/s, received {:.3} Mbit/s",
            r.src,
            r.sent_bps() / 1e6,
            r.received_bps() / 1e6
        );
        assert!(r.received_packets > 0, "{} received nothing", r.src);
    }
    let total: u64 = results.iter().map(|r| r.received_l2_bytes).sum();
    assert_limited(
        "the subscriber received",
        total,
        replayed.iter().sum(),
        plan,
        &all,
    );
    let row: serde_json::Value = serde_json::from_str(&ok(
        &lab,
        &["-j", "subscriber", "show", lab.rx_iface(), "c1042"],
    ))
    .unwrap();
    assert_eq!(field(&row, "passed_bytes"), total, "{row}");
    let sent: u64 = results.iter().map(|r| r.sent_packets).sum();
    let received: u64 = results.iter().map(|r| r.received_packets).sum();
    assert_eq!(field(&row, "dropped_packets"), sent - received, "{row}");
}

/// [`run_udp`] of IPv4 flows and IPv6 flows at once (a run is of one family: two runs,
/// side by side), their send offsets moved to the earlier run's origin so that one
/// [`replay`] places every send.
fn run_udp_both(lab: &Lab, v4: &[Flow], v6: &[Flow], duration: Duration) -> Vec<FlowResult> {
    let (a, b) = thread::scope(|s| {
        let a = s.spawn(|| run_udp_report(lab, v4, duration));
        let b = s.spawn(|| run_udp_report(lab, v6, duration));
        (a.join().unwrap(), b.join().unwrap())
    });
    let origin = a.start.min(b.start);
    let mut results = Vec::new();
    for report in [a, b] {
        let shift = u64::try_from((report.start - origin).as_nanos()).unwrap();
        results.extend(report.flows.into_iter().map(|mut r| {
            r.send_offsets_ns.iter_mut().for_each(|t| *t += shift);
            r
        }));
    }
    results
}

/// One source at 8 mbit under a policy of 4 mbit, lowered to 1 mbit and raised to 6 mbit
/// while it sends. The kernel carries the source's cell over at each change, its backlog
/// in bytes kept (a saturated source stays saturated, never refilled), so it passes what a
/// replay of the sends gives with the rate switched at the change ([`replay_changes`]).
/// When the policy map was written is known only as a bracket ([`bracket_change`]): the
/// kernel's count must lie within what the replay gives for change times anywhere in the
/// brackets, give or take two frames.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn rate_changes_mid_traffic_carry_the_backlog_over_without_a_refill() {
    const BURST: u64 = 65_536;
    const FIRST_BPS: u64 = 4_000_000;
    /// The changes, each this long after the one before (the first after the start).
    const CHANGES: [(&str, u64); 2] = [("1mbit", 1_000_000), ("6mbit", 6_000_000)];
    const APART: Duration = Duration::from_millis(1_500);
    /// Two seconds longer than the changes take when nothing else runs: a loaded
    /// machine's slow commands do not outlast the traffic.
    const SECONDS: u64 = 5;
    let lab = Lab::new("chg", 1).unwrap();
    let src: IpAddr = lab.sources()[0].into();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "1gbit", "64k");
    let set = |rate: &str| set_policy(&lab, &["--rate", rate, "--burst", "64k"]);
    set("4mbit");
    let (policies, slot) = policy_slot(&lab);
    let flow = Flow {
        src,
        offered_bps: 8_000_000,
        frame_bytes: FRAME,
    };
    let (report, brackets) = thread::scope(|s| {
        let sender = s.spawn(|| run_udp_report(&lab, &[flow], Duration::from_secs(SECONDS)));
        let brackets: Vec<(Instant, Instant, u64)> = CHANGES
            .iter()
            .map(|&(rate, bps)| {
                thread::sleep(APART);
                let (from, to) = bracket_change(&policies, slot, bps, || set(rate));
                (from, to, bps)
            })
            .collect();
        (sender.join().unwrap(), brackets)
    });
    let r = &report.flows[0];
    assert!(r.sent_bps() > 7e6, "the source did not offer 8 mbit");
    let passed = stats(lab.rx_ns(), lab.rx_iface()).key(src).passed_bytes;
    assert_eq!(passed, r.received_l2_bytes);
    // The brackets as send offsets; every change was made well before the last send, so
    // the traffic met each new rate.
    let offset = |t: Instant| t.saturating_duration_since(report.start).as_nanos() as u64;
    let brackets: Vec<(u64, u64, u64)> = brackets
        .iter()
        .map(|&(from, to, bps)| (offset(from), offset(to), bps))
        .collect();
    let last_send = *r.send_offsets_ns.last().unwrap();
    for &(from, to, bps) in &brackets {
        println!(
            "to {bps} bit/s: written between {:.4} s and {:.4} s ({} us); sends until {:.3} s",
            from as f64 / 1e9,
            to as f64 / 1e9,
            (to - from) / 1_000,
            last_send as f64 / 1e9
        );
        assert!(
            to + 500_000_000 < last_send,
            "the traffic ended before the change to {bps}"
        );
    }
    // The replay at change times spread over each bracket, its ends included: the count
    // moves by the rates' difference times the bracket's width.
    const POINTS: u64 = 5;
    let at = |(from, to, _): (u64, u64, u64), k: u64| from + (to - from) * k / (POINTS - 1);
    let (mut low, mut high) = (u64::MAX, 0);
    for i in 0..POINTS {
        for j in 0..POINTS {
            let changes = [
                (at(brackets[0], i), (brackets[0].2, BURST)),
                (at(brackets[1], j), (brackets[1].2, BURST)),
            ];
            let replayed = replay_changes(r, (FIRST_BPS, BURST), &changes);
            (low, high) = (low.min(replayed), high.max(replayed));
        }
    }
    let got = r.received_l2_bytes;
    let slack = 2 * u64::from(FRAME);
    println!(
        "received {got} bytes; the replay gives {low}..={high} over the brackets (slack {slack}); \
         a refill at a change would add {BURST}, a burst halved take {}",
        BURST / 2
    );
    assert!(
        (low - slack..=high + slack).contains(&got),
        "received {got} bytes, outside {low}..={high} (what the limits pass of the same sends, \
         each change anywhere within its bracket) by more than {slack}"
    );
}

/// The pinned policy map of `lab`'s rx veth, and the slot of its one prefix policy.
fn policy_slot(lab: &Lab) -> (Array<MapData, Policy>, u32) {
    let at = Attachment::new(lab.rx_iface(), Some(lab.rx_ns()));
    let installed = PolicyTable::open(&at).unwrap().list().unwrap();
    assert_eq!(installed.len(), 1, "{installed:?}");
    let map = Map::from_map_data(MapData::from_pin(at.policies()).unwrap()).unwrap();
    (Array::try_from(map).unwrap(), installed[0].slot)
}

/// Runs `change`, a command that sets the policy in `slot` of `policies` to `rate_bps`,
/// and says when the kernel could first meet the new rate: after the last read of the
/// slot that found the old one and before the first that found the new one, the slot
/// read every 100 us while the command runs; within the command's start and end whatever
/// this thread's scheduling. On the clock of the send offsets.
fn bracket_change(
    policies: &Array<MapData, Policy>,
    slot: u32,
    rate_bps: u64,
    change: impl FnOnce() + Send,
) -> (Instant, Instant) {
    thread::scope(|s| {
        let start = Instant::now();
        let command = s.spawn(|| {
            change();
            Instant::now()
        });
        let (mut old, mut new) = (None, None);
        loop {
            let finished = command.is_finished();
            let before = Instant::now();
            if policies.get(&slot, 0).unwrap().rate_bps == rate_bps {
                new = Some(Instant::now());
                break;
            }
            if finished {
                break;
            }
            old = Some(before);
            thread::sleep(Duration::from_micros(100));
        }
        let end = command.join().unwrap();
        let new = new
            .unwrap_or_else(|| panic!("the command ended, the policy is not at {rate_bps} bit/s"));
        let (from, to) = (old.map_or(start, |t| t.max(start)), new.min(end));
        println!(
            "to {rate_bps} bit/s: the command ran {:.1} ms, the write was seen within {} us of it",
            (end - start).as_secs_f64() * 1e3,
            (to - from).as_micros()
        );
        (from, to)
    })
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
    assert_limited(
        "the monitored source's conforming bytes",
        m.passed_bytes,
        replay(&[&results[0]], Some(limit), None)[0],
        limit,
        &[&results[0]],
    );
}
