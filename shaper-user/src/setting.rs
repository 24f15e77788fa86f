//! The settings of an attachment by name, as the configuration file spells them: library
//! errors about one setting name it this way, and each edge (a command-line flag, a file
//! field) translates the name into its own.

use std::fmt;

/// One setting of an attachment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    Rate,
    Burst,
    MaxSources,
    MaxSubscribers,
    MaxPolicies,
    XdpMode,
    Hook,
    TcMode,
    Key,
    PrefixV4,
    PrefixV6,
    NewSources,
    NewSourcesBurst,
    Mode,
    EcnThreshold,
    Horizon,
    ExcessRate,
    ExcessBurst,
    ExcessDscp,
    PacketRate,
    PacketBurst,
}

impl Setting {
    /// The name in the configuration file: `max_sources`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rate => "rate",
            Self::Burst => "burst",
            Self::MaxSources => "max_sources",
            Self::MaxSubscribers => "max_subscribers",
            Self::MaxPolicies => "max_policies",
            Self::XdpMode => "xdp_mode",
            Self::Hook => "hook",
            Self::TcMode => "tc_mode",
            Self::Key => "key",
            Self::PrefixV4 => "prefix_v4",
            Self::PrefixV6 => "prefix_v6",
            Self::NewSources => "new_sources",
            Self::NewSourcesBurst => "new_sources_burst",
            Self::Mode => "mode",
            Self::EcnThreshold => "ecn_threshold",
            Self::Horizon => "horizon",
            Self::ExcessRate => "excess_rate",
            Self::ExcessBurst => "excess_burst",
            Self::ExcessDscp => "excess_dscp",
            Self::PacketRate => "packet_rate",
            Self::PacketBurst => "packet_burst",
        }
    }

    /// The setting a rate-and-burst error is about (`LimitError::field`).
    pub fn of_limit(field: &str) -> Self {
        if field == "rate" {
            Self::Rate
        } else {
            Self::Burst
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
