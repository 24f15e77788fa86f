//! What every entry point runs: parse, key, policy, cell and counters for one frame.
//!
//! An entry point (`xdp`, `tc`) only says what its hook saw ([`Seen`]) and turns the
//! [`Verdict`] into its hook's return code.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use shaper_common::{
    gcra::{TICK_SHIFT, ticks_from_ns},
    maps::Counters,
};

use crate::{
    key,
    maps::{CONFIG, COUNTERS},
    meter::{Key, meter},
    outcome::{Verdict, count_outcome},
    parse::{Frame, classify, header_len},
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

/// What to do with a frame.
#[derive(Clone, Copy)]
pub struct Decision {
    pub verdict: Verdict,
    /// Shaping: how long the frame is held back, in ticks (0: it may leave now, always
    /// when policing).
    pub delay: u64,
    pub now: u64,
    /// Its wire bytes.
    pub len: u64,
    pub ecn_threshold_ns: u64,
    /// This CPU's global counters (null when the frame was not metered).
    pub counters: *mut Counters,
    /// A yellow frame (`meter2`): the policy slot whose DSCP to write into its IP header.
    pub remark: Option<u32>,
}

impl Decision {
    #[inline(always)]
    fn now(verdict: Verdict) -> Self {
        Self {
            verdict,
            delay: 0,
            now: 0,
            len: 0,
            ecn_threshold_ns: 0,
            counters: core::ptr::null_mut(),
            remark: None,
        }
    }

    /// How long the frame is held back, in nanoseconds (0: it leaves now).
    #[inline(always)]
    pub fn delay_ns(&self) -> u64 {
        self.delay >> TICK_SHIFT
    }
}

/// Meters one frame: its verdict, every counter updated.
#[inline(always)]
pub fn meter_frame(seen: &Seen) -> Decision {
    let frame = classify(seen.start, seen.end);
    let len64 = seen.wire_len(&frame);
    // This CPU's counters, looked up once and handed down to the metering.
    let Some(counters) = COUNTERS.get_ptr_mut(0) else {
        return Decision::now(Verdict::Pass);
    };
    // SAFETY: a per-CPU entry is only touched by programs on this CPU, and BPF programs
    // are not preempted by each other on one CPU.
    let c = unsafe { &mut *counters };
    if !matches!(frame, Frame::Ipv4(_) | Frame::Ipv6(_)) {
        let (packets, bytes) = match frame {
            Frame::NotIp => (&mut c.not_ip_packets, &mut c.not_ip_bytes),
            Frame::PppoeOther => (&mut c.pppoe_other_packets, &mut c.pppoe_other_bytes),
            Frame::VlanTooDeep => (&mut c.vlan_too_deep_packets, &mut c.vlan_too_deep_bytes),
            _ => (&mut c.malformed_packets, &mut c.malformed_bytes),
        };
        *packets += 1;
        *bytes += len64;
        return Decision::now(Verdict::Pass);
    }
    let config = match CONFIG.get(0) {
        Some(config) if config.active != 0 => config,
        _ => {
            c.unconfigured_packets += 1;
            return Decision::now(Verdict::Pass);
        }
    };
    // Frames are far below 4 GiB (the GCRA clamps what it charges much lower anyway).
    let len = len64 as u32;
    // SAFETY: a helper with no preconditions.
    let now = ticks_from_ns(unsafe { bpf_ktime_get_ns() });
    // SAFETY: `classify` returned pointers to headers it checked lie in the frame.
    let key = match frame {
        Frame::Ipv4(ip) => {
            c.ipv4_packets += 1;
            Key::V4(unsafe { key::v4(ip, config) })
        }
        Frame::Ipv6(ip) => {
            c.ipv6_packets += 1;
            let (hi, lo) = unsafe { key::v6(ip, config) };
            Key::V6(hi, lo)
        }
        _ => return Decision::now(Verdict::Pass),
    };
    let (metered, slot) = meter(key, len, now, config, c);
    if metered.is_untracked() {
        c.untracked_packets += 1;
    }
    let outcomes = if metered.is_unadmitted() {
        &mut c.unadmitted
    } else {
        &mut c.outcomes
    };
    let outcome = metered.outcome();
    count_outcome(outcomes, outcome, len64);
    Decision {
        verdict: outcome.verdict(),
        delay: metered.delay_ticks(),
        now,
        len: len64,
        ecn_threshold_ns: config.shape.ecn_threshold_ns,
        counters,
        // The header is found again by the entry point's remark: a packet pointer kept
        // across the metering would keep apart, for the verifier, the paths of every
        // encapsulation, which otherwise meet once the key is read.
        remark: metered.remarks().then_some(slot),
    }
}
