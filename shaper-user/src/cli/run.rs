//! `shaper run -f FILE [--detach-on-exit] [--metrics ADDR:PORT] [--top [ADDR:PORT]]
//! [--no-watch]`: the daemon. It applies the file as `apply` does (all or nothing) to
//! every interface of it that exists, attaches a missing one when it appears, and one
//! whose program the kernel no longer runs (made again, or its clsact filter or qdisc
//! removed) again over its pins (netlink link events, and a check every half second), tells
//! systemd it is ready (sd_notify), applies the file again on SIGHUP and when its content
//! changes (inotify on its directory: an editor's rename over it, or the kubelet's swap of
//! a ConfigMap volume's `..data` symlink, which the file reaches through; a file it
//! refuses leaves the running configuration as it was, and says why in one line), and on
//! SIGTERM or SIGINT exits, leaving the
//! limits in force through their pins, or detaching what the file names with
//! `--detach-on-exit`. One runs per host ([`system::daemon_lock`]); each change takes
//! the same lock as every other command. It logs one line per event on stderr (the
//! journal, under systemd). With a `[radius]` table in the file, it serves RADIUS CoA
//! and Disconnect requests on a thread of its own ([`radius`]), each change made through
//! the one change path; with `[radius.accounting]`, it reports the subscribers' usage on
//! another ([`accounting`]). The per-source tables of what it attaches start small and grow
//! with use up to the file's `max_sources` ([`shaper_user::grow`]): it counts their keys
//! every [`grow::GROW_EVERY`].

mod accounting;
mod api;
mod http;
mod radius;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::SystemTime,
};

use anyhow::{Context as _, Result};
use sd_notify::NotifyState;
use shaper_user::{
    apply,
    attach::Attached,
    detach, grow, link,
    metrics::{self, SourceCounter},
    pins::Attachment,
    radius::accounting::SessionIndex,
    request::AttachRequest,
    system,
};

use super::Scope;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc::UnboundedReceiver,
};

