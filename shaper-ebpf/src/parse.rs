//! Header parsing with one bounds-checked cursor, so every access the verifier sees is
//! proven in-bounds in one place.

use core::mem::size_of;

use network_types::{eth::EthHdr, ip::Ipv4Hdr};

/// A position in the frame `[start, end)` of an XDP context.
pub struct Cursor {
    pos: usize,
    end: usize,
}

impl Cursor {
    pub fn new(start: usize, end: usize) -> Self {
        Self { pos: start, end }
    }

    /// The next `T` in the frame, advancing past it; `None` if the frame is too short.
    #[inline(always)]
    pub fn next<T>(&mut self) -> Option<*const T> {
        let start = self.pos;
        if start + size_of::<T>() > self.end {
            return None;
        }
        self.pos = start + size_of::<T>();
        Some(start as *const T)
    }
}

/// What a frame is, as far as metering goes.
pub enum Frame {
    /// IPv4, keyed by the source address bytes read as a native u32.
    Ipv4 { src: u32 },
    /// A well-formed frame that is not IPv4.
    NotIpv4,
    /// Too short for its headers, or an IPv4 header with a bad version or length.
    Malformed,
}

const ETH_P_IP: u16 = 0x0800;

#[inline(always)]
pub fn classify(start: usize, end: usize) -> Frame {
    let mut cur = Cursor::new(start, end);
    let Some(eth) = cur.next::<EthHdr>() else {
        return Frame::Malformed;
    };
    // SAFETY: `next` checked that the header lies within the frame.
    let ether_type = u16::from_be(unsafe { (*eth).ether_type });
    if ether_type != ETH_P_IP {
        return Frame::NotIpv4;
    }
    let Some(ip) = cur.next::<Ipv4Hdr>() else {
        return Frame::Malformed;
    };
    // SAFETY: as above.
    let ip = unsafe { &*ip };
    if ip.version() != 4 || usize::from(ip.ihl()) < Ipv4Hdr::LEN {
        return Frame::Malformed;
    }
    Frame::Ipv4 {
        src: u32::from_ne_bytes(ip.src_addr),
    }
}
