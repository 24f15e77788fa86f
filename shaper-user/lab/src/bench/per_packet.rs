//! Per-packet cost of the kernel programs, measured with BPF_PROG_TEST_RUN in the real
//! kernel, next to a no-op XDP program measured in the same session.
//!
//! Two methods, because `BPF_PROG_TEST_RUN` runs one program on ONE frame:
//!
//! - **Loop** (existing-source cases): the kernel runs the program `repeat` times on the
//!   same frame and reports the mean time per run. Precise (the clock is read once around
//!   the whole loop), but the frame's source is the same every time, so its map entry is
//!   hot in every cache after the first run.
//! - **Single** (cases whose key must change from packet to packet: a new source, a new
//!   source that evicts, and existing keys drawn at random from 1K, 64K or 1M tracked
//!   sources): one `BPF_PROG_TEST_RUN` with `repeat = 1` per frame, over many distinct
//!   frames, taking the kernel-reported duration of each and averaging. Each reading is a
//!   whole number of nanoseconds and includes the kernel's fixed cost of timing one run
//!   (a clock read, run-context setup); a no-op program measured the same way, on the
//!   same number of frames, in the same run, carries exactly that fixed cost. So these
//!   cases are reported as their excess over the single-shot no-op, added to the loop
//!   no-op: `ns/packet = noop(loop) + (case(single) − noop(single))`. A hot existing
//!   source is also measured this way as a check: its figure should agree with the loop
//!   measurement of the same path. Resolution: a single reading is ±1 ns plus timer
//!   jitter (tens of ns); the mean over thousands of frames is good to about a
//!   nanosecond, and the median over runs removes the odd interrupted run. Between two
//!   frames the kernel returns to userspace and copies the next frame in, which evicts
//!   little of the map, so "cold" means "not the key of the previous packet": at 1K
//!   sources the whole map still fits in the CPU caches; at 1M it does not.
//!
//! Each case is measured `runs` times, interleaved with the others so drift in machine
//! load touches all of them alike; the median is reported. Differences to the no-op are
//! taken run by run (paired) before the median.
//!
//! Both builds ([`super::builds`]: the baseline, the previous build, and today's) are
//! measured in the same runs, under the same settings and on the same frames: each case
//! runs on one build's objects, then at once on the other's (which goes first alternates
//! from run to run), so a row's ratio today/baseline is taken run by run, paired, like the
//! differences to the no-op. The no-op and the floor are the bench object's, measured once
//! per run for both.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result, ensure};
use aya::{
    Ebpf,
    maps::{Array, MapData},
};
use serde::Serialize;
use shaper_common::{
    bench::{PROG_FLOOR, PROG_NOOP},
    config::PolicyLimits,
    gcra::{Limit, MAX_RATE_BPS},
    maps::{
        ACTION_LIMIT, ACTION_PASS, Admission, Config, DEFAULT_MAX_SOURCES, MAP_WATCH, PROG_XDP,
        WATCH_CONTROL, WATCH_METER, Watch,
    },
};
use shaper_user::{
    object::{self, Sizes},
    policy::{PolicySpec, PolicyTable, parse_prefix},
    watch::MAX_EVENTS_PER_SEC,
};

use super::{
    builds::{Build, single_rate},
    colour::{self, ColourResults},
    population::Population,
    spread::{Summary, median},
    subscriber::{self, SubscriberResults},
};
use crate::{
    frame,
    rng::Rng,
    testrun::{XDP_DROP, XDP_PASS, config, noop, open, open_config, prefill, test_run},
};

/// How a case was measured (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// One frame, `repeat` runs inside the kernel.
    Loop,
    /// `repeat = 1` on each of many distinct frames; excess over a single-shot no-op.
    Single,
}

#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    /// Stable identifier, e.g. `pass_existing`, `cold_1m`.
    pub id: &'static str,
    pub case: &'static str,
    pub method: Method,
    /// Packets per measurement: `repeat` (loop) or distinct frames (single).
    pub packets_per_run: u64,
    /// The sources tracked in the map while measuring, where the case is about that.
    pub tracked_sources: Option<u32>,
    /// As measured: the kernel's mean time per packet, median over runs.
    pub measured_ns_median: f64,
    pub measured_ns_runs: Vec<f64>,
    /// Median over runs of (this case − the no-op measured the same way in that run).
    pub over_noop_ns: f64,
    /// The headline cost: the measured figure (loop), or noop(loop) + over_noop_ns (single).
    pub ns_per_packet: f64,
    /// `ns_per_packet` / the no-op's loop figure.
    pub ratio_to_noop: f64,
    /// `ns_per_packet` / the floor's loop figure (parse, clock, one LRU lookup, one CAS).
    pub ratio_to_floor: f64,
    /// The headline figure of each run (as `ns_per_packet` is of their medians).
    pub ns_per_packet_runs: Vec<f64>,
    /// Packets per second one core could handle at `ns_per_packet`.
    pub packets_per_sec: f64,
    /// Anything a reader must know (e.g. frames that found no free entry).
    pub note: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PerPacketResults {
    pub repeat: u32,
    pub runs: usize,
    /// Distinct frames per measurement for the single-shot cases.
    pub frames_per_run: usize,
    /// Size of the map for the eviction case.
    pub eviction_map_entries: u32,
    /// Today's build.
    pub cases: Vec<CaseResult>,
    /// The baseline, measured in the same runs; `None` when it was not (then
    /// `baseline_missing` says why).
    pub baseline: Option<BaselineResults>,
    pub baseline_missing: Option<String>,
    /// The second meter's rows (today's build only; also among `cases`) against the
    /// single-rate pass of the same runs ([`colour`]).
    pub colour: ColourResults,
    /// The subscribers' rows (today's build only; also among `cases`) against a
    /// per-source pass on the same object ([`subscriber`]); `None` in results from before
    /// them.
    pub subscriber: Option<SubscriberResults>,
}

