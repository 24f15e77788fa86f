//! The counters and gauges of every attachment in a network namespace, in the
//! Prometheus/OpenMetrics text format (the prometheus-client crate's encoder), read from
//! the pins at each scrape. Labels name the interface, the direction (`ingress` or `egress`),
//! for per-policy counters the policy (`default` or its prefix), and for the busiest
//! subscribers' the subscriber's id: never an address, and a bounded number of policies and
//! subscribers per attachment.
//!
//! A scrape reads a fixed number of entries per attachment (the counters, the settings,
//! one per policy), whatever the source maps hold: how many keys they hold is counted by
//! the daemon in the background ([`SourceCounter`]), at most 1% of a CPU, and a scrape
//! serves the last count; so are the subscribers (their number and the busiest). The
//! daemon adds what only it knows ([`Daemon`]): whether each
//! interface of its file is attached, and how its last reload went.

use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::{
    encoding::{EncodeLabelValue, LabelValueEncoder, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use shaper_common::{
    maps::{
        DEFAULT_SLOT, MODE_MONITOR, MODE_SHAPE, Meter2Counts, Outcomes, PolicyStats, Sightings,
    },
    shape::bucket_bounds_ns,
};

use crate::{
    colour::Colours,
    maps::{self, Pinned, PinnedMapError},
    pins::{self, Attachment, Direction},
    policy::{PolicyError, PolicySpec, PolicyTable},
    subscriber::{Counts, SubscriberTable},
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

type Labels = Vec<(String, LabelValue)>;

/// A label's value, escaped as the text formats require when written: a backslash, a
/// double quote and a newline as `\\`, `\"` and `\n` (an interface may be named `a"b`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct LabelValue(String);

impl LabelValue {
    fn escaped(&self) -> String {
        let mut out = String::with_capacity(self.0.len());
        for c in self.0.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out
    }
}

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        encoder.write_str(&self.escaped())
    }
}
type GaugeF64 = Gauge<f64, std::sync::atomic::AtomicU64>;
/// A histogram's cumulative counts by upper bound in seconds (`None`: +Inf).
type Buckets = Vec<(Option<f64>, u64)>;

/// One attachment's shape delay histogram: its labels, its buckets, and the sum of the
/// delays in seconds.
struct Delays {
    labels: Labels,
    buckets: Buckets,
    sum_secs: f64,
}

/// The samples of one metric family: its name, its help, and each series' labels and
/// value.
type Samples<T> = Vec<(&'static str, &'static str, Vec<(Labels, T)>)>;

/// One metric family per name, registered once (by [`Families::register`], when every
/// attachment has been read).
#[derive(Default)]
struct Families {
    counters: Samples<u64>,
    gauges: Samples<f64>,
    /// The shape delay histogram of each attachment.
    delays: Vec<Delays>,
}

/// Adds `samples` to the family `name` of `all`.
fn add<T>(all: &mut Samples<T>, name: &'static str, help: &'static str, samples: Vec<(Labels, T)>) {
    match all.iter_mut().find(|(n, _, _)| *n == name) {
        Some((_, _, have)) => have.extend(samples),
        None => all.push((name, help, samples)),
    }
}

impl Families {
    fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, value: u64) {
        add(&mut self.counters, name, help, vec![(labels, value)]);
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, value: f64) {
        add(&mut self.gauges, name, help, vec![(labels, value)]);
    }

    /// Adds every series of `other` (one attachment's, read whole).
    fn absorb(&mut self, other: Self) {
        for (name, help, samples) in other.counters {
            add(&mut self.counters, name, help, samples);
        }
        for (name, help, samples) in other.gauges {
            add(&mut self.gauges, name, help, samples);
        }
        self.delays.extend(other.delays);
    }

    /// A registry of the counters and gauges (the delays are written by hand).
    fn register(self) -> (Registry, Vec<Delays>) {
        let mut registry = Registry::default();
        for (name, help, samples) in self.counters {
            let family = Family::<Labels, Counter>::default();
            for (labels, value) in samples {
                family.get_or_create(&labels).inc_by(value);
            }
            registry.register(name, help, family);
        }
        for (name, help, samples) in self.gauges {
            let family = Family::<Labels, GaugeF64>::default();
            for (labels, value) in samples {
                family.get_or_create(&labels).set(value);
            }
            registry.register(name, help, family);
        }
        (registry, self.delays)
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

    /// The colour counters of `m`'s frames (`crate::colour`) and its packet-rate
    /// refusals, named `{prefix}green_packets` and so on.
    fn colours(&mut self, names: &ColourNames, labels: &Labels, c: &Colours, m: &Meter2Counts) {
        for (i, value) in [
            c.green_packets,
            c.green_bytes,
            c.yellow_packets,
            c.yellow_bytes,
            c.red_packets,
            c.red_bytes,
            m.packet_rate_refused_packets,
            m.packet_rate_refused_bytes,
        ]
        .into_iter()
        .enumerate()
        {
            self.counter(names.0[i], names.1[i], labels.clone(), value);
        }
    }

    /// The four doorkeeper counters of `s`, named `{prefix}seen_once` and so on.
    fn sightings(&mut self, names: &SightingNames, labels: &Labels, s: &Sightings) {
        for (name, help, value) in [
            (names.0[0], names.1[0], s.first),
            (names.0[1], names.1[1], s.admitted),
            (names.0[2], names.1[2], s.first_admitted),
            (names.0[3], names.1[3], s.displaced),
        ] {
            self.counter(name, help, labels.clone(), value);
        }
    }
}

/// Names and help of the four doorkeeper counters of one kind (`stats -j`'s names).
type SightingNames = ([&'static str; 4], [&'static str; 4]);

const SIGHTINGS: SightingNames = (
    [
        "shaper_seen_once",
        "shaper_admitted_on_second_sighting",
        "shaper_admitted_on_first_sighting",
        "shaper_traces_displaced",
    ],
    [
        "Keys new to the table seen for the first time: a trace left, the frame metered as unadmitted",
        "Keys given a cell on their second sighting (their own trace found within the window)",
        "Keys given a cell on their first sighting, within the first-sighting allowance",
        "First sightings whose trace took the place of another key's live one",
    ],
);

const POLICY_SIGHTINGS: SightingNames = (
    [
        "shaper_policy_seen_once",
        "shaper_policy_admitted_on_second_sighting",
        "shaper_policy_admitted_on_first_sighting",
        "shaper_policy_traces_displaced",
    ],
    [
        "A policy's keys new to the table seen for the first time",
        "A policy's keys given a cell on their second sighting",
        "A policy's keys given a cell on their first sighting, within the first-sighting allowance",
        "A policy's first sightings whose trace took the place of another key's live one",
    ],
);

/// Names and help of the colour counters of one kind (`stats -j`'s names).
type ColourNames = ([&'static str; 8], [&'static str; 8]);

const COLOURS: ColourNames = (
    [
        "shaper_green_packets",
        "shaper_green_bytes",
        "shaper_yellow_packets",
        "shaper_yellow_bytes",
        "shaper_red_packets",
        "shaper_red_bytes",
        "shaper_packet_rate_refused_packets",
        "shaper_packet_rate_refused_bytes",
    ],
    [
        "Metered frames passed unmarked (passed, unadmitted included, less yellow)",
        "Bytes of metered frames passed unmarked",
        "Frames passed by an excess rate, their DSCP rewritten (monitor mode: left alone)",
        "Bytes of frames passed by an excess rate",
        "Metered frames refused: dropped or would drop, unadmitted included",
        "Bytes of metered frames refused",
        "Frames refused by a packet rate (also red)",
        "Bytes of frames refused by a packet rate (also red)",
    ],
);

const POLICY_COLOURS: ColourNames = (
    [
        "shaper_policy_green_packets",
        "shaper_policy_green_bytes",
        "shaper_policy_yellow_packets",
        "shaper_policy_yellow_bytes",
        "shaper_policy_red_packets",
        "shaper_policy_red_bytes",
        "shaper_policy_packet_rate_refused_packets",
        "shaper_policy_packet_rate_refused_bytes",
    ],
    [
        "A policy's frames passed unmarked (passed, unadmitted included, less yellow)",
        "Bytes of a policy's frames passed unmarked",
        "A policy's frames passed by its excess rate, their DSCP rewritten (monitor mode: left alone)",
        "Bytes of a policy's frames passed by its excess rate",
        "A policy's frames refused: dropped or would drop, unadmitted included",
        "Bytes of a policy's frames refused",
        "A policy's frames refused by its packet rate (also red)",
        "Bytes of a policy's frames refused by its packet rate (also red)",
    ],
);

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

const SUBSCRIBER: OutcomeNames = (
    [
        "shaper_subscriber_passed_packets",
        "shaper_subscriber_passed_bytes",
        "shaper_subscriber_dropped_packets",
        "shaper_subscriber_dropped_bytes",
        "shaper_subscriber_would_drop_packets",
        "shaper_subscriber_would_drop_bytes",
    ],
    [
        "Frames of one of the busiest subscribers, passed",
        "Bytes of frames of one of the busiest subscribers, passed",
        "Frames of one of the busiest subscribers, dropped",
        "Bytes of frames of one of the busiest subscribers, dropped",
        "Frames of one of the busiest subscribers that would drop (monitor mode)",
        "Bytes of frames of one of the busiest subscribers that would drop (monitor mode)",
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
        .map(|(k, v)| ((*k).to_owned(), LabelValue((*v).to_owned())))
        .collect()
}

/// Adds one attachment's series; `counted`: its keys as the daemon last counted them.
fn collect(
    f: &mut Families,
    at: &Attachment,
    counted: Option<Counted>,
    top: usize,
) -> Result<(), MetricsError> {
    let map_err = |error| MetricsError::Map {
        iface: at.iface.clone(),
        error: Box::new(error),
    };
    let base = labels(&[("interface", &at.iface), ("direction", at.direction.name())]);
    let c = maps::read_counters(at).map_err(map_err)?;
    f.outcomes(&INTERFACE, &base, &c.outcomes);
    f.outcomes(&UNADMITTED, &base, &c.unadmitted);
    f.sightings(&SIGHTINGS, &base, &c.sightings);
    let yellow = (c.meter2.yellow_packets, c.meter2.yellow_bytes);
    let colours = Colours::new(&[&c.outcomes, &c.unadmitted], yellow);
    f.colours(&COLOURS, &base, &colours, &c.meter2);
    for (kind, packets, bytes) in c.unmetered() {
        let mut l = base.clone();
        l.push(("kind".to_owned(), LabelValue(kind.to_owned())));
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
        l.push(("family".to_owned(), LabelValue(family.to_owned())));
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
    // The delay histogram: written by hand after the registry's text (see
    // [`delay_histogram`]).
    let mut held = 0;
    let buckets = c
        .shape_delay
        .iter()
        .enumerate()
        .map(|(k, n)| {
            held += n;
            (bucket_bounds_ns(k).1.map(|to| to as f64 / 1e9), held)
        })
        .collect();
    f.delays.push(Delays {
        labels: base.clone(),
        buckets,
        sum_secs: c.shape_delay_ns as f64 / 1e9,
    });

    let capacity = maps::sources_capacity(at).map_err(map_err)?;
    for (family, tracked) in [
        ("ipv4", counted.as_ref().map(|c| c.ipv4)),
        ("ipv6", counted.as_ref().map(|c| c.ipv6)),
    ] {
        let mut l = base.clone();
        l.push(("family".to_owned(), LabelValue(family.to_owned())));
        f.gauge(
            "shaper_sources_capacity",
            "Keys the family's source table has room for (idle ones give their place up)",
            l.clone(),
            f64::from(capacity),
        );
        // Absent until the daemon has counted them once: never a zero it did not count.
        let Some(tracked) = tracked else { continue };
        f.gauge(
            "shaper_sources_tracked",
            "Keys with a cell of their own in the family's source map, as last counted",
            l.clone(),
            tracked as f64,
        );
        f.gauge(
            "shaper_source_map_fill_ratio",
            "Tracked keys over capacity, as last counted",
            l,
            tracked as f64 / f64::from(capacity.max(1)),
        );
    }
    if let Some(c) = counted {
        f.gauge(
            "shaper_sources_counted_timestamp_seconds",
            "When the daemon last counted the keys of the source maps (Unix time)",
            base.clone(),
            unix_seconds(c.at),
        );
        if let Some(subs) = &c.subscribers {
            subscriber_series(f, &base, subs);
        }
    }

    collect_policies(f, at, &base, top)
}

/// The per-policy series of an attachment: the default policy's, and those of the `top`
/// prefix policies that refused the most bytes (then passed the most), so a scrape stays
/// bounded however many policies there are; how many there are, as a gauge. The horizon's
/// drops are summed over every policy.
fn collect_policies(
    f: &mut Families,
    at: &Attachment,
    base: &Labels,
    top: usize,
) -> Result<(), MetricsError> {
    let policy_err = |error| MetricsError::Policy {
        iface: at.iface.clone(),
        error: Box::new(error),
    };
    // The slots in use read once (prefix policies and subscribers' plans), and only
    // their counters.
    let table = PolicyTable::open(at).map_err(policy_err)?;
    let slots = table.slots().map_err(policy_err)?;
    let config = table.config().map_err(policy_err)?;
    let counted: Vec<u32> = std::iter::once(DEFAULT_SLOT)
        .chain(slots.iter().map(|(slot, _)| *slot))
        .collect();
    let mut stats = table.stats_of(&counted).map_err(policy_err)?;
    let mut take = |slot| stats.remove(&slot).unwrap_or_default();
    let default = take(DEFAULT_SLOT);
    let mut horizon = (0, 0);
    let mut add_horizon = |s: &PolicyStats| {
        horizon.0 += s.outcomes.dropped_packets + s.unadmitted.dropped_packets;
        horizon.1 += s.outcomes.dropped_bytes + s.unadmitted.dropped_bytes;
    };
    if config.mode == MODE_SHAPE {
        add_horizon(&default);
    }
    let mut ranked = Vec::with_capacity(slots.len());
    for (slot, p) in &slots {
        let s = take(*slot);
        // Subscribers' plans in shape mode drop only beyond the horizon too.
        if config.mode != MODE_MONITOR && p.mode == MODE_SHAPE {
            add_horizon(&s);
        }
        if let Some(spec) = PolicySpec::from_policy(p) {
            ranked.push((spec.prefix.to_string(), s));
        }
    }
    let policies = ranked.len();
    let refused = |s: &PolicyStats| {
        let (o, u) = (&s.outcomes, &s.unadmitted);
        o.dropped_bytes + o.would_drop_bytes + u.dropped_bytes + u.would_drop_bytes
    };
    let passed = |s: &PolicyStats| s.outcomes.passed_bytes + s.unadmitted.passed_bytes;
    ranked.sort_by_key(|(_, s)| std::cmp::Reverse((refused(s), passed(s))));
    ranked.truncate(top);
    f.gauge(
        "shaper_policies",
        "Prefix policies in force (per-policy series are given for the default and at most the top few: see shaper run --metrics-policies)",
        base.clone(),
        policies as f64,
    );
    f.gauge(
        "shaper_policy_slots",
        "Policy slots the attachment has room for (--max-policies, fixed at attach): prefix policies and subscribers' plans share them",
        base.clone(),
        f64::from(table.room()),
    );
    f.gauge(
        "shaper_policy_slots_used",
        "Policy slots in use: the prefix policies and the subscribers' distinct plans",
        base.clone(),
        slots.len() as f64,
    );
    policy_series(f, base, "default".to_owned(), &default);
    for (name, s) in ranked {
        policy_series(f, base, name, &s);
    }
    f.counter(
        "shaper_horizon_dropped_packets",
        "Shape mode: frames dropped rather than held back beyond the horizon (the drops of policies and subscribers' plans in shape mode)",
        base.clone(),
        horizon.0,
    );
    f.counter(
        "shaper_horizon_dropped_bytes",
        "Shape mode: bytes of frames dropped beyond the horizon",
        base.clone(),
        horizon.1,
    );
    Ok(())
}

/// One policy's series, labelled `policy="name"`.
fn policy_series(f: &mut Families, base: &Labels, name: String, s: &PolicyStats) {
    let mut l = base.clone();
    l.push(("policy".to_owned(), LabelValue(name)));
    f.outcomes(&POLICY, &l, &s.outcomes);
    f.outcomes(&POLICY_UNADMITTED, &l, &s.unadmitted);
    f.sightings(&POLICY_SIGHTINGS, &l, &s.sightings);
    let yellow = (s.meter2.yellow_packets, s.meter2.yellow_bytes);
    let colours = Colours::new(&[&s.outcomes, &s.unadmitted], yellow);
    f.colours(&POLICY_COLOURS, &l, &colours, &s.meter2);
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

/// The subscribers in force as the daemon last counted them, with a series set for each
/// of the busiest (`SourceCounter::new`'s `subscribers`): bounded however many there are.
fn subscriber_series(f: &mut Families, base: &Labels, subs: &SubscriberCount) {
    f.gauge(
        "shaper_subscribers",
        "Subscribers in force, when the daemon last counted (per-subscriber series are given for at most the busiest few: see shaper run --metrics-subscribers)",
        base.clone(),
        subs.in_force as f64,
    );
    for c in &subs.busiest {
        let mut l = base.clone();
        l.push(("subscriber".to_owned(), LabelValue(c.id.clone())));
        f.outcomes(&SUBSCRIBER, &l, &c.outcomes);
        f.counter(
            "shaper_subscriber_yellow_packets",
            "Of one of the busiest subscribers' passed frames, those its excess rate passed (marked)",
            l.clone(),
            c.yellow.0,
        );
        f.counter(
            "shaper_subscriber_yellow_bytes",
            "Bytes of one of the busiest subscribers' frames its excess rate passed (marked)",
            l,
            c.yellow.1,
        );
    }
}

/// How many keys an attachment's source maps held when last counted, and its subscribers.
#[derive(Clone, Debug)]
pub struct Counted {
    pub ipv4: u64,
    pub ipv6: u64,
    pub at: SystemTime,
    /// `None` where they could not be read.
    pub subscribers: Option<SubscriberCount>,
}

/// An attachment's subscribers when last counted: how many, and the busiest.
#[derive(Clone, Debug)]
pub struct SubscriberCount {
    pub in_force: usize,
    /// Those that refused the most bytes, then passed the most.
    pub busiest: Vec<Counts>,
}

/// The keys of every live attachment of a namespace, counted in the background and read
/// by each scrape. Cloned handles share one table.
#[derive(Clone, Default)]
pub struct SourceCounter {
    counts: Arc<Mutex<HashMap<(String, Direction), Counted>>>,
    /// How many of each attachment's busiest subscribers it keeps the counts of.
    subscribers: usize,
}

impl SourceCounter {
    /// A counter that also keeps the counts of each attachment's `subscribers` busiest
    /// subscribers (0: their number only).
    pub fn new(subscribers: usize) -> Self {
        Self {
            counts: Arc::default(),
            subscribers,
        }
    }

    /// The share of one CPU counting may take: after a count that took `t`, the next
    /// starts `t / BUDGET` later (and at least [`MIN_COUNT_INTERVAL`]).
    pub const BUDGET: f64 = 0.01;

    /// Counts the keys of every live attachment of `netns` once; returns how long it took.
    /// An attachment that cannot be read keeps no count (its gauges are left out).
    pub fn count_all(&self, netns: Option<&str>) -> Duration {
        let start = Instant::now();
        let mut counts = HashMap::new();
        for at in pins::list_all()
            .unwrap_or_default()
            .into_iter()
            .filter(|at| at.netns.as_deref() == netns && crate::link::is_live(at))
        {
            if let Ok((ipv4, ipv6)) = maps::count_sources(&at) {
                let counted = Counted {
                    ipv4,
                    ipv6,
                    at: SystemTime::now(),
                    subscribers: self.count_subscribers(&at),
                };
                counts.insert((at.iface, at.direction), counted);
            }
        }
        *self.counts.lock().unwrap_or_else(|e| e.into_inner()) = counts;
        start.elapsed()
    }

    /// Counts forever, each count [`Self::BUDGET`] of a CPU apart: at a full default table
    /// (262,144 keys, 0.27 s a count here) every 27 s, at a few thousand keys every second.
    pub fn run(&self, netns: Option<&str>) -> ! {
        loop {
            let took = self.count_all(netns);
            std::thread::sleep(took.div_f64(Self::BUDGET).max(MIN_COUNT_INTERVAL));
        }
    }

    fn count_subscribers(&self, at: &Attachment) -> Option<SubscriberCount> {
        let pinned = Pinned::open(at).ok()?;
        let (in_force, busiest) = SubscriberTable::of(&pinned)
            .ok()?
            .busiest(self.subscribers)
            .ok()?;
        Some(SubscriberCount { in_force, busiest })
    }

    fn get(&self, at: &Attachment) -> Option<Counted> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(at.iface.clone(), at.direction))
            .cloned()
    }
}

/// The shortest time between two counts.
pub const MIN_COUNT_INTERVAL: Duration = Duration::from_secs(1);

/// How a reload of the daemon's file went.
#[derive(Clone, Copy, Debug)]
pub struct Reload {
    pub successful: bool,
    pub at: SystemTime,
}

/// What the daemon adds to a scrape.
#[derive(Clone, Debug, Default)]
pub struct Daemon {
    /// The interfaces (and directions) of the file it runs, as last applied.
    pub configured: Vec<(String, Direction)>,
    /// Its last reload (SIGHUP or a changed file); `None` before the first.
    pub last_reload: Option<Reload>,
    /// RADIUS requests by outcome (`crate::radius::Reason`'s names, each listed from the
    /// start); empty when its listener is off.
    pub radius: Vec<(&'static str, u64)>,
    /// RADIUS accounting's counters; `None` when it is off.
    pub accounting: Option<crate::radius::accounting::Stats>,
    /// How long the RADIUS requests acted on took; `None` when its listener is off.
    pub radius_seconds: Option<Latency>,
}

/// [`Latency`]'s upper bounds, seconds: fine below 10 ms (the CoA target), coarse above.
pub const LATENCY_BOUNDS: [f64; 20] = [
    0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002, 0.003, 0.005, 0.007_5, 0.01,
    0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// A histogram of durations, counted as they are observed, in the buckets
/// [`LATENCY_BOUNDS`].
#[derive(Clone, Debug, Default)]
pub struct Latency {
    /// Observations in each bucket (not cumulative); the last is above every bound.
    counts: [u64; LATENCY_BOUNDS.len() + 1],
    sum_secs: f64,
}

impl Latency {
    pub fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BOUNDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.counts[i] += 1;
        self.sum_secs += secs;
    }

    /// Its cumulative buckets, as a scrape gives them.
    fn buckets(&self) -> Buckets {
        let mut total = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, n)| {
                total += n;
                (LATENCY_BOUNDS.get(i).copied(), total)
            })
            .collect()
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Adds the daemon's own series.
fn collect_daemon(f: &mut Families, daemon: &Daemon, netns: Option<&str>) {
    for (iface, direction) in &daemon.configured {
        let at = Attachment::toward(iface, netns, *direction);
        f.gauge(
            "shaper_interface_attached",
            "1 if the interface the daemon's file names is attached (the kernel runs its program there), 0 if not (gone, made again or its clsact filter removed until the daemon attaches it again, or its attach failed)",
            labels(&[("interface", iface), ("direction", direction.name())]),
            if crate::link::is_live(&at) { 1.0 } else { 0.0 },
        );
        f.gauge(
            "shaper_interface_missing",
            "1 if the interface the daemon's file names does not exist (the daemon attaches it when it appears), 0 if it does",
            labels(&[("interface", iface), ("direction", direction.name())]),
            if crate::system::ifindex(iface).is_err() { 1.0 } else { 0.0 },
        );
    }
    for (reason, n) in &daemon.radius {
        f.counter(
            "shaper_radius_requests",
            "RADIUS Dynamic Authorization requests (RFC 5176) by outcome: ack, a NAK's cause, or why one was dropped unanswered (unknown_client, bad_authenticator, stale_event_timestamp, replay, ...)",
            labels(&[("reason", reason)]),
            *n,
        );
    }
    if let Some(a) = &daemon.accounting {
        collect_accounting(f, a);
    }
    if let Some(reload) = daemon.last_reload {
        f.gauge(
            "shaper_config_last_reload_successful",
            "1 if the daemon's last reload applied its file, 0 if it refused it",
            Vec::new(),
            if reload.successful { 1.0 } else { 0.0 },
        );
        f.gauge(
            "shaper_config_last_reload_timestamp_seconds",
            "When the daemon last reloaded its file, applied or refused (Unix time)",
            Vec::new(),
            unix_seconds(reload.at),
        );
    }
}

/// RADIUS accounting's series: by server, and lost, and the sessions.
fn collect_accounting(f: &mut Families, a: &crate::radius::accounting::Stats) {
    for s in &a.servers {
        let l = || labels(&[("server", &s.server)]);
        f.counter(
            "shaper_radius_accounting_requests",
            "RADIUS Accounting-Requests sent to the server, retransmissions included",
            l(),
            s.requests,
        );
        f.counter(
            "shaper_radius_accounting_responses",
            "Accounting-Responses from the server that answered a request with the right authenticator",
            l(),
            s.responses,
        );
        f.counter(
            "shaper_radius_accounting_timeouts",
            "Accounting-Requests given up on the server after its retries: each went to the next server, or was lost after the last",
            l(),
            s.timeouts,
        );
    }
    f.counter(
        "shaper_radius_accounting_lost",
        "Accounting records no server answered, or that found the queue full",
        Vec::new(),
        a.lost,
    );
    f.gauge(
        "shaper_radius_accounting_sessions",
        "Accounting sessions open: the subscribers of the [radius] interface",
        Vec::new(),
        a.sessions as f64,
    );
}

/// Writes the delay histograms as OpenMetrics text: `_bucket{le}` lines, cumulative, then
/// `_count` (the `+Inf` bucket's) and `_sum` (the kernel's sum of the delays). By hand,
/// because the encoder's histogram observes values one by one and chooses its own bounds,
/// where these are the kernel's log2 buckets, counted already.
fn delay_histogram(out: &mut String, delays: &[Delays]) {
    histogram(
        out,
        "shaper_shape_delay_seconds",
        "Shape mode: how long frames were held back.",
        delays,
    );
}

/// Writes the histogram family `name` of `series` (nothing without a series).
fn histogram(out: &mut String, name: &str, help: &str, series: &[Delays]) {
    if series.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let _ = writeln!(out, "# UNIT {name} seconds");
    for d in series {
        let mut text: Vec<String> = d
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.escaped()))
            .collect();
        for (le, count) in &d.buckets {
            let le = le.map_or_else(|| "+Inf".to_owned(), |s| format!("{s:?}"));
            text.push(format!("le=\"{le}\""));
            let _ = writeln!(out, "{name}_bucket{{{}}} {count}", text.join(","));
            text.pop();
        }
        let count = d.buckets.last().map_or(0, |(_, n)| *n);
        let labels = match text.is_empty() {
            true => String::new(),
            false => format!("{{{}}}", text.join(",")),
        };
        let _ = writeln!(out, "{name}_count{labels} {count}");
        let _ = writeln!(out, "{name}_sum{labels} {:?}", d.sum_secs);
    }
}

/// A scrape: its text, and why each attachment left out of it could not be read.
#[derive(Debug)]
pub struct Scrape {
    pub text: String,
    /// One line per unreadable attachment, naming it.
    pub unreadable: Vec<String>,
}

/// The text of a scrape: every live attachment of namespace `netns` (None: the host's),
/// with their keys as `sources` last counted them, and the daemon's own series.
/// An attachment whose interface is gone has no series (its pins stay until detached).
/// One whose pins cannot be read (an older layout, a pin that fails to open) has none
/// either: it is counted in `shaper_attachments_unreadable` and named in
/// [`Scrape::unreadable`], and the others are served.
/// The prefix policies given series of their own by default (`render`'s `top`).
pub const DEFAULT_TOP_POLICIES: u16 = 10;

/// The subscribers given series of their own by default ([`SourceCounter::new`]).
pub const DEFAULT_TOP_SUBSCRIBERS: u16 = 10;

/// The scrape of every live attachment of `netns`, with per-policy series for the default
/// policy and the `top` prefix policies of each that refused the most.
pub fn render(
    netns: Option<&str>,
    sources: &SourceCounter,
    daemon: &Daemon,
    top: usize,
) -> Result<Scrape, MetricsError> {
    let mut families = Families::default();
    let mut unreadable = Vec::new();
    let attachments = pins::list_all().map_err(MetricsError::List)?;
    for at in attachments
        .iter()
        .filter(|at| at.netns.as_deref() == netns && crate::link::is_live(at))
    {
        let mut one = Families::default();
        match collect(&mut one, at, sources.get(at), top) {
            Ok(()) => families.absorb(one),
            Err(e) => unreadable.push(format!("{}: {e}", at.label())),
        }
    }
    families.gauge(
        "shaper_attachments_unreadable",
        "Live attachments whose pins could not be read (an older layout, a pin that fails to open), left out of the scrape: the daemon's log names them",
        Vec::new(),
        unreadable.len() as f64,
    );
    collect_daemon(&mut families, daemon, netns);
    let (registry, delays) = families.register();
    let mut text = String::new();
    encode(&mut text, &registry).map_err(|_| MetricsError::Encode)?;
    let eof = text.rfind("# EOF").ok_or(MetricsError::Encode)?;
    text.truncate(eof);
    delay_histogram(&mut text, &delays);
    if let Some(latency) = &daemon.radius_seconds {
        histogram(
            &mut text,
            "shaper_radius_request_seconds",
            "RADIUS CoA and Disconnect requests acted on (answered ACK or NAK): from the datagram received to the answer sent, the change written in between.",
            &[Delays {
                labels: Vec::new(),
                buckets: latency.buckets(),
                sum_secs: latency.sum_secs,
            }],
        );
    }
    text.push_str("# EOF\n");
    Ok(Scrape { text, unreadable })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_histogram_is_cumulative_with_an_inf_bucket_a_count_and_a_sum() {
        let mut out = String::new();
        let labels = labels(&[("interface", "eth1"), ("direction", "egress")]);
        delay_histogram(
            &mut out,
            &[Delays {
                labels,
                buckets: vec![(Some(1.024e-6), 2), (Some(2.048e-6), 5), (None, 7)],
                sum_secs: 12_345e-9,
            }],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[1], "# TYPE shaper_shape_delay_seconds histogram");
        assert_eq!(
            &lines[3..],
            [
                r#"shaper_shape_delay_seconds_bucket{interface="eth1",direction="egress",le="1.024e-6"} 2"#,
                r#"shaper_shape_delay_seconds_bucket{interface="eth1",direction="egress",le="2.048e-6"} 5"#,
                r#"shaper_shape_delay_seconds_bucket{interface="eth1",direction="egress",le="+Inf"} 7"#,
                r#"shaper_shape_delay_seconds_count{interface="eth1",direction="egress"} 7"#,
                r#"shaper_shape_delay_seconds_sum{interface="eth1",direction="egress"} 1.2345e-5"#,
            ]
        );
        let mut none = String::new();
        delay_histogram(&mut none, &[]);
        assert!(none.is_empty());
    }

    #[test]
    fn a_latency_is_counted_in_its_bucket_and_the_buckets_are_cumulative() {
        let mut l = Latency::default();
        for ms in [0.05, 0.3, 0.3, 4.0, 10_000.0] {
            l.observe(Duration::from_secs_f64(ms / 1e3));
        }
        let b = l.buckets();
        assert_eq!(b.len(), LATENCY_BOUNDS.len() + 1);
        let at = |le: Option<f64>| b.iter().find(|(x, _)| *x == le).unwrap().1;
        assert_eq!(at(Some(0.000_1)), 1);
        assert_eq!(at(Some(0.000_25)), 1);
        assert_eq!(at(Some(0.000_5)), 3);
        assert_eq!(at(Some(0.005)), 4);
        assert_eq!(at(Some(5.0)), 4);
        assert_eq!(at(None), 5);
        let mut out = String::new();
        histogram(
            &mut out,
            "x_seconds",
            "X.",
            &[Delays {
                labels: Vec::new(),
                buckets: b,
                sum_secs: l.sum_secs,
            }],
        );
        assert!(
            out.contains("\nx_seconds_bucket{le=\"+Inf\"} 5\nx_seconds_count 5\n"),
            "{out}"
        );
    }
}
