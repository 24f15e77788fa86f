//! Hand-built frames for `BPF_PROG_TEST_RUN`: tests and the per-packet benchmark feed
//! these to the kernel programs.

use std::net::Ipv4Addr;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_HLEN: usize = 14;

/// An Ethernet header with `ether_type`, followed by `payload`.
pub fn ethernet(ether_type: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HLEN + payload.len());
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // destination (locally administered)
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // source
    f.extend_from_slice(&ether_type.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An IPv4/UDP frame from `src` of exactly `frame_len` bytes (Ethernet header included).
/// `frame_len` must be at least 42 (Ethernet + IPv4 + UDP headers).
pub fn ipv4_udp(src: Ipv4Addr, frame_len: usize) -> Vec<u8> {
    assert!(frame_len >= ETH_HLEN + 28, "frame_len {frame_len} below 42");
    let ip_len = frame_len - ETH_HLEN;
    let mut ip = vec![0u8; ip_len];
    ip[0] = 0x45; // version 4, IHL 5
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&Ipv4Addr::new(198, 18, 0, 1).octets());
    let udp_len = (ip_len - 20) as u16;
    ip[20..22].copy_from_slice(&9u16.to_be_bytes());
    ip[22..24].copy_from_slice(&9u16.to_be_bytes());
    ip[24..26].copy_from_slice(&udp_len.to_be_bytes());
    ethernet(ETH_P_IP, &ip)
}
