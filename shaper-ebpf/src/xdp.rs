//! The XDP entry points.

use aya_ebpf::{
    bindings::xdp_action, helpers::bpf_ktime_get_ns, macros::xdp, programs::XdpContext,
};
use shaper_common::gcra::ticks_from_ns;

use crate::{
    cell::{Verdict, meter},
    counters::bump,
    maps::CONFIG,
    parse::{Frame, classify},
};

#[xdp]
pub fn shaper_xdp(ctx: XdpContext) -> u32 {
    match try_shaper_xdp(&ctx) {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

fn try_shaper_xdp(ctx: &XdpContext) -> Verdict {
    let (start, end) = (ctx.data(), ctx.data_end());
    let len = (end - start) as u32;
    let len64 = u64::from(len);
    let src = match classify(start, end) {
        Frame::Ipv4 { src } => src,
        Frame::NotIpv4 => {
            bump(|c| {
                c.not_ipv4_packets += 1;
                c.not_ipv4_bytes += len64;
            });
            return Verdict::Pass;
        }
        Frame::Malformed => {
            bump(|c| {
                c.malformed_packets += 1;
                c.malformed_bytes += len64;
            });
            return Verdict::Pass;
        }
    };
    let config = match CONFIG.get(0) {
        Some(config) if config.active != 0 => config,
        _ => {
            bump(|c| c.unconfigured_packets += 1);
            return Verdict::Pass;
        }
    };
    // SAFETY: a helper with no preconditions.
    let now = ticks_from_ns(unsafe { bpf_ktime_get_ns() });
    let verdict = meter(src, len, now, &config.limit);
    bump(|c| match verdict {
        Verdict::Pass => {
            c.passed_packets += 1;
            c.passed_bytes += len64;
        }
        Verdict::Drop => {
            c.dropped_packets += 1;
            c.dropped_bytes += len64;
        }
    });
    verdict
}

/// Passes everything: the baseline against which the per-packet cost is measured.
#[xdp]
pub fn shaper_noop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}
