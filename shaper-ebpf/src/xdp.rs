//! The XDP entry point: a thin wrapper around [`crate::entry`].
//!
//! It is multi-buffer aware (`xdp.frags`), so it can be attached to interfaces with a
//! jumbo MTU, whose frames the driver may split over several buffers.

use aya_ebpf::{
    bindings::xdp_action, helpers::bpf_xdp_get_buff_len, macros::xdp, programs::XdpContext,
};

use crate::{
    entry::{Decision, Seen, meter_frame},
    outcome::Verdict,
};

#[xdp(frags)]
pub fn shaper_xdp(ctx: XdpContext) -> u32 {
    // XDP never shapes (attach refuses shape mode on ingress): the departure is unused.
    match try_shaper_xdp(&ctx).verdict {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
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
