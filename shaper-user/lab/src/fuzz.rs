//! A fuzzer for the XDP program, run in the real kernel through `BPF_PROG_TEST_RUN`.
//!
//! Frames are golden frames of every encapsulation (see [`crate::frame`]) with addresses
//! from small pools (so keys repeat and some get dropped), mutated: bits flipped, bytes
//! overwritten, inserted or deleted, ethertypes swapped for ones the parser looks at,
//! truncated; a few are random bytes, a few are jumbo. The policy changes every
//! [`SEGMENT`] frames (key, prefixes, rate), as `attach` may change it on a live
//! interface, and the maps are small enough to evict.
//!
//! Checked on every frame: the verdict is XDP_PASS or XDP_DROP (never XDP_ABORTED, never
//! an error). Checked at the end, exactly, in packets and bytes: every frame is counted
//! once in passed, dropped (a key's, or the unadmitted cells' of keys a full table had no
//! way for), not IP, PPPoE other, VLAN too deep or malformed; the drops seen are the drops
//! counted; the metered frames are the IPv4 plus the IPv6 ones.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use shaper_common::{
    config::RateLimit,
    maps::{Config, Counters, KEY_BY_DST, KEY_BY_SRC},
};

use crate::{
    frame::*,
    rng::Rng,
    testrun::{Harness, XDP_DROP, XDP_PASS},
};

/// Frames between policy changes.
pub const SEGMENT: u64 = 20_000;
/// Entries of each sources map: small, so that new keys evict old ones.
pub const MAX_SOURCES: u32 = 4096;
/// The longest frame sent: a 9000-byte MTU plus Ethernet and two VLAN tags.
pub const MAX_FRAME: usize = 9022;

#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    pub frames: u64,
    pub bytes: u64,
    pub passed: u64,
    pub dropped: u64,
    /// What the program counted, summed over CPUs.
    pub counters: Counters,
    pub elapsed: Duration,
}

impl Report {
    /// The report as lines for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let c = &self.counters;
        let secs = self.elapsed.as_secs_f64();
        vec![
            format!(
                "fuzz: seed {:#018x}, {} frames ({} bytes) in {:.1} s ({:.0} frames/s)",
                self.seed,
                self.frames,
                self.bytes,
                secs,
                self.frames as f64 / secs.max(1e-9)
            ),
            format!(
                "  verdicts: XDP_PASS {}, XDP_DROP {}, anything else 0",
                self.passed, self.dropped
            ),
            format!(
                "  metered: passed {} ({} bytes), dropped {} ({} bytes); unadmitted (no way in a full table): passed {}, dropped {}; IPv4 {}, IPv6 {}; new keys {}, untracked {}, cas exhausted {}",
                c.outcomes.passed_packets,
                c.outcomes.passed_bytes,
                c.outcomes.dropped_packets,
                c.outcomes.dropped_bytes,
                c.unadmitted.passed_packets,
                c.unadmitted.dropped_packets,
                c.ipv4_packets,
                c.ipv6_packets,
                c.new_sources,
                c.untracked_packets,
                c.cas_exhausted
            ),
            format!(
                "  passed untouched: not IP {} ({} bytes), PPPoE other {} ({} bytes), VLAN too deep {} ({} bytes), malformed {} ({} bytes)",
                c.not_ip_packets,
                c.not_ip_bytes,
                c.pppoe_other_packets,
                c.pppoe_other_bytes,
                c.vlan_too_deep_packets,
                c.vlan_too_deep_bytes,
                c.malformed_packets,
                c.malformed_bytes
            ),
        ]
    }
}

/// A seed from the clock, for runs that were not given one.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

/// Runs `frames` fuzzed frames from `seed` and checks every invariant (see the module
/// docs); `progress` is called every [`SEGMENT`] frames.
pub fn run(frames: u64, seed: u64, mut progress: impl FnMut(u64)) -> Result<Report> {
    let mut rng = Rng::new(seed);
    let mut h = Harness::new(Some(&policy(&mut rng, true)?), MAX_SOURCES)?;
    let start = Instant::now();
    let (mut bytes, mut passed, mut dropped) = (0u64, 0u64, 0u64);
    for i in 0..frames {
        if i > 0 && i % SEGMENT == 0 {
            h.configure(&policy(&mut rng, false)?)?;
            progress(i);
        }
        let f = fuzzed_frame(&mut rng);
        match h.run(&f) {
            Ok(XDP_PASS) => passed += 1,
            Ok(XDP_DROP) => dropped += 1,
            Ok(v) => bail!("frame {i} (seed {seed:#x}) returned {v}: {}", hex(&f)),
            Err(e) => bail!("frame {i} (seed {seed:#x}): {e:#}: {}", hex(&f)),
        }
        bytes += f.len() as u64;
    }
    let report = Report {
        seed,
        frames,
        bytes,
        passed,
        dropped,
        counters: h.counters()?,
        elapsed: start.elapsed(),
    };
    check(&report)?;
    Ok(report)
}

