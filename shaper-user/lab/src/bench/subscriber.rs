//! The subscribers' per-packet rows (issue 31): a known key's frame under a subscriber
//! (its plan's rule with the subscriber's cell in the aggregate's place, counted in the
//! subscriber's entry), IPv4 and IPv6, each set against the per-source pass of a known key
//! under the default policy measured in the same runs, on the same object, by the same loop
//! method ([`super::per_packet`]): the ratio is taken run by run.
//!
//! The plan is open (the fastest rate there is, a burst no run exhausts), so every frame
//! passes, and the kernel's counters are checked after the loops: the subscriber's entry
//! must have counted every subscriber frame, and nothing else.
//!
//! [`Million`]: a million subscribers of one IPv4 address each, their keys tracked, drawn
//! at random (cold entries: the subscriber's entry and its key's state miss the CPU
//! caches), single shots, against as many per-source keys drawn at random from the same
//! object's table, which holds both: the same-size floor of a known key's pass. The ratio
//! is taken run by run. Two rows: keys whose route is cached in their state (every key
//! sent one frame first), and each key's first frame after a change of routes (the policy
//! generation moved on: the key looks its route up in the prefix trie again, a walk of
//! about 20 nodes among a million routes, where a key of no subscriber's leaves the trie
//! at once).
//!
//! Only today's build has subscribers: the rows are not measured on the baseline.

use std::net::{Ipv4Addr, Ipv6Addr};

use aya::maps::IterableMap as _;

use anyhow::{Context as _, Result, ensure};
use serde::Serialize;
use shaper_common::{
    config::PolicyLimits,
    gcra::MAX_RATE_BPS,
    maps::{ACTION_LIMIT, PROG_XDP, SUBSCRIBER_BIT, Subscriber},
};
use shaper_user::{
    policy::parse_prefix,
    subscriber::{
        Entry, SubscriberSpec,
        record::{self, Record},
    },
};

use super::spread::Summary;
use crate::{
    frame,
    rng::Rng,
    testrun::{Harness, XDP_PASS, open_config, prefill},
};

/// A row: what it measures, and its frame.
pub struct Case {
    pub id: &'static str,
    pub name: &'static str,
    frame: Vec<u8>,
    /// Under the subscriber (otherwise the default policy, per source).
    subscriber: bool,
}

/// The object the rows run on: one subscriber of an open plan, with an IPv4 /24 and an
/// IPv6 /56.
pub struct Rig {
    harness: Harness,
    cases: Vec<Case>,
}

const SUBSCRIBER: &str = "bench";

