//! `shaper apply` and `shaper config show` end to end against the real kernel, inside a
//! throwaway lab: the round trip, all-or-nothing on bad files and on failures part way,
//! and `--check`, which must not touch the kernel at all.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{fs, path::PathBuf};

use common::{TempFile, attach, guard, nobody_binary, shaper, shaper_ok};
use shaper_lab::{cli::AttachGuard, lab::Lab};

/// A port-less bridge in the rx namespace: no native XDP, so `xdp_mode = "native"` fails
/// on it when it is attached, after the checks.
const BRIDGE: &str = "shbr0";

/// Where shaper pins in the lab's rx namespace, spelled out here.
fn pin_dir(lab: &Lab, iface: &str) -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/shaper/netns/{}/{iface}", lab.rx_ns()))
}

/// Detaches `iface` in the lab's rx namespace when dropped.
fn detach_on_drop(lab: &Lab, iface: &str) -> AttachGuard {
    guard(lab.rx_ns(), iface)
}

/// [`shaper_ok`] in the lab's rx namespace.
fn ok(lab: &Lab, args: &[&str]) -> String {
    shaper_ok(lab.rx_ns(), args)
}

/// Runs a command that must fail; returns its one error line.
fn refused(lab: &Lab, args: &[&str]) -> String {
    let out = shaper(lab.rx_ns(), args);
    assert!(!out.status.success(), "shaper {args:?} succeeded");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    err.trim_end().to_owned()
}

fn show(lab: &Lab, iface: &str) -> String {
    ok(lab, &["config", "show", iface])
}

