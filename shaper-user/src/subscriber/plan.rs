//! A subscriber's plan from what is stated of it, whoever states it: `subscriber set`'s
//! flags, the file's `[plan.NAME]` and `[[interface.subscriber]]` tables, a LibreQoS
//! circuit, a RADIUS CoA's rates. The one place where each address's limit defaults to the
//! whole plan (committed and excess rate together), and where a burst given as a time at a
//! rate becomes bytes. Each caller checks its own values (with its own words for where they
//! came from), then the plan ([`super::check_plan`], or when it is written).

use shaper_common::{
    config::{Meter2Limits, PolicyLimits},
    maps::ACTION_LIMIT,
};

/// The smallest burst a burst time gives: 16 KiB (ten full-size frames and more).
pub const MIN_BURST_BYTES: u64 = 16 << 10;

/// What a plan is stated with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanParts {
    /// The subscriber's (committed) rate, all its prefixes together, and its burst.
    pub rate_bps: u64,
    pub burst_bytes: u64,
    /// Each address's (each key's) rate and burst inside it; `None`: the whole plan.
    pub per_address: Option<(u64, u64)>,
    /// The excess (peak) rate over the committed one, its burst and its mark; all zero for
    /// none.
    pub excess: Meter2Limits,
    /// `MODE_ENFORCE` or `MODE_MONITOR`.
    pub mode: u32,
}

impl PlanParts {
    /// The plan these parts state (not yet checked).
    pub fn limits(&self) -> PolicyLimits {
        let (rate_bps, burst_bytes) = self.per_address.unwrap_or((
            self.rate_bps + self.excess.excess_rate_bps,
            self.burst_bytes + self.excess.excess_burst_bytes,
        ));
        PolicyLimits {
            action: ACTION_LIMIT,
            mode: self.mode,
            rate_bps,
            burst_bytes,
            aggregate_rate_bps: self.rate_bps,
            aggregate_burst_bytes: self.burst_bytes,
            meter2: self.excess,
            ..PolicyLimits::default()
        }
    }
}

/// `plan` at another rate, `rate_bps`, with a burst lasting `burst_ns` at it: the
/// per-address limit follows where it was the whole plan's and is kept where it was its
/// own; the excess rate, its mark, the mode and the rest are kept.
pub fn with_rate(plan: &PolicyLimits, rate_bps: u64, burst_ns: u64) -> PolicyLimits {
    let parts = PlanParts {
        rate_bps,
        burst_bytes: burst_for(rate_bps, burst_ns),
        per_address: (!plan.per_address_is_whole()).then_some((plan.rate_bps, plan.burst_bytes)),
        excess: plan.meter2,
        mode: plan.mode,
    };
    PolicyLimits {
        action: plan.action,
        new_sources: plan.new_sources,
        new_sources_burst: plan.new_sources_burst,
        ..parts.limits()
    }
}

/// A burst lasting `burst_ns` at `rate_bps`, at least [`MIN_BURST_BYTES`].
pub fn burst_for(rate_bps: u64, burst_ns: u64) -> u64 {
    let bytes = u128::from(rate_bps) * u128::from(burst_ns) / 8 / 1_000_000_000;
    u64::try_from(bytes)
        .unwrap_or(u64::MAX)
        .max(MIN_BURST_BYTES)
}
