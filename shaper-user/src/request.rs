//! What `attach` is asked to do, and every check of it that needs no change: the hook and
//! modes, the keys, the settings entry a request makes on a new attachment or over an
//! existing one, and where shaping can work.
//!
//! Each check refuses one setting in one line, named as the file names it
//! ([`Setting`]); the command line names the flag instead.

use shaper_common::sources::{source_buckets, source_room};
use shaper_common::{
    config::{ConfigError, Meter2Limits, RateLimit},
    maps::{
        Admission, Config, DEFAULT_MAX_SOURCES, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, KEY_BY_DST,
        KEY_BY_SRC, MAX_POLICIES, MAX_SUBSCRIBERS, MODE_ENFORCE, MODE_SHAPE, Meter2, Shape,
        TC_MODE_CLSACT, TC_MODE_CLSACT_OWN, TC_MODE_TCX, XDP_MODE_NATIVE, XDP_MODE_SKB, is_tc_mode,
    },
};

use crate::{
    pins::{Attachment, Direction},
    policy::{Mode, PolicySet, PolicySpec},
    setting::Setting,
    system,
    tc::{self, TcAttachMode},
};

/// How to attach the XDP program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum XdpAttachMode {
    /// Native if the driver supports it, otherwise generic (skb).
    #[default]
    Auto,
    /// In the driver; fails if the driver has no XDP support.
    Native,
    /// Generic XDP in the network stack; works on every interface, costs more.
    Skb,
}

/// Where the program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Hook {
    /// XDP, before the network stack: ingress only.
    Xdp,
    /// tc, on socket buffers: either direction (after GRO on ingress).
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

/// Which address of a frame picks its bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
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

/// What `attach` is asked to do. For each `Option`, `None` means the default for a new
/// attachment, and whatever it is for an existing one.
#[derive(Clone, Debug)]
pub struct AttachRequest {
    pub at: Attachment,
    /// Per source, the default policy's.
    pub rate: RateLimit,
    /// The default policy's second meter (excess rate, packet rate); all zero for none.
    /// Like `rate`, what the request asks for replaces what is attached.
    pub meter2: Meter2Limits,
    /// `None`: XDP for a new ingress attachment, tc for egress; as it is on an existing one.
    pub hook: Option<Hook>,
    pub xdp_mode: XdpAttachMode,
    pub tc_mode: TcAttachMode,
    /// Keys each per-source table has room for; with `growing`, the most they grow to.
    pub max_sources: Option<u32>,
    /// `max_sources` is a ceiling (`shaper run`'s): a new attachment's tables start at
    /// [`crate::grow::initial_sources`] of it and grow with use ([`crate::grow`]), and an
    /// existing one's are left at their size (the grower's to grow), never made to match.
    pub growing: bool,
    /// Subscribers the attachment has room for (`--max-subscribers`); fixed once attached.
    pub max_subscribers: Option<u32>,
    /// Prefix policies and plans the attachment has room for (`--max-policies`); fixed
    /// once attached.
    pub max_policies: Option<u32>,
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
    pub policies: Option<PolicySet>,
    /// `Some`: set these subscribers in the same change (`apply`: a configuration file's);
    /// `None`: leave the subscribers as they are. `attach` itself ignores it.
    pub subscribers: Option<SubscriberRequest>,
}

impl AttachRequest {
    /// The request for `at` without its subscribers (what `attach` takes: it ignores them),
    /// made without copying them (a million of a file's).
    pub fn for_attach(&self, at: Attachment) -> Self {
        // Every other field is Copy.
        Self {
            at,
            policies: self.policies.clone(),
            subscribers: None,
            ..*self
        }
    }
}

/// The subscribers a configuration file gives an interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscriberRequest {
    pub specs: Vec<crate::subscriber::SubscriberSpec>,
    /// Remove the subscribers not in `specs` (`prune_subscribers = true`); otherwise those
    /// set by `subscriber set` or `import` stay.
    pub prune: bool,
    /// Its `[interface.libreqos]` file: its circuits are `specs` after the others once
    /// read ([`crate::rows::CsvFile::rows`]), not in `specs` while not.
    pub csv: Option<crate::rows::CsvFile>,
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

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// One setting cannot be as asked: named as the file names it ([`Setting`]); the
    /// command line names the flag instead.
    #[error("{setting} {problem}")]
    Setting { setting: Setting, problem: String },
    #[error(
        "--mode shape needs sch_fq on '{iface}' to hold packets until their departure time, and its root qdisc is {found}: set it up with `{tc} qdisc replace dev {iface} root fq`"
    )]
    NoFq {
        iface: String,
        found: String,
        tc: String,
    },
}

