//! RADIUS CoA latency at scale (issue 33 item 4): `shaper run` with a `[radius]` table on
//! a dummy interface attached both ways in a namespace of the bench's own, each
//! direction given the same subscribers (an IPv4 /32 and an IPv6 /56 each, four plans,
//! from a LibreQoS file the daemon's file names), and CoA-Requests sent to it at a fixed
//! rate from a paced sender in the namespace: each a rate change by User-Name
//! (WISPr-Bandwidth-Max-Up, a rate the subscriber does not have, so each one writes).
//!
//! Reported: every request's send-to-answer time as the sender saw it (p50, p99, max),
//! answers counted by code (none lost: every request ACKed), the daemon's own histogram
//! (`shaper_radius_request_seconds`, received to answered; p50 and p99 interpolated in
//! its buckets as Prometheus's `histogram_quantile` does), a `/metrics` scrape timed every
//! second meanwhile (p99 and max), and the daemon's CPU over the run (/proc).
//!
//! Then Disconnect-Requests by User-Name, one at a time (each waits for its answer),
//! each to a subscriber no CoA named last: their send-to-answer times and the daemon's
//! own (its log line's), min, median and max.
//!
//! The sender keeps a schedule (request k at k / rate): late sends go at once, so a
//! daemon that falls behind shows as latency, not as a lower rate. Requests spread over
//! 64 source ports, so a RADIUS identifier is not reused while its request is out (16,384
//! out at once: more than the daemon's 4 MiB receive buffer holds); the answers are
//! waited for until every request has one, or none came for 2 s.

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::Serialize;
use shaper_user::radius::packet::{
    COA_ACK, COA_REQUEST, DISCONNECT_ACK, DISCONNECT_REQUEST, EVENT_TIMESTAMP, USER_NAME,
    VENDOR_SPECIFIC, sign_request,
};

use super::report::Machine;
use crate::lab::Netns;

const IFACE: &str = "coa0";
const SECRET: &str = "bench-coa-secret";
const SOCKETS: usize = 64;
/// The rates a CoA sets (bit/s); the LibreQoS file's plans are none of them.
const RATES: [u32; 4] = [5_000_000, 15_000_000, 25_000_000, 35_000_000];
/// The file's upload plans, Mbps, by subscriber index modulo 4.
const PLANS_MBPS: [u32; 4] = [10, 20, 50, 100];

#[derive(Clone, Debug, Serialize)]
pub struct Options {
    pub subscribers: u32,
    /// CoA-Requests a second.
    pub rate: u32,
    pub seconds: u64,
    /// Disconnect-Requests after the CoAs, one at a time.
    pub disconnects: u32,
}

impl Options {
    /// Issue 33's: 100,000 subscribers, 1,000 a second for 60 s; quick: 10,000 for 5 s.
    pub fn new(quick: bool) -> Self {
        match quick {
            false => Self {
                subscribers: 100_000,
                rate: 1000,
                seconds: 60,
                disconnects: 20,
            },
            true => Self {
                subscribers: 10_000,
                rate: 1000,
                seconds: 5,
                disconnects: 20,
            },
        }
    }
}

/// Times of one kind, seconds: how many, p50, p99 and max.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Times {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Times {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Self {
            count: v.len(),
            p50: percentile(&v, 0.5),
            p99: percentile(&v, 0.99),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// Times of a few requests, seconds: min, median, max.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Few {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct CoaResults {
    pub machine: Machine,
    pub options: Options,
    pub sent: u64,
    pub acked: u64,
    pub nakked: u64,
    pub lost: u64,
    /// The sender's send-to-answer times.
    pub sender: Times,
    /// The daemon's histogram (received to answered): p50, p99 (interpolated in its
    /// buckets), its count; `max` is its log's slowest request.
    pub daemon: Times,
    /// `/metrics` scrapes, one a second: for [`IDLE_SCRAPES`] s before the CoAs (the
    /// baseline), and while they are sent.
    pub scrapes_idle: Times,
    pub scrapes: Times,
    /// The CPU time of the daemon's thread rendering them, seconds a scrape: before the
    /// CoAs, and while they are sent.
    pub scrape_cpu_idle: f64,
    pub scrape_cpu: f64,
    /// The daemon's CPU over the sending time, as a share of one CPU.
    pub cpu: f64,
    /// How long the daemon took to start (apply its file: attach, import, the listener's
    /// index).
    pub start_secs: f64,
    /// Requests the sender sent more than 1 ms after their time.
    pub late_sends: u64,
    /// The Disconnects: how many ACKed of how many sent; send-to-answer and the daemon's
    /// own times (its log).
    pub disconnects_acked: u32,
    pub disconnects_sent: u32,
    pub disconnect_sender: Few,
    pub disconnect_daemon: Few,
    /// The daemon's lines other than ACKs (the first 10), and its 5 slowest requests.
    pub log: Vec<String>,
}

