//! Layouts 2 and 3 (shaper as of commit f137e58, before the counters counted the
//! compare-and-swap's wins): the counters' value, frozen as those builds wrote it, and what
//! it becomes now. Every other value type of layout 3 is today's.
//!
//! Every field of today's type is spelled out (no `..Default::default()`), so a field
//! added later fails to compile here until someone says what layout 3 carries into it.

use shaper_common::{
    maps::{CAS_TRIES, Counters, Outcomes, Sightings},
    shape::DELAY_BUCKETS,
};

/// `SHAPER_COUNTERS`' value (208 bytes, per CPU), and `SHAPER_CARRIED`'s in layout 3.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters3 {
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
    pub untracked_packets: u64,
    pub unconfigured_packets: u64,
}

const _: () = assert!(size_of::<Counters3>() == 208);

// SAFETY: #[repr(C)], made only of integers, with no implicit padding (size asserted
// above), so every bit pattern is a valid value.
unsafe impl aya::Pod for Counters3 {}

impl Counters3 {
    /// Every count as it was; layout 3 did not count the compare-and-swap's wins.
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

    /// The frozen type is the bytes f137e58 wrote (its own size and offset assertions).
    #[test]
    fn frozen_offsets() {
        assert_eq!(std::mem::offset_of!(Counters3, ipv4_packets), 48);
        assert_eq!(std::mem::offset_of!(Counters3, unadmitted), 64);
        assert_eq!(std::mem::offset_of!(Counters3, not_ip_packets), 112);
        assert_eq!(std::mem::offset_of!(Counters3, cas_exhausted), 184);
        assert_eq!(std::mem::offset_of!(Counters3, unconfigured_packets), 200);
    }

    #[test]
    fn layout_3_carries_every_count() {
        let old = Counters3 {
            outcomes: Outcomes {
                passed_bytes: 7,
                ..Outcomes::default()
            },
            unadmitted: Outcomes {
                dropped_packets: 2,
                ..Outcomes::default()
            },
            malformed_bytes: 9,
            cas_exhausted: 3,
            untracked_packets: 5,
            unconfigured_packets: 4,
            ..Counters3::default()
        };
        let now = old.current();
        assert_eq!(now.outcomes.passed_bytes, 7);
        assert_eq!(now.unadmitted.dropped_packets, 2);
        assert_eq!(
            (
                now.malformed_bytes,
                now.cas_exhausted,
                now.untracked_packets,
                now.unconfigured_packets
            ),
            (9, 3, 5, 4)
        );
        assert_eq!(now.cas_won, [0; CAS_TRIES]);
    }
}
