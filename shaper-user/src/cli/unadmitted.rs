//! The counters of unadmitted frames as `stats -j` and `policy list -j` show them (one
//! copy for both; flattened into their rows).

use serde::Serialize;
use shaper_common::maps::Outcomes;

/// Frames of keys refused a cell by new-source admission, metered together; not in the
/// passed, dropped and would-drop counts beside them.
#[derive(Debug, Serialize)]
pub struct Unadmitted {
    pub unadmitted_packets: u64,
    pub unadmitted_bytes: u64,
    pub unadmitted_passed_packets: u64,
    pub unadmitted_passed_bytes: u64,
    pub unadmitted_dropped_packets: u64,
    pub unadmitted_dropped_bytes: u64,
    pub unadmitted_would_drop_packets: u64,
    pub unadmitted_would_drop_bytes: u64,
}

impl From<&Outcomes> for Unadmitted {
    fn from(o: &Outcomes) -> Self {
        Self {
            unadmitted_packets: o.packets(),
            unadmitted_bytes: o.bytes(),
            unadmitted_passed_packets: o.passed_packets,
            unadmitted_passed_bytes: o.passed_bytes,
            unadmitted_dropped_packets: o.dropped_packets,
            unadmitted_dropped_bytes: o.dropped_bytes,
            unadmitted_would_drop_packets: o.would_drop_packets,
            unadmitted_would_drop_bytes: o.would_drop_bytes,
        }
    }
}