/// How long the scrapes are timed before the CoAs begin, one a second.
pub const IDLE_SCRAPES: usize = 10;

fn ms(s: f64) -> String {
    format!("{:.2} ms", s * 1e3)
}

pub fn summary_lines(r: &CoaResults) -> Vec<String> {
    let o = &r.options;
    let times = |t: &Times| {
        format!(
            "p50 {}, p99 {}, max {} ({})",
            ms(t.p50),
            ms(t.p99),
            ms(t.max),
            t.count
        )
    };
    let few = |f: &Few| {
        format!(
            "min {}, median {}, max {}",
            ms(f.min),
            ms(f.median),
            ms(f.max)
        )
    };
    vec![
        format!(
            "coa: {} subscribers (an IPv4 /32 and an IPv6 /56 each, both directions), {} CoA/s for {} s; daemon started in {:.1} s",
            o.subscribers, o.rate, o.seconds, r.start_secs
        ),
        format!(
            "  sent {}, ACK {}, NAK {}, lost {} (late sends {})",
            r.sent, r.acked, r.nakked, r.lost, r.late_sends
        ),
        format!("  sender, send to answer: {}", times(&r.sender)),
        format!(
            "  daemon, shaper_radius_request_seconds (received to answered): {}",
            times(&r.daemon)
        ),
        format!(
            "  /metrics scrapes before the CoAs: {}; {} of CPU a scrape",
            times(&r.scrapes_idle),
            ms(r.scrape_cpu_idle)
        ),
        format!(
            "  /metrics scrapes meanwhile: {}; {} of CPU a scrape",
            times(&r.scrapes),
            ms(r.scrape_cpu)
        ),
        format!(
            "  daemon CPU over the run: {:.1}% of one CPU",
            r.cpu * 100.0
        ),
        format!(
            "  disconnects, one at a time: {} ACK of {}; send to answer {}; daemon (received to answered) {}",
            r.disconnects_acked,
            r.disconnects_sent,
            few(&r.disconnect_sender),
            few(&r.disconnect_daemon)
        ),
    ]
    .into_iter()
    .chain(r.log.iter().map(|l| format!("  daemon: {l}")))
    .collect()
}

