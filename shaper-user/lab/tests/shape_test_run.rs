//! Shape mode's decisions on the departure stamps themselves: the tc program run on frames
//! through BPF_PROG_TEST_RUN, its `__sk_buff` read back (the departure time it wrote in
//! `tstamp`) and its frame (the CE mark). No qdisc and no clock but the kernel's: frames
//! within the burst leave at once (no stamp); the others are stamped one frame's cost
//! apart, exactly; none is stamped beyond the horizon, and one that would be is dropped
//! and not charged; ECN-capable frames held past the threshold are marked CE (their
//! checksum right), others are not; the counters count each of them. The bounds use the
//! clock read just before and after each run, so however slow the machine (an emulated
//! guest), nothing depends on how fast it is. (live_shape.rs has TCP through sch_fq.)

use std::net::{Ipv4Addr, Ipv6Addr};

use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions};
use shaper_common::{
    config::PolicyLimits,
    gcra::{MIN_RATE_BPS, TICK_SHIFT},
    maps::{ACTION_LIMIT, Config, MODE_SHAPE, Shape, TC_MODE_TCX},
    shape::{DELAY_BUCKETS, delay_bucket},
};
use shaper_lab::{frame, testrun};
use shaper_user::{
    object,
    policy::{PolicySpec, PolicyTable, parse_prefix},
};

/// `TC_ACT_UNSPEC` and `TC_ACT_SHOT`.
const TC_ACT_UNSPEC: i32 = -1;
const TC_ACT_SHOT: i32 = 2;
/// `struct __sk_buff` (uapi/linux/bpf.h): its size and where `tstamp` and `gso_segs` are.
const SKB_SIZE: usize = 192;
const TSTAMP_AT: usize = 152;
const GSO_SEGS_AT: usize = 164;

/// A 1000-byte frame costs 10 ms at 800 kbit/s: far longer than a test run takes, even
/// emulated, so the frames sent back to back queue up.
const RATE_BPS: u64 = 800_000;
const FRAME: usize = 1000;
const COST_NS: u64 = 10_000_000;
const BURST: u64 = 5 * FRAME as u64;
const ECN_THRESHOLD_NS: u64 = 95_000_000;
const HORIZON_NS: u64 = 200_000_000;

/// What became of one frame.
struct Run {
    verdict: i32,
    /// The stamp the program left (0: none, the frame leaves at once).
    tstamp: u64,
    /// The ECN field of the frame it passed on, and whether its checksum held.
    ecn: (u8, bool),
    /// CLOCK_MONOTONIC (the program's clock) just before and just after the run.
    before: u64,
    after: u64,
    ecn_capable: bool,
}

fn run(prog: &SchedClassifier, frame: &[u8], ecn_capable: bool) -> Run {
    run_stamped(prog, frame, ecn_capable, 0)
}

/// [`run`] on a packet that comes with a departure time `tstamp` already (TCP pacing's,
/// or another program's).
fn run_stamped(prog: &SchedClassifier, frame: &[u8], ecn_capable: bool, tstamp: u64) -> Run {
    let mut ctx_in = [0u8; SKB_SIZE];
    ctx_in[GSO_SEGS_AT..GSO_SEGS_AT + 4].copy_from_slice(&1u32.to_ne_bytes());
    ctx_in[TSTAMP_AT..TSTAMP_AT + 8].copy_from_slice(&tstamp.to_ne_bytes());
    let mut ctx_out = [0u8; SKB_SIZE];
    let mut data_out = vec![0u8; frame.len()];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(&mut data_out);
    opts.ctx_in = Some(&ctx_in);
    opts.ctx_out = Some(&mut ctx_out);
    let before = monotonic_ns();
    let result = prog
        .test_run(opts)
        .expect("BPF_PROG_TEST_RUN of the tc program");
    let after = monotonic_ns();
    Run {
        verdict: result.return_value as i32,
        tstamp: u64::from_ne_bytes(ctx_out[TSTAMP_AT..TSTAMP_AT + 8].try_into().unwrap()),
        ecn: frame::ecn_of(&data_out),
        before,
        after,
        ecn_capable,
    }
}

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn departure_stamps_are_the_rate_within_the_horizon_and_marks_past_the_threshold() {
    departures(Family::V4, Shaper::Default);
    departures(Family::V6, Shaper::Default);
}

