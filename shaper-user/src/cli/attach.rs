//! `shaper attach IFACE --rate RATE --burst SIZE`: hold every source on IFACE to RATE.

use super::Scope;
use anyhow::{Result, anyhow};
use shaper_common::{
    config::RateLimit,
    layout,
    maps::{
        Admission, DEFAULT_ECN_THRESHOLD_NS, DEFAULT_HORIZON_NS, DEFAULT_PREFIX_V4,
        DEFAULT_PREFIX_V6,
    },
};
use shaper_user::{
    admission,
    attach::{AttachError, Attached},
    change::{self, ChangeError},
    policy::Mode,
    request::{self, AdmissionRequest, AttachRequest, Hook, KeyBy, RequestError, XdpAttachMode},
    setting::Setting,
    system,
    tc::TcAttachMode,
    units::{Delay, Rate, Size},
};

use super::{flag, meter2, new_sources};

/// Attach shaper to IFACE, or change its rate and burst in place if already attached.
///
/// Every source address sending to IFACE (IPv4, or IPv6 by /64) is held to RATE, with
/// bursts of up to BURST: a frame over the limit is dropped on arrival (XDP), never
/// queued. Link-local, unspecified and multicast addresses (fe80::/10, ::/8, ff00::/8,
/// 169.254.0.0/16, 0.0.0.0/8, 224.0.0.0/3) are each a key of their own whatever the
/// prefixes, so one host flooding from a link-local address drains only that address's
/// bucket, not its neighbours' neighbour discovery; a host spoofing another's address
/// still drains that one (see shaper-policy(8) to exempt a gateway's, or to hold them
/// together with an aggregate). With --direction egress, what IFACE sends is held
/// instead, per destination (tc). RATE and BURST are the default policy: what every source that no prefix policy
/// covers gets (see shaper-policy(8)).
///
/// The program and its maps are pinned under /sys/fs/bpf/shaper/IFACE/ (egress:
/// .../IFACE/egress/, with -n NETNS: /sys/fs/bpf/shaper/netns/NETNS/IFACE/), so the
/// limit stays after the command exits, until shaper-detach(8).
///
/// On an interface that already has shaper, attach changes the rate, burst, mode,
/// shaping times and new-source admission in place and leaves what it does not name as
/// it is: the program stays, no packet goes unmetered, every source keeps its bucket
/// (rescaled to the new rate, never refilled). A bigger --max-sources grows the source
/// tables in place, every source moved with its bucket and counters (through the link, as
/// an upgrade: not on clsact). What a bucket is kept for cannot change that way and is
/// refused in one line: a smaller --max-sources, --hook, --xdp-mode, --tc-mode, --key and
/// the prefixes (detach first). On an interface an older shaper attached,
/// attach with the same settings upgrades it in place, every bucket and counter kept. On
/// an interface deleted and made again, whose pins stayed, attach links the program to
/// them again: its sources, policies and counters go on from where they were.
///
/// All or nothing: an error is one line naming the bad value, and leaves nothing
/// attached or pinned. A burst below one full-size frame of IFACE is refused (such a
/// frame could never pass). Needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN.
#[derive(Debug, clap::Args)]
#[command(after_long_help = EXAMPLES)]
pub struct Args {
    /// Interface to police (what it receives, per source address; with --direction
    /// egress, what it sends, per destination address).
    pub iface: String,
    /// Rate per source, in tc units: 10mbit, 1gbit, 500kbit, 1mbps (bytes/s), ...
    #[arg(long)]
    pub rate: Rate,
    /// Burst per source, in tc units: 64k (65536 bytes), 1m, 1514b, ...
    #[arg(long)]
    pub burst: Size,
    /// How to attach the XDP program.
    #[arg(long, value_enum, default_value_t = XdpAttachMode::Auto)]
    pub xdp_mode: XdpAttachMode,
    /// Where the program runs: xdp (ingress only) or tc (either direction) [default: xdp
    /// for ingress, tc for egress]
    #[arg(long, value_enum)]
    pub hook: Option<Hook>,
    /// How to attach the tc program.
    #[arg(long, value_enum, default_value_t = TcAttachMode::Auto)]
    pub tc_mode: TcAttachMode,
    /// Sources tracked at once per address family, in buckets of 8 (beyond it, only a source
    /// whose bucket is full again gives its place up); bigger on a live attachment grows
    /// its tables in place [default: 262144]
    #[arg(long)]
    pub max_sources: Option<u32>,
    /// Subscribers the attachment has room for (`shaper subscriber`), fixed at attach:
    /// 112 bytes of kernel memory each, and room in the prefix tries for 4 prefixes each
    /// (allocated only as they are used) [default: 0]
    #[arg(long)]
    pub max_subscribers: Option<u32>,
    /// Prefix policies and subscribers' plans the attachment has room for, fixed at
    /// attach, 1 to 16383: every slot costs memory whether used or not, its counters once
    /// per CPU (184 bytes a CPU, and about 420 more) [default: 1024]
    #[arg(long)]
    pub max_policies: Option<u32>,
    /// Which address gets a bucket: the source (senders) or the destination (receivers)
    /// [default: src for ingress, dst for egress]
    #[arg(long, value_enum)]
    pub key: Option<KeyBy>,
    /// IPv4 prefix length keys are masked to: 24 gives each /24 one bucket [default: 32]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=32))]
    pub prefix_v4: Option<u32>,
    /// IPv6 prefix length keys are masked to (link-local, unspecified and multicast
    /// addresses are keyed whole) [default: 64, what one site is given]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=128))]
    pub prefix_v6: Option<u32>,
    /// enforce, or monitor: drop nothing on the whole interface and count what would be
    /// dropped [default: enforce; unchanged when updating]
    /// [shape: egress only, needs sch_fq as the root qdisc]
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Shape mode: mark ECN-capable packets CE when held back longer than this (tc
    /// times: 5ms, 500us) [default: 5ms; unchanged when updating]
    #[arg(long)]
    pub ecn_threshold: Option<Delay>,
    /// Shape mode: drop a packet rather than hold it back longer than this [default:
    /// 50ms; unchanged when updating]
    #[arg(long)]
    pub horizon: Option<Delay>,
    #[command(flatten)]
    pub new_sources: new_sources::Flags,
    #[command(flatten)]
    pub meter2: meter2::SecondMeter,
}

const EXAMPLES: &str = "\
Examples:
  shaper attach eth0 --rate 10mbit --burst 64k
      Every source address sending to eth0 gets at most 10 Mbit/s, bursts of 64 KiB.
  shaper attach eth0 --rate 20mbit --burst 128k
      Change it in place: no detach, no gap, every source keeps its bucket.
  shaper attach eth1 --rate 10mbit --burst 64k --new-sources 2000 --new-sources-burst 100000
      At most 100000 new addresses at once, then 2000 a second, get a bucket of their own;
      the frames of the rest (a spoofed flood) share one bucket at 10 Mbit/s.
  shaper attach eth0 --direction egress --rate 10mbit --burst 128k --mode monitor
      Count what each destination would have dropped of what eth0 sends; drop nothing.
";

/// Refuses a burst (given as `flag value`) below one full-size frame on `iface`: such
/// frames could never pass.
pub fn check_burst_fits(flag: &str, burst: Size, iface: &str) -> Result<()> {
    system::check_burst_fits(iface, burst.bytes()).map_err(|e| match e {
        system::SystemError::BurstBelowFrame { .. } => anyhow!("{flag} {burst}: {e}"),
        e => e.into(),
    })
}

/// The library's error, with a setting named by its flag.
fn flagged(e: AttachError) -> anyhow::Error {
    match e {
        AttachError::Request(RequestError::Setting { setting, problem }) => {
            anyhow!("{} {problem}", flag(setting))
        }
        e => e.into(),
    }
}

pub fn run(args: &Args, scope: Scope<'_>) -> Result<()> {
    // The values first (naming the argument and the value given), then the interface.
    let rate = RateLimit::new(args.rate.bits_per_sec(), args.burst.bytes()).map_err(|e| {
        let given = match Setting::of_limit(e.field()) {
            Setting::Rate => args.rate.to_string(),
            _ => args.burst.to_string(),
        };
        anyhow!("invalid --{} {given}: {e}", e.field())
    })?;
    let admission = args.new_sources.of_interface()?;
    let meter2 = args.meter2.limits()?;
    check_burst_fits("--burst", args.burst, &args.iface)?;
    let req = AttachRequest {
        at: scope.at(&args.iface),
        rate,
        meter2,
        hook: args.hook,
        xdp_mode: args.xdp_mode,
        tc_mode: args.tc_mode,
        max_sources: args.max_sources,
        growing: false,
        max_subscribers: args.max_subscribers,
        max_policies: args.max_policies,
        subscribers: None,
        key: args.key,
        prefix_v4: args.prefix_v4,
        prefix_v6: args.prefix_v6,
        mode: args.mode,
        ecn_threshold_ns: args.ecn_threshold.map(Delay::ns),
        horizon_ns: args.horizon.map(Delay::ns),
        admission: admission.map_or(AdmissionRequest::Unchanged, AdmissionRequest::Exactly),
        policies: None,
    };
    let admitted = match admission.filter(Admission::limited) {
        Some(a) => format!(
            ", new sources {}",
            admission::describe(a.new_sources, a.new_sources_burst)
        ),
        None => String::new(),
    };
    let admitted = format!("{}{admitted}", meter2::describe(&meter2));
    let attached = change::attach(&req).map_err(|e| match e {
        ChangeError::Attach(e) => flagged(e),
        e => e.into(),
    })?;
    match attached {
        Attached::New { xdp_mode } => println!(
            "attached to {} ({}{}): rate {} burst {} per {} /{} (IPv6 /{}){admitted}",
            req.at.label(),
            match Hook::of_mode(xdp_mode) {
                Hook::Xdp => format!("{} XDP", request::mode_name(xdp_mode)),
                Hook::Tc => format!("tc {}", request::mode_name(xdp_mode)),
            },
            match req.mode {
                Some(Mode::Monitor) => ", monitor only".to_owned(),
                Some(Mode::Shape) => format!(
                    ", shaping: ECN threshold {}, horizon {}",
                    args.ecn_threshold
                        .unwrap_or(Delay::from_ns(DEFAULT_ECN_THRESHOLD_NS)),
                    args.horizon.unwrap_or(Delay::from_ns(DEFAULT_HORIZON_NS))
                ),
                _ => String::new(),
            },
            args.rate,
            args.burst,
            match req.key.unwrap_or(request::default_key(req.at.direction)) {
                KeyBy::Src => "source",
                KeyBy::Dst => "destination",
            },
            req.prefix_v4.unwrap_or(DEFAULT_PREFIX_V4),
            req.prefix_v6.unwrap_or(DEFAULT_PREFIX_V6),
        ),
        Attached::Upgraded { from, .. } => println!(
            "upgraded {} in place from pin layout {from} to {}: new program, every source's bucket and the counters kept",
            req.at.label(),
            layout::LAYOUT_VERSION
        ),
        Attached::Updated { grown, .. } => println!(
            "updated {}: rate {} burst {} per source{admitted}{}",
            req.at.label(),
            args.rate,
            args.burst,
            grown.map_or(String::new(), |n| format!(
                "; source tables grown to {n} keys a family, every source's bucket and counters kept"
            ))
        ),
        Attached::Relinked { .. } => println!(
            "attached {} again over its pins (the interface was made again, or its program taken off it): every source's bucket, the policies and the counters kept; rate {} burst {} per source{admitted}",
            req.at.label(),
            args.rate,
            args.burst
        ),
    }
    Ok(())
}
