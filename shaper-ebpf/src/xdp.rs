//! The XDP entry point: a thin wrapper around [`crate::entry`], which also rewrites the
//! DSCP of yellow frames (`meter2`) in place.
//!
//! It is multi-buffer aware (`xdp.frags`), so it can be attached to interfaces with a
//! jumbo MTU, whose frames the driver may split over several buffers.

use core::ptr::{read_unaligned, write_unaligned};

use aya_ebpf::{
    EbpfContext,
    bindings::{xdp_action, xdp_md},
    helpers::bpf_xdp_get_buff_len,
    macros::xdp,
    programs::XdpContext,
};
use shaper_common::dscp::{csum_replace2, ipv6_with_dscp, with_dscp};

use crate::{
    entry::{Decision, Seen, meter_frame},
    meter2,
    outcome::Verdict,
    parse::{Frame, classify},
};

/// The IPv4 header's checksum, from its start.
const IPV4_CHECK_AT: usize = 10;

#[xdp(frags)]
pub fn shaper_xdp(ctx: XdpContext) -> u32 {
    // XDP never shapes (attach refuses shape mode on ingress): the departure is unused.
    let decision = try_shaper_xdp(&ctx);
    match decision.verdict {
        Verdict::Pass => {
            if let Some(slot) = decision.remark {
                shaper_remark_xdp(ctx.as_ptr().cast(), slot);
            }
            xdp_action::XDP_PASS
        }
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

/// Writes `dscp` into the frame's IP header (found again: see `entry::Decision::remark`),
/// ECN bits kept, an IPv4 header's checksum updated incrementally (RFC 1624,
/// `shaper_common::dscp`). A global function given the context: only yellow frames call
/// it, and its parse is verified once rather than in every state that reaches the verdict.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_remark_xdp(ctx: *mut xdp_md, slot: u32) -> u32 {
    let ctx = XdpContext::new(ctx);
    let Some(dscp) = meter2::dscp(slot) else {
        return 0;
    };
    // SAFETY: `classify` checked that the fixed header lies within the frame.
    unsafe {
        match classify(ctx.data(), ctx.data_end()) {
            Frame::Ipv6(ip) => {
                let p = ip as *mut u8;
                let (b0, b1) = ipv6_with_dscp(*p, *p.add(1), dscp);
                *p = b0;
                *p.add(1) = b1;
            }
            Frame::Ipv4(ip) => {
                let p = ip as *mut u8;
                let old = read_unaligned(p as *const u16);
                *p.add(1) = with_dscp(*p.add(1), dscp);
                let new = read_unaligned(p as *const u16);
                let check = p.add(IPV4_CHECK_AT) as *mut u16;
                write_unaligned(check, csum_replace2(read_unaligned(check), old, new));
            }
            _ => {}
        }
    }
    0
}

#[inline(always)]
fn try_shaper_xdp(ctx: &XdpContext) -> Decision {
    // The whole frame, fragments included: `data_end - data` is only the linear part.
    // SAFETY: the context pointer is the one the kernel passed in.
    let len = unsafe { bpf_xdp_get_buff_len(ctx.ctx) };
    // XDP sees frames as they arrive: a GSO packet is built later, by GRO.
    meter_frame(&Seen {
        start: ctx.data(),
        end: ctx.data_end(),
        len,
        segs: 1,
    })
}
