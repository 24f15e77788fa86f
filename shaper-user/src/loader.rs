//! Loading, attaching, updating and detaching shaper on an interface.
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

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{
        SchedClassifier, Xdp, XdpMode,
        links::{FdLink, LinkError, PinnedLink},
    },
};
use shaper_common::{
    config::{ConfigError, RateLimit},
    layout::{self, LAYOUT_VERSION},
    maps::{
        Admission, Config, DEFAULT_MAX_SOURCES, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, KEY_BY_DST,
        KEY_BY_SRC, MAP_CONFIG, MAP_LAYOUT, MAP_SOURCES, MAP_SOURCES6, MODE_ENFORCE, MODE_SHAPE,
        PROG_TC, PROG_XDP, Shape, TC_MODE_CLSACT, TC_MODE_CLSACT_OWN, TC_MODE_TCX, XDP_MODE_NATIVE,
        XDP_MODE_SKB, is_tc_mode,
    },
};

use crate::{
    kernel::{self, KernelError},
    link,
    maps::{self, PinnedMapError},
    pins::{Attachment, Direction},
    policy::{Mode, PolicyError, PolicySpec, PolicyTable},
    setting::Setting,
    system,
    tc::{self, TcAttachError, TcAttachMode},
    upgrade::{self, UpgradeError},
};

/// The kernel programs, built by build.rs.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shaper-ebpf"));

/// How to attach the XDP program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttachMode {
    /// Native if the driver supports it, otherwise generic (skb).
    Auto,
    /// In the driver; fails if the driver has no XDP support.
    Native,
    /// Generic XDP in the network stack; works on every interface, costs more.
    Skb,
}

/// Where the program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// XDP: ingress only, before the stack (the default for ingress).
    Xdp,
    /// tc: either direction, on socket buffers (after GRO on ingress).
    Tc,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Self::Xdp => "xdp",
            Self::Tc => "tc",
        }
    }

    /// The hook of an attachment in `mode` (`XDP_MODE_*` or `TC_MODE_*`).
    pub fn of_mode(mode: u32) -> Self {
        if is_tc_mode(mode) {
            Self::Tc
        } else {
            Self::Xdp
        }
    }
}

/// The default key of a direction: the source on ingress (each sender held to a rate);
/// the destination on egress, where the sender is this host or what it forwards, and what
/// is held to a rate is each receiver's download.
pub fn default_key(direction: Direction) -> KeyBy {
    match direction {
        Direction::Ingress => KeyBy::Src,
        Direction::Egress => KeyBy::Dst,
    }
}

/// Which address of a frame picks its cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyBy {
    /// The source address: each sender (or sending network) gets its own bucket.
    Src,
    /// The destination address: each receiver (or receiving network) gets its own bucket.
    Dst,
}

impl KeyBy {
    /// As recorded in [`Config::key_by`].
    pub fn value(self) -> u32 {
        match self {
            Self::Src => KEY_BY_SRC,
            Self::Dst => KEY_BY_DST,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Src => "src",
            Self::Dst => "dst",
        }
    }
}

/// `src` or `dst` for a [`Config::key_by`] value.
pub fn key_name(key_by: u32) -> &'static str {
    match key_by {
        KEY_BY_SRC => "src",
        KEY_BY_DST => "dst",
        _ => "unknown",
    }
}

/// What `attach` is asked to do. For each `Option`, `None` means the default for a new
/// attachment, and whatever it is for an existing one.
#[derive(Clone, Debug)]
pub struct AttachRequest {
    pub at: Attachment,
    /// Per source, the default policy's.
    pub rate: RateLimit,
    /// `None`: XDP for a new ingress attachment, tc for egress; as it is on an existing one.
    pub hook: Option<Hook>,
    pub xdp_mode: XdpAttachMode,
    pub tc_mode: TcAttachMode,
    pub max_sources: Option<u32>,
    pub key: Option<KeyBy>,
    pub prefix_v4: Option<u32>,
    pub prefix_v6: Option<u32>,
    /// Enforce, monitor (the whole interface) or shape (the default policy).
    pub mode: Option<Mode>,
    /// Shaping: the ECN threshold and the horizon, in nanoseconds.
    pub ecn_threshold_ns: Option<u64>,
    pub horizon_ns: Option<u64>,
    /// New-source admission of the interface.
    pub admission: AdmissionRequest,
    /// `Some`: make these the interface's prefix policies, in the same change. `None`:
    /// leave the policies as they are (none on a new attachment).
    pub policies: Option<Vec<PolicySpec>>,
}

