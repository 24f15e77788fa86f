//! Whether an attachment still holds its program on an interface, as the kernel says.
//!
//! aya 0.14's `LinkInfo` does not expose the XDP link's interface, so this asks the kernel
//! directly ([`crate::bpf`]). When its interface is unregistered the kernel detaches the
//! link and reports ifindex 0: the pins are then stale. A clsact filter has no link: it is
//! live only while a filter running the pinned program (by id) is on the interface's
//! clsact qdisc, in the attachment's direction ([`crate::tc::filter_prog_ids`]); the
//! interface made again, or its qdisc deleted (`tc qdisc del dev IF clsact`), takes the
//! filter with it while the pin stays.

use std::{io, os::fd::AsFd as _, path::Path};

use crate::{
    bpf,
    pins::Attachment,
    system::{self, SystemError},
    tc,
};

/// Whether an attachment holds its program on its interface.
#[derive(Debug)]
pub enum Liveness {
    /// Its link (or clsact filter) runs its program on the interface.
    Live,
    /// It holds nothing: the interface is gone, or made again, or the filter removed.
    /// Its pins (maps, settings) stay until detached or attached over again.
    Gone,
    /// The kernel could not be asked: nothing may be concluded (never unpin on this).
    Unknown(io::Error),
}

impl Liveness {
    pub fn is_live(&self) -> bool {
        matches!(self, Self::Live)
    }
}

/// The ifindex the XDP link pinned at `path` is attached to; 0 if its interface is gone.
pub fn xdp_link_ifindex(path: &Path) -> io::Result<u32> {
    let fd = bpf::obj_get(path)?;
    Ok(bpf::xdp_link_info(fd.as_fd())?.ifindex)
}

/// Whether the attachment holds its program on its interface (see [`Liveness`]): an XDP
/// or TCX link reports ifindex 0 once its interface is gone; a clsact filter must be on
/// the interface's qdisc with the pinned program's id.
pub fn liveness(at: &Attachment) -> Liveness {
    let link = at.link();
    if link.exists() {
        return match xdp_link_ifindex(&link) {
            Ok(0) => Liveness::Gone,
            Ok(_) => Liveness::Live,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Liveness::Gone,
            Err(e) => Liveness::Unknown(e),
        };
    }
    clsact_liveness(at)
}

fn clsact_liveness(at: &Attachment) -> Liveness {
    let prog = match bpf::obj_get(&at.tc_prog()) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Liveness::Gone,
        Err(e) => return Liveness::Unknown(e),
    };
    let id = match bpf::prog_id(prog.as_fd()) {
        Ok(id) => id,
        Err(e) => return Liveness::Unknown(e),
    };
    let ifindex = match system::ifindex(&at.iface) {
        Ok(ifindex) => ifindex,
        Err(SystemError::NoInterface(_)) => return Liveness::Gone,
        Err(e) => return Liveness::Unknown(io::Error::other(e.to_string())),
    };
    match tc::filter_prog_ids(ifindex, at.direction) {
        Ok(ids) if ids.contains(&id) => Liveness::Live,
        Ok(_) => Liveness::Gone,
        Err(e) => Liveness::Unknown(e),
    }
}

/// Whether the attachment holds its program on its interface; "could not tell" is not
/// live (where that matters, [`liveness`] tells them apart).
pub fn is_live(at: &Attachment) -> bool {
    liveness(at).is_live()
}

/// What to say of an attachment that holds nothing (see [`liveness`]).
pub fn gone(at: &Attachment) -> String {
    let netns = at
        .netns
        .as_deref()
        .map(|ns| format!(" -n {ns}"))
        .unwrap_or_default();
    let (iface, direction) = (&at.iface, at.direction_flag());
    if system::ifindex(iface).is_ok() {
        return format!(
            "shaper's program is no longer attached to {} (the interface was made again, or its filter or clsact qdisc removed): `shaper{netns} attach {iface}{direction}` with its settings attaches it again over its pins (the daemon does so itself), `shaper{netns} detach {iface}{direction}` removes them",
            at.label(),
        );
    }
    format!(
        "the interface of {} is gone (the kernel detached shaper when it was deleted): `shaper{netns} detach {iface}{direction}` removes its pins",
        at.label(),
    )
}