/// The tables of `results-coa.md`, each under its heading (the docs copy them).
pub fn tables(r: &CoaResults) -> String {
    let o = &r.options;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## CoA-Requests\n\n| {} CoA-Requests a second for {} s, {} subscribers | p50 | p99 | max | count |\n|---|--:|--:|--:|--:|",
        o.rate, o.seconds, o.subscribers
    );
    let row = |s: &mut String, what: &str, t: &Times| {
        let _ = writeln!(
            s,
            "| {what} | {} | {} | {} | {} |",
            ms(t.p50),
            ms(t.p99),
            ms(t.max),
            t.count
        );
    };
    row(
        &mut s,
        "received to answered (the daemon's histogram; max: its log)",
        &r.daemon,
    );
    row(&mut s, "send to answer (the sender)", &r.sender);
    let _ = writeln!(
        s,
        "\n## Answers\n\n| requests | sent | ACK | NAK | lost | sent over 1 ms late | the daemon's CPU |\n|---|--:|--:|--:|--:|--:|--:|\n| CoA-Requests | {} | {} | {} | {} | {} | {:.0}% of one CPU |",
        r.sent,
        r.acked,
        r.nakked,
        r.lost,
        r.late_sends,
        r.cpu * 100.0
    );
    let _ = writeln!(
        s,
        "\n## Scrapes\n\n| a `/metrics` scrape, one a second | p50 | p99 | max | count | CPU a scrape |\n|---|--:|--:|--:|--:|--:|"
    );
    for (what, t, cpu) in [
        ("before the CoAs", &r.scrapes_idle, r.scrape_cpu_idle),
        ("while the CoAs are sent", &r.scrapes, r.scrape_cpu),
    ] {
        let _ = writeln!(
            s,
            "| {what} | {} | {} | {} | {} | {} |",
            ms(t.p50),
            ms(t.p99),
            ms(t.max),
            t.count,
            ms(cpu)
        );
    }
    let _ = writeln!(
        s,
        "\n## Disconnect-Requests\n\n| {} Disconnect-Requests one at a time ({} ACK) | min | median | max |\n|---|--:|--:|--:|",
        r.disconnects_sent, r.disconnects_acked
    );
    for (what, f) in [
        (
            "received to answered (the daemon's log)",
            &r.disconnect_daemon,
        ),
        ("send to answer (the sender)", &r.disconnect_sender),
    ] {
        let _ = writeln!(
            s,
            "| {what} | {} | {} | {} |",
            ms(f.min),
            ms(f.median),
            ms(f.max)
        );
    }
    s
}

/// Writes `results-coa.md` and `.json` under `out`.
pub fn write(out: &Path, r: &CoaResults) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let m = &r.machine;
    let mut s = String::from("# RADIUS CoA and Disconnect at scale\n\n");
    let _ = writeln!(s, "{}", m.written_by("coa"));
    let _ = writeln!(
        s,
        "`shaper run` (this build) with a `[radius]` table, on a dummy interface attached \
         both ways in a namespace of the bench's own: {} subscribers on each direction, an \
         IPv4 /32 and an IPv6 /56 each, from a LibreQoS file the daemon's file names. A \
         paced sender in the namespace sends CoA-Requests by User-Name, each with \
         WISPr-Bandwidth-Max-Up at a rate the subscriber does not have (each one writes), \
         {} a second for {} s; a `/metrics` scrape is timed each second, for {} s before \
         and while they are sent (its CPU: the CPU time of the daemon's thread rendering \
         them, from its schedstat, over their number). The daemon's histogram is \
         `shaper_radius_request_seconds` over the sending, its quantiles interpolated in its \
         buckets as Prometheus's `histogram_quantile` does; its max is the slowest CoA its \
         log names. The other commands of the host (any namespace) take the same change \
         lock: a CoA waits while one holds it. The daemon started (applied its file and \
         indexed its subscribers) in {:.1} s.\n",
        r.options.subscribers, r.options.rate, r.options.seconds, IDLE_SCRAPES, r.start_secs
    );
    s += &tables(r);
    if !r.log.is_empty() {
        s += "\nThe daemon's lines other than ACKs (the first 10), and its 5 slowest requests:\n\n```\n";
        for l in &r.log {
            s += l;
            s.push('\n');
        }
        s += "```\n";
    }
    let md = out.join("results-coa.md");
    fs::write(&md, s)?;
    let json = out.join("results-coa.json");
    fs::write(&json, serde_json::to_string_pretty(r)? + "\n")?;
    Ok(vec![md, json])
}

