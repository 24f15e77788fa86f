//! What an attachment's pins hold, layout by layout: the table an upgrade reads older pins
//! with and checks them against.
//!
//! A *layout* is the set of maps pinned in an attachment's directory, each with its type,
//! key and value sizes, size and flags, and the meaning of its bytes. Layouts 1 and 2 were
//! pinned before pins carried a version and are recognised by their maps; from layout 3
//! on, the map pinned as [`PIN_LAYOUT`] holds the version (one `u32` at index 0; that map
//! is the same in every layout and must never change).
//!
//! Changing what a map holds (a field of a value type, a map added or removed, a size, a
//! flag, or the meaning of bytes that keep their size) makes a new layout:
//! 1. bump [`LAYOUT_VERSION`] and append the new layout to [`LAYOUTS`]. Never edit an
//!    entry already released: pins made by builds of that layout are read with it.
//! 2. In shaper-user's `upgrade`, decode the changed maps of every older layout into the new
//!    types: freeze the old value types in a module of the old layout, as `layout1.rs`
//!    does. A changed [`Holds::Settings`] or [`Holds::Counters`] map is then migrated; a
//!    changed [`Holds::Cells`] map refuses the upgrade until the kernel program can carry
//!    its cells (see `upgrade`).
//! 3. Add the last commit of the old layout to the lab's old builds
//!    (`shaper-user/lab/src/old_builds.rs`), so the upgrade test attaches with it.
//!
//! The tests below (value sizes against the types) and in shaper-user (every map of the
//! object file against the newest layout) fail until step 1 is done.

use crate::maps::{
    MAP_ADMISSION, MAP_AGGREGATES, MAP_CONFIG, MAP_COUNTERS, MAP_COUNTERS_CARRIED, MAP_EVENTS,
    MAP_FIRSTS, MAP_LAYOUT, MAP_METER2, MAP_METER2_6, MAP_METER2_SHARED, MAP_POLICIES,
    MAP_POLICY_STATS, MAP_POLICY_STATS_CARRIED, MAP_PREFIXES_V4, MAP_PREFIXES_V6, MAP_SOURCES,
    MAP_SOURCES6, MAP_SUBSCRIBERS, MAP_TRACES, MAP_WATCH, MAX_POLICIES, PIN_ADMISSION,
    PIN_AGGREGATES, PIN_CONFIG, PIN_COUNTERS, PIN_COUNTERS_CARRIED, PIN_EVENTS, PIN_FIRSTS,
    PIN_LAYOUT, PIN_METER2, PIN_METER2_6, PIN_METER2_SHARED, PIN_POLICIES, PIN_POLICY_STATS,
    PIN_POLICY_STATS_CARRIED, PIN_PREFIXES_V4, PIN_PREFIXES_V6, PIN_SOURCES, PIN_SOURCES6,
    PIN_SUBSCRIBERS, PIN_TRACES, PIN_WATCH, SIZED_BY_POLICIES, TRACE_BUCKETS,
};

/// The layout this build pins.
pub const LAYOUT_VERSION: u32 = 11;

/// The first layout whose pins record their version in [`PIN_LAYOUT`].
pub const FIRST_VERSIONED: u32 = 3;

/// `enum bpf_map_type` values (uapi/linux/bpf.h).
pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
pub const BPF_MAP_TYPE_LPM_TRIE: u32 = 11;
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// `BPF_F_NO_PREALLOC`: entries allocated as they are inserted (LPM tries require it).
pub const BPF_F_NO_PREALLOC: u32 = 1;
/// `BPF_F_MMAPABLE`: an array userspace can map (the per-source tables).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// [`MapLayout::max_entries`] of the maps sized at attach (`--max-sources`,
/// `--max-subscribers`, `--max-policies`).
pub const SIZED_AT_ATTACH: u32 = 0;

/// Who writes a map, which decides how an upgrade carries it over when it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// The layout version.
    Version,
    /// Written by userspace only, under the host lock (settings, policies, prefix tries):
    /// a changed one is decoded and written into its new map before the new program runs.
    Settings,
    /// GCRA cells and per-key counters the program updates (sources, aggregates,
    /// admission): only ever carried over by reusing the map itself.
    Cells,
    /// Per-CPU counters the program adds to: a changed one starts from zero in the new
    /// program, and what the old one counted goes to its [`Holds::Carried`] map.
    Counters,
    /// What counters of earlier programs counted (written once by an upgrade, read-only
    /// after): readers add it to the live counters.
    Carried,
    /// `shaper watch`'s sampled events and their control (written by the watcher and the
    /// program, read by the watcher): reused when unchanged, otherwise made anew (a
    /// watcher running across such an upgrade sees no more events and must be restarted).
    Events,
    /// New-source admission's traces of keys seen once (written by the program): reused
    /// when unchanged, otherwise made anew (a key seen once before the upgrade is seen once
    /// more after it).
    Traces,
}

