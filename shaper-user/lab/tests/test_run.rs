//! The XDP program in the real kernel through BPF_PROG_TEST_RUN: verdicts and counters
//! for non-IP, truncated, malformed, IPv4 and jumbo frames. No interface is involved.
//! (Every encapsulation and key is in `parse_golden.rs`.)

use std::net::Ipv4Addr;

use shaper_common::maps::{Config, Ipv4Key, SourceState};
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

/// The kernel's verifier refuses a program for which it processes more than a million
/// instructions (BPF_COMPLEXITY_LIMIT_INSNS); this one is near that on some kernels, so
/// the count is printed for each kernel the tests run on, and a program that leaves
/// less than 5% of the limit spare fails here before it fails on a kernel (6.18: 911670
/// before the counters counted the compare-and-swap's tries, 900978 after).
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn the_verifier_accepts_the_program_with_room_to_spare() {
    const LIMIT: u32 = 1_000_000;
    let h = Harness::new(Some((8_000_000, 65_536)));
    let info = h.0.program().unwrap().info().unwrap();
    let Some(insns) = info.verified_instruction_count() else {
        println!("this kernel does not report verified instructions (before 5.16)");
        return;
    };
    println!("the verifier processed {insns} instructions (limit {LIMIT})");
    assert!(insns < LIMIT / 100 * 95, "{insns} of {LIMIT}");
}
