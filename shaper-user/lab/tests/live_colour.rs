//! The second meter on live traffic through the real XDP program, counted at the receiver
//! by DSCP: a source over both rates of a two-rate three-colour profile receives its
//! committed rate and burst unmarked and its excess rate and burst marked; a source under
//! a packet rate receives the packet rate and burst, whatever its byte rate.
//!
//! As live_rate.rs does, each count is checked twice: against what the kernel counted
//! (exact), and against a GCRA replay of every recorded send, which a loaded machine's
//! stalled senders move as they move the kernel; then against rate × the kernel's
//! receive window (`SO_TIMESTAMPNS`) + burst, within ±1% or half a burst, whichever is
//! smaller.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::time::Duration;

use common::{attach_with, limit_gives, replay_colour, shaper_ok, stats};
use serde_json::Value;
use shaper_lab::lab::{Lab, RunOptions, run_udp_with, traffic::DscpCount};

/// `got` against rate × the receive window of `frames` (those of one colour: the excess
/// meter passes nothing until the committed burst is spent) + burst, within ±1% or half
/// a burst, whichever is smaller.
fn assert_bound(what: &str, got: u64, rate_bps: u64, burst: u64, frames: &DscpCount) {
    let bound = limit_gives(rate_bps, burst, &[frames]);
    let tolerance = (0.01 * bound).min(burst as f64 / 2.0);
    let off = got as f64 - bound;
    let span = frames
        .last_received_ns
        .saturating_sub(frames.first_received_ns) as f64
        / 1e9;
    println!(
        "{what}: {got} against rate x {span:.3} s + burst = {bound:.0} ({off:+.0}, {:+.3}%; tolerance ±{tolerance:.0})",
        100.0 * off / bound
    );
    assert!(
        off.abs() <= tolerance,
        "{what}: {got} is {off:+.0} from {bound:.0}, rate x received span + burst, beyond ±{tolerance:.0}"
    );
}

