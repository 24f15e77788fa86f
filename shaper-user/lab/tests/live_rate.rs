//! Live traffic through the real XDP program: two namespaces joined by a veth pair,
//! shaper attached to the receiving end with the real `shaper` binary.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::time::Duration;

use common::{assert_limited, attach, replay, stats};
use shaper_lab::lab::{Lab, RunOptions, run_udp_with};

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
    let flows = lab.flows(&offered, FRAME);
    let options = RunOptions {
        record_sends: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(&lab, &flows, Duration::from_secs(5), &options).unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
    let results = &report.flows;
    let st = stats(lab.rx_ns(), lab.rx_iface());

    for r in &results[..3] {
        println!(
            "{}: offered {:.2} Mbit/s for {:.3} s",
            r.src,
            r.sent_bps() / 1e6,
            r.offered_secs
        );
        let replayed = replay(&[r], Some((RATE_BPS, BURST)), None)[0];
        assert_limited(
            &format!("{} received", r.src),
            r.received_l2_bytes,
            replayed,
            (RATE_BPS, BURST),
            &[r],
        );
        // It really was overloaded, and what shaper passed is what arrived.
        assert!(r.sent_l2_bytes > 4 * replayed);
        assert_eq!(st.key(r.src).passed_bytes, r.received_l2_bytes, "{}", r.src);
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
    // It loses nothing, unless its sender, held up by a loaded machine, caught up in one
    // clump larger than the burst: then it gets what the limit passes of its sends.
    let replayed = replay(&[quiet], Some((RATE_BPS, BURST)), None)[0];
    assert!(
        quiet.received_l2_bytes.abs_diff(replayed) <= u64::from(FRAME) + 100,
        "a source below the limit received {} bytes, the limit passes {replayed} of its sends",
        quiet.received_l2_bytes
    );
    assert_eq!(
        st.key(quiet.src).passed_bytes,
        quiet.received_l2_bytes,
        "{}",
        quiet.src
    );
}
