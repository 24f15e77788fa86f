//! The maps, named as userspace finds and pins them (`shaper_common::maps`).

use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
};
use shaper_common::{
    maps::{Config, Counters, DEFAULT_MAX_SOURCES, Ipv4Key, Ipv6Key, SourceState},
    softirq::SoftirqTime,
};

/// The policy: one entry, written by userspace (also while attached, to change it).
#[map(name = "SHAPER_CONFIG")]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// One GCRA cell and counters per IPv4 key; userspace sets the size at load time.
#[map(name = "SHAPER_SOURCES")]
pub static SOURCES: LruHashMap<Ipv4Key, SourceState> =
    LruHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// The same per IPv6 key, sized like `SOURCES`.
#[map(name = "SHAPER_SOURCES6")]
pub static SOURCES6: LruHashMap<Ipv6Key, SourceState> =
    LruHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// Global counters, one entry per CPU.
#[map(name = "SHAPER_COUNTERS")]
pub static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// Softirq time per CPU, for the benchmark only (`softirq`).
#[map(name = "SHAPER_SOFTIRQ")]
pub static SOFTIRQ: PerCpuArray<SoftirqTime> = PerCpuArray::with_max_entries(1, 0);
