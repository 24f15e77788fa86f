//! Entering a named network namespace (`ip netns add NAME`), as `ip -n NAME` does.
//!
//! `setns(2)` with `CLONE_NEWNET` changes only the calling thread's namespace and leaves the
//! mount namespace alone, so `/sys/fs/bpf` stays visible (`ip netns exec` would remount
//! `/sys` and hide it).

use std::{fs::File, os::fd::AsRawFd as _, path::PathBuf};

/// Where iproute2 keeps named network namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace '{name}' does not exist ({path})")]
    Open {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enter network namespace '{name}'")]
    Enter {
        name: String,
        source: std::io::Error,
    },
    /// Not a name `ip netns` takes (`..`, `a/b`): never made a path.
    #[error(transparent)]
    Name(#[from] crate::pins::PinError),
}

impl NetnsError {
    /// Whether the namespace does not exist (rather than could not be entered).
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Moves the calling thread into the named network namespace.
///
/// Call it before spawning threads that must live in the namespace (a thread inherits its
/// creator's namespace), or from the thread that will create the sockets or links.
pub fn enter(name: &str) -> Result<(), NetnsError> {
    crate::pins::check_netns_name(name)?;
    let path = PathBuf::from(NETNS_RUN_DIR).join(name);
    let file = File::open(&path).map_err(|source| NetnsError::Open {
        name: name.to_owned(),
        path: path.clone(),
        source,
    })?;
    // SAFETY: setns only reads the descriptor, which `file` keeps open for the call.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(NetnsError::Enter {
            name: name.to_owned(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Runs `f` on a new thread inside the named network namespace and returns its result.
pub fn run_in<R: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, NetnsError> {
    let name = name.to_owned();
    std::thread::spawn(move || -> Result<R, NetnsError> {
        enter(&name)?;
        Ok(f())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
