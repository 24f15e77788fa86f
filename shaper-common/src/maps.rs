//! What the kernel programs and userspace exchange through maps and pins.
//!
//! Every type is `#[repr(C)]` with fixed-width fields and explicit padding, and its size
//! is asserted, because both sides read the same bytes.

use crate::gcra::Limit;

/// Root of shaper's pins on bpffs; each attachment has a directory below it.
pub const PIN_ROOT: &str = "/sys/fs/bpf/shaper";
/// Pin names inside an attachment's directory.
pub const PIN_LINK: &str = "link";
pub const PIN_CONFIG: &str = "config";
pub const PIN_SOURCES: &str = "sources";
pub const PIN_COUNTERS: &str = "counters";

/// Map names in the object file (at most 15 bytes: the kernel's name limit).
pub const MAP_CONFIG: &str = "SHAPER_CONFIG";
pub const MAP_SOURCES: &str = "SHAPER_SOURCES";
pub const MAP_COUNTERS: &str = "SHAPER_COUNTERS";

/// Program names in the object file.
pub const PROG_XDP: &str = "shaper_xdp";
/// An XDP program that passes everything: the baseline for per-packet cost figures.
pub const PROG_NOOP: &str = "shaper_noop";

/// Default size of the per-source map (`--max-sources`).
pub const DEFAULT_MAX_SOURCES: u32 = 262_144;

/// XDP attach modes as recorded in [`Config::xdp_mode`].
pub const XDP_MODE_NATIVE: u32 = 1;
pub const XDP_MODE_SKB: u32 = 2;

/// The policy in force on one interface: array map `SHAPER_CONFIG`, one entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// What the per-packet path uses.
    pub limit: Limit,
    /// What the operator asked for, kept for `status` (bits per second, bytes).
    pub rate_bps: u64,
    pub burst_bytes: u64,
    /// `XDP_MODE_*`: how the program is attached.
    pub xdp_mode: u32,
    /// Non-zero once userspace has written this entry; the program passes traffic
    /// untouched while it is zero (an all-zero limit would drop everything).
    pub active: u32,
}

const _: () = assert!(size_of::<Config>() == 48);

/// A source's GCRA cell and counters: value of the LRU hash map `SHAPER_SOURCES`, keyed by
/// the IPv4 source address as it is laid out in the packet (see [`Ipv4Key`]).
///
/// Every field is updated atomically: the cell with compare-and-swap, counters with
/// fetch-add, because all CPUs share one entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceState {
    /// Theoretical arrival time, in GCRA ticks (see [`crate::gcra`]).
    pub tat: u64,
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
}

const _: () = assert!(size_of::<SourceState>() == 40);

/// Key of `SHAPER_SOURCES`: the four address bytes in network order, read as a native u32
/// (`u32::from_ne_bytes(addr)`); userspace recovers them with `to_ne_bytes`.
pub type Ipv4Key = u32;

/// Global counters: per-CPU array map `SHAPER_COUNTERS`, one entry per CPU; sum them.
///
/// Bytes are whole frames as XDP sees them: Ethernet header to end of payload, no FCS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// IPv4 frames within the limit.
    pub passed_packets: u64,
    pub passed_bytes: u64,
    /// IPv4 frames over the limit.
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
    /// Frames that are not IPv4 (ARP, IPv6, ...): passed untouched.
    pub not_ipv4_packets: u64,
    pub not_ipv4_bytes: u64,
    /// Frames too short for their headers or with an invalid IPv4 header: passed untouched.
    pub malformed_packets: u64,
    pub malformed_bytes: u64,
    /// Sources seen for the first time (entries created in `SHAPER_SOURCES`).
    pub new_sources: u64,
    /// Packets dropped because the compare-and-swap lost every retry to other CPUs.
    pub cas_exhausted: u64,
    /// Packets passed unmetered because no cell could be created for their source.
    pub untracked_packets: u64,
    /// Packets passed untouched because no policy was configured yet.
    pub unconfigured_packets: u64,
}

const _: () = assert!(size_of::<Counters>() == 96);

impl Counters {
    /// Field-wise sum, for folding the per-CPU entries.
    pub fn add(&mut self, o: &Self) {
        self.passed_packets += o.passed_packets;
        self.passed_bytes += o.passed_bytes;
        self.dropped_packets += o.dropped_packets;
        self.dropped_bytes += o.dropped_bytes;
        self.not_ipv4_packets += o.not_ipv4_packets;
        self.not_ipv4_bytes += o.not_ipv4_bytes;
        self.malformed_packets += o.malformed_packets;
        self.malformed_bytes += o.malformed_bytes;
        self.new_sources += o.new_sources;
        self.cas_exhausted += o.cas_exhausted;
        self.untracked_packets += o.untracked_packets;
        self.unconfigured_packets += o.unconfigured_packets;
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each type is #[repr(C)], made only of integers, with no implicit padding
    // (sizes asserted above), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::SourceState {}
    unsafe impl aya::Pod for super::Counters {}
}
