//! The running configuration of an interface as a file `apply` takes back unchanged.

use serde::Serialize;

use crate::{
    admission::KeysPerSec,
    maps,
    pins::{Attachment, Direction},
    policy::{Action, Mode, PolicyError, PolicySpec, PolicyTable},
    request::{self, Hook, KeyBy},
    subscriber::{SubscriberError, SubscriberSpec, SubscriberTable},
    units::{Delay, Packets, Rate, Size},
};
use shaper_common::{
    config::Meter2Limits,
    dscp::Dscp,
    maps::{DEFAULT_MAX_POLICIES, Shape},
};

#[derive(Serialize)]
struct FileOut {
    interface: Vec<InterfaceOut>,
}

#[derive(Serialize)]
struct InterfaceOut {
    name: String,
    /// Ingress, XDP: left out, as a file written before directions existed has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    direction: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hook: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tc_mode: Option<&'static str>,
    rate: String,
    burst: String,
    mode: &'static str,
    /// Shaping's: written where something shapes or they are not the defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    ecn_threshold: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    horizon: Option<String>,
    key: &'static str,
    prefix_v4: u32,
    prefix_v6: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    xdp_mode: Option<&'static str>,
    max_sources: u32,
    new_sources: KeysPerSec,
    #[serde(skip_serializing_if = "Option::is_none")]
    new_sources_burst: Option<u64>,
    #[serde(flatten)]
    meter2: SecondMeterOut,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    policy: Vec<PolicyOut>,
    /// Written where not the default.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_policies: Option<u32>,
    /// Written where it has subscribers.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_subscribers: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    subscriber: Vec<SubscriberOut>,
}

/// A subscriber, its plan inline (a file's named plans are not kept in the kernel).
#[derive(Serialize)]
struct SubscriberOut {
    id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    prefixes: Vec<String>,
    rate: String,
    burst: String,
    /// Written where not the default (the plan's rate and burst, excess included).
    #[serde(skip_serializing_if = "Option::is_none")]
    per_address_rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    per_address_burst: Option<String>,
    #[serde(flatten)]
    meter2: SecondMeterOut,
    mode: &'static str,
}

fn subscriber_out(spec: &SubscriberSpec) -> SubscriberOut {
    let p = &spec.plan;
    let default = (
        p.aggregate_rate_bps + p.meter2.excess_rate_bps,
        p.aggregate_burst_bytes + p.meter2.excess_burst_bytes,
    );
    let per_address = (default != (p.rate_bps, p.burst_bytes)).then_some(());
    SubscriberOut {
        id: spec.id.clone(),
        name: spec.name.clone(),
        prefixes: spec.prefixes.iter().map(ToString::to_string).collect(),
        rate: Rate::from_bps(p.aggregate_rate_bps).to_string(),
        burst: Size::from_bytes(p.aggregate_burst_bytes).to_string(),
        per_address_rate: per_address.map(|()| Rate::from_bps(p.rate_bps).to_string()),
        per_address_burst: per_address.map(|()| Size::from_bytes(p.burst_bytes).to_string()),
        meter2: (&p.meter2).into(),
        mode: Mode::from_value(p.mode).name(),
    }
}

/// A second meter's fields, those it has (`excess_dscp` always with an excess rate).
#[derive(Serialize)]
struct SecondMeterOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    excess_rate: Option<Rate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    excess_burst: Option<Size>,
    #[serde(skip_serializing_if = "Option::is_none")]
    excess_dscp: Option<Dscp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    packet_rate: Option<Packets>,
    #[serde(skip_serializing_if = "Option::is_none")]
    packet_burst: Option<Packets>,
}

impl From<&Meter2Limits> for SecondMeterOut {
    fn from(m: &Meter2Limits) -> Self {
        let excess = m.excess_rate_bps != 0;
        let packets = m.packet_rate != 0;
        Self {
            excess_rate: excess.then(|| Rate::from_bps(m.excess_rate_bps)),
            excess_burst: excess.then(|| Size::from_bytes(m.excess_burst_bytes)),
            excess_dscp: Dscp::new(m.excess_dscp).filter(|_| excess),
            packet_rate: packets.then(|| Packets::from_count(m.packet_rate)),
            packet_burst: packets.then(|| Packets::from_count(m.packet_burst)),
        }
    }
}

