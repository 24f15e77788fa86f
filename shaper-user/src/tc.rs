//! Attaching the tc program: through TCX (a bpf_link, kernel 6.6 and later) or clsact
//! with a `cls_bpf` filter in direct-action mode (any kernel).
//!
//! clsact leaves the interface as it found it: the qdisc is added only if the interface
//! has none, recorded as shaper's own (`TC_MODE_CLSACT_OWN`), and deleted when the last
//! clsact attachment of the interface that owns it is detached; a qdisc that was there
//! stays. A clsact filter has no bpf_link: the program is pinned instead (`tc_prog`), and
//! the filter is found again by the program's name.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use aya::{
    Ebpf,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::FdLink,
        tc::{self, NlOptions, TcAttachOptions, TcError},
    },
    util::KernelVersion,
};
use shaper_common::maps::{PROG_TC, TC_MODE_CLSACT, TC_MODE_CLSACT_OWN, TC_MODE_TCX};

use crate::pins::{Attachment, Direction};

/// How to attach the tc program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcAttachMode {
    /// TCX where the kernel has it (6.6 and later), clsact otherwise.
    #[default]
    Auto,
    Tcx,
    Clsact,
}

impl TcAttachMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Tcx => "tcx",
            Self::Clsact => "clsact",
        }
    }

    /// Whether an attachment in `mode` (`TC_MODE_*`) is what this asks for.
    pub fn accepts(self, mode: u32) -> bool {
        match self {
            Self::Auto => true,
            Self::Tcx => mode == TC_MODE_TCX,
            Self::Clsact => mode == TC_MODE_CLSACT || mode == TC_MODE_CLSACT_OWN,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TcAttachError {
    #[error("--tc-mode tcx: this kernel ({0}) has no TCX (6.6 and later); use clsact or auto")]
    NoTcx(String),
    #[error("cannot add a clsact qdisc to '{iface}': {source}")]
    Qdisc { iface: String, source: TcError },
    #[error("cannot attach tc {direction} to '{iface}': {source}")]
    Attach {
        iface: String,
        direction: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("cannot pin the tc {what} at {path}: {source}")]
    Pin {
        what: &'static str,
        path: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn attach_type(direction: Direction) -> TcAttachType {
    match direction {
        Direction::Ingress => TcAttachType::Ingress,
        Direction::Egress => TcAttachType::Egress,
    }
}

/// Whether this kernel has TCX.
pub fn has_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

/// Attaches the loaded tc program of `ebpf` to `at` as `mode` asks and pins what keeps it
/// attached; the `TC_MODE_*` it was attached in. `record` is called with that mode before
/// anything is attached (and once a clsact qdisc is added), so that a detach after a
/// kill knows whether the qdisc is shaper's. On failure nothing is left attached and no
/// qdisc added.
pub fn attach(
    ebpf: &mut Ebpf,
    at: &Attachment,
    mode: TcAttachMode,
    record: impl FnOnce(u32) -> Result<(), Box<dyn std::error::Error + Send + Sync>>,
) -> Result<u32, TcAttachError> {
    let tcx = match mode {
        TcAttachMode::Auto => has_tcx(),
        TcAttachMode::Tcx if !has_tcx() => {
            let release = KernelVersion::current()
                .map(|v| format!("{v:?}"))
                .unwrap_or_else(|_| "unknown".to_owned());
            return Err(TcAttachError::NoTcx(release));
        }
        TcAttachMode::Tcx => true,
        TcAttachMode::Clsact => false,
    };
    let prog: &mut SchedClassifier = ebpf
        .program_mut(PROG_TC)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| TcAttachError::Pin {
            what: "program",
            path: PROG_TC.to_owned(),
            source: "the tc program is missing from the object".into(),
        })?;
    let iface = at.iface.as_str();
    let attach_err = |source| TcAttachError::Attach {
        iface: iface.to_owned(),
        direction: at.direction.name(),
        source,
    };
    let record_err = |source| TcAttachError::Pin {
        what: "mode in the settings",
        path: at.config().display().to_string(),
        source,
    };
    if tcx {
        record(TC_MODE_TCX).map_err(record_err)?;
        let id = prog
            .attach_with_options(
                iface,
                attach_type(at.direction),
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(attach_err)?;
        let pin_err = |source: Box<dyn std::error::Error + Send + Sync>| TcAttachError::Pin {
            what: "link",
            path: at.link().display().to_string(),
            source,
        };
        let link: FdLink = prog
            .take_link(id)
            .map_err(|e| pin_err(Box::new(e)))?
            .try_into()
            .map_err(|e: aya::programs::links::LinkError| pin_err(Box::new(e)))?;
        // Dropped unpinned on failure, which detaches it.
        link.pin(at.link()).map_err(|e| pin_err(Box::new(e)))?;
        return Ok(TC_MODE_TCX);
    }
    let created = match tc::qdisc_add_clsact(iface) {
        Ok(()) => true,
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => false,
        Err(source) => {
            return Err(TcAttachError::Qdisc {
                iface: iface.to_owned(),
                source,
            });
        }
    };
    let recorded = if created {
        TC_MODE_CLSACT_OWN
    } else {
        TC_MODE_CLSACT
    };
    let attached = record(recorded)
        .map_err(record_err)
        .and_then(|()| {
            prog.attach_with_options(
                iface,
                attach_type(at.direction),
                TcAttachOptions::Netlink(NlOptions::default()),
            )
            .map_err(attach_err)
        })
        .and_then(|id| {
            // The filter stays when this process exits: the link object must not detach it.
            std::mem::forget(prog.take_link(id));
            prog.pin(at.tc_prog()).map_err(|e| TcAttachError::Pin {
                what: "program",
                path: at.tc_prog().display().to_string(),
                source: Box::new(e),
            })
        });
    if let Err(e) = attached {
        let _ = detach_filter(at);
        if created && let Ok(ifindex) = crate::system::ifindex(iface) {
            let _ = delete_clsact(ifindex);
        }
        return Err(e);
    }
    Ok(recorded)
}

/// Removes shaper's clsact filter from `at` (none there is not an error).
pub fn detach_filter(at: &Attachment) -> Result<(), TcError> {
    match tc::qdisc_detach_program(&at.iface, attach_type(at.direction), PROG_TC) {
        Err(TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

const RTM_DELQDISC: u16 = 37;
const TCA_KIND: u16 = 1;
/// `TC_H_CLSACT` (= `TC_H_INGRESS`): the parent clsact sits at, and its handle `ffff:`.
const TC_H_CLSACT: u32 = 0xffff_fff1;
const CLSACT_HANDLE: u32 = 0xffff_0000;

/// An RTM_DELQDISC request for the clsact qdisc: netlink header, `struct tcmsg`, and the
/// TCA_KIND attribute "clsact".
#[repr(C)]
struct DelQdisc {
    header: libc::nlmsghdr,
    family: u8,
    _pad: [u8; 3],
    ifindex: i32,
    handle: u32,
    parent: u32,
    info: u32,
    kind_len: u16,
    kind_type: u16,
    kind: [u8; 8],
}

/// Deletes the clsact qdisc of interface `ifindex` (and every filter on it). aya can add
/// one but not delete it.
pub fn delete_clsact(ifindex: u32) -> io::Result<()> {
    // SAFETY: plain socket calls on a descriptor owned here; the buffers outlive them.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let sock = OwnedFd::from_raw_fd(fd);
        let req = DelQdisc {
            header: libc::nlmsghdr {
                nlmsg_len: size_of::<DelQdisc>() as u32,
                nlmsg_type: RTM_DELQDISC,
                nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
                nlmsg_seq: 1,
                nlmsg_pid: 0,
            },
            family: libc::AF_UNSPEC as u8,
            _pad: [0; 3],
            ifindex: ifindex as i32,
            handle: CLSACT_HANDLE,
            parent: TC_H_CLSACT,
            info: 0,
            kind_len: 4 + 7,
            kind_type: TCA_KIND,
            kind: *b"clsact\0\0",
        };
        let sent = libc::send(
            sock.as_raw_fd(),
            (&raw const req).cast(),
            size_of::<DelQdisc>(),
            0,
        );
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        // The ack: a header and `struct nlmsgerr`, whose error is 0 or a negated errno.
        let mut buf = [0u8; 512];
        let n = libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let header = size_of::<libc::nlmsghdr>();
        if (n as usize) < header + 4 {
            return Err(io::Error::other("a short netlink answer"));
        }
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let error = i32::from_ne_bytes([
            buf[header],
            buf[header + 1],
            buf[header + 2],
            buf[header + 3],
        ]);
        if kind == libc::NLMSG_ERROR as u16 && error != 0 {
            return Err(io::Error::from_raw_os_error(-error));
        }
        Ok(())
    }
}