/// The new-source admission `attach` is asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdmissionRequest {
    /// As it is on an existing attachment; the default on a new one.
    #[default]
    Unchanged,
    /// [`Admission::for_table`] of the attachment's source maps.
    Default,
    Exactly(Admission),
}

impl AdmissionRequest {
    /// The admission to write, for maps of `max_sources` keys now holding `current`.
    fn resolve(self, max_sources: u32, current: Option<Admission>) -> Admission {
        match (self, current) {
            (Self::Exactly(a), _) => a,
            (Self::Unchanged, Some(a)) => a,
            (Self::Unchanged | Self::Default, _) => Admission::for_table(max_sources),
        }
    }
}

/// What attach did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// Loaded and attached in this mode (`XDP_MODE_*`).
    New { xdp_mode: u32 },
    /// Shaper was already attached; its policy was updated in place.
    Updated { xdp_mode: u32 },
    /// An older shaper had attached it, with pins of layout `from`: its program was
    /// replaced in place, every cell and counter kept ([`crate::upgrade`]).
    Upgraded { xdp_mode: u32, from: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// One setting cannot be as asked: named as the file names it ([`Setting`]); the
    /// command line names the flag instead.
    #[error("{setting} {problem}")]
    Setting { setting: Setting, problem: String },
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
    #[error(
        "--mode shape needs sch_fq on '{iface}' to hold packets until their departure time, and its root qdisc is {found}: set it up with `{tc} qdisc replace dev {iface} root fq`"
    )]
    NoFq {
        iface: String,
        found: String,
        tc: String,
    },
    #[error("cannot load the kernel programs")]
    Load(#[source] Box<dyn std::error::Error + Send + Sync>),
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
    Kernel(#[from] KernelError),
}

/// The name of an attach mode (`XDP_MODE_*`, `TC_MODE_*`), as `--xdp-mode` and
/// `--tc-mode` spell it.
pub fn mode_name(xdp_mode: u32) -> &'static str {
    match xdp_mode {
        XDP_MODE_NATIVE => "native",
        XDP_MODE_SKB => "skb",
        TC_MODE_TCX => "tcx",
        TC_MODE_CLSACT | TC_MODE_CLSACT_OWN => "clsact",
        _ => "unknown",
    }
}

/// The hook of a request for a new attachment: as asked, or by direction.
fn hook_for(req: &AttachRequest) -> Result<Hook, AttachError> {
    match (req.at.direction, req.hook) {
        (Direction::Egress, Some(Hook::Xdp)) => Err(setting(
            Setting::Hook,
            "xdp: XDP sees received frames only; egress needs tc",
        )),
        (Direction::Egress, _) => Ok(Hook::Tc),
        (Direction::Ingress, hook) => Ok(hook.unwrap_or(Hook::Xdp)),
    }
}

fn setting(setting: Setting, problem: impl Into<String>) -> AttachError {
    AttachError::Setting {
        setting,
        problem: problem.into(),
    }
}

/// The settings entry for `req`: on a new attachment (`current` none) keyed as `req`
/// asks or by default, on an existing one keyed as it is, with what `req` leaves out as
/// it is. Every settings entry is made here.
pub(crate) fn config_for(
    req: &AttachRequest,
    current: Option<&Config>,
    max_sources: u32,
    xdp_mode: u32,
) -> Result<Config, AttachError> {
    let (key_by, prefix_v4, prefix_v6) = match current {
        Some(c) => (c.key_by, c.prefix_v4, c.prefix_v6),
        None => (
            req.key.unwrap_or(default_key(req.at.direction)).value(),
            req.prefix_v4.unwrap_or(DEFAULT_PREFIX_V4),
            req.prefix_v6.unwrap_or(DEFAULT_PREFIX_V6),
        ),
    };
    let config =
        Config::new(req.rate, key_by, prefix_v4, prefix_v6, xdp_mode).map_err(|e| match e {
            ConfigError::PrefixV6(_) => setting(Setting::PrefixV6, e.to_string()),
            e => setting(Setting::PrefixV4, e.to_string()),
        })?;
    let shape = current.map_or(Shape::default_settings(), |c| c.shape);
    let shape = Shape::new(
        req.ecn_threshold_ns.unwrap_or(shape.ecn_threshold_ns),
        req.horizon_ns.unwrap_or(shape.horizon_ns),
    )
    .map_err(|e| setting(Setting::Horizon, e.to_string()))?;
    Ok(Config {
        shape,
        mode: req
            .mode
            .map_or(current.map_or(MODE_ENFORCE, |c| c.mode), Mode::value),
        admission: req
            .admission
            .resolve(max_sources, current.map(|c| c.admission)),
        // Kept for the life of the attachment: a new seed would lose every trace.
        trace_seed: current.map_or_else(system::random_seed, |c| c.trace_seed),
        ..config
    })
}