impl Rig {
    pub fn new(frame_bytes: usize) -> Result<Self> {
        let mut harness = Harness::with_subscribers(Some(&open_config()?), 1024, 8)?;
        let plan = open_plan();
        let spec = SubscriberSpec {
            id: SUBSCRIBER.to_owned(),
            name: String::new(),
            prefixes: vec![
                parse_prefix("198.18.4.0/24")?,
                parse_prefix("2001:2:0:400::/56")?,
            ],
            plan,
        };
        let mut table = harness.subscribers()?;
        let before = table.before(&spec.id, Some(&spec))?;
        table.set(&spec, &before)?;
        let v6 = |group: u16| {
            frame::ipv6_udp(
                Ipv6Addr::new(0x2001, 2, 0, group, 0, 0, 0, 0x11),
                Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1),
                frame_bytes - frame::ETH_HLEN - frame::IPV6_HLEN - frame::UDP_HLEN,
            )
        };
        let case = |id, name, frame, subscriber| Case {
            id,
            name,
            frame,
            subscriber,
        };
        let cases = vec![
            case(
                "pass_known_same_object",
                "pass, existing source under the default policy (the subscriber rows' baseline)",
                frame::ipv4_udp(Ipv4Addr::new(198, 18, 5, 11), frame_bytes),
                false,
            ),
            case(
                "pass_subscriber",
                "pass, existing source of a subscriber (its plan, its one bucket)",
                frame::ipv4_udp(Ipv4Addr::new(198, 18, 4, 11), frame_bytes),
                true,
            ),
            case(
                "pass_known_same_object_v6",
                "pass, existing IPv6 source under the default policy (baseline)",
                v6(0x500),
                false,
            ),
            case(
                "pass_subscriber_v6",
                "pass, existing IPv6 source (its /64) of a subscriber's /56",
                v6(0x401),
                true,
            ),
        ];
        Ok(Self { harness, cases })
    }

    pub fn cases(&self) -> &[Case] {
        &self.cases
    }

    /// One run of row `i`: ns a frame over `repeat` frames.
    pub fn measure(&mut self, i: usize, repeat: u32) -> Result<f64> {
        let frame = self.cases[i].frame.clone();
        crate::testrun::test_run(self.harness.ebpf_mut(), PROG_XDP, &frame, repeat, XDP_PASS)
    }

    /// Checks that the subscriber counted exactly the frames of its rows: `repeat` a run
    /// each, `runs` runs.
    pub fn check(&mut self, repeat: u32, runs: usize) -> Result<()> {
        let rows = self.cases.iter().filter(|c| c.subscriber).count();
        let counted = self.harness.subscribers()?.get(SUBSCRIBER)?.outcomes;
        let want = u64::from(repeat) * runs as u64 * rows as u64;
        ensure!(
            counted.passed_packets == want && counted.dropped_packets == 0,
            "the subscriber counted {} passed and {} dropped of {want} frames",
            counted.passed_packets,
            counted.dropped_packets
        );
        Ok(())
    }
}

/// The subscriber rows against their baselines, ratios run by run.
#[derive(Clone, Debug, Serialize)]
pub struct SubscriberResults {
    /// `pass_subscriber` over `pass_known_same_object` (issue 31's target: 1.2), and IPv6.
    pub over_per_source: Summary,
    pub over_per_source_v6: Summary,
    /// A subscriber's key drawn at random from [`Million::SUBSCRIBERS`] against a
    /// per-source key drawn at random from as many on the same object, single shots: their
    /// ns a frame, and the ratio run by run. `None` in results from before it was measured.
    pub million: Option<MillionResults>,
    pub target: f64,
    pub not_measured: Vec<String>,
}

/// Issue 31's bound on a subscriber's pass over a per-source pass.
pub const TARGET: f64 = 1.2;

pub fn results(
    cases: &[Case],
    samples: &[Vec<f64>],
    million: Option<MillionResults>,
) -> Result<SubscriberResults> {
    let runs = |id: &str| -> Result<Summary> {
        let i = cases
            .iter()
            .position(|c| c.id == id)
            .with_context(|| format!("no subscriber row {id}"))?;
        Ok(Summary::of(samples[i].clone()))
    };
    Ok(SubscriberResults {
        over_per_source: runs("pass_subscriber")?.ratio_to(&runs("pass_known_same_object")?),
        over_per_source_v6: runs("pass_subscriber_v6")?
            .ratio_to(&runs("pass_known_same_object_v6")?),
        million,
        target: TARGET,
        not_measured: vec!["the baseline build: it has no subscribers".to_owned()],
    })
}

/// [`Million`]'s rows: ns a frame (the kernel's mean over a run's single shots), and the
/// subscriber's over the per-source key's run by run; keys with their route cached, and
/// each key's first frame after a change of routes.
#[derive(Clone, Debug, Serialize)]
pub struct MillionResults {
    pub subscribers: u32,
    pub subscriber_ns: Summary,
    pub per_source_ns: Summary,
    pub over_per_source: Summary,
    pub first_subscriber_ns: Summary,
    pub first_per_source_ns: Summary,
    pub first_over_per_source: Summary,
}

