//! Facts about the machine xtask runs on: whether we are root, and where programs are.

use std::env;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

/// Whether the effective uid is 0. Read from /proc rather than calling `geteuid` so xtask needs
/// no `libc` dependency.
pub fn is_root() -> Result<bool> {
    const STATUS: &str = "/proc/self/status";
    let status = fs::read_to_string(STATUS).with_context(|| format!("could not read {STATUS}"))?;
    effective_uid(&status)
        .map(|uid| uid == 0)
        .with_context(|| format!("no effective uid in {STATUS}"))
}

/// The effective uid from a /proc/<pid>/status text, whose `Uid:` line lists the real,
/// effective, saved and filesystem uids.
fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|line| line.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Finds the executable `name` on PATH, then in /usr/sbin and /sbin, which a non-root PATH often
/// leaves out although `ip`, `tc` and `bpftool` live there.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &std::path::Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_uid_is_second_field() {
        let status = "Name:\tcat\nUid:\t1000\t0\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Name:\tcat\n"), None);
    }

    #[test]
    fn finds_sh_but_not_nonsense() {
        assert!(find_program("sh").is_some());
        assert!(find_program("no-such-program-xtask").is_none());
    }
}
