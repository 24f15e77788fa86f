//! Building a [`Config`] in userspace: the limit, the key and the prefix masks the
//! per-packet path ANDs addresses with (so it never loops over bits).

use core::fmt;

use crate::{
    dscp::DSCP_MAX,
    gcra::{Limit, LimitError, MAX_RATE_BPS},
    maps::{
        ACTION_DROP, ACTION_LIMIT, ACTION_PASS, Admission, Config, DEFAULT_ECN_THRESHOLD_NS,
        DEFAULT_HORIZON_NS, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, FIRST_SIGHTING_SHARE, KEY_BY_DST,
        KEY_BY_SRC, MAX_HORIZON_NS, METER2_EXCESS, METER2_PACKETS, MODE_ENFORCE, MODE_MONITOR,
        MODE_SHAPE, Meter2, Policy, Shape,
    },
};

/// Why the values asked for cannot form a [`Config`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    Limit(LimitError),
    /// Not one of the `KEY_BY_*` values.
    KeyBy(u32),
    /// An IPv4 prefix longer than 32 bits.
    PrefixV4(u32),
    /// An IPv6 prefix longer than 128 bits.
    PrefixV6(u32),
    /// Not one of the `ACTION_*` values.
    Action(u32),
    /// Not one of the `MODE_*` values.
    Mode(u32),
    /// The aggregate limit of a policy.
    Aggregate(LimitError),
    /// New-source admission: a burst without a rate.
    NewSourcesBurstAlone,
    /// New-source admission: more keys a second than a limit can count.
    NewSourcesTooMany(u64),
    /// New-source admission: its burst.
    NewSources(LimitError),
    /// Shape mode with an action other than limit (nothing to hold back).
    ShapeNeedsLimit,
    /// Shape mode with an aggregate rate (not supported: the aggregate is policed).
    ShapeWithAggregate,
    /// The excess rate and burst (RFC 4115's EIR and EBS).
    Excess(LimitError),
    /// An excess burst or DSCP without an excess rate, or a rate without a burst.
    ExcessIncomplete,
    /// A DSCP above 63.
    ExcessDscp(u8),
    /// The packet rate and burst.
    PacketRate(LimitError),
    /// A packet burst without a packet rate, or a rate without a burst.
    PacketRateIncomplete,
    /// More packets a second than a limit can count.
    PacketRateTooHigh(u64),
    /// Shape mode with a second meter (not supported: the second meter polices).
    ShapeWithMeter2,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limit(e) => e.fmt(f),
            Self::KeyBy(k) => write!(f, "unknown key {k} (0 = source, 1 = destination)"),
            Self::PrefixV4(p) => write!(f, "IPv4 prefix /{p} is longer than 32 bits"),
            Self::PrefixV6(p) => write!(f, "IPv6 prefix /{p} is longer than 128 bits"),
            Self::Action(a) => write!(f, "unknown action {a}"),
            Self::Mode(m) => write!(f, "unknown mode {m}"),
            Self::Aggregate(e) => write!(f, "aggregate: {e}"),
            Self::NewSourcesBurstAlone => {
                f.write_str("a new-sources burst needs a new-sources rate")
            }
            Self::NewSourcesTooMany(n) => write!(
                f,
                "{n} new sources a second is more than the {MAX_NEW_SOURCES} that can be metered"
            ),
            Self::NewSources(e) => write!(f, "new sources: {e}"),
            Self::ShapeNeedsLimit => {
                f.write_str("mode shape holds back what is over a rate: it needs action limit")
            }
            Self::ShapeWithAggregate => f.write_str(
                "mode shape with an aggregate rate is not supported (shape the prefix with a policy of its own, or police it)",
            ),
            Self::Excess(e) => write!(f, "excess: {e}"),
            Self::ExcessIncomplete => {
                f.write_str("an excess rate and an excess burst go together")
            }
            Self::ExcessDscp(d) => write!(f, "DSCP {d} is above {DSCP_MAX}"),
            Self::PacketRate(e) => write!(f, "packet rate: {e}"),
            Self::PacketRateIncomplete => {
                f.write_str("a packet rate and a packet burst go together")
            }
            Self::PacketRateTooHigh(n) => write!(
                f,
                "{n} packets a second is more than the {MAX_PACKET_RATE} that can be metered"
            ),
            Self::ShapeWithMeter2 => f.write_str(
                "mode shape with an excess rate or a packet rate is not supported (they police: mark or drop)",
            ),
        }
    }
}

