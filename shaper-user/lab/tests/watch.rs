//! `shaper watch` with live traffic through the real XDP program: events for a source over
//! its limit and none for one under it (IPv4, and IPv6 by its /64 key), the packet rate named as a reason of its own, the kernel's bound on the events' rate, nothing
//! sampled while nobody watches (or once a killed watcher's lease has run out), and a
//! second watcher refused.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use common::{attach, shaper, stats};
use serde_json::Value;
use shaper_lab::{
    bins::shaper as shaper_bin,
    lab::{Flow, Lab, LabOptions, RunOptions, run_udp_with},
};
use shaper_user::{pins::Attachment, watch};

const FRAME: u32 = 1_000;
const RATE_BPS: u64 = 4_000_000;

/// A `shaper -n NS -j watch ARGS...` running; killed when dropped if still running.
struct Watcher(Child, Instant);

impl Watcher {
    fn start(lab: &Lab, args: &[&str]) -> Self {
        Self::start_as(lab, &["-j"], args)
    }

    /// `shaper -n NS GLOBAL... watch IFACE ARGS...`, returned once it holds the lease (a
    /// program as slow to start as an emulated guest makes it would otherwise miss the
    /// traffic sent next, and wait for events forever).
    fn start_as(lab: &Lab, global: &[&str], args: &[&str]) -> Self {
        let child = Command::new(shaper_bin())
            .args(["-n", lab.rx_ns()])
            .args(global)
            .args(["watch", lab.rx_iface()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run shaper watch");
        let w = Self(child, Instant::now());
        // Until it holds the lease: then sampling is on.
        let at = Attachment::new(lab.rx_iface(), Some(lab.rx_ns()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while watch::read_control(&at).unwrap().0.pid != w.0.id() {
            assert!(
                Instant::now() < deadline,
                "the watcher never took the lease"
            );
            thread::sleep(Duration::from_millis(20));
        }
        w
    }

    /// Waits for it to exit: what it wrote.
    fn output(mut self) -> std::process::Output {
        let child = std::mem::replace(&mut self.0, Command::new("true").spawn().expect("run true"));
        child.wait_with_output().expect("wait for shaper watch")
    }

    /// Waits for it to exit: its events (one JSON object a line) and how long it ran.
    fn finish(self) -> (Vec<Value>, Duration) {
        let started = self.1;
        let out = self.output();
        let ran = started.elapsed();
        assert!(
            out.status.success(),
            "shaper watch failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let events = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        (events, ran)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn flows(lab: &Lab, offered: &[u64]) -> Vec<Flow> {
    lab.flows(offered, FRAME)
}

fn send(lab: &Lab, flows: &[Flow], seconds: u64) {
    let report = run_udp_with(
        lab,
        flows,
        Duration::from_secs(seconds),
        &RunOptions::default(),
    )
    .unwrap();
    assert_eq!(report.receiver_drops, 0, "the receiver lost datagrams");
}

/// The meter's TAT: it moves with each event taken, and only then.
fn meter_tat(lab: &Lab) -> u64 {
    let at = Attachment::new(lab.rx_iface(), Some(lab.rx_ns()));
    watch::read_control(&at).unwrap().1.cell.tat
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn watch_reports_a_source_over_its_limit_and_none_under_it() {
    over_and_under(false);
}

/// The same of IPv6 sources, each its /64 key (a test of its own: the kernel matrix's
/// guests run the IPv4 one alone).
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn watch_reports_an_ipv6_source_over_its_limit_and_none_under_it() {
    over_and_under(true);
}

fn over_and_under(ipv6: bool) {
    let options = LabOptions {
        ipv6,
        ..LabOptions::default()
    };
    let lab = Lab::with("watch", 2, options).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "4mbit", "16k");
    // Each source's flow at `offered`, and its key as stats and watch name it.
    let family = |offered: &[u64]| -> Vec<Flow> {
        if !ipv6 {
            return flows(&lab, offered);
        }
        lab.sources6()
            .iter()
            .zip(offered)
            .map(|(&src, &offered_bps)| Flow {
                src: src.into(),
                offered_bps,
                frame_bytes: FRAME,
            })
            .collect()
    };
    let key = |i: usize| -> String {
        if !ipv6 {
            return lab.sources()[i].to_string();
        }
        let a = u128::from(lab.sources6()[i]) & !0 << 64;
        format!("{}/64", std::net::Ipv6Addr::from(a))
    };
    let (over, under) = (key(0), key(1));
    let watcher = Watcher::start(&lab, &["--rate", "1000", "--duration", "4s"]);
    // The conforming source at an eighth of the limit: even under emulation its frames
    // never bunch up beyond the burst (16 frames).
    send(&lab, &family(&[2 * RATE_BPS, RATE_BPS / 8]), 2);
    let (events, _) = watcher.finish();
    let s = stats(lab.rx_ns(), lab.rx_iface());
    assert!(s.key(&over).dropped_packets > 100, "nothing dropped");
    assert_eq!(s.key(&under).dropped_packets, 0);
    assert!(events.len() > 100, "{} events", events.len());
    for e in &events {
        assert_eq!(e["source"], over.to_string(), "{e}");
        assert_eq!(e["interface"], lab.rx_iface(), "{e}");
        assert_eq!(e["direction"], "ingress", "{e}");
        assert_eq!(e["policy"], "default", "{e}");
        assert_eq!(e["reason"], "source_limit", "{e}");
        assert_eq!(e["action"], "dropped", "{e}");
        assert_eq!(e["bytes"], FRAME, "{e}");
        assert!(e["time_unix_ns"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    }
    // Every drop was sampled: the rate allowed far more than there were.
    assert_eq!(events.len() as u64, s.key(&over).dropped_packets);
    println!("shaper -j watch:\n{}", events[0]);

    // The same as text: one line an event (bounded in time too: if the events never came,
    // the count below fails rather than the test hanging).
    let text = Watcher::start_as(&lab, &[], &["--count", "3", "--duration", "60s"]);
    send(&lab, &family(&[2 * RATE_BPS, RATE_BPS / 2]), 1);
    let out = text.output();
    let stdout = String::from_utf8(out.stdout).unwrap();
    println!(
        "shaper watch:\n{}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    for line in stdout.lines() {
        assert!(
            line.contains(&format!(" {over} "))
                && line.contains("policy default")
                && line.ends_with("1000 bytes  dropped: over its limit"),
            "{line}"
        );
    }
}

/// A source over its policy's packet rate, far under its byte rate: each event names the
/// packet rate as the reason, in JSON (`packet_rate`) and in text.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn watch_names_the_packet_rate() {
    let lab = Lab::new("watchpr", 1).unwrap();
    let iface = lab.rx_iface();
    let _attached = attach(lab.rx_ns(), iface, "100mbit", "64k");
    let src = lab.sources()[0];
    let prefix = format!("{src}/32");
    // 500 frames a second against 100.
    let set = [
        "policy",
        "set",
        iface,
        &prefix,
        "--rate",
        "100mbit",
        "--burst",
        "64k",
        "--packet-rate",
        "100",
        "--packet-burst",
        "10",
    ];
    assert!(shaper(lab.rx_ns(), &set).status.success());
    let watcher = Watcher::start(&lab, &["--rate", "1000", "--duration", "3s"]);
    send(&lab, &flows(&lab, &[RATE_BPS]), 2);
    let (events, _) = watcher.finish();
    assert!(events.len() > 100, "{} events", events.len());
    for e in &events {
        assert_eq!(e["reason"], "packet_rate", "{e}");
        assert_eq!(e["policy"], prefix.as_str(), "{e}");
        assert_eq!(e["action"], "dropped", "{e}");
    }
    let text = Watcher::start_as(&lab, &[], &["--count", "2", "--duration", "60s"]);
    send(&lab, &flows(&lab, &[RATE_BPS]), 1);
    let out = text.output();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    for line in stdout.lines() {
        assert!(line.ends_with("dropped: over its packet rate"), "{line}");
    }
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn the_kernel_holds_events_to_the_watchers_rate() {
    const RATE: u64 = 20;
    const BURST: u64 = 5;
    let lab = Lab::new("watchrate", 1).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "4mbit", "16k");
    let watcher = Watcher::start(&lab, &["--rate", "20", "--burst", "5", "--duration", "3s"]);
    send(&lab, &flows(&lab, &[4 * RATE_BPS]), 2);
    let (events, _) = watcher.finish();
    let dropped = stats(lab.rx_ns(), lab.rx_iface()).total("dropped_packets");
    // The events' own times, the kernel's clock when it sampled each: between the first
    // and the last, the meter allows its burst and the rate, and no more (a token is
    // an event, the first one from a full bucket)...
    let times: Vec<u64> = events
        .iter()
        .map(|e| e["time_unix_ns"].as_u64().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "events out of order"
    );
    let span = (times[times.len() - 1] - times[0]) as f64 / 1e9;
    let bound = RATE as f64 * span + BURST as f64;
    let n = events.len() as f64;
    println!("{n} events over {span:.3} s: the meter allows {bound:.1}; {dropped} dropped");
    assert!(
        n <= bound + 1.0,
        "{n} events in {span:.3} s: more than {bound:.1}"
    );
    // ...and the flood, refused frames hundreds of times a second all along, took every
    // token as it came: a tenth short at most (a sampler at half the rate, or that lost
    // its burst, falls short).
    assert!(
        n >= 0.9 * RATE as f64 * span + BURST as f64,
        "{n} events in {span:.3} s"
    );
    assert!(span >= 1.5, "sampled for {span:.3} s of 2 s of flood");
    assert!(dropped > 10 * events.len() as u64, "{dropped} dropped");
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn nothing_is_sampled_while_nobody_watches() {
    let lab = Lab::new("watchoff", 1).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "4mbit", "16k");
    let at = Attachment::new(lab.rx_iface(), Some(lab.rx_ns()));
    send(&lab, &flows(&lab, &[4 * RATE_BPS]), 1);
    assert!(stats(lab.rx_ns(), lab.rx_iface()).total("dropped_packets") > 100);
    // The event path was never taken: the meter never charged, the ring buffer is empty.
    assert_eq!(meter_tat(&lab), 0);
    let mut ring = watch::open_events(&at).unwrap();
    assert!(ring.next().is_none(), "an event with nobody watching");
    drop(ring);

    // A watcher that exits gives its lease back at once.
    let watcher = Watcher::start(&lab, &["--duration", "1s"]);
    watcher.finish();
    assert_eq!(watch::read_control(&at).unwrap().0.until, 0);

    // A watcher killed without a word: sampling stops when its lease runs out.
    let mut watcher = Watcher::start(&lab, &[]);
    send(&lab, &flows(&lab, &[4 * RATE_BPS]), 1);
    let during = meter_tat(&lab);
    assert_ne!(during, 0, "nothing sampled while watched");
    watcher.0.kill().unwrap();
    watcher.0.wait().unwrap();
    thread::sleep(watch::LEASE);
    let after = meter_tat(&lab);
    send(&lab, &flows(&lab, &[4 * RATE_BPS]), 1);
    assert_eq!(meter_tat(&lab), after, "sampled after the lease ran out");
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_second_watcher_is_refused_in_one_line() {
    let lab = Lab::new("watch2", 1).unwrap();
    let _attached = attach(lab.rx_ns(), lab.rx_iface(), "4mbit", "16k");
    let first = Watcher::start(&lab, &["--duration", "3s"]);
    let out = shaper(lab.rx_ns(), &["watch", lab.rx_iface(), "--duration", "1s"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("already watched by process {}", first.0.id()))
            && err.lines().count() == 1,
        "{err}"
    );
    first.finish();
    // Once it is gone, the next one may watch.
    Watcher::start(&lab, &["--duration", "500ms"]).finish();
}
