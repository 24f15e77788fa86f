//! Every encapsulation the program parses, through BPF_PROG_TEST_RUN in the real kernel:
//! for each golden frame the verdict, the cell charged (looked up under the key it must
//! have, masked to the prefix) and the bytes charged; every truncation inside its headers;
//! bad headers; aggregation to prefixes; keying by destination; jumbo frames.
//!
//! Expected keys are written out as addresses, not computed with the code under test.

use std::net::{Ipv4Addr, Ipv6Addr};

use shaper_common::{
    config::RateLimit,
    maps::{
        Config, Counters, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, KEY_BY_DST, KEY_BY_SRC, SourceState,
    },
};
use shaper_lab::{
    frame::*,
    testrun::{Harness, XDP_DROP, XDP_PASS},
};

/// 8 kbit/s (1000 bytes a second: nothing refills between runs) and a burst that holds
/// any frame here, so the first frame of a key always passes.
const RATE: u64 = 8_000;
const BURST: u64 = 20_000;

fn harness_with(key_by: u32, prefix_v4: u32, prefix_v6: u32, burst: u64) -> Harness {
    let rate = RateLimit::new(RATE, burst).unwrap();
    let config = Config::new(rate, key_by, prefix_v4, prefix_v6, 0).unwrap();
    Harness::new(Some(&config), 1024).expect("load")
}

fn harness() -> Harness {
    harness_with(KEY_BY_SRC, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, BURST)
}

fn run(h: &mut Harness, f: &[u8]) -> u32 {
    h.run(f).expect("test_run")
}

fn counters(h: &Harness) -> Counters {
    h.counters().expect("counters")
}

/// A key as it must be found in a sources map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

/// The one cell in the maps: it must be under `key`, and no other cell may exist.
fn only_cell(h: &Harness, key: Key) -> SourceState {
    let v4 = h.sources().expect("sources");
    let v6 = h.sources6().expect("sources6");
    let found: Vec<Key> = v4
        .iter()
        .map(|(k, _)| Key::V4(Ipv4Addr::from(k.to_ne_bytes())))
        .chain(v6.iter().map(|(k, _)| Key::V6(Ipv6Addr::from(*k))))
        .collect();
    assert_eq!(found, [key], "cells in the maps");
    match key {
        Key::V4(_) => v4[0].1,
        Key::V6(_) => v6[0].1,
    }
}

fn cell(h: &Harness, key: Key) -> Option<SourceState> {
    match key {
        Key::V4(a) => h
            .sources()
            .expect("sources")
            .into_iter()
            .find(|(k, _)| Ipv4Addr::from(k.to_ne_bytes()) == a)
            .map(|(_, s)| s),
        Key::V6(a) => h
            .sources6()
            .expect("sources6")
            .into_iter()
            .find(|(k, _)| Ipv6Addr::from(*k) == a)
            .map(|(_, s)| s),
    }
}

/// What a golden frame is, as the counters see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Metered under this key.
    Metered(Key),
    NotIp,
    PppoeOther,
    VlanTooDeep,
}

struct Golden {
    name: &'static str,
    frame: Vec<u8>,
    /// Where the headers the parser must see end: every shorter cut is malformed.
    headers: usize,
    kind: Kind,
}

const SRC4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const DST4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
const SRC6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0xa, 0xb, 0xc, 0xd);
const DST6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 9, 9, 0, 0, 0, 1);
/// SRC6 masked to the default /64.
const SRC6_64: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, 0);

fn v4_packet(payload: usize) -> Vec<u8> {
    ipv4(
        SRC4,
        DST4,
        &[],
        IPPROTO_UDP,
        Fragment::default(),
        &udp(payload),
    )
}

fn v6_packet(payload: usize) -> Vec<u8> {
    ipv6_udp_packet(SRC6, DST6, payload)
}