impl From<LimitError> for ConfigError {
    fn from(e: LimitError) -> Self {
        Self::Limit(e)
    }
}

/// The most new sources a second admission can meter (a key counts as one byte).
pub const MAX_NEW_SOURCES: u64 = MAX_RATE_BPS / 8;

/// The default admission lets a flood turn a full source table over at most once in
/// this many seconds.
pub const TABLE_TURNOVER_SECS: u64 = 10;

impl Admission {
    /// The default admission of an interface whose source maps hold `max_sources` keys
    /// each: a whole table's worth of keys at once, so a warm start on a busy link is
    /// admitted in full, then a table every [`TABLE_TURNOVER_SECS`] seconds.
    pub fn for_table(max_sources: u32) -> Self {
        let burst = u64::from(max_sources).max(1);
        let per_sec = (burst / TABLE_TURNOVER_SECS).max(1);
        Self::new(per_sec, burst).unwrap_or_default()
    }

    /// Admission of at most `new_sources` keys a second, `burst` at once; `new_sources`
    /// 0 is unlimited (and takes no burst).
    pub fn new(new_sources: u64, burst: u64) -> Result<Self, ConfigError> {
        match (new_sources, burst) {
            (0, 0) => return Ok(Self::default()),
            (0, _) => return Err(ConfigError::NewSourcesBurstAlone),
            (n, _) if n > MAX_NEW_SOURCES => return Err(ConfigError::NewSourcesTooMany(n)),
            _ => {}
        }
        // One byte a key: the limit's byte rate is the key rate (so never below the
        // minimum rate, nor above the maximum); only the burst can be refused.
        let limit = Limit::new(new_sources * 8, burst).map_err(ConfigError::NewSources)?;
        let first = Self::first_sightings_per_sec(new_sources);
        Ok(Self {
            limit,
            new_sources,
            new_sources_burst: burst,
            first: Limit::new(first * 8, first).map_err(ConfigError::NewSources)?,
        })
    }

    /// The first-sighting allowance of an admission of `new_sources` keys a second: keys
    /// a second (and at once) that may get a cell on their first sighting.
    pub fn first_sightings_per_sec(new_sources: u64) -> u64 {
        (new_sources / FIRST_SIGHTING_SHARE).max(1)
    }
}

/// The most packets a second a packet-rate meter can count (a packet counts as one byte).
pub const MAX_PACKET_RATE: u64 = MAX_RATE_BPS / 8;

/// A second meter as asked for: an excess rate, burst and DSCP, and a packet rate and
/// burst; zero rates for none. The check of [`Meter2::new`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meter2Limits {
    pub excess_rate_bps: u64,
    pub excess_burst_bytes: u64,
    /// Meaningful with an excess rate only (0 without one).
    pub excess_dscp: u8,
    pub packet_rate: u64,
    pub packet_burst: u64,
}

impl Meter2Limits {
    /// Whether it asks for either meter.
    pub fn any(&self) -> bool {
        self.excess_rate_bps != 0 || self.packet_rate != 0
    }
}

impl Meter2 {
    /// The second meter `m` asks for; none (all zero) if it asks for neither meter.
    pub fn new(m: &Meter2Limits) -> Result<Self, ConfigError> {
        let mut meter = Self::default();
        match (m.excess_rate_bps, m.excess_burst_bytes) {
            (0, 0) if m.excess_dscp == 0 => {}
            (0, _) | (_, 0) => return Err(ConfigError::ExcessIncomplete),
            (rate, burst) => {
                if m.excess_dscp > DSCP_MAX {
                    return Err(ConfigError::ExcessDscp(m.excess_dscp));
                }
                meter.excess = Limit::new(rate, burst).map_err(ConfigError::Excess)?;
                meter.excess_rate_bps = rate;
                meter.excess_burst_bytes = burst;
                meter.excess_dscp = m.excess_dscp;
                meter.meters |= METER2_EXCESS;
            }
        }
        match (m.packet_rate, m.packet_burst) {
            (0, 0) => {}
            (0, _) | (_, 0) => return Err(ConfigError::PacketRateIncomplete),
            (n, _) if n > MAX_PACKET_RATE => return Err(ConfigError::PacketRateTooHigh(n)),
            (n, burst) => {
                meter.packets = Limit::new(n * 8, burst).map_err(ConfigError::PacketRate)?;
                meter.packet_rate = n;
                meter.packet_burst = burst;
                meter.meters |= METER2_PACKETS;
            }
        }
        Ok(meter)
    }