/// The invariants over the whole run.
fn check(r: &Report) -> Result<()> {
    let c = &r.counters;
    // Metered frames: a key's (or an aggregate's), or, a key given no way in a full table
    // (or refused by admission), its policy's unadmitted cell's.
    let (u, o) = (&c.unadmitted, &c.outcomes);
    let (passed, dropped) = (
        o.passed_packets + u.passed_packets,
        o.dropped_packets + u.dropped_packets,
    );
    let packets = passed
        + dropped
        + c.not_ip_packets
        + c.pppoe_other_packets
        + c.vlan_too_deep_packets
        + c.malformed_packets;
    let bytes = o.passed_bytes
        + o.dropped_bytes
        + u.passed_bytes
        + u.dropped_bytes
        + c.not_ip_bytes
        + c.pppoe_other_bytes
        + c.vlan_too_deep_bytes
        + c.malformed_bytes;
    ensure!(
        packets == r.frames,
        "counted {packets} packets of {} frames: {c:?}",
        r.frames
    );
    ensure!(
        bytes == r.bytes,
        "counted {bytes} bytes of {} sent: {c:?}",
        r.bytes
    );
    ensure!(
        dropped == r.dropped,
        "counted {dropped} drops, saw {}",
        r.dropped
    );
    ensure!(
        c.ipv4_packets + c.ipv6_packets == passed + dropped,
        "IPv4 {} + IPv6 {} metered != passed {passed} + dropped {dropped}",
        c.ipv4_packets,
        c.ipv6_packets,
    );
    ensure!(
        c.unconfigured_packets == 0,
        "{} frames unconfigured",
        c.unconfigured_packets
    );
    Ok(())
}

/// A random policy: key, prefixes and a rate. The `first` one's rate drops a good share
/// of repeated keys, so every run drops some frames whatever the later segments draw (a
/// seed that drew the rate nothing exceeds for all five segments of a CI run once dropped
/// none, and the run tested nothing of the drop path).
fn policy(rng: &mut Rng, first: bool) -> Result<Config> {
    let key_by = if rng.below(2) == 0 {
        KEY_BY_SRC
    } else {
        KEY_BY_DST
    };
    let prefix_v4 = [32, 32, 24, 0, 1, 31][rng.below(6)];
    let prefix_v6 = [64, 64, 48, 128, 0, 65][rng.below(6)];
    let rates = [
        (8_000, 3_000),
        (1_000_000, 20_000),
        (100_000_000_000, 1 << 30),
    ];
    let (rate, burst) = rates[rng.below(if first { 2 } else { rates.len() })];
    let rate = RateLimit::new(rate, burst).map_err(|e| anyhow::anyhow!("{e}"))?;
    Config::new(rate, key_by, prefix_v4, prefix_v6, 0).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Ethertypes the parser compares against, for mutations that swap them in.
const ETHERTYPES: [u16; 9] = [
    ETH_P_IP,
    ETH_P_IPV6,
    ETH_P_8021Q,
    ETH_P_8021AD,
    ETH_P_QINQ1,
    ETH_P_PPP_SES,
    ETH_P_PPP_DISC,
    ETH_P_ARP,
    0x88cc,
];

fn addr4(rng: &mut Rng) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, rng.below(4) as u8, rng.below(64) as u8)
}

fn addr6(rng: &mut Rng) -> Ipv6Addr {
    let n = |rng: &mut Rng, k| rng.below(k) as u16;
    Ipv6Addr::new(
        0x2001,
        0xdb8,
        n(rng, 4),
        n(rng, 8),
        n(rng, 2),
        0,
        0,
        n(rng, 64),
    )
}

