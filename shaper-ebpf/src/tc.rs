//! The tc classifier entry point (TCX, or clsact with `cls_bpf` in direct-action mode),
//! for either direction: a thin wrapper around [`crate::entry`].

use aya_ebpf::{bindings::TC_ACT_UNSPEC, macros::classifier, programs::TcContext};

use crate::{
    cell::Verdict,
    entry::{Seen, meter_frame},
};

/// `TC_ACT_SHOT` (the bindings' type of it differs between the host and BPF targets).
const TC_ACT_SHOT: i32 = 2;

#[classifier]
pub fn shaper_tc(ctx: TcContext) -> i32 {
    match try_shaper_tc(&ctx) {
        // Not "OK": the next program or filter, if any, still sees the packet.
        Verdict::Pass => TC_ACT_UNSPEC,
        Verdict::Drop => TC_ACT_SHOT,
    }
}

#[inline(always)]
fn try_shaper_tc(ctx: &TcContext) -> Verdict {
    // `len` counts from the Ethernet header in both directions: on ingress tc pushes the
    // MAC header back before running the program. A GSO packet (TSO on egress, GRO on
    // ingress) is `gso_segs` frames on the wire.
    // SAFETY: the context pointer is the one the kernel passed in.
    let segs = unsafe { (*ctx.skb.skb).gso_segs };
    meter_frame(&Seen {
        start: ctx.data(),
        end: ctx.data_end(),
        len: u64::from(ctx.len()),
        segs,
    })
}