/// Refuses shape mode (of the interface, `config`, or of one of `policies`) where it
/// cannot work: anywhere but tc egress, and on a device whose packets sch_fq does not
/// hold (the departure time would be ignored). One line that says how to set fq up.
pub fn check_shape(
    at: &Attachment,
    hook: Hook,
    config: &Config,
    policies: Option<&[PolicySpec]>,
) -> Result<(), AttachError> {
    let shaping = config.mode == MODE_SHAPE
        || policies.is_some_and(|p| p.iter().any(|p| p.mode() == Mode::Shape));
    if !shaping {
        return Ok(());
    }
    if at.direction != Direction::Egress || hook != Hook::Tc {
        return Err(setting(
            Setting::Mode,
            "shape: shaping holds back what an interface sends, so it needs --direction egress (tc); ingress and XDP can only police",
        ));
    }
    fq_present(at)
}

/// Refuses shaping on `at`'s device unless sch_fq holds its packets ([`tc::check_fq`]).
pub fn fq_present(at: &Attachment) -> Result<(), AttachError> {
    let ifindex = system::ifindex(&at.iface).map_err(|e| setting(Setting::Mode, e.to_string()))?;
    match tc::check_fq(ifindex) {
        Ok(tc::FqCheck::Fq) => Ok(()),
        Ok(tc::FqCheck::Other(kind)) => Err(AttachError::NoFq {
            iface: at.iface.clone(),
            found: kind,
            tc: match &at.netns {
                Some(ns) => format!("tc -n {ns}"),
                None => "tc".to_owned(),
            },
        }),
        Err(e) => Err(setting(
            Setting::Mode,
            format!("shape: cannot read the qdiscs of '{}': {e}", at.iface),
        )),
    }
}

/// Refuses a request to key an existing attachment differently from `current`.
fn check_same_keys(req: &AttachRequest, current: &Config) -> Result<(), AttachError> {
    let rekey = |s, asked: String, current: String| {
        setting(
            s,
            format!(
                "{asked} differs from the attached {current}; detach first to key sources differently"
            ),
        )
    };
    if let Some(key) = req.key.filter(|k| k.value() != current.key_by) {
        return Err(rekey(
            Setting::Key,
            key.name().to_owned(),
            format!("key {}", key_name(current.key_by)),
        ));
    }
    for (s, asked, current) in [
        (Setting::PrefixV4, req.prefix_v4, current.prefix_v4),
        (Setting::PrefixV6, req.prefix_v6, current.prefix_v6),
    ] {
        if let Some(asked) = asked.filter(|&p| p != current) {
            return Err(rekey(s, asked.to_string(), format!("prefix /{current}")));
        }
    }
    Ok(())
}

