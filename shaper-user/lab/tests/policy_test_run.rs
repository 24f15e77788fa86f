//! Prefix policies in the real kernel through BPF_PROG_TEST_RUN: longest-prefix
//! precedence across nested IPv4 and IPv6 prefixes, exempt and blocked sources, monitor
//! mode, the aggregate cell, re-resolution after a change, and rate changes that rescale
//! a bucket instead of refilling it.
//!
//! test_run frames arrive microseconds apart, so any limit here is overloaded thousands of
//! times over: at 8 kbit/s (1000 bytes a second) nothing measurable refills during a test.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use shaper_common::{
    config::PolicyLimits,
    maps::{ACTION_DROP, ACTION_LIMIT, ACTION_PASS, Config, MODE_MONITOR, PolicyStats},
};
use shaper_lab::{
    frame,
    testrun::{Harness, XDP_DROP, XDP_PASS},
};
use shaper_user::policy::{CheckedPolicy, PolicySpec, parse_prefix};

// 10 B/s: a frame refills every 100 s, so no bucket drains a frame while a test runs,
// even in an emulated guest where one test takes seconds.
const SLOW: u64 = 80;
const FRAME: usize = 1_000;

fn limit(rate_bps: u64, burst_bytes: u64) -> PolicyLimits {
    PolicyLimits {
        action: ACTION_LIMIT,
        rate_bps,
        burst_bytes,
        ..PolicyLimits::default()
    }
}

fn action(action: u32) -> PolicyLimits {
    PolicyLimits {
        action,
        ..PolicyLimits::default()
    }
}

fn spec(prefix: &str, limits: PolicyLimits) -> PolicySpec {
    PolicySpec {
        prefix: parse_prefix(prefix).unwrap(),
        limits,
    }
}

/// Default policy: 8 kbit/s with a burst of `default_burst`, keys /32 and /64.
fn harness(default_burst: u64) -> Harness {
    let config = Config::per_source(SLOW, default_burst).unwrap();
    Harness::new(Some(&config), 1024).expect("load")
}

fn frame_from(src: &str) -> Vec<u8> {
    match src.parse::<IpAddr>().unwrap() {
        IpAddr::V4(a) => frame::ipv4_udp(a, FRAME),
        IpAddr::V6(a) => {
            let dst = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
            let payload = FRAME - frame::ETH_HLEN - frame::IPV6_HLEN - frame::UDP_HLEN;
            frame::ipv6_udp(a, dst, payload)
        }
    }
}

/// Sends `n` frames from `src`; returns how many passed.
fn send(h: &mut Harness, src: &str, n: usize) -> usize {
    let f = frame_from(src);
    (0..n)
        .filter(|_| match h.run(&f).expect("test_run") {
            XDP_PASS => true,
            XDP_DROP => false,
            v => panic!("verdict {v}"),
        })
        .count()
}

