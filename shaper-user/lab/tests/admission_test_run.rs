//! New-source admission in the real kernel through BPF_PROG_TEST_RUN: a flood of frames
//! from distinct sources creates at most `burst + N × elapsed` cells, its unadmitted
//! frames share one cell, a source tracked before the flood gets exactly the verdicts it
//! would get without it, and every frame is counted once.
//!
//! The per-source rate is the slowest there is (8 bit/s, one byte a second), so a cell
//! refills less than a frame's worth while a test runs: what a cell lets through is its
//! burst, exactly, and the bounds below are tight.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use shaper_common::{
    config::PolicyLimits,
    gcra::MIN_RATE_BPS,
    maps::{ACTION_LIMIT, Admission, Config, Counters, MODE_MONITOR},
};
use shaper_lab::{
    frame,
    testrun::{Harness, XDP_DROP, XDP_PASS},
};
use shaper_user::policy::{PolicySpec, parse_prefix};

/// Bytes of every frame (the smallest Ethernet frame without FCS).
const FRAME: u64 = 60;
/// Per-source burst: ten frames.
const BURST: u64 = 10 * FRAME;
/// Distinct flood sources, one frame each.
const FLOOD: u32 = 100_000;
/// Admission: keys a second, and at once.
const NEW_PER_SEC: u64 = 100;
const NEW_BURST: u64 = 50;

fn admitting(n: u64, burst: u64) -> Config {
    Config {
        admission: Admission::new(n, burst).unwrap(),
        ..Config::per_source(MIN_RATE_BPS, BURST).unwrap()
    }
}

/// A 60-byte frame from `src`.
fn frame_from(src: Ipv4Addr) -> Vec<u8> {
    frame::ipv4_udp(src, FRAME as usize)
}

/// The `i`th flood source, in 10.64.0.0/10 (far from the real ones in 198.18.0.0/15).
fn flood_source(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i)
}

fn passes(h: &mut Harness, f: &[u8]) -> bool {
    match h.run(f).expect("test_run") {
        XDP_PASS => true,
        XDP_DROP => false,
        v => panic!("verdict {v}"),
    }
}

/// What a flood run saw.
struct Flood {
    /// Verdicts of the known source's frames, sent one every `every` flood frames.
    known: Vec<bool>,
    flood_passed: u64,
}

/// Sends `FLOOD` frames from distinct sources, with a frame of `known` after every
/// `every` of them.
fn flood(h: &mut Harness, known: Ipv4Addr, every: u32) -> Flood {
    let known_frame = frame_from(known);
    let mut verdicts = Vec::new();
    let mut flood_passed = 0;
    for i in 0..FLOOD {
        if passes(h, &frame_from(flood_source(i))) {
            flood_passed += 1;
        }
        if i % every == 0 {
            verdicts.push(passes(h, &known_frame));
        }
    }
    Flood {
        known: verdicts,
        flood_passed,
    }
}

/// Every frame is counted exactly once: as passed, dropped or would drop by a tracked
/// key, or as unadmitted (all frames here are IPv4 and parse).
fn assert_balanced(c: &Counters, frames: u64) {
    let u = &c.unadmitted;
    assert_eq!(
        c.outcomes.passed_packets
            + c.outcomes.dropped_packets
            + c.outcomes.would_drop_packets
            + u.packets(),
        frames,
        "packets"
    );
    assert_eq!(
        c.outcomes.passed_bytes
            + c.outcomes.dropped_bytes
            + c.outcomes.would_drop_bytes
            + u.bytes(),
        frames * FRAME,
        "bytes"
    );
    let unparsed = c.not_ip_packets
        + c.pppoe_other_packets
        + c.vlan_too_deep_packets
        + c.malformed_packets
        + c.unconfigured_packets
        + c.untracked_packets;
    assert_eq!(unparsed, 0);
    assert_eq!(c.ipv4_packets, frames);
}

