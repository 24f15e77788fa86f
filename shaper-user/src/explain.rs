//! `shaper explain`: what a rate and burst mean on the wire, before they are enforced.
//!
//! Pure arithmetic on the operator's figures; nothing touches the kernel.

use serde::Serialize;

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

#[cfg(test)]
mod tests {
    use super::*;

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