fn setting(setting: Setting, problem: impl Into<String>) -> RequestError {
    RequestError::Setting {
        setting,
        problem: problem.into(),
    }
}

/// What can be checked of a request before anything is read.
pub fn check(req: &AttachRequest) -> Result<(), RequestError> {
    let sizes = [
        (Setting::MaxSources, req.max_sources),
        (Setting::MaxSubscribers, req.max_subscribers),
        (Setting::MaxPolicies, req.max_policies),
    ];
    for (which, n) in sizes {
        if let Some(problem) = n.and_then(|n| size_problem(which, n)) {
            return Err(setting(which, problem));
        }
    }
    Ok(())
}

/// What is wrong with `n` as the size `which` (one of the `max_*` settings), if anything:
/// the one range each has, whether it comes from a flag or a file.
pub fn size_problem(which: Setting, n: u32) -> Option<String> {
    let (least, most) = match which {
        Setting::MaxSources => (1, u32::MAX),
        Setting::MaxSubscribers => (0, MAX_SUBSCRIBERS),
        Setting::MaxPolicies => (1, MAX_POLICIES - 1),
        _ => return None,
    };
    match n {
        n if (least..=most).contains(&n) => None,
        n if most == u32::MAX => Some(format!("{n}: must be at least {least}")),
        n if least == 0 => Some(format!("{n}: at most {most}")),
        n => Some(format!("{n}: must be {least} to {most}")),
    }
}

/// Refuses a request for another size of `which` (one of the `max_*` settings) than
/// `room`, the attached maps' own: the maps are sized when they are made.
pub fn check_room(which: Setting, asked: Option<u32>, room: u32) -> Result<(), RequestError> {
    if let Some(asked) = asked.filter(|&asked| asked != room) {
        return Err(setting(
            which,
            format!(
                "{asked} differs from the {room} of the attached maps; detach first to resize them"
            ),
        ));
    }
    Ok(())
}

/// A request for a new attachment, checked: its hook, and its settings entry (the mode
/// left for attach to record once known).
pub fn check_new(req: &AttachRequest) -> Result<(Hook, Config), RequestError> {
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
    Ok((hook, config_for(req, None, max_sources, 0)?))
}

/// A request over an existing attachment whose settings are `current` and per-source
/// maps hold `cap` keys, checked: the settings entry it asks for, keyed as attached,
/// with what it leaves out as it is. Refused if it asks to change what cannot change.
/// A bigger `--max-sources` passes: see [`grows`].
pub fn check_over(req: &AttachRequest, current: &Config, cap: u32) -> Result<Config, RequestError> {
    check_unchangeable(req, current, cap)?;
    // The default admission is a table's worth: of the tables asked for (the ceiling of
    // growing ones, as a new attachment's), else of those attached.
    let table = if req.growing {
        req.max_sources.unwrap_or(DEFAULT_MAX_SOURCES)
    } else {
        grows(req, cap).unwrap_or(cap)
    };
    config_for(req, Some(current), table, current.xdp_mode)
}

/// The `--max-sources` `req` asks for if its tables are bigger than the attached ones of
/// room for `cap` keys: they grow in place (`upgrade::grow_sources`).
pub fn grows(req: &AttachRequest, cap: u32) -> Option<u32> {
    req.max_sources
        .filter(|&n| !req.growing && source_room(source_buckets(n)) > cap)
}

/// The hook of a request for a new attachment: as asked, or by direction.
fn hook_for(req: &AttachRequest) -> Result<Hook, RequestError> {
    match (req.at.direction, req.hook) {
        (Direction::Egress, Some(Hook::Xdp)) => Err(setting(
            Setting::Hook,
            "xdp: XDP sees received frames only; egress needs tc",
        )),
        (Direction::Egress, _) => Ok(Hook::Tc),
        (Direction::Ingress, hook) => Ok(hook.unwrap_or(Hook::Xdp)),
    }
}

