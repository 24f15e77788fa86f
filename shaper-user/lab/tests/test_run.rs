//! The XDP program in the real kernel through BPF_PROG_TEST_RUN: verdicts and counters
//! for non-IP, truncated, malformed, IPv4 and jumbo frames, and the addresses keyed whole
//! whatever the prefix (link-local, unspecified, multicast). No interface is involved.
//! (Every encapsulation and key is in `parse_golden.rs`.)

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use shaper_common::{
    config::RateLimit,
    maps::{Config, Ipv4Key, KEY_BY_DST, KEY_BY_SRC, SourceState},
};
use shaper_lab::{
    frame::{self, ETH_P_ARP},
    testrun::{self, XDP_DROP, XDP_PASS},
};

/// The shared harness, panicking on errors as tests do.
struct Harness(testrun::Harness);

impl Harness {
    /// The program loaded (not attached) with a policy of `rate_bps` and `burst` bytes per
    /// source address, or no policy at all.
    fn new(policy: Option<(u64, u64)>) -> Self {
        let config = policy
            .map(|(rate_bps, burst_bytes)| Config::per_source(rate_bps, burst_bytes).unwrap());
        Self(testrun::Harness::new(config.as_ref(), 1024).expect("load"))
    }

    fn run(&mut self, data: &[u8]) -> u32 {
        self.0.run(data).expect("test_run")
    }

    fn counters(&self) -> shaper_common::maps::Counters {
        self.0.counters().expect("counters")
    }

