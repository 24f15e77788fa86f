//! A real Prometheus server (Debian's `prometheus`) scraping `shaper run` in the lab,
//! every second, with dist/prometheus/shaper-rules.yml loaded: after traffic of both
//! families, each policy's series it stored equal what the lab's sender sent and its
//! receiver counted (an independent count: passed is what arrived, dropped what was sent
//! and never arrived), the totals equal `stats -j`'s (through its HTTP query API), every
//! metric the rules name is there, and every rule evaluates without error.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{guard, stats};
use serde_json::Value;
use shaper_lab::{
    daemon::{Daemon, config, scratch, workspace},
    lab::{Flow, FlowResult, Lab, LabOptions, RunOptions, run_udp_with},
};

/// A policy over the lab's IPv4 sources and one over its IPv6 sources (each a /64 of
/// 2001:2::/32), each address held to 8 Mbit/s: the scrape's per-policy series count
/// their traffic alone (not the neighbour discovery and MLD of link-local addresses that
/// the totals carry too).
const POLICIES: [&str; 2] = ["198.18.0.0/24", "2001:2::/32"];

/// Each policy's series as Prometheus stored them, summed over cells of their own and
/// unadmitted keys: passed and dropped packets and bytes.
fn policy_counts(prometheus: &Prometheus, policy: &str) -> Option<[u64; 4]> {
    let one = |what: &str| {
        let sum = format!(
            "sum({{__name__=~\"shaper_policy_(unadmitted_)?{what}_total\",policy=\"{policy}\"}})"
        );
        prometheus.value(&sum).map(|v| v as u64)
    };
    Some([
        one("passed_packets")?,
        one("passed_bytes")?,
        one("dropped_packets")?,
        one("dropped_bytes")?,
    ])
}

/// What the lab counted of `flow`: passed is what arrived, dropped what was sent and never
/// arrived (the run lost nothing on its path or in the receiver's socket).
fn lab_counts(flow: &FlowResult) -> [u64; 4] {
    [
        flow.received_packets,
        flow.received_l2_bytes,
        flow.sent_packets - flow.received_packets,
        flow.sent_l2_bytes - flow.received_l2_bytes,
    ]
}

/// The rules the package ships.
fn rules_file() -> std::path::PathBuf {
    workspace().join("dist/prometheus/shaper-rules.yml")
}

/// `prometheus` in namespace `ns`, on 127.0.0.1:9090, its data in `dir`; killed on drop.
struct Prometheus {
    child: Child,
    ns: String,
}