/// The ISP example: a default rate with a packet rate, a customer /24 capped per address
/// (its excess marked CS1: a bandwidth profile) and in aggregate, the operator's own
/// servers exempt, an abusive IPv6 /48 blocked, one trial in monitor.
fn isp(iface: &str) -> String {
    format!(
        r#"
[[interface]]
name = "{iface}"
rate = "10mbit"
burst = "64k"
new_sources = 2000
new_sources_burst = 200000
packet_rate = "20k"
packet_burst = 2000

[[interface.policy]]
prefix = "203.0.113.0/24"
rate = "4mbit"
burst = "64k"
aggregate_rate = "10mbit"
aggregate_burst = "128k"
excess_rate = "6mbit"
excess_burst = "64k"
excess_dscp = "cs1"

[[interface.policy]]
prefix = "192.0.2.0/28"
action = "pass"

[[interface.policy]]
prefix = "2001:db8:bad::/48"
action = "drop"

[[interface.policy]]
prefix = "198.51.100.0/24"
rate = "1mbit"
burst = "16k"
mode = "monitor"
new_sources = 50
"#
    )
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn apply_then_show_round_trips() {
    let lab = Lab::new("apply", 1).unwrap();
    let iface = lab.rx_iface();
    let _detach = detach_on_drop(&lab, iface);
    let file = TempFile::new("isp", &isp(iface));
    assert_eq!(
        ok(&lab, &["apply", "-f", file.path()]),
        format!("{iface}: attached, 4 policies\n")
    );
    let shown = show(&lab, iface);
    for line in [
        "rate = \"10mbit\"",
        "prefix = \"203.0.113.0/24\"",
        "aggregate_burst = \"128k\"",
        "action = \"pass\"",
        "prefix = \"2001:db8:bad::/48\"",
        "mode = \"monitor\"",
        "new_sources = 2000",
        "new_sources_burst = 200000",
        "new_sources = 50",
        "packet_rate = \"20k\"",
        "packet_burst = \"2k\"",
        "excess_rate = \"6mbit\"",
        "excess_dscp = \"cs1\"",
    ] {
        assert!(shown.contains(line), "{line} missing from:\n{shown}");
    }
    // What show prints, apply takes back unchanged, and show prints it again.
    let again = TempFile::new("shown", &shown);
    assert_eq!(
        ok(&lab, &["apply", "-f", again.path()]),
        format!("{iface}: unchanged, 4 policies\n")
    );
    assert_eq!(show(&lab, iface), shown);
    // The policies are in force as listed.
    let rows: serde_json::Value =
        serde_json::from_str(&ok(&lab, &["-j", "policy", "list", iface])).unwrap();
    let prefixes: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prefix"].as_str().unwrap())
        .collect();
    assert_eq!(
        prefixes,
        [
            "default",
            "192.0.2.0/28",
            "198.51.100.0/24",
            "203.0.113.0/24",
            "2001:db8:bad::/48"
        ]
    );
    let profile = &rows[3];
    assert_eq!(
        (
            &profile["excess_rate_bps"],
            &profile["excess_burst_bytes"],
            &profile["excess_dscp"]
        ),
        (&6_000_000.into(), &65_536.into(), &8.into()),
        "{profile}"
    );
    let status = |lab: &Lab| -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(&ok(lab, &["-j", "status", iface])).unwrap()[0]
            .clone()
    };
    let s = status(&lab);
    assert_eq!(
        (&s["packet_rate_per_sec"], &s["packet_burst"]),
        (&20_000.into(), &2_000.into()),
        "{s}"
    );
    assert!(
        ok(&lab, &["status", iface]).contains("20k packets/s burst 2k"),
        "status"
    );
    // A file without one of the policies removes it; without the packet rate, the
    // default policy has none.
    let fewer = isp(iface)
        .replace(
            "[[interface.policy]]\nprefix = \"192.0.2.0/28\"\naction = \"pass\"\n",
            "",
        )
        .replace("packet_rate = \"20k\"\npacket_burst = 2000\n", "");
    let fewer = TempFile::new("fewer", &fewer);
    assert_eq!(
        ok(&lab, &["apply", "-f", fewer.path()]),
        format!("{iface}: updated, 3 policies\n")
    );
    let shown = show(&lab, iface);
    assert!(!shown.contains("192.0.2.0/28"));
    assert!(!shown.contains("packet_rate"), "{shown}");
    assert_eq!(status(&lab)["packet_rate_per_sec"], 0);
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_invalid_file_or_a_failure_part_way_changes_nothing() {
    let lab = Lab::new("applyx", 1).unwrap();
    let iface = lab.rx_iface();
    let _detach = detach_on_drop(&lab, iface);
    let _detach_bridge = detach_on_drop(&lab, BRIDGE);
    lab.rx_netns()
        .ip(&["link", "add", BRIDGE, "type", "bridge"])
        .unwrap();
    lab.rx_netns().ip(&["link", "set", BRIDGE, "up"]).unwrap();

    // Nothing attached yet: a failure on the second interface detaches the first again.
    // The second's files beside its pins (its subscribers' ids and prefixes) go too.
    let both = format!(
        "{}\n[[interface]]\nname = \"{BRIDGE}\"\nrate = \"1mbit\"\nburst = \"64k\"\nxdp_mode = \"native\"\nmax_subscribers = 8\n",
        isp(iface)
    );
    let both = TempFile::new("both", &both);
    let err = refused(&lab, &["apply", "-f", both.path()]);
    assert!(
        err.contains(BRIDGE) && err.contains("native XDP was refused"),
        "{err}"
    );
    assert!(!pin_dir(&lab, iface).exists(), "{iface} left attached");
    assert!(!pin_dir(&lab, BRIDGE).exists(), "{BRIDGE} left attached");
    for file in ["ids", "prefixes"] {
        let path = format!("/run/shaper.routes/{}.{BRIDGE}.ingress.{file}", lab.rx_ns());
        assert!(fs::metadata(&path).is_err(), "{path} left");
    }

    // Attached (by `attach`, then given policies by a file): the same failure puts the
    // first interface's settings and policies back.
    let _attached = attach(lab.rx_ns(), iface, "1mbit", "64k");
    let file = TempFile::new("good", &isp(iface));
    ok(&lab, &["apply", "-f", file.path()]);
    let before = show(&lab, iface);
    let changed = TempFile::new(
        "changed",
        &fs::read_to_string(&both.0)
            .unwrap()
            .replace("rate = \"10mbit\"", "rate = \"20mbit\"")
            .replace("192.0.2.0/28", "192.0.2.0/27"),
    );
    refused(&lab, &["apply", "-f", changed.path()]);
    assert_eq!(show(&lab, iface), before, "a failed apply changed {iface}");

    // A bad value: the error names the file, the line and the field; nothing changes.
    let text = isp(iface).replace("rate = \"4mbit\"", "rate = \"4mbt\"");
    let line = text.lines().position(|l| l.contains("4mbt")).unwrap() + 1;
    let bad = TempFile::new("bad", &text);
    let err = refused(&lab, &["apply", "-f", bad.path()]);
    assert!(
        err.starts_with(&format!(
            "shaper: {}:{line}: interface[0].policy[0].rate: invalid rate '4mbt'",
            bad.path()
        )),
        "{err}"
    );
    assert_eq!(show(&lab, iface), before);
    // So is a bad mark of a bandwidth profile.
    let text = isp(iface).replace("excess_dscp = \"cs1\"", "excess_dscp = \"cs9\"");
    let line = text.lines().position(|l| l.contains("cs9")).unwrap() + 1;
    let bad = TempFile::new("bad", &text);
    let err = refused(&lab, &["apply", "-f", bad.path()]);
    assert!(
        err.starts_with(&format!(
            "shaper: {}:{line}: interface[0].policy[0].excess_dscp: not a DSCP",
            bad.path()
        )),
        "{err}"
    );
    assert_eq!(show(&lab, iface), before);
    // A burst below one frame on this interface, found when the interfaces are checked.
    let small = TempFile::new(
        "small",
        &isp(iface).replace("burst = \"16k\"", "burst = \"1k\""),
    );
    let err = refused(&lab, &["apply", "-f", small.path()]);
    assert!(
        err.contains(
            "policy 198.51.100.0/24 burst: 1024 bytes is smaller than one full-size frame"
        ),
        "{err}"
    );
    assert_eq!(show(&lab, iface), before);
    // A setting the attachment cannot change in place is named as the file names it.
    let resized = TempFile::new(
        "resized",
        &isp(iface).replacen(
            "burst = \"64k\"\n",
            "burst = \"64k\"\nmax_sources = 1000\n",
            1,
        ),
    );
    let err = refused(&lab, &["apply", "-f", resized.path()]);
    assert!(
        err.ends_with(&format!(
            "interface {iface}: interface[0].max_sources: 1000 is less than the 262144 of the attached tables, which grow in place but never shrink; detach first to make them smaller (nothing was changed)"
        )),
        "{err}"
    );
    assert_eq!(show(&lab, iface), before);
}

#[test]
#[ignore = "needs root: creates network namespaces (cargo xtask test)"]
fn check_validates_without_touching_the_kernel() {
    let lab = Lab::new("applyc", 1).unwrap();
    let iface = lab.rx_iface();
    let _detach = detach_on_drop(&lab, iface);
    let good = TempFile::new("check", &isp(iface));
    let bad = TempFile::new(
        "checkbad",
        &isp(iface).replace("192.0.2.0/28", "192.0.2.1/28"),
    );
    // As nobody, with no capabilities, from a copy of the binary nobody can reach (as an
    // operator's would be): --check cannot load, attach or pin anything, and still answers.
    let binary = nobody_binary();
    let nobody = |file: &str| {
        binary
            .command(&["-n", lab.rx_ns(), "apply", "--check", "-f", file])
            .output()
            .expect("run setpriv")
    };
    let out = nobody(good.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}: valid: 1 interface, 4 policies\n", good.path())
    );
    let out = nobody(bad.path());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("interface[0].policy[1].prefix: invalid prefix '192.0.2.1/28'"),
        "{err}"
    );
    // And as root, nothing is attached or pinned afterwards either.
    ok(&lab, &["apply", "--check", "-f", good.path()]);
    assert!(!pin_dir(&lab, iface).exists());
    assert!(!lab.xdp_attached().unwrap());
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn policy_commands_refuse_bad_input_and_change_nothing() {
    let lab = Lab::new("polcli", 1).unwrap();
    let iface = lab.rx_iface();
    // Not attached yet: named as such.
    let err = refused(
        &lab,
        &["policy", "set", iface, "10.0.0.0/8", "--action", "pass"],
    );
    assert!(err.contains("not attached"), "{err}");
    let _attached = attach(lab.rx_ns(), iface, "10mbit", "64k");
    ok(
        &lab,
        &[
            "policy",
            "set",
            iface,
            "10.0.0.0/8",
            "--rate",
            "1mbit",
            "--burst",
            "64k",
        ],
    );
    let before = show(&lab, iface);
    for (args, needle) in [
        (
            vec!["10.0.0.1/8", "--action", "pass"],
            "invalid prefix '10.0.0.1/8': host bits are set (did you mean 10.0.0.0/8?)",
        ),
        (
            vec!["10.0.0.0/33", "--action", "pass"],
            "invalid prefix '10.0.0.0/33'",
        ),
        (
            vec!["10.0.0.0/8"],
            "--action limit needs --rate and --burst",
        ),
        (
            vec!["10.0.0.0/8", "--action", "drop", "--rate", "1mbit"],
            "--rate has no meaning with --action drop",
        ),
        (
            vec!["10.0.0.0/8", "--rate", "1mbt", "--burst", "64k"],
            "invalid rate '1mbt'",
        ),
        (
            vec!["10.0.0.0/8", "--rate", "1mbit", "--burst", "1k"],
            "--burst 1k: 1024 bytes is smaller than one full-size frame",
        ),
        (
            vec![
                "10.0.0.0/8",
                "--rate",
                "1mbit",
                "--burst",
                "64k",
                "--aggregate-rate",
                "2mbit",
            ],
            "--aggregate-burst",
        ),
        (
            vec!["2001:db8::1", "--action", "pass"],
            "2001:db8::1/128 is longer than the /64 sources are keyed by",
        ),
        (
            vec!["10.0.0.0/8", "--action", "pass", "--new-sources", "0"],
            "'0' is not a positive whole number of keys a second, or unlimited",
        ),
        (
            vec!["10.0.0.0/8", "--action", "pass", "--new-sources", "many"],
            "'many' is not a positive whole number",
        ),
        (
            vec![
                "10.0.0.0/8",
                "--action",
                "pass",
                "--new-sources-burst",
                "10",
            ],
            "--new-sources",
        ),
        (
            vec![
                "10.0.0.0/8",
                "--action",
                "pass",
                "--new-sources",
                "unlimited",
                "--new-sources-burst",
                "10",
            ],
            "--new-sources-burst 10 has no meaning with --new-sources unlimited",
        ),
        (
            vec![
                "10.0.0.0/8",
                "--action",
                "pass",
                "--new-sources",
                "1",
                "--new-sources-burst",
                "99999999999999999",
            ],
            "invalid --new-sources-burst 99999999999999999: burst lasts more than 208 days at this rate",
        ),
    ] {
        let mut full = vec!["policy", "set", iface];
        full.extend(args);
        let err = refused(&lab, &full);
        assert!(err.contains(needle), "{full:?}: {err}");
        assert_eq!(show(&lab, iface), before, "{full:?} changed something");
    }
    let err = refused(&lab, &["policy", "del", iface, "10.1.0.0/16"]);
    assert!(err.ends_with("no policy for 10.1.0.0/16"), "{err}");
    assert_eq!(show(&lab, iface), before);
    ok(&lab, &["policy", "del", iface, "10.0.0.0/8"]);
    assert!(!show(&lab, iface).contains("[[interface.policy]]"));
}

