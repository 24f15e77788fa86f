//! The benchmark's kernel object, `shaper-ebpf-bench`: programs the lab loads to measure shaper
//! against, never loaded by `shaper` itself (names in `shaper_common::bench`).
//!
//! - `shaper_noop`: passes everything, the baseline of the per-packet costs.
//! - `shaper_floor`: the least a per-source XDP meter must do (parse Ethernet and IPv4,
//!   read the clock, look the source up in an LRU hash map, one compare-and-swap on its
//!   value), the second baseline of the per-packet costs.
//! - `shaper_softirq_entry`/`_exit`: exact softirq time per vector (`softirq`).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod softirq;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::bpf_ktime_get_ns,
    macros::{map, xdp},
    maps::LruHashMap,
    programs::XdpContext,
};
use shaper_common::bench::FLOOR_ENTRIES;
use shaper_ebpf::atomic;

/// The floor's per-source map: source address to the time it was last seen.
#[map(name = "SHAPER_FLOOR")]
static FLOOR: LruHashMap<u32, u64> = LruHashMap::with_max_entries(FLOOR_ENTRIES, 0);

/// Ethernet header length, and where the IPv4 source address lies in an untagged frame.
const ETH_HLEN: usize = 14;
const IPV4_SRC_AT: usize = ETH_HLEN + 12;
const ETH_P_IP: u16 = 0x0800;

/// Passes everything: the baseline against which the per-packet cost is measured. It is
/// multi-buffer aware like `shaper_xdp`, so both run under the same conditions.
#[xdp(frags)]
pub fn shaper_noop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The floor of a per-source meter: parse an untagged Ethernet frame's IPv4 source, read
/// the clock, look the source up (inserting it when new) and swap its value for the time
/// with one compare-and-swap. Passes everything. No policy, no arithmetic, no counters.
#[xdp(frags)]
pub fn shaper_floor(ctx: XdpContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + IPV4_SRC_AT + 4 > end {
        return xdp_action::XDP_PASS;
    }
    // SAFETY: both reads lie in [start, end), checked above.
    let proto = u16::from_be(unsafe { core::ptr::read_unaligned((start + 12) as *const u16) });
    if proto != ETH_P_IP {
        return xdp_action::XDP_PASS;
    }
    // SAFETY: as above.
    let src = unsafe { core::ptr::read_unaligned((start + IPV4_SRC_AT) as *const u32) };
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    match FLOOR.get_ptr_mut(src) {
        Some(p) => {
            // SAFETY: a live, aligned u64 map value, written only through `atomic`.
            unsafe {
                let old = atomic::load(p);
                let _ = atomic::compare_exchange(p, old, now);
            }
        }
        None => {
            let _ = FLOOR.insert(src, now, 0);
        }
    }
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
