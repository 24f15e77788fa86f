//! `shaper run`'s HTTP server (hyper, HTTP/1.1): `/metrics` in the Prometheus text format
//! ([`shaper_user::metrics`]), and `/top?iface=IFACE&n=N`, the N keys dropped most on an
//! interface as JSON (N at most [`TOP_MAX`], 10 by default): addresses are there and
//! never in the metrics' labels.

use std::{convert::Infallible, net::SocketAddr};

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
use shaper_user::pins::Direction;
use tokio::net::TcpListener;

use crate::cli::Scope;

/// The most keys `/top` lists.
pub const TOP_MAX: usize = 1000;

/// What `/metrics` is served as: the encoder writes OpenMetrics text.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` (in the daemon's namespace), or says in one line why not.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for metrics"))
}

/// Serves connections until the task is dropped.
pub async fn serve(listener: TcpListener, netns: Option<String>, direction: Direction) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("shaper: metrics: accept: {e}");
                continue;
            }
        };
        let netns = netns.clone();
        tokio::task::spawn_local(async move {
            let service = service_fn(move |req| {
                let netns = netns.clone();
                async move {
                    let scope = Scope {
                        netns: netns.as_deref(),
                        direction,
                    };
                    Ok::<_, Infallible>(answer(&req, scope))
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

fn answer(req: &Request<Incoming>, scope: Scope<'_>) -> Response<Full<Bytes>> {
    if req.method() != hyper::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET".to_owned());
    }
    match req.uri().path() {
        "/metrics" => match shaper_user::metrics::render(scope.netns) {
            Ok(body) => reply(StatusCode::OK, OPENMETRICS, body),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        },
        "/top" => match top_query(req.uri().query().unwrap_or("")) {
            Err(e) => text(StatusCode::BAD_REQUEST, e),
            Ok((iface, n)) => match super::super::stats::top_json(&iface, scope, n) {
                Ok(body) => reply(StatusCode::OK, "application/json", body + "\n"),
                Err(e) => text(StatusCode::NOT_FOUND, format!("{e:#}")),
            },
        },
        other => text(
            StatusCode::NOT_FOUND,
            format!("no {other} here: /metrics, /top?iface=IFACE&n=N"),
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
