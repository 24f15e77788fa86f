//! `shaper run`'s HTTP servers (hyper, HTTP/1.1), each on a listener of its own:
//! `/metrics` in the Prometheus text format ([`shaper_user::metrics`]), and, only where
//! the operator asks for it (`--top`), `/top?iface=IFACE&n=N`, the N keys dropped most on
//! an interface as JSON (N at most [`TOP_MAX`], 10 by default). Addresses are in `/top`
//! and never in the metrics' labels, so `/metrics` can be bound where a Prometheus on
//! another host reaches it while `/top` stays on loopback: a listener answers 404 for the
//! other's path.
//!
//! Every pod of a node may reach a listener, so each holds against clients that work
//! against it: a client has [`HEADER_TIMEOUT`] to send a request's head, from its
//! connection or from its last answer (keep-alive), and a connection lives
//! [`CONNECTION_LIFETIME`] at most; a listener keeps [`MAX_CONNECTIONS`] open at once,
//! and one more closes the oldest that is not being answered (or, all being answered,
//! the new one); a failed accept (out of descriptors) waits [`ACCEPT_BACKOFF`] before the
//! next, logged once for each run of failures. The answers are rendered on a thread of
//! the listener's own, one at a time, never on the daemon's thread: a scrape or a `/top`
//! at a full table does not hold up a reload, a signal or a link event, nor they a scrape.

use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    rc::Rc,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::CONTENT_TYPE,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use shaper_user::{
    crash,
    metrics::{Daemon, SourceCounter},
    pins::Direction,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot},
    task::AbortHandle,
};

use crate::cli::Scope;

/// The most keys `/top` lists.
pub const TOP_MAX: usize = 1000;

/// How long a client has to send a request's head, from its connection or from the last
/// answer on it (an idle keep-alive connection is closed then too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a connection lives at most, whatever it does (a client that reads its answer
/// slowly, or never).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// How many connections a listener keeps open at once: a scraper needs one, and the
/// daemon's descriptors (LimitNOFILE in the unit) are not theirs to use up.
pub const MAX_CONNECTIONS: usize = 128;

/// How long a listener waits after a failed accept (EMFILE: out of descriptors) before
/// the next: the error would come back at once, forever.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How many requests wait for a listener's renderer before one is answered 503: `/top`
/// walks a source map (seconds at a full table), one at a time and one waiting; a scrape
/// takes milliseconds.
fn queue(serves: &Serves) -> usize {
    match serves {
        Serves::Metrics { .. } => 8,
        Serves::Top => 1,
    }
}

/// How long a request waits for its answer to be rendered before it is answered 503.
const RENDER_TIMEOUT: Duration = Duration::from_secs(10);

/// What `/metrics` is served as: the encoder writes OpenMetrics text.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a listener serves.
#[derive(Clone)]
pub enum Serves {
    /// `/metrics`: the attachments' series, with the keys as last counted and the
    /// daemon's own state.
    Metrics {
        sources: SourceCounter,
        daemon: Arc<Mutex<Daemon>>,
        /// Prefix policies given series of their own, per attachment.
        policies: usize,
    },
    /// `/top`: per-address data.
    Top,
}

impl Serves {
    pub fn path(&self) -> &'static str {
        match self {
            Self::Metrics { .. } => "/metrics",
            Self::Top => "/top",
        }
    }

    /// The name of the listener's renderer thread (at most 15 bytes).
    fn thread(&self) -> &'static str {
        match self {
            Self::Metrics { .. } => "render-metrics",
            Self::Top => "render-top",
        }
    }
}

/// Binds `addr` (in the daemon's namespace) for `what`, or says in one line why not.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for {what}"))
}

type Answer = Response<Full<Bytes>>;

/// A request for the renderer: its path and query, and where the answer goes.
struct Job {
    path: String,
    query: String,
    answer: oneshot::Sender<Answer>,
}