/// The baseline's cases, and each product case of both builds side by side.
#[derive(Clone, Debug, Serialize)]
pub struct BaselineResults {
    /// Its short commit, as the tables name it, and its full commit.
    pub label: String,
    pub commit: String,
    pub cases: Vec<CaseResult>,
    /// Every case but the shared baselines (no-op, floor), in today's order.
    pub versus: Vec<Versus>,
}

/// One case, both builds: the headline figure of each, run by run, and their ratio.
#[derive(Clone, Debug, Serialize)]
pub struct Versus {
    pub id: &'static str,
    pub case: &'static str,
    pub baseline_ns: Summary,
    pub today_ns: Summary,
    /// today / baseline, run by run.
    pub ratio: Summary,
}

/// The cases both builds share: the bench object's programs, measured once per run.
const SHARED: [&str; 3] = ["noop", "floor", "noop_single"];

impl PerPacketResults {
    pub fn case(&self, id: &str) -> Option<&CaseResult> {
        self.cases.iter().find(|c| c.id == id)
    }

    pub fn noop(&self) -> &CaseResult {
        &self.cases[0]
    }

    /// The floor program's loop figure (the second case).
    pub fn floor(&self) -> Option<&CaseResult> {
        self.case("floor")
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Runs of the program per loop measurement.
    pub repeat: u32,
    /// Measurements per case; the median is reported.
    pub runs: usize,
    /// Distinct frames per single-shot measurement.
    pub frames: usize,
    /// Subscribers of the million-subscriber rows ([`subscriber::Million`]).
    pub million: u32,
}

impl Options {
    pub fn new(quick: bool) -> Self {
        if quick {
            Options {
                repeat: 10_000,
                runs: 5,
                frames: 2_000,
                million: 10_000,
            }
        } else {
            Options {
                repeat: 1_000_000,
                runs: 7,
                frames: 50_000,
                million: subscriber::Million::SUBSCRIBERS,
            }
        }
    }
}

/// Size of the map that the eviction case keeps full.
pub const EVICTION_MAP_ENTRIES: u32 = 1024;
const FRAME_BYTES: usize = 64;

/// Mean of the kernel-reported durations of `repeat = 1` runs over `frames`.
pub(super) fn single_shot(ebpf: &mut Ebpf, program: &str, frames: &[Vec<u8>]) -> Result<f64> {
    let mut total = 0.0;
    for f in frames {
        total += test_run(ebpf, program, f, 1, XDP_PASS)?;
    }
    Ok(total / frames.len() as f64)
}

/// Addresses for new sources: 100.64.0.0/10, counted up, never reused within a run.
struct FreshAddrs(u32);

impl FreshAddrs {
    fn take(&mut self, n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|_| {
                self.0 += 1;
                frame::ipv4_udp(Ipv4Addr::from(0x6440_0000 + self.0), FRAME_BYTES)
            })
            .collect()
    }
}

/// New-source admission that lets everything in: far more keys a second than any run
/// creates, and as many at once.
fn admit_all() -> Result<Admission> {
    Admission::new(1 << 30, 1 << 30).map_err(|e| anyhow::anyhow!("{e}"))
}

