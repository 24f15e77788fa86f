//! Shape mode's decisions on the departure stamps themselves: the tc program run on frames
//! through BPF_PROG_TEST_RUN, its `__sk_buff` read back (the departure time it wrote in
//! `tstamp`) and its frame (the CE mark). No qdisc and no clock but the kernel's: frames
//! within the burst leave at once (no stamp); the others are stamped one frame's cost
//! apart, exactly; none is stamped beyond the horizon, and one that would be is dropped
//! and not charged; ECN-capable frames held past the threshold are marked CE (their
//! checksum right), others are not; the counters count each of them. The bounds use the
//! clock read just before and after each run, so however slow the machine (an emulated
//! guest), nothing depends on how fast it is. (live_shape.rs has TCP through sch_fq.)

use std::net::Ipv4Addr;

use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions};
use shaper_common::{
    gcra::TICK_SHIFT,
    maps::{Config, MODE_SHAPE, Shape, TC_MODE_TCX},
    shape::{DELAY_BUCKETS, delay_bucket},
};
use shaper_lab::{frame, testrun};
use shaper_user::object;

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
    let mut ctx_in = [0u8; SKB_SIZE];
    ctx_in[GSO_SEGS_AT..GSO_SEGS_AT + 4].copy_from_slice(&1u32.to_ne_bytes());
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
    let mut ebpf = object::load(object::Sizes::full(1024)).unwrap();
    object::tc_program(&mut ebpf).unwrap();
    let mut config = Config::per_source(RATE_BPS, BURST).unwrap();
    config.mode = MODE_SHAPE;
    config.xdp_mode = TC_MODE_TCX;
    config.shape = Shape::new(ECN_THRESHOLD_NS, HORIZON_NS).unwrap();
    object::configure(&mut ebpf, &config).unwrap();
    let prog: &SchedClassifier = ebpf
        .program(shaper_common::maps::PROG_TC)
        .unwrap()
        .try_into()
        .unwrap();
    let plain = frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 21), FRAME);
    let ect0 = frame::with_ecn(&plain, 2);
    assert_eq!(
        config.limit.cost(FRAME as u32, 0) >> TICK_SHIFT,
        COST_NS,
        "the cost of a frame"
    );

    // Back to back, ECN-capable and not in turn, until every kind of decision has been
    // seen a few times (a bounded number of frames: a machine too slow to queue any
    // frame fails below).
    let mut runs: Vec<Run> = Vec::new();
    let seen = |runs: &[Run], what: &dyn Fn(&Run) -> bool| runs.iter().filter(|r| what(r)).count();
    let dropped = |r: &Run| r.verdict == TC_ACT_SHOT;
    let marked = |r: &Run| r.ecn.0 == 3;
    let held_unmarked = |r: &Run| r.tstamp != 0 && r.ecn_capable && !marked(r);
    let held_not_ect = |r: &Run| r.tstamp != 0 && !r.ecn_capable;
    for i in 0..2000 {
        let ecn_capable = i % 2 == 0;
        runs.push(run(
            prog,
            if ecn_capable { &ect0 } else { &plain },
            ecn_capable,
        ));
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
        "{} frames: {} left at once, {} held ({} marked), {} dropped; counters: shaped {}, CE {}, dropped {}, delays {:?}",
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
        assert!(n >= 3, "only {n} frames {what} of {}", runs.len());
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
        assert!(r.ecn.1, "frame {i}: IPv4 checksum broken");
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

    // The counters count what the frames show.
    let held = runs.iter().filter(|r| r.tstamp != 0).count() as u64;
    assert_eq!(counters.shaped_packets, held);
    assert_eq!(counters.shaped_bytes, held * FRAME as u64);
    assert_eq!(counters.ce_marked_packets, seen(&runs, &marked) as u64);
    assert_eq!(
        counters.outcomes.dropped_packets,
        seen(&runs, &dropped) as u64
    );
    assert_eq!(
        counters.outcomes.passed_packets,
        (runs.len() - seen(&runs, &dropped)) as u64
    );
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
/// and a policing prefix policy's under the same horizon, are dropped, unstamped; and with the interface in monitor mode, which overrides a
/// policy's shaping as it does enforcing, nothing is held or dropped. Both families.
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
    let specs: Vec<PolicySpec> = [
        ("198.18.5.0/24", shaping),
        ("2001:db8:5::/48", shaping),
        ("198.18.7.0/24", policing),
        ("2001:db8:7::/48", policing),
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
        ("198.18.5.1", ["198.18.6.1", "198.18.7.1"]),
        ("2001:db8:5:1::1", ["2001:db8:6:1::1", "2001:db8:7:1::1"]),
    ] {
        let (held, dropped) = send(shaped);
        assert!(held > 0, "{shaped}: none of 20 frames held");
        assert_eq!(dropped, 0, "{shaped}: dropped within the horizon");
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
