//! `shaper attach IFACE --rate RATE --burst SIZE`: hold every source on IFACE to RATE.

use super::new_sources;
use anyhow::{Result, anyhow, bail};
use shaper_common::{
    gcra::{Limit, LimitError},
    maps::{Admission, DEFAULT_PREFIX_V4, DEFAULT_PREFIX_V6},
};
use shaper_user::{
    loader::{self, AdmissionRequest, AttachRequest, Attached, KeyBy, XdpAttachMode},
    pins::Attachment,
    policy::Mode,
    system,
    units::{Rate, Size},
};

/// Ethernet header bytes counted in every frame on top of the MTU.
const ETH_HLEN: u32 = 14;

/// Attach shaper to IFACE, or change its rate and burst in place if already attached.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Interface to police (its received traffic, per source address).
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
    /// Sources tracked at once per address family (least recently seen are evicted beyond
    /// this) [default: 262144]
    #[arg(long)]
    pub max_sources: Option<u32>,
    /// Which address gets a bucket: the source (senders) or the destination (receivers)
    /// [default: src]
    #[arg(long, value_enum)]
    pub key: Option<KeyBy>,
    /// IPv4 prefix length keys are masked to: 24 gives each /24 one bucket [default: 32]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=32))]
    pub prefix_v4: Option<u32>,
    /// IPv6 prefix length keys are masked to [default: 64, what one site is given]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=128))]
    pub prefix_v6: Option<u32>,
    /// enforce, or monitor: drop nothing on the whole interface and count what would be
    /// dropped [default: enforce; unchanged when updating]
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    #[command(flatten)]
    pub new_sources: new_sources::Flags,
}

/// Refuses a burst below one full-size frame on `iface`: such frames could never pass.
pub fn check_burst_fits(flag: &str, burst: Size, iface: &str) -> Result<()> {
    system::ifindex(iface)?;
    let frame = system::mtu(iface)? + ETH_HLEN;
    if burst.bytes() < u64::from(frame) {
        bail!(
            "{flag} {burst} is smaller than one full-size frame on {iface} ({frame} bytes: MTU {} + {ETH_HLEN}-byte Ethernet header), so such frames could never pass",
            frame - ETH_HLEN
        );
    }
    Ok(())
}

pub fn run(args: &Args, netns: Option<&str>) -> Result<()> {
    // The values first (naming the argument and the value given), then the interface.
    Limit::new(args.rate.bits_per_sec(), args.burst.bytes()).map_err(|e| match e {
        LimitError::RateTooLow | LimitError::RateTooHigh => {
            anyhow!("invalid --rate {}: {e}", args.rate)
        }
        LimitError::BurstZero | LimitError::BurstTooLong => {
            anyhow!("invalid --burst {}: {e}", args.burst)
        }
    })?;
    let admission = args.new_sources.admission()?;
    check_burst_fits("--burst", args.burst, &args.iface)?;
    let req = AttachRequest {
        at: Attachment::new(&args.iface, netns),
        rate_bps: args.rate.bits_per_sec(),
        burst_bytes: args.burst.bytes(),
        xdp_mode: args.xdp_mode,
        max_sources: args.max_sources,
        key: args.key,
        prefix_v4: args.prefix_v4,
        prefix_v6: args.prefix_v6,
        mode: args.mode,
        admission: admission.map_or(AdmissionRequest::Unchanged, AdmissionRequest::Exactly),
        policies: None,
    };
    let _lock = system::lock()?;
    let admitted = match admission.filter(Admission::limited) {
        Some(a) => format!(
            ", new sources {}",
            new_sources::describe(a.new_sources, a.new_sources_burst)
        ),
        None => String::new(),
    };
    match loader::attach(&req)? {
        Attached::New { xdp_mode } => println!(
            "attached to {} ({} XDP{}): rate {} burst {} per {} /{} (IPv6 /{}){admitted}",
            req.at.label(),
            loader::mode_name(xdp_mode),
            if args.mode == Some(Mode::Monitor) {
                ", monitor only"
            } else {
                ""
            },
            args.rate,
            args.burst,
            match req.key.unwrap_or(KeyBy::Src) {
                KeyBy::Src => "source",
                KeyBy::Dst => "destination",
            },
            req.prefix_v4.unwrap_or(DEFAULT_PREFIX_V4),
            req.prefix_v6.unwrap_or(DEFAULT_PREFIX_V6),
        ),
        Attached::Updated { .. } => println!(
            "updated {}: rate {} burst {} per source{admitted}",
            req.at.label(),
            args.rate,
            args.burst
        ),
    }
    Ok(())
}
