//! What an authentic CoA- or Disconnect-Request asks: which subscriber (the first of the
//! configured identifying attributes it carries) and, for a CoA, the new rates.
//!
//! Rates, as their vendors define them (FreeRADIUS's `dictionary.wispr` and
//! `dictionary.mikrotik`, MikroTik's RouterOS manual, "RADIUS Client"):
//! - WISPr-Bandwidth-Max-Up (vendor 14122, type 7) and -Down (type 8): integers, bit/s.
//!   Up is the subscriber's upload: the ingress attachment's plan; Down the egress one's.
//! - Mikrotik-Rate-Limit (vendor 14988, type 8): a string `rx-rate[/tx-rate] [bursts ...]`
//!   from the router's view: rx is what the router receives, the subscriber's upload; tx
//!   its download. A rate is a number with an optional `k` (×1,000) or `M` (×1,000,000);
//!   no tx-rate means tx = rx. Only the first word (rx/tx) is read: MikroTik's burst
//!   fields (burst rate, threshold, time) are an averaging burst, not a token bucket's, and
//!   are ignored; the bucket's burst follows the rate (the `burst_time` rule).
//!
//! Where both vendors' rates are given, WISPr's win for the direction they give.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

use super::packet::{
    ACCT_SESSION_ID, DELEGATED_IPV6_PREFIX, FILTER_ID, FRAMED_IP_ADDRESS, FRAMED_IPV6_PREFIX,
    Packet, USER_NAME,
};

pub const VENDOR_WISPR: u32 = 14122;
pub const WISPR_BANDWIDTH_MAX_UP: u8 = 7;
pub const WISPR_BANDWIDTH_MAX_DOWN: u8 = 8;
pub const VENDOR_MIKROTIK: u32 = 14988;
pub const MIKROTIK_RATE_LIMIT: u8 = 8;

/// The attributes that may name the subscriber, as the `identify` setting names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Identify {
    /// User-Name: the subscriber's id.
    UserName,
    /// Framed-IP-Address: a subscriber's IPv4 prefix holding it.
    FramedIpAddress,
    /// Framed-IPv6-Prefix: a subscriber's IPv6 prefix holding it.
    FramedIpv6Prefix,
    /// Delegated-IPv6-Prefix (RFC 4818): as Framed-IPv6-Prefix.
    DelegatedIpv6Prefix,
    /// Acct-Session-Id: the session the daemon's accounting started for the subscriber
    /// (`super::accounting::SessionIndex`).
    AcctSessionId,
}

impl Identify {
    pub const ALL: [Self; 5] = [
        Self::UserName,
        Self::FramedIpAddress,
        Self::FramedIpv6Prefix,
        Self::DelegatedIpv6Prefix,
        Self::AcctSessionId,
    ];

    fn attribute(self) -> u8 {
        match self {
            Self::UserName => USER_NAME,
            Self::FramedIpAddress => FRAMED_IP_ADDRESS,
            Self::FramedIpv6Prefix => FRAMED_IPV6_PREFIX,
            Self::DelegatedIpv6Prefix => DELEGATED_IPV6_PREFIX,
            Self::AcctSessionId => ACCT_SESSION_ID,
        }
    }
}

/// The subscriber a request names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Id(String),
    /// A subscriber with a prefix holding this one (an address is a /32).
    Prefix(IpNet),
    /// The subscriber of an accounting session, by its Acct-Session-Id.
    Session(String),
}

/// A request's attribute is missing or not what its definition says: the NAK's
/// Error-Cause (RFC 5176 §3.5).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// 402 Missing-Attribute.
    #[error("{0}")]
    Missing(String),
    /// 407 Invalid-Attribute-Value.
    #[error("{0}")]
    Invalid(String),
}

impl Refused {
    pub fn error_cause(&self) -> u32 {
        match self {
            Self::Missing(_) => 402,
            Self::Invalid(_) => 407,
        }
    }
}