fn golden_frames() -> Vec<Golden> {
    let eth = ETH_HLEN;
    let (v4, v6) = (
        Kind::Metered(Key::V4(SRC4)),
        Kind::Metered(Key::V6(SRC6_64)),
    );
    let tagged = |f: &[u8]| with_vlan(f, ETH_P_8021Q, 100);
    let qinq = |f: &[u8], outer| with_vlan(&with_vlan(f, ETH_P_8021Q, 100), outer, 200);
    vec![
        Golden {
            name: "IPv4/UDP",
            frame: ethernet(ETH_P_IP, &v4_packet(100)),
            headers: eth + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "IPv4 with 40 bytes of options",
            frame: ipv4_with_options(SRC4, 40, 100),
            headers: eth + 60,
            kind: v4,
        },
        Golden {
            name: "IPv4 with 4 bytes of options",
            frame: ipv4_with_options(SRC4, 4, 0),
            headers: eth + 24,
            kind: v4,
        },
        Golden {
            name: "IPv4 header and nothing else",
            frame: ethernet(
                ETH_P_IP,
                &ipv4(SRC4, DST4, &[], 59, Fragment::default(), &[]),
            ),
            headers: eth + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "IPv4 first fragment",
            frame: ipv4_fragment(SRC4, DST4, true, 1000),
            headers: eth + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "IPv4 later fragment",
            frame: ipv4_fragment(SRC4, DST4, false, 500),
            headers: eth + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "IPv6/UDP",
            frame: ethernet(ETH_P_IPV6, &v6_packet(100)),
            headers: eth + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "IPv6 header and nothing else (no next header)",
            frame: ethernet(ETH_P_IPV6, &ipv6(SRC6, DST6, 59, &[])),
            headers: eth + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "IPv6 with hop-by-hop and destination options",
            frame: ipv6_with_ext_headers(SRC6, DST6, 100),
            headers: eth + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "IPv6 first fragment",
            frame: ipv6_fragment(SRC6, DST6, true, 1000),
            headers: eth + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "IPv6 later fragment",
            frame: ipv6_fragment(SRC6, DST6, false, 500),
            headers: eth + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "802.1Q / IPv4",
            frame: tagged(&ethernet(ETH_P_IP, &v4_packet(100))),
            headers: eth + VLAN_HLEN + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "802.1Q / IPv6",
            frame: tagged(&ethernet(ETH_P_IPV6, &v6_packet(100))),
            headers: eth + VLAN_HLEN + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "802.1ad / 802.1Q / IPv4",
            frame: qinq(&ethernet(ETH_P_IP, &v4_packet(100)), ETH_P_8021AD),
            headers: eth + 2 * VLAN_HLEN + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "802.1ad / 802.1Q / IPv6",
            frame: qinq(&ethernet(ETH_P_IPV6, &v6_packet(100)), ETH_P_8021AD),
            headers: eth + 2 * VLAN_HLEN + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "0x9100 / 802.1Q / IPv4",
            frame: qinq(&ethernet(ETH_P_IP, &v4_packet(100)), ETH_P_QINQ1),
            headers: eth + 2 * VLAN_HLEN + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "PPPoE / IPv4",
            frame: pppoe_session(PPP_IP, &v4_packet(100)),
            headers: eth + PPPOE_HLEN + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "PPPoE / IPv6",
            frame: pppoe_session(PPP_IPV6, &v6_packet(100)),
            headers: eth + PPPOE_HLEN + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "802.1Q / PPPoE / IPv4",
            frame: tagged(&pppoe_session(PPP_IP, &v4_packet(100))),
            headers: eth + VLAN_HLEN + PPPOE_HLEN + IPV4_HLEN,
            kind: v4,
        },
        Golden {
            name: "802.1ad / 802.1Q / PPPoE / IPv6",
            frame: qinq(&pppoe_session(PPP_IPV6, &v6_packet(100)), ETH_P_8021AD),
            headers: eth + 2 * VLAN_HLEN + PPPOE_HLEN + IPV6_HLEN,
            kind: v6,
        },
        Golden {
            name: "ARP",
            frame: ethernet(ETH_P_ARP, &[0; 28]),
            headers: eth,
            kind: Kind::NotIp,
        },
        Golden {
            name: "802.1Q / ARP",
            frame: tagged(&ethernet(ETH_P_ARP, &[0; 28])),
            headers: eth + VLAN_HLEN,
            kind: Kind::NotIp,
        },
        Golden {
            name: "PPPoE discovery (PADI)",
            frame: pppoe_discovery(),
            headers: eth,
            kind: Kind::PppoeOther,
        },
        Golden {
            name: "PPPoE LCP echo request",
            frame: pppoe_lcp(),
            headers: eth + PPPOE_HLEN,
            kind: Kind::PppoeOther,
        },
        Golden {
            name: "802.1Q / PPPoE LCP",
            frame: tagged(&pppoe_lcp()),
            headers: eth + VLAN_HLEN + PPPOE_HLEN,
            kind: Kind::PppoeOther,
        },
        Golden {
            name: "three VLAN tags / IPv4",
            frame: with_vlan(
                &qinq(&ethernet(ETH_P_IP, &v4_packet(100)), ETH_P_8021AD),
                ETH_P_8021AD,
                300,
            ),
            // The third tag is seen in the second tag's ethertype field.
            headers: eth + 2 * VLAN_HLEN,
            kind: Kind::VlanTooDeep,
        },
    ]
}