/// The counters of the policy for `prefix` (`None`: the default policy's).
fn stats(h: &mut Harness, prefix: Option<&str>) -> PolicyStats {
    let table = h.policies();
    let slot = match prefix {
        None => 0,
        Some(p) => {
            let p = parse_prefix(p).unwrap();
            table
                .list()
                .unwrap()
                .into_iter()
                .find(|i| i.spec.prefix == p)
                .unwrap_or_else(|| panic!("no policy {p}"))
                .slot
        }
    };
    table.stats(slot).unwrap()
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn longest_prefix_wins_across_nested_prefixes() {
    // The default lets 3 frames through per source, then drops.
    let mut h = harness(3 * FRAME as u64);
    let nested = [
        // IPv4: pass ⊃ drop ⊃ limit(5 frames) ⊃ pass.
        spec("10.0.0.0/8", action(ACTION_PASS)),
        spec("10.1.0.0/16", action(ACTION_DROP)),
        spec("10.1.2.0/24", limit(SLOW, 5 * FRAME as u64)),
        spec("10.1.2.3/32", action(ACTION_PASS)),
        // IPv6 (keys are /64): pass ⊃ drop ⊃ limit(7 frames).
        spec("2001:db8::/32", action(ACTION_PASS)),
        spec("2001:db8:1::/48", action(ACTION_DROP)),
        spec("2001:db8:1:2::/64", limit(SLOW, 7 * FRAME as u64)),
    ];
    h.policies().replace_all(&nested).unwrap();

    // (source, frames passed out of 20, policy expected to count them)
    let cases = [
        ("10.9.9.9", 20, Some("10.0.0.0/8")),
        ("10.1.9.9", 0, Some("10.1.0.0/16")),
        ("10.1.2.4", 5, Some("10.1.2.0/24")),
        ("10.1.2.3", 20, Some("10.1.2.3/32")),
        ("192.0.2.1", 3, None),
        ("2001:db8:9::1", 20, Some("2001:db8::/32")),
        ("2001:db8:1:9::1", 0, Some("2001:db8:1::/48")),
        ("2001:db8:1:2::1", 7, Some("2001:db8:1:2::/64")),
        ("2001:db9::1", 3, None),
    ];
    for (src, passed, policy) in cases {
        let before = stats(&mut h, policy);
        assert_eq!(send(&mut h, src, 20), passed, "{src}");
        let after = stats(&mut h, policy);
        assert_eq!(
            (
                after.outcomes.passed_packets - before.outcomes.passed_packets,
                after.outcomes.dropped_packets - before.outcomes.dropped_packets
            ),
            (passed as u64, 20 - passed as u64),
            "{src}: counted under {policy:?}"
        );
    }

    // Removing the /24 hands its sources to the /16 on their next packet (the cached slot
    // is revalidated by generation); adding it back limits them again, from a new cell
    // state only in the policy, not in the source (its bucket is still full).
    h.policies()
        .del(parse_prefix("10.1.2.0/24").unwrap())
        .unwrap();
    assert_eq!(send(&mut h, "10.1.2.4", 5), 0, "after del: blocked by /16");
    assert_eq!(send(&mut h, "10.1.2.3", 5), 5, "/32 still exempt");
    h.policies()
        .set(CheckedPolicy::new(nested[2]).unwrap())
        .unwrap();
    assert_eq!(send(&mut h, "10.1.2.5", 10), 5, "new source under the /24");
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn exempt_sources_are_never_dropped_and_blocked_ones_get_nothing() {
    let mut h = harness(2 * FRAME as u64);
    h.policies()
        .replace_all(&[
            spec("198.18.1.0/24", action(ACTION_PASS)),
            spec("198.18.2.0/24", action(ACTION_DROP)),
        ])
        .unwrap();
    // 2000 frames of 1000 bytes in well under a second: over 1000× the 8 kbit/s default.
    let n = 2_000;
    assert_eq!(
        send(&mut h, "198.18.0.9", n),
        2,
        "default source is overloaded"
    );
    assert_eq!(
        send(&mut h, "198.18.1.9", n),
        n,
        "exempt source lost frames"
    );
    assert_eq!(
        send(&mut h, "198.18.2.9", n),
        0,
        "blocked source got through"
    );
    let exempt = stats(&mut h, Some("198.18.1.0/24"));
    assert_eq!(
        (
            exempt.outcomes.passed_packets,
            exempt.outcomes.passed_bytes,
            exempt.outcomes.dropped_packets
        ),
        (n as u64, (n * FRAME) as u64, 0)
    );
    let blocked = stats(&mut h, Some("198.18.2.0/24"));
    assert_eq!(
        (
            blocked.outcomes.passed_packets,
            blocked.outcomes.dropped_packets
        ),
        (0, n as u64)
    );
    // Both are still tracked and counted per source.
    let sources = h.sources().unwrap();
    assert_eq!(sources.len(), 3);
    let c = h.counters().unwrap();
    assert_eq!(c.outcomes.passed_packets, 2 + n as u64);
    assert_eq!(c.outcomes.dropped_packets, (n - 2 + n) as u64);
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn monitor_mode_drops_nothing_and_counts_what_enforcement_would() {
    let mut h = harness(3 * FRAME as u64);
    let monitored = |limits: PolicyLimits| PolicyLimits {
        mode: MODE_MONITOR,
        ..limits
    };
    h.policies()
        .replace_all(&[
            spec("198.18.1.0/24", monitored(limit(SLOW, 3 * FRAME as u64))),
            spec("198.18.2.0/24", monitored(action(ACTION_DROP))),
            spec("198.18.3.0/24", limit(SLOW, 3 * FRAME as u64)),
        ])
        .unwrap();
    assert_eq!(send(&mut h, "198.18.1.1", 50), 50);
    assert_eq!(send(&mut h, "198.18.2.1", 50), 50);
    // The same traffic enforced, for comparison.
    assert_eq!(send(&mut h, "198.18.3.1", 50), 3);
    let limited = stats(&mut h, Some("198.18.1.0/24"));
    let enforced = stats(&mut h, Some("198.18.3.0/24"));
    assert_eq!(
        limited.outcomes.would_drop_packets,
        enforced.outcomes.dropped_packets
    );
    assert_eq!(
        (
            limited.outcomes.passed_packets,
            limited.outcomes.dropped_packets
        ),
        (3, 0)
    );
    let blocked = stats(&mut h, Some("198.18.2.0/24"));
    assert_eq!(
        (
            blocked.outcomes.would_drop_packets,
            blocked.outcomes.dropped_packets
        ),
        (50, 0)
    );
    // Per source too, and globally (would-drop frames count as passed).
    let sources = h.sources().unwrap();
    let monitored_source = sources
        .iter()
        .find(|(k, _)| Ipv4Addr::from(k.to_ne_bytes()) == Ipv4Addr::new(198, 18, 1, 1))
        .unwrap()
        .1;
    assert_eq!(monitored_source.outcomes.would_drop_packets, 47);
    assert_eq!(monitored_source.outcomes.dropped_packets, 0);
    let c = h.counters().unwrap();
    assert_eq!(c.outcomes.would_drop_packets, 47 + 50);
    assert_eq!(c.outcomes.dropped_packets, 47);
    assert_eq!(c.outcomes.passed_packets, 3 + 3);

    // The whole interface in monitor mode: even the default drops nothing.
    let config = Config {
        mode: MODE_MONITOR,
        ..Config::per_source(SLOW, 3 * FRAME as u64).unwrap()
    };
    h.configure(&config).unwrap();
    assert_eq!(send(&mut h, "198.18.3.1", 20), 20);
    assert_eq!(send(&mut h, "198.18.9.9", 20), 20);
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_packet_refused_by_the_aggregate_is_charged_to_neither_cell() {
    let mut h = harness(100 * FRAME as u64);
    let mut hier = limit(SLOW, 3 * FRAME as u64);
    hier.aggregate_rate_bps = SLOW;
    hier.aggregate_burst_bytes = 5 * FRAME as u64;
    h.policies()
        .replace_all(&[spec("198.18.0.0/24", hier)])
        .unwrap();
    // A fills its own bucket (3) and 3 of the aggregate's 5; B gets the other 2, then the
    // aggregate refuses it although B's own bucket has room for one more.
    assert_eq!(send(&mut h, "198.18.0.11", 10), 3);
    assert_eq!(send(&mut h, "198.18.0.12", 10), 2);
    let s = stats(&mut h, Some("198.18.0.0/24"));
    assert_eq!(
        (s.outcomes.passed_packets, s.outcomes.dropped_packets),
        (5, 15)
    );
    // A's 7 refusals were its own bucket's; B's 8 were the aggregate's.
    assert_eq!(s.aggregate_refused_packets, 8);
    // Neither cell was charged for a refused frame: lifting the aggregate, B has exactly
    // its one frame of room left, and A none.
    let mut no_aggregate = hier;
    no_aggregate.aggregate_rate_bps = 0;
    no_aggregate.aggregate_burst_bytes = 0;
    h.policies()
        .replace_all(&[spec("198.18.0.0/24", no_aggregate)])
        .unwrap();
    assert_eq!(send(&mut h, "198.18.0.12", 10), 1);
    assert_eq!(send(&mut h, "198.18.0.11", 10), 0);
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_rate_change_rescales_buckets_and_never_refills_them() {
    let burst = 4 * FRAME as u64;
    let mut h = harness(burst);
    let prefix = "198.18.0.0/24";
    h.policies()
        .replace_all(&[spec(prefix, limit(SLOW, burst))])
        .unwrap();
    // Fill the bucket of a source under the policy, and of one under the default.
    assert_eq!(send(&mut h, "198.18.0.11", 10), 4);
    assert_eq!(send(&mut h, "198.18.9.11", 10), 4);
    // Raise and lower the policy's rate and the default's. A refill would let a burst
    // through at once; a rescaled bucket is still full, and at these rates (a frame every
    // 25 to 200 s) it does not drain a frame's worth while the test runs.
    for rate in [2 * SLOW, SLOW, SLOW / 2, 4 * SLOW] {
        h.policies()
            .replace_all(&[spec(prefix, limit(rate, burst))])
            .unwrap();
        h.configure(&Config::per_source(rate, burst).unwrap())
            .unwrap();
        assert_eq!(send(&mut h, "198.18.0.11", 3), 0, "policy at {rate} bit/s");
        assert_eq!(send(&mut h, "198.18.9.11", 3), 0, "default at {rate} bit/s");
    }
    // The cell now records the new limit's scale.
    let sources = h.sources().unwrap();
    let scale = shaper_common::gcra::Limit::new(4 * SLOW, burst)
        .unwrap()
        .scale();
    assert!(sources.iter().all(|(_, s)| s.cell.scale == scale));
}

/// Issue 32: link-local and multicast addresses are keyed whole, and policies name them as
/// any other prefix: a policy over `fe80::/10` meters each link-local source on its own
/// and, with an aggregate, holds them together; one on the gateway's own `fe80::1/128`
/// (longer than the /64 keys, which only such ranges may be) exempts it.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn policies_over_link_local_and_multicast_ranges_apply_per_address() {
    let mut h = harness(3 * FRAME as u64);
    let mut link_local = limit(SLOW, 5 * FRAME as u64);
    link_local.aggregate_rate_bps = SLOW;
    link_local.aggregate_burst_bytes = 7 * FRAME as u64;
    h.policies()
        .replace_all(&[
            spec("fe80::/10", link_local),
            spec("fe80::1/128", action(ACTION_PASS)),
            spec("224.0.0.0/4", limit(SLOW, 4 * FRAME as u64)),
        ])
        .unwrap();
    assert_eq!(send(&mut h, "fe80::1", 20), 20);
    // Each its own bucket of 5, the 7 of the aggregate between them.
    assert_eq!(send(&mut h, "fe80::2", 20), 5);
    assert_eq!(send(&mut h, "fe80::3", 20), 2);
    assert_eq!(send(&mut h, "febf::4", 20), 0);
    let s = stats(&mut h, Some("fe80::/10"));
    assert_eq!(
        (s.outcomes.passed_packets, s.outcomes.dropped_packets),
        (7, 53)
    );
    assert_eq!(s.aggregate_refused_packets, 18 + 20);
    assert_eq!(
        stats(&mut h, Some("fe80::1/128")).outcomes.passed_packets,
        20
    );
    // Multicast sources (as a spoofer sends them), each by the policy's 4.
    assert_eq!(send(&mut h, "224.0.0.251", 10), 4);
    assert_eq!(send(&mut h, "224.0.0.252", 10), 4);
    let s = stats(&mut h, Some("224.0.0.0/4"));
    assert_eq!(s.outcomes.passed_packets, 8);
    // The default's burst of 3, each on its own.
    assert_eq!(send(&mut h, "::", 10), 3);
    assert_eq!(send(&mut h, "::1", 10), 3);
    // A prefix longer than the keys outside those ranges could never match: refused.
    let e = h
        .policies()
        .replace_all(&[spec("2001:db8::1/128", action(ACTION_PASS))])
        .unwrap_err();
    assert!(e.to_string().contains("longer than the /64"), "{e}");
}

/// The aggregate's refusals counted in bytes as well as packets (`count_policy`): every
/// byte of each frame the aggregate refused, and none of those the key's own bucket
/// refused; in both families (IPv6 keys are /64, the policy a /48).
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn the_aggregates_refusals_are_counted_in_bytes() {
    let mut h = harness(100 * FRAME as u64);
    let mut hier = limit(SLOW, 3 * FRAME as u64);
    hier.aggregate_rate_bps = SLOW;
    hier.aggregate_burst_bytes = 5 * FRAME as u64;
    h.policies()
        .replace_all(&[spec("198.18.0.0/24", hier), spec("2001:db8:5::/48", hier)])
        .unwrap();
    for (prefix, a, b) in [
        ("198.18.0.0/24", "198.18.0.11", "198.18.0.12"),
        ("2001:db8:5::/48", "2001:db8:5:1::1", "2001:db8:5:2::1"),
    ] {
        // A: 3 pass, 7 refused by its own bucket; B: 2 pass, 8 refused by the aggregate.
        assert_eq!(send(&mut h, a, 10), 3, "{prefix}");
        assert_eq!(send(&mut h, b, 10), 2, "{prefix}");
        let s = stats(&mut h, Some(prefix));
        assert_eq!(
            (s.aggregate_refused_packets, s.aggregate_refused_bytes),
            (8, 8 * FRAME as u64),
            "{prefix}"
        );
        assert_eq!(
            (s.outcomes.dropped_packets, s.outcomes.dropped_bytes),
            (15, 15 * FRAME as u64),
            "{prefix}"
        );
    }
}

/// A packet rate and an aggregate on one policy refuse apart, and neither charges a
/// frame the other refused: A's frames past its packet burst (3) are the packet rate's
/// refusals and leave the aggregate (5) its room; B gets the aggregate's last 2, then the
/// aggregate refuses it, its packets given back. In both families (keys /32 and /64).
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_packet_rate_and_an_aggregate_refuse_apart_and_charge_nothing_refused() {
    use shaper_common::config::Meter2Limits;

    let mut h = harness(100 * FRAME as u64);
    let mut both = limit(SLOW, 100 * FRAME as u64);
    both.aggregate_rate_bps = SLOW;
    both.aggregate_burst_bytes = 5 * FRAME as u64;
    both.meter2 = Meter2Limits {
        packet_rate: 1,
        packet_burst: 3,
        ..Meter2Limits::default()
    };
    let no_aggregate = PolicyLimits {
        aggregate_rate_bps: 0,
        aggregate_burst_bytes: 0,
        ..both
    };
    let cases = [
        ("198.18.0.0/24", "198.18.0.11", "198.18.0.12"),
        ("2001:db8:5::/48", "2001:db8:5:1::1", "2001:db8:5:2::1"),
    ];
    let specs = |limits| cases.map(|(prefix, _, _)| spec(prefix, limits));
    h.policies().replace_all(&specs(both)).unwrap();
    for (prefix, a, b) in cases {
        assert_eq!(send(&mut h, a, 10), 3, "{prefix}: A, its packet burst");
        assert_eq!(send(&mut h, b, 10), 2, "{prefix}: B, the aggregate's rest");
        let s = stats(&mut h, Some(prefix));
        assert_eq!(
            (s.outcomes.passed_packets, s.outcomes.dropped_packets),
            (5, 15),
            "{prefix}"
        );
        assert_eq!(
            (
                s.meter2.packet_rate_refused_packets,
                s.meter2.packet_rate_refused_bytes
            ),
            (7, 7 * FRAME as u64),
            "{prefix}: A's refusals, the packet rate's"
        );
        assert_eq!(
            (s.aggregate_refused_packets, s.aggregate_refused_bytes),
            (8, 8 * FRAME as u64),
            "{prefix}: B's refusals, the aggregate's"
        );
    }
    // Lifting the aggregate: B has exactly the one packet of its burst it did not use, A
    // none.
    h.policies().replace_all(&specs(no_aggregate)).unwrap();
    for (prefix, a, b) in cases {
        assert_eq!(send(&mut h, b, 10), 1, "{prefix}: B's packet left");
        assert_eq!(send(&mut h, a, 10), 0, "{prefix}: A's packets");
    }
    let c = h.counters().unwrap();
    assert_eq!(c.meter2.packet_rate_refused_packets, 2 * (7 + 9 + 10));
}

/// A key caches the slot it resolved to with the policies' generation (`cache_word`), so
/// the tries are searched for new keys and after a change only: read back from its
/// state, in both families, for a prefix policy's key and a default one, before and after
/// a change bumps the generation.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_keys_policy_is_cached_with_the_generation() {
    let mut h = harness(100 * FRAME as u64);
    let policies = [
        spec("198.18.7.0/24", limit(SLOW, 3 * FRAME as u64)),
        spec("2001:db8:7::/48", limit(SLOW, 3 * FRAME as u64)),
    ];
    let cached = |h: &Harness, src: &str| -> u64 {
        let state = match src.parse::<IpAddr>().unwrap() {
            IpAddr::V4(a) => h
                .sources()
                .unwrap()
                .into_iter()
                .find(|(k, _)| Ipv4Addr::from(k.to_ne_bytes()) == a)
                .map(|(_, s)| s),
            // Keys are /64: the first eight bytes.
            IpAddr::V6(a) => h
                .sources6()
                .unwrap()
                .into_iter()
                .find(|(k, _)| k[..8] == a.octets()[..8])
                .map(|(_, s)| s),
        };
        state.unwrap_or_else(|| panic!("no key for {src}")).policy
    };
    for round in 0..2 {
        h.policies().replace_all(&policies).unwrap();
        let generation = u64::from(h.policies().config().unwrap().policy_gen);
        for (src, prefix) in [
            ("198.18.7.9", Some("198.18.7.0/24")),
            ("198.18.8.9", None),
            ("2001:db8:7:1::9", Some("2001:db8:7::/48")),
            ("2001:db8:8:1::9", None),
        ] {
            let slot = match prefix {
                Some(p) => {
                    let p = parse_prefix(p).unwrap();
                    let listed = h.policies().list().unwrap();
                    u64::from(listed.iter().find(|i| i.spec.prefix == p).unwrap().slot)
                }
                None => 0,
            };
            send(&mut h, src, 1);
            assert_eq!(
                cached(&h, src),
                (generation << 32) | slot,
                "{src}, round {round}"
            );
        }
    }
}
