//! A frame's key: the configured address (source or destination) masked to the
//! configured prefix, with the mask precomputed by userspace so this is a few loads and
//! ANDs; an address that belongs to no one's prefix (link-local, unspecified, multicast:
//! `shaper_common::keys`) is kept whole, its mask all ones, without a branch.

use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use shaper_common::{
    keys::{v4_per_address, v6_per_address},
    maps::{Config, Ipv4Key, Ipv6Key, KEY_BY_DST},
};

/// # Safety
/// `ip` points to a whole IPv4 header inside the frame (`parse::classify` checked it).
#[inline(always)]
pub unsafe fn v4(ip: *const Ipv4Hdr, config: &Config) -> Ipv4Key {
    let addr = unsafe {
        if config.key_by == KEY_BY_DST {
            (*ip).dst_addr
        } else {
            (*ip).src_addr
        }
    };
    // All ones for an address keyed by itself, otherwise nothing.
    let whole = 0u32.wrapping_sub(u32::from(v4_per_address(addr)));
    u32::from_ne_bytes(addr) & (config.mask_v4 | whole)
}

/// The IPv6 key in two halves, its bytes in memory order (`u64::from_ne_bytes`), as the
/// meter takes it (`meter::Key::V6`).
///
/// # Safety
/// `ip` points to a whole IPv6 fixed header inside the frame.
#[inline(always)]
pub unsafe fn v6(ip: *const Ipv6Hdr, config: &Config) -> (u64, u64) {
    let addr = unsafe {
        if config.key_by == KEY_BY_DST {
            &(*ip).dst_addr
        } else {
            &(*ip).src_addr
        }
    };
    // All ones for an address keyed by itself, otherwise nothing.
    let whole = 0u8.wrapping_sub(u8::from(v6_per_address(addr)));
    let half = |at: usize| {
        let mut bytes = [0u8; 8];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = addr[at + i] & (config.mask_v6[at + i] | whole);
        }
        u64::from_ne_bytes(bytes)
    };
    (half(0), half(8))
}

/// The IPv6 key of its halves ([`v6`]'s), as the maps take it.
#[inline(always)]
pub fn join(hi: u64, lo: u64) -> Ipv6Key {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&hi.to_ne_bytes());
    key[8..].copy_from_slice(&lo.to_ne_bytes());
    key
}