/// The namespace, its files and the daemon; the daemon stopped (it detaches on exit) and
/// the rest removed when dropped.
pub(crate) struct Rig {
    daemon: Option<Child>,
    dir: PathBuf,
    // Dropped after `drop` ran: the namespace (and its interface) go once the daemon has
    // detached.
    _ns: Netns,
    pub(crate) name: String,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
        }
        for d in ["ingress", "egress"] {
            let _ = Command::new(crate::bins::shaper())
                .args(["-n", &self.name, "--direction", d, "detach", IFACE])
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The LibreQoS file: subscriber `s{i}` with 100.64.0.0 + i and a /56 of fdd7:b724::/32.
fn csv(n: u32) -> String {
    let mut out = String::from(
        "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n",
    );
    for i in 0..n {
        let v4 = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(100, 64, 0, 0)) + i);
        let plan = PLANS_MBPS[(i % 4) as usize];
        out += &format!(
            "s{i},,d{i},,,,{v4},fdd7:b724:{:x}:{:x}00::/56,1,1,{plan},{plan},\n",
            i >> 8,
            i & 0xff
        );
    }
    out
}

/// The daemon's file: `n` subscribers both ways, the CoA listener, then `extra` (a
/// `[radius.accounting]` table, or nothing).
fn daemon_file(n: u32, extra: &str) -> String {
    let interface = |direction: &str| {
        format!(
            "[[interface]]\nname = \"{IFACE}\"\ndirection = \"{direction}\"\nrate = \"1gbit\"\nburst = \"1m\"\nmax_subscribers = {n}\n\n[interface.libreqos]\nfile = \"subscribers.csv\"\n\n"
        )
    };
    interface("ingress")
        + &interface("egress")
        + &format!(
            "[radius]\ninterface = \"{IFACE}\"\nlisten = \"127.0.0.1:3799\"\nrequests_per_second = 100000\n\n[[radius.client]]\naddress = \"127.0.0.1\"\nsecret = \"{SECRET}\"\n"
        )
        + extra
}

