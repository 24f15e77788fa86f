//! Layout 5 (shaper as of commit dd8a0a0, before the kernel programs were verified in
//! pieces and before new-source admission's doorkeeper): the settings and counters'
//! values, frozen as those builds wrote them, and what they become now. Every other value
//! type of layout 5 is today's. Layouts 2 to 4 share the policy counters of layout 5.
//!
//! Every field of today's types is spelled out (no `..Default::default()`), so a field
//! added later fails to compile here until someone says what layout 5 carries into it.

use shaper_common::{
    gcra::Limit,
    maps::{
        Admission, CAS_TRIES, Config, Counters, Outcomes, Policy, PolicyStats, Shape, Sightings,
    },
    shape::DELAY_BUCKETS,
};

/// `Admission` of the settings and policies of layouts 2 to 5 (40 bytes): without the
/// first-sighting allowance.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admission5 {
    pub limit: Limit,
    pub new_sources: u64,
    pub new_sources_burst: u64,
}

const _: () = assert!(size_of::<Admission5>() == 40);

impl Admission5 {
    /// Today's: the same rate and burst, and the first-sighting allowance that goes with
    /// them (what `Admission::new` makes of them now).
    pub fn current(&self) -> Admission {
        Admission::new(self.new_sources, self.new_sources_burst).unwrap_or(Admission {
            limit: self.limit,
            new_sources: self.new_sources,
            new_sources_burst: self.new_sources_burst,
            ..Admission::default()
        })
    }
}

/// `SHAPER_POLICIES`' value (160 bytes), layouts 2 to 5.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy5 {
    pub limit: Limit,
    pub aggregate: Limit,
    pub rate_bps: u64,
    pub burst_bytes: u64,
    pub aggregate_rate_bps: u64,
    pub aggregate_burst_bytes: u64,
    pub action: u32,
    pub mode: u32,
    pub in_use: u32,
    pub family: u32,
    pub prefix_len: u32,
    pub _pad: u32,
    pub addr: [u8; 16],
    pub admission: Admission5,
}

const _: () = assert!(size_of::<Policy5>() == 160);

impl Policy5 {
    /// Today's policy: the same, its admission given its first-sighting allowance.
    pub fn current(&self) -> Policy {
        Policy {
            limit: self.limit,
            aggregate: self.aggregate,
            rate_bps: self.rate_bps,
            burst_bytes: self.burst_bytes,
            aggregate_rate_bps: self.aggregate_rate_bps,
            aggregate_burst_bytes: self.aggregate_burst_bytes,
            action: self.action,
            mode: self.mode,
            in_use: self.in_use,
            family: self.family,
            prefix_len: self.prefix_len,
            plan: 0,
            addr: self.addr,
            admission: self.admission.current(),
            meter2: Default::default(),
        }
    }
}

/// `SHAPER_CONFIG`'s value (152 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config5 {
    pub limit: Limit,
    pub rate_bps: u64,
    pub burst_bytes: u64,
    pub xdp_mode: u32,
    pub active: u32,
    pub key_by: u32,
    pub prefix_v4: u32,
    pub prefix_v6: u32,
    pub mask_v4: u32,
    pub mask_v6: [u8; 16],
    pub mode: u32,
    pub policy_gen: u32,
    pub admission: Admission5,
    pub prefixes_v4: u32,
    pub prefixes_v6: u32,
    pub shape: Shape,
}

const _: () = assert!(size_of::<Config5>() == 152);

/// `SHAPER_PSTATS`' value (120 bytes, per CPU), and `SHAPER_PCARRIED`'s; layouts 2 to 5.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats5 {
    pub outcomes: Outcomes,
    pub aggregate_refused_packets: u64,
    pub aggregate_refused_bytes: u64,
    pub unadmitted: Outcomes,
    pub new_sources: u64,
}

const _: () = assert!(size_of::<PolicyStats5>() == 120);

