//! `shaper explain` as an operator runs it: no root, no kernel, JSON with units in the keys,
//! one-line errors.

use std::process::Command;

use shaper_lab::bins::shaper as shaper_bin;

fn explain(args: &[&str]) -> std::process::Output {
    Command::new(shaper_bin())
        .arg("explain")
        .args(args)
        .output()
        .expect("run shaper")
}

#[test]
fn json_carries_the_arithmetic() {
    let out = explain(&["--rate", "10mbit", "--burst", "64k", "-j"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["rate_bps"], 10_000_000);
    assert_eq!(v["rate_bytes_per_sec"], 1_250_000.0);
    assert_eq!(v["byte_time_ns"], 800.0);
    assert_eq!(v["frame_1500_time_us"], 1200.0);
    assert_eq!(v["burst_bytes"], 65_536);
    assert_eq!(v["burst_ms"], 52.4288);
    assert_eq!(v["tcp_bursts"][1]["rtt_ms"], 50);
    assert_eq!(v["tcp_bursts"][1]["burst_bytes"], 62_500);
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0);
}

#[test]
fn text_warns_about_small_bursts() {
    let out = explain(&["--rate", "1gbit", "--burst", "1000b"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("125000000 bytes/s"), "{text}");
    assert_eq!(text.matches("warning:").count(), 2, "{text}");
}

#[test]
fn bad_values_are_one_line_errors() {
    for args in [
        &["--rate", "10xbit", "--burst", "64k"][..],
        &["--rate", "10mbit", "--burst", "0"][..],
        &["--rate", "10mbit"][..],
    ] {
        let out = explain(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("shaper: "), "{err}");
    }
}

/// A bandwidth profile and a packet rate for a frame size: which limit binds, and what a
/// source sending flat out gets unmarked and marked.
#[test]
fn a_profile_for_a_frame_size() {
    let out = explain(&[
        "--rate",
        "10mbit",
        "--burst",
        "64k",
        "--excess-rate",
        "10mbit",
        "--excess-burst",
        "64k",
        "--excess-dscp",
        "cs1",
        "--packet-rate",
        "2k",
        "--packet-burst",
        "200",
        "--frame-size",
        "1000b",
        "-j",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["profile"];
    assert_eq!(p["frame_bytes"], 1000);
    assert_eq!(p["excess_dscp"], "cs1");
    // 2000 frames of 1000 bytes: 16 Mbit/s, under CIR + EIR (20): the packet rate binds.
    assert_eq!(p["packet_rate_bps"], 16e6);
    assert_eq!(p["binding"], "packet rate");
    assert_eq!(p["green_bps"], 10e6);
    assert_eq!(p["yellow_bps"], 6e6);
    assert_eq!(p["packet_rate_binds_below_bytes"], 1250.0);
    // Without a second meter, no profile.
    let plain = explain(&["--rate", "10mbit", "--burst", "64k", "-j"]);
    let v: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(v.get("profile").is_none(), "{v}");
    // A half-given profile is a one-line error naming the flag.
    let out = explain(&[
        "--rate",
        "10mbit",
        "--burst",
        "64k",
        "--excess-rate",
        "5mbit",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--excess-burst"), "{err}");
}
