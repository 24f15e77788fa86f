//! `shaper top` against live lab traffic: two sources at known rates, one under a prefix
//! policy that drops two thirds of what it sends (without a terminal, a quarter of what
//! it passes marked by an excess rate). In a terminal (tmux: send-keys and capture-pane)
//! the pane shows both with their policy and rates within ±2% of what was
//! offered, sorted by rate, and by passed after `p`, and `q` quits; without a terminal it
//! prints one snapshot, as text or (`-j`) JSON.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use common::{attach, attach_with, shaper_ok};
use serde_json::Value;
use shaper_lab::{
    bins::shaper as shaper_bin,
    lab::{Flow, Lab, LabOptions, RunOptions, run_udp_with},
};

/// What each source offers: the first 3 Mbit/s under the 8mbit default, the second
/// 6 Mbit/s under a 2mbit policy of its own /32 (2 passed, 4 dropped). By rate the second
/// comes first, by passed the first.
const OFFERED: [u64; 2] = [3_000_000, 6_000_000];
const POLICY_RATE: f64 = 2e6;
const FRAME: u32 = 1000;

/// ±3%: one second's counts against a paced sender's rate (seen within ±0.5% on a
/// machine under load 9, and once +2.1% in CI beside the kernel matrix; the text view
/// rounds to three digits, 0.25% at worst).
fn assert_rate(what: &str, got: f64, expected: f64) {
    let err = (got - expected) / expected;
    println!(
        "{what}: {got:.0} against {expected:.0}: {:+.2}%",
        err * 100.0
    );
    assert!(
        err.abs() <= 0.03,
        "{what}: {got:.0} is {:+.1}% from {expected:.0}",
        err * 100.0
    );
}

/// A lab with shaper on its receiver, the policy in place, and the two sources.
fn setup(tag: &str) -> (Lab, [Ipv4Addr; 2]) {
    let lab = Lab::new(tag, 2).unwrap_or_else(|e| panic!("cannot create lab {tag}: {e:#}"));
    let srcs = [lab.sources()[0], lab.sources()[1]];
    (lab, srcs)
}

/// Sends both flows for `secs` seconds on another thread while `during` runs (it starts
/// once the senders have run a second).
fn with_traffic<T: Send>(
    lab: &Lab,
    srcs: [Ipv4Addr; 2],
    secs: u64,
    during: impl FnOnce() -> T + Send,
) -> T {
    let flows: Vec<Flow> = srcs
        .iter()
        .zip(OFFERED)
        .map(|(src, offered_bps)| Flow {
            src: (*src).into(),
            offered_bps,
            frame_bytes: FRAME,
        })
        .collect();
    thread::scope(|scope| {
        let sender = scope.spawn(|| {
            run_udp_with(
                lab,
                &flows,
                Duration::from_secs(secs),
                &RunOptions::default(),
            )
            .expect("traffic")
        });
        thread::sleep(Duration::from_secs(1));
        let out = during();
        let report = sender.join().unwrap();
        for f in &report.flows {
            let sent = f.sent_l2_bytes as f64 * 8.0 / f.offered_secs;
            println!("{}: sent {sent:.0} bit/s", f.src);
        }
        out
    })
}

/// A tmux server of the test's own (its socket named after the process), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Self {
        Self {
            socket: format!("shaper-top-{}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux (cargo xtask setup installs it)")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn pane(&self) -> String {
        self.ok(&["capture-pane", "-p", "-t", "top"])
    }

    /// Captures the pane until `ready` holds on it (5 s at most).
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pane = self.pane();
            if ready(&pane) {
                return pane;
            }
            assert!(Instant::now() < deadline, "no {what} in the pane:\n{pane}");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// A row of the pane or of the text snapshot: the key, its policy, and the rate, passed
/// and dropped columns in bits per second.
#[derive(Debug)]
struct Row {
    source: String,
    policy: String,
    rate: f64,
    passed: f64,
    dropped: f64,
}

fn bits(value: &str, unit: &str) -> f64 {
    let v: f64 = value.parse().unwrap();
    v * match unit {
        "Gbit/s" => 1e9,
        "Mbit/s" => 1e6,
        "kbit/s" => 1e3,
        "bit/s" => 1.0,
        other => panic!("unit {other}"),
    }
}

/// The rows of the sources in `srcs`, in the order shown.
fn rows(text: &str, srcs: &[Ipv4Addr]) -> Vec<Row> {
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 10 || !srcs.iter().any(|s| w[0] == s.to_string()) {
                return None;
            }
            Some(Row {
                source: w[0].to_owned(),
                policy: w[1].to_owned(),
                rate: bits(w[2], w[3]),
                passed: bits(w[4], w[5]),
                dropped: bits(w[7], w[8]),
            })
        })
        .collect()
}

