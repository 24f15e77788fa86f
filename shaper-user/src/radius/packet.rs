//! The RADIUS packet (RFC 2865 §3, §5) as Dynamic Authorization (RFC 5176) uses it: read
//! from a datagram with every length bounded, the Request Authenticator of a CoA- or
//! Disconnect-Request (§2.3: MD5 over the packet with a zero authenticator, then the
//! secret) and its Message-Authenticator (RFC 3579 §3.2: HMAC-MD5 keyed by the secret over
//! the packet with the authenticator and the attribute's value zeroed, as RFC 5176 §3.1
//! and FreeRADIUS compute it) checked in constant time, and the replies built with their
//! Response Authenticator (MD5 over the reply with the request's authenticator, then the
//! secret).

use hmac::{Hmac, Mac as _};
use md5::{Digest as _, Md5};

/// The largest packet (RFC 2865 §3: 4096 octets).
pub const MAX_PACKET: usize = 4096;
/// Code, identifier, length and authenticator.
const HEADER: usize = 20;

pub const COA_REQUEST: u8 = 43;
pub const COA_ACK: u8 = 44;
pub const COA_NAK: u8 = 45;
pub const DISCONNECT_REQUEST: u8 = 40;
pub const DISCONNECT_ACK: u8 = 41;
pub const DISCONNECT_NAK: u8 = 42;

pub const USER_NAME: u8 = 1;
pub const FRAMED_IP_ADDRESS: u8 = 8;
pub const FILTER_ID: u8 = 11;
pub const ACCT_SESSION_ID: u8 = 44;
pub const VENDOR_SPECIFIC: u8 = 26;
pub const EVENT_TIMESTAMP: u8 = 55;
pub const MESSAGE_AUTHENTICATOR: u8 = 80;
pub const FRAMED_IPV6_PREFIX: u8 = 97;
pub const ERROR_CAUSE: u8 = 101;
pub const DELEGATED_IPV6_PREFIX: u8 = 123;

/// A packet that is not well formed: dropped unanswered (RFC 2865 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("shorter than a header or than its Length")]
    Short,
    #[error("its Length is under 20 or over 4096")]
    Length,
    #[error("an attribute runs past the packet or is shorter than 2 octets")]
    Attribute,
}

/// A request as read: its header, and its attributes in order (type, value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<'a> {
    pub code: u8,
    pub identifier: u8,
    pub authenticator: [u8; 16],
    pub attributes: Vec<(u8, &'a [u8])>,
    /// The packet's octets up to its Length (those beyond are padding, ignored).
    pub raw: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Reads `datagram`: a header whose Length is 20 to 4096 and no longer than the
    /// datagram, and attributes that fill it exactly.
    pub fn parse(datagram: &'a [u8]) -> Result<Self, Malformed> {
        if datagram.len() < HEADER {
            return Err(Malformed::Short);
        }
        let length = usize::from(u16::from_be_bytes([datagram[2], datagram[3]]));
        if !(HEADER..=MAX_PACKET).contains(&length) {
            return Err(Malformed::Length);
        }
        let raw = datagram.get(..length).ok_or(Malformed::Short)?;
        let mut attributes = Vec::new();
        let mut at = HEADER;
        while at < length {
            let len = usize::from(*raw.get(at + 1).ok_or(Malformed::Attribute)?);
            if len < 2 || at + len > length {
                return Err(Malformed::Attribute);
            }
            attributes.push((raw[at], &raw[at + 2..at + len]));
            at += len;
        }
        let mut authenticator = [0; 16];
        authenticator.copy_from_slice(&raw[4..HEADER]);
        Ok(Self {
            code: raw[0],
            identifier: raw[1],
            authenticator,
            attributes,
            raw,
        })
    }

    /// The value of the first attribute `kind`.
    pub fn first(&self, kind: u8) -> Option<&'a [u8]> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| *v)
    }

    /// The value of vendor `vendor`'s first attribute `kind` (RFC 2865 §5.26's format:
    /// vendor type and length octets), in any Vendor-Specific attribute.
    pub fn vendor(&self, vendor: u32, kind: u8) -> Option<&'a [u8]> {
        self.attributes
            .iter()
            .filter(|(k, v)| *k == VENDOR_SPECIFIC && v.len() >= 4)
            .filter(|(_, v)| u32::from_be_bytes([v[0], v[1], v[2], v[3]]) == vendor)
            .find_map(|(_, v)| {
                let mut rest = &v[4..];
                while rest.len() >= 2 {
                    let len = usize::from(rest[1]);
                    if len < 2 || len > rest.len() {
                        return None;
                    }
                    if rest[0] == kind {
                        return Some(&rest[2..len]);
                    }
                    rest = &rest[len..];
                }
                None
            })
    }

    /// Whether its Request Authenticator is MD5(packet with 16 zero octets for it, then
    /// `secret`) (RFC 5176 §2.3, as RFC 2866's Accounting-Request).
    pub fn request_authentic(&self, secret: &[u8]) -> bool {
        let mut md5 = Md5::new();
        md5.update(&self.raw[..4]);
        md5.update([0u8; 16]);
        md5.update(&self.raw[HEADER..]);
        md5.update(secret);
        constant_eq(&md5.finalize(), &self.authenticator)
    }

    /// `None` if it carries no Message-Authenticator; else whether there is exactly one,
    /// 16 octets, equal to HMAC-MD5 keyed by `secret` over the packet with the
    /// authenticator and its own value zeroed.
    pub fn message_authentic(&self, secret: &[u8]) -> Option<bool> {
        let count = self
            .attributes
            .iter()
            .filter(|(k, _)| *k == MESSAGE_AUTHENTICATOR)
            .count();
        let given = self.first(MESSAGE_AUTHENTICATOR)?;
        if count != 1 || given.len() != 16 {
            return Some(false);
        }
        let mut copy = self.raw.to_vec();
        copy[4..HEADER].fill(0);
        let offset = given.as_ptr() as usize - self.raw.as_ptr() as usize;
        copy[offset..offset + 16].fill(0);
        Some(constant_eq(&hmac_md5(secret, &copy), given))
    }
}

