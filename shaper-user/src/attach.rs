//! Attaching shaper to an interface, or changing an attachment in place.
//!
//! Attach is all or nothing: the maps are configured and pinned, then the program is
//! attached through a bpf_link and the link pinned; if any step fails, every pin made so
//! far is removed and the unpinned link detaches when dropped. On an interface that
//! already has shaper, attach rewrites the settings entry in place: the program stays, no
//! packet goes unmetered, and every source keeps its cell (carried over to a new rate by
//! the kernel, never refilled). With `policies`, the prefix policies are set in the same
//! change: on a new attachment before the program is attached, on an existing one right
//! after the settings, which are put back if the policies cannot be written. On an
//! interface an older shaper attached, attach upgrades it in place ([`crate::upgrade`]).
//! On an interface deleted and made again (its link went with it, its pins stayed), or
//! whose clsact filter or qdisc was removed, a
//! program is loaded over this build's pins and linked again: every source's cell, the
//! policies and the counters go on from where they were; pins of an older build, or a
//! request for what cannot change (the hook, the table's size, ...), start afresh.
//!
//! What is asked is checked by [`crate::request`] before anything is made or changed.

use std::os::fd::AsFd as _;

use aya::programs::{
    SchedClassifier, Xdp, XdpMode,
    links::{FdLink, LinkError},
};
use aya_obj::programs::XdpAttachType;
use shaper_common::{
    layout::{self, LAYOUT_VERSION, Layout},
    maps::{
        Config, DEFAULT_MAX_POLICIES, DEFAULT_MAX_SUBSCRIBERS, PROG_XDP, TC_MODE_CLSACT,
        TC_MODE_CLSACT_OWN, XDP_MODE_NATIVE, XDP_MODE_SKB,
    },
    sources::{source_buckets, source_room},
};

use crate::{
    link,
    maps::{self, Pinned, PinnedMapError},
    object::{self, ObjectError, Sizes},
    policy::{PolicyError, PolicySet, PolicyTable},
    request::{self, AttachRequest, Hook, RequestError, XdpAttachMode},
    setting::Setting,
    tc::{self, TcAttachError},
    upgrade::{self, UpgradeError},
};

