//! The fuzzer (`shaper_lab::fuzz`) against the real kernel: random and mutated frames of
//! every encapsulation through BPF_PROG_TEST_RUN. Every verdict is XDP_PASS or XDP_DROP,
//! and every frame and byte is counted exactly once.
//!
//! `SHAPER_FUZZ_FRAMES` sets the number of frames (default 100 000) and
//! `SHAPER_FUZZ_SEED` the seed (default: from the clock; it is printed, so a failure can
//! be replayed). `cargo xtask fuzz` runs the same fuzzer for longer.

use shaper_lab::fuzz;

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={value}: {e}")))
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn fuzzed_frames_pass_or_drop_and_are_all_counted() {
    let frames = env_u64("SHAPER_FUZZ_FRAMES").unwrap_or(100_000);
    let seed = env_u64("SHAPER_FUZZ_SEED").unwrap_or_else(fuzz::clock_seed);
    // Printed first, so that even a crash leaves the seed in the log.
    eprintln!("fuzz seed {seed:#018x} (replay with SHAPER_FUZZ_SEED={seed:#x})");
    let report = fuzz::run(frames, seed, |_| {}).unwrap_or_else(|e| panic!("{e:#}"));
    for line in report.lines() {
        eprintln!("{line}");
    }
    let c = &report.counters;
    // The mix reached every kind, so the invariants were tested on each.
    for (kind, n) in [
        ("passed", c.outcomes.passed_packets),
        ("dropped", c.outcomes.dropped_packets),
        ("IPv4", c.ipv4_packets),
        ("IPv6", c.ipv6_packets),
        ("not IP", c.not_ip_packets),
        ("PPPoE other", c.pppoe_other_packets),
        ("VLAN too deep", c.vlan_too_deep_packets),
        ("malformed", c.malformed_packets),
    ] {
        assert!(n > frames / 1000, "only {n} {kind} frames of {frames}");
    }
}
