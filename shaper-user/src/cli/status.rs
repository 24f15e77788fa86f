//! `shaper status [IFACE]`: what is attached where, and how.

use super::{Scope, meter2};
use anyhow::Result;
use serde::Serialize;
use shaper_common::{config::Meter2Limits, layout::LAYOUT_VERSION};
use shaper_user::{
    admission, link, maps,
    pins::{self, Attachment},
    policy::Mode,
    request, system,
    units::{Delay, Rate, Size},
    upgrade,
};

/// Show where shaper is attached, its mode, rate, burst and map fill.
///
/// One line per attachment of the namespace (both directions): the hook and how it is
/// attached, the mode, the default policy's rate and burst (and its excess rate and
/// packet rate, if attached with them), the key and its prefixes,
/// the sources tracked of the map's size per family, the new-source admission, and the
/// pin layout. An attachment whose interface is gone is marked so (detach removes its
/// pins), one whose program is off its interface (made again, or its clsact filter or
/// qdisc removed) is marked not attached; one an older shaper made shows its layout and the attach that upgrades it.
/// With -j, a JSON array whose keys carry their unit (rate_bits_per_sec, burst_bytes).
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    /// Only this interface (in the namespace chosen with -n).
    pub iface: Option<String>,
}

const EXAMPLES: &str = "\
Examples:
  shaper status
      Every attachment of this namespace.
  shaper -j status eth0
      eth0's attachments as JSON.
";

#[derive(Debug, Serialize)]
struct Row {
    interface: String,
    netns: Option<String>,
    /// `ingress` or `egress`.
    direction: &'static str,
    /// `xdp` or `tc`.
    hook: &'static str,
    /// How it is attached: `native` or `skb` (XDP), `tcx` or `clsact` (tc).
    xdp_mode: &'static str,
    /// False once the interface is gone: the pins hold nothing until `detach` removes them.
    interface_present: bool,
    /// Whether the kernel runs the program on the interface (its link, or its filter on
    /// the clsact qdisc): false once the interface is gone or made again, or the filter
    /// or qdisc removed; `attach` (or the daemon) attaches it again over its pins.
    attached: bool,
    rate_bits_per_sec: u64,
    burst_bytes: u64,
    /// `enforce`, `monitor` or `shape`: the default policy's (monitor: the interface's).
    mode: &'static str,
    /// Shaping's ECN threshold and horizon (used by whatever is in shape mode).
    ecn_threshold_ns: u64,
    horizon_ns: u64,
    /// `src` or `dst`: which address picks a frame's bucket.
    key: &'static str,
    prefix_v4_bits: u32,
    prefix_v6_bits: u32,
    /// Both families; each has its own map of `max_sources`.
    sources_tracked: usize,
    ipv4_sources_tracked: usize,
    ipv6_sources_tracked: usize,
    max_sources: u32,
    /// Prefix policies and subscribers' plans the attachment has room for
    /// (`--max-policies`).
    max_policies: u32,
    /// New-source admission of the default policy; zero: unlimited.
    new_sources_per_sec: u64,
    new_sources_burst: u64,
    /// The default policy's second meter: an excess rate (zero: none; `attach
    /// --excess-rate`), its burst and the DSCP its frames are marked with (0 to 63); a
    /// packet rate (zero: none) and burst, in packets.
    excess_rate_bits_per_sec: u64,
    excess_burst_bytes: u64,
    excess_dscp: u8,
    packet_rate_per_sec: u64,
    packet_burst: u64,
    pin_dir: String,
    /// The layout of the pins (`shaper_common::layout`); below this shaper's, an older
    /// shaper attached it and `attach` with the same settings upgrades it in place.
    layout_version: u32,
    /// An upgrade was killed after swapping the pins: `attach` finishes it.
    upgrade_interrupted: bool,
}

