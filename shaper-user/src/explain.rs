//! `shaper explain`: what a rate and burst mean on the wire, before they are enforced, and
//! what a bandwidth profile's excess rate and a packet rate mean for a frame size.
//!
//! Pure arithmetic on the operator's figures; nothing touches the kernel.

use serde::Serialize;
use shaper_common::{config::Meter2Limits, dscp::Dscp};

use crate::units::{Rate, Size, human_bytes, human_rate};

/// A full-size Ethernet frame on a 1500-byte MTU (without FCS), as shaper counts it.
pub const FULL_FRAME_BYTES: u64 = 1514;
/// The frame size `explain` quotes a time for (a full IP packet).
pub const QUOTED_FRAME_BYTES: u64 = 1500;
/// Round-trip times a TCP flow commonly sees: same metro, same continent, intercontinental.
pub const TYPICAL_RTTS_MS: [u64; 3] = [10, 50, 100];
/// Below rate × this round trip, `explain` warns that TCP will not reach the rate.
pub const TCP_RTT_WARN_MS: u64 = 10;

/// What a rate and burst come to.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    pub rate_bps: u64,
    pub rate_bytes_per_sec: f64,
    /// Time one byte takes at the rate.
    pub byte_time_ns: f64,
    /// Time one 1500-byte frame takes at the rate.
    pub frame_1500_time_us: f64,
    pub burst_bytes: u64,
    /// The burst as time at the rate: how long a source may send at line rate from idle
    /// before the rate applies (on an infinitely fast line; the real line's time is less).
    pub burst_ms: f64,
    /// Full-size (1514-byte) frames the burst holds.
    pub burst_full_frames: u64,
    /// rate × RTT for each of [`TYPICAL_RTTS_MS`]: the burst one TCP flow needs to reach
    /// the rate through a policer at that round trip.
    pub tcp_bursts: Vec<TcpBurst>,
    pub warnings: Vec<String>,
}

/// The burst one TCP flow needs at one round-trip time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TcpBurst {
    pub rtt_ms: u64,
    pub burst_bytes: u64,
}

/// The arithmetic of `rate` and `burst`.
pub fn explain(rate: Rate, burst: Size) -> Explanation {
    let rate_bps = rate.bits_per_sec().max(1);
    let bytes_per_sec = rate_bps as f64 / 8.0;
    let burst_bytes = burst.bytes();
    let tcp = |rtt_ms: u64| -> u64 {
        (u128::from(rate_bps) * u128::from(rtt_ms) / 8 / 1000)
            .try_into()
            .unwrap_or(u64::MAX)
    };
    let tcp_bursts: Vec<TcpBurst> = TYPICAL_RTTS_MS
        .iter()
        .map(|&rtt_ms| TcpBurst {
            rtt_ms,
            burst_bytes: tcp(rtt_ms),
        })
        .collect();
    let mut warnings = Vec::new();
    if burst_bytes < FULL_FRAME_BYTES {
        warnings.push(format!(
            "the burst ({burst_bytes} B) is below one full-size frame ({FULL_FRAME_BYTES} B on a \
             1500-byte MTU): such frames can never pass, and attach refuses it"
        ));
    }
    let need = tcp(TCP_RTT_WARN_MS);
    if burst_bytes < need {
        warnings.push(format!(
            "the burst is below rate × {TCP_RTT_WARN_MS} ms ({}): a policer drops what a TCP \
             flow sends past it in one round trip, so TCP will stay well below {}; \
             use about rate × RTT",
            human_bytes(need),
            human_rate(rate_bps)
        ));
    }
    Explanation {
        rate_bps,
        rate_bytes_per_sec: bytes_per_sec,
        byte_time_ns: 1e9 / bytes_per_sec,
        frame_1500_time_us: QUOTED_FRAME_BYTES as f64 * 1e6 / bytes_per_sec,
        burst_bytes,
        burst_ms: burst_bytes as f64 * 1e3 / bytes_per_sec,
        burst_full_frames: burst_bytes / FULL_FRAME_BYTES,
        tcp_bursts,
        warnings,
    }
}

