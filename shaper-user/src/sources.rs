//! An attachment's keys as the operator's views show them, one copy for all of them:
//! `stats` and the daemon's `/top` (the keys dropped most, by their counters) and
//! `shaper top` (rates between two reads of the same counters, sorted by a key).

use std::{cmp::Ordering, collections::HashMap, time::Instant};

use ipnet::IpNet;
use shaper_common::maps::{Config, Counters, Outcomes, PerCpuSum as _, SourceState};

use crate::{
    colour::{self, Colours},
    maps::{self, KeyNet, Pinned, PinnedMapError},
    pins::Attachment,
    policy::{PolicyError, PolicyTable},
    subscriber::{SubscriberError, SubscriberTable},
    units::Rate,
};

#[derive(Debug, thiserror::Error)]
pub enum SourcesError {
    #[error(transparent)]
    Map(#[from] PinnedMapError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("cannot read the second meter's cells")]
    Meter2(#[from] aya::maps::MapError),
    #[error(transparent)]
    Subscriber(#[from] SubscriberError),
}

/// Refused bytes (dropped, or would drop in monitor mode) first, then passed bytes, then
/// the key: the order of "dropped most", on cumulative counters (`stats`, `/top`) or on
/// what changed between two reads (`shaper top`).
pub fn dropped_most<K: Ord>(a: (&K, &Outcomes), b: (&K, &Outcomes)) -> Ordering {
    let refused = |o: &Outcomes| o.dropped_bytes + o.would_drop_bytes;
    (refused(b.1), b.1.passed_bytes, a.0).cmp(&(refused(a.1), a.1.passed_bytes, b.0))
}

/// Sorts keys and their state with [`dropped_most`] and keeps the first `n`.
pub fn top_dropped(mut sources: Vec<(KeyNet, SourceState)>, n: usize) -> Vec<(KeyNet, Outcomes)> {
    sources.sort_by(|a, b| dropped_most((&a.0, &a.1.outcomes), (&b.0, &b.1.outcomes)));
    sources
        .into_iter()
        .take(n)
        .map(|(k, s)| (k, s.outcomes))
        .collect()
}

/// The name of each policy as `policy list` prints it (`default`, or the prefix), and
/// which one a key falls under.
pub struct PolicyNames {
    generation: u32,
    by_slot: HashMap<u32, String>,
    prefixes: Vec<IpNet>,
}

impl PolicyNames {
    pub fn read(at: &Attachment, config: &Config) -> Result<Self, PolicyError> {
        let installed = PolicyTable::open(at)?.list()?;
        Ok(Self {
            generation: config.policy_gen,
            by_slot: installed
                .iter()
                .map(|i| (i.slot, i.spec.prefix.to_string()))
                .collect(),
            prefixes: installed.iter().map(|i| i.spec.prefix).collect(),
        })
    }

    /// The policy of `key`: the slot the program resolved it to, when it did so under the
    /// policies in force; otherwise (no frame since the policies last changed) the
    /// longest installed prefix holding it, which is what the program will resolve.
    pub fn of(&self, key: &KeyNet, state: &SourceState) -> String {
        let (generation, slot) = ((state.policy >> 32) as u32, state.policy as u32);
        if generation == self.generation && generation != 0 {
            if let Some(name) = self.by_slot.get(&slot) {
                return name.clone();
            }
            if slot == shaper_common::maps::DEFAULT_SLOT {
                return "default".to_owned();
            }
        }
        self.prefixes
            .iter()
            .filter(|p| p.contains(&key.addr))
            .max_by_key(|p| p.prefix_len())
            .map_or_else(|| "default".to_owned(), ToString::to_string)
    }
}

/// What a row of the views is: a key ([`KeyNet`]), or a subscriber's id
/// ([`Sample::subscribers`]).
pub trait RowKey: Clone + Eq + std::hash::Hash + Ord + std::fmt::Display {}

impl<K: Clone + Eq + std::hash::Hash + Ord + std::fmt::Display> RowKey for K {}

/// One key (or subscriber) at one read.
#[derive(Clone, Debug)]
pub struct Source<K = KeyNet> {
    pub key: K,
    pub policy: String,
    pub outcomes: Outcomes,
    /// Of the passed, those passed yellow (marked): packets, bytes (`crate::colour`).
    pub yellow: (u64, u64),
}

/// One read of an attachment's counters and keys (or subscribers).
#[derive(Clone, Debug)]
pub struct Sample<K = KeyNet> {
    pub taken: Instant,
    pub config: Config,
    pub totals: Counters,
    pub sources: Vec<Source<K>>,
}

impl Sample {
    pub fn read(at: &Attachment) -> Result<Self, SourcesError> {
        let config = maps::read_config(at)?;
        let names = PolicyNames::read(at, &config)?;
        let totals = maps::read_counters(at)?;
        let yellow = colour::yellow_by_key(at, &config)?;
        let sources = maps::read_all_keys(at, &config)?
            .into_iter()
            .map(|(key, state)| Source {
                policy: names.of(&key, &state),
                yellow: yellow.get(&key).copied().unwrap_or_default(),
                key,
                outcomes: state.outcomes,
            })
            .collect();
        Ok(Self {
            taken: Instant::now(),
            config,
            totals,
            sources,
        })
    }
}

impl Sample<String> {
    /// One read of an attachment's counters and subscribers, each named by its plan's
    /// rate: `shaper top --subscribers`.
    pub fn subscribers(at: &Attachment) -> Result<Self, SourcesError> {
        let config = maps::read_config(at)?;
        let totals = maps::read_counters(at)?;
        let table = SubscriberTable::of(&Pinned::open(at)?)?;
        let sources = table
            .with_plans()?
            .into_iter()
            .map(|(c, rate_bps)| Source {
                key: c.id,
                policy: format!("plan {}", Rate::from_bps(rate_bps)),
                outcomes: c.outcomes,
                yellow: c.yellow,
            })
            .collect();
        Ok(Self {
            taken: Instant::now(),
            config,
            totals,
            sources,
        })
    }
}

/// What was counted between two reads, and over how long.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Change {
    pub counts: Outcomes,
    /// Of the passed, the yellow (marked): packets, bytes.
    pub yellow: (u64, u64),
    pub secs: f64,
}

/// A count between two reads: a key evicted and seen again starts from zero, and counts
/// from there.
fn d(a: u64, b: u64) -> u64 {
    if b >= a { b - a } else { b }
}

impl Change {
    /// The change of `before` to `after`, the yellow of each beside it.
    fn between(before: (&Outcomes, (u64, u64)), after: (&Outcomes, (u64, u64)), secs: f64) -> Self {
        let (before, yellow_before) = before;
        let (after, yellow_after) = after;
        Self {
            yellow: (
                d(yellow_before.0, yellow_after.0),
                d(yellow_before.1, yellow_after.1),
            ),
            counts: Outcomes {
                passed_packets: d(before.passed_packets, after.passed_packets),
                passed_bytes: d(before.passed_bytes, after.passed_bytes),
                dropped_packets: d(before.dropped_packets, after.dropped_packets),
                dropped_bytes: d(before.dropped_bytes, after.dropped_bytes),
                would_drop_packets: d(before.would_drop_packets, after.would_drop_packets),
                would_drop_bytes: d(before.would_drop_bytes, after.would_drop_bytes),
            },
            secs,
        }
    }

    fn per_sec(&self, v: u64) -> f64 {
        if self.secs > 0.0 {
            v as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Everything the key sent (passed, dropped and would drop), in bits per second.
    pub fn rate_bits_per_sec(&self) -> f64 {
        self.per_sec(self.counts.bytes()) * 8.0
    }
    pub fn passed_bits_per_sec(&self) -> f64 {
        self.per_sec(self.counts.passed_bytes) * 8.0
    }
    pub fn passed_packets_per_sec(&self) -> f64 {
        self.per_sec(self.counts.passed_packets)
    }
    pub fn dropped_bits_per_sec(&self) -> f64 {
        self.per_sec(self.counts.dropped_bytes) * 8.0
    }
    pub fn dropped_packets_per_sec(&self) -> f64 {
        self.per_sec(self.counts.dropped_packets)
    }
    pub fn would_drop_bits_per_sec(&self) -> f64 {
        self.per_sec(self.counts.would_drop_bytes) * 8.0
    }
    pub fn would_drop_packets_per_sec(&self) -> f64 {
        self.per_sec(self.counts.would_drop_packets)
    }

    /// The same frames by colour (`crate::colour`).
    pub fn colours(&self) -> Colours {
        Colours::new(&[&self.counts], self.yellow)
    }
    pub fn green_bits_per_sec(&self) -> f64 {
        self.per_sec(self.colours().green_bytes) * 8.0
    }
    pub fn green_packets_per_sec(&self) -> f64 {
        self.per_sec(self.colours().green_packets)
    }
    pub fn yellow_bits_per_sec(&self) -> f64 {
        self.per_sec(self.yellow.1) * 8.0
    }
    pub fn yellow_packets_per_sec(&self) -> f64 {
        self.per_sec(self.yellow.0)
    }
    pub fn red_bits_per_sec(&self) -> f64 {
        self.per_sec(self.colours().red_bytes) * 8.0
    }
    pub fn red_packets_per_sec(&self) -> f64 {
        self.per_sec(self.colours().red_packets)
    }
}

/// A key's (or subscriber's) rates between two reads.
#[derive(Clone, Debug)]
pub struct SourceRate<K = KeyNet> {
    pub key: K,
    pub policy: String,
    pub change: Change,
}

/// The interface's rates between two reads: the keys with a cell of their own, and those
/// refused one (new-source admission), which no key row shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct TotalRates {
    pub metered: Change,
    pub unadmitted: Change,
    /// Both together, with the yellow frames of both (for the colours).
    pub all: Change,
}

/// How `shaper top` orders its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Everything a key sent, per second.
    Rate,
    /// Passed per second.
    Passed,
    /// Dropped (or would drop) per second: [`dropped_most`] on the change.
    Dropped,
}

impl SortKey {
    pub fn name(self) -> &'static str {
        match self {
            Self::Rate => "rate",
            Self::Passed => "passed",
            Self::Dropped => "dropped",
        }
    }
}

/// The rates of every key of `after` since `before` (a key new in `after` counts from
/// zero), sorted by `key`, and the interface's.
pub fn rates<K: RowKey>(
    before: &Sample<K>,
    after: &Sample<K>,
    key: SortKey,
) -> (TotalRates, Vec<SourceRate<K>>) {
    let secs = after.taken.duration_since(before.taken).as_secs_f64();
    let earlier: HashMap<&K, (&Outcomes, (u64, u64))> = before
        .sources
        .iter()
        .map(|s| (&s.key, (&s.outcomes, s.yellow)))
        .collect();
    let mut rows: Vec<SourceRate<K>> = after
        .sources
        .iter()
        .map(|s| SourceRate {
            key: s.key.clone(),
            policy: s.policy.clone(),
            change: Change::between(
                earlier
                    .get(&s.key)
                    .copied()
                    .unwrap_or((&Outcomes::default(), (0, 0))),
                (&s.outcomes, s.yellow),
                secs,
            ),
        })
        .collect();
    sort(&mut rows, key);
    let (b, a) = (&before.totals, &after.totals);
    let all = |c: &Counters| {
        let mut o = c.outcomes;
        o.add(&c.unadmitted);
        (o, (c.meter2.yellow_packets, c.meter2.yellow_bytes))
    };
    let (all_before, all_after) = (all(b), all(a));
    let totals = TotalRates {
        metered: Change::between((&b.outcomes, (0, 0)), (&a.outcomes, (0, 0)), secs),
        unadmitted: Change::between((&b.unadmitted, (0, 0)), (&a.unadmitted, (0, 0)), secs),
        all: Change::between(
            (&all_before.0, all_before.1),
            (&all_after.0, all_after.1),
            secs,
        ),
    };
    (totals, rows)
}

/// Sorts rows by `key`, largest first, ties by the key's address (or id).
pub fn sort<K: RowKey>(rows: &mut [SourceRate<K>], key: SortKey) {
    rows.sort_by(|a, b| {
        let (ca, cb) = (&a.change.counts, &b.change.counts);
        match key {
            SortKey::Rate => (cb.bytes(), &a.key).cmp(&(ca.bytes(), &b.key)),
            SortKey::Passed => (cb.passed_bytes, &a.key).cmp(&(ca.passed_bytes, &b.key)),
            SortKey::Dropped => dropped_most((&a.key, ca), (&b.key, cb)),
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn source(addr: &str, passed: u64, dropped: u64) -> Source {
        Source {
            key: KeyNet {
                addr: addr.parse().unwrap(),
                prefix: 32,
            },
            policy: "default".to_owned(),
            yellow: (0, 0),
            outcomes: Outcomes {
                passed_packets: passed / 1000,
                passed_bytes: passed,
                dropped_packets: dropped / 1000,
                dropped_bytes: dropped,
                ..Outcomes::default()
            },
        }
    }

    fn sample(taken: Instant, sources: Vec<Source>) -> Sample {
        Sample {
            taken,
            config: Config::default(),
            totals: Counters::default(),
            sources,
        }
    }

    #[test]
    fn rates_are_the_change_over_the_interval_and_sort_by_each_key() {
        let t0 = Instant::now();
        let before = sample(
            t0,
            vec![source("10.0.0.1", 1_000, 0), source("10.0.0.2", 0, 0)],
        );
        let after = sample(
            t0 + Duration::from_secs(2),
            vec![
                // 1 Mbit/s passed, 3 Mbit/s dropped: 4 Mbit/s offered.
                source("10.0.0.1", 1_000 + 250_000, 750_000),
                // 2 Mbit/s passed, nothing dropped.
                source("10.0.0.2", 500_000, 0),
                // New since the first read: 0.4 Mbit/s.
                source("10.0.0.3", 100_000, 0),
            ],
        );
        let (_, rows) = rates(&before, &after, SortKey::Rate);
        let order = |rows: &[SourceRate]| {
            rows.iter()
                .map(|r| r.key.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(order(&rows), "10.0.0.1 10.0.0.2 10.0.0.3");
        assert_eq!(rows[0].change.rate_bits_per_sec(), 4e6);
        assert_eq!(rows[0].change.passed_bits_per_sec(), 1e6);
        assert_eq!(rows[0].change.dropped_bits_per_sec(), 3e6);
        assert_eq!(rows[2].change.rate_bits_per_sec(), 0.4e6);
        let (_, rows) = rates(&before, &after, SortKey::Passed);
        assert_eq!(order(&rows), "10.0.0.2 10.0.0.1 10.0.0.3");
        let (_, rows) = rates(&before, &after, SortKey::Dropped);
        assert_eq!(order(&rows), "10.0.0.1 10.0.0.2 10.0.0.3");
    }

    #[test]
    fn the_top_is_refused_bytes_dropped_and_would_drop_together_then_passed() {
        let state = |s: Source| {
            (
                s.key,
                SourceState {
                    outcomes: s.outcomes,
                    ..SourceState::default()
                },
            )
        };
        let mut monitored = source("10.0.0.3", 0, 0);
        // Would drop 600 and dropped 500: 1,100 refused, more than 10.0.0.2's 1,000.
        monitored.outcomes.would_drop_bytes = 600;
        monitored.outcomes.dropped_bytes = 500;
        let top = top_dropped(
            vec![
                state(source("10.0.0.1", 5_000, 0)),
                state(source("10.0.0.2", 0, 1_000)),
                state(monitored),
                state(source("10.0.0.4", 9_000, 0)),
            ],
            3,
        );
        let order: Vec<String> = top.iter().map(|(k, _)| k.addr.to_string()).collect();
        assert_eq!(order, ["10.0.0.3", "10.0.0.2", "10.0.0.4"]);
        assert_eq!(top[0].1.would_drop_bytes, 600);
    }

    #[test]
    fn colours_are_rates_of_the_change_and_yellow_is_part_of_passed() {
        let t0 = Instant::now();
        let mut marked = source("10.0.0.1", 1_000_000, 0);
        marked.yellow = (100, 100_000);
        let before = sample(t0, vec![marked]);
        // In 2 s: 500,000 bytes passed, 200,000 of them yellow; 250,000 dropped.
        let mut marked = source("10.0.0.1", 1_500_000, 250_000);
        marked.yellow = (300, 300_000);
        let after = sample(t0 + Duration::from_secs(2), vec![marked]);
        let (_, rows) = rates(&before, &after, SortKey::Rate);
        let c = &rows[0].change;
        assert_eq!(c.yellow_bits_per_sec(), 0.8e6);
        assert_eq!(c.yellow_packets_per_sec(), 100.0);
        assert_eq!(c.green_bits_per_sec(), 1.2e6);
        assert_eq!(c.red_bits_per_sec(), 1e6);
        assert_eq!(
            c.green_bits_per_sec() + c.yellow_bits_per_sec(),
            c.passed_bits_per_sec()
        );
    }

    #[test]
    fn a_key_seen_again_after_eviction_counts_from_zero() {
        let c = Change::between(
            (&source("10.0.0.1", 9_000, 0).outcomes, (0, 0)),
            (&source("10.0.0.1", 2_000, 0).outcomes, (0, 0)),
            1.0,
        );
        assert_eq!(c.counts.passed_bytes, 2_000);
    }
}