/// `SHAPER_COUNTERS`' value (432 bytes, per CPU), and `SHAPER_CARRIED`'s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters5 {
    pub outcomes: Outcomes,
    pub ipv4_packets: u64,
    pub ipv6_packets: u64,
    pub unadmitted: Outcomes,
    pub not_ip_packets: u64,
    pub not_ip_bytes: u64,
    pub pppoe_other_packets: u64,
    pub pppoe_other_bytes: u64,
    pub vlan_too_deep_packets: u64,
    pub vlan_too_deep_bytes: u64,
    pub malformed_packets: u64,
    pub malformed_bytes: u64,
    pub new_sources: u64,
    pub cas_exhausted: u64,
    pub cas_won: [u64; CAS_TRIES],
    pub untracked_packets: u64,
    pub unconfigured_packets: u64,
    pub shaped_packets: u64,
    pub shaped_bytes: u64,
    pub ce_marked_packets: u64,
    /// Not a count: the program's scratch space for a shaped packet's departure time.
    pub departure_ticks: u64,
    pub shape_delay: [u64; DELAY_BUCKETS],
}

const _: () = assert!(size_of::<Counters5>() == 432);

// SAFETY: #[repr(C)], made only of integers, with no implicit padding (size asserted
// above), so every bit pattern is a valid value.
unsafe impl aya::Pod for Counters5 {}
unsafe impl aya::Pod for Config5 {}
unsafe impl aya::Pod for PolicyStats5 {}
unsafe impl aya::Pod for Policy5 {}

impl Config5 {
    /// Today's settings entry: the traces (new in layout 6) get a seed of their own, the
    /// admission its first-sighting allowance.
    pub fn current(&self) -> Config {
        Config {
            limit: self.limit,
            rate_bps: self.rate_bps,
            burst_bytes: self.burst_bytes,
            xdp_mode: self.xdp_mode,
            active: self.active,
            key_by: self.key_by,
            prefix_v4: self.prefix_v4,
            prefix_v6: self.prefix_v6,
            mask_v4: self.mask_v4,
            mask_v6: self.mask_v6,
            mode: self.mode,
            policy_gen: self.policy_gen,
            admission: self.admission.current(),
            prefixes_v4: self.prefixes_v4,
            prefixes_v6: self.prefixes_v6,
            shape: self.shape,
            trace_seed: crate::system::random_seed(),
            meter2: Default::default(),
        }
    }
}

impl PolicyStats5 {
    /// Every count as it was; there were no traces to count.
    pub fn current(&self) -> PolicyStats {
        PolicyStats {
            outcomes: self.outcomes,
            aggregate_refused_packets: self.aggregate_refused_packets,
            aggregate_refused_bytes: self.aggregate_refused_bytes,
            unadmitted: self.unadmitted,
            new_sources: self.new_sources,
            sightings: Sightings::default(),
            meter2: Default::default(),
        }
    }
}