/// New-source admission as closed as it gets: one key a second, one at once. Once
/// [`drain_admission`] has taken that one, the next key is admitted a second later.
fn admit_one() -> Result<Admission> {
    Admission::new(1, 1).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Empties the admission cell of an object of `build` configured with [`admit_one`]:
/// sends frames of new sources until one is refused (the first may still be admitted).
fn drain_admission(build: &Build, ebpf: &mut Ebpf, fresh: &mut FreshAddrs) -> Result<()> {
    for f in fresh.take(4) {
        let before = build.counters(ebpf)?.unadmitted.packets();
        test_run(ebpf, PROG_XDP, &f, 1, XDP_PASS)?;
        if build.counters(ebpf)?.unadmitted.packets() > before {
            return Ok(());
        }
    }
    anyhow::bail!("new sources are still admitted after 4 tries to empty the admission cell")
}

/// A loop case: what it runs on which frame, under which default policy.
struct LoopCase {
    id: &'static str,
    name: &'static str,
    program: &'static str,
    frame: Vec<u8>,
    config: Config,
    want: u32,
    /// Run on the object with prefix policies ([`policied`]) instead of the plain one.
    policied: bool,
    /// The frame's source is a newcomer that admission must refuse: the admission cell is
    /// emptied first, and every run checked to have created no source.
    refused: bool,
    /// A watcher (`shaper watch`) holds the lease while it runs, at these events a second
    /// and burst; otherwise nobody watches.
    watch: Option<(u32, u32)>,
}

/// Switches the sampling of refused frames (`shaper watch`) of a loaded object on, as a
/// watcher's lease would (never running out), with a fresh meter, or off.
fn set_watch(ebpf: &mut Ebpf, watch: Option<(u32, u32)>) -> Result<()> {
    let map = ebpf.map_mut(MAP_WATCH).context("no watch map")?;
    let mut array: Array<&mut MapData, Watch> = Array::try_from(map)?;
    let control = match watch {
        Some((rate, burst)) => Watch {
            until: u64::MAX,
            limit: Limit::new(8 * u64::from(rate), u64::from(burst))
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            events_per_sec: rate,
            burst,
            ..Watch::default()
        },
        None => Watch::default(),
    };
    array.set(WATCH_METER, Watch::default(), 0)?;
    array.set(WATCH_CONTROL, control, 0)?;
    Ok(())
}

/// Prefix policies covering the sources of the policy cases, all with open limits so
/// every frame passes: a per-source limit, the same with an aggregate, an exemption.
const POLICY_PREFIXES: [&str; 3] = ["198.18.1.0/24", "198.18.2.0/24", "198.18.3.0/24"];

/// An object of `build` open to all, with the prefix policies of [`POLICY_PREFIXES`] and
/// its maps taken into a [`PolicyTable`].
fn policied(build: &Build, max_sources: u32) -> Result<(Ebpf, PolicyTable)> {
    let mut ebpf = open(build.load(single_rate(max_sources))?)?;
    let mut table = PolicyTable::take(&mut ebpf)?;
    let open = PolicyLimits {
        action: ACTION_LIMIT,
        rate_bps: MAX_RATE_BPS,
        burst_bytes: 1 << 40,
        ..PolicyLimits::default()
    };
    let with_aggregate = PolicyLimits {
        aggregate_rate_bps: MAX_RATE_BPS,
        aggregate_burst_bytes: 1 << 40,
        ..open
    };
    let exempt = PolicyLimits {
        action: ACTION_PASS,
        ..PolicyLimits::default()
    };
    let specs: Vec<PolicySpec> = POLICY_PREFIXES
        .iter()
        .zip([open, with_aggregate, exempt])
        .map(|(prefix, limits)| {
            Ok(PolicySpec {
                prefix: parse_prefix(prefix)?,
                limits,
            })
        })
        .collect::<Result<_>>()?;
    table.replace_all(&specs)?;
    Ok((ebpf, table))
}

/// Which object and program a single-shot case runs, and how its frames are made.
enum Frames {
    /// The same hot frame every time.
    Hot,
    /// Never-seen sources.
    Fresh,
    /// Existing keys of a population, in shuffled order.
    Cold(usize),
    /// Keys of the full map the refused newcomers meet, at random: the known-source
    /// pass those are compared with.
    Full,
}

struct SingleCase {
    id: &'static str,
    name: &'static str,
    target: Target,
    frames: Frames,
    tracked: Option<u32>,
    /// Settings and default policy (of [`Target::Main`] and [`Target::Policied`]).
    config: Config,
    /// As [`LoopCase::refused`]; frames admitted anyway are counted in the note.
    refused: bool,
}

#[derive(Clone, Copy)]
enum Target {
    Main,
    /// Like the main object, with admission.
    Admit,
    /// Full maps of the default size, without and with prefix policies ([`policied`]).
    Refusing,
    RefusingPolicied,
    Evict,
    Population(usize),
}

/// One build's objects, each loaded and configured for its cases.
struct Rig<'a> {
    build: &'a Build,
    main: Ebpf,
    evict: Ebpf,
    with_policies: Ebpf,
    table: PolicyTable,
    refusing_plain: Ebpf,
    refusing_policied: Ebpf,
    refusing_table: PolicyTable,
    admit: Ebpf,
    populations: &'a mut [Population],
}

/// The refused newcomers' maps: the product's default size, full (as a flood finds them),
/// with keys no measured frame uses (10.0.0.0/8). Refused frames insert nothing.
const FULL_BASE: u32 = 0x0A00_0000;

