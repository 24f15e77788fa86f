//! One key driven from every CPU at once through BPF_PROG_TEST_RUN (a thread pinned to
//! each CPU; test_run runs the program on the calling CPU): every CPU meters the same
//! cell with compare-and-swap, so together they pass no more than one bucket allows, rate
//! × elapsed + burst, plus at most one frame per CPU in flight; a CAS lost on every retry
//! is counted, and the cell is never corrupted. The counters say on which try each
//! charge won its compare-and-swap; a busy bucket (every frame conforms, so every frame
//! writes the cell) shows that no charge is lost between CPUs, which a plain store would.
//! And live: one source's traffic sent from every CPU over a veth with a queue per CPU,
//! so the attached program meters it on every CPU at once.

use std::{
    net::Ipv4Addr,
    sync::Barrier,
    thread,
    time::{Duration, Instant},
};

use aya::maps::{Map, MapData, PerCpuArray};
use aya::programs::{TestRun as _, TestRunOptions};
use shaper_common::maps::PIN_COUNTERS;
use shaper_common::{
    gcra::ticks_from_ns,
    maps::{Config, Counters},
};
use shaper_lab::{
    bench::lru::{online_cpus, pin_to_cpu},
    bins,
    cli::{self, AttachGuard},
    frame,
    lab::{Flow, Lab, LabOptions, RunOptions, run_udp_with},
    testrun::{Harness, XDP_DROP, XDP_PASS},
};
use shaper_user::pins::Attachment;

const RATE_BPS: u64 = 8_000_000;
const BURST: u64 = 65_536;
const FRAME: usize = 1000;
/// How long every CPU sends.
const RUN: Duration = Duration::from_millis(500);

