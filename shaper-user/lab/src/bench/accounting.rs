//! RADIUS accounting's CPU cost at scale (issue 33 item 4): the CoA bench's daemon
//! ([`super::coa`]: a dummy interface attached both ways in a namespace of the bench's own,
//! the same subscribers on each direction) with a `[radius.accounting]` table, its
//! interims every 300 s, spread evenly, to the bench's own accounting server in the
//! namespace (it answers every Accounting-Request at once, and counts them); and the same
//! daemon with no accounting, the baseline.
//!
//! Once every Start is answered, the daemon's CPU time (utime + stime, /proc/PID/stat) is
//! read before and after each of a few windows of `seconds`: CPU seconds a minute, the
//! share of one CPU, Accounting-Requests a second; the median of the windows and their
//! range. With `--accounting-against`, another build is measured after today's in the
//! same run, its rows labelled with its file's name.

use std::{
    fmt::Write as _,
    fs,
    net::UdpSocket,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use shaper_user::radius::{
    accounting::{ACCOUNTING_REQUEST, ACCOUNTING_RESPONSE},
    packet::{Packet, reply},
};

use super::{coa, report::Machine};

const SECRET: &str = "bench-acct-secret";
const ACCT_STATUS_TYPE: u8 = 40;
const START: u32 = 1;

#[derive(Clone, Debug, Serialize)]
pub struct Options {
    pub subscribers: u32,
    pub interim_secs: u64,
    /// Each window's length.
    pub seconds: u64,
    pub windows: u32,
}

impl Options {
    /// Issue 33's: 100,000 subscribers at a 300 s interim, three windows of 60 s; quick:
    /// 10,000, two windows of 10 s.
    pub fn new(quick: bool) -> Self {
        match quick {
            false => Self {
                subscribers: 100_000,
                interim_secs: 300,
                seconds: 60,
                windows: 3,
            },
            true => Self {
                subscribers: 10_000,
                interim_secs: 300,
                seconds: 10,
                windows: 2,
            },
        }
    }
}

/// One window: the daemon's CPU seconds over its wall seconds, and the requests the
/// server took meanwhile.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    pub cpu_secs: f64,
    pub secs: f64,
    pub requests: u64,
}

impl Window {
    fn cpu_per_minute(&self) -> f64 {
        self.cpu_secs * 60.0 / self.secs
    }

    fn per_second(&self) -> f64 {
        self.requests as f64 / self.secs
    }
}

/// One daemon's run, accounting on or off.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub accounting: bool,
    /// From its start until it listened and indexed its subscribers.
    pub start_secs: f64,
    /// From then until every Start was answered (accounting on).
    pub starts_secs: f64,
    pub windows: Vec<Window>,
}

/// One build's two runs.
#[derive(Clone, Debug, Serialize)]
pub struct Build {
    /// "this build", or the other build's file name.
    pub label: String,
    pub off: Run,
    pub on: Run,
}

#[derive(Clone, Debug, Serialize)]
pub struct AccountingResults {
    pub machine: Machine,
    pub options: Options,
    pub builds: Vec<Build>,
}

/// The median, min and max of `v`.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (0.0, 0.0, 0.0),
        n => (v[n / 2], v[0], v[n - 1]),
    }
}

fn cpu_minute(r: &Run) -> (f64, f64, f64) {
    spread(r.windows.iter().map(Window::cpu_per_minute).collect())
}

fn rate(r: &Run) -> (f64, f64, f64) {
    spread(r.windows.iter().map(Window::per_second).collect())
}

/// The table of `results-accounting.md`, under its heading (the docs copy it).
pub fn table(r: &AccountingResults) -> String {
    let o = &r.options;
    let mut s = format!(
        "## Accounting\n\n| {} subscribers, interim {} s; median of {} windows of {} s (min to max) | the daemon's CPU, seconds a minute | of one CPU | Accounting-Requests a second |\n|---|--:|--:|--:|\n",
        o.subscribers, o.interim_secs, o.windows, o.seconds
    );
    for b in &r.builds {
        for (what, run) in [("accounting off", &b.off), ("accounting on", &b.on)] {
            let (m, lo, hi) = cpu_minute(run);
            let (q, qlo, qhi) = rate(run);
            let _ = writeln!(
                s,
                "| {}, {what} | {m:.3} ({lo:.3} to {hi:.3}) | {:.2}% | {q:.1} ({qlo:.1} to {qhi:.1}) |",
                b.label,
                m / 60.0 * 100.0
            );
        }
        let cost = cpu_minute(&b.on).0 - cpu_minute(&b.off).0;
        let _ = writeln!(
            s,
            "| {}, what accounting costs (on less off) | {cost:.3} | {:.2}% | |",
            b.label,
            cost / 60.0 * 100.0
        );
    }
    s
}

