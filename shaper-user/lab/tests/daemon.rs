//! `shaper run`, the daemon, in the lab: it applies its file and says READY=1 on the
//! sd_notify socket (a socket of the test's, as systemd's would be); a SIGHUP with a
//! changed file updates the attachment in place (same program, every source's bucket and
//! counters kept) and the new rate holds; a SIGHUP with a broken file logs one line
//! naming file:line and field and changes nothing; SIGTERM leaves enforcement in place,
//! `--detach-on-exit` removes it; a second daemon is refused; a file replaced as an
//! editor saves it is applied without a signal.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    fs,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{assert_near, guard, shaper, shaper_ok, stats};
use serde_json::Value;
use shaper_lab::{
    daemon::{Daemon, config, scratch},
    lab::{Flow, FlowResult, Lab, RunOptions, run_udp_with},
};
use shaper_user::pins::Attachment;

/// `status -j`'s row of `iface`.
fn status(lab: &Lab, iface: &str) -> Value {
    let out = shaper_ok(lab.rx_ns(), &["-j", "status", iface]);
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    rows.into_iter().next().expect("one row")
}

fn rate(lab: &Lab, iface: &str) -> u64 {
    status(lab, iface)["rate_bits_per_sec"].as_u64().unwrap()
}

/// The id of the XDP program on the lab's receiving interface.
fn prog_id(lab: &Lab) -> u64 {
    let out = Command::new("ip")
        .args([
            "-n",
            lab.rx_ns(),
            "-j",
            "link",
            "show",
            "dev",
            lab.rx_iface(),
        ])
        .output()
        .unwrap();
    let links: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["xdp"]["prog"]["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no XDP program: {}", links[0]))
}

fn run_udp(lab: &Lab, flow: Flow, duration: Duration) -> FlowResult {
    let report = run_udp_with(lab, &[flow], duration, &RunOptions::default()).expect("traffic");
    report.flows.into_iter().next().unwrap()
}

fn new_lab(tag: &str) -> Lab {
    Lab::new(tag, 1).unwrap_or_else(|e| panic!("cannot create lab {tag}: {e:#}"))
}

/// Reload with a changed file: the same program stays (no detach, no gap), the source
/// keeps its bucket and counters, and the new rate holds it from then on.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn sighup_applies_a_changed_file_in_place() {
    let lab = new_lab("dm-hup");
    let iface = lab.rx_iface().to_owned();
    let _guard = guard(lab.rx_ns(), &iface);
    let dir = scratch("dm-hup");
    let file = dir.join("shaper.toml");
    fs::write(&file, config(&iface, "8mbit")).unwrap();
    let mut daemon = Daemon::start(lab.rx_ns(), &file, &["--no-watch"]);
    assert_eq!(rate(&lab, &iface), 8_000_000);
    let src = lab.sources()[0];
    let flow = Flow {
        src: src.into(),
        offered_bps: 16_000_000,
        frame_bytes: 1000,
    };
    run_udp(&lab, flow, Duration::from_secs(1));
    let before = stats(lab.rx_ns(), &iface);
    let program = prog_id(&lab);

    fs::write(&file, config(&iface, "4mbit")).unwrap();
    let said = daemon.reload();
    assert!(said.contains(&format!("{iface} updated")), "{said}");
    assert_eq!(rate(&lab, &iface), 4_000_000);
    assert_eq!(prog_id(&lab), program, "the program was replaced");
    let updated = stats(lab.rx_ns(), &iface);
    assert!(
        updated.key(src).kept(&before.key(src)),
        "the source's state was lost"
    );
    assert_eq!(updated.total("new_sources"), before.total("new_sources"));

    let result = run_udp(&lab, flow, Duration::from_secs(2));
    let passed = stats(lab.rx_ns(), &iface).key(src).passed_bytes - updated.key(src).passed_bytes;
    assert_near(
        "passed at 4mbit after the reload",
        passed as f64,
        4e6 / 8.0 * result.offered_secs + 65_536.0,
        65_536.0,
    );
    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    let _ = fs::remove_dir_all(&dir);
}