#[derive(Serialize)]
struct PolicyOut {
    prefix: String,
    action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregate_rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregate_burst: Option<String>,
    mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    new_sources: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    new_sources_burst: Option<u64>,
    #[serde(flatten)]
    meter2: SecondMeterOut,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("shaper is not attached to {0}")]
    NotAttached(String),
    #[error(transparent)]
    Pinned(#[from] maps::PinnedMapError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Subscriber(#[from] SubscriberError),
    #[error("cannot write TOML")]
    Toml(#[from] toml::ser::Error),
}

fn policy_out(spec: &PolicySpec) -> PolicyOut {
    let l = &spec.limits;
    let limited = spec.action() == Action::Limit;
    let aggregate = limited && l.aggregate_rate_bps != 0;
    PolicyOut {
        prefix: spec.prefix.to_string(),
        action: spec.action().name(),
        rate: limited.then(|| Rate::from_bps(l.rate_bps).to_string()),
        burst: limited.then(|| Size::from_bytes(l.burst_bytes).to_string()),
        aggregate_rate: aggregate.then(|| Rate::from_bps(l.aggregate_rate_bps).to_string()),
        aggregate_burst: aggregate.then(|| Size::from_bytes(l.aggregate_burst_bytes).to_string()),
        mode: spec.mode().name(),
        new_sources: (l.new_sources != 0).then_some(l.new_sources),
        new_sources_burst: (l.new_sources != 0).then_some(l.new_sources_burst),
        meter2: (&l.meter2).into(),
    }
}

/// The configuration of `at` as TOML, every setting spelled out.
pub fn render(at: &Attachment) -> Result<String, RenderError> {
    if !at.exists() {
        return Err(RenderError::NotAttached(at.label()));
    }
    let table = PolicyTable::open(at)?;
    let config = table.config()?;
    let key = if config.key_by == KeyBy::Dst.value() {
        KeyBy::Dst
    } else {
        KeyBy::Src
    };
    let a = config.admission;
    let tc = Hook::of_mode(config.xdp_mode) == Hook::Tc;
    let mode = request::mode_name(config.xdp_mode);
    let policies = table.list()?;
    let pinned = maps::Pinned::open(at)?;
    let subscribers = SubscriberTable::of(&pinned)?.list()?;
    let room = (!subscribers.is_empty()).then(|| pinned.subscriber_room());
    let shaping = config.mode == Mode::Shape.value()
        || policies.iter().any(|i| i.spec.mode() == Mode::Shape)
        || subscribers
            .iter()
            .any(|s| s.spec.plan.mode == Mode::Shape.value())
        || config.shape != Shape::default_settings();
    let out = FileOut {
        interface: vec![InterfaceOut {
            name: at.iface.clone(),
            direction: (at.direction != Direction::Ingress).then_some(at.direction.name()),
            // Egress is always tc: the hook is named only where it is a choice.
            hook: (tc && at.direction == Direction::Ingress).then_some(Hook::Tc.name()),
            tc_mode: tc.then_some(mode),
            rate: Rate::from_bps(config.rate_bps).to_string(),
            burst: Size::from_bytes(config.burst_bytes).to_string(),
            mode: Mode::from_value(config.mode).name(),
            ecn_threshold: shaping
                .then(|| Delay::from_ns(config.shape.ecn_threshold_ns).to_string()),
            horizon: shaping.then(|| Delay::from_ns(config.shape.horizon_ns).to_string()),
            key: key.name(),
            prefix_v4: config.prefix_v4,
            prefix_v6: config.prefix_v6,
            xdp_mode: (!tc).then_some(mode),
            max_sources: maps::sources_capacity(at)?,
            new_sources: KeysPerSec(a.new_sources),
            new_sources_burst: a.limited().then_some(a.new_sources_burst),
            meter2: (&config.meter2.limits()).into(),
            policy: policies.iter().map(|i| policy_out(&i.spec)).collect(),
            max_policies: Some(pinned.policy_room()).filter(|&n| n != DEFAULT_MAX_POLICIES),
            max_subscribers: room,
            subscriber: subscribers
                .iter()
                .map(|s| subscriber_out(&s.spec))
                .collect(),
        }],
    };
    Ok(toml::to_string(&out)?)
}
