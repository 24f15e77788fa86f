//! DSCP remarking of yellow frames ([`crate::maps::Meter2`]): the code points by name, and
//! the header arithmetic the kernel programs do and the tests check against.
//!
//! The DSCP is the upper six bits of the IPv4 TOS byte and of the IPv6 traffic class; the
//! lower two are ECN's, kept. An IPv4 header's checksum is updated incrementally (RFC 1624
//! eqn. 3, `HC' = ~(~HC + ~m + m')`), exactly as the kernel's `csum_replace2` computes it,
//! so XDP (which writes the header itself) and tc (`bpf_l3_csum_replace`) write the same
//! bytes.

/// Lower Effort (RFC 8622): what yellow frames are marked by default.
pub const DSCP_LE: u8 = 1;
/// The largest DSCP.
pub const DSCP_MAX: u8 = 63;

/// The code points with a name (RFC 2474 class selectors, RFC 2597 assured forwarding,
/// RFC 3246 expedited forwarding, RFC 8622 lower effort), as operators write them.
pub const DSCP_NAMES: [(&str, u8); 22] = [
    ("cs0", 0),
    ("cs1", 8),
    ("cs2", 16),
    ("cs3", 24),
    ("cs4", 32),
    ("cs5", 40),
    ("cs6", 48),
    ("cs7", 56),
    ("af11", 10),
    ("af12", 12),
    ("af13", 14),
    ("af21", 18),
    ("af22", 20),
    ("af23", 22),
    ("af31", 26),
    ("af32", 28),
    ("af33", 30),
    ("af41", 34),
    ("af42", 36),
    ("af43", 38),
    ("ef", 46),
    ("le", DSCP_LE),
];

/// A DSCP, 0 to 63: what `--excess-dscp` and `excess_dscp` take, by name ([`DSCP_NAMES`])
/// or number, and how it is shown (its name if it has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dscp(u8);

impl Dscp {
    /// The default mark of yellow frames: Lower Effort.
    pub const LE: Self = Self(DSCP_LE);

    /// The DSCP `value`, if it is one (at most [`DSCP_MAX`]).
    pub fn new(value: u8) -> Option<Self> {
        (value <= DSCP_MAX).then_some(Self(value))
    }

    pub fn value(self) -> u8 {
        self.0
    }
}

/// Why a text is not a DSCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DscpError;

impl core::fmt::Display for DscpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("not a DSCP: give 0 to 63 or a name (cs0..cs7, af11..af43, ef, le)")
    }
}

impl core::error::Error for DscpError {}

impl core::str::FromStr for Dscp {
    type Err = DscpError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = DSCP_NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(s));
        match name {
            Some(&(_, v)) => Ok(Self(v)),
            None => s.parse().ok().and_then(Self::new).ok_or(DscpError),
        }
    }
}

impl core::fmt::Display for Dscp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match DSCP_NAMES.iter().find(|&&(_, v)| v == self.0) {
            Some((name, _)) => f.write_str(name),
            None => write!(f, "{}", self.0),
        }
    }
}

/// The configuration file's `excess_dscp`: a name or a number, as `--excess-dscp` takes
/// them (`"cs1"`, `8`, `"8"`); written back by name where it has one.
#[cfg(feature = "user")]
impl<'de> serde::Deserialize<'de> for Dscp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Dscp;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a DSCP: 0 to 63 or a name (cs0..cs7, af11..af43, ef, le)")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dscp, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Dscp, E> {
                u8::try_from(n)
                    .ok()
                    .and_then(Dscp::new)
                    .ok_or_else(|| E::custom(DscpError))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Dscp, E> {
                self.visit_i64(i64::try_from(n).unwrap_or(-1))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(feature = "user")]
impl serde::Serialize for Dscp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The TOS byte (or IPv6 traffic class) `tos` with its DSCP replaced by `dscp`, its ECN
/// bits kept.
#[inline(always)]
pub fn with_dscp(tos: u8, dscp: u8) -> u8 {
    (dscp << 2) | (tos & 0b11)
}

/// One's complement addition of two 16-bit words, as the kernel's `csum16_add`.
#[inline(always)]
fn csum16_add(sum: u16, addend: u16) -> u16 {
    let (res, carry) = sum.overflowing_add(addend);
    res.wrapping_add(u16::from(carry))
}

/// The header checksum `check` after a 16-bit word of the header changed from `old` to
/// `new` (RFC 1624 eqn. 3; the kernel's `csum_replace2`). The three are in the same byte
/// order, whichever it is: one's complement sums do not depend on it.
#[inline(always)]
pub fn csum_replace2(check: u16, old: u16, new: u16) -> u16 {
    !csum16_add(csum16_add(!check, !old), new)
}