/// Attaches shaper as asked, or updates the policy of an existing attachment in place.
///
/// The caller has checked privileges, bpffs and the interface, and is in the
/// interface's network namespace.
pub fn attach(req: &AttachRequest) -> Result<Attached, AttachError> {
    if req.max_sources == Some(0) {
        return Err(setting(Setting::MaxSources, "0: must be at least 1"));
    }
    // A killed upgrade is finished first; what it was asked is then asked again.
    upgrade::recover(&req.at)?;
    if req.at.exists() {
        if is_live(&req.at) {
            let l =
                upgrade::identify(&req.at.dir(), &req.at.label()).map_err(UpgradeError::from)?;
            return if l.version == LAYOUT_VERSION {
                update(req)
            } else {
                upgrade::upgrade(req, l)
            };
        }
        // The interface these pins were made for is gone (the kernel detached the link
        // when it was unregistered): they hold nothing, so start afresh.
        req.at
            .remove_pins()
            .map_err(pin_err("stale pins (removing)", &req.at.dir()))?;
    }
    // Validate everything before creating anything.
    let hook = hook_for(req)?;
    if hook == Hook::Xdp && req.tc_mode != TcAttachMode::Auto {
        return Err(setting(
            Setting::TcMode,
            format!("{}: the attachment is XDP, not tc", req.tc_mode.name()),
        ));
    }
    if hook == Hook::Tc && req.xdp_mode != XdpAttachMode::Auto {
        return Err(setting(
            Setting::XdpMode,
            "is for XDP, and this attachment is tc",
        ));
    }
    let max_sources = req.max_sources.unwrap_or(DEFAULT_MAX_SOURCES);
    let config = config_for(req, None, max_sources, 0)?;
    if let Some(policies) = &req.policies {
        PolicyTable::validate(policies, (config.prefix_v4, config.prefix_v6))?;
    }
    check_shape(&req.at, hook, &config, req.policies.as_deref())?;
    let result = attach_new(req, &config, hook);
    if result.is_err() {
        // Best effort: the original error is the one worth reporting.
        let _ = req.at.remove_pins();
    }
    result
}