/// A row's samples: the subscribers' keys and the per-source keys, run by run.
#[derive(Default)]
struct Pair {
    subscriber: Vec<f64>,
    per_source: Vec<f64>,
}

impl Pair {
    fn summaries(self) -> (Summary, Summary, Summary) {
        let (s, o) = (Summary::of(self.subscriber), Summary::of(self.per_source));
        let r = s.ratio_to(&o);
        (s, o, r)
    }
}

/// A million subscribers, each one IPv4 address of 10.0.0.0/8 (subscriber `i` has
/// 10.0.0.0 + `i`), beside as many keys of no subscriber (11.0.0.0 + `i`, the default
/// policy), all of them tracked; see the module docs.
pub struct Million {
    harness: Harness,
    n: u32,
    rng: Rng,
    cached: Pair,
    first: Pair,
    frames_sent: u64,
}

const MILLION_SUBSCRIBERS: u32 = 0x0a00_0000;
const MILLION_SOURCES: u32 = 0x0b00_0000;

impl Million {
    pub const SUBSCRIBERS: u32 = 1_000_000;

    /// `n` subscribers (a million but in a quick run), written straight into the maps (an
    /// entry copied from the first, set the library's way, and a route each), and their
    /// keys and as many others tracked.
    pub fn new(n: u32) -> Result<Self> {
        let mut harness = Harness::with_subscribers(Some(&open_config()?), 2 * n + 1024, n)?;
        let address = |i: u32| Ipv4Addr::from(MILLION_SUBSCRIBERS + i);
        let spec = SubscriberSpec {
            id: "m1".to_owned(),
            name: String::new(),
            prefixes: vec![parse_prefix(&format!("{}/32", address(1)))?],
            plan: open_plan(),
        };
        let mut table = harness.subscribers()?;
        let before = table.before(&spec.id, Some(&spec))?;
        table.set(&spec, &before)?;
        // Placed by its id's hash: every other entry i is written as subscriber i's (its
        // own keeps m1's entry, the routes of both going to it).
        let index = table.get(&spec.id)?.index;
        let mut entries = harness.subscriber_entries()?;
        let template = entries.get(&index, 0)?;
        // Their ids first (an entry in use has its record), in one write.
        let mut records: Vec<(u32, Record)> = (1..=n)
            .filter(|&i| i != index)
            .map(|i| {
                let mut e = Entry::default();
                let name = format!("m{i}");
                e.id[..name.len()].copy_from_slice(name.as_bytes());
                (i, record::split(i, &e).1)
            })
            .collect();
        harness
            .subscriber_records()
            .write_many(&mut records, n + 1)?;
        for i in 1..=n {
            let name = format!("m{i}");
            if i != index {
                let id_hash = record::id_hash(name.as_bytes());
                entries.set(
                    i,
                    Subscriber {
                        id_hash,
                        ..template
                    },
                    0,
                )?;
            }
            let prefix = parse_prefix(&format!("{}/32", address(i)))?;
            harness.policies().route_value(prefix, i | SUBSCRIBER_BIT)?;
        }
        harness.policies().subscribers_routed(true, false)?;
        let keys = (1..=n).flat_map(|i| {
            [
                Ipv4Addr::from(MILLION_SUBSCRIBERS + i),
                Ipv4Addr::from(MILLION_SOURCES + i),
            ]
        });
        prefill(harness.ebpf_mut(), keys)?;
        let mut rig = Self {
            harness,
            n,
            rng: Rng::new(31),
            cached: Pair::default(),
            first: Pair::default(),
            frames_sent: 0,
        };
        // Every key's first frame: its route looked up and cached in its state.
        for base in [MILLION_SUBSCRIBERS, MILLION_SOURCES] {
            let all: Vec<Vec<u8>> = (1..=n)
                .map(|i| frame::ipv4_udp(Ipv4Addr::from(base + i), FRAME_BYTES))
                .collect();
            rig.shots(&all)?;
        }
        rig.frames_sent += u64::from(n);
        Ok(rig)
    }

