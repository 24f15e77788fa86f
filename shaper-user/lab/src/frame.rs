//! Hand-built frames for `BPF_PROG_TEST_RUN`: tests, the fuzzer and the per-packet
//! benchmark feed these to the kernel programs.
//!
//! Packets are built layer by layer: an IP packet ([`ipv4`], [`ipv6`]), put in a frame
//! ([`ethernet`], [`pppoe_session`]), optionally tagged ([`with_vlan`]).

use std::net::{Ipv4Addr, Ipv6Addr};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
pub const ETH_P_QINQ1: u16 = 0x9100;
pub const ETH_P_PPP_DISC: u16 = 0x8863;
pub const ETH_P_PPP_SES: u16 = 0x8864;
pub const ETH_HLEN: usize = 14;
pub const VLAN_HLEN: usize = 4;
/// PPPoE session header (6 bytes) and PPP protocol field (2).
pub const PPPOE_HLEN: usize = 8;
pub const IPV4_HLEN: usize = 20;
pub const IPV6_HLEN: usize = 40;
pub const UDP_HLEN: usize = 8;

/// PPP protocol numbers.
pub const PPP_IP: u16 = 0x0021;
pub const PPP_IPV6: u16 = 0x0057;
pub const PPP_LCP: u16 = 0xc021;

/// IP protocol / IPv6 next-header numbers.
pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_DSTOPTS: u8 = 60;

/// The destination of frames built with only a source address.
pub const DEFAULT_DST_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const DEFAULT_DST_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);

/// An Ethernet header with `ether_type`, followed by `payload`.
pub fn ethernet(ether_type: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HLEN + payload.len());
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // destination (locally administered)
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // source
    f.extend_from_slice(&ether_type.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `frame` with a VLAN tag (`tpid`, VLAN id `vid`) inserted after the MAC addresses, so
/// it becomes the outermost tag: tag twice for QinQ, inner tag first.
pub fn with_vlan(frame: &[u8], tpid: u16, vid: u16) -> Vec<u8> {
    assert!(frame.len() >= ETH_HLEN, "not an Ethernet frame");
    let mut f = Vec::with_capacity(frame.len() + VLAN_HLEN);
    f.extend_from_slice(&frame[..12]);
    f.extend_from_slice(&tpid.to_be_bytes());
    f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// A PPPoE session frame (RFC 2516, session 0x1234) carrying `payload` as PPP protocol
/// `ppp_protocol`.
pub fn pppoe_session(ppp_protocol: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(PPPOE_HLEN + payload.len());
    p.push(0x11); // version 1, type 1
    p.push(0x00); // code: session data
    p.extend_from_slice(&0x1234u16.to_be_bytes());
    // The PPPoE length counts the PPP protocol field and what follows it.
    p.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
    p.extend_from_slice(&ppp_protocol.to_be_bytes());
    p.extend_from_slice(payload);
    ethernet(ETH_P_PPP_SES, &p)
}

/// A PPPoE session frame with an LCP Echo-Request: PPP control traffic, not IP.
pub fn pppoe_lcp() -> Vec<u8> {
    // Code 9 (Echo-Request), identifier 1, length 8, magic number.
    pppoe_session(PPP_LCP, &[9, 1, 0, 8, 0x12, 0x34, 0x56, 0x78])
}

/// A PPPoE discovery frame: PADI (code 0x09) with a Service-Name tag.
pub fn pppoe_discovery() -> Vec<u8> {
    let tag = [0x01, 0x01, 0x00, 0x00]; // Service-Name, empty
    let mut p = vec![0x11, 0x09, 0x00, 0x00];
    p.extend_from_slice(&(tag.len() as u16).to_be_bytes());
    p.extend_from_slice(&tag);
    ethernet(ETH_P_PPP_DISC, &p)
}

/// IPv4 fragmentation: `more` is the MF flag, `offset` the fragment offset in 8-byte
/// units (0 for the first fragment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    pub more: bool,
    pub offset: u16,
}

/// An IPv4 packet from `src` to `dst` with `options` (padded to whole words with
/// End-of-Options-List), `protocol` and `payload`, fragmented as `frag` says, with a
/// valid header checksum.
pub fn ipv4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    options: &[u8],
    protocol: u8,
    frag: Fragment,
    payload: &[u8],
) -> Vec<u8> {
    let hlen = IPV4_HLEN + options.len().div_ceil(4) * 4;
    assert!(hlen <= 60, "IPv4 options longer than 40 bytes");
    let total = hlen + payload.len();
    let mut ip = vec![0u8; hlen];
    ip[0] = 0x40 | (hlen / 4) as u8;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0x5eedu16.to_be_bytes()); // identification
    let flags_offset = (u16::from(frag.more) << 13) | (frag.offset & 0x1fff);
    ip[6..8].copy_from_slice(&flags_offset.to_be_bytes());
    ip[8] = 64; // TTL
    ip[9] = protocol;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    ip[IPV4_HLEN..IPV4_HLEN + options.len()].copy_from_slice(options);
    let checksum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    ip.extend_from_slice(payload);
    ip
}

