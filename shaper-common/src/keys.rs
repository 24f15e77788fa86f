//! Addresses keyed by themselves, whatever prefix the keys are masked to (issue 32).
//!
//! A prefix key (`/64`, or a short `--prefix-v4`) stands for one customer's block. Some
//! addresses belong to no customer's block: every host on a link uses link-local
//! addresses, a host with no address yet sends from the unspecified one, and multicast
//! groups are every listener's. Masked, each of those ranges would be one key, shared by
//! every host on the port: one host flooding from any `fe80::` address would drain the
//! bucket the router's neighbour advertisements are metered by. So these are keyed per
//! address (/128, /32): the program ORs an all-ones mask into the configured one for them,
//! and userspace shows such keys as the address alone and lets policies name them.
//!
//! - IPv6: `::/8` (the unspecified `::` of duplicate address detection, with the rest of
//!   the reserved block around it: loopback, the IPv4-mapped and NAT64 `64:ff9b::/96`
//!   addresses), `fe80::/10` (link-local), `ff00::/8` (multicast).
//! - IPv4: `0.0.0.0/8` (the unspecified `0.0.0.0` of DHCP discovery, and "this network"
//!   around it), `169.254.0.0/16` (link-local), `224.0.0.0/3` (multicast `224.0.0.0/4`,
//!   then the reserved `240.0.0.0/4` with the limited broadcast `255.255.255.255`).
//!
//! Whole blocks, not the single unspecified address: an address outside a block never
//! masks into it (with key prefixes of at least /10 and /16), so a spoofer sending from
//! `::1` or `0.0.0.7` cannot drain the bucket of `::` or `0.0.0.0`.
//!
//! Written without short-circuits, so the program computes them without a branch.

/// Whether an IPv6 address (bytes in network order) is keyed by itself.
#[inline(always)]
pub fn v6_per_address(addr: &[u8; 16]) -> bool {
    // `::/8` and `ff00::/8` in one compare: 0x00 and 0xff are the two bytes that wrap
    // below 2 when 1 is added.
    let reserved_or_multicast = addr[0].wrapping_add(1) < 2;
    let link_local = u16::from_be_bytes([addr[0], addr[1]]) & 0xffc0 == 0xfe80;
    reserved_or_multicast | link_local
}

/// Whether an IPv4 address (bytes in network order) is keyed by itself.
#[inline(always)]
pub fn v4_per_address(addr: [u8; 4]) -> bool {
    // `0.0.0.0/8` and `224.0.0.0/3` in one compare: the bytes that wrap to 223 and above
    // when 1 is taken.
    let this_network_or_multicast = addr[0].wrapping_sub(1) >= 223;
    let link_local = u16::from_be_bytes([addr[0], addr[1]]) == 0xa9fe;
    this_network_or_multicast | link_local
}

/// The ranges [`v6_per_address`] holds, as (address, prefix length): what a prefix policy
/// longer than the keys may lie in.
pub const PER_ADDRESS_V6: [([u8; 16], u8); 3] = [
    ([0; 16], 8),
    ([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 10),
    ([0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8),
];

/// The ranges [`v4_per_address`] holds.
pub const PER_ADDRESS_V4: [([u8; 4], u8); 3] = [
    ([0, 0, 0, 0], 8),
    ([169, 254, 0, 0], 16),
    ([224, 0, 0, 0], 3),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(s: &str) -> bool {
        let a: core::net::Ipv6Addr = s.parse().unwrap();
        v6_per_address(&a.octets())
    }

    fn v4(s: &str) -> bool {
        let a: core::net::Ipv4Addr = s.parse().unwrap();
        v4_per_address(a.octets())
    }

    #[test]
    fn link_local_unspecified_and_multicast_v6_are_per_address() {
        for yes in [
            "::",
            "::1",
            "::ffff:192.0.2.1",
            "64:ff9b::192.0.2.1",
            "ff:ffff::1",
            "fe80::",
            "fe80::1",
            "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "ff02::1",
            "ff02::1:ff00:1",
            "ff0e::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            assert!(v6(yes), "{yes}");
        }
        for no in [
            "100::1",
            "2001:db8::1",
            "fe7f:ffff::1",
            "fec0::1",
            "fd00::1",
            "feff::1",
            "8000::",
        ] {
            assert!(!v6(no), "{no}");
        }
    }

    #[test]
    fn unspecified_link_local_multicast_and_broadcast_v4_are_per_address() {
        for yes in [
            "0.0.0.0",
            "0.0.0.7",
            "0.255.255.255",
            "169.254.0.1",
            "169.254.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(v4(yes), "{yes}");
        }
        for no in [
            "1.0.0.0",
            "10.0.0.1",
            "169.253.255.255",
            "169.255.0.0",
            "198.51.100.7",
            "223.255.255.255",
        ] {
            assert!(!v4(no), "{no}");
        }
    }

    /// The ranges listed are exactly what the predicates hold: their first and last
    /// addresses are in, the addresses just outside them are not.
    #[test]
    fn the_ranges_are_the_predicates() {
        for (addr, len) in PER_ADDRESS_V6 {
            let first = u128::from_be_bytes(addr);
            let last = first | u128::MAX.checked_shr(u32::from(len)).unwrap_or(0);
            assert!(v6_per_address(&first.to_be_bytes()));
            assert!(v6_per_address(&last.to_be_bytes()));
            if len > 0 && first > 0 {
                assert!(!v6_per_address(&(first - 1).to_be_bytes()), "{addr:?}");
            }
            if last < u128::MAX {
                assert!(!v6_per_address(&(last + 1).to_be_bytes()), "{addr:?}");
            }
        }
        for (addr, len) in PER_ADDRESS_V4 {
            let first = u32::from_be_bytes(addr);
            let last = first | u32::MAX.checked_shr(u32::from(len)).unwrap_or(0);
            assert!(v4_per_address(first.to_be_bytes()));
            assert!(v4_per_address(last.to_be_bytes()));
            if first > 0 {
                assert!(!v4_per_address((first - 1).to_be_bytes()), "{addr:?}");
            }
            if last < u32::MAX {
                assert!(!v4_per_address((last + 1).to_be_bytes()), "{addr:?}");
            }
        }
    }
}
