//! Layout 4 (shaper as of commit c17ddaa, before shaping): the settings and counters'
//! values, frozen as those builds wrote them, and what they become now. Every other value
//! type of layout 4 is today's.
//!
//! Every field of today's types is spelled out (no `..Default::default()`), so a field
//! added later fails to compile here until someone says what layout 4 carries into it.

use super::layout5::Admission5;
use shaper_common::{
    gcra::Limit,
    maps::{CAS_TRIES, Config, Counters, Outcomes, Shape, Sightings},
    shape::DELAY_BUCKETS,
};

/// `SHAPER_CONFIG`'s value (136 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config4 {
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
}

const _: () = assert!(size_of::<Config4>() == 136);

/// `SHAPER_COUNTERS`' value (240 bytes, per CPU), and `SHAPER_CARRIED`'s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters4 {
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
}

const _: () = assert!(size_of::<Counters4>() == 240);

// SAFETY: #[repr(C)], made only of integers, with no implicit padding (sizes asserted
// above), so every bit pattern is a valid value.
unsafe impl aya::Pod for Config4 {}
unsafe impl aya::Pod for Counters4 {}

impl Config4 {
    /// Today's settings entry: layout 4 did not shape (its modes were enforce and
    /// monitor), so the shaping settings are the defaults, unused until asked for.
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
            shape: Shape::default_settings(),
            // Layouts before 6 had no traces: the new program's are seeded afresh.
            trace_seed: crate::system::random_seed(),
            meter2: Default::default(),
        }
    }
}

impl Counters4 {
    /// Every count as it was; nothing was shaped before layout 5.
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

    /// The frozen types are the bytes c17ddaa wrote (its own size and offset assertions).
    #[test]
    fn frozen_offsets() {
        assert_eq!(std::mem::offset_of!(Config4, xdp_mode), 40);
        assert_eq!(std::mem::offset_of!(Config4, mode), 80);
        assert_eq!(std::mem::offset_of!(Config4, admission), 88);
        assert_eq!(std::mem::offset_of!(Config4, prefixes_v6), 132);
        assert_eq!(std::mem::offset_of!(Counters4, ipv4_packets), 48);
        assert_eq!(std::mem::offset_of!(Counters4, unadmitted), 64);
        assert_eq!(std::mem::offset_of!(Counters4, not_ip_packets), 112);
        assert_eq!(std::mem::offset_of!(Counters4, cas_won), 192);
        assert_eq!(std::mem::offset_of!(Counters4, unconfigured_packets), 232);
    }

    #[test]
    fn layout_4_carries_every_setting_and_count() {
        let old = Config4 {
            rate_bps: 1_000_000,
            burst_bytes: 65_536,
            xdp_mode: 3,
            active: 1,
            key_by: 1,
            mode: 1,
            policy_gen: 7,
            prefixes_v4: 2,
            prefixes_v6: 3,
            ..Config4::default()
        };
        let now = old.current();
        assert_eq!(
            (
                now.rate_bps,
                now.xdp_mode,
                now.key_by,
                now.mode,
                now.policy_gen
            ),
            (1_000_000, 3, 1, 1, 7)
        );
        assert_eq!((now.prefixes_v4, now.prefixes_v6), (2, 3));
        assert_eq!(now.shape, Shape::default_settings());
        let old = Counters4 {
            new_sources: 5,
            cas_won: [1, 2, 3, 4],
            unconfigured_packets: 9,
            ..Counters4::default()
        };
        let now = old.current();
        assert_eq!(
            (now.new_sources, now.cas_won, now.unconfigured_packets),
            (5, [1, 2, 3, 4], 9)
        );
        assert_eq!(now.shaped_packets, 0);
    }
}
