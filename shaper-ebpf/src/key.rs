//! A frame's key: the configured address (source or destination) masked to the
//! configured prefix, with the mask precomputed by userspace so this is a few loads and
//! ANDs.

use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use shaper_common::maps::{Config, Ipv4Key, Ipv6Key, KEY_BY_DST};

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
    u32::from_ne_bytes(addr) & config.mask_v4
}

/// # Safety
/// `ip` points to a whole IPv6 fixed header inside the frame.
#[inline(always)]
pub unsafe fn v6(ip: *const Ipv6Hdr, config: &Config) -> Ipv6Key {
    let addr = unsafe {
        if config.key_by == KEY_BY_DST {
            &(*ip).dst_addr
        } else {
            &(*ip).src_addr
        }
    };
    let mut key = [0u8; 16];
    for ((k, a), m) in key.iter_mut().zip(addr).zip(&config.mask_v6) {
        *k = a & m;
    }
    key
}