/// Reload with a broken file: one line in the log naming the file, line and field; the
/// attachment as it was; the daemon still running and reloading.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn sighup_with_a_broken_file_keeps_the_running_configuration() {
    let lab = new_lab("dm-bad");
    let iface = lab.rx_iface().to_owned();
    let _guard = guard(lab.rx_ns(), &iface);
    let dir = scratch("dm-bad");
    let file = dir.join("shaper.toml");
    fs::write(&file, config(&iface, "8mbit")).unwrap();
    let mut daemon = Daemon::start(lab.rx_ns(), &file, &["--no-watch"]);
    let before = status(&lab, &iface);
    let program = prog_id(&lab);

    fs::write(&file, config(&iface, "8mbit").replace("64k", "lots")).unwrap();
    let said = daemon.reload();
    assert!(said.contains("refused"), "{said}");
    let log = daemon.log();
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(refused.len(), 1, "{log}");
    let line = refused[0];
    assert!(
        line.contains(&format!("{}:4:", file.display())) && line.contains("burst"),
        "no file:line: field in {line:?}"
    );
    assert_eq!(
        log.lines().count(),
        3,
        "one line for the start, one for the metrics server, one for the reload: {log}"
    );
    assert_eq!(status(&lab, &iface), before);
    assert_eq!(prog_id(&lab), program);

    // A file naming an interface that does not exist is refused whole, too.
    fs::write(&file, config("nosuchif0", "4mbit")).unwrap();
    assert!(daemon.reload().contains("nosuchif0"));
    assert_eq!(status(&lab, &iface), before);
    // And a good file afterwards applies.
    fs::write(&file, config(&iface, "4mbit")).unwrap();
    assert!(daemon.reload().contains("updated"));
    assert_eq!(rate(&lab, &iface), 4_000_000);
    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    let _ = fs::remove_dir_all(&dir);
}

/// SIGTERM leaves the attachment enforcing (a source over the rate is still dropped);
/// a second daemon is refused while one runs; with --detach-on-exit nothing is left.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn sigterm_leaves_enforcement_in_place() {
    let lab = new_lab("dm-term");
    let iface = lab.rx_iface().to_owned();
    let _guard = guard(lab.rx_ns(), &iface);
    let dir = scratch("dm-term");
    let file = dir.join("shaper.toml");
    fs::write(&file, config(&iface, "8mbit")).unwrap();
    let daemon = Daemon::start(lab.rx_ns(), &file, &["--no-watch"]);

    let second = shaper(lab.rx_ns(), &["run", "-f", file.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && said.lines().count() == 1,
        "{said}"
    );
    assert!(said.contains("another `shaper run`"), "{said}");

    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    assert!(log.contains("stay in force"), "{log}");
    assert_eq!(rate(&lab, &iface), 8_000_000);
    let src = lab.sources()[0];
    run_udp(
        &lab,
        Flow {
            src: src.into(),
            offered_bps: 16_000_000,
            frame_bytes: 1000,
        },
        Duration::from_secs(1),
    );
    let counts = stats(lab.rx_ns(), &iface).key(src);
    assert!(
        counts.dropped_bytes > 0 && counts.passed_bytes > 0,
        "{counts:?}"
    );

    let daemon = Daemon::start(lab.rx_ns(), &file, &["--no-watch", "--detach-on-exit"]);
    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    assert!(!lab.xdp_attached().unwrap(), "still attached: {log}");
    let out = shaper(lab.rx_ns(), &["status", &iface]);
    assert!(!out.status.success(), "{out:?}");
    let _ = fs::remove_dir_all(&dir);
}

/// Scrapes `path` from the daemon's server in the lab's namespace with curl: `/top` on its
/// own listener (`--top`), the rest on the metrics one.
fn scrape(lab: &Lab, path: &str) -> String {
    let port = if path.starts_with("/top") { 9754 } else { 9753 };
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.rx_ns(),
            "curl",
            "-sfS",
            "--max-time",
            "5",
        ])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "curl {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Parses a scrape with the Prometheus project's own OpenMetrics parser (Debian's
