//! The XDP entry points.
//!
//! Both are multi-buffer aware (`xdp.frags`), so they can be attached to interfaces with a
//! jumbo MTU, whose frames the driver may split over several buffers.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_ktime_get_ns, bpf_xdp_get_buff_len},
    macros::xdp,
    programs::XdpContext,
};
use shaper_common::gcra::ticks_from_ns;

use crate::{
    cell::{Metered, Verdict, count_outcome, meter},
    counters::bump,
    key,
    maps::{CONFIG, SOURCES, SOURCES6},
    parse::{Frame, classify},
    policy,
};

#[xdp(frags)]
pub fn shaper_xdp(ctx: XdpContext) -> u32 {
    match try_shaper_xdp(&ctx) {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

#[inline(always)]
fn try_shaper_xdp(ctx: &XdpContext) -> Verdict {
    // The whole frame, fragments included: `data_end - data` is only the linear part.
    // SAFETY: the context pointer is the one the kernel passed in.
    let len64 = unsafe { bpf_xdp_get_buff_len(ctx.ctx) };
    let frame = classify(ctx.data(), ctx.data_end());
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
            (meter(&SOURCES, &key, len, now, config, lookup), 1)
        }
        Frame::Ipv6(ip) => {
            let key = unsafe { key::v6(ip, config) };
            let lookup = || policy::slot_v6(&key, config);
            (meter(&SOURCES6, &key, len, now, config, lookup), 0)
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
