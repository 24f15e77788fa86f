//! The daemon's local API (`shaper run`, on a Unix socket): what is not HTTP of it.
//!
//! - Its bodies: a JSON object of the fields a configuration file's subscriber or policy
//!   table takes, read by the file's own model and checks
//!   ([`config_file::parse_subscriber`], [`config_file::parse_policy`]), so the API, the
//!   file and the command line accept and refuse the same values, with the same words;
//!   a refusal names the field and the value in one line.
//! - The status of a change's error ([`status`]).
//! - Its socket, root-only from the moment it exists ([`bind`]).

use std::{
    collections::BTreeMap,
    io,
    os::unix::{
        fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
        net::UnixListener,
    },
    path::{Path, PathBuf},
};

use shaper_common::config::PolicyLimits;

use crate::{
    change::ChangeError,
    config_file::{self, FileError},
    policy::{CheckedPolicy, PolicyError},
    subscriber::{SubscriberError, SubscriberSpec},
};

/// Where `shaper run` serves the API unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/shaper/api.sock";

/// The largest body a request may send: a subscriber with thousands of prefixes fits.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// A request refused: its HTTP status and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub message: String,
}

impl Refused {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
}

/// The body, a JSON object, as the TOML table a file would hold, with `key` (given by
/// the request's path) set to `value`; a body that gives `key` itself is refused.
fn table_of(body: &[u8], key: &str, value: &str) -> Result<String, Refused> {
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body)
        .map_err(|e| Refused::bad(format!("the body is not a JSON object of fields: {e}")))?;
    if map.contains_key(key) {
        return Err(Refused::bad(format!(
            "{key}: given by the path, not the body"
        )));
    }
    if let Some((name, _)) = map.iter().find(|(_, v)| v.is_null()) {
        return Err(Refused::bad(format!(
            "{name}: null is not a value (leave the field out)"
        )));
    }
    map.insert(key.to_owned(), serde_json::Value::String(value.to_owned()));
    toml::to_string(&map).map_err(|e| Refused::bad(format!("the body: {e}")))
}

/// A file error of a body: `field: message`, without the file and line (a missing
/// field's message names it; the parser's line would point at another).
fn refused(e: FileError) -> Refused {
    if e.field.is_empty() || e.message.starts_with("missing field") {
        return Refused::bad(e.message);
    }
    Refused::bad(format!("{}: {}", e.field, e.message))
}

/// Subscriber `id` as `body` states it, checked as the file's subscribers are; a `plan`
/// field names one of `plans()` (the daemon's file's `[plan.NAME]` tables, read only
/// then).
pub fn subscriber(
    id: &str,
    body: &[u8],
    plans: &dyn Fn() -> Result<BTreeMap<String, PolicyLimits>, String>,
) -> Result<SubscriberSpec, Refused> {
    let text = table_of(body, "id", id)?;
    let plans = if text.lines().any(|l| l.starts_with("plan =")) {
        plans().map_err(|e| Refused::new(500, e))?
    } else {
        BTreeMap::new()
    };
    config_file::parse_subscriber("body", &text, &plans).map_err(refused)
}

/// The policy of `prefix` as `body` states it, checked as the file's policies are.
pub fn policy(prefix: &str, body: &[u8]) -> Result<CheckedPolicy, Refused> {
    let text = table_of(body, "prefix", prefix)?;
    config_file::parse_policy("body", &text).map_err(refused)
}

/// The HTTP status of a change refused or failed: 404 for what is not there, 409 for
/// what conflicts with what is, 400 for a value the attachment cannot take, 500 for the
/// rest (the kernel's maps, the journal).
pub fn status(e: &ChangeError) -> u16 {
    match e {
        ChangeError::NotAttached(_) | ChangeError::Gone(_) => 404,
        ChangeError::Subscriber(e) => match e {
            SubscriberError::NotFound(_) => 404,
            SubscriberError::Overlap(_)
            | SubscriberError::Full { .. }
            | SubscriberError::PlanRoom { .. }
            | SubscriberError::Policy(PolicyError::InSubscriber { .. }) => 409,
            SubscriberError::Id(_)
            | SubscriberError::Name(_)
            | SubscriberError::NoPrefix(_)
            | SubscriberError::Duplicate { .. }
            | SubscriberError::LongerThanKey { .. }
            | SubscriberError::Plan { .. } => 400,
            _ => 500,
        },
        ChangeError::Policy(e) => match e {
            PolicyError::NotFound(_) => 404,
            PolicyError::InSubscriber { .. } | PolicyError::Full { .. } => 409,
            PolicyError::Invalid { .. }
            | PolicyError::Duplicate { .. }
            | PolicyError::LongerThanKey { .. } => 400,
            _ => 500,
        },
        ChangeError::Request(_) => 400,
        _ => 500,
    }
}

/// The API's socket at a path, removed when dropped if it is still the one bound.
#[derive(Debug)]
pub struct Bound {
    path: PathBuf,
    ino: (u64, u64),
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path)
            && (m.dev(), m.ino()) == self.ino
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn refuse(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}", path.display()),
    )
}

