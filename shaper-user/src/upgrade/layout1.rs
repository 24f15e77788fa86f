//! Layout 1 (shaper as of commit ddbba43, before new-source admission): the value types
//! that changed after it, frozen as that build wrote them, and what each becomes now.
//!
//! Every field of today's type is spelled out (no `..Default::default()`), so a field
//! added later fails to compile here until someone says what layout 1 carries into it.

use shaper_common::{
    gcra::Limit,
    maps::{
        Admission, CAS_TRIES, Config, Counters, Outcomes, Policy, PolicyStats, Shape, Sightings,
    },
    shape::DELAY_BUCKETS,
};

/// `SHAPER_CONFIG`'s value (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config1 {
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
}

const _: () = assert!(size_of::<Config1>() == 88);

/// `SHAPER_POLICIES`' value (120 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy1 {
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
}

const _: () = assert!(size_of::<Policy1>() == 120);

/// `SHAPER_PSTATS`' value (64 bytes, per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats1 {
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
    pub would_drop_packets: u64,
    pub would_drop_bytes: u64,
    pub aggregate_refused_packets: u64,
    pub aggregate_refused_bytes: u64,
}

const _: () = assert!(size_of::<PolicyStats1>() == 64);

/// `SHAPER_COUNTERS`' value (160 bytes, per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters1 {
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
    pub would_drop_packets: u64,
    pub would_drop_bytes: u64,
    pub ipv4_packets: u64,
    pub ipv6_packets: u64,
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
    pub untracked_packets: u64,
    pub unconfigured_packets: u64,
}

const _: () = assert!(size_of::<Counters1>() == 160);

// SAFETY: each type is #[repr(C)], made only of integers, with no implicit padding (sizes
// asserted above), so every bit pattern is a valid value.
unsafe impl aya::Pod for Config1 {}
unsafe impl aya::Pod for Policy1 {}
unsafe impl aya::Pod for PolicyStats1 {}
unsafe impl aya::Pod for Counters1 {}

impl Config1 {
    /// Today's settings entry. Layout 1 had no new-source admission: every new key got a
    /// cell, which is what an unlimited admission does. `prefixes` are the numbers of IPv4
    /// and IPv6 prefix policies, which the entry now records.
    pub fn current(&self, prefixes: (u32, u32)) -> Config {
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
            admission: Admission::default(),
            prefixes_v4: prefixes.0,
            prefixes_v6: prefixes.1,
            // Layout 1 did not shape: the defaults, unused until shape mode is asked for.
            shape: Shape::default_settings(),
            // Layouts before 6 had no traces: the new program's are seeded afresh.
            trace_seed: crate::system::random_seed(),
            meter2: Default::default(),
        }
    }
}

impl Policy1 {
    /// Today's policy: without an admission of its own, so it shares the interface's
    /// (unlimited, as everything was in layout 1).
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
            admission: Admission::default(),
            meter2: Default::default(),
        }
    }
}

impl PolicyStats1 {
    /// Layout 1 refused no key a cell: nothing was unadmitted, and it did not count new
    /// keys per policy.
    pub fn current(&self) -> PolicyStats {
        PolicyStats {
            outcomes: Outcomes {
                passed_packets: self.passed_packets,
                passed_bytes: self.passed_bytes,
                dropped_packets: self.dropped_packets,
                dropped_bytes: self.dropped_bytes,
                would_drop_packets: self.would_drop_packets,
                would_drop_bytes: self.would_drop_bytes,
            },
            aggregate_refused_packets: self.aggregate_refused_packets,
            aggregate_refused_bytes: self.aggregate_refused_bytes,
            unadmitted: Outcomes::default(),
            new_sources: 0,
            sightings: Sightings::default(),
            meter2: Default::default(),
        }
    }
}

impl Counters1 {
    /// Layout 1 refused no key a cell: nothing was unadmitted.
    pub fn current(&self) -> Counters {
        Counters {
            outcomes: Outcomes {
                passed_packets: self.passed_packets,
                passed_bytes: self.passed_bytes,
                dropped_packets: self.dropped_packets,
                dropped_bytes: self.dropped_bytes,
                would_drop_packets: self.would_drop_packets,
                would_drop_bytes: self.would_drop_bytes,
            },
            ipv4_packets: self.ipv4_packets,
            ipv6_packets: self.ipv6_packets,
            unadmitted: Outcomes::default(),
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
            cas_won: [0; CAS_TRIES],
            untracked_packets: self.untracked_packets,
            unconfigured_packets: self.unconfigured_packets,
            // Nothing was shaped before layout 5.
            shaped_packets: 0,
            shaped_bytes: 0,
            ce_marked_packets: 0,
            shape_delay: [0; DELAY_BUCKETS],
            shape_delay_ns: 0,
            sightings: Sightings::default(),
            meter2: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frozen types are the bytes ddbba43 wrote: field offsets as its `#[repr(C)]`
    /// structs put them (checked against the commit's own definitions by hand, and
    /// end to end by the lab's upgrade test with a build of that commit).
    #[test]
    fn frozen_offsets() {
        assert_eq!(std::mem::offset_of!(Config1, rate_bps), 24);
        assert_eq!(std::mem::offset_of!(Config1, xdp_mode), 40);
        assert_eq!(std::mem::offset_of!(Config1, mask_v6), 64);
        assert_eq!(std::mem::offset_of!(Config1, policy_gen), 84);
        assert_eq!(std::mem::offset_of!(Policy1, action), 80);
        assert_eq!(std::mem::offset_of!(Policy1, addr), 104);
        assert_eq!(std::mem::offset_of!(Counters1, not_ip_packets), 64);
        assert_eq!(std::mem::offset_of!(Counters1, unconfigured_packets), 152);
    }

    /// A policy keeps every field, and shares the interface's admission (layout 1 had
    /// none of its own).
    #[test]
    fn a_layout_1_policy_carries_every_field() {
        let old = Policy1 {
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
        assert_eq!(now.admission, Admission::default());
    }

    #[test]
    fn layout_1_carries_into_todays_types() {
        let old = Config1 {
            rate_bps: 8_000_000,
            burst_bytes: 65_536,
            active: 1,
            prefix_v4: 24,
            mask_v4: 0x00ff_ffff,
            policy_gen: 7,
            ..Config1::default()
        };
        let now = old.current((2, 1));
        assert_eq!((now.rate_bps, now.burst_bytes), (8_000_000, 65_536));
        assert_eq!(
            (now.prefix_v4, now.mask_v4, now.policy_gen),
            (24, 0x00ff_ffff, 7)
        );
        assert_eq!((now.prefixes_v4, now.prefixes_v6), (2, 1));
        assert!(!now.admission.limited(), "layout 1 admitted every new key");

        let stats = PolicyStats1 {
            passed_bytes: 5,
            aggregate_refused_packets: 3,
            ..PolicyStats1::default()
        }
        .current();
        assert_eq!(
            (stats.outcomes.passed_bytes, stats.aggregate_refused_packets),
            (5, 3)
        );
        assert_eq!(stats.unadmitted, Outcomes::default());

        let counters = Counters1 {
            malformed_bytes: 9,
            unconfigured_packets: 4,
            ..Counters1::default()
        }
        .current();
        assert_eq!(
            (counters.malformed_bytes, counters.unconfigured_packets),
            (9, 4)
        );
    }
}
