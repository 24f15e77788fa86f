//! The `[radius]` table: `shaper run`'s RADIUS Dynamic Authorization listener
//! ([`crate::radius`]), off without it. `apply` reads past it.
//!
//! ```toml
//! [radius]
//! interface = "eth1"              # whose subscribers: upload rates on its ingress, download on its egress
//! listen = "0.0.0.0:3799"         # optional, this default
//! identify = ["user-name", "framed-ip-address", "framed-ipv6-prefix", "delegated-ipv6-prefix", "acct-session-id"]
//! require_message_authenticator = false
//! require_event_timestamp = true
//! event_timestamp_window = "300s"
//! requests_per_second = 100       # per client, and as many at once
//! burst_time = "20ms"             # each new rate's burst lasts this long at it (at least 16k)
//!
//! [[radius.client]]
//! address = "192.0.2.10"
//! secret_file = "/etc/shaper/radius-192.0.2.10.secret"   # root's, mode 0600 or 0400
//! # or: secret = "..." (the file must then be readable by root alone)
//! ```

use std::{net::SocketAddr, os::unix::fs::MetadataExt as _, path::Path, time::Duration};

use serde::Deserialize;
use toml::Spanned;

use super::{FileError, file::read_bytes};
use crate::{
    radius::{
        Client, Config, DEFAULT_BURST_NS, DEFAULT_PORT, DEFAULT_RATE, DEFAULT_WINDOW, MAX_CLIENTS,
        request::Identify,
    },
    units::Delay,
};

/// The longest secret read.
pub const MAX_SECRET_BYTES: usize = 128;