/// The most keys admission lets in over `elapsed`.
fn admitted_bound(n: u64, burst: u64, elapsed: Duration) -> u64 {
    burst + (n as f64 * elapsed.as_secs_f64()).ceil() as u64
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_flood_of_new_sources_gets_one_cell_and_leaves_known_sources_alone() {
    let known = Ipv4Addr::new(198, 18, 0, 7);
    let mut h = Harness::new(Some(&admitting(NEW_PER_SEC, NEW_BURST)), 65_536).unwrap();
    // The known source is tracked before the flood: its first frame takes one admission.
    let start = Instant::now();
    assert!(passes(&mut h, &frame_from(known)));
    let with = flood(&mut h, known, 1000);
    let elapsed = start.elapsed();

    // The same known source, the same frames, no flood.
    let mut twin = Harness::new(Some(&admitting(NEW_PER_SEC, NEW_BURST)), 65_536).unwrap();
    assert!(passes(&mut twin, &frame_from(known)));
    let without: Vec<bool> = (0..with.known.len())
        .map(|_| passes(&mut twin, &frame_from(known)))
        .collect();
    assert_eq!(
        with.known, without,
        "the flood changed a known source's verdicts"
    );
    assert_eq!(
        with.known.iter().filter(|&&p| p).count() as u64,
        BURST / FRAME - 1,
        "the known source gets its burst, less the frame it was tracked with"
    );

    let c = h.counters().unwrap();
    // Cells: at most the admission burst plus its rate over the run (the known source's
    // included), and at least the burst, which is admitted at once.
    let created = c.new_sources;
    let bound = admitted_bound(NEW_PER_SEC, NEW_BURST, elapsed);
    assert!(
        (NEW_BURST..=bound).contains(&created),
        "{created} cells created in {elapsed:?}, admission allows {NEW_BURST}..={bound}"
    );
    assert_eq!(h.sources().unwrap().len() as u64, created);
    // Each admitted flood key passes its one frame (a new cell holds a whole burst).
    let admitted_flood = created - 1;
    assert_eq!(
        c.outcomes.passed_packets,
        admitted_flood + 1 + BURST / FRAME - 1
    );
    // All unadmitted frames share one cell at the per-source limit: its burst passes, and
    // at one byte a second nothing more refills while the test runs.
    let refill = (MIN_RATE_BPS / 8) as f64 * elapsed.as_secs_f64();
    let u = c.unadmitted;
    assert_eq!(u.packets(), u64::from(FLOOD) - admitted_flood);
    assert!(
        u.passed_bytes as f64 <= BURST as f64 + refill,
        "unadmitted passed {} bytes, the shared cell allows {BURST} + {refill:.0}",
        u.passed_bytes
    );
    assert_eq!(u.passed_packets, BURST / FRAME, "the shared cell's burst");
    assert_eq!(u.would_drop_packets, 0);
    assert_eq!(with.flood_passed, admitted_flood + u.passed_packets);
    assert_balanced(&c, 1 + u64::from(FLOOD) + with.known.len() as u64);
    // The default policy's counters say the same.
    let p = h.policies().stats(0).unwrap();
    assert_eq!((p.unadmitted, p.new_sources), (u, created));
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn without_admission_every_new_source_gets_a_cell() {
    let mut h = Harness::new(
        Some(&Config::per_source(MIN_RATE_BPS, BURST).unwrap()),
        65_536,
    )
    .unwrap();
    let n = 5_000;
    let passed = (0..n)
        .filter(|&i| passes(&mut h, &frame_from(flood_source(i))))
        .count();
    assert_eq!(passed, n as usize);
    let c = h.counters().unwrap();
    assert_eq!(c.new_sources, u64::from(n));
    assert_eq!(c.unadmitted, Default::default());
    assert_balanced(&c, u64::from(n));
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn each_policy_admits_and_meters_its_own_newcomers() {
    let mut h = Harness::new(Some(&admitting(NEW_PER_SEC, NEW_BURST)), 65_536).unwrap();
    let flooded = PolicySpec {
        prefix: parse_prefix("10.64.0.0/10").unwrap(),
        limits: PolicyLimits {
            action: ACTION_LIMIT,
            rate_bps: MIN_RATE_BPS,
            burst_bytes: 3 * FRAME,
            new_sources: 1,
            new_sources_burst: 5,
            ..PolicyLimits::default()
        },
    };
    let monitored = PolicySpec {
        prefix: parse_prefix("10.128.0.0/16").unwrap(),
        limits: PolicyLimits {
            mode: MODE_MONITOR,
            ..flooded.limits
        },
    };
    h.policies().replace_all(&[flooded, monitored]).unwrap();
    let slot_of = |h: &mut Harness, spec: &PolicySpec| {
        h.policies()
            .list()
            .unwrap()
            .into_iter()
            .find(|i| i.spec.prefix == spec.prefix)
            .unwrap()
            .slot
    };
    let start = Instant::now();
    let n = 2_000;
    let passed = (0..n)
        .filter(|&i| passes(&mut h, &frame_from(flood_source(i))))
        .count() as u64;
    let elapsed = start.elapsed();
    let slot = slot_of(&mut h, &flooded);
    let s = h.policies().stats(slot).unwrap();
    assert!(
        (5..=admitted_bound(1, 5, elapsed)).contains(&s.new_sources),
        "{} keys admitted under the policy in {elapsed:?}",
        s.new_sources
    );
    // The policy's unadmitted frames share its cell: its 3-frame burst.
    assert_eq!(s.unadmitted.passed_packets, 3);
    assert_eq!(passed, s.new_sources + 3);
    assert_eq!(s.unadmitted.packets(), u64::from(n) - s.new_sources);

    // The default's admission is untouched by the policy's flood: a newcomer there still
    // gets a cell, and the default's shared cell has seen nothing.
    assert!(passes(&mut h, &frame_from(Ipv4Addr::new(198, 18, 0, 1))));
    let d = h.policies().stats(0).unwrap();
    assert_eq!((d.new_sources, d.unadmitted.packets()), (1, 0));

    // Monitor: the same flood passes whole, and what enforcement would drop is counted.
    let m0 = u32::from(Ipv4Addr::new(10, 128, 0, 0)) - u32::from(Ipv4Addr::new(10, 64, 0, 0));
    let passed = (m0..m0 + n)
        .filter(|&i| passes(&mut h, &frame_from(flood_source(i))))
        .count();
    assert_eq!(passed, n as usize);
    let slot = slot_of(&mut h, &monitored);
    let m = h.policies().stats(slot).unwrap();
    assert_eq!(m.unadmitted.dropped_packets, 0);
    assert_eq!(m.unadmitted.passed_packets, 3);
    assert_eq!(
        m.unadmitted.would_drop_packets,
        u64::from(n) - m.new_sources - 3
    );
    assert_balanced(&h.counters().unwrap(), 2 * u64::from(n) + 1);

    // A change of the default (as `attach` on a live attachment makes) keeps the prefix
    // counts that let a newcomer skip the trie: newcomers still find their policy.
    h.configure(&admitting(2 * NEW_PER_SEC, NEW_BURST)).unwrap();
    let slot = slot_of(&mut h, &flooded);
    let before = h.policies().stats(slot).unwrap();
    passes(&mut h, &frame_from(flood_source(n)));
    let after = h.policies().stats(slot).unwrap();
    assert_eq!(
        after.unadmitted.packets() + after.new_sources,
        before.unadmitted.packets() + before.new_sources + 1
    );
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn policies_without_an_admission_of_their_own_share_the_interfaces() {
    let mut h = Harness::new(Some(&admitting(NEW_PER_SEC, NEW_BURST)), 65_536).unwrap();
    let sharing = PolicySpec {
        prefix: parse_prefix("10.64.0.0/10").unwrap(),
        limits: PolicyLimits {
            action: ACTION_LIMIT,
            rate_bps: MIN_RATE_BPS,
            burst_bytes: 3 * FRAME,
            ..PolicyLimits::default()
        },
    };
    h.policies().replace_all(&[sharing]).unwrap();
    let slot = h.policies().list().unwrap()[0].slot;
    let start = Instant::now();
    let n = 2_000;
    for i in 0..n {
        passes(&mut h, &frame_from(flood_source(i)));
    }
    let elapsed = start.elapsed();
    let s = h.policies().stats(slot).unwrap();
    assert!(
        (NEW_BURST..=admitted_bound(NEW_PER_SEC, NEW_BURST, elapsed)).contains(&s.new_sources),
        "{} keys admitted under the policy in {elapsed:?}",
        s.new_sources
    );
    // Its unadmitted frames share the policy's own cell, at the policy's limit.
    assert_eq!(s.unadmitted.passed_packets, 3);
    assert_eq!(s.unadmitted.packets(), u64::from(n) - s.new_sources);
    // The interface's admission is what the policy used up: a newcomer under the
    // default is refused a cell too (and metered in the default's own shared cell).
    assert!(passes(&mut h, &frame_from(Ipv4Addr::new(198, 18, 0, 1))));
    let d = h.policies().stats(0).unwrap();
    assert_eq!((d.new_sources, d.unadmitted.passed_packets), (0, 1));
}