impl<'a> Rig<'a> {
    /// `main_entries`: the size of the maps new sources go into, big enough that no
    /// new-source frame of any run evicts anything.
    fn new(subject: Subject<'a>, main_entries: u32) -> Result<Self> {
        let build = subject.build;
        let load_open = |max| open(build.load(single_rate(max))?);
        let mut evict = load_open(EVICTION_MAP_ENTRIES)?;
        // Full before the first measurement, with keys no measured frame uses
        // (172.16.0.0/12).
        prefill(
            &mut evict,
            (0..EVICTION_MAP_ENTRIES).map(|i| Ipv4Addr::from(0xAC10_0000 + i)),
        )?;
        let (with_policies, table) = policied(build, 1024)?;
        let full = || (0..DEFAULT_MAX_SOURCES).map(|i| Ipv4Addr::from(FULL_BASE + i));
        let mut refusing_plain = load_open(DEFAULT_MAX_SOURCES)?;
        prefill(&mut refusing_plain, full())?;
        let (mut refusing_policied, refusing_table) = policied(build, DEFAULT_MAX_SOURCES)?;
        prefill(&mut refusing_policied, full())?;
        Ok(Rig {
            build,
            // The second meter's maps as big, as where a policy has one: the colour rows
            // run here (a key without one never looks into them).
            main: open(build.load(Sizes::full(main_entries))?)?,
            evict,
            with_policies,
            table,
            refusing_plain,
            refusing_policied,
            refusing_table,
            // The admitted newcomers' map: as big as the main one, for the same reason.
            admit: load_open(main_entries)?,
            populations: subject.populations,
        })
    }

    /// The main object configured with `config` (the second meter's rows).
    fn main_with(&mut self, config: &Config) -> Result<&mut Ebpf> {
        object::configure(&mut self.main, config)?;
        Ok(&mut self.main)
    }

    /// The object a loop case runs on, configured for it.
    fn looped(&mut self, c: &LoopCase) -> Result<&mut Ebpf> {
        Ok(if c.policied {
            self.table.set_config(&c.config)?;
            &mut self.with_policies
        } else {
            object::configure(&mut self.main, &c.config)?;
            &mut self.main
        })
    }

    /// The object a single-shot case runs on, configured with `config` where its settings
    /// are the case's.
    fn target(&mut self, target: Target, config: Option<&Config>) -> Result<&mut Ebpf> {
        Ok(match (target, config) {
            (Target::Main, Some(c)) => {
                object::configure(&mut self.main, c)?;
                &mut self.main
            }
            (Target::Admit, Some(c)) => {
                object::configure(&mut self.admit, c)?;
                &mut self.admit
            }
            (Target::Refusing, Some(c)) => {
                object::configure(&mut self.refusing_plain, c)?;
                &mut self.refusing_plain
            }
            (Target::RefusingPolicied, Some(c)) => {
                self.refusing_table.set_config(c)?;
                &mut self.refusing_policied
            }
            (Target::Main, None) => &mut self.main,
            (Target::Admit, None) => &mut self.admit,
            (Target::Refusing, None) => &mut self.refusing_plain,
            (Target::RefusingPolicied, None) => &mut self.refusing_policied,
            (Target::Evict, _) => &mut self.evict,
            (Target::Population(i), _) => &mut self.populations[i].ebpf,
        })
    }
}

/// A build to measure, and its filled maps for the cold-key cases (none: no such case).
pub struct Subject<'a> {
    pub build: &'a Build,
    pub populations: &'a mut [Population],
}