    /// What [`Meter2::new`] was given.
    pub fn limits(&self) -> Meter2Limits {
        Meter2Limits {
            excess_rate_bps: self.excess_rate_bps,
            excess_burst_bytes: self.excess_burst_bytes,
            excess_dscp: self.excess_dscp,
            packet_rate: self.packet_rate,
            packet_burst: self.packet_burst,
        }
    }
}

/// Why shaping settings were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeError {
    HorizonZero,
    HorizonTooLong(u64),
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HorizonZero => {
                f.write_str("must be more than 0 (0 would drop every held packet)")
            }
            Self::HorizonTooLong(ns) => write!(
                f,
                "{} ms is more than the {} ms sch_fq holds a packet at most",
                ns / 1_000_000,
                MAX_HORIZON_NS / 1_000_000
            ),
        }
    }
}

impl Shape {
    /// The defaults: [`DEFAULT_ECN_THRESHOLD_NS`], [`DEFAULT_HORIZON_NS`].
    pub const fn default_settings() -> Self {
        Self {
            ecn_threshold_ns: DEFAULT_ECN_THRESHOLD_NS,
            horizon_ns: DEFAULT_HORIZON_NS,
        }
    }

    /// Shaping that marks ECN-capable packets held longer than `ecn_threshold_ns` and
    /// drops those that would be held longer than `horizon_ns`. A threshold at or above
    /// the horizon marks nothing.
    pub fn new(ecn_threshold_ns: u64, horizon_ns: u64) -> Result<Self, ShapeError> {
        match horizon_ns {
            0 => Err(ShapeError::HorizonZero),
            h if h > MAX_HORIZON_NS => Err(ShapeError::HorizonTooLong(h)),
            _ => Ok(Self {
                ecn_threshold_ns,
                horizon_ns,
            }),
        }
    }
}

/// The mask of an IPv4 prefix of `prefix` bits (at most 32) in the form of
/// [`Config::mask_v4`]: its bytes in network order, read as a native u32.
pub fn mask_v4(prefix: u32) -> u32 {
    let bits = u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
    u32::from_ne_bytes(bits.to_be_bytes())
}

/// The mask of an IPv6 prefix of `prefix` bits (at most 128), bytes in network order.
pub fn mask_v6(prefix: u32) -> [u8; 16] {
    let bits = u128::MAX.checked_shl(128 - prefix.min(128)).unwrap_or(0);
    bits.to_be_bytes()
}

/// A rate and burst, validated once where they are read (a flag, a file field) and
/// carried as they are to the map entry: what was asked for, and the [`Limit`] the
/// per-packet path uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    rate_bps: u64,
    burst_bytes: u64,
    limit: Limit,
}

impl RateLimit {
    /// `rate_bps` bits per second, `burst_bytes` bytes at once.
    pub fn new(rate_bps: u64, burst_bytes: u64) -> Result<Self, LimitError> {
        Ok(Self {
            rate_bps,
            burst_bytes,
            limit: Limit::new(rate_bps, burst_bytes)?,
        })
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes
    }

    pub fn limit(&self) -> Limit {
        self.limit
    }
}

