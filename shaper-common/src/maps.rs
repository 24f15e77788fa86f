//! What the kernel programs and userspace exchange through maps and pins.
//!
//! Every type is `#[repr(C)]` with fixed-width fields and explicit padding, and its size
//! is asserted, because both sides read the same bytes.

use core::mem::offset_of;

use crate::{gcra::Limit, shape::DELAY_BUCKETS};

/// Root of shaper's pins on bpffs; each attachment has a directory below it.
pub const PIN_ROOT: &str = "/sys/fs/bpf/shaper";
/// Pin names inside an attachment's directory.
pub const PIN_LINK: &str = "link";
pub const PIN_CONFIG: &str = "config";
pub const PIN_SOURCES: &str = "sources";
pub const PIN_SOURCES6: &str = "sources6";
pub const PIN_COUNTERS: &str = "counters";
pub const PIN_POLICIES: &str = "policies";
pub const PIN_PREFIXES_V4: &str = "prefixes_v4";
pub const PIN_PREFIXES_V6: &str = "prefixes_v6";
pub const PIN_AGGREGATES: &str = "aggregates";
pub const PIN_POLICY_STATS: &str = "policy_stats";
pub const PIN_ADMISSION: &str = "admission";
/// Subscribers ([`Subscriber`]), by index.
pub const PIN_SUBSCRIBERS: &str = "subscribers";
/// The layout version of the pins beside it ([`crate::layout`]).
pub const PIN_LAYOUT: &str = "layout";
/// Counts carried over from the counters of an earlier program by an upgrade.
pub const PIN_COUNTERS_CARRIED: &str = "counters_carried";
pub const PIN_POLICY_STATS_CARRIED: &str = "policy_stats_carried";
/// Sampled events of refused frames (`shaper watch`): a ring buffer.
pub const PIN_EVENTS: &str = "events";
/// Whether and how fast the program samples them ([`Watch`]).
pub const PIN_WATCH: &str = "watch";
/// Traces of keys seen once, new-source admission's doorkeeper ([`TraceBucket`]).
pub const PIN_TRACES: &str = "traces";
/// The cells of the first-sighting allowance of new-source admission ([`Admission`]), by
/// policy slot.
pub const PIN_FIRSTS: &str = "first_sightings";
/// The second meter's cells of each key whose policy has one ([`Meter2Cells`]), IPv4 and
/// IPv6, and those its policy's unadmitted frames share, by policy slot.
pub const PIN_METER2: &str = "meter2";
pub const PIN_METER2_6: &str = "meter2_6";
pub const PIN_METER2_SHARED: &str = "meter2_unadmitted";
/// While an upgrade is under way: the program the link is being switched to.
pub const PIN_UPGRADE_PROG: &str = "upgrade_prog";
/// A tc program attached with clsact and `cls_bpf`, which has no bpf_link to pin: the
/// program itself is pinned in the link's stead.
pub const PIN_TC_PROG: &str = "tc_prog";

/// Map names in the object file (at most 15 bytes: the kernel's name limit).
pub const MAP_CONFIG: &str = "SHAPER_CONFIG";
pub const MAP_SOURCES: &str = "SHAPER_SOURCES";
pub const MAP_SOURCES6: &str = "SHAPER_SOURCES6";
pub const MAP_COUNTERS: &str = "SHAPER_COUNTERS";
pub const MAP_POLICIES: &str = "SHAPER_POLICIES";
pub const MAP_PREFIXES_V4: &str = "SHAPER_PREFIX4";
pub const MAP_PREFIXES_V6: &str = "SHAPER_PREFIX6";
pub const MAP_AGGREGATES: &str = "SHAPER_AGGS";
pub const MAP_POLICY_STATS: &str = "SHAPER_PSTATS";
pub const MAP_ADMISSION: &str = "SHAPER_ADMIT";
pub const MAP_SUBSCRIBERS: &str = "SHAPER_SUBS";
pub const MAP_LAYOUT: &str = "SHAPER_LAYOUT";
pub const MAP_COUNTERS_CARRIED: &str = "SHAPER_CARRIED";
pub const MAP_POLICY_STATS_CARRIED: &str = "SHAPER_PCARRIED";
pub const MAP_EVENTS: &str = "SHAPER_EVENTS";
pub const MAP_WATCH: &str = "SHAPER_WATCH";
pub const MAP_TRACES: &str = "SHAPER_TRACES";
pub const MAP_FIRSTS: &str = "SHAPER_FIRSTS";
pub const MAP_METER2: &str = "SHAPER_METER2";
pub const MAP_METER2_6: &str = "SHAPER_METER2_6";
pub const MAP_METER2_SHARED: &str = "SHAPER_METER2_U";

/// The program's global (`.rodata`) that says how many buckets `SHAPER_SOURCES` and
/// `SHAPER_SOURCES6` have (`crate::sources::source_buckets`), set at load time.
pub const GLOBAL_SOURCE_BUCKETS: &str = "SHAPER_SOURCE_BUCKETS";

/// The maps sized at attach (`--max-sources`): buckets of ways (`crate::sources`) for that
/// many keys of its family.
pub const SIZED_BY_SOURCES: [&str; 2] = [MAP_SOURCES, MAP_SOURCES6];
/// The second meter's per-key maps: sized as [`SIZED_BY_SOURCES`] on an attachment where
/// the default policy or a prefix policy has a second meter, otherwise
/// [`METER2_UNUSED_ENTRIES`] (the per-packet path never looks into them then), and grown
/// in place when one is set.
pub const METER2_PER_KEY: [&str; 2] = [MAP_METER2, MAP_METER2_6];
/// The size of [`METER2_PER_KEY`] on an attachment no policy of which has a second meter:
/// the smallest LRU hash the kernel makes (an LRU hash shared by every CPU takes 1).
pub const METER2_UNUSED_ENTRIES: u32 = 1;