/// Measures every per-packet case on `today`, and on `baseline` in the same runs.
/// `populations` are filled maps (1K, 64K, 1M sources) for the cold-key cases; both
/// builds must have the same sizes.
pub fn run(
    opts: &Options,
    today: Subject<'_>,
    baseline: Option<Subject<'_>>,
) -> Result<PerPacketResults> {
    ensure!(opts.runs > 0 && opts.frames > 0 && opts.repeat > 0);
    let shut = config(8, 1514)?; // over the limit after the first frame: one byte per second
    let open = open_config()?;
    // Admission set, with room for every newcomer, or emptied before each measurement.
    let admitting = Config {
        admission: admit_all()?,
        ..open
    };
    let refusing = Config {
        admission: admit_one()?,
        ..open
    };
    let fresh_total = opts.runs * opts.frames;
    let main_entries = u32::try_from(2 * fresh_total + 1024).context("too many frames")?;
    // The baseline first, today's last.
    let mut rigs = Vec::new();
    for subject in baseline.into_iter().chain([today]) {
        rigs.push(Rig::new(subject, main_entries)?);
    }
    let sizes = |r: &Rig<'_>| r.populations.iter().map(|p| p.capacity).collect::<Vec<_>>();
    ensure!(
        rigs.iter().all(|r| sizes(r) == sizes(&rigs[0])),
        "the builds' filled maps differ in size"
    );
    let populations: Vec<(&'static str, &'static str, u32)> = rigs[0]
        .populations
        .iter()
        .map(|p| (p.cold_id(), p.cold_name(), p.capacity))
        .collect();
    // The baselines, from the bench object.
    let mut bench_object = noop()?;

    let hot = frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 11), FRAME_BYTES);
    let case = |id, name, program, frame, config, want, policied| LoopCase {
        id,
        name,
        program,
        frame,
        config,
        want,
        policied,
        refused: false,
        watch: None,
    };
    // A source that never gets a cell (TEST-NET-1, far from every other case's).
    let newcomer = frame::ipv4_udp(Ipv4Addr::new(192, 0, 2, 1), FRAME_BYTES);
    let from = |c: u8| frame::ipv4_udp(Ipv4Addr::new(198, 18, c, 11), FRAME_BYTES);
    let loop_cases = [
        case(
            "noop",
            "no-op XDP program (baseline)",
            PROG_NOOP,
            hot.clone(),
            open,
            XDP_PASS,
            false,
        ),
        case(
            "floor",
            "floor: parse, clock, one LRU lookup, one CAS (second baseline)",
            PROG_FLOOR,
            hot.clone(),
            open,
            XDP_PASS,
            false,
        ),
        case(
            "pass_existing",
            "pass, existing source",
            PROG_XDP,
            hot.clone(),
            open,
            XDP_PASS,
            false,
        ),
        case(
            "pass_existing_v6",
            "pass, existing IPv6 source (its /64)",
            PROG_XDP,
            frame::ipv6_udp(
                Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 0x11),
                Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1),
                FRAME_BYTES - frame::ETH_HLEN - frame::IPV6_HLEN - frame::UDP_HLEN,
            ),
            open,
            XDP_PASS,
            false,
        ),
        case(
            "drop_existing",
            "drop, existing source (nobody watching)",
            PROG_XDP,
            frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 12), 1500),
            shut,
            XDP_DROP,
            false,
        ),
        LoopCase {
            watch: Some((100, 100)),
            ..case(
                "drop_watched",
                "drop, existing source, a watcher sampling 100 events/s",
                PROG_XDP,
                frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 12), 1500),
                shut,
                XDP_DROP,
                false,
            )
        },
        LoopCase {
            watch: Some((MAX_EVENTS_PER_SEC, u32::MAX)),
            ..case(
                "drop_watched_every",
                "drop, existing source, a watcher sampling every frame (ring buffer full \
                 after its first 5461 events: the rest cost the attempt)",
                PROG_XDP,
                frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 12), 1500),
                shut,
                XDP_DROP,
                false,
            )
        },
        LoopCase {
            watch: Some((100, 100)),
            ..case(
                "pass_watched",
                "pass, existing source, a watcher sampling (passed frames are never sampled)",
                PROG_XDP,
                hot.clone(),
                open,
                XDP_PASS,
                false,
            )
        },
        case(
            "not_ipv4",
            "not IPv4, passed untouched",
            PROG_XDP,
            frame::ethernet(frame::ETH_P_ARP, &[0; 46]),
            open,
            XDP_PASS,
            false,
        ),
        case(
            "pass_default_with_policies",
            "pass, existing source under the default policy, prefix policies present",
            PROG_XDP,
            hot.clone(),
            open,
            XDP_PASS,
            true,
        ),
        case(
            "pass_policy",
            "pass, existing source under a prefix policy",
            PROG_XDP,
            from(1),
            open,
            XDP_PASS,
            true,
        ),
        case(
            "pass_policy_aggregate",
            "pass, existing source under a prefix policy with an aggregate",
            PROG_XDP,
            from(2),
            open,
            XDP_PASS,
            true,
        ),
        case(
            "pass_exempt",
            "pass, existing source under an exempt prefix",
            PROG_XDP,
            from(3),
            open,
            XDP_PASS,
            true,
        ),
        LoopCase {
            refused: true,
            ..case(
                "refused_newcomer",
                "refused newcomer: new source, admission cell empty (unadmitted)",
                PROG_XDP,
                newcomer.clone(),
                refusing,
                XDP_PASS,
                false,
            )
        },
        LoopCase {
            refused: true,
            ..case(
                "refused_newcomer_with_policies",
                "refused newcomer, prefix policies present (trie searched)",
                PROG_XDP,
                newcomer,
                refusing,
                XDP_PASS,
                true,
            )
        },
    ];
    let colour_cases = colour::cases()?;
    let mut subscribers = subscriber::Rig::new(FRAME_BYTES)?;
    let mut million = subscriber::Million::new(opts.million)?;
    let mut singles = vec![
        SingleCase {
            id: "noop_single",
            name: "no-op XDP program, single shots (baseline of the single-shot cases)",
            target: Target::Main,
            frames: Frames::Hot,
            tracked: None,
            config: open,
            refused: false,
        },
        SingleCase {
            id: "pass_existing_single",
            name: "pass, existing source, single shots (check against the loop figure)",
            target: Target::Main,
            frames: Frames::Hot,
            tracked: None,
            config: open,
            refused: false,
        },
        SingleCase {
            id: "new_source",
            name: "first packet of a new source (no admission)",
            target: Target::Main,
            frames: Frames::Fresh,
            tracked: None,
            config: open,
            refused: false,
        },
        SingleCase {
            id: "admitted_newcomer",
            name: "admitted newcomer: first packet of a new source, admission with room",
            target: Target::Admit,
            frames: Frames::Fresh,
            tracked: None,
            config: admitting,
            refused: false,
        },
        SingleCase {
            id: "pass_known_in_full_map_single",
            name: "pass, a known source at random in the same full map (their baseline)",
            target: Target::Refusing,
            frames: Frames::Full,
            tracked: Some(DEFAULT_MAX_SOURCES),
            config: refusing,
            refused: false,
        },
        SingleCase {
            id: "refused_newcomer_single",
            name: "refused newcomer, a new source per frame (a flood's frames)",
            target: Target::Refusing,
            frames: Frames::Fresh,
            tracked: Some(DEFAULT_MAX_SOURCES),
            config: refusing,
            refused: true,
        },
        SingleCase {
            id: "refused_newcomer_with_policies_single",
            name: "refused newcomer, a new source per frame, prefix policies present",
            target: Target::RefusingPolicied,
            frames: Frames::Fresh,
            tracked: Some(DEFAULT_MAX_SOURCES),
            config: refusing,
            refused: true,
        },
        SingleCase {
            id: "new_source_evict",
            name: "first packet of a new source into a full map (evicts)",
            target: Target::Evict,
            frames: Frames::Fresh,
            tracked: Some(EVICTION_MAP_ENTRIES),
            config: open,
            refused: false,
        },
    ];
    for (i, &(id, name, capacity)) in populations.iter().enumerate() {
        singles.push(SingleCase {
            id,
            name,
            target: Target::Population(i),
            frames: Frames::Cold(i),
            tracked: Some(capacity),
            config: open,
            refused: false,
        });
    }

    let mut rng = Rng::new(0x5eed);
    let mut fresh = FreshAddrs(0);
    // Per case, per build: one sample per run.
    let per_build = || vec![Vec::with_capacity(opts.runs); rigs.len()];
    let mut loop_samples: Vec<Vec<Vec<f64>>> = loop_cases.iter().map(|_| per_build()).collect();
    let mut single_samples: Vec<Vec<Vec<f64>>> = singles.iter().map(|_| per_build()).collect();
    // Today's build only.
    let mut colour_samples = vec![Vec::with_capacity(opts.runs); colour_cases.len()];
    let mut subscriber_samples = vec![Vec::with_capacity(opts.runs); subscribers.cases().len()];
    let hot_frames = vec![hot.clone(); opts.frames];
    // Of the refused cases' frames, those admitted all the same (the cell refills at one
    // key a second), per case and build.
    let mut admitted_anyway = vec![vec![0; rigs.len()]; singles.len()];
    for run in 0..opts.runs {
        // Which build goes first alternates from run to run.
        let order: Vec<usize> = (0..rigs.len()).map(|i| (i + run) % rigs.len()).collect();
        for (c, samples) in loop_cases.iter().zip(&mut loop_samples) {
            if c.program == PROG_NOOP || c.program == PROG_FLOOR {
                let ns = test_run(&mut bench_object, c.program, &c.frame, opts.repeat, c.want)?;
                samples.iter_mut().for_each(|s| s.push(ns));
                continue;
            }
            for &r in &order {
                let build = rigs[r].build;
                let ebpf = rigs[r].looped(c)?;
                // A refused case's newcomer must stay refused while measured: admission
                // lets one key in a second, so a run held up that long (a loaded host)
                // admits it, and is measured again (its sample never kept), three times
                // at most.
                let mut tries = 0;
                let measured = loop {
                    if c.refused {
                        drain_admission(build, ebpf, &mut fresh)?;
                    }
                    if c.watch.is_some() {
                        set_watch(ebpf, c.watch)?;
                    }
                    let created = build.counters(ebpf)?.new_sources;
                    let measured = test_run(ebpf, c.program, &c.frame, opts.repeat, c.want);
                    if c.watch.is_some() {
                        set_watch(ebpf, None)?;
                    }
                    let measured = measured.with_context(|| build.label.clone())?;
                    if !c.refused || build.counters(ebpf)?.new_sources == created {
                        break measured;
                    }
                    tries += 1;
                    ensure!(
                        tries < 3,
                        "{} ({}): the newcomer was admitted while measured, {tries} runs in a row",
                        c.id,
                        build.label
                    );
                };
                samples[r].push(measured);
            }
        }
        // The second meter's rows, on the object of the single-rate pass, each frame's
        // colour checked (see `colour`); which goes first turns from run to run.
        let today = rigs.last_mut().context("today's build is measured")?;
        for i in 0..colour_cases.len() {
            let i = (i + run) % colour_cases.len();
            let (c, samples) = (&colour_cases[i], &mut colour_samples[i]);
            let ebpf = today.main_with(&c.config)?;
            samples.push(colour::measure(ebpf, c, opts.repeat)?);
        }
        // The subscribers' rows, on an object of their own, today's build only.
        let rows = subscriber_samples.len();
        for i in 0..rows {
            let i = (i + run) % rows;
            subscriber_samples[i].push(subscribers.measure(i, opts.repeat)?);
        }
        million.measure(opts.frames, run)?;
        for ((case, samples), admitted) in singles
            .iter()
            .zip(&mut single_samples)
            .zip(&mut admitted_anyway)
        {
            // The same frames for every build (but a population's keys, each its own).
            let frames: Vec<Vec<u8>> = match case.frames {
                Frames::Hot => hot_frames.clone(),
                Frames::Fresh => fresh.take(opts.frames),
                Frames::Cold(_) => Vec::new(),
                Frames::Full => (0..opts.frames)
                    .map(|_| {
                        let i = rng.below(DEFAULT_MAX_SOURCES as usize) as u32;
                        frame::ipv4_udp(Ipv4Addr::from(FULL_BASE + i), FRAME_BYTES)
                    })
                    .collect(),
            };
            if case.id == "noop_single" {
                let ns = single_shot(&mut bench_object, PROG_NOOP, &frames)?;
                samples.iter_mut().for_each(|s| s.push(ns));
                continue;
            }
            for &r in &order {
                let cold;
                let frames = match case.frames {
                    Frames::Cold(i) => {
                        cold = rigs[r].populations[i].sample_frames(
                            &mut rng,
                            opts.frames,
                            FRAME_BYTES,
                        );
                        &cold
                    }
                    _ => &frames,
                };
                let build = rigs[r].build;
                let ebpf = rigs[r].target(case.target, Some(&case.config))?;
                if case.refused {
                    drain_admission(build, ebpf, &mut fresh)?;
                }
                let created = build.counters(ebpf)?.new_sources;
                samples[r].push(
                    single_shot(ebpf, PROG_XDP, frames).with_context(|| build.label.clone())?,
                );
                if case.refused {
                    admitted[r] += build.counters(ebpf)?.new_sources - created;
                }
            }
        }
    }

    let mut per_build = Vec::new();
    for (r, rig) in rigs.iter_mut().enumerate() {
        let loops: Vec<&[f64]> = loop_samples.iter().map(|s| s[r].as_slice()).collect();
        let singles_r: Vec<&[f64]> = single_samples.iter().map(|s| s[r].as_slice()).collect();
        let admitted: Vec<u64> = admitted_anyway.iter().map(|a| a[r]).collect();
        let cases = results(
            opts,
            &loop_cases,
            &loops,
            &singles,
            &singles_r,
            &admitted,
            rig,
        )?;
        // The eviction case must have evicted: the map never grows past its size, so every
        // new source beyond it replaced an older one.
        let created = rig.build.counters(&rig.evict)?.new_sources;
        ensure!(
            created as usize == fresh_total,
            "eviction case ({}): {created} sources created of {fresh_total} frames",
            rig.build.label
        );
        per_build.push(cases);
    }
    let mut cases = per_build.pop().context("today's build is measured")?;
    // The no-op's and the floor's samples, the same for every build.
    let (noop_runs, floor_runs) = (&loop_samples[0][0], &loop_samples[1][0]);
    for (c, runs) in colour_cases.iter().zip(&colour_samples) {
        cases.push(loop_result(opts, c.id, c.name, runs, noop_runs, floor_runs));
    }
    subscribers.check(opts.repeat, opts.runs)?;
    for (c, runs) in subscribers.cases().iter().zip(&subscriber_samples) {
        cases.push(loop_result(opts, c.id, c.name, runs, noop_runs, floor_runs));
    }
    let subscriber = subscriber::results(
        subscribers.cases(),
        &subscriber_samples,
        Some(million.results(opts.frames)?),
    )?;
    let single_rate = cases
        .iter()
        .find(|c| c.id == "pass_existing")
        .context("the single-rate pass is measured")?;
    let colour = colour::results(
        &single_rate.ns_per_packet_runs,
        &colour_cases,
        &colour_samples,
    );
    let baseline = match (per_build.pop(), rigs.first()) {
        (Some(base), Some(rig)) => Some(BaselineResults {
            label: rig.build.label.clone(),
            commit: rig.build.commit.clone().unwrap_or_default(),
            versus: versus(&base, &cases),
            cases: base,
        }),
        _ => None,
    };
    Ok(PerPacketResults {
        repeat: opts.repeat,
        runs: opts.runs,
        frames_per_run: opts.frames,
        eviction_map_entries: EVICTION_MAP_ENTRIES,
        cases,
        baseline,
        baseline_missing: None,
        colour,
        subscriber: Some(subscriber),
    })
}

