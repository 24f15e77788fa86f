//! Live traffic of every kind the parser handles, through the real XDP program on a veth:
//! IPv6 sources, VLAN and QinQ tagged frames keyed by their inner address, a /24 aggregate
//! key, and jumbo frames charged their full length.
//!
//! This kernel has no 802.1Q VLAN devices (CONFIG_VLAN_8021Q is off), so tagged traffic is
//! written onto the veth with packet sockets ([`shaper_lab::lab::raw`]) and counted at the
//! receiving veth the same way.
//!
//! As live_rate.rs does, each overloaded key's bytes are the kernel's exact count, checked
//! against a GCRA replay of every recorded send and against rate x the kernel's receive
//! window + burst as an upper bound ([`assert_limited`]).

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use common::{Received, Recorded, assert_limited, attach, attach_with, replay, stats};
use shaper_lab::{
    frame,
    lab::{
        Flow, FlowResult, Lab, LabOptions, Late, RunOptions,
        raw::{RawFlow, RawOptions, Sources, run_raw_with},
        run_udp_with,
    },
};

const RATE_BPS: u64 = 8_000_000;
const RATE: &str = "8mbit";
const BURST: u64 = 65_536;
const BURST_ARG: &str = "64k";
const SECONDS: u64 = 3;

/// What one key of `flow` (overloaded: it sent half again what the limit passes of it)
/// received, `delivered`, against what a bucket of `rate_bps` and [`BURST`] passes of
/// its sends ([`assert_limited`]).
fn assert_held<R: Received + Recorded>(what: &str, delivered: u64, rate_bps: u64, flow: &R) {
    let limit = (rate_bps, BURST);
    let replayed = replay(&[flow], Some(limit), None)[0];
    let sent = flow.send_offsets().len() as u64 * flow.frame_bytes();
    assert!(
        sent > 3 * replayed / 2,
        "{what}: sent {sent} bytes, not overloaded"
    );
    assert_limited(
        &format!("{what} received"),
        delivered,
        replayed,
        limit,
        &[flow],
    );
}

/// UDP traffic through the lab, all of it counted by the receiver, every send's time kept
/// ([`replay`]).
fn run_udp(lab: &Lab, flows: &[Flow]) -> Vec<FlowResult> {
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(lab, flows, Duration::from_secs(SECONDS), &options).unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    report.flows
}