    /// The kernel's mean time of one run of each of `frames`.
    fn shots(&mut self, frames: &[Vec<u8>]) -> Result<f64> {
        super::per_packet::single_shot(self.harness.ebpf_mut(), PROG_XDP, frames)
    }

    /// One run: `frames` single shots of subscribers' keys and as many of per-source keys,
    /// each drawn at random, their routes cached; which goes first turns from run to run.
    pub fn measure(&mut self, frames: usize, run: usize) -> Result<()> {
        let (s, o) = self.pair(frames, run)?;
        self.cached.subscriber.push(s);
        self.cached.per_source.push(o);
        Ok(())
    }

    /// `runs` runs of each key's first frame after a change of routes: before each, the
    /// policy generation moves on, so every key looks its route up again.
    fn first_frames(&mut self, frames: usize, runs: usize) -> Result<()> {
        for run in 0..runs {
            self.harness.policies().subscribers_routed(true, false)?;
            let (s, o) = self.pair(frames, run)?;
            self.first.subscriber.push(s);
            self.first.per_source.push(o);
        }
        Ok(())
    }

    /// One measurement of each kind of key: (subscribers', per-source) ns a frame.
    fn pair(&mut self, frames: usize, run: usize) -> Result<(f64, f64)> {
        let mut draw = |base: u32| -> Vec<Vec<u8>> {
            (0..frames)
                .map(|_| {
                    let i = 1 + self.rng.below(self.n as usize) as u32;
                    frame::ipv4_udp(Ipv4Addr::from(base + i), FRAME_BYTES)
                })
                .collect()
        };
        let (subs, others) = (draw(MILLION_SUBSCRIBERS), draw(MILLION_SOURCES));
        self.frames_sent += frames as u64;
        if run.is_multiple_of(2) {
            let s = self.shots(&subs)?;
            Ok((s, self.shots(&others)?))
        } else {
            let o = self.shots(&others)?;
            Ok((self.shots(&subs)?, o))
        }
    }

    /// Measures the first frames after a change of routes (`frames` a run, as many runs
    /// as [`Self::measure`] made), checks that the subscribers counted every frame of
    /// theirs passed and nothing dropped; the rows' figures.
    pub fn results(mut self, frames: usize) -> Result<MillionResults> {
        self.first_frames(frames, self.cached.subscriber.len())?;
        let entries = self.harness.subscriber_entries()?;
        let (mut passed, mut dropped) = (0u64, 0u64);
        for (_, s) in shaper_user::maps::read_batched::<u32, Subscriber>(entries.map())? {
            passed += s.outcomes.passed_packets;
            dropped += s.outcomes.dropped_packets;
        }
        ensure!(
            passed == self.frames_sent && dropped == 0,
            "the million subscribers counted {passed} passed and {dropped} dropped of {} frames",
            self.frames_sent
        );
        let (subscriber_ns, per_source_ns, over_per_source) = self.cached.summaries();
        let (first_subscriber_ns, first_per_source_ns, first_over_per_source) =
            self.first.summaries();
        Ok(MillionResults {
            subscribers: self.n,
            subscriber_ns,
            per_source_ns,
            over_per_source,
            first_subscriber_ns,
            first_per_source_ns,
            first_over_per_source,
        })
    }
}

/// The frames' size, as the other per-packet rows.
const FRAME_BYTES: usize = 64;

/// A plan no run exhausts: the fastest rate there is, a burst of a terabyte.
fn open_plan() -> PolicyLimits {
    PolicyLimits {
        action: ACTION_LIMIT,
        rate_bps: MAX_RATE_BPS,
        burst_bytes: 1 << 40,
        aggregate_rate_bps: MAX_RATE_BPS,
        aggregate_burst_bytes: 1 << 40,
        ..PolicyLimits::default()
    }
}
