//! Detaching shaper from an interface: the program taken off (its link unpinned, or its
//! tc filter deleted, with the clsact qdisc if shaper added it) and every pin removed.
//! Works on the pins alone, so also after the interface or its namespace is gone.

use std::os::fd::AsFd as _;

use aya::programs::links::{LinkError, PinnedLink};
use shaper_common::maps::{Config, TC_MODE_CLSACT, TC_MODE_CLSACT_OWN};

use crate::{
    bpf, maps,
    pins::{Attachment, Direction},
    policy::PolicyTable,
    system, tc,
};

#[derive(Debug, thiserror::Error)]
pub enum DetachError {
    #[error("shaper is not attached to {0}")]
    NotAttached(String),
    #[error("cannot detach the tc filter of {label}: {source}")]
    Tc {
        label: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot open the pinned link {path}")]
    Link { path: String, source: LinkError },
    #[error("cannot remove pins under {path}")]
    Unpin {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Pins(#[from] crate::pins::PinError),
}

/// Detaches shaper and removes every pin. Works even if the interface is gone.
pub fn detach(at: &Attachment) -> Result<(), DetachError> {
    // The names, before they become paths (`..` would be bpffs's root); the directories,
    // before anything in them is removed (a symlink would lead to another tool's pins).
    at.check()?;
    if !at.dir().exists() {
        return Err(DetachError::NotAttached(at.label()));
    }
    take_off_filter(at)?;
    if at.link().exists() {
        let link = PinnedLink::from_pin(at.link()).map_err(|source| DetachError::Link {
            path: at.link().display().to_string(),
            source,
        })?;
        // Unpinning drops the last reference once this process lets go: the program is
        // detached when `_fd_link` goes out of scope.
        let _fd_link = link.unpin().map_err(|source| DetachError::Unpin {
            path: at.link().display().to_string(),
            source,
        })?;
    }
    at.remove_pins().map_err(|source| DetachError::Unpin {
        path: at.dir().display().to_string(),
        source,
    })?;
    crate::subscriber::known::forget(at);
    Ok(())
}

/// Takes the program off the interface and keeps every pin: leaves the attachment as a
/// deleted interface leaves it (its link holding nothing, or its clsact program pinned with
/// no filter), for `attach` to link again over, its cells kept. What a killed relink
/// pinned beside the link, not yet renamed over it, goes.
pub fn unlink(at: &Attachment) -> Result<(), DetachError> {
    at.check()?;
    for pin in [at.link(), at.tc_prog()] {
        let mut beside = pin.into_os_string();
        beside.push(bpf::PIN_BESIDE);
        match std::fs::remove_file(&beside) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(DetachError::Unpin {
                    path: std::path::PathBuf::from(beside).display().to_string(),
                    source: e,
                });
            }
            _ => {}
        }
    }
    if at.link().exists() {
        let unpin = |source| DetachError::Unpin {
            path: at.link().display().to_string(),
            source,
        };
        let link = bpf::obj_get(&at.link()).map_err(unpin)?;
        bpf::link_detach(link.as_fd()).map_err(unpin)?;
    }
    take_off_filter(at)
}

/// Takes a clsact attachment's filter off (see [`detach_tc`]), if it has one; its
/// program's pin stays.
fn take_off_filter(at: &Attachment) -> Result<(), DetachError> {
    if !at.tc_prog().exists() {
        return Ok(());
    }
    let mode = maps::read_config(at).map_or(TC_MODE_CLSACT, |c| c.xdp_mode);
    detach_tc(at, mode).map_err(|source| DetachError::Tc {
        label: at.label(),
        source,
    })
}

/// Takes a clsact attachment's filter off its interface (if the interface is still
/// there), and the clsact qdisc with it if shaper added it (`mode`) and no other clsact
/// attachment of the interface is left on it; if one is, that one now owns the qdisc.
///
/// It works in the attachment's namespace, whichever this thread is in (a rollback runs
/// before the command enters it); a namespace that is gone took the interface with it.
fn detach_tc(at: &Attachment, mode: u32) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let Some(ns) = at.netns.clone() else {
        return detach_tc_here(at, mode);
    };
    let here = at.clone();
    match crate::netns::run_in(&ns, move || detach_tc_here(&here, mode)) {
        Ok(result) => result,
        Err(e) if e.is_missing() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn detach_tc_here(
    at: &Attachment,
    mode: u32,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let Ok(ifindex) = system::ifindex(&at.iface) else {
        // The interface went, and its qdisc and filters with it.
        return Ok(());
    };
    tc::detach_filter(at)?;
    if mode != TC_MODE_CLSACT_OWN {
        return Ok(());
    }
    let other = Attachment {
        direction: match at.direction {
            Direction::Ingress => Direction::Egress,
            Direction::Egress => Direction::Ingress,
        },
        ..at.clone()
    };
    if other.tc_prog().exists()
        && let Ok(mut table) = PolicyTable::open(&other)
        && let Ok(config) = table.config()
    {
        table.set_config(&Config {
            xdp_mode: TC_MODE_CLSACT_OWN,
            ..config
        })?;
        return Ok(());
    }
    match tc::delete_clsact(ifindex) {
        // Someone else deleted it meanwhile.
        Err(e)
            if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            Ok(())
        }
        r => Ok(r?),
    }
}