impl Counters5 {
    /// Every count as it was; the scratch field was never a count.
    pub fn current(&self) -> Counters {
        Counters {
            outcomes: self.outcomes,
            ipv4_packets: self.ipv4_packets,
            ipv6_packets: self.ipv6_packets,
            unadmitted: self.unadmitted,
            not_ip_packets: self.not_ip_packets,
            not_ip_bytes: self.not_ip_bytes,
            pppoe_other_packets: self.pppoe_other_packets,
            pppoe_other_bytes: self.pppoe_other_bytes,
            vlan_too_deep_packets: self.vlan_too_deep_packets,
            vlan_too_deep_bytes: self.vlan_too_deep_bytes,
            malformed_packets: self.malformed_packets,
            malformed_bytes: self.malformed_bytes,
            new_sources: self.new_sources,
            cas_exhausted: self.cas_exhausted,
            cas_won: self.cas_won,
            untracked_packets: self.untracked_packets,
            unconfigured_packets: self.unconfigured_packets,
            shaped_packets: self.shaped_packets,
            shaped_bytes: self.shaped_bytes,
            ce_marked_packets: self.ce_marked_packets,
            shape_delay: self.shape_delay,
            // Layout 5 kept no sum of the delays.
            shape_delay_ns: 0,
            sightings: Sightings::default(),
            meter2: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frozen types are the bytes dd8a0a0 wrote (its own size and offset assertions).
    #[test]
    fn frozen_offsets() {
        assert_eq!(std::mem::offset_of!(Config5, shape), 136);
        assert_eq!(
            std::mem::offset_of!(PolicyStats5, aggregate_refused_packets),
            48
        );
        assert_eq!(std::mem::offset_of!(PolicyStats5, unadmitted), 64);
        assert_eq!(std::mem::offset_of!(PolicyStats5, new_sources), 112);
        assert_eq!(std::mem::offset_of!(Counters5, ipv4_packets), 48);
        assert_eq!(std::mem::offset_of!(Counters5, unadmitted), 64);
        assert_eq!(std::mem::offset_of!(Counters5, not_ip_packets), 112);
        assert_eq!(std::mem::offset_of!(Counters5, cas_won), 192);
        assert_eq!(std::mem::offset_of!(Counters5, unconfigured_packets), 232);
        assert_eq!(std::mem::offset_of!(Counters5, shaped_packets), 240);
        assert_eq!(std::mem::offset_of!(Counters5, shape_delay), 272);
    }

    #[test]
    fn layout_5_carries_every_count() {
        let mut shape_delay = [0; DELAY_BUCKETS];
        shape_delay[3] = 7;
        let old = Counters5 {
            new_sources: 5,
            cas_won: [1, 2, 3, 4],
            unconfigured_packets: 9,
            shaped_packets: 11,
            ce_marked_packets: 2,
            departure_ticks: 123_456,
            shape_delay,
            ..Counters5::default()
        };
        let now = old.current();
        assert_eq!(
            (now.new_sources, now.cas_won, now.unconfigured_packets),
            (5, [1, 2, 3, 4], 9)
        );
        assert_eq!((now.shaped_packets, now.ce_marked_packets), (11, 2));
        assert_eq!(now.shape_delay, shape_delay);
        let old = PolicyStats5 {
            aggregate_refused_bytes: 3,
            new_sources: 4,
            ..PolicyStats5::default()
        };
        let now = old.current();
        assert_eq!((now.aggregate_refused_bytes, now.new_sources), (3, 4));
    }

    /// A policy keeps every field, its admission carried as [`Admission5::current`] does.
    #[test]
    fn a_layout_5_policy_carries_every_field() {
        let old = Policy5 {
            limit: Limit::new(4_000_000, 65_536).unwrap(),
            aggregate: Limit::new(10_000_000, 131_072).unwrap(),
            rate_bps: 4_000_000,
            burst_bytes: 65_536,
            aggregate_rate_bps: 10_000_000,
            aggregate_burst_bytes: 131_072,
            action: 1,
            mode: 1,
            in_use: 1,
            family: 6,
            prefix_len: 32,
            _pad: 0,
            addr: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            admission: Admission5 {
                limit: Limit::new(8 * 100, 500).unwrap(),
                new_sources: 100,
                new_sources_burst: 500,
            },
        };
        let now = old.current();
        assert_eq!(
            (now.limit, now.aggregate, now.rate_bps, now.burst_bytes),
            (old.limit, old.aggregate, 4_000_000, 65_536)
        );
        assert_eq!(
            (now.aggregate_rate_bps, now.aggregate_burst_bytes),
            (10_000_000, 131_072)
        );
        assert_eq!(
            (now.action, now.mode, now.in_use, now.family, now.prefix_len),
            (1, 1, 1, 6, 32)
        );
        assert_eq!(now.addr, old.addr);
        assert_eq!(now.admission, Admission::new(100, 500).unwrap());
    }

    /// An admission is given today's first-sighting allowance; one today's rules refuse
    /// (a burst lasting longer than a limit may now) is carried as it was, not lost.
    #[test]
    fn layout_5_admissions_carry_their_limits() {
        let old = Admission5 {
            limit: Limit::new(8 * 100, 500).unwrap(),
            new_sources: 100,
            new_sources_burst: 500,
        };
        assert_eq!(old.current(), Admission::new(100, 500).unwrap());
        let refused = Admission5 {
            limit: Limit::new(8, 1).unwrap(),
            new_sources: 1,
            new_sources_burst: u64::MAX,
        };
        assert!(Admission::new(1, u64::MAX).is_err());
        assert_eq!(
            refused.current(),
            Admission {
                limit: refused.limit,
                new_sources: 1,
                new_sources_burst: u64::MAX,
                first: Limit::default(),
            }
        );
    }

    #[test]
    fn layout_5_carries_every_setting_and_seeds_the_traces() {
        let old = Config5 {
            rate_bps: 1_000_000,
            policy_gen: 7,
            prefixes_v6: 3,
            shape: Shape {
                ecn_threshold_ns: 1,
                horizon_ns: 2,
            },
            ..Config5::default()
        };
        let (a, b) = (old.current(), old.current());
        assert_eq!((a.rate_bps, a.policy_gen, a.prefixes_v6), (1_000_000, 7, 3));
        assert_eq!(a.shape, old.shape);
        assert_ne!(a.trace_seed, b.trace_seed, "each attachment its own seed");
    }
}
