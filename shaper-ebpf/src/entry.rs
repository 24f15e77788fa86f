//! What every entry point runs: parse, key, policy, cell and counters for one frame.
//!
//! An entry point (`xdp`, `tc`) only says what its hook saw ([`Seen`]) and turns the
//! [`Verdict`] into its hook's return code.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use shaper_common::gcra::ticks_from_ns;

use crate::{
    cell::{Metered, Verdict, count_outcome, meter},
    counters::bump,
    key,
    maps::{CONFIG, SOURCES, SOURCES6},
    parse::{Frame, classify, header_len},
    policy, watch,
};

/// A frame as a hook saw it.
pub struct Seen {
    /// The linear bytes `[start, end)`, from the Ethernet header.
    pub start: usize,
    pub end: usize,
    /// Its whole length from the Ethernet header, every buffer or fragment included.
    pub len: u64,
    /// How many frames it leaves as on the wire: its GSO segments, 1 if it is not GSO.
    pub segs: u32,
}

impl Seen {
    /// The bytes `frame` puts on the wire: its length, plus the headers each GSO segment
    /// after the first repeats (what the kernel's `qdisc_pkt_len_init` charges qdiscs).
    #[inline(always)]
    fn wire_len(&self, frame: &Frame) -> u64 {
        if self.segs <= 1 {
            return self.len;
        }
        let headers = header_len(self.start, self.end, frame) as u64;
        self.len + u64::from(self.segs - 1) * headers
    }
}

/// Meters one frame: its verdict, every counter updated.
#[inline(always)]
pub fn meter_frame(seen: &Seen) -> Verdict {
    let frame = classify(seen.start, seen.end);
    let len64 = seen.wire_len(&frame);
    if !matches!(frame, Frame::Ipv4(_) | Frame::Ipv6(_)) {
        bump(|c| {
            let (packets, bytes) = match frame {
                Frame::NotIp => (&mut c.not_ip_packets, &mut c.not_ip_bytes),
                Frame::PppoeOther => (&mut c.pppoe_other_packets, &mut c.pppoe_other_bytes),
                Frame::VlanTooDeep => (&mut c.vlan_too_deep_packets, &mut c.vlan_too_deep_bytes),
                _ => (&mut c.malformed_packets, &mut c.malformed_bytes),
            };
            *packets += 1;
            *bytes += len64;
        });
        return Verdict::Pass;
    }
    let config = match CONFIG.get(0) {
        Some(config) if config.active != 0 => config,
        _ => {
            bump(|c| c.unconfigured_packets += 1);
            return Verdict::Pass;
        }
    };
    // Frames are far below 4 GiB (the GCRA clamps what it charges much lower anyway).
    let len = len64 as u32;
    // SAFETY: a helper with no preconditions.
    let now = ticks_from_ns(unsafe { bpf_ktime_get_ns() });
    let (metered, v4) = match frame {
        // SAFETY: `classify` returned pointers to headers it checked lie in the frame.
        Frame::Ipv4(ip) => {
            let key = unsafe { key::v4(ip, config) };
            let lookup = || policy::slot_v4(&key, config);
            let metered = meter(&SOURCES, &key, len, now, config, lookup);
            watch::refused(&metered, len, now, |info| {
                watch::sample_v4(key, config, info, now)
            });
            (metered, 1)
        }
        Frame::Ipv6(ip) => {
            let key = unsafe { key::v6(ip, config) };
            let lookup = || policy::slot_v6(&key, config);
            let metered = meter(&SOURCES6, &key, len, now, config, lookup);
            watch::refused(&metered, len, now, |info| {
                watch::sample_v6(&key, config, info, now)
            });
            (metered, 0)
        }
        _ => return Verdict::Pass,
    };
    let Metered {
        outcome,
        unadmitted,
    } = metered;
    bump(|c| {
        c.ipv4_packets += v4;
        c.ipv6_packets += 1 - v4;
        let outcomes = if unadmitted {
            &mut c.unadmitted
        } else {
            &mut c.outcomes
        };
        count_outcome(outcomes, outcome, len64);
    });
    outcome.verdict()
}