/// Program names in the object file.
pub const PROG_XDP: &str = "shaper_xdp";
pub const PROG_TC: &str = "shaper_tc";

/// How many times the kernel program tries a compare-and-swap on a cell before it gives
/// up on the frame ([`Counters::cas_exhausted`]); [`Counters::cas_won`] counts by try.
pub const CAS_TRIES: usize = 4;

/// Default size of each per-source map (`--max-sources`).
pub const DEFAULT_MAX_SOURCES: u32 = 262_144;

/// How the program is attached, as recorded in [`Config::xdp_mode`]: native or generic
/// XDP, or tc through TCX or clsact (one field for both hooks, so the layout of the
/// settings entry is the same whatever the hook).
pub const XDP_MODE_NATIVE: u32 = 1;
pub const XDP_MODE_SKB: u32 = 2;
pub const TC_MODE_TCX: u32 = 3;
/// clsact with a `cls_bpf` filter, on a clsact qdisc that was there before shaper.
pub const TC_MODE_CLSACT: u32 = 4;
/// The same on a clsact qdisc shaper added, which it removes when the last of the
/// interface's clsact attachments is detached.
pub const TC_MODE_CLSACT_OWN: u32 = 5;

/// Whether an attach mode ([`Config::xdp_mode`]) is a tc one.
pub const fn is_tc_mode(mode: u32) -> bool {
    matches!(mode, TC_MODE_TCX | TC_MODE_CLSACT | TC_MODE_CLSACT_OWN)
}

/// What a frame is keyed by, as recorded in [`Config::key_by`].
pub const KEY_BY_SRC: u32 = 0;
pub const KEY_BY_DST: u32 = 1;

/// Default prefix lengths a key is masked to. IPv6 keys by /64 because that is the
/// smallest block an end site is given: one host can pick any of 2^64 addresses in it, so
/// /128 keys would hand an attacker as many buckets as it likes.
pub const DEFAULT_PREFIX_V4: u32 = 32;
pub const DEFAULT_PREFIX_V6: u32 = 64;

/// The value of a prefix trie's route that is a subscriber's prefix: this bit and the
/// subscriber's index in `SHAPER_SUBS` ([`Subscriber`]). A value without it is a policy
/// slot. A source caches the value its key resolved to ([`SourceState::policy`]).
pub const SUBSCRIBER_BIT: u32 = 1 << 31;

/// Set in [`Config::prefixes_v4`] (and `prefixes_v6`) while subscribers may have
/// prefixes of the family in its trie (the low bits count the prefix policies): a key new
/// to the table then searches the trie even where no prefix policy is.
pub const SUBSCRIBER_PREFIXES: u32 = 1 << 31;

/// Default `--max-subscribers`: none. `SHAPER_SUBS` then has the one entry the kernel
/// needs at least (index 0, never a subscriber's), and the tries room for the prefix
/// policies alone: an attachment without subscribers pays nothing for them.
pub const DEFAULT_MAX_SUBSCRIBERS: u32 = 0;

/// The most `--max-subscribers` may be (`SUBSCRIBER_BIT` leaves the index 31 bits; the
/// tries' size is kept below `u32::MAX`).
pub const MAX_SUBSCRIBERS: u32 = 16_000_000;

/// Trie routes each subscriber has room for on average (the tries are made for
/// [`MAX_POLICIES`] prefix policies and this many prefixes a subscriber: LPM tries
/// allocate a route when it is inserted, so the room costs nothing until used).
pub const PREFIXES_PER_SUBSCRIBER: u32 = 4;

/// The entries of `SHAPER_SUBS` for `max_subscribers` subscribers: index 0 is never one.
pub const fn subscriber_entries(max_subscribers: u32) -> u32 {
    max_subscribers + 1
}

/// The entries of each prefix trie for `max_subscribers` subscribers.
pub const fn trie_entries(max_subscribers: u32) -> u32 {
    MAX_POLICIES + PREFIXES_PER_SUBSCRIBER * max_subscribers
}

/// The longest subscriber id and name, in bytes (kept by userspace, in a file of records
/// beside the pins: the kernel entry holds [`Subscriber::id_hash`] alone).
pub const SUBSCRIBER_ID_BYTES: usize = 32;
pub const SUBSCRIBER_NAME_BYTES: usize = 24;

/// A subscriber: array map `SHAPER_SUBS`, indexed by the subscriber's index (a trie
/// route's value with [`SUBSCRIBER_BIT`]; index 0 is never one). Every frame of any of its
/// prefixes is metered by the rule of its plan (a policy slot whose [`Policy::plan`] is
/// set), with `cell` where a prefix policy's aggregate cell would be: one bucket for all
/// of its prefixes, every CPU sharing it. A plan with an excess rate (a committed and a
/// peak rate) passes what `cell` refuses but `excess` takes, marked (yellow).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Subscriber {
    /// The subscriber's bucket, at its plan's aggregate limit (its committed rate).
    pub cell: Cell,
    /// Its excess bucket, at its plan's excess limit (`Meter2::excess`); unused without.
    pub excess: Cell,
    /// The policy slot of its plan.
    pub plan: u32,
    /// Non-zero while the index holds a subscriber.
    pub in_use: u32,
    /// Its frames: passed, dropped, would drop (every CPU adds to them, atomically).
    pub outcomes: Outcomes,
    /// Of its passed frames, those the excess bucket passed (yellow).
    pub yellow_packets: u64,
    pub yellow_bytes: u64,
    /// A hash of its id (never zero once the entry was used; zero: never used), written
    /// and read by userspace only: its id and name are in userspace's record of the same
    /// index, which this says is the entry's.
    pub id_hash: u64,
}

