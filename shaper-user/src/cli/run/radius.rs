//! The daemon's RADIUS Dynamic Authorization listener ([`shaper_user::radius`]): one
//! thread, one UDP socket, one request at a time (the kernel's socket buffer is the only
//! queue, bounded), each answered or dropped and counted by reason on /metrics (with how
//! long each request acted on took, received to answered), and
//! logged in one line (at most one line a second for each kind of drop, so a flood of
//! bad packets cannot flood the journal; the counters count every one).

use std::{
    collections::HashMap,
    net::UdpSocket,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use shaper_user::{
    config_file, metrics,
    radius::{Config, Plans, Reason, Server, accounting::SessionIndex, packet::MAX_PACKET},
};

/// The `[radius]` table of `file`, if any; a secret inline in a file others can read is
/// refused.
pub fn config(file: &Path) -> Result<Option<Config>> {
    let name = file.display().to_string();
    let text = config_file::read(file)?;
    let Some(config) = config_file::parse_radius(&name, &text)? else {
        return Ok(None);
    };
    let mode = std::fs::metadata(file)
        .with_context(|| format!("cannot read {name}"))?
        .mode()
        & 0o777;
    if config_file::has_inline_secret(&text) && mode & 0o077 != 0 {
        bail!(
            "{name} holds a RADIUS secret and is readable by group or others (mode {mode:04o}): chmod 600 it, or use secret_file"
        );
    }
    Ok(Some(config))
}

/// On a reload: the file's `[radius]` table checked (a broken one refuses the reload, as
/// any error in the file does); what to add to the reload's line, and the table read (its
/// plans are given to the listener once the reload is applied: [`take_plans`]). The rest
/// of the table is read at start only: the line says when it differs from the one the
/// listener runs.
pub fn reloaded(file: &Path, running: Option<&Config>) -> Result<(String, Option<Config>)> {
    let now = config(file)?;
    let plans_aside = |c: &Config| Config {
        plans: Default::default(),
        ..c.clone()
    };
    let note = match (now.as_ref(), running) {
        (Some(now), Some(running)) if plans_aside(now) == plans_aside(running) => {
            match now.plans == running.plans {
                true => String::new(),
                false => "; the plans a RADIUS Filter-Id names are the file's now".to_owned(),
            }
        }
        (None, None) => String::new(),
        _ => "; the [radius] table changed: it takes effect when shaper run restarts (its plans at once)"
            .to_owned(),
    };
    Ok((note, now))
}

/// After a reload was applied: the listener's `plans` (if it runs) and the `running`
/// table's are those of the table the reload read (`read`; none: the file's `[plan.NAME]`
/// tables still, the table gone).
pub fn take_plans(plans: Option<&Plans>, running: Option<&mut Config>, read: Option<Config>) {
    let (Some(running), Some(read)) = (running, read) else {
        return;
    };
    if let Some(plans) = plans {
        plans.replace(read.plans.clone());
    }
    running.plans = read.plans;
}

/// Binds the listener (in the daemon's namespace: call it on the daemon's thread) and
/// starts its thread; every reason is counted in `daemon` from zero. The plans it names
/// by `Filter-Id`, for the reloads to replace (none: no listener).
pub fn start(
    config: Config,
    netns: Option<&str>,
    sessions: Option<SessionIndex>,
    daemon: Arc<Mutex<metrics::Daemon>>,
) -> Result<Option<Plans>> {
    // Accounting alone: no CoA listener.
    if config.clients.is_empty() {
        return Ok(None);
    }
    let socket = UdpSocket::bind(config.listen)
        .with_context(|| format!("cannot listen on {} for RADIUS", config.listen))?;
    {
        let mut state = daemon.lock().unwrap_or_else(PoisonError::into_inner);
        state.radius = Reason::ALL.iter().map(|r| (r.name(), 0)).collect();
        state.radius_seconds = Some(metrics::Latency::default());
    }
    eprintln!(
        "shaper: RADIUS CoA and Disconnect on udp {} for {} ({} client{})",
        config.listen,
        config.interface,
        config.clients.len(),
        if config.clients.len() == 1 { "" } else { "s" }
    );
    grow_buffer(&socket);
    let server = match sessions {
        Some(index) => Server::new(config, netns).with_sessions(index),
        None => Server::new(config, netns),
    };
    let plans = server.plans();
    std::thread::Builder::new()
        .name("radius".to_owned())
        .spawn(move || serve(&socket, server, &daemon))
        .context("cannot start the RADIUS thread")?;
    Ok(Some(plans))
}

/// The listener's receive buffer: the only queue of requests, where they wait while one
/// is changed (or the subscribers are read again after another command's change, a few
/// hundred ms at 100,000): 4 MiB, about 4,000 requests, 4 s at 1,000 a second.
const RECEIVE_BUFFER: libc::c_int = 4 << 20;

/// Sets the socket's receive buffer to [`RECEIVE_BUFFER`], above `net.core.rmem_max` if
/// need be (the daemon has CAP_NET_ADMIN); as the kernel gives it otherwise if refused.
fn grow_buffer(socket: &UdpSocket) {
    use std::os::fd::AsRawFd as _;
    let size = RECEIVE_BUFFER;
    for option in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt on a socket we own, with a c_int of its size.
        let done = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        } == 0;
        if done {
            return;
        }
    }
}