/// The settings entry for `req`: on a new attachment (`current` none) keyed as `req`
/// asks or by default, on an existing one keyed as it is, with what `req` leaves out as
/// it is. Every settings entry is made here.
fn config_for(
    req: &AttachRequest,
    current: Option<&Config>,
    max_sources: u32,
    xdp_mode: u32,
) -> Result<Config, RequestError> {
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
    let mode = req
        .mode
        .map_or(current.map_or(MODE_ENFORCE, |c| c.mode), Mode::value);
    let meter2 = meter2_for(&req.meter2)?;
    if mode == MODE_SHAPE && meter2.any() {
        return Err(setting(
            Setting::Mode,
            "shape: with an excess rate or a packet rate is not supported (they police: mark or drop)",
        ));
    }
    Ok(Config {
        shape,
        mode,
        meter2,
        admission: req
            .admission
            .resolve(max_sources, current.map(|c| c.admission)),
        // Kept for the life of the attachment: a new seed would lose every trace.
        trace_seed: current.map_or_else(system::random_seed, |c| c.trace_seed),
        ..config
    })
}

/// The default policy's second meter as `m` asks, checked; an error names the setting.
fn meter2_for(m: &Meter2Limits) -> Result<Meter2, RequestError> {
    Meter2::new(m).map_err(|e| {
        let s = match e {
            ConfigError::Excess(l) => {
                if l.field() == "rate" {
                    Setting::ExcessRate
                } else {
                    Setting::ExcessBurst
                }
            }
            ConfigError::ExcessIncomplete => {
                if m.excess_rate_bps == 0 {
                    Setting::ExcessRate
                } else {
                    Setting::ExcessBurst
                }
            }
            ConfigError::ExcessDscp(_) => Setting::ExcessDscp,
            ConfigError::PacketRate(l) if l.field() != "rate" => Setting::PacketBurst,
            ConfigError::PacketRateIncomplete if m.packet_rate != 0 => Setting::PacketBurst,
            _ => Setting::PacketRate,
        };
        setting(s, e.to_string())
    })
}

/// Refuses shape mode (of the interface, `config`, or of one of `policies`) where it
/// cannot work: anywhere but tc egress, and on a device whose packets sch_fq does not
/// hold (the departure time would be ignored). One line that says how to set fq up.
pub fn check_shape<'a>(
    at: &Attachment,
    hook: Hook,
    config: &Config,
    mut policies: impl Iterator<Item = &'a PolicySpec>,
) -> Result<(), RequestError> {
    let shaping = config.mode == MODE_SHAPE || policies.any(|p| p.mode() == Mode::Shape);
    check_shaping(at, hook, shaping)
}

/// Refuses the plans of `subscribers` where one shapes and shaping cannot work on `at`
/// (as [`check_shape`]).
pub fn check_subscribers_shape<'a>(
    at: &Attachment,
    hook: Hook,
    mut subscribers: impl Iterator<Item = &'a crate::subscriber::SubscriberSpec>,
) -> Result<(), RequestError> {
    check_shaping(at, hook, subscribers.any(|s| s.plan.mode == MODE_SHAPE))
}

/// [`check_shape`] of something that shapes (`shaping`), or nothing.
pub fn check_shaping(at: &Attachment, hook: Hook, shaping: bool) -> Result<(), RequestError> {
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
fn fq_present(at: &Attachment) -> Result<(), RequestError> {
    let ifindex = system::ifindex(&at.iface).map_err(|e| setting(Setting::Mode, e.to_string()))?;
    match tc::check_fq(ifindex) {
        Ok(tc::FqCheck::Fq) => Ok(()),
        Ok(tc::FqCheck::Other(kind)) => Err(RequestError::NoFq {
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
fn check_same_keys(req: &AttachRequest, current: &Config) -> Result<(), RequestError> {
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

/// Refuses a request to change what cannot change on an attachment (`current`, with
/// per-source maps of `cap` keys): a smaller map size, the hook, the modes and the keys.
fn check_unchangeable(req: &AttachRequest, current: &Config, cap: u32) -> Result<(), RequestError> {
    // The tables have room for whole buckets: any size that rounds to theirs is theirs; a
    // bigger one grows them in place (`upgrade::grow_sources`), a smaller one is refused.
    if let Some(n) = req
        .max_sources
        .filter(|&n| source_room(source_buckets(n)) < cap)
    {
        return Err(setting(
            Setting::MaxSources,
            format!(
                "{n} is less than the {cap} of the attached tables, which grow in place but never shrink; detach first to make them smaller"
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