const _: () = assert!(size_of::<Subscriber>() == 112);
const _: () = assert!(offset_of!(Subscriber, excess) == 16);
const _: () = assert!(offset_of!(Subscriber, plan) == 32);
const _: () = assert!(offset_of!(Subscriber, outcomes) == 40);
const _: () = assert!(offset_of!(Subscriber, yellow_packets) == 88);
const _: () = assert!(offset_of!(Subscriber, id_hash) == 104);

/// The most policy slots an interface may have ([`SIZED_BY_POLICIES`]), slot
/// [`DEFAULT_SLOT`] included: `--max-policies` is at most one less. Also the prefix tries'
/// room for prefix policies.
pub const MAX_POLICIES: u32 = 16_384;
/// Prefix policies and subscribers' plans an attachment has room for unless told
/// (`--max-policies`): its [`SIZED_BY_POLICIES`] maps have one slot more (the default's).
/// Every slot costs memory whether used or not, about 420 bytes and `SHAPER_PSTATS`'s 184
/// on every possible CPU: by memlock on 2 CPUs, 0.8 MB at 1,024 against 12.7 MB at
/// 16,383 (every attachment's before layout 10); on 64 CPUs about 12.5 MB against 200 MB.
pub const DEFAULT_MAX_POLICIES: u32 = 1_024;
/// The maps of one entry per policy slot, sized at attach by `--max-policies`
/// ([`policy_entries`]).
pub const SIZED_BY_POLICIES: [&str; 7] = [
    MAP_POLICIES,
    MAP_AGGREGATES,
    MAP_ADMISSION,
    MAP_POLICY_STATS,
    MAP_POLICY_STATS_CARRIED,
    MAP_FIRSTS,
    MAP_METER2_SHARED,
];

/// The entries of each of [`SIZED_BY_POLICIES`] for `max_policies` policies: slot
/// [`DEFAULT_SLOT`] is the default's.
pub const fn policy_entries(max_policies: u32) -> u32 {
    max_policies + 1
}
/// The slot of the interface's default policy (the attach rate, from [`Config`]): what a
/// source no prefix policy covers is metered by. Its `SHAPER_POLICIES` entry is unused.
pub const DEFAULT_SLOT: u32 = 0;

/// What a policy does with its sources' packets, as recorded in [`Policy::action`].
/// Meter each source (and the prefix, with an aggregate) against the policy's limits.
pub const ACTION_LIMIT: u32 = 0;
/// Exempt: never metered, always passed, still counted.
pub const ACTION_PASS: u32 = 1;
/// Blocked: every packet dropped.
pub const ACTION_DROP: u32 = 2;

/// Whether drops are carried out, as recorded in [`Policy::mode`] and [`Config::mode`].
pub const MODE_ENFORCE: u32 = 0;
/// Dry run: nothing is dropped; what enforcement would drop is counted as "would drop",
/// and is not charged to any cell, so the meters run exactly as they would enforcing.
pub const MODE_MONITOR: u32 = 1;
/// Shaping (tc egress only, with `sch_fq`): a packet that does not conform is not dropped
/// but held back: its departure time (`skb->tstamp`) is set to the earliest time at which
/// it conforms, and its cell is charged as of then. Marked CE (if ECN-capable) when held
/// longer than [`Shape::ecn_threshold_ns`]; dropped only beyond [`Shape::horizon_ns`].
pub const MODE_SHAPE: u32 = 2;

/// Default [`Shape::ecn_threshold_ns`]: 5 ms, CoDel's target delay. A standing queue
/// longer than that is what ECN is for; a shorter one is a burst that drains by itself.
pub const DEFAULT_ECN_THRESHOLD_NS: u64 = 5_000_000;
/// Default [`Shape::horizon_ns`]: 50 ms. TCP needs about one round trip of queue to keep
/// a link busy after it halves its window, so 50 ms serves round trips up to 50 ms at
/// full rate; a longer queue only adds latency (Cilium's 2 s horizon let a FIFO reach
/// 2.2 s of delay).
pub const DEFAULT_HORIZON_NS: u64 = 50_000_000;
/// The longest horizon: 10 s, sch_fq's own default horizon (a packet scheduled further
/// ahead is dropped by fq anyway).
pub const MAX_HORIZON_NS: u64 = 10_000_000_000;

/// The interface-wide settings and default policy: array map `SHAPER_CONFIG`, one entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// What the per-packet path uses.
    pub limit: Limit,
    /// What the operator asked for, kept for `status` (bits per second, bytes).
    pub rate_bps: u64,
    pub burst_bytes: u64,
    /// `XDP_MODE_*` or `TC_MODE_*`: how the program is attached.
    pub xdp_mode: u32,
    /// Non-zero once userspace has written this entry; the program passes traffic
    /// untouched while it is zero (an all-zero limit would drop everything).
    pub active: u32,
    /// `KEY_BY_*`: which address of a frame picks its cell.
    pub key_by: u32,
    /// Prefix lengths the keys are masked to (0..=32, 0..=128), kept for `status`; the
    /// program uses the masks below.
    pub prefix_v4: u32,
    pub prefix_v6: u32,
    /// The IPv4 mask as its bytes in network order read as a native u32, like
    /// [`Ipv4Key`], so the program masks with one AND.
    pub mask_v4: u32,
    /// The IPv6 mask bytes in network order, like [`Ipv6Key`].
    pub mask_v6: [u8; 16],
    /// `MODE_*` for the whole interface: monitor overrides every policy's own mode.
    pub mode: u32,
    /// Bumped by userspace after each change of the prefix policies. A source caches the
    /// slot its prefix resolved to along with this number ([`SourceState::policy`]), and
    /// looks its prefix up again only when the number has moved on.
    pub policy_gen: u32,
    /// New-source admission of the interface: of the keys no prefix policy covers, and of
    /// those of every policy without an admission of its own.
    pub admission: Admission,
    /// How many prefix policies each family has, kept by userspace with the generation:
    /// a key new to the table skips the trie search of a family that has none.
    pub prefixes_v4: u32,
    pub prefixes_v6: u32,
    /// Shaping: what [`MODE_SHAPE`] does with what it holds back, for the interface and
    /// every policy in shape mode.
    pub shape: Shape,
    /// The seed of the hash that places a key's trace in `SHAPER_TRACES` ([`TraceBucket`]),
    /// random per attachment: without it, a flood could aim at the bucket of a source it
    /// wants kept out.
    pub trace_seed: u64,
    /// The default policy's second meter: its excess rate and packet rate ([`Meter2`]).
    pub meter2: Meter2,
}