fn row(at: &Attachment) -> Result<Row> {
    // Read as today's types, whatever layout the pins have.
    let (layout, settings) = upgrade::settings_of(at)?;
    let config = settings.config;
    let v4 = maps::read_sources(at)?.len();
    let v6 = maps::read_sources6(at)?.len();
    Ok(Row {
        interface: at.iface.clone(),
        netns: at.netns.clone(),
        direction: at.direction.name(),
        hook: request::Hook::of_mode(config.xdp_mode).name(),
        xdp_mode: request::mode_name(config.xdp_mode),
        interface_present: system::ifindex(&at.iface).is_ok(),
        attached: link::is_live(at),
        rate_bits_per_sec: config.rate_bps,
        burst_bytes: config.burst_bytes,
        mode: Mode::from_value(config.mode).name(),
        ecn_threshold_ns: config.shape.ecn_threshold_ns,
        horizon_ns: config.shape.horizon_ns,
        key: request::key_name(config.key_by),
        prefix_v4_bits: config.prefix_v4,
        prefix_v6_bits: config.prefix_v6,
        sources_tracked: v4 + v6,
        ipv4_sources_tracked: v4,
        ipv6_sources_tracked: v6,
        max_sources: maps::sources_capacity(at)?,
        max_policies: upgrade::max_policies(at),
        new_sources_per_sec: config.admission.new_sources,
        new_sources_burst: config.admission.new_sources_burst,
        excess_rate_bits_per_sec: config.meter2.excess_rate_bps,
        excess_burst_bytes: config.meter2.excess_burst_bytes,
        excess_dscp: config.meter2.excess_dscp,
        packet_rate_per_sec: config.meter2.packet_rate,
        packet_burst: config.meter2.packet_burst,
        pin_dir: at.dir().display().to_string(),
        layout_version: layout.version,
        upgrade_interrupted: upgrade::interrupted(at),
    })
}

pub fn run(args: &Args, scope: Scope<'_>, json: bool) -> Result<()> {
    let attachments = match &args.iface {
        Some(iface) => {
            let at = scope.at(iface);
            if !at.exists() {
                anyhow::bail!("shaper is not attached to {}", at.label());
            }
            vec![at]
        }
        None => pins::list_all()?,
    };
    let rows = attachments.iter().map(row).collect::<Result<Vec<_>>>()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("shaper is not attached anywhere");
    }
    for (at, r) in attachments.iter().zip(&rows) {
        let gone = match (r.interface_present, r.attached) {
            (false, _) => " [interface gone: detach to remove its pins]",
            (true, false) => {
                " [not attached: its program is off the interface; attach (or the daemon) attaches it again over its pins]"
            }
            (true, true) => "",
        };
        let older = if r.upgrade_interrupted {
            " [upgrade interrupted: attach with the same settings finishes it]"
        } else if r.layout_version < LAYOUT_VERSION {
            " [attached by an older shaper: attach with the same settings upgrades it in place]"
        } else {
            ""
        };
        let shaping = if r.mode == Mode::Shape.name() {
            format!(
                ", shape (ECN threshold {}, horizon {})",
                Delay::from_ns(r.ecn_threshold_ns),
                Delay::from_ns(r.horizon_ns)
            )
        } else {
            String::new()
        };
        let meter2 = meter2::describe(&Meter2Limits {
            excess_rate_bps: r.excess_rate_bits_per_sec,
            excess_burst_bytes: r.excess_burst_bytes,
            excess_dscp: r.excess_dscp,
            packet_rate: r.packet_rate_per_sec,
            packet_burst: r.packet_burst,
        });
        println!(
            "{}: {} {} rate {} burst {}{meter2}{shaping} per {} /{} (IPv6 /{}), sources {}/{} IPv4 {}/{} IPv6, new sources {}, pin layout {}{gone}{older}",
            at.label(),
            r.hook,
            r.xdp_mode,
            Rate::from_bps(r.rate_bits_per_sec),
            Size::from_bytes(r.burst_bytes),
            r.key,
            r.prefix_v4_bits,
            r.prefix_v6_bits,
            r.ipv4_sources_tracked,
            r.max_sources,
            r.ipv6_sources_tracked,
            r.max_sources,
            admission::describe(r.new_sources_per_sec, r.new_sources_burst),
            r.layout_version,
        );
    }
    Ok(())
}