/// Whether the attachment's pinned link still holds the program on an interface (an XDP
/// or TCX link reports ifindex 0 once its interface is gone). A clsact filter has no
/// link: it is live while its interface is there (the filter goes with the interface).
pub fn is_live(at: &Attachment) -> bool {
    if at.link().exists() {
        return link::xdp_link_ifindex(&at.link()).is_ok_and(|ifindex| ifindex != 0);
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

/// Refuses a request to change what cannot change on an attachment (`current`, with
/// per-source maps of `cap` keys): the map size, the XDP mode and the keys.
pub(crate) fn check_unchangeable(
    req: &AttachRequest,
    current: &Config,
    cap: u32,
) -> Result<(), AttachError> {
    if let Some(asked) = req.max_sources.filter(|&asked| asked != cap) {
        return Err(setting(
            Setting::MaxSources,
            format!(
                "{asked} differs from the {cap} of the attached map; detach first to resize it"
            ),
        ));
    }
    let hook = Hook::of_mode(current.xdp_mode);
    if let Some(asked) = req.hook.filter(|&h| h != hook) {
        return Err(setting(
            Setting::Hook,
            format!(
                "{} differs from the attached {}; detach first to change it",
                asked.name(),
                hook.name()
            ),
        ));
    }
    if !req.tc_mode.accepts(current.xdp_mode)
        || (hook == Hook::Xdp && req.tc_mode != TcAttachMode::Auto)
    {
        return Err(setting(
            Setting::TcMode,
            format!(
                "{} differs from the attached {}; detach first to change it",
                req.tc_mode.name(),
                mode_name(current.xdp_mode)
            ),
        ));
    }
    let asked = match req.xdp_mode {
        XdpAttachMode::Auto => None,
        XdpAttachMode::Native => Some(XDP_MODE_NATIVE),
        XdpAttachMode::Skb => Some(XDP_MODE_SKB),
    };
    if let Some(asked) = asked.filter(|&m| m != current.xdp_mode) {
        return Err(setting(
            Setting::XdpMode,
            format!(
                "{} differs from the attached {} mode; detach first to change it",
                mode_name(asked),
                mode_name(current.xdp_mode)
            ),
        ));
    }
    check_same_keys(req, current)
}

fn update(req: &AttachRequest) -> Result<Attached, AttachError> {
    let current = maps::read_config(&req.at)?;
    let cap = maps::sources_capacity(&req.at)?;
    check_unchangeable(req, &current, cap)?;
    // The limit, mode and admission change: the keys stay as attached.
    let config = config_for(req, Some(&current), cap, current.xdp_mode)?;
    let mut table = PolicyTable::open(&req.at)?;
    if let Some(policies) = &req.policies {
        PolicyTable::validate(policies, (config.prefix_v4, config.prefix_v6))?;
    }
    check_shape(
        &req.at,
        Hook::of_mode(current.xdp_mode),
        &config,
        req.policies.as_deref(),
    )?;
    table.set_config(&config)?;
    crate::crash::point("update-config");
    if let Some(policies) = &req.policies
        && let Err(e) = table.replace_all(policies)
    {
        // replace_all has undone its own steps; put the settings back too.
        let _ = table.set_config(&current);
        return Err(e.into());
    }
    Ok(Attached::Updated {
        xdp_mode: current.xdp_mode,
    })
}

fn pin_err<E: std::error::Error + Send + Sync + 'static>(
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

/// Loads the object with each per-source map (IPv4, IPv6) sized as asked, on a kernel
/// that has what the program needs.
pub fn load(max_sources: u32) -> Result<Ebpf, AttachError> {
    kernel::check()?;
    EbpfLoader::new()
        .map_max_entries(MAP_SOURCES, max_sources)
        .map_max_entries(MAP_SOURCES6, max_sources)
        .load(EBPF_OBJECT)
        .map_err(|e| AttachError::Load(Box::new(e)))
}

/// The XDP program of a loaded object, loaded into the kernel.
pub fn xdp_program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp, AttachError> {
    let load_err = |e: Box<dyn std::error::Error + Send + Sync>| AttachError::Load(e);
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or_else(|| load_err(format!("program {name} missing from the object").into()))?
        .try_into()
        .map_err(|e| load_err(Box::new(e)))?;
    prog.load().map_err(|e| load_err(kernel::load_error(e)))?;
    Ok(prog)
}

/// The tc classifier of a loaded object, loaded into the kernel.
pub fn tc_program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, AttachError> {
    let load_err = |e: Box<dyn std::error::Error + Send + Sync>| AttachError::Load(e);
    let prog: &mut SchedClassifier = ebpf
        .program_mut(PROG_TC)
        .ok_or_else(|| load_err(format!("program {PROG_TC} missing from the object").into()))?
        .try_into()
        .map_err(|e| load_err(Box::new(e)))?;
    prog.load().map_err(|e| load_err(kernel::load_error(e)))?;
    Ok(prog)
}

/// Writes `config` into a freshly loaded object's policy map.
pub fn configure(ebpf: &mut Ebpf, config: &Config) -> Result<(), AttachError> {
    let map = ebpf
        .map_mut(MAP_CONFIG)
        .ok_or_else(|| AttachError::Load(format!("map {MAP_CONFIG} missing").into()))?;
    let mut array: Array<&mut MapData, Config> =
        Array::try_from(map).map_err(|e| AttachError::Load(Box::new(e)))?;
    array
        .set(0, config, 0)
        .map_err(|e| AttachError::Load(Box::new(e)))
}

/// Records this build's layout version in a freshly loaded object's version map.
pub(crate) fn write_layout_version(ebpf: &mut Ebpf) -> Result<(), AttachError> {
    let map = ebpf
        .map_mut(MAP_LAYOUT)
        .ok_or_else(|| AttachError::Load(format!("map {MAP_LAYOUT} missing").into()))?;
    let mut array: Array<&mut MapData, u32> =
        Array::try_from(map).map_err(|e| AttachError::Load(Box::new(e)))?;
    array
        .set(0, LAYOUT_VERSION, 0)
        .map_err(|e| AttachError::Load(Box::new(e)))
}

/// Loads, configures with `config` (its mode recorded once known), pins and attaches.
fn attach_new(req: &AttachRequest, config: &Config, hook: Hook) -> Result<Attached, AttachError> {
    let at = &req.at;
    let mut ebpf = load(req.max_sources.unwrap_or(DEFAULT_MAX_SOURCES))?;

    std::fs::create_dir_all(at.dir()).map_err(pin_err("the pin directory", &at.dir()))?;
    for m in layout::current().maps {
        let path = at.dir().join(m.pin);
        let map = ebpf
            .map(m.name)
            .ok_or_else(|| AttachError::Load(format!("map {} missing", m.name).into()))?;
        map.pin(&path).map_err(pin_err("a map", &path))?;
    }
    crate::crash::point("attach-pinned");
    // Before anything opens the pins, which checks their layout.
    write_layout_version(&mut ebpf)?;

    // The policy is in place before the program can see a packet. The mode is known only
    // after attaching (auto may fall back to skb); it is recorded below, for `status`.
    configure(&mut ebpf, config)?;
    if let Some(policies) = &req.policies {
        PolicyTable::open(at)?.replace_all(policies)?;
    }

    if hook == Hook::Tc {
        tc_program(&mut ebpf)?;
        let record = |xdp_mode| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            // Through the pin, keeping the generation the policies were written under.
            PolicyTable::open(at)?.set_config(&Config {
                xdp_mode,
                ..*config
            })?;
            Ok(())
        };
        let xdp_mode = tc::attach(&mut ebpf, at, req.tc_mode, record)?;
        crate::crash::point("attach-attached");
        crate::crash::point("attach-linked");
        return Ok(Attached::New { xdp_mode });
    }
    let iface = at.iface.as_str();
    let prog = xdp_program(&mut ebpf, PROG_XDP)?;
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
    let link = prog
        .take_link(link_id)
        .map_err(|e| AttachError::Load(Box::new(e)))?;
    // Through the pin, keeping the generation the policies were written under.
    PolicyTable::open(at)?.set_config(&Config {
        xdp_mode,
        ..*config
    })?;
    let link: FdLink = link.try_into().map_err(|e: LinkError| {
        AttachError::Load(format!("XDP was attached without a bpf_link: {e}").into())
    })?;
    link.pin(at.link())
        .map_err(pin_err("the link", &at.link()))?;
    crate::crash::point("attach-linked");
    Ok(Attached::New { xdp_mode })
}

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
}