const _: () = assert!(size_of::<Config>() == 272);
const _: () = assert!(offset_of!(Config, shape) == 160);
const _: () = assert!(offset_of!(Config, trace_seed) == 176);
const _: () = assert!(offset_of!(Config, meter2) == 184);

/// [`Meter2::meters`]: the excess meter of RFC 4115's two-rate three-colour marker.
pub const METER2_EXCESS: u8 = 1;
/// [`Meter2::meters`]: the packet-rate meter.
pub const METER2_PACKETS: u8 = 2;

/// A policy's second meter, beside its byte rate (the committed rate and burst, CIR and
/// CBS): an excess rate and burst (EIR, EBS) and a packet rate, each optional. Its cells
/// are a key's [`Meter2Cells`], made for the keys of policies that have one.
///
/// With an excess rate, a frame is coloured as RFC 4115's colour-blind two-rate
/// three-colour marker colours it (MEF 10.4's bandwidth profile, without coupling): green
/// if it fits the committed cell (charged there), otherwise yellow if it fits the excess
/// cell (charged there, and its DSCP rewritten to `excess_dscp`), otherwise red (dropped,
/// charged nowhere). The two buckets are independent: green frames never drain the
/// excess one (RFC 2698's peak rate would count them twice).
///
/// With a packet rate, a frame passes only if the packet meter allows it too (a packet
/// counted as one byte: `packets` is `Limit::new(8 × packet_rate, packet_burst)`, as
/// [`Admission`] counts keys); it is charged there only if it passes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meter2 {
    pub excess: Limit,
    pub packets: Limit,
    /// What the operator asked for, kept for `status`, `policy list` and `config show`:
    /// zero rates for none.
    pub excess_rate_bps: u64,
    pub excess_burst_bytes: u64,
    /// Packets a second, and at once.
    pub packet_rate: u64,
    pub packet_burst: u64,
    /// The DSCP (0 to 63) written into yellow frames, ECN bits kept.
    pub excess_dscp: u8,
    /// Which meters it has: [`METER2_EXCESS`], [`METER2_PACKETS`]; 0: none (the frame is
    /// metered by its byte rate alone, and nothing of this is read).
    pub meters: u8,
    pub _pad: [u8; 6],
}

const _: () = assert!(size_of::<Meter2>() == 88);

impl Meter2 {
    /// Whether frames of a policy with this second meter need it at all.
    #[inline(always)]
    pub fn any(&self) -> bool {
        self.meters != 0
    }
}

/// The second meter's cells of one key (value of the LRU hashes `SHAPER_METER2` and
/// `SHAPER_METER2_6`, keyed as the sources maps are), or of a policy's unadmitted frames
/// (array `SHAPER_METER2_U`, by slot), with what its excess meter passed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meter2Cells {
    pub excess: Cell,
    pub packets: Cell,
    /// Frames the excess meter passed (yellow), and their bytes.
    pub yellow_packets: u64,
    pub yellow_bytes: u64,
}

const _: () = assert!(size_of::<Meter2Cells>() == 48);

/// What the second meters decided, of the interface's frames ([`Counters::meter2`]) or a
/// policy's ([`PolicyStats::meter2`]), of keys with a cell of their own and unadmitted
/// alike: yellow frames (passed, counted as passed too) and the packet-rate meter's
/// refusals (dropped or would-drop, counted so too).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meter2Counts {
    pub yellow_packets: u64,
    pub yellow_bytes: u64,
    pub packet_rate_refused_packets: u64,
    pub packet_rate_refused_bytes: u64,
}

const _: () = assert!(size_of::<Meter2Counts>() == 32);

impl PerCpuSum for Meter2Counts {
    fn add(&mut self, o: &Self) {
        self.yellow_packets += o.yellow_packets;
        self.yellow_bytes += o.yellow_bytes;
        self.packet_rate_refused_packets += o.packet_rate_refused_packets;
        self.packet_rate_refused_bytes += o.packet_rate_refused_bytes;
    }
}

/// How shaping treats a packet it holds back ([`MODE_SHAPE`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// An ECN-capable packet held back longer than this is marked CE.
    pub ecn_threshold_ns: u64,
    /// A packet that would be held back longer than this is dropped (and not charged).
    pub horizon_ns: u64,
}

const _: () = assert!(size_of::<Shape>() == 16);

/// New-source admission: a key new to the table gets a cell of its own on its second
/// sighting within [`TRACE_WINDOW_NS`] (the doorkeeper, [`TraceBucket`]), or on its first
/// within the first-sighting allowance (`first`, a [`FIRST_SIGHTING_SHARE`]th of the rate:
/// new sources arriving slowly lose no frame), and at most `new_sources` keys a second (and
/// `new_sources_burst` at once) do; the frames of keys refused one are *unadmitted* and
/// share one cell per policy ([`AdmissionCells`]). All zero: every new key gets a cell on
/// its first frame.
///
/// The creations are metered by GCRA cells like any other, with a key counted as one
/// byte: `limit` is `Limit::new(8 × new_sources, new_sources_burst)`, `first` is
/// `Limit::new(8 × f, f)` with `f` a [`FIRST_SIGHTING_SHARE`]th of `new_sources` (at
/// least 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    pub limit: Limit,
    /// Keys a second; 0: unlimited (no admission control).
    pub new_sources: u64,
    pub new_sources_burst: u64,
    /// The first-sighting allowance (its cells are `SHAPER_FIRSTS`').
    pub first: Limit,
}