impl Prometheus {
    fn start(ns: &str, dir: &Path) -> Self {
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: ['{}']\n\
                 scrape_configs:\n  - job_name: shaper\n    static_configs:\n      \
                 - targets: ['127.0.0.1:9753']\n",
                rules_file().display()
            ),
        )
        .unwrap();
        let log = fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "prometheus"])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:9090")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's package; cargo xtask setup installs it)");
        let prometheus = Prometheus {
            child,
            ns: ns.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while prometheus.get("/-/ready").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "prometheus is not ready after 20 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    fn get(&self, path: &str) -> (u16, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "curl", "-s", "--max-time", "5"])
            .args(["-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:9090{path}"))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match text.rsplit_once('\n') {
            Some((body, code)) => (code.parse().unwrap_or(0), body.to_owned()),
            None => (0, text),
        }
    }

    /// An instant query through the HTTP API: its result vector.
    fn query(&self, promql: &str) -> Vec<Value> {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                "curl",
                "-sfS",
                "--max-time",
                "5",
                "-G",
            ])
            .arg("http://127.0.0.1:9090/api/v1/query")
            .args(["--data-urlencode", &format!("query={promql}")])
            .output()
            .expect("curl");
        assert!(out.status.success(), "query {promql}: {out:?}");
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["status"], "success", "{answer}");
        answer["data"]["result"].as_array().unwrap().clone()
    }

    /// The value of a query that must give one sample.
    fn value(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql);
        let sample = result.first()?;
        sample["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every `shaper_...` metric name the rules use (histogram buckets by their series name;
/// not the recording rules' own `level:metric:operations` names).
fn names_in_rules() -> Vec<String> {
    let text = fs::read_to_string(rules_file()).unwrap();
    let mut names: Vec<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("shaper_") && !w.ends_with('_'))
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn prometheus_scrapes_what_the_lab_counted() {
    let options = LabOptions {
        ipv6: true,
        ..LabOptions::default()
    };
    let lab = Lab::with("prom", 1, options).unwrap_or_else(|e| panic!("cannot create lab: {e:#}"));
    let iface = lab.rx_iface().to_owned();
    let _guard = guard(lab.rx_ns(), &iface);
    lab.rx_netns()
        .ip(&["link", "set", "dev", "lo", "up"])
        .unwrap();
    let dir = scratch("prom");
    let file = dir.join("shaper.toml");
    let mut text = config(&iface, "8mbit");
    for prefix in POLICIES {
        text += &format!(
            "[[interface.policy]]\nprefix = \"{prefix}\"\nrate = \"8mbit\"\nburst = \"64k\"\n"
        );
    }
    fs::write(&file, text).unwrap();
    let mut daemon = Daemon::start(lab.rx_ns(), &file, &["--no-watch"]);
    // A reload, so that the reload's series are there too.
    daemon.reload();
    let prometheus = Prometheus::start(lab.rx_ns(), &dir);
    // Its first scrape before the traffic, so the rates see the counters rise.
    let deadline = Instant::now() + Duration::from_secs(10);
    while prometheus.value("up{job=\"shaper\"}") != Some(1.0) {
        assert!(Instant::now() < deadline, "no successful scrape in 10 s");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Twice the rate from one source of each family (the lab sends one family a run).
    let srcs = [lab.sources()[0].into(), lab.sources6()[0].into()];
    let mut counted = Vec::new();
    for (src, policy) in srcs.into_iter().zip(POLICIES) {
        let flow = Flow {
            src,
            offered_bps: 16_000_000,
            frame_bytes: 1000,
        };
        let report = run_udp_with(
            &lab,
            &[flow],
            Duration::from_secs(1),
            &RunOptions::default(),
        )
        .expect("traffic");
        assert_eq!(
            (report.path_drops, report.receiver_drops),
            (0, 0),
            "the lab lost frames: its counts are not the limiter's"
        );
        let lab = lab_counts(&report.flows[0]);
        assert!(
            lab[1] > 0 && lab[3] > 0,
            "{src}: nothing passed or nothing dropped"
        );
        counted.push((policy, lab));
    }
    // The next scrapes (1 s apart) bring the counters as they stand after the traffic.
    let deadline = Instant::now() + Duration::from_secs(10);
    for (policy, lab) in &counted {
        loop {
            let got = policy_counts(&prometheus, policy);
            if got == Some(*lab) {
                println!(
                    "policy {policy}: Prometheus and the lab both count {lab:?} (passed packets, bytes; dropped packets, bytes)"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "policy {policy}: Prometheus has {got:?}, the lab counted {lab:?} (passed packets, bytes; dropped packets, bytes)"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    // The totals, equal to `stats -j`'s.
    let totals = stats(lab.rx_ns(), &iface);
    let names = [
        "passed_bytes",
        "passed_packets",
        "dropped_bytes",
        "dropped_packets",
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got: Vec<Option<f64>> = names
            .iter()
            .map(|n| {
                prometheus.value(&format!(
                    "shaper_{n}_total{{job=\"shaper\",interface=\"{iface}\",direction=\"ingress\"}}"
                ))
            })
            .collect();
        let want: Vec<Option<f64>> = names.iter().map(|n| Some(totals.total(n) as f64)).collect();
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus has {got:?}, stats -j says {want:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(totals.total("dropped_bytes") > 0 && totals.total("passed_bytes") > 0);
    assert_eq!(prometheus.value("up{job=\"shaper\"}"), Some(1.0));
    let attached = format!("shaper_interface_attached{{interface=\"{iface}\"}}");
    assert_eq!(prometheus.value(&attached), Some(1.0));

    // Every series the rules name is scraped (none misspelt, none the daemon lacks).
    let deadline = Instant::now() + Duration::from_secs(5);
    for name in names_in_rules() {
        while prometheus
            .query(&format!("{{__name__=\"{name}\"}}"))
            .is_empty()
        {
            assert!(Instant::now() < deadline, "no {name} in Prometheus");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // Every rule of the file loaded and evaluates without error; the recording rules have
    // values.
    let (code, body) = prometheus.get("/api/v1/rules");
    assert_eq!(code, 200, "{body}");
    let rules: Value = serde_json::from_str(&body).unwrap();
    let groups = rules["data"]["groups"].as_array().unwrap();
    let all: Vec<&Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    let in_file = fs::read_to_string(rules_file())
        .unwrap()
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("- record:") || l.starts_with("- alert:")
        })
        .count();
    assert_eq!(all.len(), in_file, "{rules}");
    for rule in &all {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let recorded = format!("interface:shaper_dropped_bits:rate5m{{interface=\"{iface}\"}}");
    while prometheus.value(&recorded).is_none_or(|v| v <= 0.0) {
        assert!(
            Instant::now() < deadline,
            "no {recorded}: {:?}",
            prometheus.query("{__name__=~\"interface:.*\"}")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("query {recorded}: {:?}", prometheus.value(&recorded));

    drop(prometheus);
    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    let _ = fs::remove_dir_all(&dir);
}