fn serve(socket: &UdpSocket, mut server: Server, daemon: &Mutex<metrics::Daemon>) {
    let started = Instant::now();
    match server.prepare() {
        Ok(read) => {
            for (label, n) in read {
                eprintln!(
                    "shaper: radius: {n} subscribers of {label} indexed in {:.1?}",
                    started.elapsed()
                );
            }
        }
        Err(e) => eprintln!(
            "shaper: radius: subscribers not indexed yet ({e}): the first request reads them"
        ),
    }
    let mut buf = vec![0u8; MAX_PACKET];
    let mut quiet: HashMap<Reason, (Option<Instant>, u64)> = HashMap::new();
    loop {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) => {
                eprintln!("shaper: radius: receiving: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        // An IPv4 client on a dual-stack socket as itself, not ::ffff:a.b.c.d.
        let shown = std::net::SocketAddr::new(from.ip().to_canonical(), from.port());
        let now = Instant::now();
        let (outcome, acted) = match server.check(from, &buf[..n], now, SystemTime::now()) {
            Ok(checked) => {
                let mut outcome = server.act(&checked);
                outcome.detail += &format!(" ({:.1?})", now.elapsed());
                if let Some(reply) = &outcome.reply {
                    server.remember(&checked, reply, now);
                }
                (outcome, true)
            }
            Err(outcome) => (outcome, false),
        };
        if let Some(reply) = &outcome.reply
            && let Err(e) = socket.send_to(reply, from)
        {
            eprintln!("shaper: radius: answering {from}: {e}");
        }
        count(daemon, outcome.reason, acted.then(|| now.elapsed()));
        log(&mut quiet, shown, &outcome, now);
    }
}

/// Counts a request by `reason`, and how long it took (`took`: received to answered)
/// if it was acted on.
fn count(daemon: &Mutex<metrics::Daemon>, reason: Reason, took: Option<Duration>) {
    let mut state = daemon.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, n)) = state.radius.iter_mut().find(|(r, _)| *r == reason.name()) {
        *n += 1;
    }
    if let (Some(took), Some(latency)) = (took, state.radius_seconds.as_mut()) {
        latency.observe(took);
    }
}

/// One line per request answered; per kind of drop, one line a second at most, saying
/// how many were left unsaid.
fn log(
    quiet: &mut HashMap<Reason, (Option<Instant>, u64)>,
    from: std::net::SocketAddr,
    outcome: &shaper_user::radius::Outcome,
    now: Instant,
) {
    let line = format!(
        "shaper: radius: {from}: {}: {}",
        outcome.reason.name(),
        outcome.detail
    );
    if outcome.reply.is_some() {
        eprintln!("{line}");
        return;
    }
    let (last, unsaid) = quiet.entry(outcome.reason).or_insert((None, 0));
    if last.is_some_and(|last| now.duration_since(last) < Duration::from_secs(1)) {
        *unsaid += 1;
        return;
    }
    match *unsaid {
        0 => eprintln!("{line}"),
        n => eprintln!("{line} (and {n} more like it unlogged)"),
    }
    *last = Some(now);
    *unsaid = 0;
}