/// The same stamps, marks and horizon drops when a prefix policy in shape mode holds its
/// own keys while the interface's default polices (at 8 bit/s: a default key sending
/// alongside gets its burst and nothing more, dropped, never stamped); the policy's own
/// counters count its frames exactly.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_shaping_prefix_policy_stamps_marks_and_drops_its_own_frames_while_the_default_polices() {
    departures(Family::V4, Shaper::Policy);
    departures(Family::V6, Shaper::Policy);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Family {
    V4,
    V6,
}

/// What shapes the frames: the interface's default, or a prefix policy over them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shaper {
    Default,
    Policy,
}

/// A `FRAME`-byte UDP frame from `src` (a /64 of its own when IPv6).
fn frame_of(family: Family, host: u16) -> Vec<u8> {
    match family {
        Family::V4 => frame::ipv4_udp(Ipv4Addr::new(198, 18, (host >> 8) as u8, host as u8), FRAME),
        Family::V6 => {
            let src = Ipv6Addr::new(0x2001, 0xdb8, host >> 8, host & 0xff, 0, 0, 0, 1);
            let payload = FRAME - frame::ETH_HLEN - frame::IPV6_HLEN - frame::UDP_HLEN;
            frame::ipv6_udp(src, frame::DEFAULT_DST_V6, payload)
        }
    }
}