/// The first two bytes of an IPv6 header (version, traffic class, the flow label's top
/// four bits) with the traffic class's DSCP replaced by `dscp`.
#[inline(always)]
pub fn ipv6_with_dscp(b0: u8, b1: u8, dscp: u8) -> (u8, u8) {
    let tc = with_dscp((b0 << 4) | (b1 >> 4), dscp);
    ((b0 & 0xf0) | (tc >> 4), (tc << 4) | (b1 & 0x0f))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    /// The one's complement sum of a header, folded: 0xffff when its checksum is right.
    fn fold(header: &[u8]) -> u16 {
        let mut sum: u32 = header
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    fn header(tos: u8) -> [u8; 20] {
        let mut h = [
            0x45, tos, 0, 60, 0x5e, 0xed, 0, 0, 64, 17, 0, 0, 192, 0, 2, 7, 198, 18, 0, 1,
        ];
        let check = !fold(&h);
        h[10..12].copy_from_slice(&check.to_be_bytes());
        h
    }

    #[test]
    fn the_incremental_checksum_equals_a_full_one() {
        for tos in [0u8, 1, 2, 3, 0xb8, 0xff] {
            for dscp in 0..=DSCP_MAX {
                let mut h = header(tos);
                let old = u16::from_be_bytes([h[0], h[1]]);
                h[1] = with_dscp(tos, dscp);
                let new = u16::from_be_bytes([h[0], h[1]]);
                let check = u16::from_be_bytes([h[10], h[11]]);
                h[10..12].copy_from_slice(&csum_replace2(check, old, new).to_be_bytes());
                assert_eq!(fold(&h), 0xffff, "tos {tos:#x} dscp {dscp}");
                assert_eq!(h[1] & 0b11, tos & 0b11, "ECN kept");
                assert_eq!(h[1] >> 2, dscp);
            }
        }
    }

    #[test]
    fn the_ipv6_traffic_class_spans_two_bytes() {
        // Version 6, traffic class 0xb9 (EF, ECT(1)), flow label 0xabcde.
        let (b0, b1) = (0x6b, 0x9a);
        let (n0, n1) = ipv6_with_dscp(b0, b1, 8);
        assert_eq!((n0, n1), (0x62, 0x1a));
        assert_eq!(((n0 << 4) | (n1 >> 4)) & 0b11, 0b01, "ECN kept");
        assert_eq!(n1 & 0x0f, 0x0a, "flow label kept");
    }

    #[test]
    fn a_dscp_is_a_name_or_0_to_63_and_shows_as_its_name() {
        use std::string::ToString;
        assert_eq!("cs1".parse::<Dscp>().map(|d| d.value()), Ok(8));
        assert_eq!("EF".parse::<Dscp>().map(|d| d.value()), Ok(46));
        assert_eq!("63".parse::<Dscp>().map(|d| d.value()), Ok(63));
        assert_eq!("64".parse::<Dscp>(), Err(DscpError));
        assert_eq!("af44".parse::<Dscp>(), Err(DscpError));
        assert_eq!(Dscp::LE.to_string(), "le");
        assert_eq!(Dscp::new(3).unwrap().to_string(), "3");
    }

    /// What the configuration file's `excess_dscp` reads: a name, a number as text or as
    /// an integer of either sign's type, and a refusal that says what a DSCP is.
    #[test]
    fn a_dscp_field_reads_a_name_or_a_number() {
        use serde::{
            Deserialize,
            de::{IntoDeserializer, value::Error},
        };
        use std::string::{String, ToString};
        fn read<'de, T: IntoDeserializer<'de, Error>>(v: T) -> Result<u8, String> {
            Dscp::deserialize(v.into_deserializer())
                .map(Dscp::value)
                .map_err(|e| e.to_string())
        }
        assert_eq!(read("af41"), Ok(34));
        assert_eq!(read("9"), Ok(9));
        assert_eq!(read(46_i64), Ok(46));
        assert_eq!(read(63_u64), Ok(63));
        let not_a_dscp = DscpError.to_string();
        assert_eq!(
            not_a_dscp,
            "not a DSCP: give 0 to 63 or a name (cs0..cs7, af11..af43, ef, le)"
        );
        for refused in [read(64_u64), read(u64::MAX), read(-1_i64), read("af44")] {
            assert_eq!(refused.as_ref(), Err(&not_a_dscp));
        }
        assert_eq!(
            read(true),
            Err(
                "invalid type: boolean `true`, expected a DSCP: 0 to 63 or a name (cs0..cs7, \
                 af11..af43, ef, le)"
                    .into()
            )
        );
    }

    #[test]
    fn names_are_the_standard_code_points() {
        let of = |n: &str| DSCP_NAMES.iter().find(|(name, _)| *name == n).unwrap().1;
        assert_eq!((of("cs1"), of("af41"), of("ef"), of("le")), (8, 34, 46, 1));
        for (name, v) in DSCP_NAMES {
            assert!(v <= DSCP_MAX, "{name}");
        }
    }
}
