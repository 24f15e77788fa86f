//! A spoofed flood through the real XDP program on a veth, with new-source admission: real
//! sources that were sending before the flood keep their cells and lose nothing to it, the
//! flood gets what one source gets plus a frame per admitted key, and a warm start of
//! many sources is admitted as the README says.
//!
//! Frames are written onto the veth with packet sockets ([`shaper_lab::lab::raw`]); the
//! flood is one raw flow whose every frame comes from a source never used before.

mod common;

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use common::{attach, attach_with, shaper_ok};
use serde_json::Value;
use shaper_lab::{
    frame,
    lab::{
        Lab,
        raw::{RawFlow, run_raw},
    },
};

const RATE_BPS: u64 = 8_000_000;
const RATE: &str = "8mbit";
const BURST: u64 = 32_768;
const BURST_ARG: &str = "32k";
/// Frames of the real sources.
const FRAME: usize = 1000;
/// Frames of the flood: the smallest Ethernet frame.
const FLOOD_FRAME: usize = 60;

fn stats(lab: &Lab) -> Value {
    let out = shaper_ok(
        lab.rx_ns(),
        &["-j", "stats", lab.rx_iface(), "--top", "1000"],
    );
    serde_json::from_str(&out).expect("stats JSON")
}

fn total(stats: &Value, key: &str) -> u64 {
    stats["totals"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no totals.{key}"))
}

/// A source's counters from `stats -j`: (passed packets, passed bytes, dropped packets).
fn source(stats: &Value, src: Ipv4Addr) -> (u64, u64, u64) {
    let row = stats["top_sources"]
        .as_array()
        .expect("top_sources")
        .iter()
        .find(|r| r["source"] == src.to_string())
        .unwrap_or_else(|| panic!("{src} is not tracked"));
    let n = |k: &str| row[k].as_u64().expect(k);
    (n("passed_packets"), n("passed_bytes"), n("dropped_packets"))
}

fn flow(src: Ipv4Addr, lab: &Lab, len: usize, offered_bps: u64, spoofed: bool) -> RawFlow {
    RawFlow {
        frame: frame::ipv4_udp_to(src, lab.rx_addr(), len),
        offered_bps,
        spoofed,
    }
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn real_sources_hold_their_cells_and_rates_through_a_spoofed_flood() {
    const NEW_PER_SEC: u64 = 100;
    const NEW_BURST: u64 = 100;
    let lab = Lab::new("flood", 3).unwrap();
    let _attached = attach_with(
        lab.rx_ns(),
        lab.rx_iface(),
        RATE,
        BURST_ARG,
        &["--new-sources", "100"],
    );
    let s = lab.sources();
    // One source at twice its limit, two at half of it.
    let real = [
        flow(s[0], &lab, FRAME, 2 * RATE_BPS, false),
        flow(s[1], &lab, FRAME, RATE_BPS / 2, false),
        flow(s[2], &lab, FRAME, RATE_BPS / 2, false),
    ];
    // The real sources first, alone: they get their cells.
    let before_flood = run_raw(&lab, &real, Duration::from_secs(1)).unwrap();
    let before = stats(&lab);
    let seen_before: Vec<(u64, u64, u64)> = s.iter().map(|&a| source(&before, a)).collect();

    // Then the same sources through a flood of 60-byte frames, each from a new address,
    // as fast as one sender thread goes (about 100k frames a second here).
    let mut with_flood = real.to_vec();
    with_flood.push(flow(
        Ipv4Addr::new(10, 64, 0, 0),
        &lab,
        FLOOD_FRAME,
        1_000_000_000,
        true,
    ));
    let started = Instant::now();
    let results = run_raw(&lab, &with_flood, Duration::from_secs(4)).unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let after = stats(&lab);
    let flood = &results[3];
    println!(
        "flood: {} frames sent ({:.0}/s), {} reached the receiver",
        flood.sent_packets,
        flood.sent_packets as f64 / flood.offered_secs,
        flood.received_packets
    );
    assert!(
        flood.sent_packets > 50_000,
        "the flood was too weak to mean anything: {flood:?}"
    );

    for (i, &src) in s.iter().enumerate() {
        let (passed0, _, dropped0) = seen_before[i];
        let (passed, passed_bytes, dropped) = source(&after, src);
        let sent = before_flood[i].sent_packets + results[i].sent_packets;
        println!("{src}: sent {sent}, passed {passed}, dropped {dropped}");
        // The cell survived: its counters went on from where they were, and hold every
        // frame shaper saw of it (a new cell would have started again from zero).
        assert!(passed >= passed0 && dropped >= dropped0, "{src} was reset");
        if i == 0 {
            // Over its limit: the flood changes nothing of its rate. Shaper's own count
            // of the second run, from a full bucket (idle between the runs).
            let passed_flood = passed_bytes - seen_before[0].1.min(passed_bytes);
            let expected = RATE_BPS as f64 / 8.0 * results[0].offered_secs + BURST as f64;
            let err = (passed_flood as f64 - expected) / expected;
            println!(
                "{src}: passed {passed_flood} bytes during the flood, expected {expected:.0} ({:+.3}%)",
                err * 100.0
            );
            assert!(err.abs() <= 0.01, "{src}: {:+.3}% beyond ±1%", err * 100.0);
        } else {
            // Under its limit: nothing dropped, every frame sent was metered and passed.
            assert_eq!(dropped, 0, "{src} lost frames to shaper");
            assert_eq!(passed, sent, "{src}: frames sent but never metered");
        }
    }

    // The flood: at most the admission's keys got cells (one frame each), and all its
    // other frames shared one cell at the per-source limit.
    let created = total(&after, "new_sources") - total(&before, "new_sources");
    let admitted_bound = NEW_BURST as f64 + NEW_PER_SEC as f64 * elapsed;
    let unadmitted_passed = total(&after, "unadmitted_passed_bytes");
    let shared_bound = RATE_BPS as f64 / 8.0 * elapsed + BURST as f64;
    let flood_passed = unadmitted_passed + created * FLOOD_FRAME as u64;
    let bound = shared_bound + admitted_bound * FLOOD_FRAME as f64;
    println!(
        "flood: {created} keys admitted (bound {admitted_bound:.0}), {unadmitted_passed} unadmitted bytes passed (bound {shared_bound:.0}); {flood_passed} bytes passed in all of {} sent ({:.2}%), bound {bound:.0}",
        flood.sent_l2_bytes(),
        flood_passed as f64 * 100.0 / flood.sent_l2_bytes() as f64
    );
    assert!(created as f64 <= admitted_bound, "{created} keys admitted");
    assert!(created >= NEW_BURST, "the admission burst was not used");
    assert!(
        unadmitted_passed as f64 <= shared_bound,
        "unadmitted frames passed {unadmitted_passed} bytes"
    );
    // The shared cell did pass its share: most of the per-source rate over the flood.
    assert!(
        unadmitted_passed as f64 >= 0.9 * RATE_BPS as f64 / 8.0 * flood.offered_secs,
        "the unadmitted frames' cell passed only {unadmitted_passed} bytes"
    );
    assert!(
        flood.received_l2_bytes() as f64 <= bound,
        "the receiver saw {} flood bytes",
        flood.received_l2_bytes()
    );
    assert!(
        total(&after, "unadmitted_packets") + created >= flood.sent_packets * 9 / 10,
        "most flood frames were not seen by shaper"
    );
}

/// The README's warm start: attached with `--new-sources N --new-sources-burst B`, of K
/// sources that start at once the first B get cells at once and one more every 1/N s
/// after, each on its next frame; until then their frames share one cell at the
/// per-source rate and burst, so together they pass that rate (and drop the rest), while
/// a source with a cell of its own loses nothing. With the default admission (a whole
/// table at once), every source gets its cell at once and nothing is dropped.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_warm_start_is_admitted_as_the_readme_says() {
    const SOURCES: u8 = 32;
    const NEW_PER_SEC: u64 = 4;
    const NEW_BURST: u64 = 8;
    const SECONDS: u64 = 3;
    let lab = Lab::new("warm", 1).unwrap();
    // 32 sources at 1 Mbit/s each (an eighth of their limit): 32 Mbit/s in all.
    let flows: Vec<RawFlow> = (1..=SOURCES)
        .map(|i| flow(Ipv4Addr::new(198, 18, 9, i), &lab, FRAME, 1_000_000, false))
        .collect();

    for (args, admitted_all) in [
        (vec![], true),
        (
            vec!["--new-sources", "4", "--new-sources-burst", "8"],
            false,
        ),
    ] {
        let attached = if args.is_empty() {
            attach(lab.rx_ns(), lab.rx_iface(), RATE, BURST_ARG)
        } else {
            attach_with(lab.rx_ns(), lab.rx_iface(), RATE, BURST_ARG, &args)
        };
        let started = Instant::now();
        let results = run_raw(&lab, &flows, Duration::from_secs(SECONDS)).unwrap();
        let elapsed = started.elapsed().as_secs_f64();
        let st = stats(&lab);
        let created = total(&st, "new_sources");
        let dropped = total(&st, "dropped_packets");
        let unadmitted_passed = total(&st, "unadmitted_passed_bytes");
        let unadmitted_dropped = total(&st, "unadmitted_dropped_packets");
        println!(
            "{args:?}: {created} sources admitted in {elapsed:.2} s; unadmitted passed {unadmitted_passed} bytes, dropped {unadmitted_dropped} frames; admitted sources dropped {dropped}"
        );
        // A source with a cell of its own is never dropped: it sends far under its limit.
        assert_eq!(dropped, 0);
        if admitted_all {
            assert_eq!(created, u64::from(SOURCES));
            assert_eq!(total(&st, "unadmitted_packets"), 0);
            let sent: u64 = results.iter().map(|r| r.sent_packets).sum();
            assert_eq!(total(&st, "passed_packets"), sent);
        } else {
            // B at once, then N a second (each on its next frame, 8 ms apart at most).
            let most = NEW_BURST as f64 + NEW_PER_SEC as f64 * elapsed;
            let least = NEW_BURST as f64 + NEW_PER_SEC as f64 * (SECONDS as f64 - 0.5);
            assert!(
                (least..=most).contains(&(created as f64)),
                "{created} admitted, expected {least:.0}..={most:.0}"
            );
            // The rest share one cell: at most the rate and burst over the run, and at
            // least most of the rate, since they offer far more than it together.
            let bound = RATE_BPS as f64 / 8.0 * elapsed + BURST as f64;
            assert!(
                unadmitted_passed as f64 <= bound,
                "{unadmitted_passed} > {bound:.0}"
            );
            assert!(
                unadmitted_passed as f64 >= 0.9 * RATE_BPS as f64 / 8.0 * SECONDS as f64,
                "the shared cell passed only {unadmitted_passed} bytes"
            );
            assert!(unadmitted_dropped > 0);
        }
        drop(attached);
    }
}