const _: () = assert!(size_of::<Admission>() == 64);

/// The first-sighting allowance is this fraction of the admission rate: with the default
/// admission of a 262,144-key table (26,214 keys a second), 409 keys a second. A spoofed
/// flood gets that many keys a second at most, and a second's worth at once: under 1% of
/// the table in a 5-second flood.
pub const FIRST_SIGHTING_SHARE: u64 = 64;

impl Admission {
    /// Whether new keys are admitted by a meter at all.
    #[inline(always)]
    pub fn limited(&self) -> bool {
        self.new_sources != 0
    }
}

/// The two shared cells of a policy slot: array map `SHAPER_ADMIT`, indexed by slot
/// ([`DEFAULT_SLOT`] for the interface's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionCells {
    /// Meters key creations (one byte a key) against [`Admission::limit`]: of the slot's
    /// policy if it has an admission of its own, of every policy sharing the interface's
    /// at [`DEFAULT_SLOT`].
    pub admit: Cell,
    /// Meters all unadmitted frames of the slot's policy together, at its per-source
    /// limit.
    pub unadmitted: Cell,
}

const _: () = assert!(size_of::<AdmissionCells>() == 32);

/// Counters kept one entry per CPU, which userspace adds up field by field.
pub trait PerCpuSum: Default {
    fn add(&mut self, other: &Self);
}

/// The sum of the per-CPU entries of a counter.
pub fn sum_per_cpu<'a, T: PerCpuSum + 'a>(per_cpu: impl IntoIterator<Item = &'a T>) -> T {
    let mut total = T::default();
    for c in per_cpu {
        total.add(c);
    }
    total
}

/// What became of a set of frames, by outcome: the first counters of a source
/// ([`SourceState::outcomes`]), of a policy and of the interface, and those of their
/// unadmitted frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
    /// In monitor mode: what enforcement would have dropped (and was passed).
    pub would_drop_packets: u64,
    pub would_drop_bytes: u64,
}

const _: () = assert!(size_of::<Outcomes>() == 48);
const _: () = assert!(offset_of!(Outcomes, passed_bytes) == 8);
const _: () = assert!(offset_of!(Outcomes, would_drop_bytes) == 40);

impl PerCpuSum for Outcomes {
    fn add(&mut self, o: &Self) {
        self.passed_packets += o.passed_packets;
        self.passed_bytes += o.passed_bytes;
        self.dropped_packets += o.dropped_packets;
        self.dropped_bytes += o.dropped_bytes;
        self.would_drop_packets += o.would_drop_packets;
        self.would_drop_bytes += o.would_drop_bytes;
    }
}

impl Outcomes {
    /// All frames, whatever became of them.
    pub fn packets(&self) -> u64 {
        self.passed_packets + self.dropped_packets + self.would_drop_packets
    }

    pub fn bytes(&self) -> u64 {
        self.passed_bytes + self.dropped_bytes + self.would_drop_bytes
    }
}

/// A prefix policy: array map `SHAPER_POLICIES`, indexed by slot. The LPM tries
/// `SHAPER_PREFIX4` (keyed by prefix length and [`Ipv4Key`]) and `SHAPER_PREFIX6` (by
/// prefix length and [`Ipv6Key`]) map each prefix to its slot (a `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Per-source limit (with `ACTION_LIMIT`).
    pub limit: Limit,
    /// The limit the whole prefix shares, when `aggregate_rate_bps` is non-zero.
    pub aggregate: Limit,
    /// What the operator asked for, kept for `policy list` and `config show`.
    pub rate_bps: u64,
    pub burst_bytes: u64,
    /// Zero: no aggregate cell.
    pub aggregate_rate_bps: u64,
    pub aggregate_burst_bytes: u64,
    /// `ACTION_*`.
    pub action: u32,
    /// `MODE_*`.
    pub mode: u32,
    /// Non-zero while the slot holds a policy.
    pub in_use: u32,
    /// 4 or 6: the family of `addr`.
    pub family: u32,
    /// The prefix: its length and address bytes in network order (IPv4 in the first 4).
    pub prefix_len: u32,
    /// Non-zero for a subscribers' plan: no prefix of its own (`family` 0), a slot its
    /// subscribers ([`Subscriber::plan`]) point at; `policy list` does not show it.
    pub plan: u32,
    pub addr: [u8; 16],
    /// New-source admission of the keys this policy covers; unlimited (all zero): they
    /// share the interface's ([`Config::admission`]).
    pub admission: Admission,
    /// The second meter: excess rate and packet rate ([`Meter2`]).
    pub meter2: Meter2,
}

const _: () = assert!(size_of::<Policy>() == 272);

impl Policy {
    /// Whether each key's limit is the whole plan's ([`per_address_is_whole`]).
    #[inline(always)]
    pub fn per_address_is_whole(&self) -> bool {
        per_address_is_whole(
            self.action,
            (self.rate_bps, self.burst_bytes),
            (self.aggregate_rate_bps, self.aggregate_burst_bytes),
            (self.meter2.excess_rate_bps, self.meter2.excess_burst_bytes),
        )
    }
}

/// Whether a key's limit (`per_key`: rate in bit/s and burst in bytes, under `action`) is
/// the whole of its aggregate's (the committed rate and burst, `aggregate`, and the
/// excess ones, `excess`, together): what a subscriber's plan with no per-address limit of
/// its own states. Such a limit never refuses what the aggregate's buckets passed (a key's
/// frames are some of the aggregate's, and what fits a committed and an excess bucket fits
/// one at their sum), so a key's own cell need not be charged (`meter::shaper_subscriber`).
#[inline(always)]
pub fn per_address_is_whole(
    action: u32,
    per_key: (u64, u64),
    aggregate: (u64, u64),
    excess: (u64, u64),
) -> bool {
    action == ACTION_LIMIT
        && aggregate.0 != 0
        && per_key.0 == aggregate.0.saturating_add(excess.0)
        && per_key.1 == aggregate.1.saturating_add(excess.1)
}
const _: () = assert!(offset_of!(Policy, meter2) == 184);