#[derive(Deserialize)]
struct Top {
    #[serde(default)]
    radius: Option<Spanned<RadiusModel>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RadiusModel {
    interface: Spanned<String>,
    #[serde(default)]
    listen: Option<Spanned<String>>,
    #[serde(default)]
    identify: Option<Vec<Identify>>,
    #[serde(default)]
    require_message_authenticator: bool,
    #[serde(default = "yes")]
    require_event_timestamp: bool,
    #[serde(default)]
    event_timestamp_window: Option<Spanned<String>>,
    #[serde(default)]
    requests_per_second: Option<Spanned<u32>>,
    #[serde(default)]
    burst_time: Option<Spanned<String>>,
    #[serde(default, rename = "client")]
    clients: Vec<ClientModel>,
    #[serde(default)]
    accounting: Option<Spanned<super::accounting::AccountingModel>>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientModel {
    address: Spanned<String>,
    #[serde(default)]
    secret: Option<Spanned<String>>,
    #[serde(default)]
    secret_file: Option<Spanned<String>>,
}

/// The `[radius]` table of file `file` (its text `text`), or `None` if it has none;
/// secret files read. Errors name the file, line and field.
pub fn parse_radius(file: &str, text: &str) -> Result<Option<Config>, FileError> {
    let line = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let error = |offset: usize, field: &str, message: String| FileError {
        file: file.to_owned(),
        line: line(offset),
        field: field.to_owned(),
        message,
    };
    let top: Top = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        error(at, "radius", e.message().trim().replace('\n', " "))
    })?;
    let Some(model) = top.radius else {
        return Ok(None);
    };
    let start = model.span().start;
    let m = model.into_inner();
    let spanned_err = |span: std::ops::Range<usize>, field: &str, msg: String| {
        error(span.start, &format!("radius.{field}"), msg)
    };
    let iface = m.interface.get_ref();
    if let Err(e) = crate::pins::check_iface_name(iface) {
        return Err(spanned_err(m.interface.span(), "interface", e.to_string()));
    }
    let listen = match &m.listen {
        None => SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
        Some(l) => l.get_ref().parse().map_err(|_| {
            spanned_err(
                l.span(),
                "listen",
                format!("invalid address '{}': ADDR:PORT", l.get_ref()),
            )
        })?,
    };
    let delay = |v: &Option<Spanned<String>>, field: &str, default: u64| {
        v.as_ref().map_or(Ok(default), |v| {
            match v.get_ref().parse::<Delay>().map(Delay::ns) {
                Ok(0) => Err(spanned_err(
                    v.span(),
                    field,
                    "must be more than 0".to_owned(),
                )),
                Ok(ns) => Ok(ns),
                Err(e) => Err(spanned_err(v.span(), field, e.to_string())),
            }
        })
    };
    let window_ns = delay(
        &m.event_timestamp_window,
        "event_timestamp_window",
        u64::try_from(DEFAULT_WINDOW.as_nanos()).unwrap_or(u64::MAX),
    )?;
    let window = Duration::from_nanos(window_ns);
    if window < Duration::from_secs(1) || window > Duration::from_secs(3600) {
        let span = m
            .event_timestamp_window
            .as_ref()
            .map_or(0..0, Spanned::span);
        return Err(spanned_err(
            span,
            "event_timestamp_window",
            "must be 1s to 1h".to_owned(),
        ));
    }
    let burst_ns = delay(&m.burst_time, "burst_time", DEFAULT_BURST_NS)?;
    let rate = match &m.requests_per_second {
        None => DEFAULT_RATE,
        Some(r) if (1..=100_000).contains(r.get_ref()) => *r.get_ref(),
        Some(r) => {
            return Err(spanned_err(
                r.span(),
                "requests_per_second",
                "must be 1 to 100000".into(),
            ));
        }
    };
    let identify = m.identify.unwrap_or_else(|| Identify::ALL.to_vec());
    if identify.is_empty() {
        return Err(error(
            start,
            "radius.identify",
            "names no attribute".to_owned(),
        ));
    }
    // Accounting alone needs no client (no CoA listener then).
    let least = usize::from(m.accounting.is_none());
    if m.clients.len() < least || m.clients.len() > MAX_CLIENTS {
        return Err(error(
            start,
            "radius.client",
            format!("1 to {MAX_CLIENTS} [[radius.client]] needed"),
        ));
    }
    let mut clients: Vec<Client> = Vec::new();
    for (i, c) in m.clients.iter().enumerate() {
        let here = format!("client[{i}]");
        let address = c.address.get_ref().parse().map_err(|_| {
            spanned_err(
                c.address.span(),
                &format!("{here}.address"),
                format!("invalid address '{}'", c.address.get_ref()),
            )
        })?;
        if clients.iter().any(|k| k.address == address) {
            return Err(spanned_err(
                c.address.span(),
                &format!("{here}.address"),
                format!("{address} is listed twice"),
            ));
        }
        let secret = secret_of(
            c.secret.as_ref(),
            c.secret_file.as_ref(),
            &here,
            c.address.span(),
        )
        .map_err(|(span, field, why)| spanned_err(span, &field, why))?;
        clients.push(Client { address, secret });
    }
    Ok(Some(Config {
        listen,
        interface: iface.clone(),
        clients,
        identify,
        require_message_authenticator: m.require_message_authenticator,
        require_event_timestamp: m.require_event_timestamp,
        window,
        rate,
        burst_ns,
        plans: super::parse_plans(file, text)?,
        accounting: match m.accounting {
            None => None,
            Some(a) => Some(super::accounting::parse(&a, &error)?),
        },
    }))
}

/// Whether the text of a file has a `[radius]` table with a secret given inline.
pub fn has_inline_secret(text: &str) -> bool {
    #[derive(Deserialize)]
    struct Client {
        secret: Option<toml::Value>,
    }
    #[derive(Deserialize)]
    struct Accounting {
        #[serde(default)]
        server: Vec<Client>,
    }
    #[derive(Deserialize)]
    struct Radius {
        #[serde(default)]
        client: Vec<Client>,
        accounting: Option<Accounting>,
    }
    #[derive(Deserialize)]
    struct Top {
        radius: Option<Radius>,
    }
    toml::from_str::<Top>(text)
        .ok()
        .and_then(|t| t.radius)
        .is_some_and(|r| {
            let servers = r.accounting.map(|a| a.server).unwrap_or_default();
            r.client.iter().chain(&servers).any(|c| c.secret.is_some())
        })
}

