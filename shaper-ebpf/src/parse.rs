//! Header parsing with one bounds-checked cursor, so every access the verifier sees is
//! proven in-bounds in one place.
//!
//! What is parsed: Ethernet, up to two VLAN tags (802.1Q, 802.1ad, and the pre-standard
//! 0x9100 some switches still use for the outer tag), then IPv4, IPv6, or a PPPoE session
//! carrying IPv4 or IPv6. Only the linear part of a multi-buffer frame is looked at:
//! headers are always there on a sane driver, and a frame whose headers are not is
//! counted as malformed rather than metered by a guess.
//!
//! The key comes from the fixed IP header, so nothing beyond it is walked: IPv6 extension
//! headers and fragments (first or not) need no parsing, and every fragment of a datagram
//! has the addresses of the whole.

use core::mem::size_of;

use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    vlan::VlanHdr,
};

/// A position in the frame `[start, end)` of an XDP context.
pub struct Cursor {
    pos: usize,
    end: usize,
}

impl Cursor {
    #[inline(always)]
    pub fn new(start: usize, end: usize) -> Self {
        Self { pos: start, end }
    }

    /// The next `T` in the frame, advancing past it; `None` if the frame is too short.
    #[inline(always)]
    pub fn next<T>(&mut self) -> Option<*const T> {
        self.take(size_of::<T>()).map(|p| p as *const T)
    }

    /// Advances past `len` bytes, returning where they start; `None` (and no move) if the
    /// frame is too short for them.
    #[inline(always)]
    pub fn take(&mut self, len: usize) -> Option<usize> {
        let start = self.pos;
        if start + len > self.end {
            return None;
        }
        self.pos = start + len;
        Some(start)
    }
}

/// What a frame is, as far as metering goes.
pub enum Frame {
    /// IPv4 with its whole header (options included) in the frame.
    Ipv4(*const Ipv4Hdr),
    /// IPv6 with its fixed header in the frame.
    Ipv6(*const Ipv6Hdr),
    /// Another ethertype (ARP, LLDP, MPLS, ...).
    NotIp,
    /// PPPoE discovery, or a PPPoE session carrying something other than IP (LCP, ...).
    PppoeOther,
    /// A third VLAN tag.
    VlanTooDeep,
    /// Too short for its headers, or an IP or PPPoE header that cannot be valid.
    Malformed,
}

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// The outer tag of pre-802.1ad QinQ gear.
const ETH_P_QINQ1: u16 = 0x9100;
const ETH_P_PPP_DISC: u16 = 0x8863;
const ETH_P_PPP_SES: u16 = 0x8864;

/// VLAN tags read before the payload's ethertype (802.1Q, and QinQ's outer and inner).
const MAX_VLAN_TAGS: usize = 2;

/// PPP protocol numbers inside a PPPoE session.
const PPP_IP: u16 = 0x0021;
const PPP_IPV6: u16 = 0x0057;
/// PPPoE version 1, type 1 (RFC 2516), and the session-data code.
const PPPOE_VER_TYPE: u8 = 0x11;
const PPPOE_CODE_SESSION: u8 = 0x00;

/// The PPPoE session header (RFC 2516) and the PPP protocol field after it.
#[repr(C)]
struct PppoeHdr {
    ver_type: u8,
    code: u8,
    _session_id: [u8; 2],
    _length: [u8; 2],
    protocol: [u8; 2],
}

#[inline(always)]
fn is_vlan(ether_type: u16) -> bool {
    ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD || ether_type == ETH_P_QINQ1
}

/// The ethertype after the tag the cursor is at.
#[inline(always)]
fn vlan(cur: &mut Cursor) -> Option<u16> {
    let tag = cur.next::<VlanHdr>()?;
    // SAFETY: `next` checked that the tag lies within the frame.
    Some(u16::from_be(unsafe { (*tag).ether_type }))
}

