//! The counters and gauges of every attachment in a network namespace, in the
//! Prometheus/OpenMetrics text format (the prometheus-client crate's encoder), read from
//! the pins at each scrape. Labels name the interface, the direction (`ingress` or `egress`)
//! and, for per-policy counters, the policy (`default` or its prefix): never an address,
//! so the series are bounded by the interfaces and their policies.

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use shaper_common::{
    maps::{DEFAULT_SLOT, MODE_MONITOR, MODE_SHAPE, Outcomes},
    shape::bucket_bounds_ns,
};

use crate::{
    maps::{self, PinnedMapError},
    pins::{self, Attachment},
    policy::{Mode, PolicyError, PolicyTable},
};

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot list the attachments: {0}")]
    List(std::io::Error),
    #[error("{iface}: {error}")]
    Map {
        iface: String,
        error: Box<PinnedMapError>,
    },
    #[error("{iface}: {error}")]
    Policy {
        iface: String,
        error: Box<PolicyError>,
    },
    #[error("cannot encode the metrics")]
    Encode,
}

type Labels = Vec<(String, String)>;
type GaugeF64 = Gauge<f64, std::sync::atomic::AtomicU64>;

/// One metric family per name, registered once.
struct Families {
    counters: Vec<(&'static str, &'static str, Family<Labels, Counter>)>,
    gauges: Vec<(&'static str, &'static str, Family<Labels, GaugeF64>)>,
}

impl Families {
    fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, value: u64) {
        let family = match self.counters.iter().position(|(n, _, _)| *n == name) {
            Some(i) => &self.counters[i].2,
            None => {
                self.counters.push((name, help, Family::default()));
                &self.counters.last().expect("just pushed").2
            }
        };
        family.get_or_create(&labels).inc_by(value);
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, value: f64) {
        let family = match self.gauges.iter().position(|(n, _, _)| *n == name) {
            Some(i) => &self.gauges[i].2,
            None => {
                self.gauges.push((name, help, Family::default()));
                &self.gauges.last().expect("just pushed").2
            }
        };
        family.get_or_create(&labels).set(value);
    }

    /// The six outcome counters of `o`, named `{prefix}passed_bytes` and so on.
    fn outcomes(&mut self, names: &OutcomeNames, labels: &Labels, o: &Outcomes) {
        for (name, help, value) in [
            (names.0[0], names.1[0], o.passed_packets),
            (names.0[1], names.1[1], o.passed_bytes),
            (names.0[2], names.1[2], o.dropped_packets),
            (names.0[3], names.1[3], o.dropped_bytes),
            (names.0[4], names.1[4], o.would_drop_packets),
            (names.0[5], names.1[5], o.would_drop_bytes),
        ] {
            self.counter(name, help, labels.clone(), value);
        }
    }
}

/// Names and help of the six outcome counters of one kind.
type OutcomeNames = ([&'static str; 6], [&'static str; 6]);

const INTERFACE: OutcomeNames = (
    [
        "shaper_passed_packets",
        "shaper_passed_bytes",
        "shaper_dropped_packets",
        "shaper_dropped_bytes",
        "shaper_would_drop_packets",
        "shaper_would_drop_bytes",
    ],
    [
        "IP frames of keys with a cell of their own (or untracked) passed within the limit",
        "Bytes of IP frames of keys with a cell of their own (or untracked) passed within the limit",
        "IP frames dropped: over the limit, or blocked",
        "Bytes of IP frames dropped: over the limit, or blocked",
        "IP frames passed in monitor mode that enforcement would have dropped",
        "Bytes of IP frames passed in monitor mode that enforcement would have dropped",
    ],
);

const UNADMITTED: OutcomeNames = (
    [
        "shaper_unadmitted_passed_packets",
        "shaper_unadmitted_passed_bytes",
        "shaper_unadmitted_dropped_packets",
        "shaper_unadmitted_dropped_bytes",
        "shaper_unadmitted_would_drop_packets",
        "shaper_unadmitted_would_drop_bytes",
    ],
    [
        "Frames of keys refused a cell (new-source admission) that their shared bucket passed",
        "Bytes of frames of keys refused a cell (new-source admission) that their shared bucket passed",
        "Frames of keys refused a cell that their shared bucket dropped",
        "Bytes of frames of keys refused a cell that their shared bucket dropped",
        "Frames of keys refused a cell that their shared bucket would drop (monitor mode)",
        "Bytes of frames of keys refused a cell that their shared bucket would drop (monitor mode)",
    ],
);