/// The subscriber `p` names: by the first attribute of `identify` it carries.
pub fn target(p: &Packet<'_>, identify: &[Identify]) -> Result<Target, Refused> {
    let Some((how, value)) = identify
        .iter()
        .find_map(|i| p.first(i.attribute()).map(|v| (*i, v)))
    else {
        return Err(Refused::Missing(format!(
            "none of the identifying attributes {identify:?}"
        )));
    };
    let invalid = |what: &str| Refused::Invalid(format!("invalid {what}"));
    match how {
        Identify::UserName => std::str::from_utf8(value)
            .map(|s| Target::Id(s.to_owned()))
            .map_err(|_| invalid("User-Name (not UTF-8)")),
        Identify::FramedIpAddress => <[u8; 4]>::try_from(value)
            .map(|a| Target::Prefix(IpNet::from(IpAddr::V4(Ipv4Addr::from(a)))))
            .map_err(|_| invalid("Framed-IP-Address (not 4 octets)")),
        Identify::FramedIpv6Prefix | Identify::DelegatedIpv6Prefix => {
            ipv6_prefix(value).ok_or_else(|| invalid("IPv6 prefix (RFC 3162 §2.3)"))
        }
        Identify::AcctSessionId => std::str::from_utf8(value)
            .map(|s| Target::Session(s.to_owned()))
            .map_err(|_| invalid("Acct-Session-Id (not UTF-8)")),
    }
}

/// RFC 3162 §2.3: a reserved octet, the length (0-128), then at most 16 octets of prefix.
fn ipv6_prefix(v: &[u8]) -> Option<Target> {
    let (&len, bytes) = v.get(1).zip(v.get(2..))?;
    if len > 128 || bytes.len() > 16 || bytes.len() * 8 < usize::from(len) {
        return None;
    }
    let mut addr = [0u8; 16];
    addr[..bytes.len()].copy_from_slice(bytes);
    let net = Ipv6Net::new(Ipv6Addr::from(addr), len).ok()?;
    Some(Target::Prefix(IpNet::V6(net.trunc())))
}

/// A CoA's new rates, bit/s: upload (ingress), download (egress).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    pub up: Option<u64>,
    pub down: Option<u64>,
}

/// The plan a CoA names in its Filter-Id, if it has one (RFC 2865 §5.11: text).
pub fn filter_id(p: &Packet<'_>) -> Result<Option<String>, Refused> {
    p.first(FILTER_ID)
        .map(|v| {
            String::from_utf8(v.to_vec())
                .map_err(|_| Refused::Invalid("invalid Filter-Id (not UTF-8)".to_owned()))
        })
        .transpose()
}

/// The rates a CoA asks (when it names no plan); no rate at all is a missing attribute.
pub fn rates(p: &Packet<'_>) -> Result<Rates, Refused> {
    let mut rates = match p.vendor(VENDOR_MIKROTIK, MIKROTIK_RATE_LIMIT) {
        Some(v) => mikrotik(v)?,
        None => Rates::default(),
    };
    let wispr = |kind: u8, name: &str| -> Result<Option<u64>, Refused> {
        p.vendor(VENDOR_WISPR, kind)
            .map(|v| {
                <[u8; 4]>::try_from(v)
                    .map(|b| u64::from(u32::from_be_bytes(b)))
                    .map_err(|_| Refused::Invalid(format!("invalid {name} (not 4 octets)")))
            })
            .transpose()
    };
    if let Some(up) = wispr(WISPR_BANDWIDTH_MAX_UP, "WISPr-Bandwidth-Max-Up")? {
        rates.up = Some(up);
    }
    if let Some(down) = wispr(WISPR_BANDWIDTH_MAX_DOWN, "WISPr-Bandwidth-Max-Down")? {
        rates.down = Some(down);
    }
    if rates.up.is_none() && rates.down.is_none() {
        return Err(Refused::Missing(
            "no rate (WISPr-Bandwidth-Max-Up/-Down or Mikrotik-Rate-Limit)".to_owned(),
        ));
    }
    if rates.up == Some(0) || rates.down == Some(0) {
        return Err(Refused::Invalid("a rate of 0".to_owned()));
    }
    Ok(rates)
}

/// Mikrotik-Rate-Limit's first word, `rx[/tx]`.
fn mikrotik(v: &[u8]) -> Result<Rates, Refused> {
    let text = std::str::from_utf8(v).unwrap_or("");
    let invalid = || {
        Refused::Invalid(format!(
            "invalid Mikrotik-Rate-Limit '{}'",
            text.escape_debug()
        ))
    };
    let word = text.split_whitespace().next().ok_or_else(invalid)?;
    let (rx, tx) = match word.split_once('/') {
        Some((rx, tx)) => (rx, tx),
        None => (word, word),
    };
    let rx = mikrotik_rate(rx).ok_or_else(invalid)?;
    let tx = mikrotik_rate(tx).ok_or_else(invalid)?;
    Ok(Rates {
        up: Some(rx),
        down: Some(tx),
    })
}