fn departures(family: Family, shaper: Shaper) {
    let case = format!("{family:?}, shaped by the {shaper:?}");
    let mut ebpf = object::load(object::Sizes::full(1024)).unwrap();
    object::tc_program(&mut ebpf).unwrap();
    let mut table = PolicyTable::take(&mut ebpf).unwrap();
    let shaping = Config::per_source(RATE_BPS, BURST).unwrap();
    let mut config = match shaper {
        Shaper::Default => Config {
            mode: MODE_SHAPE,
            ..shaping
        },
        // The default polices, at the slowest rate there is: its burst, then nothing.
        Shaper::Policy => Config::per_source(MIN_RATE_BPS, BURST).unwrap(),
    };
    config.xdp_mode = TC_MODE_TCX;
    config.shape = Shape::new(ECN_THRESHOLD_NS, HORIZON_NS).unwrap();
    table.set_config(&config).unwrap();
    // The shaped key is host 21 of 198.18.0.0/24 or 2001:db8:0:21::/64 (the policy's
    // prefix); the default's key host 0x121, outside it.
    let slot = if shaper == Shaper::Policy {
        let prefix = match family {
            Family::V4 => "198.18.0.0/24",
            Family::V6 => "2001:db8::/56",
        };
        let limits = PolicyLimits {
            action: ACTION_LIMIT,
            mode: MODE_SHAPE,
            rate_bps: RATE_BPS,
            burst_bytes: BURST,
            ..PolicyLimits::default()
        };
        let prefix = parse_prefix(prefix).unwrap();
        table.replace_all(&[PolicySpec { prefix, limits }]).unwrap();
        table.list().unwrap()[0].slot
    } else {
        0
    };
    let prog: &SchedClassifier = ebpf
        .program(shaper_common::maps::PROG_TC)
        .unwrap()
        .try_into()
        .unwrap();
    let plain = frame_of(family, 0x21);
    let ect0 = frame::with_ecn(&plain, 2);
    let default_key = frame_of(family, 0x121);
    assert_eq!(
        shaping.limit.cost(FRAME as u32, 0) >> TICK_SHIFT,
        COST_NS,
        "the cost of a frame"
    );

    let mut runs: Vec<Run> = Vec::new();
    let seen = |runs: &[Run], what: &dyn Fn(&Run) -> bool| runs.iter().filter(|r| what(r)).count();
    let dropped = |r: &Run| r.verdict == TC_ACT_SHOT;
    let marked = |r: &Run| r.ecn.0 == 3;
    let held_unmarked = |r: &Run| r.tstamp != 0 && r.ecn_capable && !marked(r);
    let held_not_ect = |r: &Run| r.tstamp != 0 && !r.ecn_capable;
    let mut defaults: Vec<Run> = Vec::new();
    for i in 0..2000 {
        let ecn_capable = i % 2 == 0;
        runs.push(run(
            prog,
            if ecn_capable { &ect0 } else { &plain },
            ecn_capable,
        ));
        if shaper == Shaper::Policy {
            defaults.push(run(prog, &default_key, false));
        }
        if [
            seen(&runs, &dropped),
            seen(&runs, &marked),
            seen(&runs, &held_unmarked),
            seen(&runs, &held_not_ect),
        ]
        .iter()
        .all(|&n| n >= 3)
        {
            break;
        }
    }
    let counters = testrun::counters(&ebpf).unwrap();
    println!(
        "{case}: {} frames: {} left at once, {} held ({} marked), {} dropped; counters: shaped {}, CE {}, dropped {}, delays {:?}",
        runs.len(),
        runs.iter()
            .filter(|r| r.verdict == TC_ACT_UNSPEC && r.tstamp == 0)
            .count(),
        runs.iter().filter(|r| r.tstamp != 0).count(),
        seen(&runs, &marked),
        seen(&runs, &dropped),
        counters.shaped_packets,
        counters.ce_marked_packets,
        counters.outcomes.dropped_packets,
        counters.shape_delay,
    );
    for (what, n) in [
        ("dropped", seen(&runs, &dropped)),
        ("marked CE", seen(&runs, &marked)),
        ("held, ECN-capable, unmarked", seen(&runs, &held_unmarked)),
        ("held, not ECN-capable", seen(&runs, &held_not_ect)),
    ] {
        assert!(n >= 3, "{case}: only {n} frames {what} of {}", runs.len());
    }

    // The burst leaves at once, unstamped: the first frames, and only they; and as many
    // more as the rate refilled while they were sent (none on a fast machine, where they
    // take microseconds; under emulation a frame's 10 ms can pass within the burst).
    let at_once = runs.iter().take_while(|r| r.tstamp == 0).count();
    let burst_frames = (BURST as usize).div_ceil(FRAME);
    let refilled = runs[at_once.max(1) - 1]
        .after
        .saturating_sub(runs[0].before)
        / COST_NS;
    assert!(
        (burst_frames..=burst_frames + refilled as usize).contains(&at_once),
        "frames left at once: {at_once}, the burst's {burst_frames} and at most {refilled} refilled"
    );
    let mut last: Option<u64> = None;
    for (i, r) in runs.iter().enumerate() {
        assert!(
            r.verdict == TC_ACT_UNSPEC || r.verdict == TC_ACT_SHOT,
            "frame {i}: verdict {}",
            r.verdict
        );
        // The checksum holds, marked or not; only an ECN-capable frame is marked.
        assert!(r.ecn.1, "{case}: frame {i}: IPv4 checksum broken");
        assert!(
            r.ecn_capable || r.ecn.0 == 0,
            "frame {i}: ECN field {}",
            r.ecn.0
        );
        if i < at_once {
            assert_eq!(r.verdict, TC_ACT_UNSPEC);
            continue;
        }
        if dropped(r) {
            // Dropped only because it would leave beyond the horizon, from where the last
            // frame left (a drop charges nothing).
            let would = last.expect("a frame held before") + COST_NS;
            assert!(
                would > r.before + HORIZON_NS,
                "frame {i} dropped, but it could leave {} ns after it was sent",
                would.saturating_sub(r.before)
            );
            assert_eq!(r.tstamp, 0, "frame {i}: dropped and stamped");
            continue;
        }
        // Held: exactly one frame's cost after the one before (±1 ns of rounding), the
        // first one after the burst's.
        assert_ne!(r.tstamp, 0, "frame {i} passed late without a stamp");
        if let Some(last) = last {
            assert!(
                r.tstamp.abs_diff(last + COST_NS) <= 1,
                "frame {i} stamped {} ns after the last, not {COST_NS}",
                r.tstamp as i64 - last as i64
            );
        }
        last = Some(r.tstamp);
        // Never beyond the horizon.
        assert!(
            r.tstamp <= r.after + HORIZON_NS,
            "frame {i} held {} ns, beyond the horizon",
            r.tstamp - r.after
        );
        // Marked exactly when held past the threshold (the delay is between the stamp
        // less the clock after the run and the stamp less the clock before it).
        if r.ecn_capable {
            if r.tstamp > r.after + ECN_THRESHOLD_NS {
                assert!(marked(r), "frame {i} held past the threshold, unmarked");
            }
            if r.tstamp <= r.before + ECN_THRESHOLD_NS {
                assert!(!marked(r), "frame {i} marked within the threshold");
            }
        }
    }

    // The default's key, beside a shaping policy: its burst passes, the rest is dropped,
    // nothing stamped.
    let burst = (BURST as usize).div_ceil(FRAME);
    for (i, r) in defaults.iter().enumerate() {
        let want = if i < burst {
            TC_ACT_UNSPEC
        } else {
            TC_ACT_SHOT
        };
        assert_eq!(
            (r.verdict, r.tstamp),
            (want, 0),
            "{case}: default frame {i}"
        );
    }
    let default_dropped = defaults.len().saturating_sub(burst) as u64;
    let default_passed = defaults.len() as u64 - default_dropped;

    // The counters count what the frames show.
    let held = runs.iter().filter(|r| r.tstamp != 0).count() as u64;
    let dropped_n = seen(&runs, &dropped) as u64;
    let passed_n = runs.len() as u64 - dropped_n;
    assert_eq!(counters.shaped_packets, held, "{case}");
    assert_eq!(counters.shaped_bytes, held * FRAME as u64, "{case}");
    assert_eq!(counters.ce_marked_packets, seen(&runs, &marked) as u64);
    // Each held frame's delay is its stamp less the kernel's clock during its run: the
    // sum lies between the stamps less the clock after each run and less the clock
    // before it, and the histogram counts each held frame once.
    let delays = |clock: fn(&Run) -> u64| -> u64 {
        runs.iter()
            .filter(|r| r.tstamp != 0)
            .map(|r| r.tstamp.saturating_sub(clock(r)))
            .sum()
    };
    let (least, most) = (delays(|r| r.after), delays(|r| r.before));
    assert!(
        (least..=most).contains(&counters.shape_delay_ns),
        "{case}: delays summed {} ns, not within {least}..={most}",
        counters.shape_delay_ns
    );
    assert_eq!(counters.shape_delay.iter().sum::<u64>(), held, "{case}");
    assert_eq!(
        counters.outcomes.dropped_packets,
        dropped_n + default_dropped,
        "{case}"
    );
    assert_eq!(
        counters.outcomes.passed_packets,
        passed_n + default_passed,
        "{case}"
    );
    let frames = (runs.len() + defaults.len()) as u64;
    let by_family = match family {
        Family::V4 => (counters.ipv4_packets, counters.ipv6_packets),
        Family::V6 => (counters.ipv6_packets, counters.ipv4_packets),
    };
    assert_eq!(by_family, (frames, 0), "{case}: frames of the family");
    // The shaping policy's own counters: its key's frames, exactly.
    let stats = table.stats(slot).unwrap();
    assert_eq!(
        (
            stats.outcomes.passed_packets,
            stats.outcomes.dropped_packets
        ),
        (passed_n, dropped_n),
        "{case}: the shaper's own counts"
    );
    assert_eq!(stats.outcomes.would_drop_packets, 0);
    if shaper == Shaper::Policy {
        let d = table.stats(0).unwrap();
        assert_eq!(
            (d.outcomes.passed_packets, d.outcomes.dropped_packets),
            (default_passed, default_dropped),
            "{case}: the default's counts"
        );
    }
    assert_eq!(counters.shape_delay.iter().sum::<u64>(), held);
    // Each delay in its bucket: at most the horizon's, at least the bucket of the
    // shortest delay held.
    let longest = delay_bucket(HORIZON_NS);
    assert!(
        counters.shape_delay[longest + 1..DELAY_BUCKETS]
            .iter()
            .all(|&n| n == 0),
        "delays counted beyond the horizon's bucket: {:?}",
        counters.shape_delay
    );
}

