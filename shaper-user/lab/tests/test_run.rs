//! The XDP program in the real kernel through BPF_PROG_TEST_RUN: verdicts and counters
//! for non-IP, truncated, malformed, IPv4 and jumbo frames, and the addresses keyed whole
//! whatever the prefix (link-local, unspecified, multicast); and the tc program's charge
//! for a GSO packet. No interface is involved.
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

/// `struct __sk_buff` (uapi/linux/bpf.h): its size and where `gso_segs` is.
const SKB_SIZE: usize = 192;
const GSO_SEGS_AT: usize = 164;
const TC_ACT_UNSPEC: i32 = -1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;

/// A TCP segment of `header` bytes (its data offset says so; options padding) and
/// `data` bytes after it.
fn tcp(header: usize, data: usize) -> Vec<u8> {
    let mut t = vec![0u8; header + data];
    t[12] = ((header / 4) as u8) << 4;
    t
}

fn ipv4_of(src: Ipv4Addr, options: usize, protocol: u8, payload: &[u8]) -> Vec<u8> {
    let opts = vec![1u8; options]; // No-Operation options
    let ip = frame::ipv4(
        src,
        frame::DEFAULT_DST_V4,
        &opts,
        protocol,
        frame::Fragment::default(),
        payload,
    );
    frame::ethernet(frame::ETH_P_IP, &ip)
}

fn ipv6_of(src: Ipv6Addr, next: u8, payload: &[u8]) -> Vec<u8> {
    let ip = frame::ipv6(src, frame::DEFAULT_DST_V6, next, payload);
    frame::ethernet(frame::ETH_P_IPV6, &ip)
}

/// The tc program run once on `f` as a GSO packet of `segs` segments.
fn tc_gso(ebpf: &aya::Ebpf, f: &[u8], segs: u32) {
    use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions};
    let prog = ebpf
        .program(shaper_common::maps::PROG_TC)
        .expect("the tc program");
    let prog: &SchedClassifier = prog.try_into().unwrap();
    let mut ctx_in = [0u8; SKB_SIZE];
    ctx_in[GSO_SEGS_AT..GSO_SEGS_AT + 4].copy_from_slice(&segs.to_ne_bytes());
    let mut ctx_out = [0u8; SKB_SIZE];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(f);
    opts.ctx_in = Some(&ctx_in);
    opts.ctx_out = Some(&mut ctx_out);
    let verdict = prog.test_run(opts).expect("test_run of the tc program");
    assert_eq!(
        verdict.return_value as i32, TC_ACT_UNSPEC,
        "a GSO packet passes"
    );
}

/// A GSO packet costs what it puts on the wire (as `qdisc_pkt_len_init` charges qdiscs):
/// its length plus, for each segment after the first, the headers it repeats: Ethernet,
/// IP (options included) and TCP (options included) or UDP; the IP header alone for
/// another protocol; the fixed 20 bytes of TCP when the frame ends inside its header.
/// One segment, or none said, costs the length. Each case from a key of its own, both
/// families, the key's passed bytes read exactly.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_gso_packets_cost_is_its_segments_wire_bytes() {
    let config = Config::per_source(100_000_000_000, 10_000_000).unwrap();
    let mut h = testrun::Harness::new(Some(&config), 1024).expect("load");
    shaper_user::object::tc_program(h.ebpf_mut()).expect("load the tc program");
    // (frame, segments, headers each later segment repeats)
    let v4 = |host: u8| Ipv4Addr::new(198, 18, 7, host);
    let v6 = |host: u16| Ipv6Addr::new(0x2001, 0xdb8, 7, host, 0, 0, 0, 1);
    let cases4: Vec<(Ipv4Addr, Vec<u8>, u32, u64)> = vec![
        (v4(1), frame::ipv4_udp(v4(1), 1000), 4, 14 + 20 + 8),
        (
            v4(2),
            ipv4_of(v4(2), 0, IPPROTO_TCP, &tcp(32, 900)),
            3,
            14 + 20 + 32,
        ),
        (
            v4(3),
            ipv4_of(v4(3), 4, IPPROTO_TCP, &tcp(20, 900)),
            5,
            14 + 24 + 20,
        ),
        (
            v4(4),
            ipv4_of(v4(4), 0, IPPROTO_ICMP, &[0u8; 900]),
            2,
            14 + 20,
        ),
        (
            v4(5),
            ipv4_of(v4(5), 0, IPPROTO_TCP, &[0u8; 12]),
            2,
            14 + 20 + 20,
        ),
        (v4(6), frame::ipv4_udp(v4(6), 1000), 1, 0),
        (v4(7), frame::ipv4_udp(v4(7), 1000), 0, 0),
    ];
    let cases6: Vec<(Ipv6Addr, Vec<u8>, u32, u64)> = vec![
        (
            v6(1),
            frame::ipv6_udp(v6(1), frame::DEFAULT_DST_V6, 900),
            4,
            14 + 40 + 8,
        ),
        (
            v6(2),
            ipv6_of(v6(2), IPPROTO_TCP, &tcp(32, 900)),
            3,
            14 + 40 + 32,
        ),
        (
            v6(3),
            ipv6_of(v6(3), IPPROTO_ICMPV6, &[0u8; 900]),
            2,
            14 + 40,
        ),
        (
            v6(4),
            ipv6_of(v6(4), IPPROTO_TCP, &[0u8; 12]),
            2,
            14 + 40 + 20,
        ),
        (
            v6(5),
            frame::ipv6_udp(v6(5), frame::DEFAULT_DST_V6, 900),
            1,
            0,
        ),
        (
            v6(6),
            frame::ipv6_udp(v6(6), frame::DEFAULT_DST_V6, 900),
            0,
            0,
        ),
    ];
    for (_, f, segs, _) in &cases4 {
        tc_gso(h.ebpf_mut(), f, *segs);
    }
    for (_, f, segs, _) in &cases6 {
        tc_gso(h.ebpf_mut(), f, *segs);
    }
    let expected = |f: &[u8], segs: u32, headers: u64| {
        f.len() as u64 + u64::from(segs.saturating_sub(1)) * headers
    };
    let sources = h.sources().unwrap();
    for (addr, f, segs, headers) in &cases4 {
        let key = u32::from_ne_bytes(addr.octets());
        let (_, s) = sources.iter().find(|(k, _)| *k == key).expect("a cell");
        assert_eq!(
            (s.outcomes.passed_packets, s.outcomes.passed_bytes),
            (1, expected(f, *segs, *headers)),
            "{addr}: {segs} segments of {} bytes",
            f.len()
        );
    }
    let sources6 = h.sources6().unwrap();
    for (addr, f, segs, headers) in &cases6 {
        let mut key = addr.octets();
        key[8..].fill(0); // its /64
        let (_, s) = sources6.iter().find(|(k, _)| *k == key).expect("a cell");
        assert_eq!(
            (s.outcomes.passed_packets, s.outcomes.passed_bytes),
            (1, expected(f, *segs, *headers)),
            "{addr}: {segs} segments of {} bytes",
            f.len()
        );
    }
}