/// What attach did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// Loaded and attached in this mode (`XDP_MODE_*`).
    New { xdp_mode: u32 },
    /// Shaper was already attached; its policy was updated in place, and its source
    /// tables grown to room for `grown` keys a family if asked ([`upgrade::grow_sources`]).
    Updated { xdp_mode: u32, grown: Option<u32> },
    /// An older shaper had attached it, with pins of layout `from`: its program was
    /// replaced in place, every cell and counter kept ([`crate::upgrade`]).
    Upgraded { xdp_mode: u32, from: u32 },
    /// The interface had been deleted and made again: a program was linked to it over
    /// the attachment's pins, every cell and counter kept, and its policy updated.
    Relinked { xdp_mode: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// What was asked cannot be: one setting, named ([`RequestError::Setting`]).
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(
        "native XDP was refused on '{iface}' (its driver may lack XDP support; try --xdp-mode skb or auto)"
    )]
    NativeRefused {
        iface: String,
        source: aya::programs::ProgramError,
    },
    #[error("cannot attach XDP to '{iface}' (another XDP program may be attached)")]
    Attach {
        iface: String,
        source: aya::programs::ProgramError,
    },
    #[error(transparent)]
    Tc(#[from] TcAttachError),
    #[error("cannot tell whether {label} is attached")]
    Liveness {
        label: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("cannot pin {what} at {path}")]
    Pin {
        what: &'static str,
        path: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Pinned(#[from] PinnedMapError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Upgrade(#[from] UpgradeError),
    #[error(transparent)]
    Pins(#[from] crate::pins::PinError),
}

impl AttachError {
    /// A step of attaching that failed with `e`, told as a failure to load.
    pub(crate) fn load(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Object(ObjectError::load(e))
    }
}

/// Attaches shaper as asked, or updates the policy of an existing attachment in place.
///
/// The caller has checked privileges, bpffs and the interface, and is in the
/// interface's network namespace; within a change ([`crate::change`]), `pinned` is the
/// attachment's pins as the change opened them while its link was live (`None`: not
/// live, not this shaper's layout, or not in a change).
pub fn attach(req: &AttachRequest, pinned: Option<&Pinned>) -> Result<Attached, AttachError> {
    request::check(req)?;
    // The names, before they become paths; the directories, before anything is read.
    req.at.check()?;
    // A killed upgrade is finished first; what it was asked is then asked again.
    upgrade::recover(&req.at)?;
    if let Some(pinned) = pinned {
        return update(req, pinned);
    }
    if req.at.exists() {
        let liveness = link::liveness(&req.at);
        if let link::Liveness::Unknown(source) = liveness {
            // Never taken for gone: that would unpin what may hold every bucket.
            return Err(AttachError::Liveness {
                label: req.at.label(),
                source,
            });
        }
        if liveness.is_live() {
            let l =
                upgrade::identify(&req.at.dir(), &req.at.label()).map_err(UpgradeError::from)?;
            return if l.version == LAYOUT_VERSION {
                update(req, &Pinned::open(&req.at)?)
            } else {
                upgrade_in_place(req, l)
            };
        }
        // The interface these pins were made for was unregistered (the kernel detached
        // the link): link a program to what they hold again, if it can be.
        if let Some(attached) = relink(req)? {
            return Ok(attached);
        }
        req.at
            .remove_pins()
            .map_err(pin_err("stale pins (removing)", &req.at.dir()))?;
    }
    // Validate everything before creating anything.
    let (hook, config) = request::check_new(req)?;
    check_policies(req, &config, hook)?;
    let result = attach_new(req, &config, hook);
    if result.is_err() {
        // Best effort: the original error is the one worth reporting. The files beside
        // the pins (the subscribers' ids, their prefixes) go with them.
        let _ = req.at.remove_pins();
        crate::subscriber::known::forget(&req.at);
    }
    result
}

fn update(req: &AttachRequest, pinned: &Pinned) -> Result<Attached, AttachError> {
    let current = pinned.config()?;
    let cap = pinned.sources_capacity();
    // The limit, mode and admission change: the keys stay as attached.
    let config = request::check_over(req, &current, cap)?;
    request::check_room(
        Setting::MaxSubscribers,
        req.max_subscribers,
        pinned.subscriber_room(),
    )?;
    request::check_room(Setting::MaxPolicies, req.max_policies, pinned.policy_room())?;
    check_policies(req, &config, Hook::of_mode(current.xdp_mode))?;
    if wants_meter2(req, &config) && !pinned.meter2_room() {
        upgrade::make_room_for_meter2(&req.at)?;
    }
    let mut grown = None;
    if let Some(max_sources) = request::grows(req, cap) {
        // Every map the table holds is kept; the tables' keys move with their cells.
        upgrade::grow_sources(&req.at, max_sources)?;
        grown = Some(source_room(source_buckets(max_sources)));
    }
    let mut table = PolicyTable::of(pinned)?;
    table.set_config(&config)?;
    crate::crash::point("update-config");
    if let Some(policies) = &req.policies
        && let Err(e) = table.replace(policies)
    {
        // replace_all has undone its own steps; put the settings back too.
        let _ = table.set_config(&current);
        return Err(e.into());
    }
    Ok(Attached::Updated {
        xdp_mode: current.xdp_mode,
        grown,
    })
}

/// Whether the attachment `req` asks for, whose settings are `config`, needs the second
/// meter's per-key maps full size: its default policy or one of the policies it sets has
/// a second meter.
fn wants_meter2(req: &AttachRequest, config: &Config) -> bool {
    config.meter2.any()
        || req
            .policies
            .iter()
            .flat_map(PolicySet::specs)
            .any(|p| p.limits.meter2.any())
}

/// Refuses the request's policies where they could never match (longer than the keys of
/// `config`), and shaping (of `config`, a policy or a subscriber's plan) where it cannot
/// work.
fn check_policies(req: &AttachRequest, config: &Config, hook: Hook) -> Result<(), AttachError> {
    if let Some(policies) = &req.policies {
        policies.fits((config.prefix_v4, config.prefix_v6))?;
    }
    let specs = req.policies.iter().flat_map(PolicySet::specs);
    request::check_shape(&req.at, hook, config, specs)?;
    let subscribers = req.subscribers.iter().flat_map(|s| &s.specs);
    request::check_subscribers_shape(&req.at, hook, subscribers)?;
    Ok(())
}

/// Upgrades an attachment whose pins have the older layout `from`, asked to keep its
/// settings as they are (an upgrade changes nothing else).
fn upgrade_in_place(req: &AttachRequest, from: &'static Layout) -> Result<Attached, AttachError> {
    let at = &req.at;
    let (_, settings) = upgrade::settings_of(at)?;
    let current = settings.config;
    let cap = maps::sources_capacity(at)?;
    let asked = request::check_over(req, &current, cap)?;
    // The room of the old pins (none before layout 8), which the upgrade keeps.
    request::check_room(
        Setting::MaxSubscribers,
        req.max_subscribers,
        upgrade::max_subscribers(at, from),
    )?;
    request::check_room(
        Setting::MaxPolicies,
        req.max_policies,
        upgrade::max_policies(at),
    )?;
    upgrade::refuse_changes(at, from, &current, &asked, req.policies.is_some())?;
    // Bigger tables: the sources an upgrade moves go into tables of the new size.
    let grows = request::grows(req, cap);
    upgrade::upgrade(at, from, &settings, grows.unwrap_or(cap))?;
    if let Some(max_sources) = grows {
        // Tables the upgrade reused (today's layout's) grow now: a no-op otherwise.
        upgrade::grow_sources(at, max_sources)?;
    }
    Ok(Attached::Upgraded {
        xdp_mode: current.xdp_mode,
        from: from.version,
    })
}

/// The error of a pin that could not be made (or removed) at `path`.
pub(crate) fn pin_err<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(E) -> AttachError {
    let path = path.display().to_string();
    move |e| AttachError::Pin {
        what,
        path,
        source: Box::new(e),
    }
}

/// Loads, configures with `config` (its mode recorded once known), pins and attaches.
fn attach_new(req: &AttachRequest, config: &Config, hook: Hook) -> Result<Attached, AttachError> {
    let at = &req.at;
    let mut ebpf = object::load(Sizes {
        max_sources: crate::grow::new_table_size(req, hook),
        meter2: wants_meter2(req, config),
        max_subscribers: req.max_subscribers.unwrap_or(DEFAULT_MAX_SUBSCRIBERS),
        max_policies: req.max_policies.unwrap_or(DEFAULT_MAX_POLICIES),
    })?;

    crate::pins::make_dirs(&at.dir())?;
    for m in layout::current().maps {
        let path = at.dir().join(m.pin);
        let map = ebpf
            .map(m.name)
            .ok_or_else(|| AttachError::load(format!("map {} missing", m.name)))?;
        map.pin(&path).map_err(pin_err("a map", &path))?;
    }
    crate::crash::point("attach-pinned");
    // Before anything opens the pins, which checks their layout.
    object::write_layout_version(&mut ebpf)?;
    crate::subscriber::record::make(at)
        .map_err(pin_err("the subscribers' ids and names", &at.dir()))?;
    crate::subscriber::prefixes::make(at);

    // The policy is in place before the program can see a packet. The mode is known only
    // after attaching (auto may fall back to skb); it is recorded below, for `status`.
    object::configure(&mut ebpf, config)?;
    if let Some(policies) = &req.policies {
        PolicyTable::open(at)?.replace(policies)?;
    }
    let xdp_mode = link_program(req, Program::loaded(&mut ebpf, hook)?, config)?;
    Ok(Attached::New { xdp_mode })
}

/// Links a program to `req`'s interface again over the pins its deleted namesake left,
/// if they are this build's (an older build's hold nothing this one can run over, as an
/// upgrade would) and the request changes nothing that cannot change on a live
/// attachment: the settings are updated as on one, the policies replaced if asked. `None`
/// (nothing done) otherwise.
fn relink(req: &AttachRequest) -> Result<Option<Attached>, AttachError> {
    let at = &req.at;
    if at.upgrade_prog().exists() {
        return Ok(None);
    }
    // Only this build's pins (checked as they are opened).
    let Ok(pinned) = Pinned::open(at) else {
        return Ok(None);
    };
    let (Ok(current), cap) = (pinned.config(), pinned.sources_capacity()) else {
        return Ok(None);
    };
    let Ok(config) = request::check_over(req, &current, cap) else {
        return Ok(None);
    };
    if request::grows(req, cap).is_some() {
        return Ok(None);
    }
    let hook = Hook::of_mode(current.xdp_mode);
    check_policies(req, &config, hook)?;
    // The new link's pin (or a clsact program's) replaces the stale one in one step, so
    // killed at any point, the pins are either stale as before or linked: the journal
    // takes the program off again (`journal::Undo::Unlink`) and keeps every map.
    // A second meter on maps too small for it waits until they are grown, which needs
    // the link: linked first with the settings as they are.
    let grow = wants_meter2(req, &config) && !pinned.meter2_room();
    let first = if grow { current } else { config };
    let mut table = PolicyTable::of(&pinned)?;
    table.set_config(&first)?;
    if let Some(policies) = req.policies.as_ref().filter(|_| !grow) {
        table.replace(policies)?;
    }
    let xdp_mode = match Stale::of(at, hook) {
        Some(mut stale) => link_program(req, stale.program(), &first)?,
        None => {
            let mut load = aya::EbpfLoader::new();
            for m in layout::current().maps {
                load.map_pin_path(m.name, at.dir().join(m.pin));
            }
            // Every map is reused from its pin, whatever its size.
            let mut ebpf = object::load_with(load, Sizes::full(cap))?;
            link_program(req, Program::loaded(&mut ebpf, hook)?, &first)?
        }
    };
    // A stale pin of the other kind (TCX and clsact both link tc programs) goes.
    let stale = match xdp_mode {
        TC_MODE_CLSACT | TC_MODE_CLSACT_OWN => at.link(),
        _ => at.tc_prog(),
    };
    match std::fs::remove_file(&stale) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(pin_err("the stale link", &stale)(e));
        }
        _ => {}
    }
    if grow {
        // Every map the table holds is kept.
        upgrade::make_room_for_meter2(at)?;
        table.set_config(&Config { xdp_mode, ..config })?;
        if let Some(policies) = &req.policies {
            table.replace(policies)?;
        }
    }
    Ok(Some(Attached::Relinked { xdp_mode }))
}

/// A program to link: loaded from the object ([`Program::loaded`]), or the one a stale
/// link ran ([`Stale`]).
enum Program<'a> {
    Xdp(&'a mut Xdp),
    Tc(&'a mut SchedClassifier),
}

impl<'a> Program<'a> {
    /// `ebpf`'s program for `hook`, loaded into the kernel (verified).
    fn loaded(ebpf: &'a mut aya::Ebpf, hook: Hook) -> Result<Self, AttachError> {
        Ok(match hook {
            Hook::Tc => Self::Tc(object::tc_program(ebpf)?),
            Hook::Xdp => Self::Xdp(object::xdp_program(ebpf, PROG_XDP)?),
        })
    }
}

/// The program `at`'s stale link (or clsact program pin) ran, if the kernel still has it:
/// the same program over the same maps, so linking it again needs nothing loaded or
/// verified, which is most of what an attach costs on a loaded machine.
enum Stale {
    Xdp(Xdp),
    Tc(SchedClassifier),
}

impl Stale {
    fn of(at: &crate::pins::Attachment, hook: Hook) -> Option<Self> {
        if hook == Hook::Tc && at.tc_prog().exists() {
            return SchedClassifier::from_pin(at.tc_prog()).ok().map(Self::Tc);
        }
        let link = crate::bpf::obj_get(&at.link()).ok()?;
        let id = crate::bpf::xdp_link_info(link.as_fd()).ok()?.prog_id;
        let prog = crate::bpf::prog_by_id(id).ok()?;
        // aya opens a program by its pin only: pinned a moment beside the maps (root's
        // alone, as they are) and unpinned once opened.
        let path = at.dir().join(PIN_RELINK_PROG);
        let _ = std::fs::remove_file(&path);
        crate::bpf::obj_pin(prog.as_fd(), &path).ok()?;
        let stale = match hook {
            Hook::Tc => SchedClassifier::from_pin(&path).ok().map(Self::Tc),
            Hook::Xdp => Xdp::from_pin(&path, XdpAttachType::Interface)
                .ok()
                .map(Self::Xdp),
        };
        let _ = std::fs::remove_file(&path);
        stale
    }

    fn program(&mut self) -> Program<'_> {
        match self {
            Self::Xdp(p) => Program::Xdp(p),
            Self::Tc(p) => Program::Tc(p),
        }
    }
}

/// Where [`Stale::of`] pins a stale program for the moment it takes aya to open it.
const PIN_RELINK_PROG: &str = "relink_prog";

/// Attaches `program` to `req`'s interface, pins its link (or, clsact, the program) and
/// records the mode it took in the settings, which are `config` otherwise; returns the
/// mode.
fn link_program(
    req: &AttachRequest,
    program: Program<'_>,
    config: &Config,
) -> Result<u32, AttachError> {
    let prog = match program {
        Program::Xdp(prog) => prog,
        Program::Tc(prog) => return link_tc(req, prog, config),
    };
    let at = &req.at;
    let iface = at.iface.as_str();
    let (link_id, xdp_mode) = match req.xdp_mode {
        XdpAttachMode::Native => prog
            .attach(iface, XdpMode::Driver)
            .map(|id| (id, XDP_MODE_NATIVE))
            .map_err(|source| AttachError::NativeRefused {
                iface: iface.to_owned(),
                source,
            })?,
        XdpAttachMode::Skb => prog
            .attach(iface, XdpMode::Skb)
            .map(|id| (id, XDP_MODE_SKB))
            .map_err(|source| AttachError::Attach {
                iface: iface.to_owned(),
                source,
            })?,
        XdpAttachMode::Auto => match prog.attach(iface, XdpMode::Driver) {
            Ok(id) => (id, XDP_MODE_NATIVE),
            Err(_) => prog
                .attach(iface, XdpMode::Skb)
                .map(|id| (id, XDP_MODE_SKB))
                .map_err(|source| AttachError::Attach {
                    iface: iface.to_owned(),
                    source,
                })?,
        },
    };
    crate::crash::point("attach-attached");
    let link = prog.take_link(link_id).map_err(AttachError::load)?;
    // Through the pin, keeping the generation the policies were written under.
    PolicyTable::open(at)?.set_config(&Config {
        xdp_mode,
        ..*config
    })?;
    let link: FdLink = link.try_into().map_err(|e: LinkError| {
        AttachError::load(format!("XDP was attached without a bpf_link: {e}"))
    })?;
    // Over the stale link's pin, if relinking: never a moment without one.
    crate::bpf::pin_over(&at.link(), |path| link.pin(path).map(drop))
        .map_err(pin_err("the link", &at.link()))?;
    crate::crash::point("attach-linked");
    Ok(xdp_mode)
}

/// [`link_program`] of a tc program: TCX or clsact, as `req` asks.
fn link_tc(
    req: &AttachRequest,
    prog: &mut SchedClassifier,
    config: &Config,
) -> Result<u32, AttachError> {
    let at = &req.at;
    let record = |xdp_mode| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        // Through the pin, keeping the generation the policies were written under.
        PolicyTable::open(at)?.set_config(&Config {
            xdp_mode,
            ..*config
        })?;
        Ok(())
    };
    let xdp_mode = tc::attach(prog, at, req.tc_mode, record)?;
    crate::crash::point("attach-attached");
    crate::crash::point("attach-linked");
    Ok(xdp_mode)
}