/// `512k`, `10M`, `64000`: bit/s.
fn mikrotik_rate(s: &str) -> Option<u64> {
    let (digits, scale) = match s.strip_suffix('k') {
        Some(d) => (d, 1_000),
        None => match s.strip_suffix('M') {
            Some(d) => (d, 1_000_000),
            None => (s, 1),
        },
    };
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::radius::packet::{COA_REQUEST, VENDOR_SPECIFIC, tests::request};

    fn vsa(vendor: u32, kind: u8, value: &[u8]) -> (u8, Vec<u8>) {
        let mut v = vendor.to_be_bytes().to_vec();
        v.push(kind);
        v.push(u8::try_from(value.len() + 2).unwrap());
        v.extend_from_slice(value);
        (VENDOR_SPECIFIC, v)
    }

    fn rates_of(attrs: &[(u8, Vec<u8>)]) -> Result<Rates, Refused> {
        let bytes = request(COA_REQUEST, 1, attrs, b"k", false);
        rates(&Packet::parse(&bytes).unwrap())
    }

    #[test]
    fn mikrotik_rates_are_rx_upload_tx_download_in_k_and_m() {
        let r = rates_of(&[vsa(VENDOR_MIKROTIK, 8, b"10M/20M 40M/40M")]).unwrap();
        assert_eq!((r.up, r.down), (Some(10_000_000), Some(20_000_000)));
        let r = rates_of(&[vsa(VENDOR_MIKROTIK, 8, b"512k")]).unwrap();
        assert_eq!((r.up, r.down), (Some(512_000), Some(512_000)));
        for bad in [&b"10G"[..], b"", b"/5M", b"1.5M", b"-1k"] {
            assert!(
                matches!(
                    rates_of(&[vsa(VENDOR_MIKROTIK, 8, bad)]),
                    Err(Refused::Invalid(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn wispr_rates_are_bits_per_second_and_win_over_mikrotik() {
        let r = rates_of(&[
            vsa(VENDOR_MIKROTIK, 8, b"1M/2M"),
            vsa(VENDOR_WISPR, 8, &5_000_000u32.to_be_bytes()),
        ])
        .unwrap();
        assert_eq!((r.up, r.down), (Some(1_000_000), Some(5_000_000)));
        assert_eq!(rates_of(&[]).unwrap_err().error_cause(), 402);
        assert_eq!(
            rates_of(&[vsa(VENDOR_WISPR, 7, &[1, 2])])
                .unwrap_err()
                .error_cause(),
            407
        );
    }

    #[test]
    fn a_filter_id_is_the_name_of_a_plan() {
        let id = |attrs: &[(u8, Vec<u8>)]| {
            let bytes = request(COA_REQUEST, 1, attrs, b"k", false);
            filter_id(&Packet::parse(&bytes).unwrap())
        };
        assert_eq!(
            id(&[(FILTER_ID, b"gold".to_vec())]).unwrap().as_deref(),
            Some("gold")
        );
        assert_eq!(id(&[]).unwrap(), None);
        assert_eq!(
            id(&[(FILTER_ID, vec![0xff])]).unwrap_err().error_cause(),
            407
        );
    }

    #[test]
    fn targets_follow_the_identify_order() {
        let v6 = vec![0, 56, 0xfd, 0xd7, 0xb7, 0x24, 0, 0, 1, 0xff];
        let bytes = request(
            COA_REQUEST,
            1,
            &[
                (USER_NAME, b"c1".to_vec()),
                (FRAMED_IPV6_PREFIX, v6),
                (FRAMED_IP_ADDRESS, vec![100, 64, 0, 1]),
            ],
            b"k",
            false,
        );
        let p = Packet::parse(&bytes).unwrap();
        assert_eq!(target(&p, &Identify::ALL), Ok(Target::Id("c1".into())));
        assert_eq!(
            target(&p, &[Identify::FramedIpAddress]),
            Ok(Target::Prefix("100.64.0.1/32".parse().unwrap()))
        );
        assert_eq!(
            target(&p, &[Identify::FramedIpv6Prefix]),
            Ok(Target::Prefix("fdd7:b724:0:100::/56".parse().unwrap()))
        );
        assert_eq!(
            target(&p, &[Identify::DelegatedIpv6Prefix])
                .unwrap_err()
                .error_cause(),
            402
        );
        let bytes = request(
            COA_REQUEST,
            1,
            &[
                (USER_NAME, b"c1".to_vec()),
                (ACCT_SESSION_ID, b"19A3F0C2B1D-00000002".to_vec()),
            ],
            b"k",
            false,
        );
        let p = Packet::parse(&bytes).unwrap();
        assert_eq!(
            target(&p, &[Identify::AcctSessionId, Identify::UserName]),
            Ok(Target::Session("19A3F0C2B1D-00000002".into()))
        );
    }
}
