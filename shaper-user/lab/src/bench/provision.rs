//! Provisioning at scale (issue 31 item 3): whole `shaper` commands, process start to
//! exit, on a dummy interface in a namespace of the bench's own. Today's prefix policies
//! at their most (16,383; 1,000 with --quick: apply from nothing, the same file with one rate changed, one
//! `policy set`) beside subscribers at a million (apply of a LibreQoS file from nothing,
//! the same file with one plan changed, one `subscriber set` of a plan, one of a new
//! subscriber and its `subscriber del`, one moving a subscriber to other prefixes, one
//! refused by a full table), each repeated, in one run.
//!
//! Each command runs with its output discarded and is timed from spawn to exit; a command
//! that fails fails the bench. The policies' attachment is detached before the
//! subscribers' is made, so neither pays for the other's maps. Writes
//! `results-provision.md` and `.json` (`--only provision`).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, ensure};
use serde::Serialize;
use shaper_common::maps::MAX_POLICIES;

use super::{report::Machine, spread::Summary};
use crate::lab::Netns;

const IFACE: &str = "prov0";

#[derive(Clone, Debug, Serialize)]
pub struct Options {
    /// Prefix policies: at the most an interface holds (`MAX_POLICIES` less the default
    /// slot).
    pub policies: u32,
    pub subscribers: u32,
    /// Runs of each from-nothing apply (each makes the attachment again).
    pub cold_runs: usize,
    /// Runs of each other command.
    pub runs: usize,
}

impl Options {
    /// Issue 31's figures; quick: 1,000 policies, 10,000 subscribers and fewer runs.
    pub fn new(quick: bool) -> Self {
        match quick {
            false => Self {
                policies: MAX_POLICIES - 1,
                subscribers: 1_000_000,
                cold_runs: 2,
                runs: 5,
            },
            true => Self {
                policies: 1000,
                subscribers: 10_000,
                cold_runs: 2,
                runs: 2,
            },
        }
    }
}

/// One command's times, seconds.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Which `shaper`: "today", or the label of the one it is compared with.
    pub build: String,
    pub what: String,
    /// How many prefix policies or subscribers the attachment held.
    pub at: u32,
    pub seconds: Summary,
    /// The target for this figure, seconds, if it names one.
    pub target_secs: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub machine: Machine,
    pub options: Options,
    pub rows: Vec<Row>,
}

