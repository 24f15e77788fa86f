//! LibreQoS's circuits ([`crate::libreqos`]) as subscribers of one attachment: the
//! download rates for the egress one (keyed by destination), the upload rates for the
//! ingress one. Every circuit is checked here, an error naming its line and column, before
//! anything is applied.
//!
//! The plan: Max Mbps as the subscriber's rate, or with [`Plan::committed_from_min`] Min
//! as the committed rate and Max − Min as the excess rate (marked with
//! [`Plan::excess_dscp`], not dropped). The file has no burst: each rate's burst lasts
//! [`Plan::burst_ns`] at that rate, at least [`MIN_BURST_BYTES`]. Each address may take
//! the whole plan (committed and excess), as `subscriber set` without per-address flags.
//! A name longer than a subscriber's is cut to its first 24 bytes (at a character).

use shaper_common::{
    config::{Meter2Limits, PolicyLimits},
    maps::{MODE_ENFORCE, SUBSCRIBER_NAME_BYTES},
};

use crate::{
    libreqos::{Circuit, ImportError, Rates},
    pins::Direction,
    subscriber::{
        SubscriberSpec,
        plan::{PlanParts, burst_for},
    },
};

pub use crate::subscriber::plan::MIN_BURST_BYTES;

/// How circuits become plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Egress: the download rates; ingress: the upload rates.
    pub direction: Direction,
    /// Min Mbps as the committed rate, Max − Min as the excess rate.
    pub committed_from_min: bool,
    /// How long each burst lasts at its rate, in nanoseconds.
    pub burst_ns: u64,
    /// The excess rate's mark.
    pub excess_dscp: u8,
}

/// The first `most` bytes of `s`, cut at a character.
fn cut(s: &str, most: usize) -> String {
    let mut end = s.len().min(most);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Circuit `c`'s subscriber under `plan`; an error names the circuit's first line.
pub fn subscriber(c: Circuit, plan: &Plan) -> Result<SubscriberSpec, ImportError> {
    let (rates, column) = match plan.direction {
        Direction::Egress => (c.download, "Download Max Mbps"),
        Direction::Ingress => (c.upload, "Upload Max Mbps"),
    };
    let plan = limits(rates, plan);
    let spec = SubscriberSpec {
        name: cut(c.name.as_deref().unwrap_or(""), SUBSCRIBER_NAME_BYTES),
        id: c.id,
        prefixes: c.prefixes,
        plan,
    };
    // The widest keys: a prefix too long for the attachment's is the change's to refuse.
    spec.check((32, 128)).map_err(|e| {
        let column = match e {
            crate::subscriber::SubscriberError::Id(_) => "Circuit ID",
            crate::subscriber::SubscriberError::Name(_) => "Circuit Name",
            _ => column,
        };
        ImportError::Cell {
            line: c.line,
            column: column.to_owned(),
            reason: e.to_string(),
        }
    })?;
    Ok(spec)
}

/// Every circuit's subscriber, in file order.
pub fn subscribers(
    circuits: Vec<Circuit>,
    plan: &Plan,
) -> Result<Vec<SubscriberSpec>, ImportError> {
    circuits.into_iter().map(|c| subscriber(c, plan)).collect()
}

/// The plan of a direction's rates.
fn limits(rates: Rates, plan: &Plan) -> PolicyLimits {
    let (committed, excess) = match plan.committed_from_min {
        true => (rates.min_bps, rates.excess_bps()),
        false => (rates.max_bps, 0),
    };
    let excess = match excess {
        0 => Meter2Limits::default(),
        _ => Meter2Limits {
            excess_rate_bps: excess,
            excess_burst_bytes: burst_for(excess, plan.burst_ns),
            excess_dscp: plan.excess_dscp,
            ..Meter2Limits::default()
        },
    };
    PlanParts {
        rate_bps: committed,
        burst_bytes: burst_for(committed, plan.burst_ns),
        per_address: None,
        excess,
        mode: MODE_ENFORCE,
    }
    .limits()
}

#[cfg(test)]
mod tests {
    use ipnet::IpNet;

    use super::*;

    fn circuit(min: u64, max: u64) -> Circuit {
        let rates = Rates {
            min_bps: min,
            max_bps: max,
        };
        Circuit {
            id: "c1".into(),
            name: Some("Émilie Dupont-Lefèvre, 12 rue".into()),
            prefixes: vec!["100.64.0.1/32".parse::<IpNet>().unwrap()],
            download: rates,
            upload: Rates {
                min_bps: min / 2,
                max_bps: max / 2,
            },
            line: 3,
        }
    }

    const PLAN: Plan = Plan {
        direction: Direction::Egress,
        committed_from_min: false,
        burst_ns: 20_000_000,
        excess_dscp: 1,
    };

    #[test]
    fn max_is_the_rate_and_min_is_ignored_by_default() {
        let s = subscriber(circuit(1_000_000, 100_000_000), &PLAN).unwrap();
        assert_eq!(s.plan.aggregate_rate_bps, 100_000_000);
        // 20 ms at 100 Mbit/s.
        assert_eq!(s.plan.aggregate_burst_bytes, 250_000);
        assert_eq!(s.plan.meter2, Meter2Limits::default());
        let up = subscriber(
            circuit(1_000_000, 100_000_000),
            &Plan {
                direction: Direction::Ingress,
                ..PLAN
            },
        )
        .unwrap();
        assert_eq!(up.plan.aggregate_rate_bps, 50_000_000);
    }

    #[test]
    fn committed_from_min_marks_the_rest_up_to_max() {
        let plan = Plan {
            committed_from_min: true,
            ..PLAN
        };
        let s = subscriber(circuit(20_000_000, 100_000_000), &plan).unwrap();
        assert_eq!(s.plan.aggregate_rate_bps, 20_000_000);
        assert_eq!(s.plan.meter2.excess_rate_bps, 80_000_000);
        assert_eq!(s.plan.meter2.excess_dscp, 1);
        assert_eq!(s.plan.rate_bps, 100_000_000);
        // Min equal to Max: no excess.
        let s = subscriber(circuit(50_000_000, 50_000_000), &plan).unwrap();
        assert_eq!(s.plan.meter2, Meter2Limits::default());
    }

    #[test]
    fn a_small_rate_gets_the_floor_and_a_long_name_is_cut_at_a_character() {
        let s = subscriber(circuit(100_000, 200_000), &PLAN).unwrap();
        assert_eq!(s.plan.aggregate_burst_bytes, MIN_BURST_BYTES);
        assert!(s.name.len() <= SUBSCRIBER_NAME_BYTES);
        assert!("Émilie Dupont-Lefèvre, 12 rue".starts_with(&s.name));
    }

    #[test]
    fn an_id_a_subscriber_cannot_take_names_its_line_and_column() {
        let mut c = circuit(1_000_000, 2_000_000);
        c.id = "circuit 7".into();
        let e = subscriber(c, &PLAN).unwrap_err().to_string();
        assert!(
            e.starts_with("line 3, column \"Circuit ID\": invalid subscriber id 'circuit 7'"),
            "{e}"
        );
    }
}
