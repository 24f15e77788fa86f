//! `shaper run`'s local API: JSON over HTTP/1.1 (hyper) on a Unix socket only root can
//! connect to ([`shaper_user::api::bind`]; and a peer whose credentials are not root's is
//! closed at once, SO_PEERCRED), for the operator's own systems (billing, provisioning):
//!
//! - `GET /v1/interfaces/IFACE/subscribers[/ID]`: what `shaper -j subscriber list|show`
//!   prints; `PUT .../subscribers/ID` with the fields of a file's subscriber table;
//!   `DELETE .../subscribers/ID`.
//! - `GET /v1/interfaces/IFACE/policies[/PREFIX]`: what `shaper -j policy list` prints (or
//!   its row of PREFIX, `default` the interface's); `PUT .../policies/PREFIX` with the
//!   fields of a file's policy table; `DELETE .../policies/PREFIX`.
//! - `?direction=egress` for the egress attachment (default: the daemon's direction).
//!
//! Every change goes the one change path (lock, journal, write, commit), on a thread of
//! the API's own, one at a time; the lock is waited for [`LOCK_PATIENCE`] at most (503,
//! nothing changed). A refusal is `{"error": "one line"}` naming the field and value.
//! Limits: [`MAX_CONNECTIONS`] open at once (one more is closed), [`HEADER_TIMEOUT`] for a
//! request's head, [`BODY_TIMEOUT`] and [`MAX_BODY_BYTES`] for its body,
//! [`CONNECTION_LIFETIME`] for a connection, [`QUEUE`] requests waiting for the thread.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::CONTENT_TYPE,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use shaper_common::config::PolicyLimits;
use shaper_user::{
    api::{self, Bound, MAX_BODY_BYTES, Refused},
    change, config_file,
    pins::{Attachment, Direction},
    policy::parse_prefix,
    subscriber::{Changed, SubscriberError},
    system,
    units::Size,
};
use tokio::{
    net::UnixListener,
    sync::{Semaphore, mpsc, oneshot},
};

/// How many connections are open at once; one more is closed at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a client has to send a request's head (and between requests on a connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a client has to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection lives at most.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// How many requests wait for the API's thread before one is answered 503.
pub const QUEUE: usize = 32;
/// How long a change waits for the host's change lock before it is answered 503.
pub const LOCK_PATIENCE: Duration = Duration::from_secs(2);
/// How long the listener waits after a failed accept (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A request for the API's thread.
struct Job {
    method: Method,
    path: String,
    query: String,
    body: Bytes,
    answer: oneshot::Sender<(StatusCode, String)>,
}

/// The API, bound and its thread started; [`serve`] accepts on it. Dropped, its socket
/// is removed.
pub struct Api {
    listener: UnixListener,
    bound: Bound,
    jobs: mpsc::Sender<Job>,
}

/// What the API's thread needs.
struct Context {
    file: PathBuf,
    netns: Option<String>,
    direction: Direction,
}

/// Binds the socket at `socket` and starts the API's thread in the daemon's namespace
/// (call it on the daemon's thread); `file` is the daemon's, whose `[plan.NAME]` tables
/// a subscriber's `plan` names.
pub fn start(socket: &Path, file: &Path, netns: Option<&str>, direction: Direction) -> Result<Api> {
    let (listener, bound) = api::bind(socket)
        .with_context(|| format!("cannot serve the API on {}", socket.display()))?;
    let listener = UnixListener::from_std(listener).context("cannot serve the API")?;
    let (jobs, mut rx) = mpsc::channel::<Job>(QUEUE);
    let context = Context {
        file: file.to_owned(),
        netns: netns.map(str::to_owned),
        direction,
    };
    std::thread::Builder::new()
        .name("api".to_owned())
        .spawn(move || {
            while let Some(job) = rx.blocking_recv() {
                let answer = handle(&job, &context);
                let _ = job.answer.send(answer);
            }
        })
        .context("cannot start the API's thread")?;
    Ok(Api {
        listener,
        bound,
        jobs,
    })
}

/// Serves the API's connections until dropped (then its socket is removed).
pub async fn serve(api: Api) {
    let Api {
        listener,
        bound: _bound,
        jobs,
    } = api;
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // The socket is root's, mode 0600: a second fence, the peer's credentials.
        if !stream.peer_cred().is_ok_and(|c| c.uid() == 0) {
            continue;
        }
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            continue;
        };
        let jobs = jobs.clone();
        tokio::task::spawn_local(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let jobs = jobs.clone();
                async move { Ok::<_, Infallible>(answer(req, jobs).await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
        });
    }
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body + "\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error_json(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

