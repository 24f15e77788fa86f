//! What must hold on the host before shaper touches the kernel: privileges, bpffs, and
//! the interface. Each failure is one line naming the missing thing.

use std::{ffi::CString, io, path::Path};

#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error(
        "shaper must run as root or with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (missing {missing})"
    )]
    Privileges { missing: String },
    #[error("bpffs is not mounted at {path} (mount it with: mount -t bpf -o mode=0700 bpf {path})")]
    Bpffs { path: String },
    #[error("interface '{0}' does not exist")]
    NoInterface(String),
    #[error("invalid interface name '{0}'")]
    BadInterfaceName(String),
    #[error("cannot read the MTU of '{iface}'")]
    Mtu { iface: String, source: io::Error },
    #[error("cannot take the lock {path}")]
    Lock { path: String, source: io::Error },
    #[error("another `shaper run` is running on this host (it holds {path})")]
    DaemonRunning { path: String },
    #[error(
        "{burst} bytes is smaller than one full-size frame on {iface} ({frame} bytes: MTU {mtu} + {ETH_HLEN}-byte Ethernet header), so such frames could never pass"
    )]
    BurstBelowFrame {
        iface: String,
        burst: u64,
        frame: u32,
        mtu: u32,
    },
}

/// Ethernet header bytes every frame carries on top of the MTU (no VLAN tag, no FCS).
pub const ETH_HLEN: u32 = 14;

/// Refuses a burst of `burst` bytes below one full-size frame on `iface` (which must
/// exist): such frames could never pass.
pub fn check_burst_fits(iface: &str, burst: u64) -> Result<(), SystemError> {
    ifindex(iface)?;
    let mtu = mtu(iface)?;
    let frame = mtu + ETH_HLEN;
    if burst < u64::from(frame) {
        return Err(SystemError::BurstBelowFrame {
            iface: iface.to_owned(),
            burst,
            frame,
            mtu,
        });
    }
    Ok(())
}

/// Held while a command changes attachments, so two shaper commands never interleave
/// their map writes. Released when dropped (the file stays). The lock files are root's,
/// mode 0600 ([`crate::owned::open_private`]): `flock` needs only a descriptor, so a user
/// who could open one could hold it and stop every change.
///
/// The change lock's file holds the host's change count ([`Lock::generation`]): every
/// change moves it on under the lock before it writes anything ([`crate::change`]), so
/// what a process read of the attachments under one count is still so under the same
/// count (the daemon's subscriber index keeps its reads this way).
pub struct Lock(std::fs::File);

/// The bytes of the change count in the lock's file: 20 decimal digits and a newline.
const GENERATION_BYTES: usize = 21;

/// After the count, the change log: what each of the last [`LOG_RECORDS`] changes may
/// have touched, a record of [`RECORD_BYTES`] each at [`record_at`] its count (so the
/// daemon keeps what it read of an attachment while the changes since name others only).
/// A record: the change's count, then up to [`RECORD_DIGESTS`] attachments' digests
/// ([`digest`]; 0 for none), or [`EVERY`] alone. All little-endian `u64`s.
const LOG_OFFSET: u64 = 64;
const LOG_RECORDS: u64 = 256;
const RECORD_DIGESTS: usize = 7;
const RECORD_BYTES: usize = 8 * (1 + RECORD_DIGESTS);
/// A change that may have touched every attachment.
const EVERY: u64 = u64::MAX;

fn record_at(count: u64) -> u64 {
    LOG_OFFSET + (count % LOG_RECORDS) * RECORD_BYTES as u64
}

/// An attachment's name in the change log: FNV-1a of `label`, never 0 or [`EVERY`] (a
/// collision makes a change of one count as a change of the other: read again, no more).
pub fn digest(label: &str) -> u64 {
    match crate::fnv::fnv1a(label.bytes()) {
        0 | EVERY => 1,
        h => h,
    }
}