/// One pinned map, as the kernel describes it (`bpf_map_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapLayout {
    /// Its pin in the attachment's directory.
    pub pin: &'static str,
    /// Its name in the object file.
    pub name: &'static str,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    /// [`SIZED_AT_ATTACH`] for the per-source maps.
    pub max_entries: u32,
    pub flags: u32,
    pub holds: Holds,
}

impl MapLayout {
    /// Whether a pinned map described by the rest of the arguments is this map, as libbpf
    /// checks before it reuses a pinned map: type, key and value size, size and flags.
    pub fn matches(
        &self,
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        flags: u32,
    ) -> bool {
        self.map_type == map_type
            && self.key_size == key_size
            && self.value_size == value_size
            && match self.max_entries {
                SIZED_AT_ATTACH => max_entries != 0,
                n => n == max_entries,
            }
            && self.flags == flags
    }

    /// Whether this map (of an older layout) holds what `today`'s does, as it does: the
    /// same in every way, or, for a map of one entry per policy slot
    /// ([`SIZED_BY_POLICIES`], sized at attach since layout 10), but for its size (an older
    /// map's 16,384 slots are one of the sizes `--max-policies` may choose). The prefix
    /// tries, sized at attach since layout 8 for subscribers' prefixes too, are not: an
    /// older attachment's are made anew.
    pub fn holds_as(&self, today: &MapLayout) -> bool {
        self == today
            || (today.max_entries == SIZED_AT_ATTACH
                && SIZED_BY_POLICIES.contains(&today.name)
                && MapLayout {
                    max_entries: SIZED_AT_ATTACH,
                    ..*self
                } == *today)
    }
}

/// The maps of one layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: u32,
    pub maps: &'static [MapLayout],
}

impl Layout {
    /// The map pinned as `pin`, if this layout has one.
    pub fn map(&self, pin: &str) -> Option<&'static MapLayout> {
        self.maps.iter().find(|m| m.pin == pin)
    }

    /// Whether its pins record the version ([`PIN_LAYOUT`]).
    pub fn versioned(&self) -> bool {
        self.version >= FIRST_VERSIONED
    }
}

/// The layout of `version`, if there is one.
pub fn layout(version: u32) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.version == version)
}

/// The layout this build pins.
pub fn current() -> &'static Layout {
    &LAYOUTS[LAYOUTS.len() - 1]
}

const fn map(
    pin: &'static str,
    name: &'static str,
    (map_type, key_size, value_size, max_entries, flags): (u32, u32, u32, u32, u32),
    holds: Holds,
) -> MapLayout {
    MapLayout {
        pin,
        name,
        map_type,
        key_size,
        value_size,
        max_entries,
        flags,
        holds,
    }
}

const ARRAY: u32 = BPF_MAP_TYPE_ARRAY;
const PERCPU: u32 = BPF_MAP_TYPE_PERCPU_ARRAY;
const LRU: u32 = BPF_MAP_TYPE_LRU_HASH;
const LPM: u32 = BPF_MAP_TYPE_LPM_TRIE;
const HASH: u32 = BPF_MAP_TYPE_HASH;
const RINGBUF: u32 = BPF_MAP_TYPE_RINGBUF;
const SLOTS: u32 = MAX_POLICIES;
const ANY: u32 = SIZED_AT_ATTACH;

// Every number below is frozen: these are the maps as released builds pinned them.