/// Reads the request's body (bounded in size and time) and has the API's thread answer.
async fn answer(req: Request<Incoming>, jobs: mpsc::Sender<Job>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(
        BODY_TIMEOUT,
        Limited::new(body, MAX_BODY_BYTES).collect(),
    )
    .await
    {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) => {
            let why = format!("the body is larger than {MAX_BODY_BYTES} bytes, or cut short");
            return reply(StatusCode::PAYLOAD_TOO_LARGE, error_json(&why));
        }
        Err(_) => {
            let why = format!("the body took longer than {BODY_TIMEOUT:?}");
            return reply(StatusCode::REQUEST_TIMEOUT, error_json(&why));
        }
    };
    let (tx, rx) = oneshot::channel();
    let job = Job {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or("").to_owned(),
        body,
        answer: tx,
    };
    if jobs.try_send(job).is_err() {
        let why = "busy: too many requests waiting, nothing changed; try again";
        return reply(StatusCode::SERVICE_UNAVAILABLE, error_json(why));
    }
    match rx.await {
        Ok((status, body)) => reply(status, body),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            error_json("the API's thread is gone"),
        ),
    }
}

/// The answer to one request, on the API's thread; a change is logged in one line.
fn handle(job: &Job, cx: &Context) -> (StatusCode, String) {
    let start = Instant::now();
    let outcome = route(job, cx);
    let (status, body) = match &outcome {
        Ok(body) => (StatusCode::OK, body.clone()),
        Err(r) => (
            StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            error_json(&r.message),
        ),
    };
    if job.method != Method::GET {
        let said = match &outcome {
            Ok(body) => body.clone(),
            Err(r) => format!("refused ({}): {}", r.status, r.message),
        };
        eprintln!(
            "shaper: api: {} {}: {said} ({:.1?})",
            job.method,
            job.path,
            start.elapsed()
        );
    }
    (status, body)
}

/// A path's segment, percent-decoded (`2001:db8::%2F48`).
fn decode(segment: &str) -> Result<String, Refused> {
    let bad = || Refused::new(400, format!("'{segment}': bad percent-encoding"));
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3).ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// The attachment a query names (`direction=ingress|egress`, or the daemon's).
fn direction(query: &str, default: Direction) -> Result<Direction, Refused> {
    let mut direction = default;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        direction = match (&*key, &*value) {
            ("direction", "ingress") => Direction::Ingress,
            ("direction", "egress") => Direction::Egress,
            ("direction", other) => {
                let why = format!("direction '{other}': ingress or egress");
                return Err(Refused::new(400, why));
            }
            (other, _) => {
                return Err(Refused::new(
                    400,
                    format!("unknown parameter '{other}': direction"),
                ));
            }
        };
    }
    Ok(direction)
}

const PATHS: &str = "/v1/interfaces/IFACE/subscribers[/ID], /v1/interfaces/IFACE/policies[/PREFIX]";

/// What a request asks, done: the JSON to answer, or why not.
fn route(job: &Job, cx: &Context) -> Result<String, Refused> {
    let not_here = || Refused::new(404, format!("no {} here: {PATHS}", job.path));
    let rest = job
        .path
        .strip_prefix("/v1/interfaces/")
        .ok_or_else(not_here)?;
    let (iface, rest) = rest.split_once('/').ok_or_else(not_here)?;
    let (kind, key) = match rest.split_once('/') {
        // A key may hold a slash: a prefix's length, unencoded, or one of an id.
        Some((kind, key)) => (kind, Some(decode(key)?)),
        None => (rest, None),
    };
    let iface = decode(iface)?;
    shaper_user::pins::check_iface_name(&iface).map_err(|e| Refused::new(400, e.to_string()))?;
    let at = Attachment::toward(
        &iface,
        cx.netns.as_deref(),
        direction(&job.query, cx.direction)?,
    );
    if !at.exists() {
        let why = format!("shaper is not attached to {}", at.label());
        return Err(Refused::new(404, why));
    }
    let key = key.as_deref();
    match (&job.method, kind, key) {
        (&Method::GET, "subscribers", id) => read_subscribers(&at, id),
        (&Method::PUT, "subscribers", Some(id)) => set_subscriber(&at, id, &job.body, cx),
        (&Method::DELETE, "subscribers", Some(id)) => del_subscriber(&at, id),
        (&Method::GET, "policies", prefix) => read_policies(&at, prefix),
        (&Method::PUT, "policies", Some(prefix)) => set_policy(&at, prefix, &job.body),
        (&Method::DELETE, "policies", Some(prefix)) => del_policy(&at, prefix),
        (method, "subscribers" | "policies", key) => Err(Refused::new(
            405,
            format!(
                "{method} of {}: GET of the list; GET, PUT or DELETE of one",
                if key.is_some() { "one" } else { "the list" }
            ),
        )),
        _ => Err(not_here()),
    }
}

fn read_subscribers(at: &Attachment, id: Option<&str>) -> Result<String, Refused> {
    crate::cli::subscriber::json(at, id).map_err(|e| {
        let status = match e.downcast_ref::<SubscriberError>() {
            Some(SubscriberError::NotFound(_)) => 404,
            Some(SubscriberError::Id(_)) => 400,
            _ => 500,
        };
        Refused::new(status, format!("{e:#}"))
    })
}