impl Lock {
    /// The host's change count as the lock's file holds it (0 for an empty file or one
    /// it cannot read as a count).
    pub fn generation(&self) -> Result<u64, SystemError> {
        use std::os::unix::fs::FileExt as _;
        let mut buf = [0u8; GENERATION_BYTES];
        let n = self.0.read_at(&mut buf, 0).map_err(|e| self.err(e))?;
        Ok(std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0))
    }

    /// Moves the change count on from `seen` (what [`Lock::generation`] read) and says
    /// what it is now. A file without a count starts from the clock, so a lock file made
    /// anew never repeats a count an earlier one held.
    pub fn bump(&self, seen: u64) -> Result<u64, SystemError> {
        use std::os::unix::fs::FileExt as _;
        let next = match seen {
            0 => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1),
            n => n.wrapping_add(1).max(1),
        };
        let text = format!("{next:020}\n");
        self.0
            .write_all_at(text.as_bytes(), 0)
            .map_err(|e| self.err(e))?;
        Ok(next)
    }

    /// [`Lock::bump`], logging what the change of the new count may touch: the
    /// attachments of `touched` ([`digest`]), or every attachment if it is empty.
    pub fn bump_logging(&self, seen: u64, touched: &[u64]) -> Result<u64, SystemError> {
        use std::os::unix::fs::FileExt as _;
        let next = self.bump(seen)?;
        let mut record = [0u8; RECORD_BYTES];
        record[..8].copy_from_slice(&next.to_le_bytes());
        match touched.len() {
            1..=RECORD_DIGESTS => {
                for (i, d) in touched.iter().enumerate() {
                    record[8 + 8 * i..16 + 8 * i].copy_from_slice(&d.to_le_bytes());
                }
            }
            _ => record[8..16].copy_from_slice(&EVERY.to_le_bytes()),
        }
        self.0
            .write_all_at(&record, record_at(next))
            .map_err(|e| self.err(e))?;
        Ok(next)
    }

    /// The attachments ([`digest`]s) the changes since count `since` may have touched,
    /// `since` being at most the count now; `None` if that could be any: a change that
    /// may touch every attachment, one of a shaper that does not log (an older one), or
    /// more than [`LOG_RECORDS`] changes since.
    pub fn touched_since(&self, since: u64) -> Result<Option<Vec<u64>>, SystemError> {
        use std::os::unix::fs::FileExt as _;
        let now = self.generation()?;
        if now < since || now - since > LOG_RECORDS {
            return Ok(None);
        }
        let mut log = vec![0u8; LOG_OFFSET as usize + LOG_RECORDS as usize * RECORD_BYTES];
        let n = self.0.read_at(&mut log, 0).map_err(|e| self.err(e))?;
        log.truncate(n);
        let mut touched = Vec::new();
        for count in since + 1..=now {
            let at = record_at(count) as usize;
            let Some(record) = log.get(at..at + RECORD_BYTES) else {
                return Ok(None);
            };
            let mut words = record
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
            if words.next() != Some(count) {
                return Ok(None);
            }
            for word in words.filter(|w| *w != 0) {
                if word == EVERY {
                    return Ok(None);
                }
                touched.push(word);
            }
        }
        Ok(Some(touched))
    }

    fn err(&self, source: io::Error) -> SystemError {
        SystemError::Lock {
            path: LOCK_PATH.to_owned(),
            source,
        }
    }
}

/// Where [`lock`] locks: a file on tmpfs, which every mount namespace of the host shares.
pub const LOCK_PATH: &str = "/run/shaper.lock";

/// Waits for and takes the host-wide lock on changes.
pub fn lock() -> Result<Lock, SystemError> {
    Ok(flock(LOCK_PATH, true)?.expect("a waiting flock is taken"))
}

/// Takes the host-wide lock on changes if no one holds it; `None` if another does (the
/// daemon waits for it between other work, never in `flock`).
pub fn try_lock() -> Result<Option<Lock>, SystemError> {
    flock(LOCK_PATH, false)
}

/// Where [`daemon_lock`] locks: one `shaper run` per host, whatever its namespace.
pub const DAEMON_LOCK_PATH: &str = "/run/shaper.run.lock";

/// Takes the daemon's lock without waiting: held for the daemon's life, so a second
/// daemon is refused at once. (Commands take [`lock`] for each change, daemon included.)
pub fn daemon_lock() -> Result<Lock, SystemError> {
    flock(DAEMON_LOCK_PATH, false)?.ok_or_else(|| SystemError::DaemonRunning {
        path: DAEMON_LOCK_PATH.to_owned(),
    })
}

/// An exclusive `flock` on the root-only file `path` (made 0600 if missing): waited for,
/// or tried once (`None`: another holds it).
fn flock(path: &str, wait: bool) -> Result<Option<Lock>, SystemError> {
    let err = |source| SystemError::Lock {
        path: path.to_owned(),
        source,
    };
    let file = crate::owned::open_private(Path::new(path)).map_err(err)?;
    let operation = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    use std::os::fd::AsRawFd as _;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(err(e));
    }
    Ok(Some(Lock(file)))
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Checks the effective capabilities for loading and attaching programs: CAP_BPF, and
/// CAP_PERFMON (the verifier refuses the program from a loader without it: it reads
/// packet and map memory as only a perfmon-capable loader may), and CAP_NET_ADMIN.
/// CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON, as the kernel allows.
pub fn check_privileges() -> Result<(), SystemError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    missing_privileges(eff).map_or(Ok(()), |missing| Err(SystemError::Privileges { missing }))
}

