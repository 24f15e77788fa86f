//! shaper's kernel programs.
//!
//! # Theory of operation
//! `shaper_xdp` runs on every frame an interface receives. It parses Ethernet, up to two
//! VLAN tags, PPPoE sessions, and the fixed IPv4 or IPv6 header with one bounds-checked
//! cursor (`parse`); anything else passes untouched and is counted by kind. An IP frame's
//! key is its source (or, as configured, destination) address masked to a prefix
//! (`key`); the program finds the key's GCRA cell in the LRU hash `SHAPER_SOURCES`
//! (IPv4) or `SHAPER_SOURCES6` (IPv6), creating it on first sight, and asks the shared
//! arithmetic (`shaper_common::gcra`) whether the frame's bytes fit the configured rate
//! and burst (`SHAPER_CONFIG`). The cell is one 64-bit TAT that every CPU updates with a
//! bounded compare-and-swap loop (`cell`), so all CPUs meter one bucket per key.
//! Conforming frames pass, the rest are dropped; per-key counters are updated with atomic
//! adds, global ones in a per-CPU array (`counters`).
//!
//! A frame costs its whole length: Ethernet header to end of payload, every buffer of a
//! multi-buffer (jumbo) frame included, no FCS — what tc counts.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// The bpfel target has no compare-and-swap in core::sync::atomic; see `atomic`.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(internal_features, reason = "core_intrinsics, see atomic.rs")
)]

mod atomic;
mod cell;
mod counters;
mod key;
mod maps;
mod parse;
mod softirq;
mod xdp;

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