/// A well-formed frame of a random encapsulation.
fn golden(rng: &mut Rng) -> Vec<u8> {
    let jumbo = rng.below(200) == 0;
    let payload = if jumbo {
        3000 + rng.below(5900)
    } else {
        rng.below(1400)
    };
    let (s4, d4, s6, d6) = (addr4(rng), addr4(rng), addr6(rng), addr6(rng));
    let ip4 = || ipv4(s4, d4, &[], IPPROTO_UDP, Fragment::default(), &udp(payload));
    let ip6 = || ipv6_udp_packet(s6, d6, payload);
    let base = match rng.below(14) {
        0 | 1 => ethernet(ETH_P_IP, &ip4()),
        2 | 3 => ethernet(ETH_P_IPV6, &ip6()),
        4 => ipv4_with_options(s4, 4 * rng.below(11), payload),
        5 => ipv4_fragment(s4, d4, rng.below(2) == 0, payload),
        6 => ipv6_with_ext_headers(s6, d6, payload),
        7 => ipv6_fragment(s6, d6, rng.below(2) == 0, payload),
        8 => pppoe_session(PPP_IP, &ip4()),
        9 => pppoe_session(PPP_IPV6, &ip6()),
        10 => pppoe_lcp(),
        11 => pppoe_discovery(),
        12 => ethernet(ETH_P_ARP, &[0; 28]),
        _ => {
            let mut f = vec![0; ETH_HLEN + rng.below(200)];
            fill(rng, &mut f);
            f
        }
    };
    // Up to three VLAN tags of any TPID the parser knows.
    let tags = [0, 0, 0, 1, 1, 2, 2, 3][rng.below(8)];
    (0..tags).fold(base, |f, _| {
        let tpid = [ETH_P_8021Q, ETH_P_8021AD, ETH_P_QINQ1][rng.below(3)];
        with_vlan(&f, tpid, rng.below(4096) as u16)
    })
}

/// A golden frame with up to four mutations, or (one in twenty) random bytes.
pub fn fuzzed_frame(rng: &mut Rng) -> Vec<u8> {
    let mut f = if rng.below(20) == 0 {
        let mut f = vec![0; ETH_HLEN + rng.below(120)];
        fill(rng, &mut f);
        f
    } else {
        golden(rng)
    };
    for _ in 0..rng.below(5) {
        mutate(rng, &mut f);
    }
    // test_run refuses frames shorter than an Ethernet header.
    if f.len() < ETH_HLEN {
        f.resize(ETH_HLEN, 0);
    }
    f.truncate(MAX_FRAME);
    f
}

/// Where a mutation lands: mostly in the first 80 bytes, where the headers are.
fn position(rng: &mut Rng, len: usize) -> usize {
    if len == 0 {
        0
    } else if rng.below(4) == 0 {
        rng.below(len)
    } else {
        rng.below(len.min(80))
    }
}

fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    let at = position(rng, f.len());
    match rng.below(7) {
        0 if !f.is_empty() => f[at] ^= 1 << rng.below(8),
        1 if !f.is_empty() => f[at] = rng.next_u64() as u8,
        2 => {
            let n = 1 + rng.below(8);
            let mut bytes = vec![0; n];
            fill(rng, &mut bytes);
            f.splice(at..at, bytes);
        }
        3 if !f.is_empty() => {
            let end = (at + 1 + rng.below(8)).min(f.len());
            f.drain(at..end);
        }
        4 => f.truncate(ETH_HLEN + rng.below(f.len().saturating_sub(ETH_HLEN).max(1))),
        // An ethertype the parser knows where one is (after 0, 1 or 2 tags) or anywhere.
        5 => {
            let at = [12, 16, 20, at & !1][rng.below(4)];
            let et = ETHERTYPES[rng.below(ETHERTYPES.len())].to_be_bytes();
            if at + 2 <= f.len() {
                f[at..at + 2].copy_from_slice(&et);
            }
        }
        // The IP version nibble (or whatever sits there) changed.
        _ => {
            let at = [14, 18, 22, 26][rng.below(4)];
            if at < f.len() {
                f[at] = (f[at] & 0x0f) | ((rng.below(16) as u8) << 4);
            }
        }
    }
}

fn fill(rng: &mut Rng, bytes: &mut [u8]) {
    for chunk in bytes.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
}

/// The first 96 bytes of a frame in hex, for failure messages.
fn hex(f: &[u8]) -> String {
    let shown: String = f.iter().take(96).map(|b| format!("{b:02x}")).collect();
    format!(
        "{} bytes {shown}{}",
        f.len(),
        if f.len() > 96 { "..." } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_sendable_and_varied() {
        let mut rng = Rng::new(7);
        let frames: Vec<Vec<u8>> = (0..20_000).map(|_| fuzzed_frame(&mut rng)).collect();
        assert!(
            frames
                .iter()
                .all(|f| (ETH_HLEN..=MAX_FRAME).contains(&f.len()))
        );
        let ethertype = |f: &Vec<u8>| u16::from_be_bytes([f[12], f[13]]);
        for et in ETHERTYPES {
            assert!(frames.iter().any(|f| ethertype(f) == et), "{et:#06x}");
        }
        assert!(frames.iter().any(|f| f.len() > 4096), "no jumbo frames");
        // Same seed, same frames.
        let mut again = Rng::new(7);
        assert_eq!(fuzzed_frame(&mut again), frames[0]);
    }
}