/// Both rows, in the order asked, at the rates offered and passed.
fn check_rows(rows: &[Row], srcs: [Ipv4Addr; 2], order: [usize; 2]) {
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, i) in rows.iter().zip(order) {
        assert_eq!(row.source, srcs[i].to_string(), "order: {rows:?}");
        let (policy, passed) = if i == 0 {
            ("default".to_owned(), OFFERED[0] as f64)
        } else {
            (format!("{}/32", srcs[1]), POLICY_RATE)
        };
        assert_eq!(row.policy, policy, "{row:?}");
        assert_rate(&format!("{} rate", row.source), row.rate, OFFERED[i] as f64);
        assert_rate(&format!("{} passed", row.source), row.passed, passed);
        if i == 1 {
            assert_rate(
                &format!("{} dropped", row.source),
                row.dropped,
                OFFERED[1] as f64 - POLICY_RATE,
            );
        }
    }
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn top_in_a_terminal_shows_the_sources_at_their_rates_and_sorts() {
    let (lab, srcs) = setup("top-tty");
    let _guard = attach(lab.rx_ns(), lab.rx_iface(), "8mbit", "64k");
    let prefix = format!("{}/32", srcs[1]);
    shaper_ok(
        lab.rx_ns(),
        &[
            "policy",
            "set",
            lab.rx_iface(),
            &prefix,
            "--rate",
            "2mbit",
            "--burst",
            "16k",
        ],
    );
    let tmux = Tmux::new();
    let command = format!(
        "{} -n {} top {}",
        shaper_bin().display(),
        lab.rx_ns(),
        lab.rx_iface()
    );
    let (by_rate, by_passed) = with_traffic(&lab, srcs, 7, || {
        tmux.ok(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "132",
            "-y",
            "20",
            &command,
        ]);
        // The first rates come a second after the start; the ones after it cover a whole
        // second of steady traffic.
        thread::sleep(Duration::from_millis(2500));
        let by_rate = tmux.wait_for("two rows sorted by rate", |p| {
            p.contains("sorted by rate") && rows(p, &srcs).len() == 2
        });
        tmux.ok(&["send-keys", "-t", "top", "p"]);
        let by_passed = tmux.wait_for("the sort by passed", |p| p.contains("sorted by passed"));
        (by_rate, by_passed)
    });
    println!("shaper top, sorted by rate:\n{by_rate}");
    println!("after p:\n{by_passed}");
    assert!(
        by_rate.contains(lab.rx_iface()),
        "no interface in the header"
    );
    check_rows(&rows(&by_rate, &srcs), srcs, [1, 0]);
    check_rows(&rows(&by_passed, &srcs), srcs, [0, 1]);

    tmux.ok(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(3);
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(Instant::now() < deadline, "q did not end shaper top");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn top_without_a_terminal_prints_one_snapshot() {
    let (lab, srcs) = setup("top-pipe");
    let _guard = attach(lab.rx_ns(), lab.rx_iface(), "8mbit", "64k");
    let prefix = format!("{}/32", srcs[1]);
    shaper_ok(
        lab.rx_ns(),
        &[
            "policy",
            "set",
            lab.rx_iface(),
            &prefix,
            "--rate",
            "1500kbit",
            "--burst",
            "16k",
            "--excess-rate",
            "500kbit",
            "--excess-burst",
            "16k",
        ],
    );
    let (text, json) = with_traffic(&lab, srcs, 5, || {
        let started = Instant::now();
        let text = shaper_ok(lab.rx_ns(), &["top", lab.rx_iface()]);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(3),
            "one snapshot is two reads a second apart: took {took:?}"
        );
        let json = shaper_ok(
            lab.rx_ns(),
            &["-j", "top", lab.rx_iface(), "--sort", "passed"],
        );
        (text, json)
    });
    println!("{text}\n{json}");
    check_rows(&rows(&text, &srcs), srcs, [1, 0]);

    let top: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(top["interface"], lab.rx_iface());
    assert_eq!(top["sort"], "passed");
    assert_eq!(top["sources_tracked"], 2);
    let sources = top["sources"].as_array().unwrap();
    let row = |v: &Value| Row {
        source: v["source"].as_str().unwrap().to_owned(),
        policy: v["policy"].as_str().unwrap().to_owned(),
        rate: v["rate_bits_per_sec"].as_f64().unwrap(),
        passed: v["passed_bits_per_sec"].as_f64().unwrap(),
        dropped: v["dropped_bits_per_sec"].as_f64().unwrap(),
    };
    check_rows(&sources.iter().map(row).collect::<Vec<_>>(), srcs, [0, 1]);
    // The policy's 2 Mbit/s are a bandwidth profile here: 1.5 Mbit/s committed (green),
    // 0.5 more marked (yellow), in the text's marked column and in JSON by colour.
    let marked = &sources[1];
    let colour = |c: &str| marked[format!("{c}_bits_per_sec")].as_f64().unwrap();
    assert_rate("green", colour("green"), 1.5e6);
    assert_rate("yellow", colour("yellow"), 0.5e6);
    assert_rate("red", colour("red"), OFFERED[1] as f64 - POLICY_RATE);
    assert_eq!(sources[0]["yellow_bits_per_sec"], 0.0);
    let line = text
        .lines()
        .find(|l| l.starts_with(&srcs[1].to_string()))
        .unwrap();
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_rate("marked column", bits(w[10], w[11]), 0.5e6);
    assert_rate(
        "the interface's rate",
        top["totals"]["rate_bits_per_sec"].as_f64().unwrap(),
        (OFFERED[0] + OFFERED[1]) as f64,
    );
}

