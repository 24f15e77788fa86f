//! Reading a configuration file into the requests `apply` makes, every value checked,
//! every error pointing at its line and field. The settings are the library's own types
//! (serde reads their names); what `attach` takes from flags, the file gives as fields.

use std::{collections::BTreeMap, ops::Range, path::Path, rc::Rc};

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use ipnet::IpNet;
use serde::Deserialize;
use shaper_common::{
    config::{ConfigError, Meter2Limits, PolicyLimits, RateLimit},
    dscp::Dscp,
    maps::{
        DEFAULT_ECN_THRESHOLD_NS, DEFAULT_HORIZON_NS, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6, Meter2,
    },
};
use toml::{Spanned, Value};

use crate::rows::{CsvFile, MAX_CSV_BYTES, RowDigests};
use crate::{
    admission::{self, KeysPerSec, NewSourcesError},
    import, libreqos,
    pins::{Attachment, Direction},
    policy::{Action, CheckedPolicy, Mode, PolicyError, PolicySet, PolicySpec, parse_prefix},
    request::{
        self, AdmissionRequest, AttachRequest, Hook, KeyBy, SubscriberRequest, XdpAttachMode,
    },
    setting::Setting,
    subscriber::{self, SubscriberError, SubscriberSpec, plan::PlanParts},
    tc::TcAttachMode,
    units::{Delay, Packets, Rate, Size, UnitError},
};

/// An error in a configuration file: `FILE:LINE: FIELD: what is wrong`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct FileError {
    pub file: String,
    pub line: usize,
    /// `interface[0].policy[2].rate`, or the table or key the parser stopped at.
    pub field: String,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModel {
    #[serde(default, rename = "interface")]
    interfaces: Vec<InterfaceModel>,
    /// `shaper run`'s RADIUS listener: read by `super::radius`, not here.
    #[serde(default, rename = "radius")]
    _radius: Option<Value>,
    /// `[plan.NAME]`: plans subscribers name.
    #[serde(default, rename = "plan")]
    plans: BTreeMap<String, PlanModel>,
}

