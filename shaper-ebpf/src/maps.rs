//! The maps, named as userspace finds and pins them (`shaper_common::maps`).

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use shaper_common::maps::{
    AdmissionCells, Cell, Config, Counters, DEFAULT_MAX_SOURCES, DEFAULT_MAX_SUBSCRIBERS,
    EVENTS_BYTES, Ipv4Key, Ipv6Key, MAX_POLICIES, Meter2Cells, Policy, PolicyStats, Subscriber,
    TRACE_BUCKETS, TraceBucket, WATCH_ENTRIES, Watch, subscriber_entries, trie_entries,
};
use shaper_common::sources::{SourceBucket4, SourceBucket6, source_buckets};

/// The interface's settings and default policy: one entry, written by userspace (also
/// while attached, to change it).
#[map(name = "SHAPER_CONFIG")]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// One GCRA cell and counters per IPv4 key, in buckets of ways (`crate::sources`);
/// userspace sets the number of buckets at load time, and [`SOURCE_BUCKETS`] with it.
/// Mappable (`BPF_F_MMAPABLE`), so an upgrade can add to a live source's counters and cell
/// atomically from userspace (`shaper_user::table::top_up_v4`).
#[map(name = "SHAPER_SOURCES")]
pub static SOURCES: Array<SourceBucket4> =
    Array::with_max_entries(source_buckets(DEFAULT_MAX_SOURCES), BPF_F_MMAPABLE);

/// The same per IPv6 key, sized like `SOURCES`.
#[map(name = "SHAPER_SOURCES6")]
pub static SOURCES6: Array<SourceBucket6> =
    Array::with_max_entries(source_buckets(DEFAULT_MAX_SOURCES), BPF_F_MMAPABLE);

/// The buckets of `SOURCES` and of `SOURCES6`: set by userspace at load
/// time (`shaper_common::maps::GLOBAL_SOURCE_BUCKETS`), read-only to the program.
#[unsafe(no_mangle)]
pub static SHAPER_SOURCE_BUCKETS: u32 = source_buckets(DEFAULT_MAX_SOURCES);

/// [`SHAPER_SOURCE_BUCKETS`], as loaded.
#[inline(always)]
pub fn source_bucket_count() -> u32 {
    // SAFETY: a static; volatile, so the compiler does not fold the default in.
    unsafe { core::ptr::read_volatile(&raw const SHAPER_SOURCE_BUCKETS) }
}

/// Prefix policies by slot (slot 0, the default, lives in `CONFIG` instead).
#[map(name = "SHAPER_POLICIES")]
pub static POLICIES: Array<Policy> = Array::with_max_entries(MAX_POLICIES, 0);

/// IPv4 prefix → policy slot, or subscriber index with `SUBSCRIBER_BIT`; longest prefix
/// wins. Userspace sizes it at load time for the subscribers' prefixes too.
#[map(name = "SHAPER_PREFIX4")]
pub static PREFIXES_V4: LpmTrie<Ipv4Key, u32> =
    LpmTrie::with_max_entries(trie_entries(DEFAULT_MAX_SUBSCRIBERS), 0);

/// IPv6 prefix → policy slot or subscriber, as `PREFIXES_V4`.
#[map(name = "SHAPER_PREFIX6")]
pub static PREFIXES_V6: LpmTrie<Ipv6Key, u32> =
    LpmTrie::with_max_entries(trie_entries(DEFAULT_MAX_SUBSCRIBERS), 0);

/// Subscribers by index (`shaper_common::maps::Subscriber`); userspace sizes it at load
/// time (`--max-subscribers`).
#[map(name = "SHAPER_SUBS")]
pub static SUBSCRIBERS: Array<Subscriber> =
    Array::with_max_entries(subscriber_entries(DEFAULT_MAX_SUBSCRIBERS), 0);

/// The aggregate cell of each policy slot that has one.
#[map(name = "SHAPER_AGGS")]
pub static AGGREGATES: Array<Cell> = Array::with_max_entries(MAX_POLICIES, 0);

/// The new-source admission cell and the shared cell of unadmitted frames, per policy
/// slot (the default policy's at slot 0).
#[map(name = "SHAPER_ADMIT")]
pub static ADMISSION: Array<AdmissionCells> = Array::with_max_entries(MAX_POLICIES, 0);

/// Counters per policy slot, one entry per CPU.
#[map(name = "SHAPER_PSTATS")]
pub static POLICY_STATS: PerCpuArray<PolicyStats> = PerCpuArray::with_max_entries(MAX_POLICIES, 0);

/// Global counters, one entry per CPU.
#[map(name = "SHAPER_COUNTERS")]
pub static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// The layout version of these maps (`shaper_common::layout`), written by userspace and
/// pinned with them, so a later build knows how to read them. The program never reads it.
#[map(name = "SHAPER_LAYOUT")]
pub static LAYOUT: Array<u32> = Array::with_max_entries(1, 0);

/// What the counters of the programs this one replaced had counted (written once by the
/// upgrade that carried them over; userspace adds it to `COUNTERS`). Never read here.
#[map(name = "SHAPER_CARRIED")]
pub static COUNTERS_CARRIED: Array<Counters> = Array::with_max_entries(1, 0);

/// The same per policy slot, only for slots that carried something (userspace adds it to
/// `POLICY_STATS`). Never read here.
#[map(name = "SHAPER_PCARRIED")]
pub static POLICY_STATS_CARRIED: HashMap<u32, PolicyStats> =
    HashMap::with_max_entries(MAX_POLICIES, BPF_F_NO_PREALLOC);

/// Sampled events of refused frames, for `shaper watch` (`crate::watch`).
#[map(name = "SHAPER_EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Whether anyone watches, and the meter of the events (`shaper_common::maps::Watch`).
#[map(name = "SHAPER_WATCH")]
pub static WATCH: Array<Watch> = Array::with_max_entries(WATCH_ENTRIES, 0);

/// New-source admission's doorkeeper: traces of keys seen once (`crate::trace`).
#[map(name = "SHAPER_TRACES")]
pub static TRACES: Array<TraceBucket> = Array::with_max_entries(TRACE_BUCKETS, 0);

/// The cells of new-source admission's first-sighting allowance, per policy slot (the
/// default policy's at slot 0), metered where the slot's admission is.
#[map(name = "SHAPER_FIRSTS")]
pub static FIRSTS: Array<Cell> = Array::with_max_entries(MAX_POLICIES, 0);

/// The second meter's cells of each IPv4 key whose policy has one (`crate::meter2`), sized
/// like `SOURCES`.
#[map(name = "SHAPER_METER2")]
pub static METER2: LruHashMap<Ipv4Key, Meter2Cells> =
    LruHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// The same per IPv6 key.
#[map(name = "SHAPER_METER2_6")]
pub static METER2_6: LruHashMap<Ipv6Key, Meter2Cells> =
    LruHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// The second meter's cells the unadmitted frames of each policy slot share (the default
/// policy's at slot 0), beside their committed cell in `ADMISSION`.
#[map(name = "SHAPER_METER2_U")]
pub static METER2_SHARED: Array<Meter2Cells> = Array::with_max_entries(MAX_POLICIES, 0);