/// Run as a daemon: apply a configuration file, re-apply it on SIGHUP, and leave the
/// limits in force on exit
///
/// At start it applies the file as shaper-apply(8) does, all or nothing, to every
/// interface of it that exists, or exits non-zero with the one-line error; it names the
/// missing ones and attaches each when it appears. On SIGHUP, and when the file changes (unless
/// --no-watch), it applies it again: what changed is changed in place, every source
/// keeping its bucket; the file's subscribers are written only where they differ (one
/// plan changed: that subscriber alone), and those set by shaper-subscriber(8) stay
/// unless the interface has prune_subscribers = true; a file it refuses is logged in one
/// line naming file:line: field, and the running configuration stays. An interface the file names that is deleted and
/// made again, or whose clsact filter or qdisc is removed, is attached again within a
/// second or two, over its own pins: its sources, policies and counters go on from where
/// they were. It serves /metrics (OpenMetrics) and /top (the keys
/// dropped most, as JSON) on --metrics. The per-source tables of what it attaches start
/// at a sixteenth of max_sources (at most 16384 keys a family) and grow fourfold in place,
/// every source keeping its bucket and counters, when either family holds more than half
/// their room, up to max_sources (a clsact attachment, which cannot grow, starts there);
/// new-source admission bounds how fast they fill. It tells systemd when it is ready and when it
/// reloads (Type=notify). On SIGTERM it exits and the limits stay in force, unless
/// --detach-on-exit. One runs per host; every other shaper command works beside it.
///
/// With a [radius] table in the file, it takes RADIUS CoA-Requests and
/// Disconnect-Requests (RFC 5176, UDP 3799 by default) from the clients listed there,
/// each with its shared secret: a CoA sets a subscriber's rate from
/// WISPr-Bandwidth-Max-Up/-Down or Mikrotik-Rate-Limit, a Disconnect removes the
/// subscriber; a request that fails a check (secret, Message-Authenticator,
/// Event-Timestamp window, replay, rate) changes nothing, and every outcome is counted
/// by reason on /metrics (shaper_radius_requests_total). With [radius.accounting], it
/// reports each subscriber of that interface to the accounting servers listed (RFC
/// 2866: Accounting-On first, Start, Interim-Update every interim, Stop when removed and
/// on exit, then Accounting-Off; octets delivered, upload as input), failing over in
/// order; a CoA or Disconnect may name a subscriber by the Acct-Session-Id of its
/// Start. The table is read at start
/// (restart to change it); a reload takes the file's plans a Filter-Id names. See
/// docs/operating/radius.md.
///
/// It serves a local API on --api-socket (a Unix socket only root may connect to): JSON
/// over HTTP to read, set and delete the subscribers and policies of an attached
/// interface, checked as the command line checks them, each change made as theirs
/// are. See docs/operating/api.md.
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    /// The configuration file (`shaper config show` prints the format)
    #[arg(short = 'f', long = "file", value_name = "FILE.toml")]
    pub file: PathBuf,
    /// On exit, detach every interface the file names instead of leaving them attached
    #[arg(long)]
    pub detach_on_exit: bool,
    /// Serve /metrics (Prometheus) over HTTP on this address, in the daemon's namespace:
    /// counters and gauges by interface and policy, never an address
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9753")]
    pub metrics: SocketAddr,
    /// Serve no metrics
    #[arg(long, conflicts_with = "metrics")]
    pub no_metrics: bool,
    /// Per-policy series for the default policy and at most this many prefix policies of
    /// each attachment: those that refused the most bytes, then passed the most (0: the
    /// default's only). Totals over every policy are the interface's series
    #[arg(long, value_name = "N", default_value_t = metrics::DEFAULT_TOP_POLICIES,
          value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub metrics_policies: u16,
    /// Per-subscriber series for at most this many subscribers of each attachment: those
    /// that refused the most bytes, then passed the most, as the daemon last counted them
    /// (in the background, with the sources); their number is a gauge
    #[arg(long, value_name = "N", default_value_t = metrics::DEFAULT_TOP_SUBSCRIBERS,
          value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub metrics_subscribers: u16,
    /// Also serve /top (the addresses dropped most, as JSON) on a listener of its own,
    /// on loopback unless an address is given: it shows every source's address and
    /// traffic, so keep it off a /metrics port other hosts reach
    #[arg(long, value_name = "ADDR:PORT", num_args = 0..=1,
          default_missing_value = "127.0.0.1:9754")]
    pub top: Option<SocketAddr>,
    /// Apply the file again only on SIGHUP, not whenever it changes
    #[arg(long)]
    pub no_watch: bool,
    /// Serve the local API (JSON over HTTP: subscribers and policies read, set and
    /// deleted) on this Unix socket, which only root may connect to
    #[arg(long, value_name = "PATH", default_value = shaper_user::api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    /// Serve no local API
    #[arg(long, conflicts_with = "api_socket")]
    pub no_api: bool,
}

const EXAMPLES: &str = "\
Examples:
  shaper run -f /etc/shaper/shaper.toml
      What shaper.service runs: apply, serve 127.0.0.1:9753/metrics, reload on change.
  curl -s 'localhost:9753/top?iface=eth1&n=10'
      The 10 keys of eth1 dropped most, from a running daemon.
  echo 'User-Name = c1042, Event-Timestamp = '$(date +%s)', WISPr-Bandwidth-Max-Down = 50000000' | radclient -x 127.0.0.1:3799 coa SECRET
      A CoA to a daemon whose file has a [radius] table: c1042's downloads at 50 Mbit/s.
  curl --unix-socket /run/shaper/api.sock -X PUT --data-binary '{\"prefixes\": [\"100.64.0.14\"], \"rate\": \"20mbit\", \"burst\": \"256k\"}' http://localhost/v1/interfaces/eth1/subscribers/c1042
      The local API: subscriber c1042 set on eth1 (docs/operating/api.md).
";

/// The requests whose interface exists here, and the names of those that do not (the
/// daemon enforces the others, and attaches these when they appear).
fn present(desired: &[AttachRequest]) -> (Vec<AttachRequest>, Vec<String>) {
    let mut missing: Vec<String> = Vec::new();
    let mut here = Vec::new();
    for d in desired {
        match system::ifindex(&d.at.iface) {
            Err(system::SystemError::NoInterface(name)) => {
                if !missing.contains(&name) {
                    missing.push(name);
                }
            }
            _ => here.push(d.clone()),
        }
    }
    (here, missing)
}

