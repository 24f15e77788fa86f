//! The tc classifier entry point (TCX, or clsact with `cls_bpf` in direct-action mode),
//! for either direction: a thin wrapper around [`crate::entry`], which also carries out
//! shaping's decisions (egress only): the departure time and the CE mark; and rewrites the
//! DSCP of yellow frames (`meter2`) through the skb helpers, which keep the checksum
//! state of the skb right.

use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, BPF_F_RECOMPUTE_CSUM, TC_ACT_UNSPEC},
    helpers::{bpf_l3_csum_replace, bpf_skb_ecn_set_ce, bpf_skb_set_tstamp, bpf_skb_store_bytes},
    macros::classifier,
    programs::TcContext,
};

use shaper_common::{
    dscp::{ipv6_with_dscp, with_dscp},
    gcra::TICK_SHIFT,
    shape::delay_bucket,
};

use crate::{
    entry::{Decision, Seen, meter_frame},
    meter2,
    outcome::Verdict,
    parse::{Frame, classify},
};

/// The IPv4 header's checksum, from its start.
const IPV4_CHECK_AT: u32 = 10;

/// `TC_ACT_SHOT` (the bindings' type of it differs between the host and BPF targets).
const TC_ACT_SHOT: i32 = 2;
/// `BPF_SKB_TSTAMP_DELIVERY_MONO` (renamed `BPF_SKB_CLOCK_MONOTONIC` in 6.11, same
/// value): the time stamp is a departure time on CLOCK_MONOTONIC, as sch_fq reads it.
const TSTAMP_DELIVERY_MONO: u32 = 1;

#[classifier]
pub fn shaper_tc(ctx: TcContext) -> i32 {
    let decision = try_shaper_tc(&ctx);
    match decision.verdict {
        Verdict::Pass => {
            if let Some(slot) = decision.remark {
                shaper_remark_tc(ctx.as_ptr().cast(), slot);
            }
            // One branch, after metering: the verifier walks the shaping below once per
            // state that reaches here, and few do (everything else is dead by now).
            let delay_ns = decision.delay_ns();
            if delay_ns != 0 {
                shape(&ctx, &decision, delay_ns);
            }
            // Not "OK": the next program or filter, if any, still sees the packet.
            TC_ACT_UNSPEC
        }
        Verdict::Drop => TC_ACT_SHOT,
    }
}

/// Writes `dscp` into the packet's IP header (found again: see
/// `entry::Decision::remark`), ECN bits kept: an IPv4 header's checksum updated with
/// `bpf_l3_csum_replace` (the header's sum is then unchanged, so a CHECKSUM_COMPLETE sum
/// stays right), an IPv6 header's traffic class stored with the packet's sum recomputed.
/// A global function given the context: only yellow frames call it, and its parse is
/// verified once rather than in every state that reaches the verdict.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn shaper_remark_tc(skb: *mut __sk_buff, slot: u32) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(dscp) = meter2::dscp(slot) else {
        return 0;
    };
    let start = ctx.data();
    // SAFETY: `classify` checked that the fixed header lies within the packet; helpers
    // take offsets from the packet's start (its MAC header, in both directions) and the
    // context pointer the kernel passed in.
    unsafe {
        match classify(start, ctx.data_end()) {
            Frame::Ipv6(ip) => {
                let p = ip as *const u8;
                let (b0, b1) = ipv6_with_dscp(*p, *p.add(1), dscp);
                let bytes = [b0, b1];
                bpf_skb_store_bytes(
                    skb,
                    (ip as usize - start) as u32,
                    bytes.as_ptr().cast(),
                    2,
                    u64::from(BPF_F_RECOMPUTE_CSUM),
                );
            }
            Frame::Ipv4(ip) => {
                let p = ip as *const u8;
                let at = (ip as usize - start) as u32;
                let tos = with_dscp(*p.add(1), dscp);
                let old = u16::from_ne_bytes([*p, *p.add(1)]);
                let new = u16::from_ne_bytes([*p, tos]);
                bpf_l3_csum_replace(skb, at + IPV4_CHECK_AT, u64::from(old), u64::from(new), 2);
                bpf_skb_store_bytes(skb, at + 1, (&raw const tos).cast(), 1, 0);
            }
            _ => {}
        }
    }
    0
}

/// Holds a packet back `delay_ns` (sch_fq releases it then), unless it is already held
/// until later (TCP pacing, or another program); marks it CE past the ECN threshold;
/// counts it.
#[inline(always)]
fn shape(ctx: &TcContext, decision: &Decision, delay_ns: u64) {
    let skb = ctx.skb.skb;
    let depart_ns = (decision.now >> TICK_SHIFT) + delay_ns;
    let mut marked = 0;
    // SAFETY: the context pointer is the one the kernel passed in; both helpers take it.
    unsafe {
        // The helper refuses what is not IP by `skb->protocol` (a VLAN tag not
        // offloaded): then the stamp is written as it is, its clock type left alone.
        if (*skb).tstamp < depart_ns
            && bpf_skb_set_tstamp(skb, depart_ns, TSTAMP_DELIVERY_MONO) != 0
        {
            (*skb).tstamp = depart_ns;
        }
        // Sets CE on an ECT(0) or ECT(1) packet, IPv4 (checksum updated) or IPv6; 1 if
        // it did.
        if delay_ns > decision.ecn_threshold_ns && bpf_skb_ecn_set_ce(skb) == 1 {
            marked = 1;
        }
    }
    // SAFETY: this CPU's counters, as the metering found them (see `entry`).
    if let Some(c) = unsafe { decision.counters.as_mut() } {
        c.shaped_packets += 1;
        c.shaped_bytes += decision.len;
        c.ce_marked_packets += marked;
        if let Some(n) = c.shape_delay.get_mut(delay_bucket(delay_ns)) {
            *n += 1;
        }
        c.shape_delay_ns += delay_ns;
    }
}

#[inline(always)]
fn try_shaper_tc(ctx: &TcContext) -> Decision {
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
