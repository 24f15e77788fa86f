//! The daemon's RADIUS accounting ([`shaper_user::radius::accounting`]): one thread scans
//! the `[radius]` interface's subscribers every [`scan_every`] (Start, Stop, the interims
//! due), sends the records and takes the answers in between, and copies its counters to
//! /metrics. It begins with an Accounting-On; on exit every session gets its Stop, then
//! the daemon's Accounting-Off, sent within [`STOP_PATIENCE`].

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use shaper_user::{
    metrics,
    radius::accounting::{self, Config, Nas, Sender, SessionIndex, Sessions, Status},
};

/// How long the daemon's exit waits for the Stops to be answered.
pub const STOP_PATIENCE: Duration = Duration::from_secs(5);

/// How often the subscribers are scanned: a 60th of the interval, 1 to 5 s (Start and
/// Stop go within that of the change).
fn scan_every(interim: Duration) -> Duration {
    (interim / 60).clamp(Duration::from_secs(1), Duration::from_secs(5))
}

/// The running accounting: its thread and the flag that stops it.
pub struct Accounting {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Accounting {
    /// Sends every session's Stop (within [`STOP_PATIENCE`]) and ends the thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// Binds the sockets (in the daemon's namespace: call it on the daemon's thread) and
/// starts the thread.
pub fn start(
    config: Config,
    iface: &str,
    netns: Option<&str>,
    sessions: SessionIndex,
    daemon: Arc<Mutex<metrics::Daemon>>,
) -> Result<Accounting> {
    let nas = Nas {
        identifier: config.nas_identifier.clone(),
        ip: config.nas_ip_address,
    };
    let servers: Vec<String> = config
        .servers
        .iter()
        .map(|s| s.address.to_string())
        .collect();
    eprintln!(
        "shaper: RADIUS accounting of {iface}'s subscribers to {} every {:?}",
        servers.join(", then "),
        config.interim
    );
    let interim = config.interim;
    let sender = Sender::new(config, nas).context("cannot open the RADIUS accounting socket")?;
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, iface, ns) = (
        Arc::clone(&stop),
        iface.to_owned(),
        netns.map(str::to_owned),
    );
    let thread = std::thread::Builder::new()
        .name("radius-acct".to_owned())
        .spawn(move || {
            let sessions = Sessions::new(interim, SystemTime::now(), sessions);
            let at = (iface.as_str(), ns.as_deref());
            run(at, scan_every(interim), sessions, sender, &flag, &daemon);
        })
        .context("cannot start the RADIUS accounting thread")?;
    Ok(Accounting { stop, thread })
}

fn run(
    (iface, netns): (&str, Option<&str>),
    every: Duration,
    mut sessions: Sessions,
    mut sender: Sender,
    stop: &AtomicBool,
    daemon: &Mutex<metrics::Daemon>,
) {
    // Before any Start: no session of an earlier run is in progress.
    sender.queue(vec![sessions.accounting(
        Status::AccountingOn,
        Instant::now(),
        SystemTime::now(),
    )]);
    let mut next_scan = Instant::now();
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next_scan {
            next_scan += every;
            match scan(iface, netns, &mut sessions) {
                Ok(records) => {
                    failing = false;
                    sender.queue(records);
                }
                // Said once until it reads again (the interface may be away).
                Err(e) if !failing => {
                    failing = true;
                    eprintln!("shaper: radius accounting: cannot read {iface}'s subscribers: {e}");
                }
                Err(_) => {}
            }
            sender.set_sessions(sessions.len());
        }
        // Back at least every 200 ms to see the stop flag.
        sender.step(next_scan.min(Instant::now() + Duration::from_millis(200)));
        publish(daemon, &sender);
    }
    let n = sessions.len();
    sender.queue(sessions.stop_all(Instant::now(), SystemTime::now()));
    // After every Stop is answered.
    sender.queue(vec![sessions.accounting(
        Status::AccountingOff,
        Instant::now(),
        SystemTime::now(),
    )]);
    sender.set_sessions(0);
    let deadline = Instant::now() + STOP_PATIENCE;
    while !sender.idle() && Instant::now() < deadline {
        sender.step(deadline);
    }
    publish(daemon, &sender);
    let unsent = if sender.idle() {
        ""
    } else {
        " (not all answered)"
    };
    eprintln!("shaper: radius accounting: {n} sessions stopped, Accounting-Off sent{unsent}");
}

fn scan(
    iface: &str,
    netns: Option<&str>,
    sessions: &mut Sessions,
) -> Result<Vec<accounting::Record>> {
    let tables = accounting::scan(iface, netns, sessions)?;
    let prefixes = accounting::prefixes(&tables, &sessions.starting())?;
    Ok(sessions.end(&prefixes, Instant::now(), SystemTime::now()))
}

fn publish(daemon: &Mutex<metrics::Daemon>, sender: &Sender) {
    let mut state = daemon.lock().unwrap_or_else(PoisonError::into_inner);
    if state.accounting.as_ref() != Some(sender.stats()) {
        state.accounting = Some(sender.stats().clone());
    }
}