const CONFIG_88: MapLayout = map(
    PIN_CONFIG,
    MAP_CONFIG,
    (ARRAY, 4, 88, 1, 0),
    Holds::Settings,
);
const CONFIG_136: MapLayout = map(
    PIN_CONFIG,
    MAP_CONFIG,
    (ARRAY, 4, 136, 1, 0),
    Holds::Settings,
);
const CONFIG_152: MapLayout = map(
    PIN_CONFIG,
    MAP_CONFIG,
    (ARRAY, 4, 152, 1, 0),
    Holds::Settings,
);
const CONFIG_184: MapLayout = map(
    PIN_CONFIG,
    MAP_CONFIG,
    (ARRAY, 4, 184, 1, 0),
    Holds::Settings,
);
const CONFIG_272: MapLayout = map(
    PIN_CONFIG,
    MAP_CONFIG,
    (ARRAY, 4, 272, 1, 0),
    Holds::Settings,
);
const SOURCES: MapLayout = map(PIN_SOURCES, MAP_SOURCES, (LRU, 4, 72, ANY, 0), Holds::Cells);
const SOURCES6: MapLayout = map(
    PIN_SOURCES6,
    MAP_SOURCES6,
    (LRU, 16, 72, ANY, 0),
    Holds::Cells,
);
// Layout 11's per-source tables: arrays of buckets of eight ways (`crate::sources`), as
// many buckets as `--max-sources` asks for (eight keys a bucket, rounded up).
const SOURCES_TABLE: MapLayout = map(
    PIN_SOURCES,
    MAP_SOURCES,
    (ARRAY, 4, 648, ANY, BPF_F_MMAPABLE),
    Holds::Cells,
);
const SOURCES6_TABLE: MapLayout = map(
    PIN_SOURCES6,
    MAP_SOURCES6,
    (ARRAY, 4, 744, ANY, BPF_F_MMAPABLE),
    Holds::Cells,
);
const COUNTERS_160: MapLayout = map(
    PIN_COUNTERS,
    MAP_COUNTERS,
    (PERCPU, 4, 160, 1, 0),
    Holds::Counters,
);
const COUNTERS_208: MapLayout = map(
    PIN_COUNTERS,
    MAP_COUNTERS,
    (PERCPU, 4, 208, 1, 0),
    Holds::Counters,
);
const COUNTERS_240: MapLayout = map(
    PIN_COUNTERS,
    MAP_COUNTERS,
    (PERCPU, 4, 240, 1, 0),
    Holds::Counters,
);
const COUNTERS_432: MapLayout = map(
    PIN_COUNTERS,
    MAP_COUNTERS,
    (PERCPU, 4, 432, 1, 0),
    Holds::Counters,
);
const COUNTERS_464: MapLayout = map(
    PIN_COUNTERS,
    MAP_COUNTERS,
    (PERCPU, 4, 464, 1, 0),
    Holds::Counters,
);
const COUNTERS_496: MapLayout = map(
    PIN_COUNTERS,
    MAP_COUNTERS,
    (PERCPU, 4, 496, 1, 0),
    Holds::Counters,
);
const POLICIES_120: MapLayout = map(
    PIN_POLICIES,
    MAP_POLICIES,
    (ARRAY, 4, 120, SLOTS, 0),
    Holds::Settings,
);
const POLICIES_160: MapLayout = map(
    PIN_POLICIES,
    MAP_POLICIES,
    (ARRAY, 4, 160, SLOTS, 0),
    Holds::Settings,
);
const POLICIES_184: MapLayout = map(
    PIN_POLICIES,
    MAP_POLICIES,
    (ARRAY, 4, 184, SLOTS, 0),
    Holds::Settings,
);
const POLICIES_272: MapLayout = map(
    PIN_POLICIES,
    MAP_POLICIES,
    (ARRAY, 4, 272, SLOTS, 0),
    Holds::Settings,
);
const PREFIXES_V4: MapLayout = map(
    PIN_PREFIXES_V4,
    MAP_PREFIXES_V4,
    (LPM, 8, 4, SLOTS, BPF_F_NO_PREALLOC),
    Holds::Settings,
);
const PREFIXES_V6: MapLayout = map(
    PIN_PREFIXES_V6,
    MAP_PREFIXES_V6,
    (LPM, 20, 4, SLOTS, BPF_F_NO_PREALLOC),
    Holds::Settings,
);
const PREFIXES_V4_ANY: MapLayout = map(
    PIN_PREFIXES_V4,
    MAP_PREFIXES_V4,
    (LPM, 8, 4, ANY, BPF_F_NO_PREALLOC),
    Holds::Settings,
);
const PREFIXES_V6_ANY: MapLayout = map(
    PIN_PREFIXES_V6,
    MAP_PREFIXES_V6,
    (LPM, 20, 4, ANY, BPF_F_NO_PREALLOC),
    Holds::Settings,
);
const SUBSCRIBERS_160: MapLayout = map(
    PIN_SUBSCRIBERS,
    MAP_SUBSCRIBERS,
    (ARRAY, 4, 160, ANY, 0),
    Holds::Cells,
);
const SUBSCRIBERS_112: MapLayout = map(
    PIN_SUBSCRIBERS,
    MAP_SUBSCRIBERS,
    (ARRAY, 4, 112, ANY, 0),
    Holds::Cells,
);
const AGGREGATES: MapLayout = map(
    PIN_AGGREGATES,
    MAP_AGGREGATES,
    (ARRAY, 4, 16, SLOTS, 0),
    Holds::Cells,
);
const POLICY_STATS_64: MapLayout = map(
    PIN_POLICY_STATS,
    MAP_POLICY_STATS,
    (PERCPU, 4, 64, SLOTS, 0),
    Holds::Counters,
);
const POLICY_STATS_120: MapLayout = map(
    PIN_POLICY_STATS,
    MAP_POLICY_STATS,
    (PERCPU, 4, 120, SLOTS, 0),
    Holds::Counters,
);
const POLICY_STATS_152: MapLayout = map(
    PIN_POLICY_STATS,
    MAP_POLICY_STATS,
    (PERCPU, 4, 152, SLOTS, 0),
    Holds::Counters,
);
const POLICY_STATS_184: MapLayout = map(
    PIN_POLICY_STATS,
    MAP_POLICY_STATS,
    (PERCPU, 4, 184, SLOTS, 0),
    Holds::Counters,
);
const ADMISSION: MapLayout = map(
    PIN_ADMISSION,
    MAP_ADMISSION,
    (ARRAY, 4, 32, SLOTS, 0),
    Holds::Cells,
);
const VERSION: MapLayout = map(PIN_LAYOUT, MAP_LAYOUT, (ARRAY, 4, 4, 1, 0), Holds::Version);
const COUNTERS_CARRIED_208: MapLayout = map(
    PIN_COUNTERS_CARRIED,
    MAP_COUNTERS_CARRIED,
    (ARRAY, 4, 208, 1, 0),
    Holds::Carried,
);
const COUNTERS_CARRIED_240: MapLayout = map(
    PIN_COUNTERS_CARRIED,
    MAP_COUNTERS_CARRIED,
    (ARRAY, 4, 240, 1, 0),
    Holds::Carried,
);
const COUNTERS_CARRIED_432: MapLayout = map(
    PIN_COUNTERS_CARRIED,
    MAP_COUNTERS_CARRIED,
    (ARRAY, 4, 432, 1, 0),
    Holds::Carried,
);
const COUNTERS_CARRIED_464: MapLayout = map(
    PIN_COUNTERS_CARRIED,
    MAP_COUNTERS_CARRIED,
    (ARRAY, 4, 464, 1, 0),
    Holds::Carried,
);
const COUNTERS_CARRIED_496: MapLayout = map(
    PIN_COUNTERS_CARRIED,
    MAP_COUNTERS_CARRIED,
    (ARRAY, 4, 496, 1, 0),
    Holds::Carried,
);
const POLICY_STATS_CARRIED_120: MapLayout = map(
    PIN_POLICY_STATS_CARRIED,
    MAP_POLICY_STATS_CARRIED,
    (HASH, 4, 120, SLOTS, BPF_F_NO_PREALLOC),
    Holds::Carried,
);
const POLICY_STATS_CARRIED_152: MapLayout = map(
    PIN_POLICY_STATS_CARRIED,
    MAP_POLICY_STATS_CARRIED,
    (HASH, 4, 152, SLOTS, BPF_F_NO_PREALLOC),
    Holds::Carried,
);
const POLICY_STATS_CARRIED_184: MapLayout = map(
    PIN_POLICY_STATS_CARRIED,
    MAP_POLICY_STATS_CARRIED,
    (HASH, 4, 184, SLOTS, BPF_F_NO_PREALLOC),
    Holds::Carried,
);