    fn source(&self, addr: Ipv4Addr) -> Option<SourceState> {
        let key: Ipv4Key = u32::from_ne_bytes(addr.octets());
        let sources = self.0.sources().expect("sources");
        sources.into_iter().find(|(k, _)| *k == key).map(|(_, s)| s)
    }
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn non_ip_frames_pass_and_are_counted() {
    let mut h = Harness::new(Some((8_000, 3_000)));
    let arp = frame::ethernet(ETH_P_ARP, &[0u8; 46]);
    let lldp = frame::ethernet(0x88cc, &[0u8; 46]);
    let mpls = frame::ethernet(0x8847, &[0x45; 86]);
    for f in [&arp, &lldp, &mpls] {
        assert_eq!(h.run(f), XDP_PASS);
    }
    let c = h.counters();
    assert_eq!(c.not_ip_packets, 3);
    assert_eq!(c.not_ip_bytes, (arp.len() + lldp.len() + mpls.len()) as u64);
    assert_eq!(
        (
            c.outcomes.passed_packets,
            c.outcomes.dropped_packets,
            c.malformed_packets,
            c.new_sources
        ),
        (0, 0, 0, 0)
    );
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn truncated_and_malformed_ipv4_frames_pass_untouched() {
    let mut h = Harness::new(Some((8_000, 3_000)));
    let whole = frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), 60);
    // Every cut inside the IPv4 header: Ethernet header plus 0..19 bytes of it. (The
    // kernel's test_run refuses frames shorter than an Ethernet header itself.)
    let mut sent = 0u64;
    let mut bytes = 0u64;
    for cut in 14..34 {
        assert_eq!(h.run(&whole[..cut]), XDP_PASS, "cut at {cut}");
        sent += 1;
        bytes += cut as u64;
    }
    // Bad version, and an IHL below 5 words.
    let mut bad_version = whole.clone();
    bad_version[14] = 0x65;
    let mut bad_ihl = whole.clone();
    bad_ihl[14] = 0x44;
    for f in [&bad_version, &bad_ihl] {
        assert_eq!(h.run(f), XDP_PASS);
        sent += 1;
        bytes += f.len() as u64;
    }
    let c = h.counters();
    assert_eq!((c.malformed_packets, c.malformed_bytes), (sent, bytes));
    assert_eq!(
        (
            c.outcomes.passed_packets,
            c.outcomes.dropped_packets,
            c.new_sources
        ),
        (0, 0, 0)
    );
    assert!(h.source(Ipv4Addr::new(198, 18, 0, 11)).is_none());
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn ipv4_frames_are_metered_per_source() {
    // 8 kbit/s is 1000 bytes per second: the bucket refills 1000 bytes per second, far
    // slower than these runs follow each other, so the verdicts below do not race.
    let mut h = Harness::new(Some((8_000, 3_000)));
    let a = Ipv4Addr::new(198, 18, 0, 11);
    let b = Ipv4Addr::new(198, 18, 0, 12);
    let fa = frame::ipv4_udp(a, 1000);
    let fb = frame::ipv4_udp(b, 1000);

    // The burst is exactly three such frames.
    let verdicts: Vec<u32> = (0..5).map(|_| h.run(&fa)).collect();
    assert_eq!(verdicts, [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP, XDP_DROP]);
    // Another source has its own bucket.
    assert_eq!(h.run(&fb), XDP_PASS);

    let sa = h.source(a).expect("cell for a");
    assert_eq!(
        (sa.outcomes.passed_packets, sa.outcomes.passed_bytes),
        (3, 3000)
    );
    assert_eq!(
        (sa.outcomes.dropped_packets, sa.outcomes.dropped_bytes),
        (2, 2000)
    );
    let sb = h.source(b).expect("cell for b");
    assert_eq!(
        (
            sb.outcomes.passed_packets,
            sb.outcomes.passed_bytes,
            sb.outcomes.dropped_packets
        ),
        (1, 1000, 0)
    );

    let c = h.counters();
    assert_eq!(
        (c.outcomes.passed_packets, c.outcomes.passed_bytes),
        (4, 4000)
    );
    assert_eq!(
        (c.outcomes.dropped_packets, c.outcomes.dropped_bytes),
        (2, 2000)
    );
    assert_eq!(c.new_sources, 2);
    assert_eq!(
        (c.not_ip_packets, c.malformed_packets, c.cas_exhausted),
        (0, 0, 0)
    );
    assert_eq!((c.ipv4_packets, c.ipv6_packets), (6, 0));
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn frame_larger_than_burst_is_dropped_even_from_idle() {
    let mut h = Harness::new(Some((8_000_000, 2_000)));
    let src = Ipv4Addr::new(198, 18, 0, 20);
    assert_eq!(h.run(&frame::ipv4_udp(src, 2_001)), XDP_DROP);
    assert_eq!(h.run(&frame::ipv4_udp(src, 2_000)), XDP_PASS);
    let s = h.source(src).unwrap();
    assert_eq!(
        (s.outcomes.dropped_packets, s.outcomes.dropped_bytes),
        (1, 2_001)
    );
    assert_eq!(
        (s.outcomes.passed_packets, s.outcomes.passed_bytes),
        (1, 2_000)
    );
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn without_a_policy_everything_passes_unmetered() {
    let mut h = Harness::new(None);
    let f = frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), 1_500);
    for _ in 0..3 {
        assert_eq!(h.run(&f), XDP_PASS);
    }
    let c = h.counters();
    assert_eq!(c.unconfigured_packets, 3);
    assert_eq!(
        (
            c.outcomes.passed_packets,
            c.outcomes.dropped_packets,
            c.new_sources
        ),
        (0, 0, 0)
    );
}

/// 10 B/s: nothing measurable refills while a test runs, even in an emulated guest.
const SLOW: u64 = 80;
const FRAME: usize = 1_000;
/// The address on the other side of the frames of [`passes`].
const PEER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);

/// Keyed by `key_by` (`KEY_BY_*`) at /24 and /64, a burst of 3 frames per key.
fn keyed(key_by: u32) -> testrun::Harness {
    let rate = RateLimit::new(SLOW, 3 * FRAME as u64).unwrap();
    let config = Config::new(rate, key_by, 24, 64, 0).unwrap();
    testrun::Harness::new(Some(&config), 1024).expect("load")
}

