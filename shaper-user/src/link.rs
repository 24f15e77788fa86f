//! What a pinned XDP bpf_link is attached to.
//!
//! aya 0.14's `LinkInfo` does not expose the XDP link's interface, so this asks the kernel
//! directly ([`crate::bpf`]). When its interface is unregistered the kernel detaches the
//! link and reports ifindex 0: the pins are then stale.

use std::{io, os::fd::AsFd as _, path::Path};

use crate::bpf;

/// The ifindex the XDP link pinned at `path` is attached to; 0 if its interface is gone.
pub fn xdp_link_ifindex(path: &Path) -> io::Result<u32> {
    let fd = bpf::obj_get(path)?;
    Ok(bpf::xdp_link_info(fd.as_fd())?.ifindex)
}