/// What a second meter (`--excess-rate`, `--packet-rate`) beside a rate means for frames
/// of one size, sent flat out by one source: what passes unmarked (green) and marked
/// (yellow), and which limit binds. The packet rate is checked first and counts green and
/// yellow frames alike; a frame within it is green if the committed rate allows it, else
/// yellow if the excess rate does (RFC 4115: the two byte rates add up).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Profile {
    /// The frame size asked about, as shaper counts a frame (from the Ethernet header,
    /// without the FCS).
    pub frame_bytes: u64,
    /// Frames a second the committed rate passes at this size.
    pub committed_frames_per_sec: f64,
    /// The excess rate (0: none), its burst, and the DSCP yellow frames get (`null`: none).
    pub excess_rate_bps: u64,
    pub excess_burst_bytes: u64,
    pub excess_dscp: Option<String>,
    /// Frames a second the excess rate passes at this size.
    pub excess_frames_per_sec: f64,
    /// The packet rate (0: none) and burst, and what they come to at this size, in bytes.
    pub packet_rate: u64,
    pub packet_burst: u64,
    pub packet_rate_bps: f64,
    pub packet_burst_bytes: u64,
    /// The frame size at which the packet rate and the byte rates (committed plus excess)
    /// allow the same bytes: smaller frames are held by the packet rate (`null`: no
    /// packet rate).
    pub packet_rate_binds_below_bytes: Option<f64>,
    /// What binds at this size: `packet rate` or `byte rate`.
    pub binding: &'static str,
    /// At most, of a source sending flat out at this size (burst aside): passed unmarked,
    /// passed marked, and both.
    pub green_bps: f64,
    pub yellow_bps: f64,
    pub passed_bps: f64,
}