fn read_policies(at: &Attachment, prefix: Option<&str>) -> Result<String, Refused> {
    let prefix = match prefix {
        None | Some("default") => prefix.map(str::to_owned),
        Some(p) => Some(
            parse_prefix(p)
                .map_err(|e| Refused::new(400, e.to_string()))?
                .to_string(),
        ),
    };
    match crate::cli::policy::json(at, prefix.as_deref()) {
        Ok(Some(json)) => Ok(json),
        Ok(None) => Err(Refused::new(
            404,
            format!("no policy for {}", prefix.unwrap_or_default()),
        )),
        Err(e) => Err(Refused::new(500, format!("{e:#}"))),
    }
}

/// The change lock within [`LOCK_PATIENCE`], or 503.
fn lock() -> Result<system::Lock, Refused> {
    let deadline = Instant::now() + LOCK_PATIENCE;
    loop {
        match system::try_lock() {
            Ok(Some(lock)) => return Ok(lock),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                return Err(Refused::new(
                    503,
                    format!(
                        "{} is held by another command for over {LOCK_PATIENCE:?}: nothing changed, try again",
                        system::LOCK_PATH
                    ),
                ));
            }
            Err(e) => return Err(Refused::new(500, e.to_string())),
        }
    }
}

/// Refuses a burst (of `field`) below one full-size frame on the interface, as the
/// command line does.
fn burst_fits(at: &Attachment, field: &str, bytes: u64) -> Result<(), Refused> {
    system::check_burst_fits(&at.iface, bytes).map_err(|e| {
        let size = Size::from_bytes(bytes);
        Refused::new(400, format!("{field} {size}: {e}"))
    })
}

fn refused(e: &change::ChangeError) -> Refused {
    Refused::new(api::status(e), e.to_string())
}

fn result(at: &Attachment, what: &str, key: &str, value: &str, changed: &str) -> String {
    serde_json::json!({
        "result": changed,
        "interface": at.iface,
        "direction": at.direction.name(),
        what: key,
        "description": value,
    })
    .to_string()
}

fn changed_name(c: Changed) -> &'static str {
    match c {
        Changed::Added => "added",
        Changed::Changed => "changed",
        Changed::Unchanged => "unchanged",
        Changed::Removed => "removed",
    }
}

fn set_subscriber(at: &Attachment, id: &str, body: &[u8], cx: &Context) -> Result<String, Refused> {
    let plans = || -> Result<BTreeMap<String, PolicyLimits>, String> {
        let name = cx.file.display().to_string();
        let text = config_file::read(&cx.file).map_err(|e| e.to_string())?;
        config_file::parse_plans(&name, &text).map_err(|e| e.to_string())
    };
    let spec = api::subscriber(id, body, &plans)?;
    let p = &spec.plan;
    burst_fits(at, "burst", p.aggregate_burst_bytes)?;
    burst_fits(at, "per_address_burst", p.burst_bytes)?;
    if p.meter2.excess_rate_bps != 0 {
        burst_fits(at, "excess_burst", p.meter2.excess_burst_bytes)?;
    }
    let changed = change::set_subscriber_holding(at, &spec, lock()?).map_err(|e| refused(&e))?;
    let description = crate::cli::subscriber::describe(&spec);
    Ok(result(at, "id", id, &description, changed_name(changed)))
}

fn del_subscriber(at: &Attachment, id: &str) -> Result<String, Refused> {
    let changed = change::del_subscriber_holding(at, id, lock()?).map_err(|e| refused(&e))?;
    Ok(result(at, "id", id, "", changed_name(changed)))
}

fn set_policy(at: &Attachment, prefix: &str, body: &[u8]) -> Result<String, Refused> {
    let policy = api::policy(prefix, body)?;
    let spec = *policy.spec();
    if spec.limits.burst_bytes != 0 {
        burst_fits(at, "burst", spec.limits.burst_bytes)?;
    }
    if spec.limits.aggregate_burst_bytes != 0 {
        burst_fits(at, "aggregate_burst", spec.limits.aggregate_burst_bytes)?;
    }
    let changes = change::set_policy_holding(at, policy, lock()?).map_err(|e| refused(&e))?;
    let what = changes.verb();
    let description = crate::cli::policy::describe(&spec);
    Ok(result(
        at,
        "prefix",
        &spec.prefix.to_string(),
        &description,
        what,
    ))
}

fn del_policy(at: &Attachment, prefix: &str) -> Result<String, Refused> {
    let prefix = parse_prefix(prefix).map_err(|e| Refused::new(400, e.to_string()))?;
    change::del_policy_holding(at, prefix, lock()?).map_err(|e| refused(&e))?;
    Ok(result(at, "prefix", &prefix.to_string(), "", "removed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_decode_and_directions_are_named() {
        assert_eq!(decode("2001:db8::%2F48").unwrap(), "2001:db8::/48");
        assert_eq!(decode("c1042").unwrap(), "c1042");
        assert!(decode("%2").is_err());
        assert!(decode("%zz").is_err());
        assert_eq!(direction("", Direction::Ingress), Ok(Direction::Ingress));
        assert_eq!(
            direction("direction=egress", Direction::Ingress),
            Ok(Direction::Egress)
        );
        assert!(direction("direction=up", Direction::Ingress).is_err());
        assert!(direction("dir=egress", Direction::Ingress).is_err());
    }
}