/// The default policy's row of `policy list -j`.
fn default_row(ns: &str, iface: &str) -> Value {
    let list: Value =
        serde_json::from_str(&shaper_ok(ns, &["-j", "policy", "list", iface])).unwrap();
    list[0].clone()
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_source_over_both_rates_receives_cir_unmarked_and_eir_marked() {
    const CIR_BPS: u64 = 8_000_000;
    // Bursts of 131 ms at the rates: a sender stalled for less loses nothing (a bucket
    // full for longer refills no more), which keeps a loaded machine's stalls out of the
    // bound below; its tolerance (1%, 50 kB) is still well under a burst.
    const CBS: u64 = 131_072;
    const EIR_BPS: u64 = CIR_BPS;
    const EBS: u64 = 131_072;
    /// DSCP cs1.
    const MARK: u8 = 8;
    const FRAME: u32 = 1_000;
    let lab = Lab::new("colr", 1).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let _attached = attach_with(
        ns,
        iface,
        "8mbit",
        "128k",
        &[
            "--excess-rate",
            "8mbit",
            "--excess-burst",
            "128k",
            "--excess-dscp",
            "cs1",
        ],
    );
    let flows = lab.flows(&[3 * CIR_BPS], FRAME);
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(&lab, &flows, Duration::from_secs(5), &options).unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    let r = &report.flows[0];
    let unmarked = r.received_by_dscp.get(&0).copied().unwrap_or_default();
    let marked = r.received_by_dscp.get(&MARK).copied().unwrap_or_default();
    println!(
        "{}: offered {:.2} Mbit/s for {:.3} s; received by DSCP {:?}",
        r.src,
        r.sent_bps() / 1e6,
        r.offered_secs,
        r.received_by_dscp
    );
    assert_eq!(
        unmarked.packets + marked.packets,
        r.received_packets,
        "frames arrived with another DSCP"
    );

    // What the kernel counted: everything it passed arrived, the yellow marked.
    let key = stats(ns, iface).key(r.src);
    assert_eq!(key.passed_bytes, r.received_l2_bytes);
    let row = default_row(ns, iface);
    assert_eq!(n(&row, "yellow_packets"), marked.packets, "{row}");
    assert_eq!(n(&row, "yellow_bytes"), marked.l2_bytes, "{row}");

    // What the profile passes of the same sends.
    let (green, yellow) = replay_colour(r, (CIR_BPS, CBS), Some((EIR_BPS, EBS)), None);
    let frame = u64::from(FRAME);
    for (what, got, replayed, burst) in [
        ("green", unmarked.l2_bytes, green * frame, CBS),
        ("yellow", marked.l2_bytes, yellow * frame, EBS),
    ] {
        let off = got as f64 - replayed as f64;
        println!("{what}: {got} bytes against {replayed} replayed ({off:+.0})");
        assert!(
            off.abs() <= burst as f64 / 4.0,
            "{what}: {got} is {off:+.0} bytes from {replayed}, what the profile passes of the same sends"
        );
    }
    // It really was over both: a third of what it sent is red.
    assert!(r.sent_l2_bytes > r.received_l2_bytes * 4 / 3);
    assert_bound(
        "unmarked (CIR x t + CBS)",
        unmarked.l2_bytes,
        CIR_BPS,
        CBS,
        &unmarked,
    );
    assert_bound(
        "marked (EIR x t + EBS)",
        marked.l2_bytes,
        EIR_BPS,
        EBS,
        &marked,
    );
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_packet_rate_limited_source_of_small_frames_receives_the_packet_rate() {
    const PACKET_RATE: u64 = 2_000;
    /// 200 ms at the rate (see the bursts above); 1% is 105 frames.
    const PACKET_BURST: u64 = 400;
    /// Far above what the frames make: only the packet rate refuses.
    const RATE_BPS: u64 = 100_000_000;
    const BURST: u64 = 65_536;
    const FRAME: u32 = 64;
    let lab = Lab::new("colp", 1).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let _attached = attach_with(
        ns,
        iface,
        "100mbit",
        "64k",
        &["--packet-rate", "2k", "--packet-burst", "400"],
    );
    // Three times the packet rate: 6,000 frames a second, 3 Mbit/s.
    let offered = 3 * PACKET_RATE * u64::from(FRAME) * 8;
    let flows = lab.flows(&[offered], FRAME);
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(&lab, &flows, Duration::from_secs(5), &options).unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    let r = &report.flows[0];
    println!(
        "{}: sent {} frames in {:.3} s, received {}",
        r.src, r.sent_packets, r.offered_secs, r.received_packets
    );

    // What the kernel counted: what it passed arrived; what it refused is the packet
    // rate's.
    let key = stats(ns, iface).key(r.src);
    assert_eq!(key.passed_packets, r.received_packets);
    let row = default_row(ns, iface);
    assert_eq!(
        n(&row, "packet_rate_refused_packets"),
        key.dropped_packets,
        "{row}"
    );
    assert!(key.dropped_packets > r.sent_packets / 2, "{row}");

    let (passed, yellow) = replay_colour(
        r,
        (RATE_BPS, BURST),
        None,
        Some((PACKET_RATE, PACKET_BURST)),
    );
    assert_eq!(yellow, 0);
    let off = r.received_packets as f64 - passed as f64;
    println!(
        "received {} frames against {passed} replayed ({off:+.0})",
        r.received_packets
    );
    assert!(
        off.abs() <= PACKET_BURST as f64 / 4.0,
        "{} frames is {off:+.0} from {passed}, what the packet rate passes of the same sends",
        r.received_packets
    );
    // packet rate x t + packet burst, within ±1%: a frame a byte at 8 x the rate.
    let bound = limit_gives(8 * PACKET_RATE, PACKET_BURST, &[r]);
    let got = r.received_packets as f64;
    let off = got - bound;
    println!(
        "received {got} frames against packet rate x {:.3} s + burst = {bound:.0} ({:+.3}%)",
        r.received_span_secs(),
        100.0 * off / bound
    );
    assert!(
        off.abs() <= 0.01 * bound,
        "{got} frames is {off:+.0} from {bound:.0}, packet rate x received span + burst, beyond ±1%"
    );
}
