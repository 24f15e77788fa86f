//! The `[radius.accounting]` table: RADIUS accounting (RFC 2866) of the `[radius]`
//! interface's subscribers to its servers ([`crate::radius::accounting`]), off without it.
//!
//! ```toml
//! [radius.accounting]
//! interim = "300s"              # optional, this default: 1s to 1d
//! timeout = "3s"                # optional, this default: each try's wait for an answer
//! retries = 2                   # optional, this default: retransmissions to each server
//! nas_identifier = "bng1"       # optional, the host's name by default
//! nas_ip_address = "192.0.2.1"  # optional, none by default
//!
//! [[radius.accounting.server]]  # 1 to 8, tried in order
//! address = "192.0.2.20"        # port 1813 unless given ("192.0.2.20:1813", "[2001:db8::20]:1813")
//! secret_file = "/etc/shaper/acct.secret"
//! ```

use std::{net::SocketAddr, time::Duration};

use serde::Deserialize;
use toml::Spanned;

use super::{FileError, radius::secret_of};
use crate::{
    radius::accounting::{
        Config, DEFAULT_INTERIM, DEFAULT_PORT, DEFAULT_RETRIES, DEFAULT_TIMEOUT, MAX_INTERIM,
        MAX_RETRIES, MAX_SERVERS, MIN_INTERIM, Server, hostname,
    },
    units::Delay,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AccountingModel {
    #[serde(default)]
    interim: Option<Spanned<String>>,
    #[serde(default)]
    timeout: Option<Spanned<String>>,
    #[serde(default)]
    retries: Option<Spanned<u32>>,
    #[serde(default)]
    nas_identifier: Option<Spanned<String>>,
    #[serde(default)]
    nas_ip_address: Option<Spanned<String>>,
    #[serde(default, rename = "server")]
    servers: Vec<ServerModel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerModel {
    address: Spanned<String>,
    #[serde(default)]
    secret: Option<Spanned<String>>,
    #[serde(default)]
    secret_file: Option<Spanned<String>>,
}

type Error<'a> = &'a dyn Fn(usize, &str, String) -> FileError;

/// A duration field within `min..=max`, `default` when absent.
fn duration(
    v: Option<&Spanned<String>>,
    field: &str,
    (default, min, max): (Duration, Duration, Duration),
    error: Error<'_>,
) -> Result<Duration, FileError> {
    let Some(v) = v else { return Ok(default) };
    let at = v.span().start;
    let name = format!("radius.accounting.{field}");
    let d = v
        .get_ref()
        .parse::<Delay>()
        .map(|d| Duration::from_nanos(d.ns()))
        .map_err(|e| error(at, &name, e.to_string()))?;
    if d < min || d > max {
        return Err(error(at, &name, format!("must be {min:?} to {max:?}")));
    }
    Ok(d)
}

/// The table read (secret files too); errors name the line and field.
pub(super) fn parse(
    model: &Spanned<AccountingModel>,
    error: Error<'_>,
) -> Result<Config, FileError> {
    let start = model.span().start;
    let m = model.get_ref();
    let interim = duration(
        m.interim.as_ref(),
        "interim",
        (DEFAULT_INTERIM, MIN_INTERIM, MAX_INTERIM),
        error,
    )?;
    let timeout = duration(
        m.timeout.as_ref(),
        "timeout",
        (
            DEFAULT_TIMEOUT,
            Duration::from_millis(100),
            Duration::from_secs(60),
        ),
        error,
    )?;
    let retries = match &m.retries {
        None => DEFAULT_RETRIES,
        Some(r) if *r.get_ref() <= MAX_RETRIES => *r.get_ref(),
        Some(r) => {
            return Err(error(
                r.span().start,
                "radius.accounting.retries",
                format!("must be 0 to {MAX_RETRIES}"),
            ));
        }
    };
    let nas_identifier = match &m.nas_identifier {
        None => hostname(),
        Some(n) if (1..=253).contains(&n.get_ref().len()) => n.get_ref().clone(),
        Some(n) => {
            return Err(error(
                n.span().start,
                "radius.accounting.nas_identifier",
                "must be 1 to 253 bytes".to_owned(),
            ));
        }
    };
    let nas_ip_address = match &m.nas_ip_address {
        None => None,
        Some(a) => Some(a.get_ref().parse().map_err(|_| {
            error(
                a.span().start,
                "radius.accounting.nas_ip_address",
                format!("invalid IPv4 address '{}'", a.get_ref()),
            )
        })?),
    };
    if m.servers.is_empty() || m.servers.len() > MAX_SERVERS {
        return Err(error(
            start,
            "radius.accounting.server",
            format!("1 to {MAX_SERVERS} [[radius.accounting.server]] needed"),
        ));
    }
    let servers = m
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| server(i, s, error))
        .collect::<Result<_, _>>()?;
    Ok(Config {
        servers,
        interim,
        timeout,
        retries,
        nas_identifier,
        nas_ip_address,
    })
}

fn server(i: usize, s: &ServerModel, error: Error<'_>) -> Result<Server, FileError> {
    let here = format!("radius.accounting.server[{i}]");
    let text = s.address.get_ref();
    let address = text
        .parse::<SocketAddr>()
        .or_else(|_| {
            text.parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, DEFAULT_PORT))
        })
        .map_err(|_| {
            error(
                s.address.span().start,
                &format!("{here}.address"),
                format!("invalid address '{text}': ADDR or ADDR:PORT"),
            )
        })?;
    let secret = secret_of(
        s.secret.as_ref(),
        s.secret_file.as_ref(),
        &here,
        s.address.span(),
    )
    .map_err(|(span, field, why)| error(span.start, &field, why))?;
    Ok(Server { address, secret })
}