const EVENTS_256K: MapLayout = map(
    PIN_EVENTS,
    MAP_EVENTS,
    (RINGBUF, 0, 0, 256 * 1024, 0),
    Holds::Events,
);
const WATCH_72: MapLayout = map(PIN_WATCH, MAP_WATCH, (ARRAY, 4, 72, 2, 0), Holds::Events);
const FIRSTS: MapLayout = map(
    PIN_FIRSTS,
    MAP_FIRSTS,
    (ARRAY, 4, 16, SLOTS, 0),
    Holds::Cells,
);
const METER2: MapLayout = map(PIN_METER2, MAP_METER2, (LRU, 4, 48, ANY, 0), Holds::Cells);
const METER2_6: MapLayout = map(
    PIN_METER2_6,
    MAP_METER2_6,
    (LRU, 16, 48, ANY, 0),
    Holds::Cells,
);
const METER2_SHARED: MapLayout = map(
    PIN_METER2_SHARED,
    MAP_METER2_SHARED,
    (ARRAY, 4, 48, SLOTS, 0),
    Holds::Cells,
);
// Layout 10's maps of one entry per policy slot, sized at attach (`--max-policies`).
const POLICIES_272_ANY: MapLayout = map(
    PIN_POLICIES,
    MAP_POLICIES,
    (ARRAY, 4, 272, ANY, 0),
    Holds::Settings,
);
const AGGREGATES_ANY: MapLayout = map(
    PIN_AGGREGATES,
    MAP_AGGREGATES,
    (ARRAY, 4, 16, ANY, 0),
    Holds::Cells,
);
const POLICY_STATS_184_ANY: MapLayout = map(
    PIN_POLICY_STATS,
    MAP_POLICY_STATS,
    (PERCPU, 4, 184, ANY, 0),
    Holds::Counters,
);
const POLICY_STATS_CARRIED_184_ANY: MapLayout = map(
    PIN_POLICY_STATS_CARRIED,
    MAP_POLICY_STATS_CARRIED,
    (HASH, 4, 184, ANY, BPF_F_NO_PREALLOC),
    Holds::Carried,
);
const ADMISSION_ANY: MapLayout = map(
    PIN_ADMISSION,
    MAP_ADMISSION,
    (ARRAY, 4, 32, ANY, 0),
    Holds::Cells,
);
const FIRSTS_ANY: MapLayout = map(PIN_FIRSTS, MAP_FIRSTS, (ARRAY, 4, 16, ANY, 0), Holds::Cells);
const METER2_SHARED_ANY: MapLayout = map(
    PIN_METER2_SHARED,
    MAP_METER2_SHARED,
    (ARRAY, 4, 48, ANY, 0),
    Holds::Cells,
);
const TRACES_8M: MapLayout = map(
    PIN_TRACES,
    MAP_TRACES,
    (ARRAY, 4, 128, TRACE_BUCKETS, 0),
    Holds::Traces,
);