/// Its directory: made 0700 if missing; one that exists must be root's and writable by
/// root alone (no one else could then swap the socket).
fn directory(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        Err(_) => {}
    }
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() {
        return Err(refuse(dir, "not a directory"));
    }
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(refuse(
            dir,
            "must be root's and writable by root alone (mode 0700 or 0755)",
        ));
    }
    Ok(())
}

/// Binds the API's socket at `path`, root-only from its first moment: bound under a
/// temporary name with umask 0177 (mode 0600, the daemon's owner root), in a directory
/// only root writes, then renamed over `path`, which replaces a stale socket of a
/// daemon killed before it removed its own (one daemon runs per host: its lock is held).
/// Anything at `path` other than a socket is refused, left as it is.
pub fn bind(path: &Path) -> io::Result<(UnixListener, Bound)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    directory(dir)?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(refuse(path, "exists and is not a socket: not replaced"));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let name = path
        .file_name()
        .ok_or_else(|| refuse(path, "names no file"))?;
    let mut temporary = name.to_owned();
    temporary.push(format!(".{}.new", std::process::id()));
    let temporary = dir.join(temporary);
    let _ = std::fs::remove_file(&temporary);
    // SAFETY: umask only sets the process's file mode mask; the old one is put back at
    // once. Another thread creating a file meanwhile would make it 0600 at most.
    let old = unsafe { libc::umask(0o177) };
    let listener = UnixListener::bind(&temporary);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = listener?;
    let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(e);
    }
    let m = std::fs::symlink_metadata(path)?;
    listener.set_nonblocking(true)?;
    Ok((
        listener,
        Bound {
            path: path.to_owned(),
            ino: (m.dev(), m.ino()),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_plans() -> Result<BTreeMap<String, PolicyLimits>, String> {
        Ok(BTreeMap::new())
    }

    fn error_of(body: &str) -> String {
        subscriber("c1", body.as_bytes(), &no_plans)
            .unwrap_err()
            .message
    }

    #[test]
    fn a_subscriber_reads_as_the_file_reads_it() {
        let spec = subscriber(
            "c1042",
            br#"{"name": "Smith", "prefixes": ["100.64.0.14", "fdd7:b724:0:100::/56"], "rate": "20mbit", "burst": "256k"}"#,
            &no_plans,
        )
        .unwrap();
        assert_eq!(spec.id, "c1042");
        assert_eq!(spec.name, "Smith");
        assert_eq!(spec.prefixes.len(), 2);
        assert_eq!(spec.plan.aggregate_rate_bps, 20_000_000);
        assert_eq!(spec.plan.aggregate_burst_bytes, 256 * 1024);
    }

    #[test]
    fn refusals_name_the_field_and_value_in_one_line() {
        let e = error_of(r#"{"prefixes": ["10.0.0.1"], "rate": "10mbitz", "burst": "1m"}"#);
        assert!(e.starts_with("rate: ") && e.contains("10mbitz"), "{e}");
        let e = error_of(r#"{"prefixes": ["10.0.0.1"], "rat": "10mbit", "burst": "1m"}"#);
        assert!(e.contains("unknown field `rat`"), "{e}");
        let e = error_of(r#"{"prefixes": ["10.0.0.300"], "rate": "10mbit", "burst": "1m"}"#);
        assert!(
            e.starts_with("prefixes: ") && e.contains("10.0.0.300"),
            "{e}"
        );
        let e = error_of(r#"{"prefixes": ["10.0.0.1"], "rate": "10mbit"}"#);
        assert!(e.starts_with("burst: "), "{e}");
        let e = error_of(r#"{"id": "c2", "prefixes": ["10.0.0.1"]}"#);
        assert!(e.starts_with("id: "), "{e}");
        let e = error_of(r#"{"prefixes": ["10.0.0.1"], "rate": null}"#);
        assert!(e.starts_with("rate: null"), "{e}");
        let e = error_of("[1]");
        assert!(e.starts_with("the body is not a JSON object"), "{e}");
        for e in [
            error_of(r#"{"prefixes": ["10.0.0.1"], "rate": "10mbitz", "burst": "1m"}"#),
            error_of("{\"prefixes\": [\"10.0.0.1\"], \"rate\": \"1\\nx\"}"),
        ] {
            assert!(!e.contains('\n'), "{e}");
        }
        let e = error_of(r#"{"prefixes": ["10.0.0.1"], "plan": "gold"}"#);
        assert!(e.starts_with("plan: no [plan.gold]"), "{e}");
    }

    #[test]
    fn a_policy_reads_as_the_file_reads_it() {
        let p = policy("2001:db8::/48", br#"{"rate": "4mbit", "burst": "64k"}"#).unwrap();
        assert_eq!(p.spec().prefix.to_string(), "2001:db8::/48");
        assert_eq!(p.spec().limits.rate_bps, 4_000_000);
        let e = policy("10.0.0.0/8", br#"{"action": "pass", "rate": "4mbit"}"#).unwrap_err();
        assert!(e.message.starts_with("rate: has no meaning"), "{e:?}");
        let e = policy("10.0.0.1/8", br#"{"action": "drop"}"#).unwrap_err();
        assert!(e.message.starts_with("prefix: "), "{e:?}");
    }
}
