//! One key driven from every CPU at once through BPF_PROG_TEST_RUN (a thread pinned to
//! each CPU; test_run runs the program on the calling CPU): every CPU meters the same
//! cell with compare-and-swap, so together they pass no more than one bucket allows, rate
//! × elapsed + burst, plus at most one frame per CPU in flight; a CAS lost on every retry
//! is counted, and the cell is never corrupted.

use std::{
    net::Ipv4Addr,
    sync::Barrier,
    thread,
    time::{Duration, Instant},
};

use aya::programs::{TestRun as _, TestRunOptions};
use shaper_common::{gcra::ticks_from_ns, maps::Config};
use shaper_lab::{
    bench::lru::{online_cpus, pin_to_cpu},
    frame,
    testrun::{Harness, XDP_DROP, XDP_PASS},
};

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
        "{cpus} CPUs: passed {passed} frames ({passed_bytes} bytes, bound {bound:.0}), dropped {dropped}, per CPU {per_cpu:?}, cas exhausted {}",
        c.cas_exhausted
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