/// The daemon on `n` subscribers (its file ending with `extra`), started, not waited for
/// ([`Rig::wait_ready`]).
pub(crate) fn rig(shaper: &Path, n: u32, extra: &str) -> Result<Rig> {
    let name = format!("shaper-coa-{}", std::process::id());
    let ns = Netns::create(&name)?;
    // A bridge where the kernel has no dummy driver: either holds the programs.
    ns.ip_output(&["link", "add", IFACE, "type", "dummy"])
        .or_else(|_| ns.ip_output(&["link", "add", IFACE, "type", "bridge"]))?;
    ns.ip_output(&["link", "set", IFACE, "up"])?;
    ns.ip_output(&["link", "set", "lo", "up"])?;
    let dir = std::env::temp_dir().join(&name);
    fs::create_dir_all(&dir)?;
    let mut rig = Rig {
        daemon: None,
        dir: dir.clone(),
        _ns: ns,
        name: name.clone(),
    };
    fs::write(dir.join("subscribers.csv"), csv(n))?;
    let file = dir.join("shaper.toml");
    fs::write(&file, daemon_file(n, extra))?;
    fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let log = fs::File::create(dir.join("log"))?;
    rig.daemon = Some(
        Command::new(shaper)
            .args(["-n", &name, "run", "-f"])
            .arg(&file)
            .args(["--no-watch", "--detach-on-exit"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start shaper run")?,
    );
    Ok(rig)
}

impl Rig {
    pub(crate) fn log(&self) -> String {
        fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Waits for the RADIUS listener (the daemon applies its file first) and its index of
    /// both directions' subscribers (a build without one: 3 s).
    pub(crate) fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let mut listening = None;
        while Instant::now() < deadline {
            let log = self.log();
            if log.contains("RADIUS CoA and Disconnect on udp") {
                let since = *listening.get_or_insert_with(Instant::now);
                if log.matches(" indexed in ").count() >= 2
                    || log.contains("not indexed yet")
                    || since.elapsed() > Duration::from_secs(3)
                {
                    return Ok(());
                }
            }
            if let Some(child) = self.daemon.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("shaper run exited ({status}): {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("shaper run not ready in {within:?}: {}", self.log())
    }

    /// The CPU time so far of the daemon's thread `name` (`render-metrics`: the scrapes'),
    /// seconds, from its schedstat (nanoseconds on the CPU).
    fn thread_cpu_secs(&self, name: &str) -> Result<f64> {
        let pid = self.daemon.as_ref().context("no daemon")?.id();
        for task in fs::read_dir(format!("/proc/{pid}/task"))? {
            let dir = task?.path();
            if fs::read_to_string(dir.join("comm"))?.trim() != name {
                continue;
            }
            let stat = fs::read_to_string(dir.join("schedstat"))?;
            let ns: f64 = stat
                .split_whitespace()
                .next()
                .context("schedstat")?
                .parse()?;
            return Ok(ns / 1e9);
        }
        bail!("the daemon has no thread {name}")
    }

    /// The daemon's CPU time so far (user + system), seconds.
    pub(crate) fn cpu_secs(&self) -> Result<f64> {
        let pid = self.daemon.as_ref().context("no daemon")?.id();
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let after = stat.rsplit_once(')').context("/proc stat")?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok(ticks as f64 / hz)
    }
}

/// A CoA-Request: `User-Name = s{i}`, Event-Timestamp now, WISPr-Bandwidth-Max-Up `up`;
/// `up` 0: a Disconnect-Request, no rate.
fn request(id: u8, subscriber: u32, up: u32) -> Vec<u8> {
    let code = match up {
        0 => DISCONNECT_REQUEST,
        _ => COA_REQUEST,
    };
    let mut out = vec![code, id, 0, 0];
    out.extend_from_slice(&[0; 16]);
    let mut attr = |kind: u8, value: &[u8]| {
        out.push(kind);
        out.push(value.len() as u8 + 2);
        out.extend_from_slice(value);
    };
    attr(USER_NAME, format!("s{subscriber}").as_bytes());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as u32;
    attr(EVENT_TIMESTAMP, &now.to_be_bytes());
    if up != 0 {
        let mut vsa = 14122u32.to_be_bytes().to_vec();
        vsa.extend_from_slice(&[7, 6]);
        vsa.extend_from_slice(&up.to_be_bytes());
        attr(VENDOR_SPECIFIC, &vsa);
    }
    let len = out.len() as u16;
    out[2..4].copy_from_slice(&len.to_be_bytes());
    sign_request(&mut out, SECRET.as_bytes());
    out
}

/// What the receivers count.
#[derive(Default)]
struct Answers {
    acked: AtomicU64,
    nakked: AtomicU64,
    /// Send-to-answer times, seconds.
    times: Mutex<Vec<f64>>,
}

/// Sends `opts.rate` CoA a second for `opts.seconds` from the namespace; returns what was
/// sent, late, and answered.
fn send(ns: &str, opts: &Options) -> Result<(u64, u64, Arc<Answers>)> {
    shaper_user::netns::enter(ns)?;
    let sockets: Vec<Arc<UdpSocket>> = (0..SOCKETS)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0")?;
            s.connect("127.0.0.1:3799")?;
            s.set_read_timeout(Some(Duration::from_millis(100)))?;
            Ok(Arc::new(s))
        })
        .collect::<Result<_>>()?;
    // When each (socket, identifier) was last sent, ns from `start`; u64::MAX: none out.
    let out: Arc<Vec<AtomicU64>> = Arc::new(
        (0..SOCKETS * 256)
            .map(|_| AtomicU64::new(u64::MAX))
            .collect(),
    );
    let answers = Arc::new(Answers::default());
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let receivers: Vec<_> = sockets
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let (s, out, answers, done) = (s.clone(), out.clone(), answers.clone(), done.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while !done.load(Ordering::Relaxed) {
                    let Ok(n) = s.recv(&mut buf) else { continue };
                    let at = start.elapsed().as_nanos() as u64;
                    if n < 20 {
                        continue;
                    }
                    let sent = out[k * 256 + usize::from(buf[1])].swap(u64::MAX, Ordering::Relaxed);
                    if sent == u64::MAX {
                        continue;
                    }
                    match buf[0] == COA_ACK {
                        true => answers.acked.fetch_add(1, Ordering::Relaxed),
                        false => answers.nakked.fetch_add(1, Ordering::Relaxed),
                    };
                    answers
                        .times
                        .lock()
                        .unwrap()
                        .push(at.saturating_sub(sent) as f64 / 1e9);
                }
            })
        })
        .collect();
    let total = u64::from(opts.rate) * opts.seconds;
    let (mut sent, mut late) = (0u64, 0u64);
    for k in 0..total {
        let due = Duration::from_nanos(k * 1_000_000_000 / u64::from(opts.rate));
        let now = start.elapsed();
        if now < due {
            std::thread::sleep(due - now);
        } else if now - due > Duration::from_millis(1) {
            late += 1;
        }
        let socket = (k as usize) % SOCKETS;
        let id = ((k as usize / SOCKETS) % 256) as u8;
        let subscriber = (k % u64::from(opts.subscribers)) as u32;
        // Each subscriber's CoAs cycle through RATES: never the rate it has.
        let round = k / u64::from(opts.subscribers);
        let up = RATES[((u64::from(subscriber) + round) % 4) as usize];
        let bytes = request(id, subscriber, up);
        out[socket * 256 + usize::from(id)]
            .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        sockets[socket].send(&bytes)?;
        sent += 1;
    }
    // The last answers: until every request has one, or none came for 2 s.
    let answered =
        || answers.acked.load(Ordering::Relaxed) + answers.nakked.load(Ordering::Relaxed);
    let (mut last, mut quiet) = (answered(), Instant::now());
    while last < sent && quiet.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
        if answered() != last {
            (last, quiet) = (answered(), Instant::now());
        }
    }
    done.store(true, Ordering::Relaxed);
    for r in receivers {
        let _ = r.join();
    }
    Ok((sent, late, answers))
}

