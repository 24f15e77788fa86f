//! A prefix policy as an operator states it: the prefix and what to do with its sources.

use std::{fmt, net::IpAddr};

use ipnet::IpNet;
use shaper_common::{
    config::{ConfigError, PolicyLimits},
    maps::{
        ACTION_DROP, ACTION_LIMIT, ACTION_PASS, MODE_ENFORCE, MODE_MONITOR, MODE_SHAPE, Policy,
    },
};

/// What a policy does with its sources' packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Action {
    /// Hold each source to the policy's rate and burst (and the prefix to its aggregate).
    #[default]
    Limit,
    /// Exempt: never limited, still counted.
    Pass,
    /// Blocked: every packet dropped.
    Drop,
}

impl Action {
    pub fn value(self) -> u32 {
        match self {
            Self::Limit => ACTION_LIMIT,
            Self::Pass => ACTION_PASS,
            Self::Drop => ACTION_DROP,
        }
    }

    pub fn from_value(v: u32) -> Option<Self> {
        match v {
            ACTION_LIMIT => Some(Self::Limit),
            ACTION_PASS => Some(Self::Pass),
            ACTION_DROP => Some(Self::Drop),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Limit => "limit",
            Self::Pass => "pass",
            Self::Drop => "drop",
        }
    }
}

/// Whether drops are carried out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Mode {
    /// Drop what does not conform.
    #[default]
    Enforce,
    /// Dry run: drop nothing, count what enforcement would drop.
    Monitor,
    /// Egress only, with sch_fq: delay what does not conform until it does (ECN marks
    /// past --ecn-threshold, drops only past --horizon).
    Shape,
}

impl Mode {
    pub fn value(self) -> u32 {
        match self {
            Self::Enforce => MODE_ENFORCE,
            Self::Monitor => MODE_MONITOR,
            Self::Shape => MODE_SHAPE,
        }
    }

    pub fn from_value(v: u32) -> Self {
        match v {
            MODE_MONITOR => Self::Monitor,
            MODE_SHAPE => Self::Shape,
            _ => Self::Enforce,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Monitor => "monitor",
            Self::Shape => "shape",
        }
    }
}

/// Why a prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    #[error("invalid prefix '{0}' (expected an address or address/length)")]
    Syntax(String),
    #[error("invalid prefix '{given}': host bits are set (did you mean {network}?)")]
    HostBits { given: String, network: IpNet },
}

/// Parses `198.51.100.0/24`, `2001:db8::/32`, or a bare address (a /32 or /128). Like
/// `ip route`, a prefix with bits set past its length is refused rather than truncated.
pub fn parse_prefix(s: &str) -> Result<IpNet, PrefixError> {
    let net = match s.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => s
            .parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| PrefixError::Syntax(s.to_owned()))?,
    };
    if net.trunc() != net {
        return Err(PrefixError::HostBits {
            given: s.to_owned(),
            network: net.trunc(),
        });
    }
    Ok(net)
}

/// A prefix and its policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    pub prefix: IpNet,
    pub limits: PolicyLimits,
}

impl PolicySpec {
    /// The map entry, validated.
    pub fn to_policy(&self) -> Result<Policy, ConfigError> {
        let (family, addr) = family_and_bytes(&self.prefix);
        Policy::new(
            family,
            addr,
            u32::from(self.prefix.prefix_len()),
            &self.limits,
        )
    }

    /// The spec of a map entry; `None` for a slot not in use or not well-formed.
    pub fn from_policy(p: &Policy) -> Option<Self> {
        if p.in_use == 0 {
            return None;
        }
        let addr: IpAddr = match p.family {
            4 => <[u8; 4]>::try_from(&p.addr[..4]).ok()?.into(),
            6 => p.addr.into(),
            _ => return None,
        };
        let prefix = IpNet::new(addr, u8::try_from(p.prefix_len).ok()?).ok()?;
        Some(Self {
            prefix,
            limits: p.limits(),
        })
    }

    pub fn action(&self) -> Action {
        Action::from_value(self.limits.action).unwrap_or_default()
    }

    pub fn mode(&self) -> Mode {
        Mode::from_value(self.limits.mode)
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.prefix, self.action().name())
    }
}