/// CLOCK_MONOTONIC in nanoseconds, as bpf_ktime_get_ns reads it.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A prefix policy in shape mode on an interface that polices: the policy's keys are
/// held (stamped, none dropped within the horizon) past their burst while the default's,
/// and a policing prefix policy's under the same horizon (with an aggregate or without),
/// are dropped, unstamped; and with the interface in monitor mode, which overrides a
/// policy's shaping as it does enforcing, nothing is held or dropped; a frame that comes
/// held until later than its turn (TCP pacing) keeps its time. Both families.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_shaping_prefix_policy_holds_its_keys_while_the_default_polices() {
    use std::net::{IpAddr, Ipv6Addr};

    use shaper_common::{
        config::PolicyLimits,
        maps::{ACTION_LIMIT, MODE_ENFORCE, MODE_MONITOR},
    };
    use shaper_user::policy::{PolicySpec, PolicyTable, parse_prefix};

    let mut ebpf = object::load(object::Sizes::full(1024)).unwrap();
    object::tc_program(&mut ebpf).unwrap();
    let mut table = PolicyTable::take(&mut ebpf).unwrap();
    let mut config = Config::per_source(RATE_BPS, BURST).unwrap();
    config.xdp_mode = TC_MODE_TCX;
    config.shape = Shape::new(ECN_THRESHOLD_NS, HORIZON_NS).unwrap();
    table.set_config(&config).unwrap();
    let shaping = PolicyLimits {
        action: ACTION_LIMIT,
        mode: MODE_SHAPE,
        rate_bps: RATE_BPS,
        burst_bytes: BURST,
        ..PolicyLimits::default()
    };
    // And a prefix policy that polices, under the same horizon.
    let policing = PolicyLimits {
        mode: MODE_ENFORCE,
        ..shaping
    };
    // And one that polices with an aggregate too (room for every key's frames): the
    // frames it passes carry the aggregate's charge, never a departure time.
    let aggregated = PolicyLimits {
        aggregate_rate_bps: 100 * RATE_BPS,
        aggregate_burst_bytes: 100 * BURST,
        ..policing
    };
    let specs: Vec<PolicySpec> = [
        ("198.18.5.0/24", shaping),
        ("2001:db8:5::/48", shaping),
        ("198.18.7.0/24", policing),
        ("2001:db8:7::/48", policing),
        ("198.18.8.0/24", aggregated),
        ("2001:db8:8::/48", aggregated),
    ]
    .iter()
    .map(|&(p, limits)| PolicySpec {
        prefix: parse_prefix(p).unwrap(),
        limits,
    })
    .collect();
    table.replace_all(&specs).unwrap();
    let prog: &SchedClassifier = ebpf
        .program(shaper_common::maps::PROG_TC)
        .unwrap()
        .try_into()
        .unwrap();
    let frame_from = |src: &str| match src.parse::<IpAddr>().unwrap() {
        IpAddr::V4(a) => frame::ipv4_udp(a, FRAME),
        IpAddr::V6(a) => {
            let dst = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
            let payload = FRAME - frame::ETH_HLEN - frame::IPV6_HLEN - frame::UDP_HLEN;
            frame::ipv6_udp(a, dst, payload)
        }
    };
    // 20 frames back to back: the burst's 5, then 15 within the horizon's 20 frames.
    let send = |src: &str| -> (usize, usize) {
        let f = frame_from(src);
        let runs: Vec<Run> = (0..20).map(|_| run(prog, &f, false)).collect();
        (
            runs.iter().filter(|r| r.tstamp != 0).count(),
            runs.iter().filter(|r| r.verdict == TC_ACT_SHOT).count(),
        )
    };
    for (shaped, policed) in [
        ("198.18.5.1", ["198.18.6.1", "198.18.7.1", "198.18.8.1"]),
        (
            "2001:db8:5:1::1",
            ["2001:db8:6:1::1", "2001:db8:7:1::1", "2001:db8:8:1::1"],
        ),
    ] {
        let (held, dropped) = send(shaped);
        assert!(held > 0, "{shaped}: none of 20 frames held");
        assert_eq!(dropped, 0, "{shaped}: dropped within the horizon");
        // A frame already held until later than its turn (TCP pacing) keeps that time.
        let later = monotonic_ns() + 10_000_000_000;
        let r = run_stamped(prog, &frame_from(shaped), false, later);
        assert_eq!(
            (r.verdict, r.tstamp),
            (TC_ACT_UNSPEC, later),
            "{shaped}: paced"
        );
        // The default's key, and the policing policy's.
        for key in policed {
            let (held, dropped) = send(key);
            assert_eq!(held, 0, "{key}: held, not policed");
            assert!(dropped > 0, "{key}: none of 20 frames dropped");
        }
    }
    // The interface monitors: no frame held or dropped, the policy's or the default's.
    config.mode = MODE_MONITOR;
    table.set_config(&config).unwrap();
    for key in [
        "198.18.5.2",
        "198.18.6.2",
        "198.18.7.2",
        "2001:db8:5:2::1",
        "2001:db8:6:2::1",
        "2001:db8:7:2::1",
    ] {
        assert_eq!(send(key), (0, 0), "{key} under a monitoring interface");
    }
}