/// The fields of a plan, in a `[plan.NAME]` table or inline in a subscriber's: as
/// `subscriber set`'s flags.
macro_rules! plan_fields {
    ($(#[$m:meta])* struct $name:ident { $($extra:tt)* }) => {
        $(#[$m])*
        struct $name {
            $($extra)*
            #[serde(default)]
            rate: Option<Spanned<String>>,
            #[serde(default)]
            burst: Option<Spanned<String>>,
            #[serde(default)]
            per_address_rate: Option<Spanned<String>>,
            #[serde(default)]
            per_address_burst: Option<Spanned<String>>,
            #[serde(default)]
            excess_rate: Option<Spanned<Rate>>,
            #[serde(default)]
            excess_burst: Option<Spanned<Size>>,
            #[serde(default)]
            excess_dscp: Option<Spanned<Dscp>>,
            #[serde(default)]
            packet_rate: Option<Spanned<Packets>>,
            #[serde(default)]
            packet_burst: Option<Spanned<Packets>>,
            #[serde(default)]
            mode: Option<Spanned<Mode>>,
        }
    };
}

plan_fields! {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PlanModel {}
}

plan_fields! {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SubscriberModel {
        id: Spanned<String>,
        #[serde(default)]
        name: Option<Spanned<String>>,
        prefixes: Spanned<Vec<Spanned<String>>>,
        /// A `[plan.NAME]`'s name; otherwise the plan's fields are given inline.
        #[serde(default)]
        plan: Option<Spanned<String>>,
    }
}

/// `[interface.libreqos]`: a LibreQoS `ShapedDevices.csv` whose circuits are subscribers,
/// with `subscriber import`'s options.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LibreqosModel {
    /// Relative to the configuration file's directory.
    file: Spanned<String>,
    #[serde(default)]
    committed_from_min: bool,
    #[serde(default)]
    excess_dscp: Option<Spanned<Dscp>>,
    #[serde(default)]
    burst_time: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InterfaceModel {
    name: Spanned<String>,
    #[serde(default)]
    direction: Option<Direction>,
    #[serde(default)]
    hook: Option<Hook>,
    #[serde(default)]
    tc_mode: Option<TcAttachMode>,
    rate: Spanned<String>,
    burst: Spanned<String>,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    ecn_threshold: Option<Spanned<String>>,
    #[serde(default)]
    horizon: Option<Spanned<String>>,
    #[serde(default)]
    key: Option<KeyBy>,
    #[serde(default)]
    prefix_v4: Option<Spanned<u32>>,
    #[serde(default)]
    prefix_v6: Option<Spanned<u32>>,
    #[serde(default)]
    xdp_mode: Option<XdpAttachMode>,
    #[serde(default)]
    max_sources: Option<Spanned<u32>>,
    #[serde(default)]
    new_sources: Option<Spanned<Value>>,
    #[serde(default)]
    new_sources_burst: Option<Spanned<u64>>,
    #[serde(default)]
    excess_rate: Option<Spanned<Rate>>,
    #[serde(default)]
    excess_burst: Option<Spanned<Size>>,
    #[serde(default)]
    excess_dscp: Option<Spanned<Dscp>>,
    #[serde(default)]
    packet_rate: Option<Spanned<Packets>>,
    #[serde(default)]
    packet_burst: Option<Spanned<Packets>>,
    #[serde(default, rename = "policy")]
    policies: Vec<PolicyModel>,
    #[serde(default)]
    max_subscribers: Option<Spanned<u32>>,
    #[serde(default)]
    max_policies: Option<Spanned<u32>>,
    /// Remove the subscribers the file does not give (default: keep them).
    #[serde(default)]
    prune_subscribers: bool,
    #[serde(default, rename = "subscriber")]
    subscribers: Vec<SubscriberModel>,
    #[serde(default)]
    libreqos: Option<LibreqosModel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyModel {
    prefix: Spanned<String>,
    #[serde(default)]
    action: Option<Action>,
    #[serde(default)]
    rate: Option<Spanned<String>>,
    #[serde(default)]
    burst: Option<Spanned<String>>,
    #[serde(default)]
    aggregate_rate: Option<Spanned<String>>,
    #[serde(default)]
    aggregate_burst: Option<Spanned<String>>,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    new_sources: Option<Spanned<Value>>,
    #[serde(default)]
    new_sources_burst: Option<Spanned<u64>>,
    #[serde(default)]
    excess_rate: Option<Spanned<Rate>>,
    #[serde(default)]
    excess_burst: Option<Spanned<Size>>,
    #[serde(default)]
    excess_dscp: Option<Spanned<Dscp>>,
    #[serde(default)]
    packet_rate: Option<Spanned<Packets>>,
    #[serde(default)]
    packet_burst: Option<Spanned<Packets>>,
}

/// The second meter of a policy or of the interface's default one (`policy set
/// --excess-rate ...`, `shaper_common::config::Meter2Limits`), as its table gives it: each
/// field the type its flag parses. (Fields of both tables: serde's flatten would lose
/// their spans and unknown fields.)
struct SecondMeterModel {
    excess_rate: Option<Spanned<Rate>>,
    excess_burst: Option<Spanned<Size>>,
    excess_dscp: Option<Spanned<Dscp>>,
    packet_rate: Option<Spanned<Packets>>,
    packet_burst: Option<Spanned<Packets>>,
}

/// The [`SecondMeterModel`] of a table.
macro_rules! second_meter {
    ($m:expr) => {
        SecondMeterModel {
            excess_rate: $m.excess_rate.clone(),
            excess_burst: $m.excess_burst.clone(),
            excess_dscp: $m.excess_dscp.clone(),
            packet_rate: $m.packet_rate.clone(),
            packet_burst: $m.packet_burst.clone(),
        }
    };
}

impl SecondMeterModel {
    /// The fields given, by name, with their spans.
    fn given(&self) -> [(&'static str, Option<Range<usize>>); 5] {
        [
            ("excess_rate", self.excess_rate.as_ref().map(Spanned::span)),
            (
                "excess_burst",
                self.excess_burst.as_ref().map(Spanned::span),
            ),
            ("excess_dscp", self.excess_dscp.as_ref().map(Spanned::span)),
            ("packet_rate", self.packet_rate.as_ref().map(Spanned::span)),
            (
                "packet_burst",
                self.packet_burst.as_ref().map(Spanned::span),
            ),
        ]
    }

    /// The limits asked for, checked as the flags are (`excess_dscp` defaults to `le`);
    /// an error names the field at fault (`at`: the table's first field, for one left
    /// out).
    fn limits(
        &self,
        src: &Source,
        here: &str,
        at: Range<usize>,
    ) -> Result<Meter2Limits, FileError> {
        let value = |v: &Option<Spanned<Packets>>| v.as_ref().map_or(0, |n| n.get_ref().count());
        let limits = Meter2Limits {
            excess_rate_bps: self
                .excess_rate
                .as_ref()
                .map_or(0, |r| r.get_ref().bits_per_sec()),
            excess_burst_bytes: self
                .excess_burst
                .as_ref()
                .map_or(0, |b| b.get_ref().bytes()),
            excess_dscp: match (&self.excess_rate, &self.excess_dscp) {
                (None, _) => 0,
                (Some(_), None) => Dscp::LE.value(),
                (Some(_), Some(d)) => d.get_ref().value(),
            },
            packet_rate: value(&self.packet_rate),
            packet_burst: value(&self.packet_burst),
        };
        if let (None, Some(d)) = (&self.excess_rate, &self.excess_dscp) {
            return Err(src.error(d.span(), format!("{here}.excess_dscp"), "needs excess_rate"));
        }
        let Err(e) = Meter2::new(&limits) else {
            return Ok(limits);
        };
        let field = match &e {
            ConfigError::Excess(l) if l.field() == "rate" => "excess_rate",
            ConfigError::Excess(_) => "excess_burst",
            ConfigError::ExcessIncomplete if self.excess_rate.is_some() => "excess_burst",
            ConfigError::ExcessIncomplete => "excess_rate",
            ConfigError::ExcessDscp(_) => "excess_dscp",
            ConfigError::PacketRate(l) if l.field() != "rate" => "packet_burst",
            ConfigError::PacketRateIncomplete if self.packet_rate.is_some() => "packet_burst",
            _ => "packet_rate",
        };
        // At the field, or (left out) at the one it goes with, or the table.
        let partner = match field {
            "excess_rate" => "excess_burst",
            "excess_burst" => "excess_rate",
            "packet_rate" => "packet_burst",
            _ => "packet_rate",
        };
        let given = self.given();
        let span = |name: &str| {
            given
                .iter()
                .find(|(n, _)| *n == name)
                .and_then(|(_, s)| s.clone())
        };
        let span = span(field).or_else(|| span(partner)).unwrap_or(at);
        Err(src.error(span, format!("{here}.{field}"), e.to_string()))
    }
}

/// Points errors at lines of one file.
struct Source<'a> {
    file: &'a str,
    text: &'a str,
}

impl Source<'_> {
    fn line_of(&self, offset: usize) -> usize {
        let offset = offset.min(self.text.len());
        self.text[..offset].matches('\n').count() + 1
    }

    fn error(&self, span: Range<usize>, field: String, message: impl Into<String>) -> FileError {
        FileError {
            file: self.file.to_owned(),
            line: self.line_of(span.start),
            field,
            message: message.into(),
        }
    }

    /// A parser error: its span gives the line; the field is the key on that line, under
    /// the table header above it, numbered as the other errors number them
    /// (`interface[1].policy[0]`).
    fn parse_error(&self, e: &toml::de::Error) -> FileError {
        let span = e.span().unwrap_or(0..0);
        let line = self.line_of(span.start);
        let text_line = self.text.lines().nth(line - 1).unwrap_or("");
        let (mut interfaces, mut policies) = (0, 0);
        let table = self
            .text
            .lines()
            .take(line)
            .filter_map(|l| {
                let l = l.trim();
                let name = l.trim_matches(|c| c == '[' || c == ']');
                match (l.starts_with('['), name) {
                    (false, _) => None,
                    (true, "interface") => {
                        interfaces += 1;
                        policies = 0;
                        Some(format!("interface[{}]", interfaces - 1))
                    }
                    (true, "interface.policy") => {
                        policies += 1;
                        Some(format!(
                            "interface[{}].policy[{}]",
                            interfaces.max(1) - 1,
                            policies - 1
                        ))
                    }
                    // A table of the interface's other than its policies (a misspelled
                    // one): numbered as its interface is.
                    (true, name) => Some(match name.strip_prefix("interface.") {
                        Some(rest) => format!("interface[{}].{rest}", interfaces.max(1) - 1),
                        None => name.to_owned(),
                    }),
                }
            })
            .last();
        let key = text_line
            .split_once('=')
            .map(|(k, _)| k.trim().to_owned())
            .filter(|k| !k.is_empty() && !k.starts_with('['));
        let field = match (table, key) {
            (Some(t), Some(k)) => format!("{t}.{k}"),
            (Some(t), None) => t,
            (None, Some(k)) => k,
            (None, None) => "(file)".to_owned(),
        };
        FileError {
            file: self.file.to_owned(),
            line,
            field,
            message: e.message().trim().replace('\n', " "),
        }
    }
}

/// Reads the file text `text` (named `file` in errors) into what it asks of each
/// interface it names: the request `attach` takes, the file being the whole truth (what
/// it leaves out is the default, and its policies are all the interface has). An
/// interface that names no direction is for `direction`; each request is for the
/// namespace the command runs in (`apply` names it).
pub fn parse(
    file: &str,
    text: &str,
    direction: Direction,
) -> Result<Vec<AttachRequest>, FileError> {
    parse_file(file, text, direction).map(|p| p.interfaces)
}

/// A configuration file read: the requests of its interfaces, and its named plans.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub interfaces: Vec<AttachRequest>,
    plans: BTreeMap<String, PolicyLimits>,
}

impl Parsed {
    /// The file's `[plan.NAME]` tables by name, each checked as a subscriber's plan
    /// (`aggregate_*` the subscriber's rate and burst, `rate_bps` and `burst_bytes` each
    /// address's): what a subscriber's `plan = "NAME"` (or a RADIUS Filter-Id) names.
    pub fn plans(&self) -> &BTreeMap<String, PolicyLimits> {
        &self.plans
    }
}

/// The file's `[plan.NAME]` tables alone, checked as [`parse_file`] checks them (for the
/// RADIUS listener's `Filter-Id`; no interface is read, nor any LibreQoS file).
pub fn parse_plans(file: &str, text: &str) -> Result<BTreeMap<String, PolicyLimits>, FileError> {
    let src = Source { file, text };
    let model: FileModel = toml::from_str(text).map_err(|e| src.parse_error(&e))?;
    named_plans(&src, &model.plans)
}

fn named_plans(
    src: &Source,
    plans: &BTreeMap<String, PlanModel>,
) -> Result<BTreeMap<String, PolicyLimits>, FileError> {
    plans
        .iter()
        .map(|(name, m)| {
            let here = format!("plan.{name}");
            let first = m.rate.as_ref().or(m.burst.as_ref()).map(Spanned::span);
            let at = first.unwrap_or_else(|| plan_table_span(src.text, name));
            if !plan_name_ok(name) {
                let why = "a plan's name is 1 to 32 letters, digits and . _ -";
                return Err(src.error(at, here, why));
            }
            Ok((name.clone(), plan_limits(src, m.fields(), &here, at)?))
        })
        .collect()
}

/// [`parse`], with the file's named plans ([`Parsed::plans`]).
pub fn parse_file(file: &str, text: &str, direction: Direction) -> Result<Parsed, FileError> {
    parse_file_with(file, text, direction, false)
}

/// [`parse`], but an `[interface.libreqos]` file is not read ([`CsvFile::rows`] is
/// `None`): what `apply` takes first, reading only the rows that changed since its last
/// apply if it can ([`crate::rows`]), and the file whole through [`parse`] otherwise.
pub fn parse_deferring(
    file: &str,
    text: &str,
    direction: Direction,
) -> Result<Vec<AttachRequest>, FileError> {
    parse_file_with(file, text, direction, true).map(|p| p.interfaces)
}

fn parse_file_with(
    file: &str,
    text: &str,
    direction: Direction,
    defer: bool,
) -> Result<Parsed, FileError> {
    let src = Source { file, text };
    let model: FileModel = toml::from_str(text).map_err(|e| src.parse_error(&e))?;
    if model.interfaces.is_empty() {
        return Err(src.error(0..0, "interface".into(), "no [[interface]] in the file"));
    }
    let plans = named_plans(&src, &model.plans)?;
    let mut out: Vec<AttachRequest> = Vec::new();
    for (i, m) in model.interfaces.into_iter().enumerate() {
        let here = format!("interface[{i}]");
        let at = Attachment::toward(m.name.get_ref(), None, m.direction.unwrap_or(direction));
        if let Err(e) = crate::pins::check_iface_name(&at.iface) {
            return Err(src.error(m.name.span(), format!("{here}.name"), e.to_string()));
        }
        if out.iter().any(|r| r.at == at) {
            return Err(src.error(
                m.name.span(),
                format!("{here}.name"),
                format!(
                    "interface '{}' is listed twice for {}",
                    at.iface,
                    at.direction.name()
                ),
            ));
        }
        let rate = RateLimit::new(
            rate(&src, &m.rate, format!("{here}.rate"))?.bits_per_sec(),
            size(&src, &m.burst, format!("{here}.burst"))?.bytes(),
        )
        .map_err(|e| {
            let span = match e.field() {
                "rate" => m.rate.span(),
                _ => m.burst.span(),
            };
            src.error(span, format!("{here}.{}", e.field()), e.to_string())
        })?;
        let prefix_v4 = bounded(&src, &m.prefix_v4, 32, format!("{here}.prefix_v4"))?;
        let prefix_v6 = bounded(&src, &m.prefix_v6, 128, format!("{here}.prefix_v6"))?;
        let sizes = [
            (Setting::MaxSources, &m.max_sources),
            (Setting::MaxSubscribers, &m.max_subscribers),
            (Setting::MaxPolicies, &m.max_policies),
        ];
        for (which, n) in sizes {
            let Some(n) = n else { continue };
            if let Some(problem) = request::size_problem(which, *n.get_ref()) {
                return Err(src.error(n.span(), format!("{here}.{which}"), problem));
            }
        }
        let given = NewSources::of(&src, &m.new_sources, &m.new_sources_burst, &here)?;
        let admission = admission::of_interface(given.n, given.burst)
            .map_err(|e| given.error(&src, &m.name, e))?;
        let meter2 = second_meter!(m).limits(&src, &here, m.name.span())?;
        let policies = m
            .policies
            .iter()
            .enumerate()
            .map(|(j, p)| policy(&src, p, &format!("{here}.policy[{j}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = (
            prefix_v4.unwrap_or(DEFAULT_PREFIX_V4),
            prefix_v6.unwrap_or(DEFAULT_PREFIX_V6),
        );
        let prefixes: Vec<_> = policies.iter().map(|p| p.spec().prefix).collect();
        let policy_prefixes: Vec<_> = prefixes
            .iter()
            .zip(&m.policies)
            .enumerate()
            .map(|(j, (p, pm))| (*p, pm.prefix.span(), format!("{here}.policy[{j}].prefix")))
            .collect();
        // As a set (duplicates, prefixes longer than the keys), the way every change is.
        let policies = PolicySet::new(policies, keys).map_err(|e| {
            let prefix = match &e {
                PolicyError::LongerThanKey { prefix, .. } | PolicyError::Duplicate { prefix } => {
                    Some(*prefix)
                }
                _ => None,
            };
            // The offending entry: a duplicate's second listing, otherwise the first.
            let at = prefix.and_then(|prefix| {
                let mut same = prefixes.iter().enumerate().filter(|(_, p)| **p == prefix);
                let first = same.next().map(|(j, _)| j);
                let second = same.next().map(|(j, _)| j);
                second.or(first)
            });
            match at {
                Some(j) => src.error(
                    m.policies[j].prefix.span(),
                    format!("{here}.policy[{j}].prefix"),
                    e.to_string(),
                ),
                None => src.error(m.name.span(), format!("{here}.policy"), e.to_string()),
            }
        })?;
        out.push(AttachRequest {
            at,
            rate,
            hook: m.hook,
            xdp_mode: m.xdp_mode.unwrap_or_default(),
            tc_mode: m.tc_mode.unwrap_or_default(),
            max_sources: m.max_sources.as_ref().map(|n| *n.get_ref()),
            growing: false,
            key: m.key,
            prefix_v4,
            prefix_v6,
            mode: Some(m.mode.unwrap_or_default()),
            ecn_threshold_ns: Some(
                delay(
                    &src,
                    m.ecn_threshold.as_ref(),
                    format!("{here}.ecn_threshold"),
                )?
                .unwrap_or(DEFAULT_ECN_THRESHOLD_NS),
            ),
            horizon_ns: Some(
                delay(&src, m.horizon.as_ref(), format!("{here}.horizon"))?
                    .unwrap_or(DEFAULT_HORIZON_NS),
            ),
            admission: admission.map_or(AdmissionRequest::Default, AdmissionRequest::Exactly),
            meter2,
            max_subscribers: m.max_subscribers.as_ref().map(|n| *n.get_ref()),
            max_policies: m.max_policies.as_ref().map(|n| *n.get_ref()),
            subscribers: subscribers(
                &src,
                &m,
                &here,
                &plans,
                keys,
                direction,
                &policy_prefixes,
                defer,
            )?,
            policies: Some(policies),
        });
    }
    Ok(Parsed {
        interfaces: out,
        plans,
    })
}

/// A plan's fields as given, wherever they are.
struct PlanFields<'a> {
    rate: &'a Option<Spanned<String>>,
    burst: &'a Option<Spanned<String>>,
    per_address_rate: &'a Option<Spanned<String>>,
    per_address_burst: &'a Option<Spanned<String>>,
    second: SecondMeterModel,
    mode: &'a Option<Spanned<Mode>>,
}

/// The [`PlanFields`] of a table that has them.
macro_rules! plan_fields_of {
    ($m:expr) => {
        PlanFields {
            rate: &$m.rate,
            burst: &$m.burst,
            per_address_rate: &$m.per_address_rate,
            per_address_burst: &$m.per_address_burst,
            second: second_meter!($m),
            mode: &$m.mode,
        }
    };
}

impl PlanModel {
    fn fields(&self) -> PlanFields<'_> {
        plan_fields_of!(self)
    }
}

impl SubscriberModel {
    fn fields(&self) -> PlanFields<'_> {
        plan_fields_of!(self)
    }

    /// Whether any of the plan's fields is given inline.
    fn inline(&self) -> Option<Range<usize>> {
        let f = self.fields();
        [f.rate, f.burst, f.per_address_rate, f.per_address_burst]
            .into_iter()
            .flatten()
            .map(Spanned::span)
            .chain(f.second.given().into_iter().filter_map(|(_, s)| s))
            .chain(f.mode.as_ref().map(Spanned::span))
            .next()
    }
}