/// A file with subscribers: two named plans (a residential one, a business one with a
/// committed and a peak rate), a dual-stack subscriber (an IPv4 /32 and an IPv6 /56) and a
/// business circuit of each family, beside a prefix policy.
fn with_subscribers(iface: &str, c1_plan: &str) -> String {
    format!(
        r#"
[plan.residential]
rate = "20mbit"
burst = "256k"

[plan.business]
rate = "50mbit"
burst = "512k"
excess_rate = "50mbit"
excess_burst = "512k"
excess_dscp = "af11"

[[interface]]
name = "{iface}"
rate = "10mbit"
burst = "64k"
max_subscribers = 16

[[interface.policy]]
prefix = "203.0.113.0/24"
rate = "4mbit"
burst = "64k"

[[interface.subscriber]]
id = "c1"
name = "Smith"
prefixes = ["100.64.0.1/32", "fdd7:b724:0:100::/56"]
plan = "{c1_plan}"

[[interface.subscriber]]
id = "b2"
prefixes = ["198.51.100.8/29", "2001:db8:2077::/48"]
plan = "business"
"#
    )
}

/// `subscriber list -j` as (id, prefixes, rate, excess rate) by id.
fn subscribers(lab: &Lab, iface: &str) -> Vec<(String, Vec<String>, u64, u64)> {
    let list: serde_json::Value =
        serde_json::from_str(&ok(lab, &["-j", "subscriber", "list", iface])).unwrap();
    let mut rows: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let prefixes = s["prefixes"].as_array().unwrap();
            (
                s["id"].as_str().unwrap().to_owned(),
                prefixes
                    .iter()
                    .map(|p| p.as_str().unwrap().to_owned())
                    .collect(),
                s["rate_bps"].as_u64().unwrap(),
                s["excess_rate_bps"].as_u64().unwrap(),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// `apply -j`'s subscriber counts of its one interface: added, changed, unchanged, removed.
fn applied(lab: &Lab, file: &TempFile) -> [u64; 4] {
    let out: serde_json::Value =
        serde_json::from_str(&ok(lab, &["-j", "apply", "-f", file.path()])).unwrap();
    let s = &out[0]["subscribers"];
    ["added", "changed", "unchanged", "removed"].map(|k| s[k].as_u64().unwrap())
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn subscribers_in_the_file_are_written_only_where_they_differ() {
    let lab = Lab::new("applys", 1).unwrap();
    let iface = lab.rx_iface();
    let _detach = detach_on_drop(&lab, iface);
    let file = TempFile::new("subs", &with_subscribers(iface, "residential"));
    assert_eq!(applied(&lab, &file), [2, 0, 0, 0]);
    let residential = [
        (
            "b2".to_owned(),
            vec![
                "198.51.100.8/29".to_owned(),
                "2001:db8:2077::/48".to_owned(),
            ],
            50_000_000,
            50_000_000,
        ),
        (
            "c1".to_owned(),
            vec![
                "100.64.0.1/32".to_owned(),
                "fdd7:b724:0:100::/56".to_owned(),
            ],
            20_000_000,
            0,
        ),
    ];
    assert_eq!(subscribers(&lab, iface), residential);
    // The same file again writes nothing; one plan changed writes that subscriber alone.
    assert_eq!(applied(&lab, &file), [0, 0, 2, 0]);
    let upgraded = TempFile::new("subs2", &with_subscribers(iface, "business"));
    assert_eq!(applied(&lab, &upgraded), [0, 1, 1, 0]);
    let mut business = residential.clone();
    business[1].2 = 50_000_000;
    business[1].3 = 50_000_000;
    assert_eq!(subscribers(&lab, iface), business);
    // The routes the batch left are kept beside the lock: the next apply reads them, not
    // the tries, while the policy generation is the one they were saved at. A change of
    // prefixes by `subscriber set` (its plan the file's) moves it on, of either family:
    // the file is not trusted, and the apply puts the file's prefixes back.
    let known = format!("/run/shaper.routes/{}.{iface}.ingress", lab.rx_ns());
    assert!(fs::metadata(&known).is_ok(), "{known}");
    let set_c1 = |prefixes: [&str; 2]| {
        ok(
            &lab,
            &[
                "subscriber",
                "set",
                iface,
                "c1",
                "--prefix",
                prefixes[0],
                "--prefix",
                prefixes[1],
                "--rate",
                "50mbit",
                "--burst",
                "512k",
                "--excess-rate",
                "50mbit",
                "--excess-burst",
                "512k",
                "--excess-dscp",
                "af11",
            ],
        )
    };
    for moved in [
        ["100.64.0.2/32", "fdd7:b724:0:100::/56"],
        ["100.64.0.1/32", "fdd7:b724:0:200::/56"],
    ] {
        set_c1(moved);
        assert_eq!(applied(&lab, &upgraded), [0, 1, 1, 0], "after {moved:?}");
        assert_eq!(subscribers(&lab, iface), business, "after {moved:?}");
    }
    assert_eq!(applied(&lab, &upgraded), [0, 0, 2, 0]);
    // A removal reads its routes from the file too: none is left, of either family (a
    // subscriber of the same prefixes is taken), and the file is saved without them.
    ok(&lab, &["subscriber", "del", iface, "c1"]);
    assert_eq!(subscribers(&lab, iface), business[..1]);
    let c1_prefixes = ["100.64.0.1/32", "fdd7:b724:0:100::/56"];
    ok(
        &lab,
        &[
            "subscriber",
            "set",
            iface,
            "c7",
            "--prefix",
            c1_prefixes[0],
            "--prefix",
            c1_prefixes[1],
            "--rate",
            "1mbit",
            "--burst",
            "64k",
        ],
    );
    ok(&lab, &["subscriber", "del", iface, "c7"]);
    assert_eq!(applied(&lab, &upgraded), [1, 0, 1, 0]);
    assert_eq!(subscribers(&lab, iface), business);
    // `config show` prints them back (plans inline), and apply takes that back unchanged.
    let shown = TempFile::new("subs-shown", &show(&lab, iface));
    assert_eq!(applied(&lab, &shown), [0, 0, 2, 0]);
    assert_eq!(show(&lab, iface), fs::read_to_string(&shown.0).unwrap());

    // One set by `subscriber set` stays (no prune_subscribers)...
    ok(
        &lab,
        &[
            "subscriber",
            "set",
            iface,
            "c9",
            "--prefix",
            "100.64.9.9",
            "--rate",
            "1mbit",
            "--burst",
            "64k",
        ],
    );
    assert_eq!(applied(&lab, &upgraded), [0, 0, 2, 0]);
    assert_eq!(subscribers(&lab, iface).len(), 3);
    // ... and an overlap with it is refused before anything is written.
    let over = TempFile::new(
        "subs3",
        &with_subscribers(iface, "residential").replace("100.64.0.1/32", "100.64.9.9/32"),
    );
    let err = refused(&lab, &["apply", "-f", over.path()]);
    assert!(
        err.contains("subscribers:") && err.contains("100.64.9.9/32"),
        "{err}"
    );
    assert_eq!(subscribers(&lab, iface).len(), 3);
    assert_eq!(subscribers(&lab, iface)[..2], business[..]);

    // A policy's prefix given to a subscriber in one file, of each family: checked against
    // the policies the file leaves (written before the subscribers), not those it removes.
    let v6_policy = "\n[[interface.policy]]\nprefix = \"2001:db8:f00::/48\"\nrate = \"4mbit\"\nburst = \"64k\"\n";
    let with_v6 = TempFile::new(
        "subs-v6",
        &(with_subscribers(iface, "business") + v6_policy),
    );
    assert_eq!(applied(&lab, &with_v6), [0, 0, 2, 0]);
    let moved = with_subscribers(iface, "business")
        .replace("203.0.113.0/24", "192.0.2.0/24")
        .replace(
            "\"100.64.0.1/32\", \"fdd7:b724:0:100::/56\"",
            "\"100.64.0.1/32\", \"fdd7:b724:0:100::/56\", \"203.0.113.0/24\", \"2001:db8:f00::/48\"",
        );
    let moved = TempFile::new("subs-moved", &moved);
    assert_eq!(applied(&lab, &moved), [0, 1, 1, 0]);
    let c1 = subscribers(&lab, iface).remove(1);
    assert_eq!(c1.0, "c1");
    for p in ["203.0.113.0/24", "2001:db8:f00::/48"] {
        assert!(c1.1.contains(&p.to_owned()), "{p} not c1's: {c1:?}");
    }
    let policies = ok(&lab, &["-j", "policy", "list", iface]);
    assert!(
        policies.contains("192.0.2.0/24")
            && !policies.contains("203.0.113.0/24")
            && !policies.contains("2001:db8:f00::/48"),
        "{policies}"
    );

    // Overlaps within the file, and a bad plan: refused at their line and field, nothing
    // applied.
    for (text, needle, field) in [
        (
            with_subscribers(iface, "business").replace("203.0.113.0/24", "100.64.0.1/32"),
            "\"100.64.0.1/32\", \"fdd7",
            "interface[0].subscriber[0].prefixes: policy 100.64.0.1/32 is subscriber c1's prefix too",
        ),
        (
            with_subscribers(iface, "business")
                .replace("2001:db8:2077::/48", "fdd7:b724:0:100::/64"),
            "fdd7:b724:0:100::/64",
            "interface[0].subscriber[1].prefixes: subscriber b2's prefix fdd7:b724:0:100::/64 is inside subscriber c1's prefix fdd7:b724:0:100::/56",
        ),
        (
            with_subscribers(iface, "business")
                .replace("rate = \"50mbit\"\nburst", "rate = \"50mbt\"\nburst"),
            "50mbt",
            "plan.business.rate: invalid rate '50mbt'",
        ),
        (
            with_subscribers(iface, "gold"),
            "\"gold\"",
            "interface[0].subscriber[0].plan: no [plan.gold] in the file",
        ),
    ] {
        let line = text.lines().position(|l| l.contains(needle)).unwrap() + 1;
        let bad = TempFile::new("subs4", &text);
        let err = refused(&lab, &["apply", "-f", bad.path()]);
        let want = format!("shaper: {}:{line}: {field}", bad.path());
        assert!(err.starts_with(&want), "{err}\nwanted {want}");
        assert_eq!(subscribers(&lab, iface).len(), 3);
    }

    // A LibreQoS file named by the configuration, relative to it; prune_subscribers removes
    // the others.
    let csv = std::env::temp_dir().join(format!("shaper-test-{}.csv", std::process::id()));
    let csv_text = "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n\
q1,Quinn,d1,Router,AP,,\"100.64.1.1, 100.64.1.2\",fdd7:b724:1::/56,1,2.5,10,5.5,\n";
    fs::write(&csv, csv_text).unwrap();
    let text = format!(
        "[[interface]]\nname = \"{iface}\"\nrate = \"10mbit\"\nburst = \"64k\"\nmax_subscribers = 16\nprune_subscribers = true\n\n[interface.libreqos]\nfile = \"{}\"\n",
        csv.file_name().unwrap().to_str().unwrap()
    );
    let from_csv = TempFile::new("subs5", &text);
    let got = applied(&lab, &from_csv);
    fs::remove_file(&csv).unwrap();
    assert_eq!(got, [1, 0, 0, 3]);
    assert_eq!(
        subscribers(&lab, iface),
        [(
            "q1".to_owned(),
            vec![
                "100.64.1.1/32".to_owned(),
                "100.64.1.2/32".to_owned(),
                "fdd7:b724:1::/56".to_owned()
            ],
            5_500_000,
            0
        )]
    );
}

/// A LibreQoS file of circuits `c1` to `c6` (`c6` of two device rows, `c4` IPv4 alone,
/// `c5` IPv6 alone), `c2` at `c2_mbps`, with `extra` rows after them.
fn reapplied_csv(c2_mbps: &str, extra: &str) -> String {
    format!(
        "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n\
# a comment\n\
c1,Ames,d1,,,,100.64.0.1,fdd7:b724:0:100::/56,1,1,20,20,\n\
c2,Bell,d2,,,,100.64.0.2,fdd7:b724:0:200::/56,1,1,{c2_mbps},{c2_mbps},\n\
c3,Cole,d3,,,,100.64.0.3,fdd7:b724:0:300::/56,1,1,50,50,\n\
c4,Dunn,d4,,,,100.64.0.4,,1,1,10,10,\n\
c5,Eads,d5,,,,,fdd7:b724:0:500::/56,1,1,10,10,\n\
c6,Ford,d6a,,,,100.64.0.6,,1,1,100,100,\n\
c6,Ford,d6b,,,,,fdd7:b724:0:600::/56,1,1,100,100,\n\
{extra}"
    )
}

/// `apply -j -f FILE`, told to die once done if the rows were read as far as they changed
/// ([`shaper_user::rows`]): `None` if it died there (the fast way was taken, everything
/// written and committed), its subscriber counts otherwise (the file was read whole).
fn applied_reading_rows(lab: &Lab, file: &TempFile) -> Option<[u64; 4]> {
    use std::os::unix::process::ExitStatusExt as _;
    let out = std::process::Command::new(shaper_lab::bins::shaper())
        .args(["-n", lab.rx_ns(), "-j", "apply", "-f", file.path()])
        .env(shaper_user::crash::CRASH_AT_VAR, "apply-rows")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    if out.status.signal() == Some(libc::SIGKILL) {
        return None;
    }
    assert!(out.status.success(), "{out:?}");
    let out: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &out[0]["subscribers"];
    Some(["added", "changed", "unchanged", "removed"].map(|k| s[k].as_u64().unwrap()))
}

/// Runs alone, as `cargo xtask test` runs every test: a change another shaper makes on
/// the host meanwhile that may touch any attachment (a `detach`, a rollback) rightly makes
/// the saved rows untrusted, and the fast way is not taken where this test wants it.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_libreqos_file_applied_again_is_read_as_far_as_it_changed() {
    let lab = Lab::new("applyr", 1).unwrap();
    let iface = lab.rx_iface();
    let _detach = detach_on_drop(&lab, iface);
    let csv = std::env::temp_dir().join(format!("shaper-rows-{}.csv", std::process::id()));
    let _csv_gone = CsvGone(csv.clone());
    let text = format!(
        "[[interface]]\nname = \"{iface}\"\nrate = \"10mbit\"\nburst = \"64k\"\nmax_subscribers = 64\n\n[interface.libreqos]\nfile = \"{}\"\n",
        csv.file_name().unwrap().to_str().unwrap()
    );
    let file = TempFile::new("rows", &text);
    let write = |c2: &str, extra: &str| fs::write(&csv, reapplied_csv(c2, extra)).unwrap();
    let rate_of = |id: &str| {
        let all = subscribers(&lab, iface);
        let s = all.iter().find(|s| s.0 == id).unwrap();
        (s.1.clone(), s.2)
    };
    write("20", "");
    assert_eq!(applied(&lab, &file), [6, 0, 0, 0]);
    let before = subscribers(&lab, iface);

    // One row changed: the fast way is taken (the test build dies once it is done), and
    // it writes that subscriber alone; again, from the rows it saved.
    let c2 = before.iter().find(|s| s.0 == "c2").unwrap();
    for mbps in ["30", "40"] {
        write(mbps, "");
        assert_eq!(applied_reading_rows(&lab, &file), None, "at {mbps}");
        let bps = mbps.parse::<u64>().unwrap() * 1_000_000;
        assert_eq!(rate_of("c2"), (c2.1.clone(), bps));
        for s in before.iter().filter(|s| s.0 != "c2") {
            assert_eq!(rate_of(&s.0), (s.1.clone(), s.2), "{}", s.0);
        }
    }
    write("30", "");
    assert_eq!(applied(&lab, &file), [0, 1, 5, 0]);
    // The same file again: nothing to write, still the fast way.
    assert_eq!(applied_reading_rows(&lab, &file), None);
    assert_eq!(applied(&lab, &file), [0, 0, 6, 0]);

    // A `subscriber set` of another plan since (which moves no route, nor the policy
    // generation): the rows saved are not trusted, and the file's plan comes back, for a
    // subscriber of both families and one of each.
    for (id, prefixes, mbit) in [
        (
            "c3",
            &["100.64.0.3/32", "fdd7:b724:0:300::/56"][..],
            50_000_000,
        ),
        ("c4", &["100.64.0.4/32"][..], 10_000_000),
        ("c5", &["fdd7:b724:0:500::/56"][..], 10_000_000),
    ] {
        let mut args = vec!["subscriber", "set", iface, id];
        for p in prefixes {
            args.extend(["--prefix", p]);
        }
        args.extend(["--rate", "1mbit", "--burst", "64k"]);
        ok(&lab, &args);
        assert_eq!(rate_of(id).1, 1_000_000);
        assert_eq!(
            applied_reading_rows(&lab, &file),
            Some([0, 1, 5, 0]),
            "after {id}'s set"
        );
        let was = before.iter().find(|s| s.0 == id).unwrap();
        assert_eq!(rate_of(id), (was.1.clone(), mbit), "{id}");
        assert_eq!(applied_reading_rows(&lab, &file), None, "after {id}'s");
        assert_eq!(applied(&lab, &file), [0, 0, 6, 0]);
    }

    // A row whose prefix is inside (or is) an unchanged neighbour's, of each family: its
    // overlap is checked against that neighbour, and nothing is applied.
    let c7 = |cells: &str| format!("c7,Gray,d7,,,,{cells},1,1,10,10,\n");
    let c6_v6 = |to: &str| {
        reapplied_csv("30", "").replace("d6b,,,,,fdd7:b724:0:600::/56", &format!("d6b,,,,,{to}"))
    };
    for (csv_text, why) in [
        (
            reapplied_csv("30", &c7(",fdd7:b724:0:180::/64")),
            "subscriber c7's prefix fdd7:b724:0:180::/64 is inside subscriber c1's prefix fdd7:b724:0:100::/56",
        ),
        (
            reapplied_csv("30", &c7("100.64.0.1,")),
            "100.64.0.1/32 is already in circuit 'c1'",
        ),
        (
            c6_v6("fdd7:b724:0:1c0::/60"),
            "subscriber c6's prefix fdd7:b724:0:1c0::/60 is inside subscriber c1's prefix fdd7:b724:0:100::/56",
        ),
        (
            reapplied_csv("30", "").replace("d6a,,,,100.64.0.6", "d6a,,,,100.64.0.3"),
            "subscriber c3's prefix 100.64.0.3/32 is subscriber c6's prefix too",
        ),
    ] {
        fs::write(&csv, csv_text).unwrap();
        let err = refused(&lab, &["apply", "-f", file.path()]);
        assert!(err.contains(why), "{err}");
        assert_eq!(subscribers(&lab, iface).len(), 6, "{err}");
        write("30", "");
        assert_eq!(applied(&lab, &file), [0, 0, 6, 0]);
    }
    assert_eq!(applied_reading_rows(&lab, &file), None);

    // Circuits moved to other prefixes of each family are written the fast way too, those
    // subscribers alone, their old routes gone (the list reads the tries); and back.
    let now = subscribers(&lab, iface);
    let moved = reapplied_csv("30", "")
        .replace(
            "d2,,,,100.64.0.2,fdd7:b724:0:200::/56",
            "d2,,,,100.64.0.22,fdd7:b724:0:2200::/56",
        )
        .replace(
            "d5,,,,,fdd7:b724:0:500::/56",
            "d5,,,,,fdd7:b724:0:5500::/56",
        );
    fs::write(&csv, &moved).unwrap();
    assert_eq!(applied_reading_rows(&lab, &file), None, "moved");
    let want = |id: &str, prefixes: &[&str]| {
        let s = now.iter().find(|s| s.0 == id).unwrap();
        let p = prefixes.iter().map(|p| (*p).to_owned()).collect();
        (id.to_owned(), p, s.2, s.3)
    };
    let mut expected: Vec<_> = now
        .iter()
        .filter(|s| s.0 != "c2" && s.0 != "c5")
        .cloned()
        .collect();
    expected.push(want("c2", &["100.64.0.22/32", "fdd7:b724:0:2200::/56"]));
    expected.push(want("c5", &["fdd7:b724:0:5500::/56"]));
    expected.sort();
    assert_eq!(subscribers(&lab, iface), expected);
    write("30", "");
    assert_eq!(applied_reading_rows(&lab, &file), None, "moved back");
    assert_eq!(subscribers(&lab, iface), now);

    // Moves onto another moved circuit's prefixes (a swap, each family) take the whole
    // way, and end as the file says.
    let swapped = reapplied_csv("30", "")
        .replace("d4,,,,100.64.0.4,", "d4,,,,100.64.0.X,")
        .replace("d6a,,,,100.64.0.6,", "d6a,,,,100.64.0.4,")
        .replace("d4,,,,100.64.0.X,", "d4,,,,100.64.0.6,")
        .replace(
            "d1,,,,100.64.0.1,fdd7:b724:0:100::/56",
            "d1,,,,100.64.0.1,fdd7:b724:0:Y::/56",
        )
        .replace(
            "d3,,,,100.64.0.3,fdd7:b724:0:300::/56",
            "d3,,,,100.64.0.3,fdd7:b724:0:100::/56",
        )
        .replace("fdd7:b724:0:Y::/56", "fdd7:b724:0:300::/56");
    fs::write(&csv, &swapped).unwrap();
    assert_eq!(applied_reading_rows(&lab, &file), Some([0, 4, 2, 0]));
    let listed = subscribers(&lab, iface);
    let prefixes_of = |id: &str| listed.iter().find(|s| s.0 == id).unwrap().1.clone();
    assert_eq!(prefixes_of("c4"), ["100.64.0.6/32"]);
    assert_eq!(prefixes_of("c6"), ["100.64.0.4/32", "fdd7:b724:0:600::/56"]);
    assert_eq!(prefixes_of("c1"), ["100.64.0.1/32", "fdd7:b724:0:300::/56"]);
    assert_eq!(prefixes_of("c3"), ["100.64.0.3/32", "fdd7:b724:0:100::/56"]);
    write("30", "");
    assert_eq!(applied(&lab, &file), [0, 4, 2, 0]);
    assert_eq!(subscribers(&lab, iface), now);

    // A move the fast way refused by its lookups, each family (onto a prefix inside an
    // unchanged circuit's, around unchanged circuits'), with nothing applied.
    for (csv_text, why) in [
        (
            reapplied_csv("30", "").replace("d4,,,,100.64.0.4,", "d4,,,,100.64.0.0/30,"),
            "subscriber c1's prefix 100.64.0.1/32 is inside subscriber c4's prefix 100.64.0.0/30",
        ),
        (
            reapplied_csv("30", "")
                .replace("d5,,,,,fdd7:b724:0:500::/56", "d5,,,,,fdd7:b724:0:280::/58"),
            "fdd7:b724:0:280::/58 is inside subscriber c2's prefix fdd7:b724:0:200::/56",
        ),
    ] {
        // The saved rows trusted: the move is read as far as it changed.
        assert_eq!(applied_reading_rows(&lab, &file), None);
        fs::write(&csv, csv_text).unwrap();
        let err = refused(&lab, &["apply", "-f", file.path()]);
        assert!(err.contains(why), "{err}");
        assert_eq!(subscribers(&lab, iface), now, "{err}");
        // A rollback may have touched anything: the next apply reads the file whole.
        write("30", "");
        assert_eq!(applied(&lab, &file), [0, 0, 6, 0]);
    }
}

/// Removes the test's CSV when dropped.
struct CsvGone(PathBuf);

impl Drop for CsvGone {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// `--max-policies` (and `max_policies` in a file) sizes every map of one entry per policy
/// slot, the default's slot besides; prefix policies and subscribers' plans share the room,
/// one too many is refused in one line naming it with nothing changed, and the file the
/// attachment shows keeps the room.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn max_policies_sizes_the_policy_maps_and_bounds_them() {
    use shaper_common::{layout, maps::SIZED_BY_POLICIES};

    let lab = Lab::new("maxpol", 1).unwrap();
    let iface = lab.rx_iface();
    let slots = |iface: &str| -> Vec<u32> {
        layout::current()
            .maps
            .iter()
            .filter(|m| SIZED_BY_POLICIES.contains(&m.name))
            .map(|m| {
                shaper_user::bpf::map_info(&pin_dir(&lab, iface).join(m.pin))
                    .unwrap()
                    .max_entries
            })
            .collect()
    };
    {
        let _attached = attach(lab.rx_ns(), iface, "10mbit", "64k");
        assert_eq!(slots(iface), [1025; 7], "the default room");
        assert!(!show(&lab, iface).contains("max_policies"));
    }
    let _attached = detach_on_drop(&lab, iface);
    let base = ["attach", iface, "--rate", "10mbit", "--burst", "64k"];
    for (bad, needles) in [
        ("0", &["--max-policies", "0"][..]),
        ("16384", &["--max-policies", "16384", "16383"][..]),
    ] {
        let mut args = base.to_vec();
        args.extend(["--max-policies", bad]);
        let err = refused(&lab, &args);
        assert!(needles.iter().all(|n| err.contains(n)), "{err}");
        assert!(!pin_dir(&lab, iface).exists(), "{err}: pinned");
    }
    let mut args = base.to_vec();
    args.extend(["--max-policies", "2", "--max-subscribers", "4"]);
    ok(&lab, &args);
    assert_eq!(slots(iface), [3; 7]);
    let status: serde_json::Value =
        serde_json::from_str(&ok(&lab, &["status", iface, "-j"])).unwrap();
    assert_eq!(status[0]["max_policies"], 2, "{status}");
    // Fixed once attached.
    let at = args.len() - 3;
    args[at] = "3";
    let err = refused(&lab, &args);
    assert!(
        err.contains("--max-policies") && err.contains("detach"),
        "{err}"
    );
    assert_eq!(slots(iface), [3; 7]);
    // A plan and a prefix policy of each family: the third is one too many, whichever
    // takes the last slot.
    ok(
        &lab,
        &[
            "subscriber",
            "set",
            iface,
            "c1",
            "--prefix",
            "100.64.0.1",
            "--prefix",
            "fdd7:b724::/56",
            "--rate",
            "5mbit",
            "--burst",
            "64k",
        ],
    );
    ok(
        &lab,
        &[
            "policy",
            "set",
            iface,
            "10.0.0.0/8",
            "--rate",
            "1mbit",
            "--burst",
            "64k",
        ],
    );
    let before = show(&lab, iface);
    let err = refused(
        &lab,
        &[
            "policy",
            "set",
            iface,
            "2001:db8::/32",
            "--rate",
            "1mbit",
            "--burst",
            "64k",
        ],
    );
    assert!(
        err.contains("too many policies") && err.contains("--max-policies"),
        "{err}"
    );
    let err = refused(
        &lab,
        &[
            "subscriber",
            "set",
            iface,
            "c2",
            "--prefix",
            "100.64.0.2",
            "--rate",
            "7mbit",
            "--burst",
            "64k",
        ],
    );
    assert!(err.contains("--max-policies"), "{err}");
    assert_eq!(show(&lab, iface), before, "a refusal changed something");
    assert!(before.contains("max_policies = 2"), "{before}");
    // The same plan takes no slot of its own: a second subscriber of it fits.
    ok(
        &lab,
        &[
            "subscriber",
            "set",
            iface,
            "c2",
            "--prefix",
            "fdd7:b724:0:100::/56",
            "--rate",
            "5mbit",
            "--burst",
            "64k",
        ],
    );
    // The file the attachment shows makes it again as it is.
    let file = TempFile::new("maxpol.toml", &show(&lab, iface));
    ok(&lab, &["detach", iface]);
    ok(&lab, &["apply", "-f", file.path()]);
    assert_eq!(slots(iface), [3; 7]);
    assert_eq!(show(&lab, iface), fs::read_to_string(file.path()).unwrap());
}