#[inline(always)]
pub fn classify(start: usize, end: usize) -> Frame {
    let mut cur = Cursor::new(start, end);
    let Some(eth) = cur.next::<EthHdr>() else {
        return Frame::Malformed;
    };
    // SAFETY: `next` checked that the header lies within the frame.
    let mut ether_type = u16::from_be(unsafe { (*eth).ether_type });
    // Untagged IPv4 first: it is the common case, and the one whose cost is watched.
    if ether_type == ETH_P_IP {
        return ipv4(&mut cur);
    }
    for _ in 0..MAX_VLAN_TAGS {
        if !is_vlan(ether_type) {
            break;
        }
        let Some(inner) = vlan(&mut cur) else {
            return Frame::Malformed;
        };
        ether_type = inner;
    }
    if is_vlan(ether_type) {
        return Frame::VlanTooDeep;
    }
    match ether_type {
        ETH_P_IP => ipv4(&mut cur),
        ETH_P_IPV6 => ipv6(&mut cur),
        ETH_P_PPP_SES => pppoe_session(&mut cur),
        ETH_P_PPP_DISC => Frame::PppoeOther,
        _ => Frame::NotIp,
    }
}

#[inline(always)]
fn ipv4(cur: &mut Cursor) -> Frame {
    let Some(ip) = cur.next::<Ipv4Hdr>() else {
        return Frame::Malformed;
    };
    // SAFETY: `next` checked that the fixed header lies within the frame.
    let vihl = unsafe { (*ip).vihl };
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < Ipv4Hdr::LEN {
        return Frame::Malformed;
    }
    // Options are not read, but a header the frame cannot hold is not a valid one.
    if cur.take(ihl - Ipv4Hdr::LEN).is_none() {
        return Frame::Malformed;
    }
    Frame::Ipv4(ip)
}

#[inline(always)]
fn ipv6(cur: &mut Cursor) -> Frame {
    let Some(ip) = cur.next::<Ipv6Hdr>() else {
        return Frame::Malformed;
    };
    // SAFETY: `next` checked that the fixed header lies within the frame.
    if unsafe { (*ip).vcf[0] } >> 4 != 6 {
        return Frame::Malformed;
    }
    Frame::Ipv6(ip)
}

#[inline(always)]
fn pppoe_session(cur: &mut Cursor) -> Frame {
    let Some(h) = cur.next::<PppoeHdr>() else {
        return Frame::Malformed;
    };
    // SAFETY: `next` checked that the header lies within the frame.
    let h = unsafe { &*h };
    // What the kernel's own PPPoE driver would refuse is not a session frame.
    if h.ver_type != PPPOE_VER_TYPE || h.code != PPPOE_CODE_SESSION {
        return Frame::Malformed;
    }
    match u16::from_be_bytes(h.protocol) {
        PPP_IP => ipv4(cur),
        PPP_IPV6 => ipv6(cur),
        _ => Frame::PppoeOther,
    }
}

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
/// The fixed TCP header, and the offset of its data-offset byte.
const TCP_MIN_LEN: usize = 20;
const TCP_DOFF_AT: usize = 12;
const UDP_LEN: usize = 8;

/// Bytes from the frame's start to the end of its transport header: what each segment of
/// a GSO packet repeats. TCP's header counts with its options; a TCP header beyond the
/// linear part counts as the fixed 20 bytes; another protocol (or an IPv6 extension
/// header, which GSO packets do not carry in practice) counts the IP header only.
#[inline(always)]
pub fn header_len(start: usize, end: usize, frame: &Frame) -> usize {
    // SAFETY: `classify` checked that these headers lie within the frame.
    let (l4, proto) = unsafe {
        match *frame {
            Frame::Ipv4(ip) => (
                ip as usize + usize::from((*ip).vihl & 0x0f) * 4,
                (*ip).proto,
            ),
            Frame::Ipv6(ip) => (ip as usize + Ipv6Hdr::LEN, (*ip).next_hdr),
            _ => return end - start,
        }
    };
    let transport = match proto {
        IPPROTO_TCP => {
            let mut cur = Cursor::new(l4, end);
            match cur.take(TCP_MIN_LEN) {
                // SAFETY: `take` checked that the fixed TCP header lies within the frame.
                Some(tcp) => usize::from(unsafe { *((tcp + TCP_DOFF_AT) as *const u8) } >> 4) * 4,
                None => TCP_MIN_LEN,
            }
        }
        IPPROTO_UDP => UDP_LEN,
        _ => 0,
    };
    l4 - start + transport
}
