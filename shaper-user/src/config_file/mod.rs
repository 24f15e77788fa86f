//! The declarative configuration file of `shaper apply -f FILE.toml` and `shaper config
//! show`: interfaces with their settings and default rate, and their prefix policies.
//!
//! ```toml
//! [[interface]]
//! name = "eth0"
//! rate = "10mbit"          # the default policy, per source
//! burst = "64k"
//! mode = "enforce"         # or "monitor": the whole interface dry-runs
//! key = "src"              # optional: src | dst
//! prefix_v4 = 32           # optional: keys masked to these prefixes
//! prefix_v6 = 64
//! xdp_mode = "auto"        # optional: auto | native | skb
//! max_sources = 262144     # optional
//! excess_rate = "10mbit"   # optional: a bandwidth profile's excess, marked, not dropped
//! excess_burst = "64k"
//! excess_dscp = "cs1"      # optional: the mark (default "le"); a name or 0-63
//! packet_rate = "20k"      # optional: frames a second per source, beside the bytes
//! packet_burst = 2000
//!
//! [[interface.policy]]
//! prefix = "203.0.113.0/24"
//! action = "limit"         # limit (default) | pass | drop
//! rate = "4mbit"
//! burst = "64k"
//! aggregate_rate = "10mbit"   # optional: the whole prefix shares this
//! aggregate_burst = "128k"
//! mode = "enforce"         # optional
//! # and, as the interface: excess_rate, excess_burst, excess_dscp, packet_rate, packet_burst
//! ```
//!
//! Subscribers (`crate::subscriber`): named plans, and each interface's subscribers, a
//! plan named or inline, or a LibreQoS file's circuits (`crate::import`):
//!
//! ```toml
//! [plan.business]          # rate and burst the subscriber's; per_address_rate and
//! rate = "50mbit"          # per_address_burst, excess_rate, excess_burst, excess_dscp,
//! burst = "512k"           # mode as `subscriber set`'s flags
//!
//! [[interface.subscriber]]   # under an [[interface]], which may set max_subscribers and
//! id = "b2077"               # prune_subscribers
//! prefixes = ["198.51.100.0/29", "2001:db8:2077::/48"]
//! plan = "business"
//!
//! [interface.libreqos]
//! file = "ShapedDevices.csv" # relative to the file; committed_from_min, excess_dscp, burst_time
//! ```
//!
//! The file is the whole truth for each interface it names: policies not in it are
//! removed; subscribers not in it are removed only with `prune_subscribers = true`.
//! Interfaces it does not name are left alone. Every error names the file, the line and the
//! field. [`parse_file`] gives the named plans too ([`Parsed::plans`]).

mod accounting;
mod file;
mod model;
mod radius;
mod render;

pub use file::{MAX_FILE_BYTES, ReadError, read, read_bytes};
pub use model::{
    FileError, Parsed, parse, parse_deferring, parse_file, parse_plans, parse_policy,
    parse_subscriber,
};
pub use radius::{MAX_SECRET_BYTES, has_inline_secret, parse_radius};
pub use render::render;