pub fn summary_lines(r: &AccountingResults) -> Vec<String> {
    let mut out = vec![format!(
        "accounting: {} subscribers, interim {} s, {} windows of {} s",
        r.options.subscribers, r.options.interim_secs, r.options.windows, r.options.seconds
    )];
    for b in &r.builds {
        out.push(format!(
            "  {}: started in {:.1} s (off), {:.1} s (on); every Start answered {:.1} s later",
            b.label, b.off.start_secs, b.on.start_secs, b.on.starts_secs
        ));
    }
    out.extend(table(r).lines().map(|l| format!("  {l}")));
    out
}

/// Writes `results-accounting.md` and `.json` under `out`.
pub fn write(out: &Path, r: &AccountingResults) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let o = &r.options;
    let mut s = String::from("# RADIUS accounting's CPU at scale\n\n");
    let _ = writeln!(s, "{}", r.machine.written_by("coa"));
    let _ = writeln!(
        s,
        "`shaper run` with a `[radius]` table (the CoA listener, idle), on a dummy interface \
         attached both ways in a namespace of the bench's own: {} subscribers on each \
         direction, an IPv4 /32 and an IPv6 /56 each, from a LibreQoS file. With \
         `[radius.accounting]`, interim {} s (the subscribers read every 5 s, the interims \
         spread evenly over the interval), to the bench's own accounting server in the \
         namespace, which answers each request at once; without, the same daemon, the \
         baseline. Once every Start is answered, the daemon's CPU time (utime + stime, \
         /proc/PID/stat) is read before and after each of {} windows of {} s; the requests \
         are those the server took meanwhile (the interims).\n",
        o.subscribers, o.interim_secs, o.windows, o.seconds
    );
    for b in &r.builds {
        let _ = writeln!(
            s,
            "{}: the daemon started in {:.1} s (accounting off) and {:.1} s (on); every \
             Start was answered {:.1} s later.\n",
            b.label, b.off.start_secs, b.on.start_secs, b.on.starts_secs
        );
    }
    s += &table(r);
    let md = out.join("results-accounting.md");
    fs::write(&md, s)?;
    let json = out.join("results-accounting.json");
    fs::write(&json, serde_json::to_string_pretty(r)? + "\n")?;
    Ok(vec![md, json])
}

/// What the server counts.
#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    starts: AtomicU64,
}

/// The accounting server in namespace `ns` on 127.0.0.1:1813: answers every
/// Accounting-Request signed for [`SECRET`], counting them, until `stop`.
struct Server {
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Server {
    fn start(ns: &str) -> Result<Self> {
        let (stop, counts) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(Counts::default()),
        );
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (ns, stop, counts) = (ns.to_owned(), stop.clone(), counts.clone());
            std::thread::spawn(move || {
                let bound = shaper_user::netns::enter(&ns)
                    .map_err(anyhow::Error::from)
                    .and_then(|()| Ok(UdpSocket::bind("127.0.0.1:1813")?));
                let _ = ready_tx.send(bound.as_ref().err().map(ToString::to_string));
                serve(&bound?, &stop, &counts)
            })
        };
        if let Some(e) = ready_rx.recv().context("accounting server")? {
            bail!("accounting server: {e}");
        }
        Ok(Self {
            stop,
            counts,
            thread: Some(thread),
        })
    }

    fn requests(&self) -> u64 {
        self.counts.requests.load(Ordering::Relaxed)
    }

    fn starts(&self) -> u64 {
        self.counts.starts.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(s: &UdpSocket, stop: &AtomicBool, counts: &Counts) -> Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = s.recv_from(&mut buf) else {
            continue;
        };
        let Ok(p) = Packet::parse(&buf[..n]) else {
            continue;
        };
        if p.code != ACCOUNTING_REQUEST {
            continue;
        }
        counts.requests.fetch_add(1, Ordering::Relaxed);
        if p.first(ACCT_STATUS_TYPE) == Some(&START.to_be_bytes()[..]) {
            counts.starts.fetch_add(1, Ordering::Relaxed);
        }
        let _ = s.send_to(
            &reply(ACCOUNTING_RESPONSE, &p, None, SECRET.as_bytes()),
            from,
        );
    }
    Ok(())
}