/// `top --subscribers`: a row a subscriber, over all of its prefixes and both families.
/// `c-two` holds the second IPv4 source and the first IPv6 one's /64, each at 3 Mbit/s,
/// under a plan of 1.5 Mbit/s committed and 0.5 more marked; `c-one` the first IPv4
/// source at 3 Mbit/s under 8 Mbit/s. Their rates, passed, dropped and marked as offered
/// and planned, sorted by passed (`c-one` first) and named by their plans' rates.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn top_shows_subscribers_over_their_prefixes() {
    let options = LabOptions {
        ipv6: true,
        ..LabOptions::default()
    };
    let lab = Lab::with("top-subs", 2, options).unwrap();
    let (ns, iface) = (lab.rx_ns(), lab.rx_iface());
    let _guard = attach_with(ns, iface, "8mbit", "64k", &["--max-subscribers", "4"]);
    let six = lab.sources6()[0].segments();
    let net64 = Ipv6Addr::new(six[0], six[1], six[2], six[3], 0, 0, 0, 0);
    for args in [
        vec![
            "c-one".to_owned(),
            "--prefix".to_owned(),
            format!("{}/32", lab.sources()[0]),
            "--rate".to_owned(),
            "8mbit".to_owned(),
        ],
        vec![
            "c-two".to_owned(),
            "--prefix".to_owned(),
            format!("{}/32", lab.sources()[1]),
            "--prefix".to_owned(),
            format!("{net64}/64"),
            "--rate".to_owned(),
            "1500kbit".to_owned(),
            "--excess-rate".to_owned(),
            "500kbit".to_owned(),
            "--excess-burst".to_owned(),
            "16k".to_owned(),
        ],
    ] {
        let mut all = vec!["subscriber", "set", iface];
        all.extend(args.iter().map(String::as_str));
        all.extend(["--burst", "16k"]);
        shaper_ok(ns, &all);
    }
    let flow = |src: IpAddr| Flow {
        src,
        offered_bps: 3_000_000,
        frame_bytes: FRAME,
    };
    let v4 = [flow(lab.sources()[0].into()), flow(lab.sources()[1].into())];
    let v6 = [flow(lab.sources6()[0].into())];
    let run = |flows: &[Flow]| {
        run_udp_with(&lab, flows, Duration::from_secs(4), &RunOptions::default()).expect("traffic")
    };
    let json = thread::scope(|scope| {
        let senders = [scope.spawn(|| run(&v4)), scope.spawn(|| run(&v6))];
        thread::sleep(Duration::from_secs(1));
        let json = shaper_ok(
            ns,
            &["-j", "top", iface, "--subscribers", "--sort", "passed"],
        );
        for s in senders {
            s.join().unwrap();
        }
        json
    });
    println!("{json}");
    let top: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(top["subscribers_tracked"], 2);
    let rows = top["subscribers"].as_array().unwrap();
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["subscriber"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c-one", "c-two"]);
    assert_eq!(rows[0]["plan"], "plan 8mbit");
    assert_eq!(rows[1]["plan"], "plan 1500kbit");
    let rate = |r: &Value, what: &str| r[format!("{what}_bits_per_sec")].as_f64().unwrap();
    assert_rate("c-one rate", rate(&rows[0], "rate"), 3e6);
    assert_rate("c-one passed", rate(&rows[0], "passed"), 3e6);
    assert_rate("c-two rate", rate(&rows[1], "rate"), 6e6);
    assert_rate("c-two passed", rate(&rows[1], "passed"), 2e6);
    assert_rate("c-two green", rate(&rows[1], "green"), 1.5e6);
    assert_rate("c-two yellow", rate(&rows[1], "yellow"), 0.5e6);
    assert_rate("c-two dropped", rate(&rows[1], "dropped"), 4e6);
}