/// python3-prometheus-client), which refuses anything off the format; returns each
/// sample as `name{label="value",...}` (labels sorted) and its value.
fn parse(text: &str) -> Vec<(String, f64)> {
    const SCRIPT: &str = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join('%s="%s"' % kv for kv in sorted(s.labels.items()))
        print("%s{%s} %r" % (s.name, labels, s.value))
"#;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (cargo xtask setup installs python3-prometheus-client)");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn sample(samples: &[(String, f64)], series: &str) -> u64 {
    samples
        .iter()
        .find(|(name, _)| name == series)
        .map(|(_, v)| *v as u64)
        .unwrap_or_else(|| panic!("no {series} in the scrape"))
}

/// `/metrics` in the lab: valid for Prometheus's own parser, counters that rise with
/// traffic and equal `stats -j`'s, per-policy counters, no address in any label; `/top`
/// lists the source, bounded by n.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn metrics_match_stats_and_parse() {
    let lab = new_lab("dm-prom");
    let iface = lab.rx_iface().to_owned();
    let _guard = guard(lab.rx_ns(), &iface);
    lab.rx_netns()
        .ip(&["link", "set", "dev", "lo", "up"])
        .unwrap();
    let src = lab.sources()[0];
    let [a, b, c, _] = src.octets();
    let prefix = format!("{a}.{b}.{c}.0/24");
    let dir = scratch("dm-prom");
    let file = dir.join("shaper.toml");
    fs::write(
        &file,
        config(&iface, "8mbit")
            + &format!(
                "\n[[interface.policy]]\nprefix = \"{prefix}\"\nrate = \"4mbit\"\nburst = \"64k\"\n"
            ),
    )
    .unwrap();
    let daemon = Daemon::start(lab.rx_ns(), &file, &["--no-watch", "--top"]);
    let labels = format!("direction=\"ingress\",interface=\"{iface}\"");
    let before = parse(&scrape(&lab, "/metrics"));
    assert_eq!(
        sample(&before, &format!("shaper_passed_bytes_total{{{labels}}}")),
        0
    );

    run_udp(
        &lab,
        Flow {
            src: src.into(),
            offered_bps: 16_000_000,
            frame_bytes: 1000,
        },
        Duration::from_secs(1),
    );
    let text = scrape(&lab, "/metrics");
    let after = parse(&text);
    let totals = stats(lab.rx_ns(), &iface);
    for name in [
        "passed_bytes",
        "passed_packets",
        "dropped_bytes",
        "dropped_packets",
    ] {
        let got = sample(&after, &format!("shaper_{name}_total{{{labels}}}"));
        assert_eq!(got, totals.total(name), "{name}");
        assert!(got > 0, "{name} did not rise");
    }
    let policy = format!("direction=\"ingress\",interface=\"{iface}\",policy=\"{prefix}\"");
    assert!(
        sample(
            &after,
            &format!("shaper_policy_dropped_bytes_total{{{policy}}}")
        ) > 0
    );
    // Labels come sorted: direction, family, interface. The keys are counted in the
    // background, every second at this size: the source is there within two.
    let family = format!("direction=\"ingress\",family=\"ipv4\",interface=\"{iface}\"");
    let tracked = format!("shaper_sources_tracked{{{family}}}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while sample(&parse(&scrape(&lab, "/metrics")), &tracked) != 1 {
        assert!(Instant::now() < deadline, "{tracked} is not 1 after 2 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    for (series, _) in &after {
        assert!(series.starts_with("shaper_"), "{series}");
        assert!(
            !series.contains(&format!("\"{src}\"")),
            "an address label: {series}"
        );
    }
    eprintln!("a scrape:\n{text}");

    let top: Value =
        serde_json::from_str(&scrape(&lab, &format!("/top?iface={iface}&n=1"))).unwrap();
    let rows = top["top_sources"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{top}");
    assert_eq!(rows[0]["source"], src.to_string(), "{top}");
    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    let _ = fs::remove_dir_all(&dir);
}

/// Without --no-watch, a file replaced as editors save it (written beside, renamed over)
/// is applied without a signal, once; a broken one is refused the same way.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_changed_file_is_applied_without_a_signal() {
    let lab = new_lab("dm-watch");
    let iface = lab.rx_iface().to_owned();
    let _guard = guard(lab.rx_ns(), &iface);
    let dir = scratch("dm-watch");
    let file = dir.join("shaper.toml");
    fs::write(&file, config(&iface, "8mbit")).unwrap();
    let mut daemon = Daemon::start(lab.rx_ns(), &file, &["--no-metrics"]);
    let save = |text: String| {
        let beside = dir.join(".shaper.toml.swp");
        fs::write(&beside, text).unwrap();
        fs::rename(&beside, &file).unwrap();
    };
    save(config(&iface, "4mbit"));
    daemon.wait_for("RELOADING=1");
    let said = daemon.wait_for("READY=1");
    assert!(said.contains(&format!("{iface} updated")), "{said}");
    assert_eq!(rate(&lab, &iface), 4_000_000);
    save(config(&iface, "2mbit").replace("64k", "lots"));
    daemon.wait_for("RELOADING=1");
    assert!(daemon.wait_for("READY=1").contains("refused"));
    assert_eq!(rate(&lab, &iface), 4_000_000);
    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    let reloads = log
        .lines()
        .filter(|l| l.contains("the file changed"))
        .count();
    assert_eq!(reloads, 2, "one reload per save: {log}");
    let _ = fs::remove_dir_all(&dir);
}