fn plan_name_ok(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Where `[plan.NAME]` is in `text` (its table has no field to point at).
fn plan_table_span(text: &str, name: &str) -> Range<usize> {
    let start = text.find(&format!("plan.{name}")).unwrap_or(0);
    start..start
}

/// A plan's limits, checked as `subscriber set` checks its flags; an error names the field
/// under `here` (`at`: the table, for a field left out).
fn plan_limits(
    src: &Source,
    f: PlanFields,
    here: &str,
    at: Range<usize>,
) -> Result<PolicyLimits, FileError> {
    let need = |v: &Option<Spanned<String>>, name: &str| {
        v.clone()
            .ok_or_else(|| src.error(at.clone(), format!("{here}.{name}"), "a plan needs it"))
    };
    let agg_rate = need(f.rate, "rate")?;
    let agg_burst = need(f.burst, "burst")?;
    let agg_rate_bps = rate(src, &agg_rate, format!("{here}.rate"))?.bits_per_sec();
    let agg_burst_bytes = size(src, &agg_burst, format!("{here}.burst"))?.bytes();
    let meter2 = f.second.limits(src, here, at.clone())?;
    let per_address = match (f.per_address_rate, f.per_address_burst) {
        (Some(r), Some(b)) => Some((
            rate(src, r, format!("{here}.per_address_rate"))?.bits_per_sec(),
            size(src, b, format!("{here}.per_address_burst"))?.bytes(),
        )),
        (None, None) => None,
        (Some(r), None) => {
            return Err(src.error(
                r.span(),
                format!("{here}.per_address_burst"),
                "a per-address rate and a per-address burst go together",
            ));
        }
        (None, Some(b)) => {
            return Err(src.error(
                b.span(),
                format!("{here}.per_address_rate"),
                "a per-address rate and a per-address burst go together",
            ));
        }
    };
    let mode = f.mode.as_ref().map_or(Mode::Enforce, |m| *m.get_ref());
    let limits = PlanParts {
        rate_bps: agg_rate_bps,
        burst_bytes: agg_burst_bytes,
        per_address,
        excess: meter2,
        mode: mode.value(),
    }
    .limits();
    subscriber::check_plan(&limits).map_err(|why| {
        let (field, span) = match (&f.mode, &f.second.packet_rate) {
            (Some(m), _) if why.contains("mode") => ("mode", m.span()),
            (_, Some(p)) if why.starts_with("packet rate") => ("packet_rate", p.span()),
            _ => ("rate", agg_rate.span()),
        };
        src.error(span, format!("{here}.{field}"), why)
    })?;
    Ok(limits)
}

/// Where a subscriber of the file is, for its errors.
enum Loc {
    /// `[[interface.subscriber]]`: its table's `prefixes` and its field name.
    Toml(Range<usize>, String),
    /// A circuit of a LibreQoS file: the file and the circuit's first line.
    Csv(Rc<str>, usize),
}

impl Loc {
    fn error(&self, src: &Source, prefix: IpNet, message: String) -> FileError {
        match self {
            Self::Toml(span, field) => src.error(span.clone(), field.clone(), message),
            Self::Csv(file, line) => FileError {
                file: file.to_string(),
                line: *line,
                field: if prefix.addr().is_ipv4() {
                    "IPv4"
                } else {
                    "IPv6"
                }
                .to_owned(),
                message,
            },
        }
    }
}

/// The subscribers of interface `m` (at `here`): its `[[interface.subscriber]]` tables and
/// its `[interface.libreqos]` file (unless `defer`), each checked for keys masked to
/// `keys`, and none overlapping another or the interface's policies (`policies`: prefix,
/// span, field).
#[expect(
    clippy::too_many_arguments,
    reason = "the file's parts an interface's subscribers are checked against"
)]
fn subscribers(
    src: &Source,
    m: &InterfaceModel,
    here: &str,
    plans: &BTreeMap<String, PolicyLimits>,
    keys: (u32, u32),
    direction: Direction,
    policies: &[(IpNet, Range<usize>, String)],
    defer: bool,
) -> Result<Option<SubscriberRequest>, FileError> {
    if m.subscribers.is_empty() && m.libreqos.is_none() {
        if m.prune_subscribers {
            return Ok(Some(SubscriberRequest {
                specs: Vec::new(),
                prune: true,
                csv: None,
            }));
        }
        return Ok(None);
    }
    let mut specs = Vec::new();
    let mut locs = Vec::new();
    for (k, s) in m.subscribers.iter().enumerate() {
        let here = format!("{here}.subscriber[{k}]");
        specs.push(toml_subscriber(src, s, &here, plans, keys)?);
        locs.push(Loc::Toml(s.prefixes.span(), format!("{here}.prefixes")));
    }
    let mut file = None;
    if let Some(l) = &m.libreqos {
        let direction = m.direction.unwrap_or(direction);
        let here = format!("{here}.libreqos");
        let mut csv = csv_file(src, l, &here, direction)?;
        if !defer {
            let first = specs.len();
            let (lines, rows) = csv_subscribers(src, l, &here, &csv, &mut specs)?;
            let shown: Rc<str> = csv.shown.clone().into();
            locs.reserve(lines.len());
            for (spec, line) in specs[first..].iter().zip(lines) {
                spec.check_shape(keys).map_err(|e| {
                    Loc::Csv(shown.clone(), line).error(src, spec.prefixes[0], e.to_string())
                })?;
                locs.push(Loc::Csv(shown.clone(), line));
            }
            csv.rows = Some(rows);
        }
        file = Some(csv);
    }
    let mut ids = HashSet::with_capacity(specs.len());
    for (spec, loc) in specs.iter().zip(&locs) {
        if !ids.insert(spec.id.as_str()) {
            let message = format!("subscriber {} is given twice", spec.id);
            return Err(loc.error(src, spec.prefixes[0], message));
        }
    }
    check_overlaps(src, &specs, &locs, policies)?;
    Ok(Some(SubscriberRequest {
        specs,
        prune: m.prune_subscribers,
        csv: file,
    }))
}

