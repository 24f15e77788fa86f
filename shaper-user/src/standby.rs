//! A program held ready for an interface that may come back ([`Standby`]), for the
//! daemon: linked again in milliseconds over the attachment's own pins ([`relink`])
//! instead of loaded and verified anew.

use aya::{
    Ebpf, EbpfLoader,
    maps::MapData,
    programs::{
        Xdp, XdpMode,
        links::{FdLink, LinkError},
    },
};
use shaper_common::{
    layout,
    maps::{Config, PROG_XDP, XDP_MODE_NATIVE, XDP_MODE_SKB},
};

use crate::{
    attach::{AttachError, pin_err},
    link, maps, object,
    pins::Attachment,
    policy::PolicyTable,
    system, upgrade,
};

/// The program, loaded and verified ahead of time over an XDP attachment's own pinned
/// maps, ready to be linked again when the attachment's interface is deleted and made
/// again ([`relink`]). The verifier is nearly all of an attach's time (1.2 s of 1.25 s
/// here, fresh pins or stale alike), so a daemon that keeps one per interface puts a
/// re-created interface back under its limits in milliseconds. It holds no map of its
/// own: only the program.
pub struct Standby {
    ebpf: Ebpf,
    /// The ids of the pinned maps it was loaded over, in [`layout::current`]'s order.
    map_ids: Vec<u32>,
}

impl Standby {
    /// Whether it was loaded over the maps pinned for `at` now.
    pub fn is_over(&self, at: &Attachment) -> bool {
        pinned_map_ids(at).is_ok_and(|ids| ids == self.map_ids)
    }
}

/// The ids of an attachment's pinned maps, in [`layout::current`]'s order.
fn pinned_map_ids(at: &Attachment) -> Result<Vec<u32>, AttachError> {
    layout::current()
        .maps
        .iter()
        .map(|m| {
            let path = at.dir().join(m.pin);
            MapData::from_pin(&path)
                .and_then(|d| d.info())
                .map(|info| info.id())
                .map_err(|e| AttachError::load(format!("{}: {e}", path.display())))
        })
        .collect()
}

/// Loads and verifies the XDP program over the pinned maps of `at`, which must be an
/// XDP attachment of this shaper's layout (live or not).
pub fn standby(at: &Attachment) -> Result<Standby, AttachError> {
    upgrade::require_current(at).map_err(AttachError::from)?;
    let config = maps::read_config(at)?;
    if !matches!(config.xdp_mode, XDP_MODE_NATIVE | XDP_MODE_SKB) {
        return Err(AttachError::load(format!(
            "{} is not an XDP attachment",
            at.label()
        )));
    }
    // Every pin must be there: the loader would make and pin a map that is not.
    let map_ids = pinned_map_ids(at)?;
    let capacity = maps::sources_capacity(at)?;
    let mut load = EbpfLoader::new();
    for m in layout::current().maps {
        load.map_pin_path(m.name, at.dir().join(m.pin));
    }
    let mut ebpf = object::load_with(load, capacity)?;
    object::xdp_program(&mut ebpf, PROG_XDP)?;
    if pinned_map_ids(at)? != map_ids {
        return Err(AttachError::load(format!(
            "the pins of {} changed while loading",
            at.label()
        )));
    }
    Ok(Standby { ebpf, map_ids })
}

/// Links `standby`'s program to the interface of `at` again, over the same pins, if the
/// interface is back and the pins are still those the program was loaded over; returns
/// whether it did (false: nothing done, attach the usual way). The attachment keeps its
/// maps: sources, policies and counters go on from where they were. The caller holds the
/// lock, and applies the settings it wants afterwards (an update in place).
pub fn relink(at: &Attachment, standby: &mut Standby) -> Result<bool, AttachError> {
    if !at.exists() || link::is_live(at) || system::ifindex(&at.iface).is_err() {
        return Ok(false);
    }
    if !standby.is_over(at) {
        return Ok(false);
    }
    let config = maps::read_config(at)?;
    let (mode, xdp_mode) = match config.xdp_mode {
        XDP_MODE_NATIVE => (XdpMode::Driver, XDP_MODE_NATIVE),
        XDP_MODE_SKB => (XdpMode::Skb, XDP_MODE_SKB),
        _ => return Ok(false),
    };
    let iface = at.iface.as_str();
    let prog: &mut Xdp = standby
        .ebpf
        .program_mut(PROG_XDP)
        .ok_or_else(|| AttachError::load(format!("program {PROG_XDP} missing")))?
        .try_into()
        .map_err(AttachError::load)?;
    let link_id = prog
        .attach(iface, mode)
        .map_err(|source| AttachError::Attach {
            iface: iface.to_owned(),
            source,
        })?;
    let link: FdLink = prog
        .take_link(link_id)
        .map_err(AttachError::load)?
        .try_into()
        .map_err(|e: LinkError| {
            AttachError::load(format!("XDP was attached without a bpf_link: {e}"))
        })?;
    // The old link, whose interface is gone, gives its pin to the new one. Should this
    // process die before the new pin is made, its link goes with it and the pins are
    // stale as before.
    std::fs::remove_file(at.link()).map_err(pin_err("the old link", &at.link()))?;
    link.pin(at.link())
        .map_err(pin_err("the link", &at.link()))?;
    PolicyTable::open(at)?.set_config(&Config { xdp_mode, ..config })?;
    Ok(true)
}