/// The counters after one frame of `kind` and `len` bytes passed, and nothing else.
fn assert_counted_once(c: &Counters, kind: Kind, len: u64, name: &str) {
    let mut want = Counters::default();
    match kind {
        Kind::Metered(key) => {
            want.outcomes.passed_packets = 1;
            want.outcomes.passed_bytes = len;
            want.new_sources = 1;
            // Its new cell's charge, on the first try: no other CPU sees it yet.
            want.cas_won[0] = 1;
            match key {
                Key::V4(_) => want.ipv4_packets = 1,
                Key::V6(_) => want.ipv6_packets = 1,
            }
        }
        Kind::NotIp => (want.not_ip_packets, want.not_ip_bytes) = (1, len),
        Kind::PppoeOther => (want.pppoe_other_packets, want.pppoe_other_bytes) = (1, len),
        Kind::VlanTooDeep => (want.vlan_too_deep_packets, want.vlan_too_deep_bytes) = (1, len),
    }
    assert_eq!(*c, want, "{name}: counters");
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn golden_frames_are_classified_keyed_and_charged_in_full() {
    // One load for every frame (a verification takes seconds in an emulated guest).
    let mut h = harness();
    for g in golden_frames() {
        h.reset().unwrap();
        let len = g.frame.len() as u64;
        assert_eq!(run(&mut h, &g.frame), XDP_PASS, "{}", g.name);
        assert_counted_once(&counters(&h), g.kind, len, g.name);
        match g.kind {
            Kind::Metered(key) => {
                let s = only_cell(&h, key);
                assert_eq!(
                    (
                        s.outcomes.passed_packets,
                        s.outcomes.passed_bytes,
                        s.outcomes.dropped_packets
                    ),
                    (1, len, 0),
                    "{}: cell",
                    g.name
                );
            }
            _ => {
                assert!(h.sources().unwrap().is_empty(), "{}: a v4 cell", g.name);
                assert!(h.sources6().unwrap().is_empty(), "{}: a v6 cell", g.name);
            }
        }
        eprintln!("{:<48} {len:>5} bytes: {:?}", g.name, g.kind);
    }
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn every_cut_inside_the_headers_is_malformed_and_passes() {
    let mut h = harness();
    let mut want = Counters::default();
    for g in golden_frames() {
        // test_run refuses frames shorter than an Ethernet header (EINVAL).
        for cut in ETH_HLEN..g.headers {
            assert_eq!(
                run(&mut h, &g.frame[..cut]),
                XDP_PASS,
                "{} cut at {cut}",
                g.name
            );
            want.malformed_packets += 1;
            want.malformed_bytes += cut as u64;
            assert_eq!(counters(&h), want, "{} cut at {cut}", g.name);
        }
        eprintln!(
            "{:<48} cut at {}..{}: malformed",
            g.name, ETH_HLEN, g.headers
        );
    }
    assert!(want.malformed_packets > 400, "too few cuts tested");
    assert!(h.sources().unwrap().is_empty());
    assert!(h.sources6().unwrap().is_empty());
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_frame_cut_right_after_its_headers_is_still_whole() {
    let mut h = harness();
    for g in golden_frames() {
        h.reset().unwrap();
        let cut = &g.frame[..g.headers];
        assert_eq!(run(&mut h, cut), XDP_PASS, "{}", g.name);
        assert_counted_once(&counters(&h), g.kind, cut.len() as u64, g.name);
    }
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn bad_headers_are_malformed() {
    let v4 = ethernet(ETH_P_IP, &v4_packet(100));
    let v6 = ethernet(ETH_P_IPV6, &v6_packet(100));
    let pppoe = pppoe_session(PPP_IP, &v4_packet(100));
    let patch = |f: &[u8], at: usize, byte: u8| {
        let mut f = f.to_vec();
        f[at] = byte;
        f
    };
    let cases = [
        ("IPv4 version 6", patch(&v4, 14, 0x65)),
        ("IPv4 version 0", patch(&v4, 14, 0x05)),
        ("IPv4 IHL 0", patch(&v4, 14, 0x40)),
        ("IPv4 IHL 4", patch(&v4, 14, 0x44)),
        // 60 bytes of header claimed, 20 + 8 + 100 present but the frame is cut at 50.
        (
            "IPv4 IHL 15 beyond the frame",
            patch(&v4, 14, 0x4f)[..50].to_vec(),
        ),
        ("IPv6 version 4", patch(&v6, 14, 0x40)),
        ("IPv6 version 7", patch(&v6, 14, 0x70)),
        ("PPPoE version 2", patch(&pppoe, 14, 0x21)),
        ("PPPoE discovery code in a session", patch(&pppoe, 15, 0x09)),
        ("PPPoE / IPv4 version 5", patch(&pppoe, 22, 0x55)),
        (
            "802.1Q / IPv6 version 4",
            patch(&with_vlan(&v6, ETH_P_8021Q, 7), 18, 0x45),
        ),
    ];
    let mut h = harness();
    let mut want = Counters::default();
    for (name, f) in &cases {
        assert_eq!(run(&mut h, f), XDP_PASS, "{name}");
        want.malformed_packets += 1;
        want.malformed_bytes += f.len() as u64;
        assert_eq!(counters(&h), want, "{name}");
    }
    assert!(h.sources().unwrap().is_empty());
    assert!(h.sources6().unwrap().is_empty());
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn fragments_of_a_datagram_share_one_cell() {
    let first = ipv4_fragment(SRC4, DST4, true, 1000);
    let later = ipv4_fragment(SRC4, DST4, false, 500);
    let first6 = ipv6_fragment(SRC6, DST6, true, 1000);
    let later6 = ipv6_fragment(SRC6, DST6, false, 500);
    let mut h = harness();
    for f in [&first, &later, &first6, &later6] {
        assert_eq!(run(&mut h, f), XDP_PASS);
    }
    let s = cell(&h, Key::V4(SRC4)).expect("v4 cell");
    assert_eq!(
        (s.outcomes.passed_packets, s.outcomes.passed_bytes),
        (2, (first.len() + later.len()) as u64)
    );
    let s = cell(&h, Key::V6(SRC6_64)).expect("v6 cell");
    assert_eq!(
        (s.outcomes.passed_packets, s.outcomes.passed_bytes),
        (2, (first6.len() + later6.len()) as u64)
    );
    assert_eq!(h.sources().unwrap().len() + h.sources6().unwrap().len(), 2);
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn encapsulated_frames_are_dropped_over_the_limit() {
    // Room for two of these frames: the third of each key is dropped, and charged there.
    let frames = [
        with_vlan(
            &with_vlan(&pppoe_session(PPP_IPV6, &v6_packet(1000)), ETH_P_8021Q, 100),
            ETH_P_8021AD,
            200,
        ),
        with_vlan(&pppoe_session(PPP_IP, &v4_packet(1000)), ETH_P_8021Q, 100),
    ];
    let mut h = harness_with(KEY_BY_SRC, 32, 64, 2 * frames[0].len() as u64);
    for (f, key) in frames.iter().zip([Key::V6(SRC6_64), Key::V4(SRC4)]) {
        let verdicts: Vec<u32> = (0..3).map(|_| run(&mut h, f)).collect();
        assert_eq!(verdicts, [XDP_PASS, XDP_PASS, XDP_DROP], "{key:?}");
        let s = cell(&h, key).expect("cell");
        let len = f.len() as u64;
        assert_eq!(
            (s.outcomes.passed_packets, s.outcomes.passed_bytes),
            (2, 2 * len),
            "{key:?}"
        );
        assert_eq!(
            (s.outcomes.dropped_packets, s.outcomes.dropped_bytes),
            (1, len),
            "{key:?}"
        );
    }
    let c = counters(&h);
    assert_eq!((c.ipv4_packets, c.ipv6_packets), (3, 3));
    assert_eq!(
        (c.outcomes.passed_packets, c.outcomes.dropped_packets),
        (4, 2)
    );
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn prefixes_aggregate_addresses_into_one_cell() {
    // IPv4 /24 and IPv6 /48.
    let mut h = harness_with(KEY_BY_SRC, 24, 48, BURST);
    let v4 = |a| ipv4_udp(a, 100);
    let v6 = |a| ipv6_udp(a, DST6, 50);
    let frames = [
        v4(Ipv4Addr::new(198, 51, 100, 7)),
        v4(Ipv4Addr::new(198, 51, 100, 200)),
        v4(Ipv4Addr::new(198, 51, 101, 7)),
        v6(Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, 1)),
        v6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0xffff, 9, 9, 9, 9)),
        v6(Ipv6Addr::new(0x2001, 0xdb8, 2, 2, 0, 0, 0, 1)),
    ];
    for f in &frames {
        assert_eq!(run(&mut h, f), XDP_PASS);
    }
    let expect = [
        (Key::V4(Ipv4Addr::new(198, 51, 100, 0)), 2, 200),
        (Key::V4(Ipv4Addr::new(198, 51, 101, 0)), 1, 100),
        (
            Key::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0)),
            2,
            2 * 112,
        ),
        (
            Key::V6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0)),
            1,
            112,
        ),
    ];
    for (key, packets, bytes) in expect {
        let s = cell(&h, key).unwrap_or_else(|| panic!("no cell {key:?}"));
        assert_eq!(
            (s.outcomes.passed_packets, s.outcomes.passed_bytes),
            (packets, bytes),
            "{key:?}"
        );
    }
    assert_eq!(h.sources().unwrap().len(), 2);
    assert_eq!(h.sources6().unwrap().len(), 2);

    // The default /64: a host's addresses are one cell; the next /64 is another.
    let mut h = harness();
    for a in [
        Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, 0xa),
        Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0xffff, 1, 2, 3),
        Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 0xa),
    ] {
        assert_eq!(run(&mut h, &v6(a)), XDP_PASS);
    }
    let s = cell(&h, Key::V6(SRC6_64)).expect("the /64 cell");
    assert_eq!(s.outcomes.passed_packets, 2);
    assert!(cell(&h, Key::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 0))).is_some());
    assert_eq!(h.sources6().unwrap().len(), 2);

    // /0 and /128, /32 at the edges: everyone in one cell, or each address its own.
    let mut h = harness_with(KEY_BY_SRC, 0, 128, BURST);
    for a in [SRC4, DST4] {
        assert_eq!(run(&mut h, &v4(a)), XDP_PASS);
    }
    for a in [SRC6, SRC6_64] {
        assert_eq!(run(&mut h, &v6(a)), XDP_PASS);
    }
    let s = cell(&h, Key::V4(Ipv4Addr::UNSPECIFIED)).expect("the /0 cell");
    assert_eq!(s.outcomes.passed_packets, 2);
    assert!(cell(&h, Key::V6(SRC6)).is_some() && cell(&h, Key::V6(SRC6_64)).is_some());
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn key_by_destination() {
    let mut h = harness_with(KEY_BY_DST, 32, 64, BURST);
    let senders4 = [SRC4, Ipv4Addr::new(192, 0, 2, 1)];
    let senders6 = [SRC6, Ipv6Addr::new(0x2001, 0xdb8, 7, 7, 7, 7, 7, 7)];
    for s in senders4 {
        assert_eq!(run(&mut h, &ipv4_udp_to(s, DST4, 100)), XDP_PASS);
    }
    for s in senders6 {
        let f = pppoe_session(PPP_IPV6, &ipv6_udp_packet(s, DST6, 50));
        assert_eq!(run(&mut h, &f), XDP_PASS);
    }
    let s = cell(&h, Key::V4(DST4)).expect("v4 destination cell");
    assert_eq!(
        (s.outcomes.passed_packets, s.outcomes.passed_bytes),
        (2, 200)
    );
    let dst6_64 = Ipv6Addr::new(0x2001, 0xdb8, 9, 9, 0, 0, 0, 0);
    let s = cell(&h, Key::V6(dst6_64)).expect("v6 destination cell");
    assert_eq!(s.outcomes.passed_packets, 2);
    assert_eq!(h.sources().unwrap().len(), 1);
    assert_eq!(h.sources6().unwrap().len(), 1);
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn jumbo_frames_are_charged_in_full() {
    // Longer than a page: test_run puts what does not fit the linear part in fragments,
    // as a driver does with a 9000-byte MTU. Only the program's frags support lets it
    // run at all, and only the multi-buffer length charges the whole frame.
    let jumbo4 = ipv4_udp(SRC4, 9000);
    let jumbo6 = with_vlan(&ipv6_udp(SRC6, DST6, 9000), ETH_P_8021Q, 5);
    let mut h = harness();
    for (f, key) in [(&jumbo4, Key::V4(SRC4)), (&jumbo6, Key::V6(SRC6_64))] {
        assert_eq!(run(&mut h, f), XDP_PASS);
        let s = cell(&h, key).expect("cell");
        assert_eq!(
            (s.outcomes.passed_packets, s.outcomes.passed_bytes),
            (1, f.len() as u64)
        );
    }
    let c = counters(&h);
    assert_eq!(
        c.outcomes.passed_bytes,
        (jumbo4.len() + jumbo6.len()) as u64
    );

    // A burst of 8000 bytes cannot hold a 9000-byte frame, whatever its linear part.
    let mut h = harness_with(KEY_BY_SRC, 32, 64, 8_000);
    assert_eq!(run(&mut h, &jumbo4), XDP_DROP);
    let s = cell(&h, Key::V4(SRC4)).expect("cell");
    assert_eq!(
        (s.outcomes.dropped_packets, s.outcomes.dropped_bytes),
        (1, 9000)
    );
}
