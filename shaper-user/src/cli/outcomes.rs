//! What became of frames (passed, dropped, would drop; packets and bytes) as `stats -j` and
//! `policy list -j` show them, per source, per policy and for the interface: one list of
//! the names, flattened into each row, and prefixed `unadmitted_` for the frames of keys
//! refused a cell.

use serde::{Serialize, Serializer, ser::SerializeMap as _};
use shaper_common::maps::{Outcomes, Sightings};

/// [`Outcomes`] as the JSON fields `PREFIX{passed,dropped,would_drop}_{packets,bytes}`
/// (flatten it into a row).
#[derive(Debug)]
pub struct OutcomeFields {
    prefix: &'static str,
    pub counts: Outcomes,
}

impl OutcomeFields {
    /// `passed_packets`, `passed_bytes`, ...
    pub fn new(counts: Outcomes) -> Self {
        Self { prefix: "", counts }
    }

    /// The names and values, in the order they are printed.
    fn fields(&self) -> [(&'static str, u64); 6] {
        let o = &self.counts;
        [
            ("passed_packets", o.passed_packets),
            ("passed_bytes", o.passed_bytes),
            ("dropped_packets", o.dropped_packets),
            ("dropped_bytes", o.dropped_bytes),
            // Monitor mode: passed, but enforcement would have dropped them.
            ("would_drop_packets", o.would_drop_packets),
            ("would_drop_bytes", o.would_drop_bytes),
        ]
    }
}

impl Serialize for OutcomeFields {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(6))?;
        for (name, value) in self.fields() {
            map.serialize_entry(&format_args!("{}{name}", self.prefix), &value)?;
        }
        map.end()
    }
}

/// Frames of keys refused a cell by new-source admission, metered together; not in the
/// passed, dropped and would-drop counts beside them. `unadmitted_packets`,
/// `unadmitted_bytes` (all of them), then `unadmitted_passed_packets`, ...
#[derive(Debug, Serialize)]
pub struct Unadmitted {
    pub unadmitted_packets: u64,
    pub unadmitted_bytes: u64,
    #[serde(flatten)]
    pub outcomes: OutcomeFields,
}

impl From<&Outcomes> for Unadmitted {
    fn from(o: &Outcomes) -> Self {
        Self {
            unadmitted_packets: o.packets(),
            unadmitted_bytes: o.bytes(),
            outcomes: OutcomeFields {
                prefix: "unadmitted_",
                counts: *o,
            },
        }
    }
}

/// What new-source admission's doorkeeper saw (`shaper_common::maps::Sightings`): keys
/// whose first frame left a trace, keys given a cell on their second sighting, and on
/// their first (within the first-sighting allowance), and first sightings whose trace took
/// the place of another key's live one.
#[derive(Debug, Serialize)]
pub struct SightingFields {
    pub seen_once: u64,
    pub admitted_on_second_sighting: u64,
    pub admitted_on_first_sighting: u64,
    pub traces_displaced: u64,
}

impl From<&Sightings> for SightingFields {
    fn from(s: &Sightings) -> Self {
        Self {
            seen_once: s.first,
            admitted_on_second_sighting: s.admitted,
            admitted_on_first_sighting: s.first_admitted,
            traces_displaced: s.displaced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_unit_and_prefix() {
        let o = Outcomes {
            passed_packets: 1,
            passed_bytes: 2,
            dropped_packets: 3,
            dropped_bytes: 4,
            would_drop_packets: 5,
            would_drop_bytes: 6,
        };
        assert_eq!(
            serde_json::to_string(&OutcomeFields::new(o)).unwrap(),
            r#"{"passed_packets":1,"passed_bytes":2,"dropped_packets":3,"dropped_bytes":4,"would_drop_packets":5,"would_drop_bytes":6}"#
        );
        assert_eq!(
            serde_json::to_string(&Unadmitted::from(&o)).unwrap(),
            r#"{"unadmitted_packets":9,"unadmitted_bytes":12,"unadmitted_passed_packets":1,"unadmitted_passed_bytes":2,"unadmitted_dropped_packets":3,"unadmitted_dropped_bytes":4,"unadmitted_would_drop_packets":5,"unadmitted_would_drop_bytes":6}"#
        );
    }
}