/// A frame of `len` bytes (its wire length) from `src`, either family.
fn frame_from(src: &str, len: usize) -> Vec<u8> {
    match src.parse::<std::net::IpAddr>().unwrap() {
        std::net::IpAddr::V4(a) => frame::ipv4_udp(a, len),
        std::net::IpAddr::V6(a) => {
            let payload = len - frame::ETH_HLEN - frame::IPV6_HLEN - frame::UDP_HLEN;
            frame::ipv6_udp(a, frame::DEFAULT_DST_V6, payload)
        }
    }
}

/// A subscriber in shape mode (`subscriber set --mode shape`): its IPv4 /32 and its IPv6
/// /56, with frames from two /64s in it, keep one departure schedule, the subscriber's
/// bucket's. A mixed sequence of frames (three keys, two families, four sizes) is checked
/// against a replay of one GCRA bucket. The program's clock is known only between the
/// reads just before and after each run, so the replay keeps the bucket's theoretical
/// arrival time as the range it can be in: a stamp must fall in that range less the
/// burst (and then fixes it to the nanosecond: the rate makes each cost whole
/// nanoseconds, so nothing is rounded), a frame left at once or dropped must be possible
/// for some clock in the run's range. So however slow the machine (an emulated guest
/// stalled between frames lets the bucket drain), nothing depends on its speed, while a
/// second bucket (one per family, per key) stamps a frame outside the range as soon as
/// the bucket is backlogged. Frames within the burst leave unstamped, those past the
/// horizon are dropped and not charged, ECN-capable ones held past the threshold are
/// marked; the subscriber's counters and the plan's count each.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_shaping_subscribers_prefixes_of_both_families_keep_one_departure_schedule() {
    use aya::maps::Array;
    use shaper_common::maps::{MAP_SUBSCRIBERS, Subscriber};
    use shaper_user::subscriber::{Changed, SubscriberSpec, SubscriberTable, plan::PlanParts};

    let mut ebpf = object::load(object::Sizes {
        max_subscribers: 8,
        ..object::Sizes::full(1024)
    })
    .unwrap();
    object::tc_program(&mut ebpf).unwrap();
    let subs: Array<_, Subscriber> = ebpf.take_map(MAP_SUBSCRIBERS).unwrap().try_into().unwrap();
    let mut table = PolicyTable::take(&mut ebpf).unwrap();
    // The default polices, at the slowest rate there is.
    let mut config = Config::per_source(MIN_RATE_BPS, BURST).unwrap();
    config.xdp_mode = TC_MODE_TCX;
    config.shape = Shape::new(ECN_THRESHOLD_NS, HORIZON_NS).unwrap();
    table.set_config(&config).unwrap();
    let spec = SubscriberSpec {
        id: "c1042".to_owned(),
        name: String::new(),
        prefixes: ["100.64.0.14/32", "fdd7:b724:0:100::/56"]
            .iter()
            .map(|p| parse_prefix(p).unwrap())
            .collect(),
        plan: PlanParts {
            rate_bps: RATE_BPS,
            burst_bytes: BURST,
            mode: MODE_SHAPE,
            ..PlanParts::default()
        }
        .limits(),
    };
    let mut subscribers = SubscriberTable::new(
        subs,
        &mut table,
        shaper_user::subscriber::record::Records::anonymous().unwrap(),
    );
    let before = subscribers.before(&spec.id, Some(&spec)).unwrap();
    assert_eq!(subscribers.set(&spec, &before).unwrap(), Changed::Added);
    let prog: &SchedClassifier = ebpf
        .program(shaper_common::maps::PROG_TC)
        .unwrap()
        .try_into()
        .unwrap();

    // 10 µs a byte: a frame's cost in nanoseconds.
    let cost = |len: usize| len as u64 * COST_NS / FRAME as u64;
    let tau = cost(BURST as usize);
    let keys = ["100.64.0.14", "fdd7:b724:0:100::1", "fdd7:b724:0:1ff::1"];
    let sizes = [1000, 400, 1400, 700, 1000];
    let mut runs: Vec<Run> = Vec::new();
    let mut lens = Vec::new();
    let count = |runs: &[Run], what: fn(&Run) -> bool| runs.iter().filter(|r| what(r)).count();
    let is_dropped: fn(&Run) -> bool = |r| r.verdict == TC_ACT_SHOT;
    let is_held: fn(&Run) -> bool = |r| r.tstamp != 0;
    let is_marked: fn(&Run) -> bool = |r| r.ecn.0 == 3;
    for i in 0..2000 {
        let len = sizes[i % sizes.len()];
        let plain = frame_from(keys[i % keys.len()], len);
        let ecn_capable = i % 2 == 0;
        let f = if ecn_capable {
            frame::with_ecn(&plain, 2)
        } else {
            plain
        };
        runs.push(run(prog, &f, ecn_capable));
        lens.push(len);
        // Past the first 80 frames, until each outcome has been seen three times.
        if i >= 80
            && [is_dropped, is_held, is_marked]
                .iter()
                .all(|&w| count(&runs, w) >= 3)
        {
            break;
        }
    }

    // The replay: the bucket's theoretical arrival time is within `lo..=hi` (a new
    // bucket's is in the past: the first frame's clock).
    let (mut lo, mut hi) = (0u64, 0u64);
    for (i, r) in runs.iter().enumerate() {
        let case = format!(
            "frame {i} ({} bytes from {})",
            lens[i],
            keys[i % keys.len()]
        );
        let c = cost(lens[i]);
        // With this frame charged: the earliest TAT (clock `before`, TAT `lo`) and the
        // latest (clock `after`, TAT `hi`).
        let (earliest, latest) = (lo.max(r.before) + c, hi.max(r.after) + c);
        if is_dropped(r) {
            // Dropped only if, for some clock in the run, it would leave past the horizon.
            assert!(
                hi.max(r.before) + c > r.before + tau + HORIZON_NS,
                "{case}: dropped, though it could leave {} ns after it was sent",
                (hi.max(r.before) + c - tau).saturating_sub(r.before)
            );
            assert_eq!(r.tstamp, 0, "{case}: dropped and stamped");
            continue;
        }
        assert_eq!(r.verdict, TC_ACT_UNSPEC, "{case}");
        assert!(
            lo.max(r.after) + c <= r.after + tau + HORIZON_NS,
            "{case}: passed, though it would leave {} ns past the horizon",
            lo.max(r.after) + c - tau - r.after - HORIZON_NS
        );
        if !is_held(r) {
            // Left at once: within the burst for some clock in the run (the latest is
            // the likeliest).
            let soonest = lo.max(r.after) + c;
            assert!(
                soonest <= r.after + tau,
                "{case}: left at once, {} ns past the burst",
                soonest - r.after - tau
            );
            (lo, hi) = (earliest, latest.min(r.after + tau));
            continue;
        }
        let tat = r.tstamp + tau;
        assert!(
            (earliest..=latest).contains(&tat),
            "{case}: stamped {}, not within the replay's {}..={}",
            r.tstamp,
            earliest - tau,
            latest - tau
        );
        assert!(r.tstamp > r.before, "{case}: stamped in the past");
        (lo, hi) = (tat, tat);
        assert!(
            r.tstamp <= r.after + HORIZON_NS,
            "{case}: beyond the horizon"
        );
        if r.ecn_capable && r.tstamp > r.after + ECN_THRESHOLD_NS {
            assert!(is_marked(r), "{case}: held past the threshold, unmarked");
        }
        if !r.ecn_capable || r.tstamp <= r.before + ECN_THRESHOLD_NS {
            assert!(!is_marked(r), "{case}: marked");
        }
        assert!(r.ecn.1, "{case}: IPv4 checksum broken");
    }
    let (held, marked, dropped) = (
        count(&runs, is_held) as u64,
        count(&runs, is_marked) as u64,
        count(&runs, is_dropped) as u64,
    );
    for (what, n) in [("held", held), ("marked", marked), ("dropped", dropped)] {
        assert!(n >= 3, "only {n} of {} frames {what}", runs.len());
    }

    // The counters: the subscriber's, the plan's, the interface's.
    let passed_bytes: u64 = (0..runs.len())
        .filter(|&i| !is_dropped(&runs[i]))
        .map(|i| lens[i] as u64)
        .sum();
    let n = runs.len() as u64;
    let got = subscribers.get("c1042").unwrap();
    drop(subscribers);
    assert_eq!(
        (
            got.outcomes.passed_packets,
            got.outcomes.passed_bytes,
            got.outcomes.dropped_packets
        ),
        (n - dropped, passed_bytes, dropped)
    );
    let stats = table.stats(got.plan_slot).unwrap();
    assert_eq!(
        (
            stats.outcomes.passed_packets,
            stats.outcomes.dropped_packets
        ),
        (n - dropped, dropped)
    );
    let counters = testrun::counters(&ebpf).unwrap();
    assert_eq!(counters.shaped_packets, held);
    assert_eq!(counters.ce_marked_packets, marked);
    assert_eq!(counters.shape_delay.iter().sum::<u64>(), held);
    assert_eq!(
        (counters.ipv4_packets, counters.ipv6_packets),
        (n.div_ceil(3), n - n.div_ceil(3))
    );
    println!(
        "{n} frames: {} left at once, {held} held ({marked} marked), {dropped} dropped",
        n - dropped - held
    );
}