/// One `[[interface.subscriber]]`, its plan named or inline.
fn toml_subscriber(
    src: &Source,
    s: &SubscriberModel,
    here: &str,
    plans: &BTreeMap<String, PolicyLimits>,
    keys: (u32, u32),
) -> Result<SubscriberSpec, FileError> {
    let plan = match (&s.plan, s.inline()) {
        (Some(name), None) => *plans.get(name.get_ref()).ok_or_else(|| {
            let message = format!("no [plan.{}] in the file", name.get_ref());
            src.error(name.span(), format!("{here}.plan"), message)
        })?,
        (Some(name), Some(_)) => {
            let message = "a named plan, or the plan's fields inline, not both";
            return Err(src.error(name.span(), format!("{here}.plan"), message));
        }
        (None, _) => plan_limits(src, s.fields(), here, s.id.span())?,
    };
    let prefixes = s
        .prefixes
        .get_ref()
        .iter()
        .map(|p| {
            parse_prefix(p.get_ref())
                .map_err(|e| src.error(p.span(), format!("{here}.prefixes"), e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let spec = SubscriberSpec {
        id: s.id.get_ref().clone(),
        name: s
            .name
            .as_ref()
            .map(|n| n.get_ref().clone())
            .unwrap_or_default(),
        prefixes,
        plan,
    };
    spec.check(keys).map_err(|e| {
        let (field, span) = match &e {
            SubscriberError::Id(_) => ("id", s.id.span()),
            SubscriberError::Name(_) => {
                ("name", s.name.as_ref().map_or(s.id.span(), Spanned::span))
            }
            _ => ("prefixes", s.prefixes.span()),
        };
        src.error(span, format!("{here}.{field}"), e.to_string())
    })?;
    Ok(spec)
}

/// `[interface.libreqos]`: its file (not read yet) and its plan options.
fn csv_file(
    src: &Source,
    l: &LibreqosModel,
    here: &str,
    direction: Direction,
) -> Result<CsvFile, FileError> {
    let base = Path::new(src.file).parent().unwrap_or(Path::new(""));
    let path = base.join(l.file.get_ref());
    let shown = path.display().to_string();
    let err = |span: Range<usize>, field: &str, message: String| {
        src.error(span, format!("{here}.{field}"), message)
    };
    let burst_ns = match &l.burst_time {
        Some(t) => delay(src, Some(t), format!("{here}.burst_time"))?.unwrap_or(0),
        None => 20_000_000,
    };
    if burst_ns == 0 {
        let span = l.burst_time.as_ref().map_or(l.file.span(), Spanned::span);
        return Err(err(span, "burst_time", "a burst must last".to_owned()));
    }
    let plan = import::Plan {
        direction,
        committed_from_min: l.committed_from_min,
        burst_ns,
        excess_dscp: l
            .excess_dscp
            .as_ref()
            .map_or(Dscp::LE, |d| *d.get_ref())
            .value(),
    };
    Ok(CsvFile {
        path,
        shown,
        plan,
        rows: None,
    })
}

/// The circuits of `[interface.libreqos]` (`csv`) as subscribers, put after `specs` (not
/// a million specs made and then moved): each one's line, and the digests of its rows.
fn csv_subscribers(
    src: &Source,
    l: &LibreqosModel,
    here: &str,
    csv: &CsvFile,
    specs: &mut Vec<SubscriberSpec>,
) -> Result<(Vec<usize>, RowDigests), FileError> {
    let first = specs.len();
    let shown = &csv.shown;
    let err = |span: Range<usize>, field: &str, message: String| {
        src.error(span, format!("{here}.{field}"), message)
    };
    let open = std::fs::File::open(&csv.path)
        .and_then(|f| f.metadata().map(|m| (f, m.len())))
        .map_err(|e| err(l.file.span(), "file", format!("cannot open {shown}: {e}")))?;
    if open.1 > MAX_CSV_BYTES {
        let message = format!("{shown} is larger than {MAX_CSV_BYTES} bytes");
        return Err(err(l.file.span(), "file", message));
    }
    // Read whole (bounded above): its rows' digests are taken from the same bytes.
    let mut buf = Vec::with_capacity(open.1 as usize + 1);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(open.0, MAX_CSV_BYTES + 1),
        &mut buf,
    )
    .map_err(|e| err(l.file.span(), "file", format!("cannot read {shown}: {e}")))?;
    let csv_error = |e: libreqos::ImportError| FileError {
        file: shown.clone(),
        line: e.line(),
        field: match &e {
            libreqos::ImportError::Cell { column, .. } => column.clone(),
            libreqos::ImportError::Line { .. } => "(row)".to_owned(),
        },
        message: match e {
            libreqos::ImportError::Cell { reason, .. }
            | libreqos::ImportError::Line { reason, .. } => reason,
        },
    };
    // Its lines' digests taken on another thread meanwhile: on two CPUs, for nothing.
    let (read, lines) = std::thread::scope(|s| {
        let lines = s.spawn(|| crate::rows::line_digests(&buf));
        let read = libreqos::read_rows_of(&buf);
        let lines = lines
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (read, lines)
    });
    let mut read = read.map_err(csv_error)?;
    let rows = RowDigests::of(&lines, &read, first);
    let circuits = std::mem::take(&mut read.circuits);
    let mut lines = Vec::with_capacity(circuits.len());
    specs.reserve(circuits.len());
    for c in circuits {
        lines.push(c.line);
        specs.push(import::subscriber(c, &csv.plan).map_err(csv_error)?);
    }
    Ok((lines, rows))
}

/// Who holds a prefix in the file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Policy(usize),
    Subscriber(usize),
}

/// Refuses what would let a subscriber's traffic escape its bucket, as the kernel tables
/// would ([`crate::subscriber`]): a prefix given twice (by two subscribers, or a
/// subscriber and a policy), and a policy's or another subscriber's prefix inside a
/// subscriber's. A lookup per prefix and prefix length subscribers use: no pair is compared.
fn check_overlaps(
    src: &Source,
    specs: &[SubscriberSpec],
    locs: &[Loc],
    policies: &[(IpNet, Range<usize>, String)],
) -> Result<(), FileError> {
    let mut end = HashMap::with_capacity(policies.len() + 2 * specs.len());
    end.extend(
        policies
            .iter()
            .enumerate()
            .map(|(j, (p, _, _))| (*p, Owner::Policy(j))),
    );
    let name = |o: Owner, p: IpNet| match o {
        Owner::Policy(_) => format!("policy {p}"),
        Owner::Subscriber(k) => format!("subscriber {}'s prefix {p}", specs[k].id),
    };
    let at = |o: Owner, p: IpNet, message: String| match o {
        Owner::Policy(j) => src.error(policies[j].1.clone(), policies[j].2.clone(), message),
        Owner::Subscriber(k) => locs[k].error(src, p, message),
    };
    let mut lengths = HashSet::new();
    for (k, s) in specs.iter().enumerate() {
        for p in &s.prefixes {
            lengths.insert((p.addr().is_ipv4(), p.prefix_len()));
            if let Some(other) = end.insert(*p, Owner::Subscriber(k)) {
                let message = format!(
                    "{} is subscriber {}'s prefix too: its traffic would escape a subscriber's bucket",
                    name(other, *p),
                    s.id
                );
                return Err(at(Owner::Subscriber(k), *p, message));
            }
        }
    }
    let mut lengths: Vec<_> = lengths.into_iter().collect();
    lengths.sort_unstable();
    for (p, o) in &end {
        for &(_, len) in lengths
            .iter()
            .filter(|l| l.0 == p.addr().is_ipv4() && l.1 < p.prefix_len())
        {
            let Ok(cover) = IpNet::new(p.addr(), len).map(|c| c.trunc()) else {
                continue;
            };
            if let Some(Owner::Subscriber(k)) = end.get(&cover).copied().filter(|c| c != o) {
                let message = format!(
                    "{} is inside subscriber {}'s prefix {cover}: its traffic would escape that subscriber's bucket",
                    name(*o, *p),
                    specs[k].id
                );
                return Err(at(*o, *p, message));
            }
        }
    }
    Ok(())
}

fn rate(src: &Source, v: &Spanned<String>, field: String) -> Result<Rate, FileError> {
    v.get_ref()
        .parse()
        .map_err(|e: UnitError| src.error(v.span(), field, e.to_string()))
}

/// A time span field (`5ms`), in nanoseconds; `None` when absent.
fn delay(
    src: &Source,
    v: Option<&Spanned<String>>,
    field: String,
) -> Result<Option<u64>, FileError> {
    v.map(|v| {
        v.get_ref()
            .parse::<Delay>()
            .map(Delay::ns)
            .map_err(|e| src.error(v.span(), field, e.to_string()))
    })
    .transpose()
}

fn size(src: &Source, v: &Spanned<String>, field: String) -> Result<Size, FileError> {
    v.get_ref()
        .parse()
        .map_err(|e: UnitError| src.error(v.span(), field, e.to_string()))
}

/// `new_sources` and `new_sources_burst` of a table, as given.
struct NewSources<'a> {
    n: Option<KeysPerSec>,
    burst: Option<u64>,
    n_field: &'a Option<Spanned<Value>>,
    burst_field: &'a Option<Spanned<u64>>,
    here: &'a str,
}

impl<'a> NewSources<'a> {
    /// The fields of the table at `here`: `new_sources` a positive whole number or
    /// "unlimited".
    fn of(
        src: &Source,
        n: &'a Option<Spanned<Value>>,
        burst: &'a Option<Spanned<u64>>,
        here: &'a str,
    ) -> Result<Self, FileError> {
        let keys = match n {
            None => None,
            Some(v) => Some(match v.get_ref() {
                Value::Integer(0) => {
                    return Err(src.error(
                        v.span(),
                        format!("{here}.new_sources"),
                        "must be at least 1 (leave it out for the default)",
                    ));
                }
                Value::Integer(n) if *n > 0 => KeysPerSec(n.unsigned_abs()),
                Value::String(w) if w == "unlimited" => KeysPerSec::UNLIMITED,
                other => {
                    let word = match other {
                        Value::String(w) => w.clone(),
                        v => v.to_string(),
                    };
                    return Err(src.error(
                        v.span(),
                        format!("{here}.new_sources"),
                        format!(
                            "'{}' is not a positive whole number of keys a second, or \"unlimited\"",
                            word.escape_debug()
                        ),
                    ));
                }
            }),
        };
        Ok(Self {
            n: keys,
            burst: burst.as_ref().map(|b| *b.get_ref()),
            n_field: n,
            burst_field: burst,
            here,
        })
    }

    /// A refusal of the admission rules, at the field it is about (`name`, the table's
    /// first field, if that one is not given).
    fn error(&self, src: &Source, name: &Spanned<String>, e: NewSourcesError) -> FileError {
        let n_span = self.n_field.as_ref().map(Spanned::span);
        let burst_span = self.burst_field.as_ref().map(Spanned::span);
        let (setting, message) = match &e {
            NewSourcesError::BurstAlone { .. } => {
                (Setting::NewSourcesBurst, "needs new_sources".to_owned())
            }
            NewSourcesError::BurstWhenUnlimited { .. } => (
                Setting::NewSourcesBurst,
                "has no meaning with new_sources = \"unlimited\"".to_owned(),
            ),
            NewSourcesError::UnlimitedPolicy => (
                Setting::NewSources,
                "\"unlimited\": a policy without new_sources shares the interface's admission"
                    .to_owned(),
            ),
            // A burst refused although none was given is the default one: its rate's.
            NewSourcesError::Invalid {
                setting, reason, ..
            } => (
                match (setting, &burst_span) {
                    (Setting::NewSourcesBurst, None) => Setting::NewSources,
                    (s, _) => *s,
                },
                reason.to_string(),
            ),
        };
        let span = match setting {
            Setting::NewSourcesBurst => burst_span,
            _ => n_span,
        };
        src.error(
            span.unwrap_or_else(|| name.span()),
            format!("{}.{setting}", self.here),
            message,
        )
    }
}

fn bounded(
    src: &Source,
    v: &Option<Spanned<u32>>,
    max: u32,
    field: String,
) -> Result<Option<u32>, FileError> {
    match v {
        Some(p) if *p.get_ref() > max => Err(src.error(
            p.span(),
            field,
            format!("/{} is longer than {max} bits", p.get_ref()),
        )),
        Some(p) => Ok(Some(*p.get_ref())),
        None => Ok(None),
    }
}

/// One subscriber's table given alone (`text`, named `file` in errors: the local API's
/// body, as TOML), read and checked as a `[[interface.subscriber]]` of a file is, its
/// fields named without a table (`rate`); a `plan` names one of `plans`. The prefixes'
/// lengths are checked against the attachment's keys when it is set.
pub fn parse_subscriber(
    file: &str,
    text: &str,
    plans: &BTreeMap<String, PolicyLimits>,
) -> Result<SubscriberSpec, FileError> {
    let src = Source { file, text };
    let model: SubscriberModel = toml::from_str(text).map_err(|e| src.parse_error(&e))?;
    toml_subscriber(&src, &model, "", plans, (32, 128)).map_err(unprefixed)
}

/// One policy's table given alone, read and checked as an `[[interface.policy]]` of a
/// file is (see [`parse_subscriber`]).
pub fn parse_policy(file: &str, text: &str) -> Result<CheckedPolicy, FileError> {
    let src = Source { file, text };
    let model: PolicyModel = toml::from_str(text).map_err(|e| src.parse_error(&e))?;
    policy(&src, &model, "").map_err(unprefixed)
}

/// An error of a table given alone: its field without the empty table's dot.
fn unprefixed(mut e: FileError) -> FileError {
    e.field = e.field.trim_start_matches('.').to_owned();
    e
}

/// One `[[interface.policy]]` table, checked the way `shaper policy set` checks its flags.
fn policy(src: &Source, p: &PolicyModel, here: &str) -> Result<CheckedPolicy, FileError> {
    let prefix = parse_prefix(p.prefix.get_ref())
        .map_err(|e| src.error(p.prefix.span(), format!("{here}.prefix"), e.to_string()))?;
    let action = p.action.unwrap_or_default();
    let span = |v: &Option<Spanned<String>>| v.as_ref().map(Spanned::span);
    let mut fields = vec![
        ("rate", span(&p.rate)),
        ("burst", span(&p.burst)),
        ("aggregate_rate", span(&p.aggregate_rate)),
        ("aggregate_burst", span(&p.aggregate_burst)),
    ];
    let meter2 = second_meter!(p);
    fields.extend(meter2.given());
    if action != Action::Limit
        && let Some((name, Some(v))) = fields.iter().find(|(_, v)| v.is_some())
    {
        return Err(src.error(
            v.clone(),
            format!("{here}.{name}"),
            format!("has no meaning with action = \"{}\"", action.name()),
        ));
    }
    let given = NewSources::of(src, &p.new_sources, &p.new_sources_burst, here)?;
    let admission =
        admission::of_policy(given.n, given.burst).map_err(|e| given.error(src, &p.prefix, e))?;
    let mut limits = PolicyLimits {
        action: action.value(),
        mode: p.mode.unwrap_or_default().value(),
        new_sources: admission.new_sources,
        new_sources_burst: admission.new_sources_burst,
        ..PolicyLimits::default()
    };
    if action == Action::Limit {
        let (Some(r), Some(b)) = (&p.rate, &p.burst) else {
            return Err(src.error(
                p.prefix.span(),
                format!("{here}.rate"),
                "action \"limit\" needs rate and burst",
            ));
        };
        limits.meter2 = meter2.limits(src, here, p.prefix.span())?;
        limits.rate_bps = rate(src, r, format!("{here}.rate"))?.bits_per_sec();
        limits.burst_bytes = size(src, b, format!("{here}.burst"))?.bytes();
        match (&p.aggregate_rate, &p.aggregate_burst) {
            (None, None) => {}
            (Some(r), Some(b)) => {
                limits.aggregate_rate_bps =
                    rate(src, r, format!("{here}.aggregate_rate"))?.bits_per_sec();
                limits.aggregate_burst_bytes =
                    size(src, b, format!("{here}.aggregate_burst"))?.bytes();
            }
            (Some(v), None) | (None, Some(v)) => {
                return Err(src.error(
                    v.span(),
                    format!("{here}.aggregate_rate"),
                    "aggregate_rate and aggregate_burst go together",
                ));
            }
        }
    }
    CheckedPolicy::new(PolicySpec { prefix, limits }).map_err(|e| match e {
        PolicyError::Invalid { reason, .. } => {
            src.error(p.prefix.span(), here.to_owned(), reason.to_string())
        }
        e => src.error(p.prefix.span(), here.to_owned(), e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use shaper_common::maps::Admission;

    use super::*;

    /// The policies a request names.
    fn specs(r: &AttachRequest) -> Vec<PolicySpec> {
        r.policies
            .iter()
            .flat_map(PolicySet::specs)
            .copied()
            .collect()
    }

    const GOOD: &str = r#"
[[interface]]
name = "eth0"
rate = "10mbit"
burst = "64k"

[[interface.policy]]
prefix = "203.0.113.0/24"
rate = "4mbit"
burst = "64k"
aggregate_rate = "10mbit"
aggregate_burst = "128k"

[[interface.policy]]
prefix = "192.0.2.0/24"
action = "pass"

[[interface.policy]]
prefix = "198.18.0.0/15"
rate = "2mbit"
burst = "16k"
new_sources = 200
mode = 'monitor'

[[interface]]
name = "eth1"
rate = "1gbit"
burst = "1m"
mode = "monitor"
key = "dst"
prefix_v4 = 24
xdp_mode = "skb"
max_sources = 1000
new_sources = 5000
new_sources_burst = 200000
"#;

    #[test]
    fn a_good_file_reads_into_interfaces_and_policies() {
        let got = parse("isp.toml", GOOD, Direction::Ingress).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].at, Attachment::new("eth0", None));
        assert_eq!(got[0].rate.rate_bps(), 10_000_000);
        let policies = specs(&got[0]);
        assert_eq!(policies.len(), 3);
        assert_eq!(got[0].admission, AdmissionRequest::Default);
        assert_eq!(
            (
                policies[2].limits.new_sources,
                policies[2].limits.new_sources_burst
            ),
            (200, 200)
        );
        assert_eq!(
            got[1].admission,
            AdmissionRequest::Exactly(Admission::new(5000, 200_000).unwrap())
        );
        let unlimited = GOOD.replace(
            "new_sources = 5000\nnew_sources_burst = 200000",
            "new_sources = \"unlimited\"",
        );
        assert_eq!(
            parse("isp.toml", &unlimited, Direction::Ingress).unwrap()[1].admission,
            AdmissionRequest::Exactly(Admission::default())
        );
        assert_eq!(policies[0].limits.aggregate_burst_bytes, 131_072);
        assert_eq!(policies[1].action(), Action::Pass);
        assert_eq!(
            policies.iter().map(PolicySpec::mode).collect::<Vec<_>>(),
            [Mode::Enforce, Mode::Enforce, Mode::Monitor]
        );
        assert_eq!(got[1].mode, Some(Mode::Monitor));
        assert_eq!(got[1].key, Some(KeyBy::Dst));
        assert_eq!(got[1].prefix_v4, Some(24));
        assert_eq!(got[1].xdp_mode, XdpAttachMode::Skb);
        assert_eq!(got[1].max_sources, Some(1000));
    }

    /// An interface's ECN threshold and horizon, read as `attach` takes them; left out,
    /// the defaults.
    #[test]
    fn shape_delays_read_as_the_flags_do() {
        let given = GOOD.replace(
            "name = \"eth0\"",
            "name = \"eth0\"\necn_threshold = \"2ms\"\nhorizon = \"250us\"",
        );
        let got = parse("isp.toml", &given, Direction::Ingress).unwrap();
        assert_eq!(
            (got[0].ecn_threshold_ns, got[0].horizon_ns),
            (Some(2_000_000), Some(250_000))
        );
        assert_eq!(
            (got[1].ecn_threshold_ns, got[1].horizon_ns),
            (Some(DEFAULT_ECN_THRESHOLD_NS), Some(DEFAULT_HORIZON_NS))
        );
    }

    /// Every table refuses a key it does not know, misspelled or made up, and names it at
    /// its line: the top level (a misspelled `[[interface]]`), `[[interface]]` (a field, a
    /// second-meter field, a misspelled `[[interface.policy]]`) and `[[interface.policy]]`
    /// (a field, an aggregate's, a second-meter field). Nothing else is a table: every
    /// other value is a string, a number or an enum's name, and a table given for one is
    /// refused as the wrong type.
    #[test]
    fn every_table_refuses_unknown_keys() {
        let cases: [(&str, &str, &str, &str); 10] = [
            // (what, replaced by, the field named, the key refused)
            (
                "[[interface]]\nname = \"eth1\"",
                "[[interfaces]]\nname = \"eth1\"",
                "interfaces",
                "interfaces",
            ),
            (
                "\n[[interface]]\nname = \"eth0\"",
                "\nversion = 2\n[[interface]]\nname = \"eth0\"",
                "version",
                "version",
            ),
            (
                "burst = \"1m\"",
                "burts = \"1m\"",
                "interface[1].burts",
                "burts",
            ),
            (
                "max_sources = 1000",
                "max_sources = 1000\npacket_rates = 5",
                "interface[1].packet_rates",
                "packet_rates",
            ),
            (
                "max_sources = 1000",
                "max_sources = 1000\ncomment = \"x\"",
                "interface[1].comment",
                "comment",
            ),
            (
                "[[interface.policy]]\nprefix = \"192.0.2.0/24\"",
                "[[interface.policies]]\nprefix = \"192.0.2.0/24\"",
                "interface[0].policies",
                "policies",
            ),
            (
                "action = \"pass\"",
                "actions = \"pass\"",
                "interface[0].policy[1].actions",
                "actions",
            ),
            (
                "aggregate_burst = \"128k\"",
                "aggregate_bursts = \"128k\"",
                "interface[0].policy[0].aggregate_bursts",
                "aggregate_bursts",
            ),
            (
                "new_sources = 200",
                "new_sources = 200\nexcess_dscps = \"cs1\"",
                "interface[0].policy[2].excess_dscps",
                "excess_dscps",
            ),
            (
                "mode = 'monitor'",
                "mode = 'monitor'\nname = \"eth9\"",
                "interface[0].policy[2].name",
                "name",
            ),
        ];
        for (what, by, field, key) in cases {
            assert_eq!(GOOD.matches(what).count(), 1, "{what}");
            let text = GOOD.replace(what, by);
            let e = error_of(&text);
            let at = by.lines().find(|l| l.contains(key)).unwrap();
            let want = format!(
                "isp.toml:{}: {field}: unknown field `{key}`",
                line(&text, at)
            );
            assert!(e.starts_with(&want), "{by}: {e}, not {want}");
        }
    }

    fn error_of(text: &str) -> String {
        parse("isp.toml", text, Direction::Ingress)
            .unwrap_err()
            .to_string()
    }

    /// The line of `text` that contains `needle` (the first such), counted from 1.
    fn line(text: &str, needle: &str) -> usize {
        nth_line(text, needle, 0)
    }

    /// The line of the `n`th (from 0) occurrence of `needle`, counted from 1.
    fn nth_line(text: &str, needle: &str, n: usize) -> usize {
        let mut found = text.lines().enumerate().filter(|(_, l)| l.contains(needle));
        found.nth(n).unwrap().0 + 1
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let bad_rate = GOOD.replace("rate = \"4mbit\"", "rate = \"4mbt\"");
        assert_eq!(
            error_of(&bad_rate),
            format!(
                "isp.toml:{}: interface[0].policy[0].rate: invalid rate '4mbt': unknown unit 'mbt' (expected bit, kbit, mbit, gbit, tbit, kibit, mibit, gibit, tibit, bps, kbps, mbps, gbps, tbps, kibps, mibps, gibps, tibps)",
                line(&bad_rate, "4mbt")
            )
        );
        let host_bits = GOOD.replace("192.0.2.0/24", "192.0.2.1/24");
        assert_eq!(
            error_of(&host_bits),
            format!(
                "isp.toml:{}: interface[0].policy[1].prefix: invalid prefix '192.0.2.1/24': host bits are set (did you mean 192.0.2.0/24?)",
                line(&host_bits, "192.0.2.1/24")
            )
        );
        let pass_with_rate =
            GOOD.replace("action = \"pass\"", "action = \"pass\"\nrate = \"1mbit\"");
        assert_eq!(
            error_of(&pass_with_rate),
            format!(
                "isp.toml:{}: interface[0].policy[1].rate: has no meaning with action = \"pass\"",
                line(&pass_with_rate, "1mbit")
            )
        );
        let dot_dot = GOOD.replacen("name = \"eth0\"", "name = \"..\"", 1);
        let e = error_of(&dot_dot);
        assert!(
            e.starts_with(&format!(
                "isp.toml:{}: interface[0].name: invalid interface name '..'",
                line(&dot_dot, "\"..\"")
            )),
            "{e}"
        );
        let unknown_field = GOOD.replace("max_sources = 1000", "max_source = 1000");
        let e = error_of(&unknown_field);
        let want = format!(
            "isp.toml:{}: interface[1].max_source: unknown field `max_source`",
            line(&unknown_field, "max_source")
        );
        assert!(e.starts_with(&want), "{e}");
        let bad_mode = GOOD.replace("mode = \"monitor\"", "mode = \"dry\"");
        let e = error_of(&bad_mode);
        let want = format!(
            "isp.toml:{}: interface[1].mode: unknown variant `dry`",
            line(&bad_mode, "dry")
        );
        assert!(e.starts_with(&want), "{e}");
        let syntax = GOOD.replace("burst = \"1m\"", "burst = 1m");
        let e = error_of(&syntax);
        let want = format!("isp.toml:{}: interface[1].burst: ", line(&syntax, "1m"));
        assert!(e.starts_with(&want), "{e}");
        let too_long = GOOD
            .replace("prefix = \"192.0.2.0/24\"", "prefix = \"192.0.2.0/25\"")
            .replace("name = \"eth0\"", "name = \"eth0\"\nprefix_v4 = 24");
        assert_eq!(
            error_of(&too_long),
            format!(
                "isp.toml:{}: interface[0].policy[1].prefix: 192.0.2.0/25 is longer than the /24 sources are keyed by, so it could never match",
                line(&too_long, "/25")
            )
        );
        // Link-local, unspecified and multicast addresses are keyed whole: a policy may
        // name one of them, or a range of them, past the keys' prefix.
        for whole in [
            "169.254.0.0/24",
            "0.0.0.0/32",
            "224.0.0.251/32",
            "fe80::1/128",
            "::/128",
            "ff02::/16",
        ] {
            let file = GOOD
                .replace(
                    "prefix = \"192.0.2.0/24\"",
                    &format!("prefix = \"{whole}\""),
                )
                .replace("name = \"eth0\"", "name = \"eth0\"\nprefix_v4 = 24");
            parse("isp.toml", &file, Direction::Ingress).unwrap_or_else(|e| panic!("{whole}: {e}"));
        }
        // Not in such a range: past the keys' prefix as any other.
        let not_whole = GOOD.replace("prefix = \"192.0.2.0/24\"", "prefix = \"100::1/128\"");
        assert!(error_of(&not_whole).contains("100::1/128 is longer than the /64"));
        let twice = GOOD.replace("name = \"eth1\"", "name = \"eth0\"");
        assert_eq!(
            error_of(&twice),
            format!(
                "isp.toml:{}: interface[1].name: interface 'eth0' is listed twice for ingress",
                nth_line(&twice, "name = \"eth0\"", 1)
            )
        );
        // Each direction is an attachment of its own: the same name once for each is fine.
        let both = GOOD.replace(
            "name = \"eth1\"",
            "name = \"eth0\"\ndirection = \"egress\"\nhook = \"tc\"\ntc_mode = \"clsact\"",
        );
        let got = parse("isp.toml", &both, Direction::Ingress).unwrap();
        assert_eq!(
            got.iter()
                .map(|d| (d.at.label(), d.hook, d.tc_mode))
                .collect::<Vec<_>>(),
            [
                ("eth0".to_owned(), None, TcAttachMode::Auto),
                (
                    "eth0 egress".to_owned(),
                    Some(Hook::Tc),
                    TcAttachMode::Clsact
                )
            ]
        );
        let zero = GOOD.replace("new_sources = 200\n", "new_sources = 0\n");
        assert_eq!(
            error_of(&zero),
            format!(
                "isp.toml:{}: interface[0].policy[2].new_sources: must be at least 1 (leave it out for the default)",
                line(&zero, "new_sources = 0")
            )
        );
        let burst_alone = GOOD.replace("new_sources = 5000\n", "");
        assert_eq!(
            error_of(&burst_alone),
            format!(
                "isp.toml:{}: interface[1].new_sources_burst: needs new_sources",
                line(&burst_alone, "new_sources_burst")
            )
        );
        // A key prefix at most as long as the address: /32 and /128 are, /33 is not.
        let whole = GOOD.replace("prefix_v4 = 24", "prefix_v4 = 32\nprefix_v6 = 128");
        let got = parse("isp.toml", &whole, Direction::Ingress).unwrap();
        assert_eq!((got[1].prefix_v4, got[1].prefix_v6), (Some(32), Some(128)));
        let longer = GOOD.replace("prefix_v4 = 24", "prefix_v4 = 33");
        assert_eq!(
            error_of(&longer),
            format!(
                "isp.toml:{}: interface[1].prefix_v4: /33 is longer than 32 bits",
                line(&longer, "prefix_v4 = 33")
            )
        );
        // Each size's range, checked once for flag and file (`request::size_problem`): at
        // its line, by its field, both ends of each range.
        for (size, problem) in [
            ("max_sources = 0", "0: must be at least 1"),
            ("max_subscribers = 16000001", "16000001: at most 16000000"),
            ("max_policies = 0", "0: must be 1 to 16383"),
            ("max_policies = 16384", "16384: must be 1 to 16383"),
        ] {
            let bad = GOOD.replace("max_sources = 1000", size);
            let field = size.split(' ').next().unwrap();
            assert_eq!(
                error_of(&bad),
                format!(
                    "isp.toml:{}: interface[1].{field}: {problem}",
                    line(&bad, size)
                )
            );
        }
        let most = GOOD.replace(
            "max_sources = 1000",
            "max_sources = 4294967295\nmax_subscribers = 16000000\nmax_policies = 16383",
        );
        assert!(parse("isp.toml", &most, Direction::Ingress).is_ok());
        // The interface's rate refused by the limit: at the rate, not the burst below it.
        let slow = GOOD.replace("rate = \"1gbit\"", "rate = \"1bit\"");
        assert_eq!(
            error_of(&slow),
            format!(
                "isp.toml:{}: interface[1].rate: rate is below the minimum of 8bit (one byte per second)",
                line(&slow, "1bit")
            )
        );
        // A parser error on a line with no key: the field is the table.
        let no_key = GOOD.replace("burst = \"1m\"", "= \"1m\"");
        let e = error_of(&no_key);
        let want = format!("isp.toml:{}: interface[1]: ", line(&no_key, "= \"1m\""));
        assert!(e.starts_with(&want), "{e}");
        assert_eq!(
            error_of(""),
            "isp.toml:1: interface: no [[interface]] in the file"
        );
    }

    /// The worked example of docs/operating/colour.md, on the interface and on a policy.
    const PROFILE: &str = r#"
[[interface]]
name = "eth0"
rate = "10mbit"
burst = "64k"
packet_rate = 20000
packet_burst = "2k"

[[interface.policy]]
prefix = "203.0.113.0/24"
rate = "10mbit"
burst = "64k"
excess_rate = "10mbit"
excess_burst = "64k"
excess_dscp = "cs1"

[[interface.policy]]
prefix = "198.51.100.0/24"
rate = "10mbit"
burst = "64k"
excess_rate = "5mbit"
excess_burst = "32k"
"#;

    #[test]
    fn a_bandwidth_profile_and_a_packet_rate_read_as_the_flags_do() {
        let got = parse("isp.toml", PROFILE, Direction::Ingress).unwrap();
        assert_eq!(
            got[0].meter2,
            Meter2Limits {
                packet_rate: 20_000,
                packet_burst: 2_000,
                ..Meter2Limits::default()
            }
        );
        let policies = specs(&got[0]);
        assert_eq!(
            policies[0].limits.meter2,
            Meter2Limits {
                excess_rate_bps: 10_000_000,
                excess_burst_bytes: 65_536,
                excess_dscp: 8,
                ..Meter2Limits::default()
            }
        );
        // Without excess_dscp, Lower Effort, as --excess-dscp defaults.
        assert_eq!(policies[1].limits.meter2.excess_dscp, 1);
        assert_eq!(
            parse("isp.toml", GOOD, Direction::Ingress).unwrap()[0].meter2,
            Meter2Limits::default()
        );
    }

    #[test]
    fn second_meter_errors_name_their_field() {
        let cases = [
            (
                PROFILE.replace("excess_rate = \"5mbit\"", "excess_rate = \"5mbt\""),
                "5mbt",
                "interface[0].policy[1].excess_rate: invalid rate '5mbt': unknown unit 'mbt'",
            ),
            (
                PROFILE.replace("excess_dscp = \"cs1\"", "excess_dscp = \"cs9\""),
                "cs9",
                "interface[0].policy[0].excess_dscp: not a DSCP: give 0 to 63 or a name",
            ),
            (
                PROFILE.replace("excess_dscp = \"cs1\"", "excess_dscp = 64"),
                "= 64",
                "interface[0].policy[0].excess_dscp: not a DSCP",
            ),
            (
                PROFILE.replace("excess_burst = \"32k\"\n", ""),
                "excess_rate = \"5mbit\"",
                "interface[0].policy[1].excess_burst: an excess rate and an excess burst go together",
            ),
            (
                PROFILE.replace("excess_rate = \"10mbit\"\n", ""),
                "excess_dscp",
                "interface[0].policy[0].excess_dscp: needs excess_rate",
            ),
            // Refused by the excess meter's limit: at the field it is about.
            (
                PROFILE.replace("excess_rate = \"5mbit\"", "excess_rate = \"1bit\""),
                "1bit",
                "interface[0].policy[1].excess_rate: excess: rate is below the minimum",
            ),
            (
                PROFILE
                    .replace("excess_rate = \"5mbit\"", "excess_rate = \"8bit\"")
                    .replace("excess_burst = \"32k\"", "excess_burst = \"1g\""),
                "1g",
                "interface[0].policy[1].excess_burst: excess: burst lasts more than 208 days",
            ),
            // A burst without its rate: named as the rate left out, at the burst.
            (
                PROFILE.replace("excess_rate = \"5mbit\"\n", ""),
                "excess_burst = \"32k\"",
                "interface[0].policy[1].excess_rate: an excess rate and an excess burst go together",
            ),
            (
                PROFILE.replace("packet_burst = \"2k\"\n", ""),
                "packet_rate",
                "interface[0].packet_burst: a packet rate and a packet burst go together",
            ),
            (
                PROFILE.replace("packet_rate = 20000\n", ""),
                "packet_burst",
                "interface[0].packet_rate: a packet rate and a packet burst go together",
            ),
            (
                PROFILE
                    .replace("packet_rate = 20000", "packet_rate = 1")
                    .replace("packet_burst = \"2k\"", "packet_burst = \"20m\""),
                "20m",
                "interface[0].packet_burst: packet rate: burst lasts more than 208 days",
            ),
            (
                PROFILE.replace("packet_rate = 20000", "packet_rate = 0"),
                "packet_rate",
                "interface[0].packet_rate: not a count of packets",
            ),
            (
                PROFILE
                    .replace(
                        "prefix = \"198.51.100.0/24\"",
                        "prefix = \"198.51.100.0/24\"\naction = \"pass\"",
                    )
                    .replacen(
                        "rate = \"10mbit\"\nburst = \"64k\"\nexcess_rate = \"5mbit\"",
                        "excess_rate = \"5mbit\"",
                        1,
                    ),
                "excess_rate = \"5mbit\"",
                "interface[0].policy[1].excess_rate: has no meaning with action = \"pass\"",
            ),
        ];
        for (text, at, want) in cases {
            let e = error_of(&text);
            let want = format!("isp.toml:{}: {want}", line(&text, at));
            assert!(e.starts_with(&want), "{e}\nwanted {want}");
        }
    }

    #[test]
    fn new_sources_follow_the_rules_the_flags_do() {
        let word = GOOD.replace("new_sources = 5000\n", "new_sources = \"lots\"\n");
        assert_eq!(
            error_of(&word),
            format!(
                "isp.toml:{}: interface[1].new_sources: 'lots' is not a positive whole number of keys a second, or \"unlimited\"",
                line(&word, "lots")
            )
        );
        let negative = GOOD.replace("new_sources = 5000\n", "new_sources = -5\n");
        assert_eq!(
            error_of(&negative),
            format!(
                "isp.toml:{}: interface[1].new_sources: '-5' is not a positive whole number of keys a second, or \"unlimited\"",
                line(&negative, "-5")
            )
        );
        let unlimited_with_burst =
            GOOD.replace("new_sources = 5000\n", "new_sources = \"unlimited\"\n");
        assert_eq!(
            error_of(&unlimited_with_burst),
            format!(
                "isp.toml:{}: interface[1].new_sources_burst: has no meaning with new_sources = \"unlimited\"",
                line(&unlimited_with_burst, "new_sources_burst")
            )
        );
        let policy_unlimited = GOOD.replace("new_sources = 200\n", "new_sources = \"unlimited\"\n");
        assert_eq!(
            error_of(&policy_unlimited),
            format!(
                "isp.toml:{}: interface[0].policy[2].new_sources: \"unlimited\": a policy without new_sources shares the interface's admission",
                line(&policy_unlimited, "unlimited")
            )
        );
        let burst_too_small = GOOD.replace("new_sources_burst = 200000", "new_sources_burst = 0");
        let e = error_of(&burst_too_small);
        let want = format!(
            "isp.toml:{}: interface[1].new_sources_burst: new sources: ",
            line(&burst_too_small, "new_sources_burst = 0")
        );
        assert!(e.starts_with(&want), "{e}");
    }

    const SUBSCRIBERS: &str = r#"
[plan.business]
rate = "50mbit"
burst = "512k"
excess_rate = "50mbit"
excess_burst = "512k"
excess_dscp = "af11"

[[interface]]
name = "eth0"
rate = "10mbit"
burst = "64k"
prefix_v6 = 56
prune_subscribers = true

[[interface.policy]]
prefix = "100.64.0.0/16"
rate = "4mbit"
burst = "64k"

[[interface.subscriber]]
id = "b1"
prefixes = ["100.64.0.8/29", "2001:db8:1::/48"]
plan = "business"

[[interface.subscriber]]
id = "c2"
name = "Smith"
prefixes = ["100.64.1.1/32"]
rate = "20mbit"
burst = "256k"
per_address_rate = "10mbit"
per_address_burst = "128k"
mode = "monitor"
"#;

    #[test]
    fn subscribers_and_their_plans_read_as_subscriber_set_does() {
        let parsed = parse_file("isp.toml", SUBSCRIBERS, Direction::Ingress).unwrap();
        let business = parsed.plans()["business"];
        // Each address may take the plan's peak, as `subscriber set` without per-address
        // flags gives it.
        assert_eq!(
            (
                business.aggregate_rate_bps,
                business.rate_bps,
                business.meter2.excess_dscp
            ),
            (50_000_000, 100_000_000, 10)
        );
        let subs = parsed.interfaces[0].subscribers.as_ref().unwrap();
        assert!(subs.prune);
        assert_eq!(subs.specs[0].plan, business);
        let c2 = &subs.specs[1];
        assert_eq!(
            (
                c2.name.as_str(),
                c2.plan.aggregate_rate_bps,
                c2.plan.rate_bps
            ),
            ("Smith", 20_000_000, 10_000_000)
        );
        assert_eq!(c2.plan.mode, Mode::Monitor.value());
        // A plan with a packet rate, and one that shapes.
        let shaped = SUBSCRIBERS
            .replace(
                "per_address_rate = \"10mbit\"\nper_address_burst = \"128k\"\nmode = \"monitor\"",
                "mode = \"shape\"",
            )
            .replace(
                "excess_rate = \"50mbit\"\nexcess_burst = \"512k\"\nexcess_dscp = \"af11\"",
                "packet_rate = \"20k\"\npacket_burst = 2000",
            );
        let parsed = parse_file("isp.toml", &shaped, Direction::Egress).unwrap();
        let m = parsed.plans()["business"].meter2;
        assert_eq!(
            (m.packet_rate, m.packet_burst, m.excess_rate_bps),
            (20_000, 2000, 0)
        );
        let subs = parsed.interfaces[0].subscribers.as_ref().unwrap();
        assert_eq!(subs.specs[1].plan.mode, Mode::Shape.value());
        // A subscriber inside a policy is allowed (the longest prefix wins); the errors name
        // their line and field.
        for (text, at, want) in [
            (
                SUBSCRIBERS.replace("plan = \"business\"", "plan = \"gold\""),
                "\"gold\"",
                "interface[0].subscriber[0].plan: no [plan.gold] in the file",
            ),
            (
                SUBSCRIBERS.replace("mode = \"monitor\"", "mode = \"shape\""),
                "\"shape\"",
                "interface[0].subscriber[1].mode: mode shape takes no per-address limit",
            ),
            (
                SUBSCRIBERS.replace(
                    "excess_dscp = \"af11\"",
                    "excess_dscp = \"af11\"\npacket_rate = \"20k\"\npacket_burst = 2000",
                ),
                "packet_rate",
                "plan.business.packet_rate: packet rate 20000 with an excess rate is not supported for subscribers",
            ),
            (
                SUBSCRIBERS.replace("per_address_burst = \"128k\"\n", ""),
                "per_address_rate",
                "interface[0].subscriber[1].per_address_burst: a per-address rate and a per-address burst go together",
            ),
            (
                SUBSCRIBERS.replace("\"100.64.1.1/32\"", "\"100.64.0.9/32\""),
                "100.64.0.9/32",
                "interface[0].subscriber[1].prefixes: subscriber c2's prefix 100.64.0.9/32 is inside subscriber b1's prefix 100.64.0.8/29",
            ),
            (
                SUBSCRIBERS.replace("\"100.64.0.0/16\"", "\"100.64.0.8/30\""),
                "100.64.0.8/30",
                "interface[0].policy[0].prefix: policy 100.64.0.8/30 is inside subscriber b1's prefix 100.64.0.8/29",
            ),
            (
                SUBSCRIBERS.replace("2001:db8:1::/48", "2001:db8:1::/64"),
                "2001:db8:1::/64",
                "interface[0].subscriber[0].prefixes: 2001:db8:1::/64 is longer than the /56 keys",
            ),
            (
                SUBSCRIBERS.replace("id = \"c2\"", "id = \"b1\""),
                "\"100.64.1.1/32\"",
                "interface[0].subscriber[1].prefixes: subscriber b1 is given twice",
            ),
            (
                SUBSCRIBERS.replace(
                    "excess_dscp = \"af11\"",
                    "excess_dscp = \"af11\"\nexcess = 1",
                ),
                "excess = 1",
                "plan.business.excess: unknown field `excess`",
            ),
        ] {
            let e = error_of(&text);
            let want = format!("isp.toml:{}: {want}", line(&text, at));
            assert!(e.starts_with(&want), "{e}\nwanted {want}");
        }
    }
}