/// A GCRA cell: the TAT, and the scale ([`Limit::scale`]) of the limit it is expressed in,
/// so a rate change can carry it over (see [`crate::rescale`]). Zero scale: never charged.
/// Also the value of `SHAPER_AGGS`, one aggregate cell per policy slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    /// Theoretical arrival time, in GCRA ticks (see [`crate::gcra`]).
    pub tat: u64,
    pub scale: u64,
}

const _: () = assert!(size_of::<Cell>() == 16);

/// Per-policy counters: per-CPU array map `SHAPER_PSTATS`, indexed by slot; sum the CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats {
    /// Frames of the policy's keys that have a cell of their own: passed, dropped, and
    /// (monitor mode) would drop.
    pub outcomes: Outcomes,
    /// Of the dropped or would-drop packets, those refused by the aggregate cell (the
    /// source's own cell had room).
    pub aggregate_refused_packets: u64,
    pub aggregate_refused_bytes: u64,
    /// Frames of keys refused a cell (new-source admission), metered together; not in
    /// the passed, dropped and would-drop counts above.
    pub unadmitted: Outcomes,
    /// Keys given a cell under this policy.
    pub new_sources: u64,
    /// New-source admission's doorkeeper: the traces it counts ([`Sightings`]).
    pub sightings: Sightings,
    /// Yellow frames and the packet-rate meter's refusals ([`Meter2Counts`]).
    pub meter2: Meter2Counts,
}

const _: () = assert!(size_of::<PolicyStats>() == 184);
const _: () = assert!(offset_of!(PolicyStats, meter2) == 152);
const _: () = assert!(offset_of!(PolicyStats, outcomes) == 0);
const _: () = assert!(offset_of!(PolicyStats, aggregate_refused_packets) == 48);
const _: () = assert!(offset_of!(PolicyStats, unadmitted) == 64);
const _: () = assert!(offset_of!(PolicyStats, new_sources) == 112);

impl PerCpuSum for PolicyStats {
    fn add(&mut self, o: &Self) {
        self.outcomes.add(&o.outcomes);
        self.aggregate_refused_packets += o.aggregate_refused_packets;
        self.aggregate_refused_bytes += o.aggregate_refused_bytes;
        self.unadmitted.add(&o.unadmitted);
        self.new_sources += o.new_sources;
        self.sightings.add(&o.sightings);
        self.meter2.add(&o.meter2);
    }
}

/// What new-source admission's doorkeeper ([`TraceBucket`]) saw, of the interface's keys
/// ([`Counters::sightings`]) or a policy's ([`PolicyStats::sightings`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sightings {
    /// Keys seen for the first time (none of their own trace found): a trace left, the
    /// frame metered as unadmitted.
    pub first: u64,
    /// Keys given a cell on a second sighting (their own trace found within the window).
    pub admitted: u64,
    /// Keys given a cell on their first sighting, within the first-sighting allowance.
    pub first_admitted: u64,
    /// First sightings whose trace took the place of another key's live one. Without the
    /// tag each trace carries, each would have been a false admission; with it, a flood
    /// can push real sources' traces out but not forge them.
    pub displaced: u64,
}

const _: () = assert!(size_of::<Sightings>() == 32);

impl PerCpuSum for Sightings {
    fn add(&mut self, o: &Self) {
        self.first += o.first;
        self.admitted += o.admitted;
        self.first_admitted += o.first_admitted;
        self.displaced += o.displaced;
    }
}

/// Ways of a [`TraceBucket`]: two cache lines.
pub const TRACE_WAYS: usize = 16;
/// Buckets of `SHAPER_TRACES`: 2^16, so 2^20 traces in 8 MiB, four for each source of the
/// default table. A trace is lost only when more than 16 keys of its bucket arrive within
/// its window: with a warm start of 200,000 new sources (3 a bucket on average) that is
/// about one chance in 500 for the whole table, where 8 ways in twice as many buckets
/// lost 63 of them.
pub const TRACE_BUCKETS: u32 = 1 << 16;
/// How long a trace counts, in nanoseconds: a key seen again within this gets its cell. It
/// covers the retries of a frame lost on the first sighting (TCP's first SYN retransmission
/// after 1 s, the next after 3 s; DNS resolvers retry after 1 to 5 s).
pub const TRACE_WINDOW_NS: u64 = 10_000_000_000;
/// A trace's time stamp is `bpf_ktime_get_ns() >> TRACE_STAMP_SHIFT` in 32 bits: units of
/// 1.05 ms, wrapping after 52 days.
pub const TRACE_STAMP_SHIFT: u32 = 20;

/// One bucket of `SHAPER_TRACES`, an array indexed by a seeded hash of the key: the traces of
/// up to [`TRACE_WAYS`] keys seen once, each a `u64` holding a 32-bit tag of the key (the
/// hash's other half, never 0) in its high half and its time stamp in its low half
/// ([`TRACE_STAMP_SHIFT`]); 0 is an empty way. A key's first sighting takes the way of an
/// empty, expired or else the oldest trace; a later sighting within [`TRACE_WINDOW_NS`]
/// that finds its own tag admits it. So the doorkeeper costs one lookup and a cache line,
/// never fills up (a flood overwrites traces), and cannot be made to admit a key it has not
/// seen, but with the chance of a tag collision (2^-28 per fresh key).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceBucket {
    pub ways: [u64; TRACE_WAYS],
}

const _: () = assert!(size_of::<TraceBucket>() == 128);