fn accounting_table(interim_secs: u64) -> String {
    format!(
        "\n[radius.accounting]\ninterim = \"{interim_secs}s\"\n\n[[radius.accounting.server]]\naddress = \"127.0.0.1\"\nsecret = \"{SECRET}\"\n"
    )
}

/// One daemon of `shaper` on the subscribers, accounting on or off, measured.
fn measure(shaper: &Path, opts: &Options, accounting: bool) -> Result<Run> {
    let extra = match accounting {
        true => accounting_table(opts.interim_secs),
        false => String::new(),
    };
    let t = Instant::now();
    let mut rig = coa::rig(shaper, opts.subscribers, &extra)?;
    // Bound before the daemon's accounting sends its Accounting-On (it retransmits it
    // every 3 s until answered; the Starts wait for it).
    let server = Server::start(&rig.name)?;
    rig.wait_ready(Duration::from_secs(600))?;
    let start_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    if accounting {
        let deadline = t + Duration::from_secs(600);
        while server.starts() < u64::from(opts.subscribers) {
            if Instant::now() > deadline {
                bail!(
                    "{} Starts of {} answered in 600 s: {}",
                    server.starts(),
                    opts.subscribers,
                    rig.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let starts_secs = t.elapsed().as_secs_f64();
    let mut windows = Vec::new();
    for _ in 0..opts.windows {
        let (cpu, requests, t) = (rig.cpu_secs()?, server.requests(), Instant::now());
        std::thread::sleep(Duration::from_secs(opts.seconds));
        windows.push(Window {
            cpu_secs: rig.cpu_secs()? - cpu,
            secs: t.elapsed().as_secs_f64(),
            requests: server.requests() - requests,
        });
    }
    // The daemon stops (its Stops answered) before the server.
    drop(rig);
    drop(server);
    Ok(Run {
        accounting,
        start_secs,
        starts_secs,
        windows,
    })
}

/// Today's `shaper`, then each of `others` (label, path), each accounting off then on.
pub fn run(
    shaper: &Path,
    others: &[(String, PathBuf)],
    opts: &Options,
) -> Result<AccountingResults> {
    let mut machine = Machine::this();
    let mut builds = Vec::new();
    let all = std::iter::once(("this build".to_owned(), shaper.to_owned())).chain(others.to_vec());
    for (label, path) in all {
        let off = measure(&path, opts, false)?;
        let on = measure(&path, opts, true)?;
        builds.push(Build { label, off, on });
    }
    machine.loadavg_end = super::report::loadavg();
    Ok(AccountingResults {
        machine,
        options: opts.clone(),
        builds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_answer_is_what_the_daemon_takes() {
        let request = {
            let mut r = vec![ACCOUNTING_REQUEST, 7, 0, 0];
            r.extend_from_slice(&[0; 16]);
            r.extend_from_slice(&[ACCT_STATUS_TYPE, 6, 0, 0, 0, 1]);
            let len = r.len() as u16;
            r[2..4].copy_from_slice(&len.to_be_bytes());
            shaper_user::radius::packet::sign_request(&mut r, SECRET.as_bytes());
            r
        };
        let p = Packet::parse(&request).unwrap();
        assert!(shaper_user::radius::accounting::response_authentic(
            &reply(ACCOUNTING_RESPONSE, &p, None, SECRET.as_bytes()),
            &request,
            SECRET.as_bytes()
        ));
    }

    #[test]
    fn windows_give_the_median_and_range() {
        let w = |cpu: f64| Window {
            cpu_secs: cpu,
            secs: 30.0,
            requests: 300,
        };
        let run = Run {
            accounting: true,
            start_secs: 0.0,
            starts_secs: 0.0,
            windows: vec![w(3.0), w(1.0), w(2.0)],
        };
        assert_eq!(cpu_minute(&run), (4.0, 2.0, 6.0));
        assert_eq!(rate(&run).0, 10.0);
    }
}