#[cfg(test)]
mod tests {
    const GOOD: &str = "[[interface]]\nname = \"eth0\"\nrate = \"1mbit\"\nburst = \"64k\"\n\n[radius]\ninterface = \"eth0\"\n\n[radius.accounting]\ninterim = \"60s\"\n\n[[radius.accounting.server]]\naddress = \"10.0.0.9\"\nsecret = \"a\"\n\n[[radius.accounting.server]]\naddress = \"[2001:db8::9]:1645\"\nsecret = \"b\"\n";

    fn parse(text: &str) -> Result<crate::radius::accounting::Config, String> {
        super::super::parse_radius("f", text)
            .map(|c| c.unwrap().accounting.unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn accounting_alone_reads_with_its_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.interim, std::time::Duration::from_secs(60));
        assert_eq!(c.servers[0].address, "10.0.0.9:1813".parse().unwrap());
        assert_eq!(c.servers[1].address, "[2001:db8::9]:1645".parse().unwrap());
        assert_eq!(
            (c.retries, c.timeout),
            (2, std::time::Duration::from_secs(3))
        );
        assert!(super::super::has_inline_secret(GOOD));
    }

    #[test]
    fn accounting_errors_name_the_line_and_field() {
        let err = |from: &str, to: &str| parse(&GOOD.replace(from, to)).unwrap_err();
        assert_eq!(
            err("interim = \"60s\"", "interim = \"500ms\""),
            "f:10: radius.accounting.interim: must be 1s to 86400s"
        );
        assert!(
            err("interim", "intrim").starts_with("f:10: radius: unknown field `intrim`"),
            "{}",
            err("interim", "intrim")
        );
        assert_eq!(
            err("\"10.0.0.9\"", "\"nine\""),
            "f:13: radius.accounting.server[0].address: invalid address 'nine': ADDR or ADDR:PORT"
        );
        assert_eq!(
            err("interim = \"60s\"", "retries = 11"),
            "f:10: radius.accounting.retries: must be 0 to 10"
        );
        // Exactly one of secret and secret_file, on a server as on a client.
        assert_eq!(
            err("secret = \"a\"", "secret = \"a\"\nsecret_file = \"/x\""),
            "f:13: radius.accounting.server[0]: give one of secret and secret_file"
        );
        assert_eq!(
            err("secret = \"b\"", ""),
            "f:17: radius.accounting.server[1]: give one of secret and secret_file"
        );
        assert_eq!(
            err("secret = \"b\"", "secret = \"\""),
            "f:18: radius.accounting.server[1].secret: a secret is 1 to 128 bytes"
        );
    }
}