/// A key's GCRA cell and counters: a way's state in the tables `SHAPER_SOURCES` (IPv4
/// keys, [`Ipv4Key`]) and `SHAPER_SOURCES6` (IPv6, [`Ipv6Key`]) ([`crate::sources`]).
///
/// Every field is updated atomically: the cell with compare-and-swap, counters with
/// fetch-add, because all CPUs share one entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceState {
    pub cell: Cell,
    /// The policy slot this key resolved to, in the low 32 bits, and the
    /// [`Config::policy_gen`] it was resolved under, in the high 32 (0: not yet resolved).
    pub policy: u64,
    /// Passed, dropped, and (monitor mode) would drop.
    pub outcomes: Outcomes,
}

const _: () = assert!(size_of::<SourceState>() == 72);
const _: () = assert!(offset_of!(SourceState, cell) == 0);
const _: () = assert!(offset_of!(SourceState, policy) == 16);
const _: () = assert!(offset_of!(SourceState, outcomes) == 24);

/// Key of `SHAPER_SOURCES`: the four address bytes in network order, read as a native u32
/// (`u32::from_ne_bytes(addr)`), masked with [`Config::mask_v4`]; userspace recovers the
/// bytes with `to_ne_bytes`.
pub type Ipv4Key = u32;

/// Key of `SHAPER_SOURCES6`: the sixteen address bytes in network order, masked with
/// [`Config::mask_v6`].
pub type Ipv6Key = [u8; 16];

/// Global counters: per-CPU array map `SHAPER_COUNTERS`, one entry per CPU; sum them.
///
/// Bytes are whole frames as XDP sees them: Ethernet header to end of payload, no FCS,
/// every fragment of a multi-buffer frame included. With a policy in force every frame is
/// counted in exactly one of passed, dropped, would drop, unadmitted (passed, dropped or
/// would drop), not IP, PPPoE other, VLAN too deep and malformed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// IP frames (both families) of keys with a cell of their own, or untracked: passed
    /// (within the limit), dropped (over it, or blocked), and would drop (passed in
    /// monitor mode, where enforcement would have dropped them).
    pub outcomes: Outcomes,
    /// Metered frames per family (passed, dropped or would drop, unadmitted included).
    pub ipv4_packets: u64,
    pub ipv6_packets: u64,
    /// Frames of keys refused a cell by new-source admission, metered together per policy.
    pub unadmitted: Outcomes,
    /// Frames of another ethertype (ARP, LLDP, MPLS, ...): passed untouched.
    pub not_ip_packets: u64,
    pub not_ip_bytes: u64,
    /// PPPoE discovery, and PPPoE sessions carrying something other than IP (LCP, IPCP,
    /// authentication, ...): passed untouched.
    pub pppoe_other_packets: u64,
    pub pppoe_other_bytes: u64,
    /// Frames with a third VLAN tag: passed untouched.
    pub vlan_too_deep_packets: u64,
    pub vlan_too_deep_bytes: u64,
    /// Frames too short for their headers, or with an invalid IP or PPPoE header: passed
    /// untouched.
    pub malformed_packets: u64,
    pub malformed_bytes: u64,
    /// Keys given a way in either source table.
    pub new_sources: u64,
    /// Decisions lost because the compare-and-swap lost every retry to other CPUs: the
    /// packet was refused (dropped, or unadmitted when it was asking for a new cell).
    pub cas_exhausted: u64,
    /// Charges published by the compare-and-swap, by the try that won: `[0]` on the
    /// first, `[n]` after `n` retries (source, aggregate, unadmitted and admission cells
    /// alike).
    pub cas_won: [u64; CAS_TRIES],
    /// Packets passed unmetered because no cell could be created for their key.
    pub untracked_packets: u64,
    /// Packets passed untouched because no policy was configured yet.
    pub unconfigured_packets: u64,
    /// Shaping ([`MODE_SHAPE`]): packets held back (given a departure time later than
    /// now; counted as passed too) and their bytes.
    pub shaped_packets: u64,
    pub shaped_bytes: u64,
    /// Of the shaped packets, those marked CE (ECN-capable and held back longer than the
    /// ECN threshold).
    pub ce_marked_packets: u64,
    /// How long shaped packets were held back: a log2 histogram
    /// ([`crate::shape::delay_bucket`]).
    pub shape_delay: [u64; DELAY_BUCKETS],
    /// The sum of those delays, in nanoseconds.
    pub shape_delay_ns: u64,
    /// New-source admission's doorkeeper: the traces it counts ([`Sightings`]).
    pub sightings: Sightings,
    /// Yellow frames and the packet-rate meter's refusals ([`Meter2Counts`]).
    pub meter2: Meter2Counts,
}

const _: () = assert!(size_of::<Counters>() == 496);
const _: () = assert!(offset_of!(Counters, meter2) == 464);
const _: () = assert!(offset_of!(Counters, shaped_packets) == 240);
const _: () = assert!(offset_of!(Counters, shape_delay) == 264);
const _: () = assert!(offset_of!(Counters, outcomes) == 0);
const _: () = assert!(offset_of!(Counters, ipv4_packets) == 48);
const _: () = assert!(offset_of!(Counters, unadmitted) == 64);
const _: () = assert!(offset_of!(Counters, not_ip_packets) == 112);
const _: () = assert!(offset_of!(Counters, cas_won) == 192);
const _: () = assert!(offset_of!(Counters, unconfigured_packets) == 232);