/// Each case of one build from its samples (one per run; the loop no-op's first, and the
/// single-shot no-op's).
fn results(
    opts: &Options,
    loop_cases: &[LoopCase],
    loop_samples: &[&[f64]],
    singles: &[SingleCase],
    single_samples: &[&[f64]],
    admitted_anyway: &[u64],
    rig: &mut Rig<'_>,
) -> Result<Vec<CaseResult>> {
    let noop_runs = loop_samples[0];
    let noop_loop = median(noop_runs);
    let floor_loop = median(loop_samples[1]);
    let mut cases: Vec<CaseResult> = loop_cases
        .iter()
        .zip(loop_samples)
        .map(|(c, runs)| loop_result(opts, c.id, c.name, runs, noop_runs, loop_samples[1]))
        .collect();
    let noop_single = single_samples[0];
    for ((case, runs), &admitted) in singles.iter().zip(single_samples).zip(admitted_anyway) {
        let over_runs: Vec<f64> = runs.iter().zip(noop_single).map(|(c, n)| c - n).collect();
        let over = median(&over_runs);
        let ns = noop_loop + over;
        let build = rig.build;
        let untracked = build
            .counters(rig.target(case.target, None)?)?
            .untracked_packets;
        let mut notes = Vec::new();
        if untracked > 0 {
            notes.push(format!(
                "{untracked} packets found no free map entry and passed unmetered"
            ));
        }
        if admitted > 0 {
            notes.push(format!(
                "{admitted} of {} frames were admitted all the same (admission refills at 1 key/s)",
                opts.runs * opts.frames
            ));
        }
        cases.push(CaseResult {
            id: case.id,
            case: case.name,
            method: Method::Single,
            packets_per_run: opts.frames as u64,
            tracked_sources: case.tracked,
            measured_ns_median: median(runs),
            measured_ns_runs: runs.to_vec(),
            over_noop_ns: over,
            ns_per_packet: ns,
            ratio_to_noop: ns / noop_loop,
            ratio_to_floor: ns / floor_loop,
            ns_per_packet_runs: noop_runs
                .iter()
                .zip(&over_runs)
                .map(|(n, o)| n + o)
                .collect(),
            packets_per_sec: 1e9 / ns,
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        });
    }
    Ok(cases)
}