/// What to say of the interfaces of the file that are missing ("" if none).
fn missing_line(missing: &[String]) -> String {
    if missing.is_empty() {
        return String::new();
    }
    format!(
        "; missing, attached when they appear: {}",
        missing.join(", ")
    )
}

/// Reads the file and applies what it says of every interface that exists, under the
/// lock (`lock`, taken already, or waited for; a file error refuses the whole file);
/// returns what it asks and a line saying what changed and which interfaces are missing.
fn apply_file(
    file: &Path,
    scope: Scope<'_>,
    lock: Option<system::Lock>,
) -> Result<(Vec<AttachRequest>, String)> {
    let mut desired = super::apply::read(file, scope.direction)?;
    // The file's max_sources is the ceiling the daemon grows tables to.
    for d in &mut desired {
        d.growing = true;
    }
    let (here, missing) = present(&desired);
    let applied = match lock {
        Some(lock) => apply::apply_holding(&here, scope.netns, lock, &mut |_, _| {})?,
        None => apply::apply(&here, scope.netns, &mut |_, _| {})?,
    };
    let what = applied
        .iter()
        .map(|one| {
            format!(
                "{} {} ({}{})",
                one.iface,
                super::apply::outcome(one),
                super::apply::policies(one.policies),
                super::apply::subscribers(one.subscribers.as_ref())
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let what = if what.is_empty() {
        "no interface of it exists".to_owned()
    } else {
        what
    };
    let missing = missing_line(&missing);
    Ok((
        desired,
        format!("applied {}: {what}{missing}", file.display()),
    ))
}

/// Attaches the running configuration's interface `name`, which appeared (made again,
/// it lost its program: attach links one again over its pins, keeping every cell and
/// counter) or lost its clsact filter, by applying what the running configuration says
/// of it (each direction; the other interfaces are left alone, so that one of them that
/// fails cannot keep this one off); says how.
fn attach_again(name: &str, running: &[AttachRequest], netns: Option<&str>) -> Result<String> {
    let mine: Vec<AttachRequest> = running
        .iter()
        .filter(|d| d.at.iface == name)
        .cloned()
        .collect();
    let applied = apply::apply(&mine, netns, &mut |_, _| {})?;
    let any = |f: fn(&Attached) -> bool| applied.iter().any(|a| f(&a.outcome));
    Ok(if any(|o| matches!(o, Attached::Relinked { .. })) {
        format!("{name}: attached it again (its program and maps kept)")
    } else if any(|o| matches!(o, Attached::New { .. })) {
        format!("{name}: attached it")
    } else {
        format!("{name}: attached it again")
    })
}

/// The interfaces of the running configuration that exist and whose program the kernel
/// does not run (appeared, made again, or their clsact filter or qdisc removed): each
/// is to be attached again. One the kernel could not be asked about is left as it is.
fn lost(running: &[AttachRequest], netns: Option<&str>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for d in running {
        let name = &d.at.iface;
        if names.contains(name) || system::ifindex(name).is_err() {
            continue;
        }
        let at = Attachment::toward(name, netns, d.at.direction);
        if matches!(link::liveness(&at), link::Liveness::Gone) {
            names.push(name.clone());
        }
    }
    names
}

/// Grows the per-source tables of each interface of the running configuration that has
/// used more than half their room ([`grow::grow_if_full`]), if the change lock is free now
/// (otherwise at the next tick); says what it grew. One that failed is logged once and not
/// tried again until the next reload (`failed`).
fn grow_tables(running: &[AttachRequest], netns: Option<&str>, failed: &mut Vec<String>) {
    let Ok(Some(_lock)) = system::try_lock() else {
        return;
    };
    for d in running.iter().filter(|d| d.growing) {
        let at = Attachment::toward(&d.at.iface, netns, d.at.direction);
        if failed.contains(&at.label()) || !at.link().exists() {
            continue;
        }
        let ceiling = d
            .max_sources
            .unwrap_or(shaper_common::maps::DEFAULT_MAX_SOURCES);
        let said = match grow::grow_if_full(&at, ceiling) {
            Ok(None) => continue,
            Ok(Some(room)) => format!(
                "{}: grew its source tables to {room} keys a family (up to {ceiling})",
                at.label()
            ),
            Err(e) => {
                failed.push(at.label());
                format!("{}: growing its source tables failed: {e:#}", at.label())
            }
        };
        eprintln!("shaper: {said}");
        notify(&[NotifyState::Status(&said)]);
    }
}

/// How often the daemon asks the kernel whether every interface of its file still runs
/// its program: a deleted clsact qdisc or filter sends no link event.
const CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a reload waits for the change lock (tried every [`LOCK_TRY`], the daemon's
/// thread serving and rendering meanwhile) before it is put off for [`RELOAD_RETRY`]: a
/// long change by another command, or someone holding the lock who should not, never
/// stops the daemon.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);
const LOCK_TRY: std::time::Duration = std::time::Duration::from_millis(50);
const RELOAD_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// The change lock for a reload, within [`LOCK_PATIENCE`], or why not.
async fn reload_lock() -> Result<system::Lock> {
    let deadline = tokio::time::Instant::now() + LOCK_PATIENCE;
    loop {
        if let Some(lock) = system::try_lock()? {
            return Ok(lock);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "{} is held by another command for over {LOCK_PATIENCE:?}: trying again in {RELOAD_RETRY:?}",
                system::LOCK_PATH
            );
        }
        tokio::time::sleep(LOCK_TRY).await;
    }
}

/// Waits until `at`, or forever when there is nothing to wait for.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The interfaces and directions of a configuration, for the metrics.
fn configured(running: &[AttachRequest]) -> Vec<(String, shaper_user::pins::Direction)> {
    running
        .iter()
        .map(|d| (d.at.iface.clone(), d.at.direction))
        .collect()
}

/// Tells systemd, when it supervises us; elsewhere NOTIFY_SOCKET is unset and this does
/// nothing.
fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        eprintln!("shaper: cannot notify systemd: {e}");
    }
}

/// Watches the file's directory and sends a message on any change in it: editors
/// replace a file rather than write it, and a Kubernetes ConfigMap volume changes no file
/// of its own, but swaps the `..data` symlink that `shaper.toml -> ..data/shaper.toml`
/// goes through. Whether the file's content changed is for the receiver to tell
/// ([`Content`]). The watcher lives as long as the value.
fn watch(file: &Path) -> Result<(notify::RecommendedWatcher, UnboundedReceiver<()>)> {
    use notify::Watcher as _;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if !event.kind.is_access() {
            let _ = tx.send(());
        }
    })
    .context("cannot watch the configuration file")?;
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .with_context(|| format!("cannot watch {}", dir.display()))?;
    Ok((watcher, rx))
}