/// Every layout shaper has pinned since prefix policies, oldest first; the last is
/// [`LAYOUT_VERSION`].
pub const LAYOUTS: &[Layout] = &[
    // Prefix policies, before new-source admission: shaper as of commit ddbba43.
    Layout {
        version: 1,
        maps: &[
            CONFIG_88,
            SOURCES,
            SOURCES6,
            COUNTERS_160,
            POLICIES_120,
            PREFIXES_V4,
            PREFIXES_V6,
            AGGREGATES,
            POLICY_STATS_64,
        ],
    },
    // New-source admission, the last before pins recorded their layout.
    Layout {
        version: 2,
        maps: &[
            CONFIG_136,
            SOURCES,
            SOURCES6,
            COUNTERS_208,
            POLICIES_160,
            PREFIXES_V4,
            PREFIXES_V6,
            AGGREGATES,
            POLICY_STATS_120,
            ADMISSION,
        ],
    },
    // Pins record their layout; counts carried over by upgrades.
    Layout {
        version: 3,
        maps: &[
            VERSION,
            CONFIG_136,
            SOURCES,
            SOURCES6,
            COUNTERS_208,
            COUNTERS_CARRIED_208,
            POLICIES_160,
            PREFIXES_V4,
            PREFIXES_V6,
            AGGREGATES,
            POLICY_STATS_120,
            POLICY_STATS_CARRIED_120,
            ADMISSION,
        ],
    },
    // The counters count the compare-and-swap's wins by try (`Counters::cas_won`).
    Layout {
        version: 4,
        maps: &[
            VERSION,
            CONFIG_136,
            SOURCES,
            SOURCES6,
            COUNTERS_240,
            COUNTERS_CARRIED_240,
            POLICIES_160,
            PREFIXES_V4,
            PREFIXES_V6,
            AGGREGATES,
            POLICY_STATS_120,
            POLICY_STATS_CARRIED_120,
            ADMISSION,
        ],
    },
    // `shaper watch`: a ring buffer of sampled refused frames and its control. Shaping
    // (`MODE_SHAPE`): the settings carry its ECN threshold and horizon (`Config::shape`),
    // the counters what it held back and marked, and the delays.
    Layout {
        version: 5,
        maps: &[
            VERSION,
            CONFIG_152,
            SOURCES,
            SOURCES6,
            COUNTERS_432,
            COUNTERS_CARRIED_432,
            POLICIES_160,
            PREFIXES_V4,
            PREFIXES_V6,
            AGGREGATES,
            POLICY_STATS_120,
            POLICY_STATS_CARRIED_120,
            ADMISSION,
            EVENTS_256K,
            WATCH_72,
        ],
    },
    // The kernel programs verified in pieces: the departure time of a shaped packet comes
    // back from the metering, no longer through a scratch field of the counters, which
    // sum the shaping delays instead. New-source admission's doorkeeper: the traces of keys
    // seen once, the seed of their hash in the settings, what it saw in the counters; its
    // first-sighting allowance in the settings and the policies, and its cells.
    Layout {
        version: 6,
        maps: &[
            VERSION,
            CONFIG_184,
            SOURCES,
            SOURCES6,
            COUNTERS_464,
            COUNTERS_CARRIED_464,
            POLICIES_184,
            PREFIXES_V4,
            PREFIXES_V6,
            AGGREGATES,
            POLICY_STATS_152,
            POLICY_STATS_CARRIED_152,
            ADMISSION,
            EVENTS_256K,
            WATCH_72,
            TRACES_8M,
            FIRSTS,
        ],
    },
    // The second meter (excess rate and packet rate): appended to the settings and the
    // policies, and what it decided to the counters; its cells per key (sized at load:
    // `--max-sources` keys where a policy has a second meter, otherwise the smallest map,
    // grown in place when one is set) and per policy.
    Layout {
        version: 7,
        maps: &[
            VERSION,
            CONFIG_272,
            SOURCES,
            SOURCES6,
            COUNTERS_496,
            COUNTERS_CARRIED_496,
            POLICIES_272,
            PREFIXES_V4,
            PREFIXES_V6,
            AGGREGATES,
            POLICY_STATS_184,
            POLICY_STATS_CARRIED_184,
            ADMISSION,
            EVENTS_256K,
            WATCH_72,
            TRACES_8M,
            FIRSTS,
            METER2,
            METER2_6,
            METER2_SHARED,
        ],
    },
    // Subscribers: their entries (sized at attach, `--max-subscribers`), the prefix tries
    // sized for their prefixes too (a route's value with `SUBSCRIBER_BIT` is a
    // subscriber's index), and a policy slot may be a plan (`Policy::plan`, layout 7's
    // padding: zero in every policy it wrote).
    Layout {
        version: 8,
        maps: &[
            VERSION,
            CONFIG_272,
            SOURCES,
            SOURCES6,
            COUNTERS_496,
            COUNTERS_CARRIED_496,
            POLICIES_272,
            PREFIXES_V4_ANY,
            PREFIXES_V6_ANY,
            AGGREGATES,
            POLICY_STATS_184,
            POLICY_STATS_CARRIED_184,
            ADMISSION,
            EVENTS_256K,
            WATCH_72,
            TRACES_8M,
            FIRSTS,
            METER2,
            METER2_6,
            METER2_SHARED,
            SUBSCRIBERS_160,
        ],
    },
    // A subscriber's id and name out of its entry (userspace keeps them in a file of
    // records by index, the entry an 8-byte hash of the id): 112 bytes, not 160.
    Layout {
        version: 9,
        maps: &[
            VERSION,
            CONFIG_272,
            SOURCES,
            SOURCES6,
            COUNTERS_496,
            COUNTERS_CARRIED_496,
            POLICIES_272,
            PREFIXES_V4_ANY,
            PREFIXES_V6_ANY,
            AGGREGATES,
            POLICY_STATS_184,
            POLICY_STATS_CARRIED_184,
            ADMISSION,
            EVENTS_256K,
            WATCH_72,
            TRACES_8M,
            FIRSTS,
            METER2,
            METER2_6,
            METER2_SHARED,
            SUBSCRIBERS_112,
        ],
    },
    // The maps of one entry per policy slot sized at attach (`--max-policies`, 1,024 by
    // default), not 16,384 each: the policy counters are per CPU.
    Layout {
        version: 10,
        maps: &[
            VERSION,
            CONFIG_272,
            SOURCES,
            SOURCES6,
            COUNTERS_496,
            COUNTERS_CARRIED_496,
            POLICIES_272_ANY,
            PREFIXES_V4_ANY,
            PREFIXES_V6_ANY,
            AGGREGATES_ANY,
            POLICY_STATS_184_ANY,
            POLICY_STATS_CARRIED_184_ANY,
            ADMISSION_ANY,
            EVENTS_256K,
            WATCH_72,
            TRACES_8M,
            FIRSTS_ANY,
            METER2,
            METER2_6,
            METER2_SHARED_ANY,
            SUBSCRIBERS_112,
        ],
    },
    // The per-source tables as arrays of buckets of eight ways (issue 35): 81 and 93
    // bytes a source where an LRU hash entry cost 144 and 152; an upgrade moves every key of
    // the LRU maps into them.
    Layout {
        version: 11,
        maps: &[
            VERSION,
            CONFIG_272,
            SOURCES_TABLE,
            SOURCES6_TABLE,
            COUNTERS_496,
            COUNTERS_CARRIED_496,
            POLICIES_272_ANY,
            PREFIXES_V4_ANY,
            PREFIXES_V6_ANY,
            AGGREGATES_ANY,
            POLICY_STATS_184_ANY,
            POLICY_STATS_CARRIED_184_ANY,
            ADMISSION_ANY,
            EVENTS_256K,
            WATCH_72,
            TRACES_8M,
            FIRSTS_ANY,
            METER2,
            METER2_6,
            METER2_SHARED_ANY,
            SUBSCRIBERS_112,
        ],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::{
        AdmissionCells, Cell, Config, Counters, EVENTS_BYTES, Ipv4Key, Ipv6Key, Meter2Cells,
        Policy, PolicyStats, Subscriber, TraceBucket, WATCH_ENTRIES, Watch,
    };

    /// An LPM trie's key: the prefix length, then the address.
    const fn trie_key(addr: usize) -> usize {
        4 + addr
    }

    /// Layout 9's maps of one entry per policy slot (16,384) hold as layout 10's sized at
    /// attach do, so an upgrade reuses them; a map whose value changed, or one sized at
    /// attach before and fixed now, does not.
    #[test]
    fn a_map_resized_at_attach_holds_as_its_fixed_predecessor() {
        let (nine, ten) = (layout(9).unwrap(), layout(10).unwrap());
        for m in ten.maps {
            let old = nine.map(m.pin).unwrap();
            assert!(old.holds_as(m), "{}", m.pin);
            assert_eq!(old == m, old.max_entries == m.max_entries, "{}", m.pin);
        }
        let resized = SIZED_BY_POLICIES.iter().filter(|&&name| {
            let m = ten.maps.iter().find(|m| m.name == name).unwrap();
            m.max_entries == SIZED_AT_ATTACH && nine.map(m.pin).unwrap().max_entries == MAX_POLICIES
        });
        assert_eq!(resized.count(), SIZED_BY_POLICIES.len());
        let policies = ten.map(PIN_POLICIES).unwrap();
        let other_value = MapLayout {
            value_size: 264,
            ..*nine.map(PIN_POLICIES).unwrap()
        };
        assert!(!other_value.holds_as(policies));
        assert!(!policies.holds_as(nine.map(PIN_POLICIES).unwrap()));
        // Layout 7's tries, sized for prefix policies alone, are not today's.
        let seven = layout(7).unwrap();
        assert!(
            !seven
                .map(PIN_PREFIXES_V4)
                .unwrap()
                .holds_as(ten.map(PIN_PREFIXES_V4).unwrap())
        );
    }

    /// The current types: a change to any of them fails here until the newest layout
    /// says so, and a new layout means an upgrade (see the module docs).
    #[test]
    fn the_newest_layout_is_the_one_the_types_make() {
        let u32_size = size_of::<u32>();
        let expected: &[(&str, usize, usize, u32)] = &[
            (PIN_LAYOUT, u32_size, u32_size, 1),
            (PIN_CONFIG, u32_size, size_of::<Config>(), 1),
            (
                PIN_SOURCES,
                u32_size,
                size_of::<crate::sources::SourceBucket4>(),
                SIZED_AT_ATTACH,
            ),
            (
                PIN_SOURCES6,
                u32_size,
                size_of::<crate::sources::SourceBucket6>(),
                SIZED_AT_ATTACH,
            ),
            (PIN_COUNTERS, u32_size, size_of::<Counters>(), 1),
            (PIN_COUNTERS_CARRIED, u32_size, size_of::<Counters>(), 1),
            (PIN_POLICIES, u32_size, size_of::<Policy>(), SIZED_AT_ATTACH),
            (
                PIN_PREFIXES_V4,
                trie_key(size_of::<Ipv4Key>()),
                u32_size,
                SIZED_AT_ATTACH,
            ),
            (
                PIN_PREFIXES_V6,
                trie_key(size_of::<Ipv6Key>()),
                u32_size,
                SIZED_AT_ATTACH,
            ),
            (
                PIN_SUBSCRIBERS,
                u32_size,
                size_of::<Subscriber>(),
                SIZED_AT_ATTACH,
            ),
            (PIN_AGGREGATES, u32_size, size_of::<Cell>(), SIZED_AT_ATTACH),
            (
                PIN_POLICY_STATS,
                u32_size,
                size_of::<PolicyStats>(),
                SIZED_AT_ATTACH,
            ),
            (
                PIN_POLICY_STATS_CARRIED,
                u32_size,
                size_of::<PolicyStats>(),
                SIZED_AT_ATTACH,
            ),
            (
                PIN_ADMISSION,
                u32_size,
                size_of::<AdmissionCells>(),
                SIZED_AT_ATTACH,
            ),
            // A ring buffer has no key or value: its size is its bytes.
            (PIN_EVENTS, 0, 0, EVENTS_BYTES),
            (PIN_WATCH, u32_size, size_of::<Watch>(), WATCH_ENTRIES),
            (
                PIN_TRACES,
                u32_size,
                size_of::<TraceBucket>(),
                TRACE_BUCKETS,
            ),
            (PIN_FIRSTS, u32_size, size_of::<Cell>(), SIZED_AT_ATTACH),
            (
                PIN_METER2,
                size_of::<Ipv4Key>(),
                size_of::<Meter2Cells>(),
                SIZED_AT_ATTACH,
            ),
            (
                PIN_METER2_6,
                size_of::<Ipv6Key>(),
                size_of::<Meter2Cells>(),
                SIZED_AT_ATTACH,
            ),
            (
                PIN_METER2_SHARED,
                u32_size,
                size_of::<Meter2Cells>(),
                SIZED_AT_ATTACH,
            ),
        ];
        let newest = current();
        assert_eq!(newest.version, LAYOUT_VERSION);
        assert_eq!(
            newest.maps.len(),
            expected.len(),
            "the newest layout has other maps than the types"
        );
        for &(pin, key, value, entries) in expected {
            let m = newest
                .map(pin)
                .unwrap_or_else(|| panic!("the newest layout has no map {pin}"));
            assert_eq!(
                (m.key_size as usize, m.value_size as usize, m.max_entries),
                (key, value, entries),
                "{pin}: the types say key {key}, value {value}, {entries} entries; \
                 the layout {} says otherwise: a layout change needs a new layout (see \
                 shaper_common::layout)",
                newest.version,
            );
        }
    }

    #[test]
    fn layouts_are_numbered_in_order_and_each_differs_from_the_last() {
        for (i, l) in LAYOUTS.iter().enumerate() {
            assert_eq!(l.version as usize, i + 1);
            for (j, m) in l.maps.iter().enumerate() {
                assert!(
                    l.maps[..j]
                        .iter()
                        .all(|o| o.pin != m.pin && o.name != m.name),
                    "layout {}: {} twice",
                    l.version,
                    m.pin
                );
            }
            assert_eq!(l.versioned(), l.map(PIN_LAYOUT).is_some());
            if let Some(v) = l.map(PIN_LAYOUT) {
                assert_eq!(*v, VERSION, "the version map never changes");
            }
        }
        for pair in LAYOUTS.windows(2) {
            assert_ne!(pair[0].maps, pair[1].maps, "layout {}", pair[1].version);
        }
        assert!(layout(FIRST_VERSIONED).is_some_and(Layout::versioned));
        assert!(!layout(FIRST_VERSIONED - 1).is_some_and(Layout::versioned));
    }

    /// Unversioned layouts are told apart by their maps alone: no two may look alike.
    #[test]
    fn unversioned_layouts_are_told_apart_by_their_maps() {
        let unversioned = || LAYOUTS.iter().filter(|l| !l.versioned());
        for (i, a) in unversioned().enumerate() {
            for b in unversioned().skip(i + 1) {
                assert!(
                    a.maps.iter().any(|m| b.map(m.pin) != Some(m)),
                    "layouts {} and {} have the same maps",
                    a.version,
                    b.version
                );
            }
        }
    }

    #[test]
    fn a_pinned_map_matches_as_libbpf_checks() {
        let m = PREFIXES_V4;
        assert!(m.matches(LPM, 8, 4, SLOTS, BPF_F_NO_PREALLOC));
        assert!(!m.matches(HASH, 8, 4, SLOTS, BPF_F_NO_PREALLOC));
        assert!(!m.matches(LPM, 20, 4, SLOTS, BPF_F_NO_PREALLOC));
        assert!(!m.matches(LPM, 8, 8, SLOTS, BPF_F_NO_PREALLOC));
        assert!(!m.matches(LPM, 8, 4, SLOTS + 1, BPF_F_NO_PREALLOC));
        assert!(!m.matches(LPM, 8, 4, SLOTS, 0));
        // The per-source maps take whatever size they were given at attach.
        assert!(SOURCES.matches(LRU, 4, 72, 1024, 0));
        assert!(!SOURCES.matches(LRU, 4, 72, 0, 0));
    }
}