/// A loop case's result from its samples and the no-op's and the floor's of the same runs.
fn loop_result(
    opts: &Options,
    id: &'static str,
    case: &'static str,
    runs: &[f64],
    noop_runs: &[f64],
    floor_runs: &[f64],
) -> CaseResult {
    let over: Vec<f64> = runs.iter().zip(noop_runs).map(|(c, n)| c - n).collect();
    let ns = median(runs);
    CaseResult {
        id,
        case,
        method: Method::Loop,
        packets_per_run: opts.repeat.into(),
        tracked_sources: None,
        measured_ns_median: ns,
        measured_ns_runs: runs.to_vec(),
        over_noop_ns: median(&over),
        ns_per_packet: ns,
        ratio_to_noop: ns / median(noop_runs),
        ratio_to_floor: ns / median(floor_runs),
        ns_per_packet_runs: runs.to_vec(),
        packets_per_sec: 1e9 / ns,
        note: None,
    }
}

/// Every case of both builds but the shared baselines, side by side, in today's order.
fn versus(baseline: &[CaseResult], today: &[CaseResult]) -> Vec<Versus> {
    today
        .iter()
        .filter(|t| !SHARED.contains(&t.id))
        .filter_map(|t| {
            let b = baseline.iter().find(|b| b.id == t.id)?;
            let (b_ns, t_ns) = (
                Summary::of(b.ns_per_packet_runs.clone()),
                Summary::of(t.ns_per_packet_runs.clone()),
            );
            Some(Versus {
                id: t.id,
                case: t.case,
                ratio: t_ns.ratio_to(&b_ns),
                baseline_ns: b_ns,
                today_ns: t_ns,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(id: &'static str, runs: &[f64]) -> CaseResult {
        CaseResult {
            id,
            case: id,
            method: Method::Loop,
            packets_per_run: 1,
            tracked_sources: None,
            measured_ns_median: median(runs),
            measured_ns_runs: runs.to_vec(),
            over_noop_ns: 0.0,
            ns_per_packet: median(runs),
            ratio_to_noop: 1.0,
            ratio_to_floor: 1.0,
            ns_per_packet_runs: runs.to_vec(),
            packets_per_sec: 1.0,
            note: None,
        }
    }

    /// Rows pair the builds' runs (today / baseline, run by run), leave out the shared
    /// baselines, and keep today's order.
    #[test]
    fn versus_pairs_runs_in_todays_order() {
        let baseline = [
            case("noop", &[10.0, 10.0]),
            case("drop_existing", &[40.0, 80.0]),
            case("pass_existing", &[50.0, 100.0]),
        ];
        let today = [
            case("noop", &[10.0, 10.0]),
            case("pass_existing", &[25.0, 100.0]),
            case("drop_existing", &[40.0, 40.0]),
            case("new_in_today", &[1.0, 1.0]),
        ];
        let rows = versus(&baseline, &today);
        let ids: Vec<&str> = rows.iter().map(|v| v.id).collect();
        assert_eq!(ids, ["pass_existing", "drop_existing"]);
        assert_eq!(rows[0].ratio.runs, [0.5, 1.0]);
        assert_eq!(rows[1].ratio.runs, [1.0, 0.5]);
        assert_eq!(
            (rows[1].baseline_ns.median, rows[1].today_ns.median),
            (60.0, 40.0)
        );
    }
}