/// An IPv6 packet from `src` to `dst` whose first next-header is `next_hdr`, followed by
/// `payload` (extension headers included).
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next_hdr: u8, payload: &[u8]) -> Vec<u8> {
    let mut ip = vec![0u8; IPV6_HLEN];
    ip[0] = 0x60; // version 6, traffic class 0
    ip[1..4].copy_from_slice(&[0x0a, 0xbc, 0xde]); // flow label
    ip[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    ip[6] = next_hdr;
    ip[7] = 64; // hop limit
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    ip.extend_from_slice(payload);
    ip
}

/// A UDP datagram (port 9, discard) with `payload_len` zero bytes; checksum left zero
/// (nothing here checks it).
pub fn udp(payload_len: usize) -> Vec<u8> {
    let mut u = vec![0u8; UDP_HLEN + payload_len];
    u[0..2].copy_from_slice(&9u16.to_be_bytes());
    u[2..4].copy_from_slice(&9u16.to_be_bytes());
    u[4..6].copy_from_slice(&((UDP_HLEN + payload_len) as u16).to_be_bytes());
    u
}

/// An IPv4/UDP frame from `src` to `dst` of exactly `frame_len` bytes (Ethernet header
/// included); at least 42 (Ethernet + IPv4 + UDP headers).
pub fn ipv4_udp_to(src: Ipv4Addr, dst: Ipv4Addr, frame_len: usize) -> Vec<u8> {
    let headers = ETH_HLEN + IPV4_HLEN + UDP_HLEN;
    assert!(
        frame_len >= headers,
        "frame_len {frame_len} below {headers}"
    );
    let ip = ipv4(
        src,
        dst,
        &[],
        IPPROTO_UDP,
        Fragment::default(),
        &udp(frame_len - headers),
    );
    ethernet(ETH_P_IP, &ip)
}

/// An IPv4/UDP frame from `src` of exactly `frame_len` bytes (Ethernet header included).
/// `frame_len` must be at least 42 (Ethernet + IPv4 + UDP headers).
pub fn ipv4_udp(src: Ipv4Addr, frame_len: usize) -> Vec<u8> {
    ipv4_udp_to(src, DEFAULT_DST_V4, frame_len)
}

/// An IPv4/UDP frame whose header carries `options_len` bytes of options (a multiple of
/// 4, at most 40): Record Route with room for the addresses, padded with No-Operation.
pub fn ipv4_with_options(src: Ipv4Addr, options_len: usize, payload_len: usize) -> Vec<u8> {
    assert!(options_len.is_multiple_of(4) && options_len <= 40);
    let mut options = vec![1u8; options_len]; // No-Operation
    if options_len >= 8 {
        // Record Route: type 7, length, pointer 4, then (length - 3) bytes of slots.
        let rr = options_len - 1;
        options[0] = 7;
        options[1] = rr as u8;
        options[2] = 4;
        options[3..rr].fill(0);
        options[rr] = 0; // End of Options List
    }
    let ip = ipv4(
        src,
        DEFAULT_DST_V4,
        &options,
        IPPROTO_UDP,
        Fragment::default(),
        &udp(payload_len),
    );
    ethernet(ETH_P_IP, &ip)
}

/// A fragment of an IPv4/UDP datagram from `src` to `dst`: the first (offset 0, MF set,
/// carrying the UDP header) or a later one (offset 185 × 8 bytes, MF clear, no UDP
/// header), with `payload_len` bytes of data.
pub fn ipv4_fragment(src: Ipv4Addr, dst: Ipv4Addr, first: bool, payload_len: usize) -> Vec<u8> {
    let (frag, payload) = if first {
        (
            Fragment {
                more: true,
                offset: 0,
            },
            udp(payload_len),
        )
    } else {
        (
            Fragment {
                more: false,
                offset: 185,
            },
            vec![0xab; payload_len],
        )
    };
    ethernet(ETH_P_IP, &ipv4(src, dst, &[], IPPROTO_UDP, frag, &payload))
}

/// An IPv6/UDP packet from `src` to `dst` with `payload_len` bytes of UDP payload.
pub fn ipv6_udp_packet(src: Ipv6Addr, dst: Ipv6Addr, payload_len: usize) -> Vec<u8> {
    ipv6(src, dst, IPPROTO_UDP, &udp(payload_len))
}

/// An IPv6/UDP frame from `src` to `dst` with `payload_len` bytes of UDP payload.
pub fn ipv6_udp(src: Ipv6Addr, dst: Ipv6Addr, payload_len: usize) -> Vec<u8> {
    ethernet(ETH_P_IPV6, &ipv6_udp_packet(src, dst, payload_len))
}

/// An IPv6/UDP frame whose fixed header is followed by a Hop-by-Hop Options header and a
/// Destination Options header (each 8 bytes: next header, length 0, one PadN option).
pub fn ipv6_with_ext_headers(src: Ipv6Addr, dst: Ipv6Addr, payload_len: usize) -> Vec<u8> {
    let mut payload = vec![IPPROTO_DSTOPTS, 0, 1, 4, 0, 0, 0, 0]; // Hop-by-Hop, PadN
    payload.extend_from_slice(&[IPPROTO_UDP, 0, 1, 4, 0, 0, 0, 0]); // Destination Options
    payload.extend_from_slice(&udp(payload_len));
    ethernet(ETH_P_IPV6, &ipv6(src, dst, IPPROTO_HOPOPTS, &payload))
}

/// A fragment of an IPv6/UDP datagram (Fragment extension header, identification
/// 0x5eed): the first (offset 0, M set, carrying the UDP header) or a later one (offset
/// 181 × 8 bytes, M clear, no UDP header), with `payload_len` bytes of data.
pub fn ipv6_fragment(src: Ipv6Addr, dst: Ipv6Addr, first: bool, payload_len: usize) -> Vec<u8> {
    let offset_flags: u16 = if first { 1 } else { 181 << 3 };
    let mut payload = vec![IPPROTO_UDP, 0];
    payload.extend_from_slice(&offset_flags.to_be_bytes());
    payload.extend_from_slice(&0x5eedu32.to_be_bytes());
    if first {
        payload.extend_from_slice(&udp(payload_len));
    } else {
        payload.extend(std::iter::repeat_n(0xab, payload_len));
    }
    ethernet(ETH_P_IPV6, &ipv6(src, dst, IPPROTO_FRAGMENT, &payload))
}

/// An untagged IPv4 or IPv6 frame with the ECN field of its header set to `ecn` (0:
/// Not-ECT, 2: ECT(0), 1: ECT(1), 3: CE), an IPv4 header's checksum made valid again.
pub fn with_ecn(frame: &[u8], ecn: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    if is_ipv6(frame) {
        // The traffic class straddles the first two bytes: ECN is bits 4-5 of the second.
        f[ETH_HLEN + 1] = (f[ETH_HLEN + 1] & !0x30) | ((ecn & 3) << 4);
        return f;
    }
    let ip = ETH_HLEN..ETH_HLEN + IPV4_HLEN;
    f[ETH_HLEN + 1] = (f[ETH_HLEN + 1] & !3) | (ecn & 3);
    f[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
    let checksum = internet_checksum(&f[ip]);
    f[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&checksum.to_be_bytes());
    f
}

/// The ECN field of an untagged IPv4 or IPv6 frame, and whether its header checksum is
/// valid (IPv6 has none: always).
pub fn ecn_of(frame: &[u8]) -> (u8, bool) {
    if is_ipv6(frame) {
        return ((frame[ETH_HLEN + 1] >> 4) & 3, true);
    }
    let header = &frame[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
    (header[1] & 3, internet_checksum(header) == 0)
}

fn is_ipv6(frame: &[u8]) -> bool {
    frame[12..14] == ETH_P_IPV6.to_be_bytes()
}

/// The one's-complement sum of `bytes` as 16-bit words, complemented (RFC 1071).
fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_frames_have_the_asked_length_and_a_valid_checksum() {
        let f = ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), 60);
        assert_eq!(f.len(), 60);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(f[14], 0x45);
        assert_eq!(internet_checksum(&f[14..34]), 0);
        let o = ipv4_with_options(Ipv4Addr::new(198, 18, 0, 11), 12, 0);
        assert_eq!(o[14], 0x48); // IHL 8 words
        assert_eq!(o.len(), ETH_HLEN + 32 + UDP_HLEN);
        assert_eq!(internet_checksum(&o[14..46]), 0);
    }

    #[test]
    fn fragments_carry_flags_and_offsets() {
        let (a, b) = (Ipv4Addr::new(198, 18, 0, 11), DEFAULT_DST_V4);
        let first = ipv4_fragment(a, b, true, 100);
        let later = ipv4_fragment(a, b, false, 100);
        assert_eq!(&first[20..22], &[0x20, 0x00]); // MF, offset 0
        assert_eq!(&later[20..22], &185u16.to_be_bytes());
        let (a6, b6) = (Ipv6Addr::LOCALHOST, DEFAULT_DST_V6);
        let first6 = ipv6_fragment(a6, b6, true, 0);
        assert_eq!(first6[ETH_HLEN + 6], IPPROTO_FRAGMENT);
        assert_eq!(first6.len(), ETH_HLEN + IPV6_HLEN + 8 + UDP_HLEN);
    }

    #[test]
    fn vlan_tags_go_outermost() {
        let f = ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), 60);
        let qinq = with_vlan(&with_vlan(&f, ETH_P_8021Q, 100), ETH_P_8021AD, 200);
        assert_eq!(qinq.len(), 68);
        assert_eq!(&qinq[12..16], &[0x88, 0xa8, 0x00, 200]);
        assert_eq!(&qinq[16..20], &[0x81, 0x00, 0x00, 100]);
        assert_eq!(&qinq[20..22], &[0x08, 0x00]);
    }

    #[test]
    fn pppoe_frames() {
        let ip = ipv6_udp_packet(Ipv6Addr::LOCALHOST, DEFAULT_DST_V6, 10);
        let f = pppoe_session(PPP_IPV6, &ip);
        assert_eq!(&f[12..14], &ETH_P_PPP_SES.to_be_bytes());
        assert_eq!(&f[14..16], &[0x11, 0x00]);
        assert_eq!(&f[18..20], &((ip.len() + 2) as u16).to_be_bytes());
        assert_eq!(&f[20..22], &[0x00, 0x57]);
        assert_eq!(f.len(), ETH_HLEN + PPPOE_HLEN + ip.len());
        assert_eq!(&pppoe_discovery()[12..14], &ETH_P_PPP_DISC.to_be_bytes());
        assert_eq!(&pppoe_lcp()[20..22], &[0xc0, 0x21]);
    }
}