/// The arithmetic of a second meter `m` beside the committed `rate`, for frames of
/// `frame` bytes (see [`Profile`]).
pub fn profile(rate: Rate, m: &Meter2Limits, frame: Size) -> Profile {
    let frame_bytes = frame.bytes().max(1);
    let frame_bits = frame_bytes as f64 * 8.0;
    let committed = rate.bits_per_sec() as f64;
    let excess = m.excess_rate_bps as f64;
    let packet_rate_bps = m.packet_rate as f64 * frame_bits;
    let bytes_bound = committed + excess;
    let packet_binds = m.packet_rate != 0 && packet_rate_bps < bytes_bound;
    let passed = if packet_binds {
        packet_rate_bps
    } else {
        bytes_bound
    };
    let green = passed.min(committed);
    Profile {
        frame_bytes,
        committed_frames_per_sec: committed / frame_bits,
        excess_rate_bps: m.excess_rate_bps,
        excess_burst_bytes: m.excess_burst_bytes,
        excess_dscp: (m.excess_rate_bps != 0).then(|| {
            Dscp::new(m.excess_dscp).map_or_else(|| m.excess_dscp.to_string(), |d| d.to_string())
        }),
        excess_frames_per_sec: excess / frame_bits,
        packet_rate: m.packet_rate,
        packet_burst: m.packet_burst,
        packet_rate_bps,
        packet_burst_bytes: m.packet_burst.saturating_mul(frame_bytes),
        packet_rate_binds_below_bytes: (m.packet_rate != 0)
            .then(|| bytes_bound / 8.0 / m.packet_rate as f64),
        binding: if packet_binds {
            "packet rate"
        } else {
            "byte rate"
        },
        green_bps: green,
        yellow_bps: passed - green,
        passed_bps: passed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(excess: &str, packets: u64) -> Meter2Limits {
        Meter2Limits {
            excess_rate_bps: excess.parse::<Rate>().map_or(0, Rate::bits_per_sec),
            excess_burst_bytes: 65_536,
            excess_dscp: 8,
            packet_rate: packets,
            packet_burst: packets / 10,
        }
    }

    #[test]
    fn the_worked_isp_profile_at_full_size_and_at_64_bytes() {
        // CIR 10 Mbit/s, EIR 10 Mbit/s marked CS1, 2000 frames a second.
        let m = limits("10mbit", 2_000);
        let full = profile("10mbit".parse().unwrap(), &m, Size::from_bytes(1250));
        // 1250-byte frames: 1000 a second each for CIR and EIR; 2000/s is 20 Mbit/s, the
        // byte rates' sum: the crossover itself.
        assert_eq!(full.committed_frames_per_sec, 1_000.0);
        assert_eq!(full.excess_frames_per_sec, 1_000.0);
        assert_eq!(full.packet_rate_bps, 20e6);
        assert_eq!(full.packet_rate_binds_below_bytes, Some(1250.0));
        assert_eq!(full.binding, "byte rate");
        assert_eq!((full.green_bps, full.yellow_bps), (10e6, 10e6));
        assert_eq!(full.excess_dscp.as_deref(), Some("cs1"));
        // 64-byte frames: 2000/s is 1.024 Mbit/s, all of it green.
        let small = profile("10mbit".parse().unwrap(), &m, Size::from_bytes(64));
        assert_eq!(small.binding, "packet rate");
        assert_eq!(small.packet_rate_bps, 1_024_000.0);
        assert_eq!(small.packet_burst_bytes, 200 * 64);
        assert_eq!((small.green_bps, small.yellow_bps), (1_024_000.0, 0.0));
        // 1000-byte frames: 16 Mbit/s, 10 green and 6 yellow.
        let mid = profile("10mbit".parse().unwrap(), &m, Size::from_bytes(1000));
        assert_eq!(mid.binding, "packet rate");
        assert_eq!((mid.green_bps, mid.yellow_bps), (10e6, 6e6));
    }

    #[test]
    fn without_a_packet_rate_the_byte_rates_bind() {
        let p = profile(
            "10mbit".parse().unwrap(),
            &limits("5mbit", 0),
            Size::from_bytes(64),
        );
        assert_eq!(p.binding, "byte rate");
        assert_eq!(p.packet_rate_binds_below_bytes, None);
        assert_eq!(p.passed_bps, 15e6);
        let none = profile(
            "10mbit".parse().unwrap(),
            &Meter2Limits::default(),
            Size::from_bytes(1514),
        );
        assert_eq!((none.yellow_bps, none.excess_dscp), (0.0, None));
    }

    fn ex(rate: &str, burst: &str) -> Explanation {
        explain(rate.parse().unwrap(), burst.parse().unwrap())
    }

    #[test]
    fn ten_megabit_with_64k() {
        let e = ex("10mbit", "64k");
        assert_eq!(e.rate_bps, 10_000_000);
        assert!((e.rate_bytes_per_sec - 1_250_000.0).abs() < 1e-9);
        assert!((e.byte_time_ns - 800.0).abs() < 1e-9);
        assert!((e.frame_1500_time_us - 1200.0).abs() < 1e-9);
        assert_eq!(e.burst_bytes, 65_536);
        assert!((e.burst_ms - 52.4288).abs() < 1e-9);
        assert_eq!(e.burst_full_frames, 43);
        let tcp: Vec<(u64, u64)> = e
            .tcp_bursts
            .iter()
            .map(|t| (t.rtt_ms, t.burst_bytes))
            .collect();
        assert_eq!(tcp, [(10, 12_500), (50, 62_500), (100, 125_000)]);
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
    }

    #[test]
    fn warns_below_one_frame_and_below_tcp_needs() {
        let e = ex("10mbit", "1000b");
        assert_eq!(e.warnings.len(), 2, "{:?}", e.warnings);
        assert!(e.warnings[0].contains("below one full-size frame"));
        assert!(e.warnings[1].contains("TCP"));
        // A gigabit with 64k: a frame fits, TCP's 10 ms (1.25 MB) does not.
        let e = ex("1gbit", "64k");
        assert_eq!(e.warnings.len(), 1, "{:?}", e.warnings);
        assert!(e.warnings[0].contains("TCP"));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let e = ex("100tbit", "4g");
        assert!(e.byte_time_ns > 0.0 && e.byte_time_ns.is_finite());
        assert!(e.tcp_bursts.iter().all(|t| t.burst_bytes > 0));
        let e = ex("8bit", "1514b");
        assert!((e.byte_time_ns - 1e9).abs() < 1e-3);
    }
}