/// The names of links that appear or change in this namespace (RTM_NEWLINK), from a
/// netlink socket subscribed to link events; its connection must be polled (spawned).
fn link_events() -> Result<(
    impl Future<Output = ()>,
    impl futures::Stream<Item = String>,
)> {
    use futures::StreamExt as _;
    use rtnetlink::{
        MulticastGroup,
        packet_core::NetlinkPayload,
        packet_route::{RouteNetlinkMessage, link::LinkAttribute},
    };
    let (conn, _handle, messages) = rtnetlink::new_multicast_connection(&[MulticastGroup::Link])
        .context("cannot listen to link events (netlink)")?;
    let names = messages.filter_map(|(message, _)| async move {
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) = message.payload
        else {
            return None;
        };
        link.attributes.into_iter().find_map(|a| match a {
            LinkAttribute::IfName(name) => Some(name),
            _ => None,
        })
    });
    Ok((conn, names))
}

/// How long the file must stay quiet after a change before it is applied: an editor's
/// save is several events (write, rename, attributes).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(300);

/// The file's content as last read (through any symlinks), or why it could not be read:
/// a change in its directory is applied only when this differs.
#[derive(PartialEq, Eq)]
struct Content(std::result::Result<Vec<u8>, std::io::ErrorKind>);

impl Content {
    fn read(file: &Path) -> Self {
        Self(shaper_user::config_file::read_bytes(file).map_err(|e| e.kind()))
    }
}