fn overload(srcs: &[IpAddr], frame_bytes: u32) -> Vec<Flow> {
    srcs.iter()
        .map(|&src| Flow {
            src,
            offered_bps: 2 * RATE_BPS,
            frame_bytes,
        })
        .collect()
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn ipv6_sources_are_held_to_the_limit() {
    let options = LabOptions {
        ipv6: true,
        ..LabOptions::default()
    };
    let lab = Lab::with("live6", 3, options).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), RATE, BURST_ARG);
    let srcs: Vec<IpAddr> = lab.sources6().iter().map(|&a| a.into()).collect();
    let results = run_udp(&lab, &overload(&srcs, 1000));
    let st = stats(lab.rx_ns(), lab.rx_iface());
    for r in &results {
        assert_held(&r.src.to_string(), r.received_l2_bytes, RATE_BPS, r);
        // Each source is its own /64 (the default IPv6 key) and shaper saw the same bytes.
        let IpAddr::V6(a) = r.src else { unreachable!() };
        let seg = a.segments();
        let prefix = format!("{:x}:{:x}:{:x}:{:x}::/64", seg[0], seg[1], seg[2], seg[3]);
        assert_eq!(
            st.key(&prefix).passed_bytes,
            r.received_l2_bytes,
            "{prefix}"
        );
    }
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn vlan_and_qinq_frames_are_held_by_inner_address() {
    const FRAME: usize = 1000;
    let lab = Lab::new("livevlan", 4).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), RATE, BURST_ARG);
    let inner = |src: Ipv4Addr| frame::ipv4_udp_to(src, lab.rx_addr(), FRAME - 4);
    let qinq_inner = |src: Ipv4Addr| frame::ipv4_udp_to(src, lab.rx_addr(), FRAME - 8);
    let s = lab.sources();
    // Two sources in 802.1Q VLAN 100, two in QinQ (802.1ad 10, then 802.1Q 20); every
    // frame is FRAME bytes with its tags.
    let frames = [
        frame::with_vlan(&inner(s[0]), 0x8100, 100),
        frame::with_vlan(&inner(s[1]), 0x8100, 100),
        frame::with_vlan(&frame::with_vlan(&qinq_inner(s[2]), 0x8100, 20), 0x88a8, 10),
        frame::with_vlan(&frame::with_vlan(&qinq_inner(s[3]), 0x8100, 20), 0x88a8, 10),
    ];
    let flows: Vec<RawFlow> = frames
        .iter()
        .map(|f| {
            assert_eq!(f.len(), FRAME);
            RawFlow {
                sources: Sources::One,
                late: Late::CatchUp,
                frame: f.clone(),
                offered_bps: 2 * RATE_BPS,
            }
        })
        .collect();
    let options = RawOptions { record_sends: true };
    let run = run_raw_with(&lab, &flows, Duration::from_secs(SECONDS), &options).unwrap();
    assert_eq!(run.receiver_drops, 0, "the receiver lost frames");
    let st = stats(lab.rx_ns(), lab.rx_iface());
    for (src, r) in s.iter().zip(&run.flows) {
        assert!(r.sent_packets > 0, "{src}: {r:?}");
        assert_held(&src.to_string(), r.received_l2_bytes(), RATE_BPS, r);
        // Charged to the inner source address, with the tags' bytes.
        assert_eq!(st.key(src).passed_bytes, r.received_l2_bytes(), "{src}");
    }
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_24_prefix_holds_four_sources_to_one_limit() {
    const AGGREGATE_BPS: u64 = 10_000_000;
    let lab = Lab::new("live24", 4).unwrap();
    let _attached = attach_with(
        lab.rx_ns(),
        lab.rx_iface(),
        "10mbit",
        BURST_ARG,
        &["--prefix-v4", "24"],
    );
    let srcs: Vec<IpAddr> = lab.sources().iter().map(|&a| a.into()).collect();
    // Each offers 8 mbit: 32 mbit against one 10 mbit bucket.
    let results = run_udp(&lab, &overload(&srcs, 1000));
    let delivered: u64 = results.iter().map(|r| r.received_l2_bytes).sum();
    let all: Vec<&FlowResult> = results.iter().collect();
    // One bucket for all four: the replay's aggregate over every send of the four.
    let limit = (AGGREGATE_BPS, BURST);
    let replayed = replay(&all, None, Some(limit)).iter().sum();
    assert_limited("198.18.0.0/24 received", delivered, replayed, limit, &all);
    let st = stats(lab.rx_ns(), lab.rx_iface());
    let keys: Vec<_> = st.keys().collect();
    assert_eq!(keys.len(), 1, "one key for the /24: {keys:?}");
    assert_eq!(keys[0].0, "198.18.0.0/24");
    assert_eq!(keys[0].1.passed_bytes, delivered);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn jumbo_frames_are_charged_their_full_length() {
    const JUMBO: u32 = 9014;
    let lab = Lab::new("livejumbo", 2).unwrap();
    lab.set_mtu(9000).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), RATE, BURST_ARG);
    let s = lab.sources();
    let flows = [
        // Overloaded: held to the limit in full-frame bytes.
        Flow {
            src: s[0].into(),
            offered_bps: 2 * RATE_BPS,
            frame_bytes: JUMBO,
        },
        // Below the limit: everything passes, each frame charged 9014 bytes.
        Flow {
            src: s[1].into(),
            offered_bps: RATE_BPS / 2,
            frame_bytes: JUMBO,
        },
    ];
    let results = run_udp(&lab, &flows);
    let st = stats(lab.rx_ns(), lab.rx_iface());
    let passed = |src: IpAddr| st.key(src).passed_bytes;
    let hot = &results[0];
    assert_held("jumbo, overloaded,", hot.received_l2_bytes, RATE_BPS, hot);
    assert_eq!(passed(hot.src), hot.received_l2_bytes);
    let quiet = &results[1];
    assert!(quiet.sent_packets > 0);
    assert_eq!(quiet.received_packets, quiet.sent_packets);
    assert_eq!(passed(quiet.src), quiet.received_packets * u64::from(JUMBO));
}