impl Config {
    /// An active policy: `rate` per key, keyed by `key_by` (`KEY_BY_*`) masked to
    /// `prefix_v4` / `prefix_v6` bits, attached in `xdp_mode` (`XDP_MODE_*`, or 0 while not
    /// yet known).
    pub fn new(
        rate: RateLimit,
        key_by: u32,
        prefix_v4: u32,
        prefix_v6: u32,
        xdp_mode: u32,
    ) -> Result<Self, ConfigError> {
        if key_by != KEY_BY_SRC && key_by != KEY_BY_DST {
            return Err(ConfigError::KeyBy(key_by));
        }
        if prefix_v4 > 32 {
            return Err(ConfigError::PrefixV4(prefix_v4));
        }
        if prefix_v6 > 128 {
            return Err(ConfigError::PrefixV6(prefix_v6));
        }
        Ok(Self {
            limit: rate.limit,
            rate_bps: rate.rate_bps,
            burst_bytes: rate.burst_bytes,
            xdp_mode,
            active: 1,
            key_by,
            prefix_v4,
            prefix_v6,
            mask_v4: mask_v4(prefix_v4),
            mask_v6: mask_v6(prefix_v6),
            mode: MODE_ENFORCE,
            // Never 0, which a source's unresolved policy carries.
            policy_gen: 1,
            // Every new key gets a cell unless admission is asked for.
            admission: Admission::default(),
            // Kept by the policy table along with the generation.
            prefixes_v4: 0,
            prefixes_v6: 0,
            shape: Shape::default_settings(),
            // Set per attachment by the loader; 0 hashes as well, only predictably.
            trace_seed: 0,
            // The byte rate alone unless a second meter is asked for.
            meter2: Meter2::default(),
        })
    }

    /// [`Config::new`] with the defaults: keyed by source address at /32 and /64, attach
    /// mode not yet known.
    pub fn per_source(rate_bps: u64, burst_bytes: u64) -> Result<Self, ConfigError> {
        Self::new(
            RateLimit::new(rate_bps, burst_bytes)?,
            KEY_BY_SRC,
            DEFAULT_PREFIX_V4,
            DEFAULT_PREFIX_V6,
            0,
        )
    }
}

/// A prefix policy's limits and action, as [`Policy::new`] takes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyLimits {
    /// `ACTION_*`.
    pub action: u32,
    /// `MODE_*`.
    pub mode: u32,
    /// Per source; both zero unless the action is `ACTION_LIMIT`.
    pub rate_bps: u64,
    pub burst_bytes: u64,
    /// The whole prefix; both zero for none.
    pub aggregate_rate_bps: u64,
    pub aggregate_burst_bytes: u64,
    /// New-source admission ([`Admission::new`]); both zero for none.
    pub new_sources: u64,
    pub new_sources_burst: u64,
    /// The second meter ([`Meter2::new`]); all zero for none, and unless the action is
    /// `ACTION_LIMIT`.
    pub meter2: Meter2Limits,
}

impl PolicyLimits {
    /// Whether each key's limit is the whole plan's ([`crate::maps::per_address_is_whole`]).
    pub fn per_address_is_whole(&self) -> bool {
        crate::maps::per_address_is_whole(
            self.action,
            (self.rate_bps, self.burst_bytes),
            (self.aggregate_rate_bps, self.aggregate_burst_bytes),
            (self.meter2.excess_rate_bps, self.meter2.excess_burst_bytes),
        )
    }
}

