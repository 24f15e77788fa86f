//! Attaching the tc program: through TCX (a bpf_link, kernel 6.6 and later) or clsact
//! with a `cls_bpf` filter in direct-action mode (any kernel).
//!
//! clsact leaves the interface as it found it: the qdisc is added only if the interface
//! has none, recorded as shaper's own (`TC_MODE_CLSACT_OWN`), and deleted when the last
//! clsact attachment of the interface that owns it is detached; a qdisc that was there
//! stays. A clsact filter has no bpf_link: the program is pinned instead (`tc_prog`), and
//! the filter is found again by the program's name, and is live while a filter on the
//! qdisc runs the pinned program's id ([`filter_prog_ids`]).

use std::io;

use aya::{
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::FdLink,
        tc::{self, NlOptions, TcAttachOptions, TcError},
    },
    util::KernelVersion,
};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload, Nla as _, NlasIterator,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcHandle, TcMessage},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use shaper_common::maps::{PROG_TC, TC_MODE_CLSACT, TC_MODE_CLSACT_OWN, TC_MODE_TCX};

use crate::pins::{Attachment, Direction};

/// How to attach the tc program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum TcAttachMode {
    /// TCX where the kernel has it (6.6 and later), clsact otherwise.
    #[default]
    Auto,
    /// A TCX link (kernel 6.6 and later).
    Tcx,
    /// A cls_bpf filter on the clsact qdisc (added if absent, removed on detach if added).
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

/// Attaches the loaded tc program `prog` to `at` as `mode` asks and pins what keeps it
/// attached; the `TC_MODE_*` it was attached in. `record` is called with that mode before
/// anything is attached (and once a clsact qdisc is added), so that a detach after a
/// kill knows whether the qdisc is shaper's. On failure nothing is left attached and no
/// qdisc added.
pub fn attach(
    prog: &mut SchedClassifier,
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
        // Dropped unpinned on failure, which detaches it; over a stale link's pin if
        // relinking.
        crate::bpf::pin_over(&at.link(), |path| link.pin(path).map(drop))
            .map_err(|e| pin_err(Box::new(e)))?;
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
            // Over a stale program's pin if relinking.
            crate::bpf::pin_over(&at.tc_prog(), |path| prog.pin(path)).map_err(|e| {
                TcAttachError::Pin {
                    what: "program",
                    path: at.tc_prog().display().to_string(),
                    source: Box::new(e),
                }
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

/// Deletes the clsact qdisc of interface `ifindex` (and every filter on it): aya can add
/// one but not delete it. A blocking request on a socket of its own, as this runs both
/// inside and outside the daemon's runtime.
pub fn delete_clsact(ifindex: u32) -> io::Result<()> {
    let mut qdisc = TcMessage::with_index(ifindex as i32);
    qdisc.header.parent = TcHandle::CLSACT;
    qdisc.header.handle = TcHandle {
        major: 0xffff,
        minor: 0,
    };
    qdisc
        .attributes
        .push(TcAttribute::Kind("clsact".to_owned()));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::DelQueueDiscipline(qdisc));
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    request.header.sequence_number = 1;
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    let socket = Socket::new(NETLINK_ROUTE)?;
    socket.send_to(&buf, &SocketAddr::new(0, 0), 0)?;
    let (answer, _) = socket.recv_from_full()?;
    let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer)
        .map_err(|e| io::Error::other(format!("a netlink answer that does not parse: {e}")))?;
    match answer.payload {
        NetlinkPayload::Error(e) if e.code.is_some() => Err(e.to_io()),
        _ => Ok(()),
    }
}

/// What a device's qdiscs say about shaping: sch_fq is what holds packets until their
/// departure time (`skb->tstamp`), so shape mode needs it as the device's root qdisc, or
/// under its root `mq` on every queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FqCheck {
    /// fq is the root qdisc, or every queue's under the root mq.
    Fq,
    /// The root qdisc's kind (`noqueue`, `fq_codel`, `mq` with other children, ...).
    Other(String),
}