/// Detaches shaper and removes every pin. Works even if the interface is gone.
pub fn detach(at: &Attachment) -> Result<(), DetachError> {
    if !at.dir().exists() {
        return Err(DetachError::NotAttached(at.label()));
    }
    if at.tc_prog().exists() {
        let mode = maps::read_config(at).map_or(TC_MODE_CLSACT, |c| c.xdp_mode);
        detach_tc(at, mode).map_err(|source| DetachError::Tc {
            label: at.label(),
            source,
        })?;
    }
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
                .map_err(|e| AttachError::Load(format!("{}: {e}", path.display()).into()))
        })
        .collect()
}

/// Loads and verifies the XDP program over the pinned maps of `at`, which must be an
/// XDP attachment of this shaper's layout (live or not).
pub fn standby(at: &Attachment) -> Result<Standby, AttachError> {
    upgrade::require_current(at).map_err(AttachError::from)?;
    let config = maps::read_config(at)?;
    if !matches!(config.xdp_mode, XDP_MODE_NATIVE | XDP_MODE_SKB) {
        return Err(AttachError::Load(
            format!("{} is not an XDP attachment", at.label()).into(),
        ));
    }
    // Every pin must be there: the loader would make and pin a map that is not.
    let map_ids = pinned_map_ids(at)?;
    let capacity = maps::sources_capacity(at)?;
    kernel::check()?;
    let mut load = EbpfLoader::new();
    load.map_max_entries(MAP_SOURCES, capacity)
        .map_max_entries(MAP_SOURCES6, capacity);
    for m in layout::current().maps {
        load.map_pin_path(m.name, at.dir().join(m.pin));
    }
    let mut ebpf = load
        .load(EBPF_OBJECT)
        .map_err(|e| AttachError::Load(Box::new(e)))?;
    xdp_program(&mut ebpf, PROG_XDP)?;
    if pinned_map_ids(at)? != map_ids {
        return Err(AttachError::Load(
            format!("the pins of {} changed while loading", at.label()).into(),
        ));
    }
    Ok(Standby { ebpf, map_ids })
}

/// Links `standby`'s program to the interface of `at` again, over the same pins, if the
/// interface is back and the pins are still those the program was loaded over; returns
/// whether it did (false: nothing done, attach the usual way). The attachment keeps its
/// maps: sources, policies and counters go on from where they were. The caller holds the
/// lock, and applies the settings it wants afterwards (an update in place).
pub fn relink(at: &Attachment, standby: &mut Standby) -> Result<bool, AttachError> {
    if !at.exists() || is_live(at) || system::ifindex(&at.iface).is_err() {
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
        .ok_or_else(|| AttachError::Load(format!("program {PROG_XDP} missing").into()))?
        .try_into()
        .map_err(|e| AttachError::Load(Box::new(e)))?;
    let link_id = prog
        .attach(iface, mode)
        .map_err(|source| AttachError::Attach {
            iface: iface.to_owned(),
            source,
        })?;
    let link: FdLink = prog
        .take_link(link_id)
        .map_err(|e| AttachError::Load(Box::new(e)))?
        .try_into()
        .map_err(|e: LinkError| {
            AttachError::Load(format!("XDP was attached without a bpf_link: {e}").into())
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