impl Policy {
    /// The policy for the prefix `addr/prefix_len` of `family` (4 or 6; the address bytes
    /// in network order, IPv4 in the first four), validated.
    pub fn new(
        family: u32,
        addr: [u8; 16],
        prefix_len: u32,
        p: &PolicyLimits,
    ) -> Result<Self, ConfigError> {
        match (family, prefix_len) {
            (4, 0..=32) | (6, 0..=128) => {}
            (4, p) => return Err(ConfigError::PrefixV4(p)),
            (_, p) => return Err(ConfigError::PrefixV6(p)),
        }
        if !matches!(p.mode, MODE_ENFORCE | MODE_MONITOR | MODE_SHAPE) {
            return Err(ConfigError::Mode(p.mode));
        }
        let (limit, aggregate) = match p.action {
            ACTION_LIMIT => {
                let limit = Limit::new(p.rate_bps, p.burst_bytes)?;
                let aggregate = if p.aggregate_rate_bps == 0 && p.aggregate_burst_bytes == 0 {
                    Limit::default()
                } else {
                    Limit::new(p.aggregate_rate_bps, p.aggregate_burst_bytes)
                        .map_err(ConfigError::Aggregate)?
                };
                (limit, aggregate)
            }
            ACTION_PASS | ACTION_DROP => (Limit::default(), Limit::default()),
            a => return Err(ConfigError::Action(a)),
        };
        if p.mode == MODE_SHAPE && p.action != ACTION_LIMIT {
            return Err(ConfigError::ShapeNeedsLimit);
        }
        if p.mode == MODE_SHAPE && p.aggregate_rate_bps != 0 {
            return Err(ConfigError::ShapeWithAggregate);
        }
        let meter2 = if p.action == ACTION_LIMIT {
            Meter2::new(&p.meter2)?
        } else {
            Meter2::default()
        };
        if p.mode == MODE_SHAPE && meter2.any() {
            return Err(ConfigError::ShapeWithMeter2);
        }
        let admission = Admission::new(p.new_sources, p.new_sources_burst)?;
        let limited = p.action == ACTION_LIMIT;
        Ok(Self {
            limit,
            aggregate,
            rate_bps: if limited { p.rate_bps } else { 0 },
            burst_bytes: if limited { p.burst_bytes } else { 0 },
            aggregate_rate_bps: if limited { p.aggregate_rate_bps } else { 0 },
            aggregate_burst_bytes: if limited { p.aggregate_burst_bytes } else { 0 },
            action: p.action,
            mode: p.mode,
            in_use: 1,
            family,
            prefix_len,
            plan: 0,
            addr,
            admission,
            meter2,
        })
    }

