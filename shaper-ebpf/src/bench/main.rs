//! The benchmark's kernel object, `shaper-ebpf-bench`: programs the lab loads to measure shaper
//! against, never loaded by `shaper` itself (names in `shaper_common::bench`).
//!
//! - `shaper_noop`: passes everything, the baseline of the per-packet costs.
//! - `shaper_softirq_entry`/`_exit`: exact softirq time per vector (`softirq`).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod softirq;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

/// Passes everything: the baseline against which the per-packet cost is measured. It is
/// multi-buffer aware like `shaper_xdp`, so both run under the same conditions.
#[xdp(frags)]
pub fn shaper_noop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

/// The host build of this crate exists only so the workspace builds and lints as one.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