/// Sends `opts.disconnects` Disconnect-Requests from the namespace, one at a time, to
/// the last subscribers (a CoA named them longest ago): how many were ACKed, and each
/// one's send-to-answer time, seconds.
fn disconnect(ns: &str, opts: &Options) -> Result<(u32, Vec<f64>)> {
    shaper_user::netns::enter(ns)?;
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.connect("127.0.0.1:3799")?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let (mut acked, mut times) = (0, Vec::new());
    let mut buf = [0u8; 4096];
    for k in 0..opts.disconnects.min(opts.subscribers) {
        let id = k as u8;
        let bytes = request(id, opts.subscribers - 1 - k, 0);
        let t = Instant::now();
        s.send(&bytes)?;
        loop {
            let n = s.recv(&mut buf).context("a Disconnect unanswered in 5 s")?;
            if n >= 20 && buf[1] == id {
                acked += u32::from(buf[0] == DISCONNECT_ACK);
                break;
            }
        }
        times.push(t.elapsed().as_secs_f64());
    }
    Ok((acked, times))
}

/// The seconds each `disconnect` line of the daemon's log says it took.
fn disconnect_times(log: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains(": disconnect s"))
        .filter_map(took)
        .collect()
}

/// Min, median and max of `v`.
fn spread(mut v: Vec<f64>) -> Few {
    v.sort_by(f64::total_cmp);
    Few {
        min: v.first().copied().unwrap_or(0.0),
        median: percentile(&v, 0.5),
        max: v.last().copied().unwrap_or(0.0),
    }
}

/// One GET of /metrics over plain HTTP/1.1 in the current namespace: its time and body.
fn scrape() -> Result<(f64, String)> {
    let t = Instant::now();
    let mut s = TcpStream::connect("127.0.0.1:9753")?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    ensure!(body.starts_with("HTTP/1.1 200"), "scrape: {body:.200}");
    Ok((t.elapsed().as_secs_f64(), body))
}

/// The value of the series `name` (no labels) or with `labels`, in a scrape.
fn series(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The daemon's histogram as (upper bound, cumulative count), +Inf last.
fn buckets(body: &str) -> Vec<(f64, f64)> {
    let prefix = "shaper_radius_request_seconds_bucket{le=\"";
    body.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = match le {
                "+Inf" => f64::INFINITY,
                le => le.parse().ok()?,
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of the change between two scrapes' histograms, interpolated
/// linearly within its bucket (as Prometheus's `histogram_quantile`).
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, n)| *n);
            (le, n - was)
        })
        .collect();
    let total = counts.last().map_or(0.0, |(_, n)| *n);
    if total == 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in &counts {
        if n >= rank {
            if le.is_infinite() {
                return lower.0;
            }
            let within = (rank - lower.1) / (n - lower.1).max(1.0);
            return lower.0 + (le - lower.0) * within;
        }
        lower = (le, n);
    }
    lower.0
}