/// 4 or 6, and the address bytes in network order as the maps hold them (IPv4 in the
/// first four).
pub fn family_and_bytes(net: &IpNet) -> (u32, [u8; 16]) {
    let mut bytes = [0u8; 16];
    match net.addr() {
        IpAddr::V4(a) => {
            bytes[..4].copy_from_slice(&a.octets());
            (4, bytes)
        }
        IpAddr::V6(a) => (6, a.octets()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_parse_like_ip_route() {
        assert_eq!(
            parse_prefix("198.51.100.0/24").unwrap().to_string(),
            "198.51.100.0/24"
        );
        assert_eq!(
            parse_prefix("198.51.100.7").unwrap().to_string(),
            "198.51.100.7/32"
        );
        assert_eq!(
            parse_prefix("2001:db8::/32").unwrap().to_string(),
            "2001:db8::/32"
        );
        assert_eq!(parse_prefix("::1").unwrap().to_string(), "::1/128");
        assert_eq!(parse_prefix("0.0.0.0/0").unwrap().prefix_len(), 0);
        assert_eq!(
            parse_prefix("198.51.100.7/24").unwrap_err().to_string(),
            "invalid prefix '198.51.100.7/24': host bits are set (did you mean 198.51.100.0/24?)"
        );
        for bad in ["198.51.100.0/33", "2001:db8::/129", "eth0", "", "10.0.0.0/"] {
            assert!(
                matches!(parse_prefix(bad), Err(PrefixError::Syntax(_))),
                "{bad}"
            );
        }
    }

    /// What the maps hold and what operators type: each action and mode to its kernel
    /// value and back, by the name the flags and the file give it (serde's), and a spec
    /// read back from its limits as it was written.
    #[test]
    fn actions_and_modes_are_the_kernels_values_and_the_operators_names() {
        use serde::Deserialize as _;
        fn named(name: &str) -> serde::de::value::StrDeserializer<'_, serde::de::value::Error> {
            serde::de::value::StrDeserializer::new(name)
        }
        for (action, value, name) in [
            (Action::Limit, ACTION_LIMIT, "limit"),
            (Action::Pass, ACTION_PASS, "pass"),
            (Action::Drop, ACTION_DROP, "drop"),
        ] {
            assert_eq!(action.value(), value);
            assert_eq!(Action::from_value(value), Some(action));
            assert_eq!(action.name(), name);
            assert_eq!(Action::deserialize(named(name)), Ok(action));
        }
        assert_eq!(Action::from_value(99), None);
        for (mode, value, name) in [
            (Mode::Enforce, MODE_ENFORCE, "enforce"),
            (Mode::Monitor, MODE_MONITOR, "monitor"),
            (Mode::Shape, MODE_SHAPE, "shape"),
        ] {
            assert_eq!(mode.value(), value);
            assert_eq!(Mode::from_value(value), mode);
            assert_eq!(mode.name(), name);
            assert_eq!(Mode::deserialize(named(name)), Ok(mode));
            let spec = PolicySpec {
                prefix: parse_prefix("198.51.100.0/24").unwrap(),
                limits: PolicyLimits {
                    action: ACTION_DROP,
                    mode: value,
                    ..PolicyLimits::default()
                },
            };
            assert_eq!((spec.action(), spec.mode()), (Action::Drop, mode));
            assert_eq!(spec.to_string(), "198.51.100.0/24 drop");
        }
    }

    #[test]
    fn specs_round_trip_through_map_entries() {
        for (prefix, action) in [
            ("203.0.113.0/24", ACTION_LIMIT),
            ("2001:db8:7::/48", ACTION_PASS),
            ("192.0.2.66", ACTION_DROP),
        ] {
            let spec = PolicySpec {
                prefix: parse_prefix(prefix).unwrap(),
                limits: PolicyLimits {
                    action,
                    mode: MODE_MONITOR,
                    rate_bps: if action == ACTION_LIMIT { 4_000_000 } else { 0 },
                    burst_bytes: if action == ACTION_LIMIT { 65_536 } else { 0 },
                    ..PolicyLimits::default()
                },
            };
            let policy = spec.to_policy().unwrap();
            assert_eq!(PolicySpec::from_policy(&policy), Some(spec));
        }
        assert_eq!(PolicySpec::from_policy(&Policy::default()), None);
    }
}