/// What an effective capability set `eff` lacks, in words, or `None`.
fn missing_privileges(eff: u64) -> Option<String> {
    let has = |cap: u32| eff & (1 << cap) != 0;
    let mut missing = Vec::new();
    let sys_admin = has(CAP_SYS_ADMIN);
    for (granted, name) in [
        (has(CAP_BPF) || sys_admin, "CAP_BPF"),
        (has(CAP_PERFMON) || sys_admin, "CAP_PERFMON"),
        (has(CAP_NET_ADMIN), "CAP_NET_ADMIN"),
    ] {
        if !granted {
            missing.push(name);
        }
    }
    match missing.as_slice() {
        [] => None,
        [one] => Some((*one).to_owned()),
        [first @ .., last] => Some(format!("{} and {last}", first.join(", "))),
    }
}

/// Checks that `path` is a bpffs mount (pins can live nowhere else).
pub fn check_bpffs(path: &Path) -> Result<(), SystemError> {
    let err = || SystemError::Bpffs {
        path: path.display().to_string(),
    };
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| err())?;
    // SAFETY: statfs writes into the zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 || st.f_type != BPF_FS_MAGIC {
        return Err(err());
    }
    Ok(())
}

/// The index of `iface` in the calling thread's network namespace.
pub fn ifindex(iface: &str) -> Result<u32, SystemError> {
    let c = CString::new(iface).map_err(|_| SystemError::BadInterfaceName(iface.to_owned()))?;
    if iface.is_empty() || iface.len() >= libc::IFNAMSIZ || iface.contains('/') {
        return Err(SystemError::BadInterfaceName(iface.to_owned()));
    }
    // SAFETY: a NUL-terminated string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(SystemError::NoInterface(iface.to_owned())),
        index => Ok(index),
    }
}

/// The MTU of `iface`, asked of the kernel (not sysfs, which shows the namespace it was
/// mounted in, not the one this thread is in).
pub fn mtu(iface: &str) -> Result<u32, SystemError> {
    let fail = |source| SystemError::Mtu {
        iface: iface.to_owned(),
        source,
    };
    // SAFETY: a plain socket for the ioctl; closed by OwnedFd.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; the name fits (checked by ifindex's callers, and
    // truncated here regardless).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(iface.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SIOCGIFMTU,
            &mut req,
        )
    };
    if rc != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    // SAFETY: SIOCGIFMTU fills the ifru_mtu member.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}

/// A seed no one outside this host can guess: std's hash keys, which come from the
/// operating system's random source (`getrandom`). Each call gives another.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_change_log_says_what_changes_since_a_count_touched() {
        let path = std::env::temp_dir().join(format!("shaper-log-test-{}", std::process::id()));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let lock = Lock(file);
        let bump = |touched: &[u64]| lock.bump_logging(lock.generation().unwrap(), touched);
        let since = bump(&[1, 2]).unwrap();
        assert_eq!(lock.touched_since(since).unwrap(), Some(vec![]));
        bump(&[5]).unwrap();
        bump(&[6, 7]).unwrap();
        assert_eq!(lock.touched_since(since).unwrap(), Some(vec![5, 6, 7]));
        // Every attachment: none named, or more than a record holds.
        let mark = lock.generation().unwrap();
        bump(&[]).unwrap();
        assert_eq!(lock.touched_since(mark).unwrap(), None);
        let mark = lock.generation().unwrap();
        bump(&[11, 12, 13, 14, 15, 16, 17]).unwrap();
        assert_eq!(lock.touched_since(mark).unwrap().unwrap().len(), 7);
        bump(&[11, 12, 13, 14, 15, 16, 17, 18]).unwrap();
        assert_eq!(lock.touched_since(mark).unwrap(), None);
        // The log holds the last LOG_RECORDS changes.
        let mark = lock.generation().unwrap();
        for _ in 0..LOG_RECORDS {
            bump(&[9]).unwrap();
        }
        assert_eq!(lock.touched_since(mark).unwrap().unwrap().len(), 256);
        bump(&[9]).unwrap();
        assert_eq!(lock.touched_since(mark).unwrap(), None);
        // A change that logs nothing (an older shaper's): the record where its would be
        // is an earlier change's.
        let mark = lock.generation().unwrap();
        lock.bump(mark).unwrap();
        assert_eq!(lock.touched_since(mark).unwrap(), None);
        // The count itself is where older shapers read it.
        assert!(lock.generation().unwrap() > mark);
    }

    #[test]
    fn privileges_are_named_when_missing() {
        let caps = |list: &[u32]| list.iter().map(|c| 1u64 << c).sum::<u64>();
        assert_eq!(
            missing_privileges(caps(&[CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN])),
            None
        );
        assert_eq!(
            missing_privileges(caps(&[CAP_SYS_ADMIN, CAP_NET_ADMIN])),
            None
        );
        assert_eq!(
            missing_privileges(caps(&[CAP_BPF, CAP_NET_ADMIN])).as_deref(),
            Some("CAP_PERFMON")
        );
        assert_eq!(
            missing_privileges(caps(&[CAP_SYS_ADMIN])).as_deref(),
            Some("CAP_NET_ADMIN")
        );
        assert_eq!(
            missing_privileges(0).as_deref(),
            Some("CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN")
        );
    }
}
