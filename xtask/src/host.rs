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

/// Whether `path` is a 64-bit little-endian ELF executable without a program interpreter
/// (`PT_INTERP`): one that runs with no dynamic loader and no libraries beside it.
pub fn is_static_elf(path: &std::path::Path) -> Result<bool> {
    let bytes = fs::read(path).with_context(|| format!("could not read {}", path.display()))?;
    Ok(elf_without_interpreter(&bytes))
}

fn elf_without_interpreter(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    // Magic, ELFCLASS64, ELFDATA2LSB.
    if !bytes.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum)).all(|i| {
        u32_at(phoff + i * usize::from(phentsize)).is_some_and(|p_type| p_type != PT_INTERP)
    })
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
    fn static_elf() {
        // This test binary is dynamically linked (Rust's default on glibc).
        let me = env::current_exe().unwrap();
        assert!(!is_static_elf(&me).unwrap());
        assert!(!elf_without_interpreter(b"#!/bin/sh\n"));
        // A header with no program headers at all: nothing asks for an interpreter.
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        assert!(elf_without_interpreter(&header));
    }

    #[test]
    fn finds_sh_but_not_nonsense() {
        assert!(find_program("sh").is_some());
        assert!(find_program("no-such-program-xtask").is_none());
    }
}