impl Counters {
    /// The frames passed untouched because they could not be metered, by kind, as
    /// `(kind, packets, bytes)`: `kind` is the snake_case word that `stats` and the
    /// metrics name it by.
    pub fn unmetered(&self) -> [(&'static str, u64, u64); 4] {
        [
            ("not_ip", self.not_ip_packets, self.not_ip_bytes),
            (
                "pppoe_other",
                self.pppoe_other_packets,
                self.pppoe_other_bytes,
            ),
            (
                "vlan_too_deep",
                self.vlan_too_deep_packets,
                self.vlan_too_deep_bytes,
            ),
            ("malformed", self.malformed_packets, self.malformed_bytes),
        ]
    }
}

impl PerCpuSum for Counters {
    fn add(&mut self, o: &Self) {
        self.outcomes.add(&o.outcomes);
        self.ipv4_packets += o.ipv4_packets;
        self.ipv6_packets += o.ipv6_packets;
        self.unadmitted.add(&o.unadmitted);
        self.not_ip_packets += o.not_ip_packets;
        self.not_ip_bytes += o.not_ip_bytes;
        self.pppoe_other_packets += o.pppoe_other_packets;
        self.pppoe_other_bytes += o.pppoe_other_bytes;
        self.vlan_too_deep_packets += o.vlan_too_deep_packets;
        self.vlan_too_deep_bytes += o.vlan_too_deep_bytes;
        self.malformed_packets += o.malformed_packets;
        self.malformed_bytes += o.malformed_bytes;
        self.new_sources += o.new_sources;
        self.cas_exhausted += o.cas_exhausted;
        for (won, o) in self.cas_won.iter_mut().zip(o.cas_won) {
            *won += o;
        }
        self.untracked_packets += o.untracked_packets;
        self.unconfigured_packets += o.unconfigured_packets;
        self.shaped_packets += o.shaped_packets;
        self.shaped_bytes += o.shaped_bytes;
        self.ce_marked_packets += o.ce_marked_packets;
        for (n, o) in self.shape_delay.iter_mut().zip(o.shape_delay) {
            *n += o;
        }
        self.shape_delay_ns += o.shape_delay_ns;
        self.sightings.add(&o.sightings);
        self.meter2.add(&o.meter2);
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each type is #[repr(C)], made only of integers, with no implicit padding
    // (sizes asserted above), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::SourceState {}
    unsafe impl aya::Pod for super::Counters {}
    unsafe impl aya::Pod for super::Policy {}
    unsafe impl aya::Pod for super::Cell {}
    unsafe impl aya::Pod for super::PolicyStats {}
    unsafe impl aya::Pod for super::AdmissionCells {}
    unsafe impl aya::Pod for super::Watch {}
    unsafe impl aya::Pod for super::WatchEvent {}
    unsafe impl aya::Pod for super::TraceBucket {}
    unsafe impl aya::Pod for super::Meter2Cells {}
    unsafe impl aya::Pod for super::Subscriber {}
}

/// The size of the ring buffer of sampled events (`SHAPER_EVENTS`), in bytes: a power of
/// two pages; room for 5461 events of [`WatchEvent`] with the ring buffer's 8-byte header.
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// Entries of `SHAPER_WATCH`: [`WATCH_CONTROL`], written by the watcher only, and
/// [`WATCH_METER`], written by the program only (so neither side overwrites what the
/// other wrote).
pub const WATCH_ENTRIES: u32 = 2;
/// The watcher's entry: [`Watch::until`], [`Watch::limit`], who and at what rate.
pub const WATCH_CONTROL: u32 = 0;
/// The program's entry: [`Watch::cell`] and [`Watch::lost`].
pub const WATCH_METER: u32 = 1;

/// `shaper watch`'s control of the sampling of refused frames: array map `SHAPER_WATCH`,
/// [`WATCH_ENTRIES`] entries of this type, each using its half of the fields.
///
/// The program samples only while its clock is before [`Watch::until`] of the control
/// entry: a *lease* the watcher renews every second and clears when it exits, so a
/// watcher killed without a word leaves sampling on for at most the lease's length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watch {
    /// Control: the end of the lease, in GCRA ticks of `bpf_ktime_get_ns`
    /// (`gcra::ticks_from_ns`, CLOCK_MONOTONIC); 0: nobody watches.
    pub until: u64,
    /// Control: the events' rate and burst, an event counted as one byte (as
    /// [`Admission`] counts keys): `Limit::new(8 × events_per_sec, burst)`.
    pub limit: Limit,
    /// Control: the watcher's process id, and what it asked for (for a second watcher's
    /// refusal).
    pub pid: u32,
    pub events_per_sec: u32,
    pub burst: u32,
    pub _pad: u32,
    /// Meter: the GCRA cell the events are metered in.
    pub cell: Cell,
    /// Meter: sampled events the ring buffer had no room for.
    pub lost: u64,
}

const _: () = assert!(size_of::<Watch>() == 72);

/// Why a frame was refused, as recorded in [`WatchEvent::reason`].
/// Over its source's (key's) limit.
pub const REASON_SOURCE: u8 = 0;
/// Over its prefix's aggregate limit (the source's own cell had room).
pub const REASON_AGGREGATE: u8 = 1;
/// Its policy blocks it.
pub const REASON_BLOCKED: u8 = 2;
/// Its key was refused a cell by new-source admission and the policy's shared cell of
/// unadmitted frames had no room.
pub const REASON_UNADMITTED: u8 = 3;
/// Over its key's packet rate ([`Meter2::packets`]).
pub const REASON_PACKET_RATE: u8 = 4;

/// One sampled refused frame: a record of the ring buffer `SHAPER_EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchEvent {
    /// When, from `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
    pub time_ns: u64,
    /// The key: [`Ipv4Key`]'s bytes in the first 4 (family 4), or [`Ipv6Key`].
    pub key: [u8; 16],
    /// The policy slot it fell under ([`DEFAULT_SLOT`]: the default).
    pub slot: u32,
    /// What the frame cost (its wire length).
    pub bytes: u32,
    /// 4 or 6.
    pub family: u8,
    /// `REASON_*`.
    pub reason: u8,
    /// Non-zero in monitor mode: the frame was passed, enforcement would have dropped it.
    pub would_drop: u8,
    pub _pad: [u8; 5],
}

const _: () = assert!(size_of::<WatchEvent>() == 40);