/// What a dump request (`Get*` with `NLM_F_DUMP`) answers: every message until Done, over
/// a netlink socket of its own, like [`delete_clsact`].
fn dump(what: RouteNetlinkMessage) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut request = NetlinkMessage::from(what);
    request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    request.header.sequence_number = 1;
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    let socket = Socket::new(NETLINK_ROUTE)?;
    socket.send_to(&buf, &SocketAddr::new(0, 0), 0)?;
    let mut found = Vec::new();
    loop {
        let (answer, _) = socket.recv_from_full()?;
        let mut at = 0;
        while at < answer.len() {
            let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer[at..])
                .map_err(|e| {
                    io::Error::other(format!("a netlink answer that does not parse: {e}"))
                })?;
            let len = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(inner) => found.push(inner),
                _ => {}
            }
            if len == 0 {
                break;
            }
            at += len.next_multiple_of(4);
        }
    }
}

/// The qdiscs of interface `ifindex`, as `(handle, parent, kind)`.
fn qdiscs(ifindex: u32) -> io::Result<Vec<(TcHandle, TcHandle, String)>> {
    let all = dump(RouteNetlinkMessage::GetQueueDiscipline(
        TcMessage::with_index(ifindex as i32),
    ))?;
    Ok(all
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewQueueDiscipline(q) if q.header.index == ifindex as i32 => {
                let kind = q.attributes.iter().find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k.clone()),
                    _ => None,
                });
                Some((q.header.handle, q.header.parent, kind.unwrap_or_default()))
            }
            _ => None,
        })
        .collect())
}

/// `TCA_BPF_ID` in a `cls_bpf` filter's options: the id of the program it runs.
const TCA_BPF_ID: u16 = 11;

/// The ids of the programs the `cls_bpf` filters of interface `ifindex`'s clsact qdisc
/// run in `direction`; none if it has no clsact qdisc (or no such interface).
pub fn filter_prog_ids(ifindex: u32, direction: Direction) -> io::Result<Vec<u32>> {
    let mut request = TcMessage::with_index(ifindex as i32);
    request.header.parent = TcHandle {
        major: TcHandle::CLSACT.major,
        minor: match direction {
            Direction::Ingress => TcHandle::MIN_INGRESS,
            Direction::Egress => TcHandle::MIN_EGRESS,
        },
    };
    let all = dump(RouteNetlinkMessage::GetTrafficFilter(request))?;
    let mut ids = Vec::new();
    for m in all {
        let RouteNetlinkMessage::NewTrafficFilter(f) = m else {
            continue;
        };
        if f.header.index != ifindex as i32 {
            continue;
        }
        let bpf = f
            .attributes
            .iter()
            .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
        let options = f.attributes.iter().filter_map(|a| match a {
            TcAttribute::Options(o) => Some(o),
            _ => None,
        });
        // cls_bpf's options are not parsed by netlink-packet-route: one raw nest.
        for option in options.flatten().filter(|_| bpf) {
            let mut nest = vec![0; option.value_len()];
            option.emit_value(&mut nest);
            for nla in NlasIterator::new(&nest[..]).flatten() {
                if nla.kind() == TCA_BPF_ID
                    && let Some(id) = nla.value().first_chunk::<4>()
                {
                    ids.push(u32::from_ne_bytes(*id));
                }
            }
        }
    }
    Ok(ids)
}

/// Whether sch_fq holds interface `ifindex`'s packets (see [`FqCheck`]).
pub fn check_fq(ifindex: u32) -> io::Result<FqCheck> {
    let all = qdiscs(ifindex)?;
    let Some((handle, _, kind)) = all.iter().find(|(_, parent, _)| *parent == TcHandle::ROOT)
    else {
        return Ok(FqCheck::Other("none".to_owned()));
    };
    if kind == "fq" {
        return Ok(FqCheck::Fq);
    }
    if kind == "mq" {
        // mq's children hang off its handle, one per queue (`parent 8001:1`, ...).
        let mut children = all
            .iter()
            .filter(|(_, parent, _)| parent.major == handle.major && *parent != TcHandle::ROOT)
            .peekable();
        if children.peek().is_some() && children.all(|(_, _, k)| k == "fq") {
            return Ok(FqCheck::Fq);
        }
        return Ok(FqCheck::Other("mq without fq on every queue".to_owned()));
    }
    Ok(FqCheck::Other(kind.clone()))
}