pub async fn run(args: &Args, scope: Scope<'_>) -> Result<()> {
    let netns = scope.netns;
    let _daemon = system::daemon_lock()?;
    // Signals are caught from here on, so one sent as soon as we are ready is never lost.
    let mut hup = signal(SignalKind::hangup()).context("cannot catch SIGHUP")?;
    let mut term = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
    if args
        .top
        .is_some_and(|top| !args.no_metrics && top.port() == args.metrics.port())
    {
        anyhow::bail!(
            "--top {}: /top needs a port of its own, not the metrics port {}",
            args.top.unwrap_or(args.metrics),
            args.metrics.port()
        );
    }
    let listener = match args.no_metrics {
        true => None,
        false => Some(http::bind(args.metrics, "metrics").await?),
    };
    let top_listener = match args.top {
        Some(addr) => Some((addr, http::bind(addr, "/top").await?)),
        None => None,
    };
    // Without a watcher, a channel nobody sends on (its sender kept, so it never closes).
    let (_watcher, mut changed) = match args.no_watch {
        true => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Err(tx), rx)
        }
        false => {
            let (watcher, rx) = watch(&args.file)?;
            (Ok(watcher), rx)
        }
    };
    let (links_conn, links) = link_events()?;
    let mut links = std::pin::pin!(links);
    let mut content = Content::read(&args.file);
    let mut radius = radius::config(&args.file)?;
    let (mut running, line) = apply_file(&args.file, scope, None)?;
    // When a reload put off for want of the lock is tried again.
    let mut retry = None;
    eprintln!("shaper: {line}");
    let daemon_state = Arc::new(Mutex::new(metrics::Daemon {
        configured: configured(&running),
        last_reload: None,
        radius: Vec::new(),
        accounting: None,
        radius_seconds: None,
    }));
    // The accounting's sessions, which a CoA or Disconnect may name by Acct-Session-Id.
    let sessions = radius
        .as_ref()
        .and_then(|r| r.accounting.as_ref())
        .map(|_| SessionIndex::default());
    let plans = match radius.clone() {
        Some(config) => radius::start(config, netns, sessions.clone(), Arc::clone(&daemon_state))?,
        None => None,
    };
    let accounting = match radius
        .as_ref()
        .and_then(|r| Some((r.accounting.clone()?, r)))
        .zip(sessions)
    {
        Some(((a, r), sessions)) => Some(accounting::start(
            a,
            &r.interface,
            netns,
            sessions,
            Arc::clone(&daemon_state),
        )?),
        None => None,
    };
    // The servers accept on this thread, between signals, and render on threads of their own.
    let local = tokio::task::LocalSet::new();
    if let Some(listener) = listener {
        eprintln!("shaper: serving /metrics on http://{}", args.metrics);
        // The source maps are counted on a thread of their own, at most 1% of a CPU;
        // a scrape serves the last count.
        let sources = SourceCounter::new(usize::from(args.metrics_subscribers));
        let (counter, ns) = (sources.clone(), netns.map(str::to_owned));
        std::thread::Builder::new()
            .name("count-sources".to_owned())
            .spawn(move || counter.run(ns.as_deref()))
            .context("cannot start the thread counting sources")?;
        let serves = http::Serves::Metrics {
            sources,
            daemon: Arc::clone(&daemon_state),
            policies: usize::from(args.metrics_policies),
        };
        local.spawn_local(http::serve(
            listener,
            serves,
            netns.map(str::to_owned),
            scope.direction,
        )?);
    }
    if let Some((addr, listener)) = top_listener {
        eprintln!("shaper: serving /top on http://{addr}");
        local.spawn_local(http::serve(
            listener,
            http::Serves::Top,
            netns.map(str::to_owned),
            scope.direction,
        )?);
    }
    if !args.no_api {
        let api = api::start(&args.api_socket, &args.file, netns, scope.direction)?;
        eprintln!("shaper: serving the API on {}", args.api_socket.display());
        local.spawn_local(api::serve(api));
    }
    local.spawn_local(links_conn);
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut grow_check = tokio::time::interval(grow::GROW_EVERY);
    grow_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut grow_failed: Vec<String> = Vec::new();
    // Interfaces whose attach failed: tried again on their next link event or reload,
    // not every check.
    let mut stuck: Vec<String> = Vec::new();
    let reattach = |name: &str, running: &[AttachRequest], stuck: &mut Vec<String>| {
        // An interface of the file is back (made again, or its namespace's), or lost its
        // filter: attach it again, with what is running.
        let said = match attach_again(name, running, netns) {
            Ok(said) => said,
            Err(e) => {
                stuck.push(name.to_owned());
                format!("{name}: attaching it failed: {e:#}")
            }
        };
        eprintln!("shaper: {said}");
        notify(&[NotifyState::Status(&said)]);
    };
    local
        .run_until(async {
            notify(&[NotifyState::Ready, NotifyState::Status(&line)]);
            loop {
                let why = tokio::select! {
                    _ = hup.recv() => "SIGHUP",
                    () = until(retry) => "a reload put off",
                    Some(()) = changed.recv() => {
                        // Wait for the writes to settle, then apply what is there if it
                        // is not what was last read.
                        loop {
                            tokio::time::sleep(SETTLE).await;
                            if changed.try_recv().is_err() {
                                break;
                            }
                            while changed.try_recv().is_ok() {}
                        }
                        if Content::read(&args.file) == content {
                            continue;
                        }
                        "the file changed"
                    }
                    Some(name) = futures::StreamExt::next(&mut links) => {
                        // Deleting an interface sends a last RTM_NEWLINK too: only
                        // one that exists and has lost its program is attached. An event
                        // of its own tries again one whose attach failed.
                        stuck.retain(|n| *n != name);
                        if lost(&running, netns).contains(&name) {
                            reattach(&name, &running, &mut stuck);
                        }
                        continue;
                    }
                    _ = check.tick() => {
                        for name in lost(&running, netns) {
                            if !stuck.contains(&name) {
                                reattach(&name, &running, &mut stuck);
                            }
                        }
                        continue;
                    }
                    _ = grow_check.tick() => {
                        grow_tables(&running, netns, &mut grow_failed);
                        continue;
                    }
                    _ = term.recv() => break,
                    _ = int.recv() => break,
                };
                notify(&[NotifyState::Reloading]);
                stuck.clear();
                grow_failed.clear();
                content = Content::read(&args.file);
                retry = None;
                let lock = reload_lock().await.inspect_err(|_| {
                    retry = Some(tokio::time::Instant::now() + RELOAD_RETRY);
                });
                let (successful, status) = match lock.and_then(|l| {
                    let (note, read) = radius::reloaded(&args.file, radius.as_ref())?;
                    apply_file(&args.file, scope, Some(l)).map(|(d, line)| (d, line + &note, read))
                }) {
                    Ok((desired, line, read)) => {
                        running = desired;
                        radius::take_plans(plans.as_ref(), radius.as_mut(), read);
                        (true, line)
                    }
                    Err(e) => (
                        false,
                        format!("reload refused, the running configuration stays: {e:#}"),
                    ),
                };
                {
                    let mut state = daemon_state.lock().unwrap_or_else(PoisonError::into_inner);
                    state.configured = configured(&running);
                    state.last_reload = Some(metrics::Reload {
                        successful,
                        at: SystemTime::now(),
                    });
                }
                eprintln!("shaper: {why}: {status}");
                notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
            }
        })
        .await;
    notify(&[NotifyState::Stopping]);
    if let Some(accounting) = accounting {
        accounting.stop();
    }
    if !args.detach_on_exit {
        eprintln!("shaper: exiting; the limits stay in force (shaper detach IFACE removes them)");
        return Ok(());
    }
    let _lock = system::lock()?;
    for d in &running {
        let at = Attachment::toward(&d.at.iface, netns, d.at.direction);
        detach::detach(&at)?;
        eprintln!("shaper: detached from {}", at.label());
    }
    Ok(())
}
