//! A spoofed flood through the real XDP program on a veth, with new-source admission: real
//! sources that were sending before the flood keep their cells and lose nothing to it, the
//! flood gets what one source gets plus a frame per admitted key, every frame is counted
//! once, and a warm start of many sources is admitted as the README says.
//!
//! Frames are written onto the veth with packet sockets ([`shaper_lab::lab::raw`]); the
//! flood is one raw flow whose every frame comes from a source never used before, sent flat
//! out, while the real sources are paced by real-time threads (so the flood's sender cannot
//! hold them up: see `lab::raw`).

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{net::Ipv4Addr, time::Duration};

use common::{assert_near, attach, attach_with, limit_gives, stats};
use shaper_lab::{
    frame,
    lab::{
        Lab,
        raw::{RawFlow, run_raw},
    },
};

const RATE_BPS: u64 = 8_000_000;
const RATE_BYTES: f64 = RATE_BPS as f64 / 8.0;
const RATE: &str = "8mbit";
const BURST: u64 = 32_768;
const BURST_ARG: &str = "32k";
/// Frames of the real sources.
const FRAME: usize = 1000;
/// Frames of the flood: the smallest Ethernet frame.
const FLOOD_FRAME: usize = 60;

/// How many keys an admission of `burst` keys and `per_sec` a second gives a stream of new
/// keys whose first frame came `first` seconds into the run and whose last came at `secs`:
/// the burst at once, then one key each time the bucket has room for one again.
fn admissions(burst: u64, per_sec: u64, first: f64, secs: f64) -> std::ops::RangeInclusive<u64> {
    let after = |t: f64| burst + (per_sec as f64 * t).floor() as u64;
    after(secs - first)..=after(secs)
}