const POLICY: OutcomeNames = (
    [
        "shaper_policy_passed_packets",
        "shaper_policy_passed_bytes",
        "shaper_policy_dropped_packets",
        "shaper_policy_dropped_bytes",
        "shaper_policy_would_drop_packets",
        "shaper_policy_would_drop_bytes",
    ],
    [
        "Frames of a policy's keys with a cell of their own, passed",
        "Bytes of frames of a policy's keys with a cell of their own, passed",
        "Frames of a policy's keys with a cell of their own, dropped",
        "Bytes of frames of a policy's keys with a cell of their own, dropped",
        "Frames of a policy's keys with a cell of their own that would drop (monitor mode)",
        "Bytes of frames of a policy's keys with a cell of their own that would drop (monitor mode)",
    ],
);

const POLICY_UNADMITTED: OutcomeNames = (
    [
        "shaper_policy_unadmitted_passed_packets",
        "shaper_policy_unadmitted_passed_bytes",
        "shaper_policy_unadmitted_dropped_packets",
        "shaper_policy_unadmitted_dropped_bytes",
        "shaper_policy_unadmitted_would_drop_packets",
        "shaper_policy_unadmitted_would_drop_bytes",
    ],
    [
        "Frames of a policy's keys refused a cell, passed by their shared bucket",
        "Bytes of frames of a policy's keys refused a cell, passed by their shared bucket",
        "Frames of a policy's keys refused a cell, dropped by their shared bucket",
        "Bytes of frames of a policy's keys refused a cell, dropped by their shared bucket",
        "Frames of a policy's keys refused a cell that would drop (monitor mode)",
        "Bytes of frames of a policy's keys refused a cell that would drop (monitor mode)",
    ],
);

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Adds one attachment's series.
fn collect(f: &mut Families, at: &Attachment) -> Result<(), MetricsError> {
    let map_err = |error| MetricsError::Map {
        iface: at.iface.clone(),
        error: Box::new(error),
    };
    let base = labels(&[("interface", &at.iface), ("direction", at.direction.name())]);
    let c = maps::read_counters(at).map_err(map_err)?;
    f.outcomes(&INTERFACE, &base, &c.outcomes);
    f.outcomes(&UNADMITTED, &base, &c.unadmitted);
    for (kind, packets, bytes) in c.unmetered() {
        let mut l = base.clone();
        l.push(("kind".to_owned(), kind.to_owned()));
        f.counter(
            "shaper_unmetered_packets",
            "Frames passed untouched, not metered, by kind",
            l.clone(),
            packets,
        );
        f.counter(
            "shaper_unmetered_bytes",
            "Bytes of frames passed untouched, not metered, by kind",
            l,
            bytes,
        );
    }
    for (family, packets) in [("ipv4", c.ipv4_packets), ("ipv6", c.ipv6_packets)] {
        let mut l = base.clone();
        l.push(("family".to_owned(), family.to_owned()));
        f.counter(
            "shaper_metered_packets",
            "Metered frames by address family",
            l,
            packets,
        );
    }
    for (name, help, value) in [
        (
            "shaper_new_sources",
            "Keys given a cell of their own",
            c.new_sources,
        ),
        (
            "shaper_cas_exhausted_packets",
            "Decisions lost to other CPUs after every retry (refused)",
            c.cas_exhausted,
        ),
        (
            "shaper_untracked_packets",
            "Frames passed unmetered: no cell could be made for their key",
            c.untracked_packets,
        ),
        (
            "shaper_unconfigured_packets",
            "Frames passed before any policy was configured",
            c.unconfigured_packets,
        ),
        (
            "shaper_shaped_packets",
            "Shape mode: frames held back until their departure time (also passed)",
            c.shaped_packets,
        ),
        (
            "shaper_shaped_bytes",
            "Shape mode: bytes of frames held back (also passed)",
            c.shaped_bytes,
        ),
        (
            "shaper_ce_marked_packets",
            "Shape mode: frames marked CE, held back longer than the ECN threshold",
            c.ce_marked_packets,
        ),
    ] {
        f.counter(name, help, base.clone(), value);
    }
    // Cumulative, as a Prometheus histogram's buckets are: held back at most `le_seconds`.
    let mut held = 0;
    for (k, n) in c.shape_delay.iter().enumerate() {
        held += n;
        let le = match bucket_bounds_ns(k).1 {
            Some(to) => format!("{}", to as f64 / 1e9),
            None => "+Inf".to_owned(),
        };
        let mut l = base.clone();
        l.push(("le_seconds".to_owned(), le));
        f.counter(
            "shaper_shape_delay_packets",
            "Shape mode: frames held back at most le_seconds (log2 buckets, cumulative)",
            l,
            held,
        );
    }

    let capacity = maps::sources_capacity(at).map_err(map_err)?;
    let v4 = maps::read_sources(at).map_err(map_err)?.len();
    let v6 = maps::read_sources6(at).map_err(map_err)?.len();
    for (family, tracked) in [("ipv4", v4), ("ipv6", v6)] {
        let mut l = base.clone();
        l.push(("family".to_owned(), family.to_owned()));
        f.gauge(
            "shaper_sources_tracked",
            "Keys with a cell of their own in the family's source map",
            l.clone(),
            tracked as f64,
        );
        f.gauge(
            "shaper_sources_capacity",
            "Keys the family's source map holds before evicting the least recently seen",
            l.clone(),
            f64::from(capacity),
        );
        f.gauge(
            "shaper_source_map_fill_ratio",
            "Tracked keys over capacity",
            l,
            tracked as f64 / f64::from(capacity.max(1)),
        );
    }

    let policy_err = |error| MetricsError::Policy {
        iface: at.iface.clone(),
        error: Box::new(error),
    };
    let table = PolicyTable::open(at).map_err(policy_err)?;
    let mut slots = vec![(DEFAULT_SLOT, "default".to_owned())];
    slots.extend(
        table
            .list()
            .map_err(policy_err)?
            .into_iter()
            .map(|i| (i.slot, i.spec.prefix.to_string())),
    );
    let config = table.config().map_err(policy_err)?;
    let shapes: Vec<u32> = table
        .list()
        .map_err(policy_err)?
        .into_iter()
        .filter(|i| i.spec.mode() == Mode::Shape)
        .map(|i| i.slot)
        .chain((config.mode == MODE_SHAPE).then_some(DEFAULT_SLOT))
        .collect();
    let mut horizon = (0, 0);
    for (slot, name) in slots {
        let s = table.stats(slot).map_err(policy_err)?;
        if config.mode != MODE_MONITOR && shapes.contains(&slot) {
            horizon.0 += s.outcomes.dropped_packets + s.unadmitted.dropped_packets;
            horizon.1 += s.outcomes.dropped_bytes + s.unadmitted.dropped_bytes;
        }
        let mut l = base.clone();
        l.push(("policy".to_owned(), name));
        f.outcomes(&POLICY, &l, &s.outcomes);
        f.outcomes(&POLICY_UNADMITTED, &l, &s.unadmitted);
        f.counter(
            "shaper_policy_aggregate_refused_packets",
            "Of a policy's dropped or would-drop frames, those its aggregate refused",
            l.clone(),
            s.aggregate_refused_packets,
        );
        f.counter(
            "shaper_policy_aggregate_refused_bytes",
            "Bytes of a policy's dropped or would-drop frames that its aggregate refused",
            l.clone(),
            s.aggregate_refused_bytes,
        );
        f.counter(
            "shaper_policy_new_sources",
            "Keys given a cell under a policy",
            l,
            s.new_sources,
        );
    }
    f.counter(
        "shaper_horizon_dropped_packets",
        "Shape mode: frames dropped rather than held back beyond the horizon (the drops of policies in shape mode)",
        base.clone(),
        horizon.0,
    );
    f.counter(
        "shaper_horizon_dropped_bytes",
        "Shape mode: bytes of frames dropped beyond the horizon",
        base,
        horizon.1,
    );
    Ok(())
}

/// The text of a scrape: every live attachment of namespace `netns` (None: the host's).
/// An attachment whose interface is gone has no series (its pins stay until detached).
pub fn render(netns: Option<&str>) -> Result<String, MetricsError> {
    let mut families = Families {
        counters: Vec::new(),
        gauges: Vec::new(),
    };
    let attachments = pins::list_all().map_err(MetricsError::List)?;
    for at in attachments
        .iter()
        .filter(|at| at.netns.as_deref() == netns && crate::link::is_live(at))
    {
        collect(&mut families, at)?;
    }
    let mut registry = Registry::default();
    for (name, help, family) in families.counters {
        registry.register(name, help, family);
    }
    for (name, help, family) in families.gauges {
        registry.register(name, help, family);
    }
    let mut text = String::new();
    encode(&mut text, &registry).map_err(|_| MetricsError::Encode)?;
    Ok(text)
}