/// Sends 5 frames from (`KEY_BY_SRC`) or to (`KEY_BY_DST`) each address in turn; how many
/// of each passed. A key of its own passes 3 of them.
fn passes(h: &mut testrun::Harness, key_by: u32, addrs: &[&str]) -> Vec<usize> {
    addrs
        .iter()
        .map(|a| {
            let f = match (a.parse::<IpAddr>().unwrap(), key_by == KEY_BY_DST) {
                (IpAddr::V4(a), false) => frame::ipv4_udp_to(a, PEER_V4, FRAME),
                (IpAddr::V4(a), true) => frame::ipv4_udp_to(PEER_V4, a, FRAME),
                (IpAddr::V6(a), dst) => {
                    let payload = FRAME - frame::ETH_HLEN - frame::IPV6_HLEN - frame::UDP_HLEN;
                    let (src, to) = if dst { (PEER_V6, a) } else { (a, PEER_V6) };
                    frame::ipv6_udp(src, to, payload)
                }
            };
            (0..5)
                .filter(|_| h.run(&f).expect("test_run") == XDP_PASS)
                .count()
        })
        .collect()
}

/// Every key tracked, as addresses.
fn keys(h: &testrun::Harness) -> BTreeSet<IpAddr> {
    let v4 = h.sources().unwrap().into_iter();
    let v6 = h.sources6().unwrap().into_iter();
    v4.map(|(k, _)| IpAddr::from(Ipv4Addr::from(k.to_ne_bytes())))
        .chain(v6.map(|(k, _)| IpAddr::from(Ipv6Addr::from(k))))
        .collect()
}

fn addrs(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

/// Issue 32: with /64 keys every `fe80::` source was one key, so one host flooding from
/// any link-local address drained the bucket of every neighbour's (and the router's)
/// neighbour discovery. Link-local, unspecified and multicast addresses are keys of their
/// own; a global /64 (and a /24) is still one key.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn link_local_unspecified_and_multicast_sources_are_keys_of_their_own() {
    let mut h = keyed(KEY_BY_SRC);
    let whole = [
        "fe80::1",
        "fe80::2",
        "fe80::1:2:3:4",
        "::",
        "::1",
        "0.0.0.0",
        "0.0.0.7",
        "169.254.1.1",
        "169.254.1.2",
        "224.0.0.251",
        "224.0.0.252",
    ];
    assert_eq!(passes(&mut h, KEY_BY_SRC, &whole), [3; 11]);
    // Two addresses of one global /64, of one /24: one key, one burst between them.
    let shared = [
        "2001:db8:1:2::1",
        "2001:db8:1:2::2",
        "198.51.100.1",
        "198.51.100.2",
    ];
    assert_eq!(passes(&mut h, KEY_BY_SRC, &shared), [3, 0, 3, 0]);
    let mut want = addrs(&whole);
    want.extend(addrs(&["2001:db8:1:2::", "198.51.100.0"]));
    assert_eq!(keys(&h), want);
    let c = h.counters().unwrap();
    assert_eq!(
        (
            c.outcomes.passed_packets,
            c.outcomes.dropped_packets,
            c.new_sources
        ),
        (3 * 13, 2 * 13 + 2 * 5, 13)
    );
}

/// The same on egress by destination: every multicast group (`ff02::1`, the
/// solicited-node groups, `224.0.0.251`), the limited broadcast and each link-local
/// neighbour are keys of their own.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn link_local_and_multicast_destinations_are_keys_of_their_own() {
    let mut h = keyed(KEY_BY_DST);
    let whole = [
        "ff02::1",
        "ff02::2",
        "ff02::1:ff00:1",
        "ff02::1:ff00:2",
        "fe80::1",
        "fe80::2",
        "224.0.0.1",
        "224.0.0.251",
        "255.255.255.255",
        "169.254.7.7",
    ];
    assert_eq!(passes(&mut h, KEY_BY_DST, &whole), [3; 10]);
    let shared = [
        "2001:db8:1:2::1",
        "2001:db8:1:2::2",
        "198.51.100.1",
        "198.51.100.2",
    ];
    assert_eq!(passes(&mut h, KEY_BY_DST, &shared), [3, 0, 3, 0]);
    let mut want = addrs(&whole);
    want.extend(addrs(&["2001:db8:1:2::", "198.51.100.0"]));
    assert_eq!(keys(&h), want);
}