/// Starts the renderer of `serves`, a thread of its own in the caller's namespace (call it
/// on the daemon's thread, which entered it); returns where to send it requests.
fn renderer(
    serves: Serves,
    netns: Option<String>,
    direction: Direction,
) -> Result<mpsc::Sender<Job>> {
    let (tx, mut rx) = mpsc::channel::<Job>(queue(&serves));
    let what = serves.path();
    std::thread::Builder::new()
        .name(serves.thread().to_owned())
        .spawn(move || {
            let mut unreadable = Vec::new();
            while let Some(job) = rx.blocking_recv() {
                let scope = Scope {
                    netns: netns.as_deref(),
                    direction,
                };
                let answer = answer(&job.path, &job.query, &serves, scope, &mut unreadable);
                let _ = job.answer.send(answer);
            }
        })
        .with_context(|| format!("cannot start the thread serving {what}"))?;
    Ok(tx)
}

/// Answers `req` by the renderer: 503 if it has too many waiting, or takes too long.
async fn render(req: Request<Incoming>, jobs: mpsc::Sender<Job>) -> Answer {
    if req.method() != hyper::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET".to_owned());
    }
    let (tx, rx) = oneshot::channel();
    let job = Job {
        path: req.uri().path().to_owned(),
        query: req.uri().query().unwrap_or("").to_owned(),
        answer: tx,
    };
    if jobs.try_send(job).is_err() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: too many requests waiting, try again".to_owned(),
        );
    }
    match tokio::time::timeout(RENDER_TIMEOUT, rx).await {
        Ok(Ok(answer)) => answer,
        _ => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no answer within {RENDER_TIMEOUT:?}, try again"),
        ),
    }
}

/// The open connections of a listener, oldest first.
#[derive(Default)]
struct Open {
    next: u64,
    connections: BTreeMap<u64, Connection>,
}

struct Connection {
    /// Whether a request of it is being answered.
    busy: Rc<Cell<bool>>,
    task: AbortHandle,
}

impl Open {
    /// Makes room for one more connection: closes the oldest not being answered, if
    /// [`MAX_CONNECTIONS`] are open; false if every one is being answered.
    fn make_room(open: &RefCell<Self>) -> bool {
        let closing = {
            let mut open = open.borrow_mut();
            if open.connections.len() < MAX_CONNECTIONS {
                return true;
            }
            let Some(id) = open
                .connections
                .iter()
                .find(|(_, c)| !c.busy.get())
                .map(|(id, _)| *id)
            else {
                return false;
            };
            open.connections.remove(&id)
        };
        if let Some(connection) = closing {
            connection.task.abort();
        }
        true
    }
}

/// Removes its connection from [`Open`] when the connection's task ends or is aborted.
struct Registered {
    open: Rc<RefCell<Open>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut open) = self.open.try_borrow_mut() {
            open.connections.remove(&self.id);
        }
    }
}

/// Clears a connection's busy mark when its answer is made (or the request dropped).
struct Busy(Rc<Cell<bool>>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Failed accepts in a row: the first is logged, and the count when one succeeds again.
#[derive(Default)]
struct Failures {
    count: u64,
    since: Option<Instant>,
}

impl Failures {
    async fn failed(&mut self, what: &str, e: &std::io::Error) {
        if self.count == 0 {
            eprintln!(
                "shaper: {what}: accept: {e}; trying again every {ACCEPT_BACKOFF:?} until one succeeds"
            );
            self.since = Some(Instant::now());
        }
        self.count += 1;
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }

    fn succeeded(&mut self, what: &str) {
        if self.count > 0 {
            let took = self.since.map_or(Duration::ZERO, |s| s.elapsed());
            eprintln!(
                "shaper: {what}: accepting again after {} failed accepts in {took:.1?}",
                self.count
            );
            *self = Self::default();
        }
    }
}

/// Starts `serves`'s renderer; the future serves connections of `listener` until it is
/// dropped.
pub fn serve(
    listener: TcpListener,
    serves: Serves,
    netns: Option<String>,
    direction: Direction,
) -> Result<impl Future<Output = ()>> {
    let what = serves.path();
    let jobs = renderer(serves, netns, direction)?;
    Ok(async move {
        let open = Rc::new(RefCell::new(Open::default()));
        let mut failures = Failures::default();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    failures.failed(what, &e).await;
                    continue;
                }
            };
            failures.succeeded(what);
            if !Open::make_room(&open) {
                // Every connection is being answered: this one is closed at once.
                drop(stream);
                continue;
            }
            connect(stream, &open, jobs.clone());
        }
    })
}

