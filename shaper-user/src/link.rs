//! Whether an attachment still holds its program on an interface.
//!
//! aya 0.14's `LinkInfo` does not expose the XDP link's interface, so this asks the kernel
//! directly ([`crate::bpf`]). When its interface is unregistered the kernel detaches the
//! link and reports ifindex 0: the pins are then stale.

use std::{io, os::fd::AsFd as _, path::Path};

use crate::{bpf, pins::Attachment, system};

/// The ifindex the XDP link pinned at `path` is attached to; 0 if its interface is gone.
pub fn xdp_link_ifindex(path: &Path) -> io::Result<u32> {
    let fd = bpf::obj_get(path)?;
    Ok(bpf::xdp_link_info(fd.as_fd())?.ifindex)
}

/// Whether the attachment's pinned link still holds the program on an interface (an XDP
/// or TCX link reports ifindex 0 once its interface is gone). A clsact filter has no
/// link: it is live while its interface is there (the filter goes with the interface).
pub fn is_live(at: &Attachment) -> bool {
    if at.link().exists() {
        return xdp_link_ifindex(&at.link()).is_ok_and(|ifindex| ifindex != 0);
    }
    at.tc_prog().exists() && system::ifindex(&at.iface).is_ok()
}

/// What to say of an attachment whose interface is gone (see [`is_live`]).
pub fn gone(at: &Attachment) -> String {
    format!(
        "the interface of {} is gone (the kernel detached shaper when it was deleted): `shaper{} detach {}{}` removes its pins",
        at.label(),
        at.netns
            .as_deref()
            .map(|ns| format!(" -n {ns}"))
            .unwrap_or_default(),
        at.iface,
        at.direction_flag()
    )
}