/// What shaper should make of a flood, each frame from a new key, that sent `per_ms`
/// frames of `len` bytes in each millisecond (`RawResult::per_ms`): the admission
/// (`new_burst` keys at once, then `per_sec` a second) gives keys cells of their own, one
/// frame each, and the other frames share one bucket of `rate` bytes a second and `burst`
/// bytes; both full at the start. Returns (keys admitted, bytes the shared bucket passes).
///
/// A millisecond's frames are taken as arriving at its start, which moves either figure
/// by a millisecond's worth at most each time the flood stops or starts; the flood's
/// sender (at normal priority) may stall on a busy machine, and so the expectation follows
/// what it sent rather than how long.
fn flood_model(
    per_ms: &[u32],
    len: usize,
    (per_sec, new_burst): (u64, u64),
    (rate, burst): (f64, f64),
) -> (u64, f64) {
    let (mut keys, mut shared) = (0u64, 0.0);
    let (mut tokens, mut credit) = (new_burst as f64, burst);
    for (ms, &frames) in per_ms.iter().enumerate() {
        let dt = if ms == 0 { 0.0 } else { 1e-3 };
        tokens = (tokens + per_sec as f64 * dt).min(new_burst as f64);
        credit = (credit + rate * dt).min(burst);
        let admitted = (tokens.floor() as u64).min(u64::from(frames));
        tokens -= admitted as f64;
        keys += admitted;
        let passed = ((credit / len as f64).floor() as u64).min(u64::from(frames) - admitted);
        credit -= (passed * len as u64) as f64;
        shared += (passed * len as u64) as f64;
    }
    (keys, shared)
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
    // Short enough that the burst is more than 1% of what the over-limit source and the
    // shared cell pass (a burst given twice fails the checks).
    const SECONDS: u64 = 2;
    let lab = Lab::new("flood", 3).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let _attached = attach_with(ns, iface, RATE, BURST_ARG, &["--new-sources", "100"]);
    let s = lab.sources();
    // One source at twice its limit, two at half of it.
    let real = [
        flow(s[0], &lab, FRAME, 2 * RATE_BPS, false),
        flow(s[1], &lab, FRAME, RATE_BPS / 2, false),
        flow(s[2], &lab, FRAME, RATE_BPS / 2, false),
    ];
    // The real sources first, alone: they get their cells.
    let alone = run_raw(&lab, &real, Duration::from_secs(1)).unwrap();
    let before = stats(ns, iface);
    // Then the same sources through a flood of 60-byte frames, each from a new address,
    // as fast as one sender thread goes (about 700k frames a second here). The admission
    // and every bucket are full again by now: the first run made 3 keys a second ago.
    let flood_net = Ipv4Addr::new(10, 64, 0, 0);
    let mut flows = real.to_vec();
    flows.push(flow(flood_net, &lab, FLOOD_FRAME, 1_000_000_000, true));
    let run = run_raw(&lab, &flows, Duration::from_secs(SECONDS)).unwrap();
    let after = stats(ns, iface);
    let (with_flood, flood) = (&run.flows[..3], &run.flows[3]);
    println!(
        "flood: {} frames sent ({:.0}/s), {} reached the receiver",
        flood.sent_packets,
        flood.sent_packets as f64 / flood.offered_secs,
        flood.received_packets
    );

    // The lab did its part: the flood outran the shared cell many times over, the receiver
    // counted everything, and no real source's sender was held up for as long as the
    // burst lasts at the rate (a bucket refills to its burst in that time; a longer gap
    // would cost the over-limit source its share, and could make an under-limit source's
    // catch-up overflow its burst, for the generator's sake, not shaper's). The flood's
    // sender runs at normal priority and may stall on a busy machine: what shaper should
    // make of the flood follows what it sent, millisecond by millisecond.
    // (Thrice what its shared cell passes at the most: a sender on a busy machine of this
    // kind manages five to forty times that.)
    assert!(
        flood.sent_l2_bytes() as f64 >= 3.0 * (RATE_BYTES * flood.offered_secs + BURST as f64),
        "the flood was too weak to mean anything: {flood:?}"
    );
    assert_eq!(alone.receiver_drops, 0, "the receiver lost frames");
    assert_eq!(run.receiver_drops, 0, "the receiver lost frames");
    let refill_secs = BURST as f64 / RATE_BYTES;
    let gaps: Vec<String> = run
        .flows
        .iter()
        .map(|r| format!("{:.1}", r.max_gap_secs * 1e3))
        .collect();
    println!(
        "longest gaps in ms (the real sources', the flood's): {}; the bucket refills in {:.1}",
        gaps.join(", "),
        refill_secs * 1e3
    );
    for r in alone.flows.iter().chain(with_flood) {
        assert!(
            r.max_gap_secs < refill_secs,
            "a sender stalled for {:.1} ms (the lab, not shaper: a busy machine?): {r:?}",
            r.max_gap_secs * 1e3
        );
    }

    for (i, &src) in s.iter().enumerate() {
        let (was, now) = (before.key(src), after.key(src));
        let sent = alone.flows[i].sent_packets + with_flood[i].sent_packets;
        let received = alone.flows[i].received_packets + with_flood[i].received_packets;
        println!("{src}: sent {sent}, received {received}, {now:?}");
        // The cell survived: its counters went on from where they were, and hold every
        // frame shaper saw of it (a new cell would have started again from zero).
        assert!(now.kept(&was), "{src} was reset: {was:?}, then {now:?}");
        assert_eq!(now.packets(), sent, "{src}: frames sent but not metered");
        assert_eq!(
            now.passed_packets, received,
            "{src}: the receiver saw other than what shaper passed"
        );
        if i == 0 {
            // Over its limit: the flood changes nothing of its rate. From a full bucket
            // (idle between the runs), shaper's own count of the second run.
            let passed = now.passed_bytes - was.passed_bytes;
            let expected = limit_gives(RATE_BPS, BURST, &[&with_flood[0]]);
            assert_near(
                &format!("{src}, over its limit, passed during the flood"),
                passed as f64,
                expected,
                BURST as f64,
            );
        } else {
            // Under its limit: nothing dropped.
            assert_eq!(now.dropped_packets, 0, "{src} lost frames to shaper");
        }
    }

    // The flood: the admission's keys got cells, one frame each, and all its other frames
    // shared one cell at the per-source limit.
    let created = after.total("new_sources") - before.total("new_sources");
    let flood_keys: Vec<_> = after
        .keys()
        .filter(|&(key, _)| !s.iter().any(|src| src.to_string() == key))
        .collect();
    // What the admission and the shared cell make of the flood as it was sent (at full
    // speed, the admission's burst and rate over the run, and the cell's burst and rate).
    let (model_keys, model_shared) = flood_model(
        &flood.per_ms,
        FLOOD_FRAME,
        (NEW_PER_SEC, NEW_BURST),
        (RATE_BYTES, BURST as f64),
    );
    println!(
        "flood: {created} keys admitted, {model_keys} expected ({:.0} at full speed)",
        NEW_BURST as f64 + NEW_PER_SEC as f64 * flood.offered_secs
    );
    assert_eq!(flood_keys.len() as u64, created, "keys made but not listed");
    assert!(
        created.abs_diff(model_keys) <= 1,
        "{created} keys admitted, expected {model_keys}"
    );
    // The flood's sources count up from its frame's own, one per frame.
    // (per attempt: a refused send uses its source too).
    let flood_sources = u32::from(flood_net)..u32::from(flood_net) + flood.attempted_packets as u32;
    for &(key, counts) in &flood_keys {
        assert!(
            key.parse::<Ipv4Addr>()
                .is_ok_and(|a| flood_sources.contains(&u32::from(a))),
            "{key} is not a flood source"
        );
        // No source repeats within the flood: each key sent one frame, which its fresh
        // bucket passed.
        assert_eq!(
            (counts.passed_packets, counts.packets()),
            (1, 1),
            "{key}: {counts:?}"
        );
    }
    assert_eq!(before.total("unadmitted_packets"), 0);
    let unadmitted_passed = after.total("unadmitted_passed_bytes");
    println!(
        "the shared cell at full speed: {:.0} bytes",
        RATE_BYTES * flood.offered_secs + BURST as f64
    );
    assert_near(
        "the unadmitted flood frames' shared cell passed",
        unadmitted_passed as f64,
        model_shared,
        BURST as f64,
    );
    assert_eq!(
        flood.received_l2_bytes(),
        unadmitted_passed + created * FLOOD_FRAME as u64,
        "the receiver saw other flood frames than shaper passed"
    );

    // Every frame sent was metered, exactly once: by a real source's cell, an admitted
    // key's, or the shared cell.
    let sent_packets: u64 = alone
        .flows
        .iter()
        .chain(&run.flows)
        .map(|r| r.sent_packets)
        .sum();
    let sent_bytes: u64 = alone
        .flows
        .iter()
        .chain(&run.flows)
        .map(|r| r.sent_l2_bytes())
        .sum();
    let metered = |unit: &str| {
        ["passed", "dropped", "would_drop", "unadmitted"]
            .iter()
            .map(|kind| after.total(&format!("{kind}_{unit}")))
            .sum::<u64>()
    };
    assert_eq!(
        (metered("packets"), metered("bytes")),
        (sent_packets, sent_bytes),
        "frames metered against frames sent"
    );
    assert_eq!(after.total("ipv4_packets"), sent_packets);
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
    /// Each source sends its first frame one frame's time (8 ms) into the run.
    const FIRST_FRAME_SECS: f64 = FRAME as f64 * 8.0 / 1e6;
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
        let run = run_raw(&lab, &flows, Duration::from_secs(SECONDS)).unwrap();
        assert_eq!(run.receiver_drops, 0, "the receiver lost frames");
        // The shared cell is fed by all the waiting sources together: a sender held up
        // alone costs it nothing, but all of them at once (a machine too busy to run
        // them) for longer than its burst lasts would.
        let mut per_ms: Vec<u32> = Vec::new();
        for r in &run.flows {
            per_ms.resize(per_ms.len().max(r.per_ms.len()), 0);
            for (all, n) in per_ms.iter_mut().zip(&r.per_ms) {
                *all += n;
            }
        }
        let silent_ms = per_ms
            .split(|&n| n != 0)
            .map(<[u32]>::len)
            .max()
            .unwrap_or(0);
        assert!(
            (silent_ms as f64) < 1e3 * BURST as f64 / (RATE_BPS as f64 / 8.0),
            "no source sent for {silent_ms} ms (the lab, not shaper: a busy machine?)"
        );
        let secs = run.flows.iter().map(|r| r.offered_secs).fold(0.0, f64::max);
        let st = stats(lab.rx_ns(), lab.rx_iface());
        let created = st.total("new_sources");
        let dropped = st.total("dropped_packets");
        let unadmitted_passed = st.total("unadmitted_passed_bytes");
        let unadmitted_dropped = st.total("unadmitted_dropped_packets");
        println!(
            "{args:?}: {created} sources admitted in {secs:.3} s; unadmitted passed {unadmitted_passed} bytes, dropped {unadmitted_dropped} frames; admitted sources dropped {dropped}"
        );
        // A source with a cell of its own is never dropped: it sends far under its limit.
        assert_eq!(dropped, 0);
        let sent: u64 = run.flows.iter().map(|r| r.sent_packets).sum();
        let received: u64 = run.flows.iter().map(|r| r.received_packets).sum();
        if admitted_all {
            assert_eq!(created, u64::from(SOURCES));
            assert_eq!(st.total("unadmitted_packets"), 0);
            assert_eq!(st.total("passed_packets"), sent);
            assert_eq!(received, sent);
        } else {
            // B at once, then N a second, each on its next frame (the 24 waiting sources
            // send a frame every 0.3 ms between them, the first 8 ms into the run).
            let admitted = admissions(NEW_BURST, NEW_PER_SEC, FIRST_FRAME_SECS, secs);
            assert!(
                admitted.contains(&created),
                "{created} admitted, expected {admitted:?}"
            );
            // The rest share one cell, overloaded all along from their first frames (the
            // 12 still waiting at the end offer 12 Mbit/s): it passes the burst and the
            // rate from then on.
            assert_near(
                "the unadmitted sources' shared cell passed",
                unadmitted_passed as f64,
                RATE_BPS as f64 / 8.0 * (secs - FIRST_FRAME_SECS) + BURST as f64,
                BURST as f64,
            );
            assert!(unadmitted_dropped > 0);
            // Every frame was metered once, and what passed arrived.
            assert_eq!(
                st.total("passed_packets") + st.total("unadmitted_packets"),
                sent
            );
            assert_eq!(
                received,
                st.total("passed_packets") + st.total("unadmitted_passed_packets")
            );
        }
        drop(attached);
    }
}
