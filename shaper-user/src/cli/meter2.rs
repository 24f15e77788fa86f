//! `--excess-rate EIR --excess-burst EBS [--excess-dscp DSCP]` and `--packet-rate N
//! --packet-burst N`, taken by `policy set`: a policy's second meter. The excess rate is
//! RFC 4115's (MEF 10.4's EIR): frames beyond the committed rate and burst (`--rate`,
//! `--burst`) but within it pass with their DSCP rewritten; the packet rate refuses a
//! frame over N frames a second (N at once), whatever its size.

use anyhow::{Result, anyhow};
use shaper_common::{
    config::{ConfigError, Meter2Limits},
    dscp::Dscp,
    maps::Meter2,
};
use shaper_user::units::{Packets, Rate, Size};

#[derive(Debug, clap::Args)]
pub struct SecondMeter {
    /// Excess rate per source (RFC 4115's EIR), in tc units: frames over --rate and
    /// --burst but within this pass marked with --excess-dscp instead of being dropped
    #[arg(long, value_name = "RATE", requires = "excess_burst")]
    pub excess_rate: Option<Rate>,
    /// Excess burst per source (EBS), in tc units
    #[arg(long, value_name = "SIZE", requires = "excess_rate")]
    pub excess_burst: Option<Size>,
    /// The DSCP written into frames passed by the excess rate, ECN bits kept: a name
    /// (cs0..cs7, af11..af43, ef, le) or 0-63 [default: le, RFC 8622's Lower Effort]
    #[arg(long, value_name = "DSCP", requires = "excess_rate")]
    pub excess_dscp: Option<Dscp>,
    /// Frames a second per source, whatever their size (20000, 20k, 1m): a frame passes
    /// only if this and the byte rate both allow it
    #[arg(long, value_name = "N", requires = "packet_burst")]
    pub packet_rate: Option<Packets>,
    /// Frames per source at once, beside --packet-rate
    #[arg(long, value_name = "N", requires = "packet_rate")]
    pub packet_burst: Option<Packets>,
}

impl SecondMeter {
    /// The second meter asked for, checked; all zero when no flag was given.
    pub fn limits(&self) -> Result<Meter2Limits> {
        let limits = Meter2Limits {
            excess_rate_bps: self.excess_rate.map_or(0, Rate::bits_per_sec),
            excess_burst_bytes: self.excess_burst.map_or(0, Size::bytes),
            excess_dscp: match self.excess_rate {
                Some(_) => self.excess_dscp.unwrap_or(Dscp::LE).value(),
                None => 0,
            },
            packet_rate: self.packet_rate.map_or(0, Packets::count),
            packet_burst: self.packet_burst.map_or(0, Packets::count),
        };
        Meter2::new(&limits).map_err(|e| self.flagged(e))?;
        Ok(limits)
    }

    /// A refusal, named by its flag and the value given.
    fn flagged(&self, e: ConfigError) -> anyhow::Error {
        let show = |v: Option<String>| v.unwrap_or_default();
        match e {
            ConfigError::Excess(e) => {
                let (flag, given) = if e.field() == "rate" {
                    (
                        "--excess-rate",
                        show(self.excess_rate.map(|r| r.to_string())),
                    )
                } else {
                    (
                        "--excess-burst",
                        show(self.excess_burst.map(|b| b.to_string())),
                    )
                };
                anyhow!("invalid {flag} {given}: {e}")
            }
            ConfigError::PacketRate(e) => anyhow!(
                "invalid --packet-rate {} / --packet-burst {}: {e}",
                show(self.packet_rate.map(|n| n.to_string())),
                show(self.packet_burst.map(|n| n.to_string()))
            ),
            ConfigError::PacketRateTooHigh(_) => anyhow!(
                "invalid --packet-rate {}: {e}",
                show(self.packet_rate.map(|n| n.to_string()))
            ),
            e => anyhow!("{e}"),
        }
    }
}

/// What a second meter's limits say, for `policy list` and `status` ("" for none).
pub fn describe(m: &Meter2Limits) -> String {
    let mut text = String::new();
    if m.excess_rate_bps != 0 {
        text += &format!(
            ", excess {} burst {} marked {}",
            Rate::from_bps(m.excess_rate_bps),
            Size::from_bytes(m.excess_burst_bytes),
            Dscp::new(m.excess_dscp).map_or_else(|| m.excess_dscp.to_string(), |d| d.to_string())
        );
    }
    if m.packet_rate != 0 {
        text += &format!(
            ", {} packets/s burst {}",
            Packets::from_count(m.packet_rate),
            Packets::from_count(m.packet_burst)
        );
    }
    text
}