/// The `n` requests the daemon took longest over, as its log says (each line ends with
/// how long: `(412.3µs)`, `(2.2ms)`, `(1.3s)`), slowest first.
fn slowest(log: &str, n: usize) -> Vec<String> {
    let mut timed: Vec<(f64, &str)> = log
        .lines()
        .filter(|l| l.contains("radius:"))
        .filter_map(|l| Some((took(l)?, l)))
        .collect();
    timed.sort_by(|a, b| b.0.total_cmp(&a.0));
    timed
        .into_iter()
        .take(n)
        .map(|(_, l)| format!("slow: {l}"))
        .collect()
}

/// How long a request took, as its log line ends: `(412.3µs)`, `(2.2ms)`, `(1.3s)`.
fn took(l: &str) -> Option<f64> {
    let t = l.strip_suffix(')')?.rsplit_once('(')?.1;
    let (v, unit) = t.split_at(t.find(|c: char| c.is_alphabetic() || c == 'µ')?);
    let scale = match unit {
        "ns" => 1e-9,
        "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    };
    Some(v.parse::<f64>().ok()? * scale)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

/// Scrapes /metrics once a second from namespace `ns` until `stop` is set (or `n` were
/// made): their times, seconds.
fn scraper(ns: String, stop: Arc<AtomicBool>, n: usize) -> Result<Vec<f64>> {
    shaper_user::netns::enter(&ns)?;
    let mut times = Vec::new();
    while !stop.load(Ordering::Relaxed) && times.len() < n {
        let t = Instant::now();
        times.push(scrape()?.0);
        if let Some(rest) = Duration::from_secs(1).checked_sub(t.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(times)
}

pub fn run(shaper: &Path, opts: &Options) -> Result<CoaResults> {
    let mut machine = Machine::this();
    let t = Instant::now();
    let mut rig = rig(shaper, opts.subscribers, "")?;
    rig.wait_ready(Duration::from_secs(600))?;
    let start_secs = t.elapsed().as_secs_f64();
    let ns = rig.name.clone();
    let joined = |h: std::thread::JoinHandle<Result<Vec<f64>>>| {
        h.join().map_err(|_| anyhow::anyhow!("scraper panicked"))?
    };
    // The baseline: scrapes with no CoA sent.
    let render = "render-metrics";
    let cpu_idle = rig.thread_cpu_secs(render)?;
    let idle = {
        let (ns, stop) = (ns.clone(), Arc::new(AtomicBool::new(false)));
        joined(std::thread::spawn(move || scraper(ns, stop, IDLE_SCRAPES)))?
    };
    let scrape_cpu_idle = (rig.thread_cpu_secs(render)? - cpu_idle) / idle.len().max(1) as f64;
    // The scraper: one GET a second while the sender runs, from the namespace.
    let stop = Arc::new(AtomicBool::new(false));
    let scraping = {
        let (ns, stop) = (ns.clone(), stop.clone());
        std::thread::spawn(move || scraper(ns, stop, usize::MAX))
    };
    let in_ns = |f: fn() -> Result<(f64, String)>| {
        let ns = ns.clone();
        std::thread::spawn(move || {
            shaper_user::netns::enter(&ns)?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("scrape thread panicked"))?
    };
    let (_, before) = in_ns(scrape)?;
    let cpu_before = rig.cpu_secs()?;
    let render_before = rig.thread_cpu_secs(render)?;
    let sending = Instant::now();
    let (sent, late_sends, answers) = {
        let (ns, opts) = (ns.clone(), opts.clone());
        std::thread::spawn(move || send(&ns, &opts))
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))??
    };
    let cpu = (rig.cpu_secs()? - cpu_before) / sending.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let scrapes = joined(scraping)?;
    let scrape_cpu = (rig.thread_cpu_secs(render)? - render_before) / scrapes.len().max(1) as f64;
    let (_, after) = in_ns(scrape)?;
    let (disconnected, disconnect_times_sent) = {
        let (ns, opts) = (ns.clone(), opts.clone());
        std::thread::spawn(move || disconnect(&ns, &opts))
            .join()
            .map_err(|_| anyhow::anyhow!("disconnect sender panicked"))??
    };
    let times = answers.times.lock().unwrap().clone();
    let (b0, b1) = (buckets(&before), buckets(&after));
    let count = series(&after, "shaper_radius_request_seconds_count").unwrap_or(0.0)
        - series(&before, "shaper_radius_request_seconds_count").unwrap_or(0.0);
    let acked = answers.acked.load(Ordering::Relaxed);
    let nakked = answers.nakked.load(Ordering::Relaxed);
    let text = rig.log();
    let mut log: Vec<String> = text
        .lines()
        .filter(|l| l.contains("radius:") && !l.contains(": ack: "))
        .take(10)
        .map(str::to_owned)
        .collect();
    log.extend(slowest(&text, 5));
    let coa_slowest = text
        .lines()
        .filter(|l| l.contains(": coa s"))
        .filter_map(took)
        .fold(0.0, f64::max);
    machine.loadavg_end = super::report::loadavg();
    Ok(CoaResults {
        machine,
        options: opts.clone(),
        sent,
        acked,
        nakked,
        lost: sent - acked - nakked,
        sender: Times::of(times),
        daemon: Times {
            count: count as usize,
            p50: quantile(&b0, &b1, 0.5),
            p99: quantile(&b0, &b1, 0.99),
            max: coa_slowest,
        },
        scrapes_idle: Times::of(idle),
        scrapes: Times::of(scrapes),
        scrape_cpu_idle,
        scrape_cpu,
        cpu,
        start_secs,
        late_sends,
        disconnects_acked: disconnected,
        disconnects_sent: u32::try_from(disconnect_times_sent.len()).unwrap_or(u32::MAX),
        disconnect_sender: spread(disconnect_times_sent),
        disconnect_daemon: spread(disconnect_times(&text)),
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantile_is_interpolated_within_its_bucket() {
        let after = [
            (0.001, 50.0),
            (0.002, 90.0),
            (0.005, 100.0),
            (f64::INFINITY, 100.0),
        ];
        assert!((quantile(&[], &after, 0.5) - 0.001).abs() < 1e-12);
        assert!((quantile(&[], &after, 0.7) - 0.0015).abs() < 1e-12);
        let before = [
            (0.001, 50.0),
            (0.002, 50.0),
            (0.005, 50.0),
            (f64::INFINITY, 50.0),
        ];
        // Only what came after: 40 in (1, 2] ms, 10 in (2, 5] ms.
        assert!((quantile(&before, &after, 0.8) - 0.002).abs() < 1e-12);
    }

    #[test]
    fn the_slowest_requests_are_read_from_the_log() {
        let log = "shaper: radius: 127.0.0.1:1: ack: coa s1: up 5 bit/s, down unchanged (412.3µs)\n\
                   shaper: radius: 127.0.0.1:1: ack: coa s2: up 5 bit/s, down unchanged (1.3s)\n\
                   shaper: radius: 127.0.0.1:1: ack: coa s3: up 5 bit/s, down unchanged (2.2ms)\n";
        let got = slowest(log, 2);
        assert!(got[0].contains("s2") && got[1].contains("s3"), "{got:?}");
    }

    #[test]
    fn each_request_is_signed_and_names_its_subscriber() {
        let bytes = request(7, 42, 5_000_000);
        let p = shaper_user::radius::packet::Packet::parse(&bytes).unwrap();
        assert!(p.request_authentic(SECRET.as_bytes()));
        assert_eq!(p.first(USER_NAME), Some(&b"s42"[..]));
        assert_eq!(p.vendor(14122, 7), Some(&5_000_000u32.to_be_bytes()[..]));
    }
}