/// Serves one connection on a task of its own, registered in `open`.
fn connect(stream: TcpStream, open: &Rc<RefCell<Open>>, jobs: mpsc::Sender<Job>) {
    let busy = Rc::new(Cell::new(false));
    let id = {
        let mut open = open.borrow_mut();
        open.next += 1;
        open.next
    };
    let registered = Registered {
        open: Rc::clone(open),
        id,
    };
    let marks = Rc::clone(&busy);
    let task = tokio::task::spawn_local(async move {
        let _registered = registered;
        let service = service_fn(move |req| {
            let jobs = jobs.clone();
            marks.set(true);
            let busy = Busy(Rc::clone(&marks));
            async move {
                let answer = render(req, jobs).await;
                drop(busy);
                Ok::<_, Infallible>(answer)
            }
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        // A client gone, slow or idle too long is no news: not logged.
        let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
    });
    open.borrow_mut().connections.insert(
        id,
        Connection {
            busy,
            task: task.abort_handle(),
        },
    );
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

fn text(status: StatusCode, line: String) -> Answer {
    reply(status, "text/plain; charset=utf-8", line + "\n")
}

/// The answer to a GET of `path?query`, rendered on the listener's thread; `unreadable`:
/// the attachments the last scrape left out, logged when they change.
fn answer(
    path: &str,
    query: &str,
    serves: &Serves,
    scope: Scope<'_>,
    unreadable: &mut Vec<String>,
) -> Answer {
    match (path, serves) {
        (
            "/metrics",
            Serves::Metrics {
                sources,
                daemon,
                policies,
            },
        ) => {
            // A copy: the daemon's thread never waits for a scrape to update it.
            let daemon = daemon
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            match shaper_user::metrics::render(scope.netns, sources, &daemon, *policies) {
                Ok(scrape) => {
                    if scrape.unreadable != *unreadable {
                        for line in &scrape.unreadable {
                            eprintln!("shaper: metrics: left out, cannot read {line}");
                        }
                        *unreadable = scrape.unreadable;
                    }
                    reply(StatusCode::OK, OPENMETRICS, scrape.text)
                }
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        ("/top", Serves::Top) => match top_query(query) {
            Err(e) => text(StatusCode::BAD_REQUEST, e),
            Ok((iface, n)) => {
                crash::hold("top-render");
                match super::super::stats::top_json(&iface, scope, n) {
                    Ok(body) => reply(StatusCode::OK, "application/json", body + "\n"),
                    Err(e) => text(StatusCode::NOT_FOUND, format!("{e:#}")),
                }
            }
        },
        (other, serves) => text(
            StatusCode::NOT_FOUND,
            format!("no {other} here: {}", serves.path()),
        ),
    }
}

/// `iface=IFACE&n=N` (n optional, 1 to [`TOP_MAX`]).
fn top_query(query: &str) -> Result<(String, usize), String> {
    let mut iface = None;
    let mut n = 10;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "iface" => iface = Some(value.into_owned()),
            "n" => {
                n = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=TOP_MAX).contains(n))
                    .ok_or_else(|| format!("n '{value}': a number from 1 to {TOP_MAX}"))?;
            }
            other => return Err(format!("unknown parameter '{other}': iface, n")),
        }
    }
    Ok((iface.ok_or("iface is missing: /top?iface=IFACE&n=N")?, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_queries_are_bounded_and_named() {
        assert_eq!(top_query("iface=eth1"), Ok(("eth1".to_owned(), 10)));
        assert_eq!(top_query("iface=eth%31&n=5"), Ok(("eth1".to_owned(), 5)));
        assert_eq!(
            top_query("n=5"),
            Err("iface is missing: /top?iface=IFACE&n=N".to_owned())
        );
        assert!(
            top_query("iface=eth1&n=1001")
                .unwrap_err()
                .contains("n '1001'")
        );
        assert!(top_query("iface=eth1&n=0").is_err());
        assert!(
            top_query("iface=eth1&src=1.2.3.4")
                .unwrap_err()
                .contains("'src'")
        );
    }
}