#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn one_key_from_every_cpu_gets_one_bucket() {
    let config = Config::per_source(RATE_BPS, BURST).unwrap();
    let h = Harness::new(Some(&config), 1024).unwrap();
    let prog = h.program().unwrap();
    let cpus = online_cpus();
    let src = Ipv4Addr::new(198, 18, 0, 7);
    let f = frame::ipv4_udp(src, FRAME);
    let barrier = Barrier::new(cpus);
    let start = Instant::now();
    let per_cpu: Vec<(u64, u64)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..cpus)
            .map(|cpu| {
                let (f, barrier) = (&f, &barrier);
                scope.spawn(move || {
                    pin_to_cpu(cpu).unwrap();
                    barrier.wait();
                    let until = Instant::now() + RUN;
                    let (mut passed, mut dropped) = (0u64, 0u64);
                    // Bounded: at most one frame per microsecond over the run.
                    for _ in 0..RUN.as_micros() {
                        if Instant::now() >= until {
                            break;
                        }
                        let mut opts = TestRunOptions::new();
                        opts.data_in = Some(f);
                        match prog.test_run(opts).unwrap().return_value {
                            XDP_PASS => passed += 1,
                            XDP_DROP => dropped += 1,
                            v => panic!("verdict {v}"),
                        }
                    }
                    (passed, dropped)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let c = h.counters().unwrap();
    let passed: u64 = per_cpu.iter().map(|p| p.0).sum();
    let dropped: u64 = per_cpu.iter().map(|p| p.1).sum();
    let passed_bytes = passed * FRAME as u64;
    let bound = RATE_BPS as f64 / 8.0 * elapsed + BURST as f64 + (cpus * FRAME) as f64;
    println!(
        "{cpus} CPUs: passed {passed} frames ({passed_bytes} bytes, bound {bound:.0}), dropped {dropped}, per CPU {per_cpu:?}; {}",
        cas_report(&c)
    );
    assert!(
        per_cpu.iter().all(|&(p, d)| p + d > 1000),
        "a CPU sent too little"
    );
    assert!(
        passed_bytes as f64 <= bound,
        "{passed_bytes} bytes passed over {elapsed:.3} s, one bucket allows {bound:.0}"
    );
    // And the bucket did pass its rate: it is one bucket, not a stuck one.
    assert!(
        passed_bytes as f64 >= 0.9 * (RATE_BPS as f64 / 8.0 * RUN.as_secs_f64()) + BURST as f64,
        "only {passed_bytes} bytes passed"
    );
    // Every verdict counted once; a CAS lost on every retry is a drop, and counted.
    assert_eq!(
        (c.outcomes.passed_packets, c.outcomes.dropped_packets),
        (passed, dropped)
    );
    assert!(c.cas_exhausted <= dropped);
    // Each passed frame was charged once, by a compare-and-swap won on one of its tries;
    // so was the first frame of a CPU that found the key new, in a fresh cell, even when
    // another CPU's entry was inserted first and the frame was metered again in it.
    let won: u64 = c.cas_won.iter().sum();
    assert!(
        (passed..passed + cpus as u64).contains(&won),
        "{passed} passed; {}",
        cas_report(&c)
    );
    // The cell is whole: one source, its TAT within one burst (τ) of now.
    let sources = h.sources().unwrap();
    assert_eq!(sources.len(), 1);
    let cell = sources[0].1.cell;
    let now = ticks_from_ns(monotonic_ns());
    let tau = config.limit.tau_ticks;
    let ahead = cell.tat.wrapping_sub(now) as i64;
    assert!(
        ahead <= tau as i64 && ahead > -(ticks_from_ns(10_000_000_000) as i64),
        "TAT {ahead} ticks from now, τ is {tau}"
    );
    assert_eq!(cell.scale, config.limit.scale());
}

/// A busy bucket: every CPU sends one key frames that all conform (a burst far larger than
/// what the run sends), so every frame writes the cell. Once the cell's TAT is ahead of
/// the clock, each charge adds the frame's cost to it whatever the time: after the run it
/// must be ahead of where it was by exactly the cost of the frames passed. A charge
/// overwritten by another CPU's (a read-modify-write without compare-and-swap) shows
/// there as a frame passed and never charged.
#[test]
#[ignore = "needs root: loads programs into the kernel (cargo xtask test)"]
fn a_busy_bucket_loses_no_charge_between_cpus() {
    const FRAMES_PER_CPU: u32 = 200_000;
    const REPEAT: u32 = 1000;
    let config = Config::per_source(RATE_BPS, 1 << 30).unwrap();
    let h = Harness::new(Some(&config), 1024).unwrap();
    let prog = h.program().unwrap();
    let cpus = online_cpus();
    let f = frame::ipv4_udp(Ipv4Addr::new(198, 18, 0, 9), FRAME);
    // 8 Mbit/s is 10^6 bytes/s: a byte costs 64000 ticks, no remainder to dither.
    let cost = config.limit.cost(f.len() as u32, 0);
    assert_eq!(cost, config.limit.cost(f.len() as u32, u32::MAX));
    let run = |repeat: u32| {
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(&f);
        opts.repeat = repeat;
        assert_eq!(prog.test_run(opts).unwrap().return_value, XDP_PASS);
    };
    // The key's cell, created and charged ten seconds ahead of the clock (a frame is a
    // millisecond's worth), so that it never drains while the threads start.
    for _ in 0..10 {
        run(REPEAT);
    }
    let tat = || h.sources().unwrap()[0].1.cell.tat;
    let before = (tat(), h.counters().unwrap().outcomes.passed_packets);
    let barrier = Barrier::new(cpus);
    thread::scope(|scope| {
        for cpu in 0..cpus {
            let (run, barrier) = (&run, &barrier);
            scope.spawn(move || {
                pin_to_cpu(cpu).unwrap();
                barrier.wait();
                for _ in 0..FRAMES_PER_CPU / REPEAT {
                    run(REPEAT);
                }
            });
        }
    });
    let c = h.counters().unwrap();
    let passed = c.outcomes.passed_packets - before.1;
    let charged = tat().wrapping_sub(before.0);
    assert_eq!(
        charged % cost,
        0,
        "the TAT moved by no whole number of frames"
    );
    let lost = passed as i64 - (charged / cost) as i64;
    println!(
        "busy bucket, {cpus} CPUs: {passed} frames passed, {} charged, {lost} lost; {}",
        charged / cost,
        cas_report(&c)
    );
    assert_eq!(
        passed + c.outcomes.dropped_packets,
        u64::from(FRAMES_PER_CPU / REPEAT * REPEAT) * cpus as u64
    );
    assert_eq!(lost, 0, "charges lost between CPUs");
    // The key was made before the run: every charge in it was one compare-and-swap won.
    assert_eq!(c.cas_won.iter().sum::<u64>(), c.outcomes.passed_packets);
    assert_eq!(c.cas_exhausted, c.outcomes.dropped_packets);
}

/// Live: one source sends from every CPU (a sender pinned to each) over a veth with a queue
/// per CPU, each CPU on its own queue, so the program attached with `shaper` meters the
/// source on every CPU at once. What passed stays within one bucket: rate × the time
/// frames were metered + burst + a frame per CPU; and every CPU metered some of it.
#[test]
#[ignore = "needs root: attaches XDP and creates network namespaces (cargo xtask test)"]
fn one_source_live_from_every_cpu_gets_one_bucket() {
    const LIVE_RATE_BPS: u64 = 200_000_000;
    const LIVE_FRAME: u32 = 1000;
    let options = LabOptions {
        queue_per_cpu: true,
        ..LabOptions::default()
    };
    let lab = Lab::with("cont", 1, options).unwrap();
    let shaper = bins::shaper();
    let mut guard = AttachGuard::new(shaper, lab.rx_ns(), lab.rx_iface());
    guard
        .attach(&["--rate", "200mbit", "--burst", "64k"])
        .unwrap();
    let flow = Flow {
        src: lab.sources()[0].into(),
        offered_bps: 2 * LIVE_RATE_BPS,
        frame_bytes: LIVE_FRAME,
    };
    let run = RunOptions {
        spread_cpus: true,
        ..RunOptions::default()
    };
    let report = run_udp_with(&lab, &[flow], Duration::from_secs(2), &run).unwrap();
    let sent = &report.flows[0];
    let stats = cli::stats(shaper, lab.rx_ns(), lab.rx_iface()).unwrap();
    let counts = stats.key(lab.sources()[0]);
    let per_cpu = per_cpu_counters(&Attachment::new(lab.rx_iface(), Some(lab.rx_ns())));
    let total = per_cpu.iter().fold(Counters::default(), |mut t, c| {
        shaper_common::maps::PerCpuSum::add(&mut t, c);
        t
    });
    let cpus = per_cpu.len();
    // Frames are metered after they are sent and before the receiver's drain ends: allow
    // the veth's queues (256 frames per queue: milliseconds) on top of the sending time.
    let metered_secs = sent.offered_secs + 0.05;
    let bound = LIVE_RATE_BPS as f64 / 8.0 * metered_secs
        + 65_536.0
        + (cpus as u64 * u64::from(LIVE_FRAME)) as f64;
    println!(
        "live, {} senders on {cpus} CPUs: sent {} frames in {:.3} s, passed {} bytes (bound {bound:.0}), dropped {} frames; metered per CPU {:?}; {}",
        report.sender_threads,
        sent.sent_packets,
        sent.offered_secs,
        counts.passed_bytes,
        counts.dropped_packets,
        per_cpu.iter().map(|c| c.ipv4_packets).collect::<Vec<_>>(),
        cas_report(&total)
    );
    assert!(
        (counts.passed_bytes as f64) <= bound,
        "{} bytes passed, one bucket allows {bound:.0}",
        counts.passed_bytes
    );
    assert!(
        counts.dropped_packets > 0,
        "the source was never over its rate"
    );
    // Every CPU metered a share of the source's frames.
    for (cpu, c) in per_cpu.iter().enumerate() {
        assert!(
            c.ipv4_packets * 10 >= counts.packets() / cpus as u64,
            "CPU {cpu} metered {} of {} frames",
            c.ipv4_packets,
            counts.packets()
        );
    }
    // The CPUs metered the cell at the same time: some compare-and-swap lost to another
    // CPU's and was tried again. (On one queue they never do: a queue's NAPI, and so the
    // program, runs on one CPU at a time.)
    assert!(
        total.cas_won[1..].iter().sum::<u64>() > 0,
        "no CPU ever found the cell changed under it: {}",
        cas_report(&total)
    );
    // Each passed frame was charged once, and each key given a cell took a token from the
    // admission cell, each with one compare-and-swap won; a CPU that found the key new
    // but whose insert lost to another CPU's took a token and charged a fresh cell too.
    let won: u64 = total.cas_won.iter().sum();
    let charged = total.outcomes.passed_packets + total.new_sources;
    assert!(
        (charged..=charged + 2 * (cpus as u64 - 1)).contains(&won),
        "{} passed, {} new sources; {}",
        total.outcomes.passed_packets,
        total.new_sources,
        cas_report(&total)
    );
}

/// The global counters of the attachment `at`, one per CPU.
fn per_cpu_counters(at: &Attachment) -> Vec<Counters> {
    let map = Map::from_map_data(MapData::from_pin(at.dir().join(PIN_COUNTERS)).unwrap()).unwrap();
    let array: PerCpuArray<MapData, Counters> = PerCpuArray::try_from(map).unwrap();
    array.get(&0, 0).unwrap().iter().copied().collect()
}

/// The compare-and-swap's outcomes, as `shaper stats` prints them.
fn cas_report(c: &Counters) -> String {
    format!(
        "CAS won on the first try {}, after 1 retry {}, after 2 {}, after 3 {}; exhausted {}",
        c.cas_won[0], c.cas_won[1], c.cas_won[2], c.cas_won[3], c.cas_exhausted
    )
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