/// The secret of table `here`: exactly one of its `secret` and `secret_file`, checked (the
/// file read). An error says where (the field's span, or `whole` when neither or both are
/// given), which field, and why.
pub(super) fn secret_of(
    secret: Option<&Spanned<String>>,
    file: Option<&Spanned<String>>,
    here: &str,
    whole: std::ops::Range<usize>,
) -> Result<Vec<u8>, (std::ops::Range<usize>, String, String)> {
    match (secret, file) {
        (Some(v), None) => check_secret(v.get_ref().as_bytes().to_vec())
            .map_err(|e| (v.span(), format!("{here}.secret"), e)),
        (None, Some(f)) => read_secret(Path::new(f.get_ref()))
            .map_err(|e| (f.span(), format!("{here}.secret_file"), e)),
        _ => Err((
            whole,
            here.to_owned(),
            "give one of secret and secret_file".to_owned(),
        )),
    }
}

fn check_secret(secret: Vec<u8>) -> Result<Vec<u8>, String> {
    if secret.is_empty() || secret.len() > MAX_SECRET_BYTES {
        return Err(format!("a secret is 1 to {MAX_SECRET_BYTES} bytes"));
    }
    Ok(secret)
}

/// A secret file: its owner's (root's or ours) alone to read and write, its content the
/// secret (one trailing newline dropped).
fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let mut bytes = read_bytes(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {shown}: {e}"))?
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{shown} is readable by group or others (mode {mode:04o}; chmod 600 it)"
        ));
    }
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    check_secret(bytes).map_err(|e| format!("{shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "[[interface]]\nname = \"eth0\"\nrate = \"1mbit\"\nburst = \"64k\"\n\n[radius]\ninterface = \"eth0\"\nlisten = \"127.0.0.1:3799\"\n\n[[radius.client]]\naddress = \"10.0.0.1\"\nsecret = \"s3cret\"\n";

    #[test]
    fn a_radius_table_reads_with_its_defaults() {
        let c = parse_radius("f", GOOD).unwrap().unwrap();
        assert_eq!(c.listen, "127.0.0.1:3799".parse().unwrap());
        assert_eq!(c.clients[0].secret, b"s3cret");
        assert_eq!(c.window, DEFAULT_WINDOW);
        assert!(c.require_event_timestamp && !c.require_message_authenticator);
        assert_eq!(c.identify, Identify::ALL);
        assert!(has_inline_secret(GOOD));
        assert_eq!(
            parse_radius("f", "[[interface]]\nname = \"eth0\"\n").unwrap(),
            None
        );
        // apply reads past it.
        assert_eq!(
            super::super::parse("f", GOOD, crate::pins::Direction::Ingress)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let err = |from: &str, to: &str| {
            parse_radius("f", &GOOD.replace(from, to))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("\"10.0.0.1\"", "\"ten\""),
            "f:11: radius.client[0].address: invalid address 'ten'"
        );
        assert_eq!(
            err("secret = \"s3cret\"", "secret = \"\""),
            "f:12: radius.client[0].secret: a secret is 1 to 128 bytes"
        );
        assert_eq!(
            err("secret = \"s3cret\"", ""),
            "f:11: radius.client[0]: give one of secret and secret_file"
        );
        assert!(
            err("secret = \"s3cret\"", "secret_file = \"/nonexistent/s\"")
                .starts_with("f:12: radius.client[0].secret_file: "),
            "{}",
            err("secret = \"s3cret\"", "secret_file = \"/nonexistent/s\"")
        );
        assert!(
            err("listen", "listne").starts_with("f:8: radius: unknown field `listne`"),
            "{}",
            err("listen", "listne")
        );
        assert!(
            err("secret = \"s3cret\"", "secret_file = \"/nonexistent\"")
                .starts_with("f:12: radius.client[0].secret_file: cannot read /nonexistent")
        );
        assert_eq!(
            err(
                "listen = \"127.0.0.1:3799\"",
                "event_timestamp_window = \"7200s\""
            ),
            "f:8: radius.event_timestamp_window: must be 1s to 1h"
        );
    }
}
