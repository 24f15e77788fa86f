//! `shaper run`'s HTTP servers (hyper, HTTP/1.1), each on a listener of its own:
//! `/metrics` in the Prometheus text format ([`shaper_user::metrics`]), and, only where
//! the operator asks for it (`--top`), `/top?iface=IFACE&n=N`, the N keys dropped most on
//! an interface as JSON (N at most [`TOP_MAX`], 10 by default). Addresses are in `/top`
//! and never in the metrics' labels, so `/metrics` can be bound where a Prometheus on
//! another host reaches it while `/top` stays on loopback: a listener answers 404 for the
//! other's path.

use std::{cell::RefCell, convert::Infallible, net::SocketAddr, rc::Rc};

use anyhow::{Context as _, Result};
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::CONTENT_TYPE,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use shaper_user::{
    metrics::{Daemon, SourceCounter},
    pins::Direction,
};
use tokio::net::TcpListener;

use crate::cli::Scope;

/// The most keys `/top` lists.
pub const TOP_MAX: usize = 1000;

/// What `/metrics` is served as: the encoder writes OpenMetrics text.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a listener serves.
#[derive(Clone)]
pub enum Serves {
    /// `/metrics`: the attachments' series, with the keys as last counted and the
    /// daemon's own state.
    Metrics {
        sources: SourceCounter,
        daemon: Rc<RefCell<Daemon>>,
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
}

/// Binds `addr` (in the daemon's namespace) for `what`, or says in one line why not.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for {what}"))
}

/// Serves connections until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    serves: Serves,
    netns: Option<String>,
    direction: Direction,
) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("shaper: metrics: accept: {e}");
                continue;
            }
        };
        let (netns, serves) = (netns.clone(), serves.clone());
        tokio::task::spawn_local(async move {
            let service = service_fn(move |req| {
                let (netns, serves) = (netns.clone(), serves.clone());
                async move {
                    let scope = Scope {
                        netns: netns.as_deref(),
                        direction,
                    };
                    Ok::<_, Infallible>(answer(&req, &serves, scope))
                }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("shaper: metrics: {e}");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

fn text(status: StatusCode, line: String) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", line + "\n")
}

fn answer(req: &Request<Incoming>, serves: &Serves, scope: Scope<'_>) -> Response<Full<Bytes>> {
    if req.method() != hyper::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET".to_owned());
    }
    match (req.uri().path(), serves) {
        ("/metrics", Serves::Metrics { sources, daemon }) => {
            match shaper_user::metrics::render(scope.netns, sources, &daemon.borrow()) {
                Ok(body) => reply(StatusCode::OK, OPENMETRICS, body),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        ("/top", Serves::Top) => match top_query(req.uri().query().unwrap_or("")) {
            Err(e) => text(StatusCode::BAD_REQUEST, e),
            Ok((iface, n)) => match super::super::stats::top_json(&iface, scope, n) {
                Ok(body) => reply(StatusCode::OK, "application/json", body + "\n"),
                Err(e) => text(StatusCode::NOT_FOUND, format!("{e:#}")),
            },
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