    /// What [`Policy::new`] was given.
    pub fn limits(&self) -> PolicyLimits {
        PolicyLimits {
            action: self.action,
            mode: self.mode,
            rate_bps: self.rate_bps,
            burst_bytes: self.burst_bytes,
            aggregate_rate_bps: self.aggregate_rate_bps,
            aggregate_burst_bytes: self.aggregate_burst_bytes,
            new_sources: self.admission.new_sources,
            new_sources_burst: self.admission.new_sources_burst,
            meter2: self.meter2.limits(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask bytes in network order, as an operator writes them.
    fn v4_bytes(prefix: u32) -> [u8; 4] {
        mask_v4(prefix).to_ne_bytes()
    }

    #[test]
    fn ipv4_masks() {
        assert_eq!(v4_bytes(0), [0, 0, 0, 0]);
        assert_eq!(v4_bytes(1), [0x80, 0, 0, 0]);
        assert_eq!(v4_bytes(24), [255, 255, 255, 0]);
        assert_eq!(v4_bytes(31), [255, 255, 255, 254]);
        assert_eq!(v4_bytes(32), [255, 255, 255, 255]);
        // Applied the way the program applies it: to the address bytes read as a u32.
        let addr = u32::from_ne_bytes([198, 51, 100, 77]);
        assert_eq!((addr & mask_v4(24)).to_ne_bytes(), [198, 51, 100, 0]);
        assert_eq!((addr & mask_v4(12)).to_ne_bytes(), [198, 48, 0, 0]);
    }

    #[test]
    fn ipv6_masks() {
        let ff = 0xff;
        assert_eq!(mask_v6(0), [0; 16]);
        assert_eq!(
            mask_v6(1),
            [0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            mask_v6(48),
            [ff, ff, ff, ff, ff, ff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            mask_v6(64),
            [ff, ff, ff, ff, ff, ff, ff, ff, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            mask_v6(65),
            [ff, ff, ff, ff, ff, ff, ff, ff, 0x80, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(mask_v6(127)[15], 0xfe);
        assert_eq!(mask_v6(128), [ff; 16]);
    }

    #[test]
    fn config_validates_and_carries_masks() {
        let rate = RateLimit::new(10_000_000, 65_536).unwrap();
        let c = Config::new(rate, KEY_BY_DST, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, 0).unwrap();
        assert_eq!(c.active, 1);
        assert_eq!((c.key_by, c.prefix_v4, c.prefix_v6), (KEY_BY_DST, 32, 64));
        assert_eq!(c.mask_v4, u32::MAX);
        assert_eq!(c.mask_v6, mask_v6(64));
        assert_eq!(c.limit, Limit::new(10_000_000, 65_536).unwrap());

        assert_eq!(Config::new(rate, 2, 32, 64, 0), Err(ConfigError::KeyBy(2)));
        assert_eq!(
            Config::new(rate, KEY_BY_SRC, 33, 64, 0),
            Err(ConfigError::PrefixV4(33))
        );
        assert_eq!(
            Config::new(rate, KEY_BY_SRC, 32, 129, 0),
            Err(ConfigError::PrefixV6(129))
        );
        assert_eq!(RateLimit::new(7, 65_536), Err(LimitError::RateTooLow));
        assert_eq!(LimitError::RateTooLow.field(), "rate");
        assert_eq!(LimitError::BurstTooLong.field(), "burst");
        assert!(Config::new(rate, KEY_BY_SRC, 0, 0, 0).is_ok());
        assert!(Config::new(rate, KEY_BY_SRC, 32, 128, 0).is_ok());
    }

    #[test]
    fn admission_counts_a_key_as_one_byte() {
        assert_eq!(Admission::new(0, 0), Ok(Admission::default()));
        assert!(!Admission::default().limited());
        let a = Admission::new(1000, 5000).unwrap();
        assert!(a.limited());
        assert_eq!(a.limit, Limit::new(8000, 5000).unwrap());
        assert_eq!((a.new_sources, a.new_sources_burst), (1000, 5000));
        // From idle, exactly the burst of keys is admitted at once.
        let now = 1 << 40;
        let mut tat = 0;
        let mut admitted = 0;
        while let Some(t) = a.limit.admit(tat, now, 1) {
            tat = t;
            admitted += 1;
            assert!(admitted <= 5000);
        }
        assert_eq!(admitted, 5000);
        assert_eq!(
            Admission::new(0, 10),
            Err(ConfigError::NewSourcesBurstAlone)
        );
        assert_eq!(
            Admission::new(10, 0),
            Err(ConfigError::NewSources(LimitError::BurstZero))
        );
        assert_eq!(
            Admission::new(MAX_NEW_SOURCES + 1, 1),
            Err(ConfigError::NewSourcesTooMany(MAX_NEW_SOURCES + 1))
        );
        assert!(Admission::new(MAX_NEW_SOURCES, 1).is_ok());
        let table = Admission::for_table(262_144);
        assert_eq!(
            (table.new_sources, table.new_sources_burst),
            (26_214, 262_144)
        );
        let tiny = Admission::for_table(1);
        assert_eq!((tiny.new_sources, tiny.new_sources_burst), (1, 1));
        assert_eq!(
            Admission::new(1, u64::MAX / 8),
            Err(ConfigError::NewSources(LimitError::BurstTooLong))
        );
    }

    #[test]
    fn policies_validate_and_carry_only_what_their_action_uses() {
        let addr = [198, 51, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let limited = PolicyLimits {
            action: ACTION_LIMIT,
            rate_bps: 4_000_000,
            burst_bytes: 65_536,
            aggregate_rate_bps: 10_000_000,
            aggregate_burst_bytes: 131_072,
            ..PolicyLimits::default()
        };
        let p = Policy::new(4, addr, 24, &limited).unwrap();
        assert_eq!(p.limit, Limit::new(4_000_000, 65_536).unwrap());
        assert_eq!(p.aggregate, Limit::new(10_000_000, 131_072).unwrap());
        assert_eq!((p.in_use, p.family, p.prefix_len), (1, 4, 24));
        assert_eq!(p.limits(), limited);

        let pass = PolicyLimits {
            action: ACTION_PASS,
            ..limited
        };
        let p = Policy::new(6, [0x20; 16], 48, &pass).unwrap();
        assert_eq!((p.limit, p.aggregate), (Limit::default(), Limit::default()));
        assert_eq!((p.rate_bps, p.aggregate_rate_bps), (0, 0));

        assert_eq!(
            Policy::new(4, addr, 33, &limited),
            Err(ConfigError::PrefixV4(33))
        );
        assert_eq!(
            Policy::new(6, addr, 129, &limited),
            Err(ConfigError::PrefixV6(129))
        );
        let bad_aggregate = PolicyLimits {
            aggregate_burst_bytes: 0,
            ..limited
        };
        assert_eq!(
            Policy::new(4, addr, 24, &bad_aggregate),
            Err(ConfigError::Aggregate(LimitError::BurstZero))
        );
        let bad_action = PolicyLimits {
            action: 9,
            ..limited
        };
        assert_eq!(
            Policy::new(4, addr, 24, &bad_action),
            Err(ConfigError::Action(9))
        );
    }

    /// A per-address limit is the whole plan's only at exactly the committed and excess
    /// rates and bursts together, and only under an aggregate; the entry says the same as
    /// what it was made from (the kernel reads the entry).
    #[test]
    fn a_per_address_limit_is_whole_at_exactly_the_plans_sum() {
        let whole = PolicyLimits {
            action: ACTION_LIMIT,
            rate_bps: 15_000_000,
            burst_bytes: 96_000,
            aggregate_rate_bps: 10_000_000,
            aggregate_burst_bytes: 64_000,
            meter2: Meter2Limits {
                excess_rate_bps: 5_000_000,
                excess_burst_bytes: 32_000,
                excess_dscp: 10,
                ..Meter2Limits::default()
            },
            ..PolicyLimits::default()
        };
        let addr = [0; 16];
        for (limits, want) in [
            (whole, true),
            (
                PolicyLimits {
                    rate_bps: 14_999_999,
                    ..whole
                },
                false,
            ),
            (
                PolicyLimits {
                    burst_bytes: 96_001,
                    ..whole
                },
                false,
            ),
            (
                PolicyLimits {
                    meter2: Meter2Limits::default(),
                    ..whole
                },
                false,
            ),
            (
                PolicyLimits {
                    rate_bps: 10_000_000,
                    burst_bytes: 64_000,
                    meter2: Meter2Limits::default(),
                    ..whole
                },
                true,
            ),
            (
                PolicyLimits {
                    aggregate_rate_bps: 0,
                    aggregate_burst_bytes: 0,
                    meter2: Meter2Limits::default(),
                    rate_bps: 0,
                    burst_bytes: 0,
                    ..whole
                },
                false,
            ),
            (
                PolicyLimits {
                    action: ACTION_PASS,
                    ..whole
                },
                false,
            ),
        ] {
            assert_eq!(limits.per_address_is_whole(), want, "{limits:?}");
            if let Ok(p) = Policy::new(4, addr, 0, &limits) {
                assert_eq!(p.per_address_is_whole(), want, "{limits:?}");
            }
        }
    }
}

#[cfg(test)]
mod shape_tests {
    use super::*;

    #[test]
    fn shape_mode_needs_a_limit_and_no_aggregate() {
        let addr = [198, 51, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let shaped = PolicyLimits {
            action: ACTION_LIMIT,
            mode: MODE_SHAPE,
            rate_bps: 4_000_000,
            burst_bytes: 65_536,
            ..PolicyLimits::default()
        };
        assert_eq!(Policy::new(4, addr, 24, &shaped).unwrap().mode, MODE_SHAPE);
        let pass = PolicyLimits {
            action: ACTION_PASS,
            rate_bps: 0,
            burst_bytes: 0,
            ..shaped
        };
        assert_eq!(
            Policy::new(4, addr, 24, &pass),
            Err(ConfigError::ShapeNeedsLimit)
        );
        let aggregate = PolicyLimits {
            aggregate_rate_bps: 10_000_000,
            aggregate_burst_bytes: 131_072,
            ..shaped
        };
        assert_eq!(
            Policy::new(4, addr, 24, &aggregate),
            Err(ConfigError::ShapeWithAggregate)
        );
    }

    #[test]
    fn shaping_settings_are_checked() {
        assert_eq!(
            Shape::new(5_000_000, 50_000_000),
            Ok(Shape::default_settings())
        );
        assert_eq!(Shape::new(1, 0), Err(ShapeError::HorizonZero));
        assert!(Shape::new(1, MAX_HORIZON_NS + 1).is_err());
        assert!(Shape::new(0, MAX_HORIZON_NS).is_ok());
    }
}