/// Sets the Request Authenticator of the CoA- or Disconnect-Request `raw` for `secret`
/// (RFC 5176 §2.3), as a client does last; a packet shorter than a header is left alone.
pub fn sign_request(raw: &mut [u8], secret: &[u8]) {
    if raw.len() < HEADER {
        return;
    }
    raw[4..HEADER].fill(0);
    let mut md5 = Md5::new();
    md5.update(&*raw);
    md5.update(secret);
    let digest = md5.finalize();
    raw[4..HEADER].copy_from_slice(&digest);
}

fn hmac_md5(secret: &[u8], data: &[u8]) -> [u8; 16] {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Md5>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Equal, in a time that depends on the lengths only.
fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The reply `code` to `request`, with `error_cause` (RFC 5176 §3.5) if any, and a
/// Message-Authenticator if the request had one; its Response Authenticator over the
/// request's authenticator and `secret`.
pub fn reply(code: u8, request: &Packet<'_>, error_cause: Option<u32>, secret: &[u8]) -> Vec<u8> {
    let mut out = vec![code, request.identifier, 0, 0];
    out.extend_from_slice(&request.authenticator);
    if let Some(cause) = error_cause {
        out.extend_from_slice(&[ERROR_CAUSE, 6]);
        out.extend_from_slice(&cause.to_be_bytes());
    }
    let signed = request.first(MESSAGE_AUTHENTICATOR).is_some();
    let mac_at = out.len() + 2;
    if signed {
        out.extend_from_slice(&[MESSAGE_AUTHENTICATOR, 18]);
        out.extend_from_slice(&[0; 16]);
    }
    let len = u16::try_from(out.len()).unwrap_or(u16::MAX);
    out[2..4].copy_from_slice(&len.to_be_bytes());
    if signed {
        // Over the reply with the request's authenticator in its place (RFC 3579 §3.2).
        let mac = hmac_md5(secret, &out);
        out[mac_at..mac_at + 16].copy_from_slice(&mac);
    }
    let mut md5 = Md5::new();
    md5.update(&out);
    md5.update(secret);
    let digest = md5.finalize();
    out[4..HEADER].copy_from_slice(&digest);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A request as a client signs it: `attributes` (type, value), a Message-Authenticator
    /// last if `signed`.
    pub fn request(
        code: u8,
        id: u8,
        attributes: &[(u8, Vec<u8>)],
        secret: &[u8],
        signed: bool,
    ) -> Vec<u8> {
        let mut out = vec![code, id, 0, 0];
        out.extend_from_slice(&[0; 16]);
        for (k, v) in attributes {
            out.push(*k);
            out.push(u8::try_from(v.len() + 2).unwrap());
            out.extend_from_slice(v);
        }
        let mac_at = out.len() + 2;
        if signed {
            out.extend_from_slice(&[MESSAGE_AUTHENTICATOR, 18]);
            out.extend_from_slice(&[0; 16]);
        }
        let len = u16::try_from(out.len()).unwrap();
        out[2..4].copy_from_slice(&len.to_be_bytes());
        if signed {
            let mac = hmac_md5(secret, &out);
            out[mac_at..mac_at + 16].copy_from_slice(&mac);
        }
        sign_request(&mut out, secret);
        out
    }

    #[test]
    fn a_signed_request_verifies_with_its_secret_only() {
        let bytes = request(
            COA_REQUEST,
            7,
            &[(USER_NAME, b"c1".to_vec())],
            b"s3cret",
            true,
        );
        let p = Packet::parse(&bytes).unwrap();
        assert!(p.request_authentic(b"s3cret"));
        assert_eq!(p.message_authentic(b"s3cret"), Some(true));
        assert!(!p.request_authentic(b"other"));
        assert_eq!(p.message_authentic(b"other"), Some(false));
        let plain = request(
            COA_REQUEST,
            7,
            &[(USER_NAME, b"c1".to_vec())],
            b"s3cret",
            false,
        );
        assert_eq!(
            Packet::parse(&plain).unwrap().message_authentic(b"s3cret"),
            None
        );
    }

    #[test]
    fn a_changed_octet_fails_both_checks() {
        let mut bytes = request(COA_REQUEST, 7, &[(USER_NAME, b"c1".to_vec())], b"k", true);
        bytes[22] ^= 1;
        let p = Packet::parse(&bytes).unwrap();
        assert!(!p.request_authentic(b"k"));
        assert_eq!(p.message_authentic(b"k"), Some(false));
    }

    #[test]
    fn lengths_are_bounded() {
        assert_eq!(Packet::parse(&[0; 19]), Err(Malformed::Short));
        let mut bytes = request(COA_REQUEST, 1, &[(USER_NAME, b"c1".to_vec())], b"k", false);
        bytes[3] = 200;
        assert_eq!(Packet::parse(&bytes), Err(Malformed::Short));
        bytes[2..4].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(Packet::parse(&bytes), Err(Malformed::Length));
        let mut bad = request(COA_REQUEST, 1, &[(USER_NAME, b"c1".to_vec())], b"k", false);
        bad[21] = 1;
        assert_eq!(Packet::parse(&bad), Err(Malformed::Attribute));
        bad[21] = 30;
        assert_eq!(Packet::parse(&bad), Err(Malformed::Attribute));
        // Padding past Length is ignored.
        let mut padded = request(COA_REQUEST, 1, &[(USER_NAME, b"c1".to_vec())], b"k", false);
        padded.extend_from_slice(&[9; 7]);
        assert!(Packet::parse(&padded).unwrap().request_authentic(b"k"));
    }

    #[test]
    fn vendor_attributes_are_found_inside_vendor_specific() {
        let mut vsa = 14122u32.to_be_bytes().to_vec();
        vsa.extend_from_slice(&[7, 6, 0, 0, 0x27, 0x10, 8, 6, 0, 0, 0x4e, 0x20]);
        let bytes = request(COA_REQUEST, 1, &[(VENDOR_SPECIFIC, vsa)], b"k", false);
        let p = Packet::parse(&bytes).unwrap();
        assert_eq!(p.vendor(14122, 7), Some(&[0, 0, 0x27, 0x10][..]));
        assert_eq!(p.vendor(14122, 8), Some(&[0, 0, 0x4e, 0x20][..]));
        assert_eq!(p.vendor(14988, 8), None);
    }

    #[test]
    fn a_reply_carries_the_response_authenticator() {
        let bytes = request(COA_REQUEST, 9, &[(USER_NAME, b"c1".to_vec())], b"k", true);
        let p = Packet::parse(&bytes).unwrap();
        let r = reply(COA_NAK, &p, Some(503), b"k");
        assert_eq!((r[0], r[1], usize::from(r[3])), (COA_NAK, 9, r.len()));
        let mut check = r.clone();
        check[4..20].copy_from_slice(&p.authenticator);
        let mut md5 = Md5::new();
        md5.update(&check);
        md5.update(b"k");
        assert_eq!(&r[4..20], &md5.finalize()[..]);
        assert_eq!(&r[20..26], &[ERROR_CAUSE, 6, 0, 0, 1, 247]);
    }
}