/// The namespace, its dummy interface and the files; detached and removed when dropped.
struct Rig {
    build: String,
    shaper: PathBuf,
    /// Whether the build sizes its policy slots (`--max-policies`, `max_policies`): the
    /// policies' file then asks for room for them all, as an older build always had.
    sized_policies: bool,
    dir: PathBuf,
    ns: Netns,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for d in ["ingress", "egress"] {
            let _ = Command::new(&self.shaper)
                .args(["-n", self.ns.name(), "--direction", d, "detach", IFACE])
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Rig {
    fn new(build: &str, shaper: &Path) -> Result<Self> {
        let name = format!("shaper-prov-{}", std::process::id());
        let ns = Netns::create(&name)?;
        ns.ip_output(&["link", "add", IFACE, "type", "dummy"])
            .or_else(|_| ns.ip_output(&["link", "add", IFACE, "type", "bridge"]))?;
        ns.ip_output(&["link", "set", IFACE, "up"])?;
        let dir = std::env::temp_dir().join(&name);
        fs::create_dir_all(&dir)?;
        let help = Command::new(shaper)
            .args(["attach", "--help"])
            .output()
            .context("cannot run shaper")?;
        Ok(Rig {
            build: build.to_owned(),
            shaper: shaper.to_owned(),
            sized_policies: String::from_utf8_lossy(&help.stdout).contains("--max-policies"),
            dir,
            ns,
        })
    }

    /// Runs `shaper -n NS ARGS...`, its output discarded: its time, seconds.
    fn time(&self, args: &[&str]) -> Result<f64> {
        let (secs, out) = self.run(args)?;
        ensure!(
            out.status.success(),
            "shaper {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(secs)
    }

    /// As [`Rig::time`], for a command that must be refused, saying `why`.
    fn time_refused(&self, args: &[&str], why: &str) -> Result<f64> {
        let (secs, out) = self.run(args)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains(why),
            "shaper {}: not refused with \"{why}\": {}",
            args.join(" "),
            err.trim()
        );
        Ok(secs)
    }

    fn run(&self, args: &[&str]) -> Result<(f64, std::process::Output)> {
        let t = Instant::now();
        let out = Command::new(&self.shaper)
            .args(["-n", self.ns.name()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .context("cannot run shaper")?;
        Ok((t.elapsed().as_secs_f64(), out))
    }

    fn write(&self, name: &str, text: &str) -> Result<String> {
        let path = self.dir.join(name);
        fs::write(&path, text)?;
        Ok(path.to_string_lossy().into_owned())
    }

    fn detach(&self) -> Result<()> {
        self.time(&["detach", IFACE]).map(drop)
    }

    /// `runs` applies of `file` from nothing (detached after each but the last).
    fn cold_applies(&self, file: &str, runs: usize) -> Result<Summary> {
        let mut times = Vec::new();
        for run in 0..runs {
            times.push(self.time(&["apply", "-f", file])?);
            if run + 1 < runs {
                self.detach()?;
            }
        }
        Ok(Summary::of(times))
    }

    /// `files[0]` applied from nothing, then the two files in turn (odd runs the second,
    /// which differs in one rate, even runs the first again): both summaries.
    fn applies(&self, files: &[String; 2], opts: &Options) -> Result<(Summary, Summary)> {
        let cold = self.cold_applies(&files[0], opts.cold_runs)?;
        let changed = self.repeated(opts.runs, |run| {
            vec!["apply".into(), "-f".into(), files[(run + 1) % 2].clone()]
        })?;
        Ok((cold, changed))
    }

    fn row(&self, what: &str, at: u32, seconds: Summary, target_secs: Option<f64>) -> Row {
        Row {
            build: self.build.clone(),
            what: what.into(),
            at,
            seconds,
            target_secs,
        }
    }

    /// `runs` of the commands `each(run)` gives, timed one by one.
    fn repeated(&self, runs: usize, each: impl Fn(usize) -> Vec<String>) -> Result<Summary> {
        let times = (0..runs)
            .map(|run| {
                let args = each(run);
                self.time(&args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Summary::of(times))
    }
}

/// Policy `i`: IPv4 /24s of 10.0.0.0/8 for even `i`, IPv6 /48s of 2001:db8::/32 for odd.
fn policy_prefix(i: u32) -> String {
    match i % 2 {
        0 => format!("10.{}.{}.0/24", (i / 2) >> 8, (i / 2) & 0xff),
        _ => format!("2001:db8:{:x}::/48", i / 2),
    }
}

/// The file of `n` policies, with room for them (`max_policies`) where `sized`; policy 0
/// at `first_rate`.
fn policies_file(n: u32, sized: bool, first_rate: &str) -> String {
    let mut s = format!("[[interface]]\nname = \"{IFACE}\"\nrate = \"1gbit\"\nburst = \"1m\"\n");
    if sized {
        let _ = writeln!(s, "max_policies = {n}");
    }
    for i in 0..n {
        let rate = if i == 0 { first_rate } else { "10mbit" };
        let _ = write!(
            s,
            "\n[[interface.policy]]\nprefix = \"{}\"\nrate = \"{rate}\"\nburst = \"64k\"\n",
            policy_prefix(i)
        );
    }
    s
}

/// Subscriber `s{i}`: 100.64.0.0 + i and a /56 of fdd7:b724::/32 (as the CoA bench's).
fn subscriber_prefixes(i: u32) -> [String; 2] {
    let v4 = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(100, 64, 0, 0)) + i);
    [
        format!("{v4}/32"),
        format!("fdd7:b724:{:x}:{:x}00::/56", i >> 8, i & 0xff),
    ]
}

/// A LibreQoS file of `n` subscribers, plans of 10 to 100 Mbps; subscriber 0's at
/// `first_mbps`.
fn libreqos_csv(n: u32, first_mbps: u32) -> String {
    libreqos_csv_moving(n, first_mbps, None)
}

/// [`libreqos_csv`], with subscriber 3 on the prefixes of subscriber `moved_to` (one no
/// file holds) where given.
fn libreqos_csv_moving(n: u32, first_mbps: u32, moved_to: Option<u32>) -> String {
    const PLANS_MBPS: [u32; 4] = [10, 20, 50, 100];
    let mut out = String::from(
        "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n",
    );
    for i in 0..n {
        let [v4, v6] = subscriber_prefixes(match (i, moved_to) {
            (3, Some(to)) => to,
            _ => i,
        });
        let v4 = v4.trim_end_matches("/32");
        let plan = if i == 0 {
            first_mbps
        } else {
            PLANS_MBPS[(i % 4) as usize]
        };
        let _ = writeln!(out, "s{i},,d{i},,,,{v4},{v6},1,1,{plan},{plan},");
    }
    out
}

/// The subscribers' attachment's room beyond its `n`: for the new subscribers the rows
/// make, and filled before the full table's row.
const ROOM: u32 = 1000;

fn subscribers_file(csv: &str, n: u32) -> String {
    format!(
        "[[interface]]\nname = \"{IFACE}\"\nrate = \"1gbit\"\nburst = \"1m\"\nmax_subscribers = {}\n\n[interface.libreqos]\nfile = \"{csv}\"\n",
        n + ROOM
    )
}

fn policies(rig: &Rig, opts: &Options) -> Result<Vec<Row>> {
    let files = [
        rig.write(
            "policies.toml",
            &policies_file(opts.policies, rig.sized_policies, "10mbit"),
        )?,
        rig.write(
            "policies-changed.toml",
            &policies_file(opts.policies, rig.sized_policies, "20mbit"),
        )?,
    ];
    let row = |what: &str, seconds| rig.row(what, opts.policies, seconds, None);
    let (cold, changed) = rig.applies(&files, opts)?;
    let set = rig.repeated(opts.runs, |run| {
        let rate = ["30mbit", "40mbit"][run % 2];
        ["policy", "set", IFACE, &policy_prefix(1), "--rate", rate]
            .into_iter()
            .chain(["--burst", "64k"])
            .map(String::from)
            .collect()
    })?;
    rig.detach()?;
    Ok(vec![
        row("prefix policies: apply from nothing", cold),
        row(
            "prefix policies: the same file with one rate changed",
            changed,
        ),
        row("prefix policies: one `policy set`", set),
    ])
}

fn subscribers(rig: &Rig, opts: &Options) -> Result<Vec<Row>> {
    let n = opts.subscribers;
    rig.write("subscribers.csv", &libreqos_csv(n, 10))?;
    rig.write("subscribers-changed.csv", &libreqos_csv(n, 15))?;
    let files = [
        rig.write("subscribers.toml", &subscribers_file("subscribers.csv", n))?,
        rig.write(
            "subscribers-changed.toml",
            &subscribers_file("subscribers-changed.csv", n),
        )?,
    ];
    let row = |what: &str, seconds, target_secs| rig.row(what, n, seconds, target_secs);
    let (cold, changed) = rig.applies(&files, opts)?;
    // Subscriber 3 moved to other prefixes and back, the file's rows read as far as they
    // changed.
    rig.write(
        "subscribers-moved.csv",
        &libreqos_csv_moving(n, 10, Some(n + ROOM + 20)),
    )?;
    let moving = [
        rig.write(
            "subscribers-moved.toml",
            &subscribers_file("subscribers-moved.csv", n),
        )?,
        files[0].clone(),
    ];
    rig.time(&["apply", "-f", &files[0]])?;
    let moved_file = rig.repeated(opts.runs, |run| {
        vec!["apply".into(), "-f".into(), moving[run % 2].clone()]
    })?;
    // Subscriber 1's plan, changed each run; then a subscriber of its own prefixes, made
    // and deleted.
    let [v4, v6] = subscriber_prefixes(1);
    let set = |id: &str, prefixes: &[String], rate: &str| -> Vec<String> {
        let mut args: Vec<String> = ["subscriber", "set", IFACE, id].map(String::from).into();
        for p in prefixes {
            args.extend(["--prefix".into(), p.clone()]);
        }
        args.extend(["--rate", rate, "--burst", "64k"].map(String::from));
        args
    };
    let plan = rig.repeated(opts.runs, |run| {
        set(
            "s1",
            &[v4.clone(), v6.clone()],
            ["30mbit", "40mbit"][run % 2],
        )
    })?;
    let fresh = subscriber_prefixes(n + 500);
    let (mut added, mut deleted) = (Vec::new(), Vec::new());
    for _ in 0..opts.runs {
        let args = set("new", &fresh, "25mbit");
        added.push(rig.time(&args.iter().map(String::as_str).collect::<Vec<_>>())?);
        deleted.push(rig.time(&["subscriber", "del", IFACE, "new"])?);
    }
    // Subscriber 2's prefixes moved between two pairs no file holds, each run.
    let moved = rig.repeated(opts.runs, |run| {
        let pair = n + ROOM + 10 + run as u32 % 2;
        set("s2", &subscriber_prefixes(pair), "20mbit")
    })?;
    let refused = full_table(rig, n, opts)?;
    rig.detach()?;
    Ok(vec![
        row("subscribers: apply from nothing", cold, Some(10.0)),
        row(
            "subscribers: the same file with one plan changed",
            changed,
            Some(1.0),
        ),
        row(
            "subscribers: the same file with one subscriber moved to other prefixes",
            moved_file,
            None,
        ),
        row(
            "subscribers: one `subscriber set` of a plan",
            plan,
            Some(0.02),
        ),
        row(
            "subscribers: one `subscriber set` of a new subscriber (an IPv4 /32, an IPv6 /56)",
            Summary::of(added),
            None,
        ),
        row(
            "subscribers: one `subscriber del`",
            Summary::of(deleted),
            None,
        ),
        row(
            "subscribers: one `subscriber set` moving a subscriber to other prefixes",
            moved,
            None,
        ),
        row(
            "subscribers: one `subscriber set` of a new subscriber refused by a full table",
            refused,
            None,
        ),
    ])
}

/// The attachment's last free subscriber slots filled (a file of `ROOM` more applied),
/// then a new subscriber refused for want of room, each run: the refusals' times.
fn full_table(rig: &Rig, n: u32, opts: &Options) -> Result<Summary> {
    rig.write("subscribers-full.csv", &libreqos_csv(n + ROOM, 20))?;
    let full = rig.write(
        "subscribers-full.toml",
        &subscribers_file("subscribers-full.csv", n),
    )?;
    rig.time(&["apply", "-f", &full])?;
    let [v4, v6] = subscriber_prefixes(n + ROOM + 1);
    let args = [
        "subscriber",
        "set",
        IFACE,
        "refused",
        "--prefix",
        &v4,
        "--prefix",
        &v6,
        "--rate",
        "10mbit",
        "--burst",
        "64k",
    ];
    let times = (0..opts.runs)
        .map(|_| rig.time_refused(&args, "no room for another subscriber"))
        .collect::<Result<Vec<_>>>()?;
    Ok(Summary::of(times))
}

/// Today's `shaper`, and then, if given, another (`(label, path)`), each in a rig of its
/// own, policies and subscribers in turn.
pub fn run(shaper: &Path, other: Option<(&str, &Path)>, opts: &Options) -> Result<Results> {
    let machine = Machine::this();
    let mut rows = Vec::new();
    for (build, shaper) in std::iter::once(("today", shaper)).chain(other) {
        let rig = Rig::new(build, shaper)?;
        rows.extend(policies(&rig, opts)?);
        rows.extend(subscribers(&rig, opts)?);
    }
    Ok(Results {
        machine,
        options: opts.clone(),
        rows,
    })
}

fn ms(s: f64) -> String {
    match s < 1.0 {
        true => format!("{:.1} ms", s * 1e3),
        false => format!("{s:.2} s"),
    }
}

pub fn table(r: &Results) -> String {
    let mut s = String::from(
        "| build | command | held | median | min–max | runs | issue 31's target |\n|---|---|--:|--:|--:|--:|--:|\n",
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {}–{} | {} | {} |",
            row.build,
            row.what,
            row.at,
            ms(row.seconds.median),
            ms(row.seconds.min),
            ms(row.seconds.max),
            row.seconds.runs.len(),
            row.target_secs
                .map_or("".into(), |t| format!("under {}", ms(t)))
        );
    }
    s
}

/// Writes `results-provision.md` and `.json` under `out`.
pub fn write(out: &Path, r: &Results) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let m = &r.machine;
    let mut s = String::from("# Provisioning: prefix policies and subscribers\n\n");
    let _ = writeln!(s, "{}", m.written_by("provision"));
    let _ = writeln!(
        s,
        "Whole release `shaper` commands, process start to exit, on a dummy interface's \
         ingress in a namespace of the bench's own. The policies' rows: {} prefix \
         policies (IPv4 /24s and IPv6 /48s) in one file. The subscribers' rows: {} \
         subscribers, an IPv4 /32 and an IPv6 /56 each, from a LibreQoS ShapedDevices.csv \
         the file names; the policies' attachment is detached first. \"From nothing\": the \
         interface not attached before the apply. Each changed-file row alternates two files \
         differing in one rate; each `set` row alternates two rates.\n",
        r.options.policies, r.options.subscribers
    );
    s += &table(r);
    let md = out.join("results-provision.md");
    fs::write(&md, s)?;
    let json = out.join("results-provision.json");
    fs::write(&json, serde_json::to_string_pretty(r)? + "\n")?;
    Ok(vec![md, json])
}