/// An interface the file names (a dummy or a bridge), deleted and made again, is attached
/// again with the file's settings, from the link event alone (no signal, no file change):
/// within 2 s, by a program loaded and linked over its pins (verified in pieces, a load
/// takes a fraction of a second), keeping the interface's cells and counters; again and
/// again.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_recreated_interface_is_attached_again() {
    const DUMMY: &str = "shdmn0";
    let lab = new_lab("dm-link");
    let ns = lab.rx_netns();
    // A dummy interface, or where the kernel has no dummy driver, a bridge without ports.
    let add = || {
        ["dummy", "bridge"]
            .into_iter()
            .find(|kind| ns.ip(&["link", "add", DUMMY, "type", kind]).is_ok())
            .expect("the kernel has neither a dummy nor a bridge driver");
        ns.ip(&["link", "set", "dev", DUMMY, "up"]).unwrap();
    };
    add();
    let _guard = guard(lab.rx_ns(), DUMMY);
    let dir = scratch("dm-link");
    let file = dir.join("shaper.toml");
    fs::write(&file, config(DUMMY, "8mbit")).unwrap();
    let attached = || {
        let out = Command::new("ip")
            .args(["-n", lab.rx_ns(), "-j", "link", "show", "dev", DUMMY])
            .output()
            .unwrap();
        serde_json::from_slice::<Vec<Value>>(&out.stdout)
            .ok()
            .and_then(|links| links.first().map(|l| l.get("xdp").is_some()))
            .unwrap_or(false)
    };
    // Deletes and makes the interface again; returns how long it took to be attached
    // again (panicking after `limit`).
    let recreate = |daemon: &Daemon, limit: Duration| {
        assert!(attached());
        ns.ip(&["link", "del", DUMMY]).unwrap();
        assert_eq!(status(&lab, DUMMY)["interface_present"], false);
        let start = Instant::now();
        add();
        while !attached() {
            assert!(
                start.elapsed() < limit,
                "not attached again within {limit:?}: {}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = start.elapsed();
        eprintln!("attached again after {took:?}");
        let out = shaper(lab.rx_ns(), &["-j", "status", DUMMY]);
        assert!(out.status.success(), "{out:?}: {}", daemon.log());
        assert_eq!(rate(&lab, DUMMY), 8_000_000);
        took
    };

    let daemon = Daemon::start(lab.rx_ns(), &file, &["--no-metrics"]);
    // The maps (every cell and counter) are the ones pinned before: the same map ids.
    let at = Attachment::new(DUMMY, Some(lab.rx_ns()));
    let maps =
        || [at.sources(), at.counters()].map(|pin| shaper_user::bpf::map_info(&pin).unwrap().id);
    let before = maps();
    recreate(&daemon, Duration::from_secs(2));
    recreate(&daemon, Duration::from_secs(2));
    assert_eq!(maps(), before, "the maps were made anew");
    let (exit, log) = daemon.stop();
    assert!(exit.success(), "{exit}: {log}");
    assert_eq!(
        log.matches(&format!(
            "{DUMMY} appeared: attached it again (its program and maps kept)"
        ))
        .count(),
        2,
        "{log}"
    );
    let _ = fs::remove_dir_all(&dir);
}
