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
//! The file is the whole truth for each interface it names: policies not in it are
//! removed. Interfaces it does not name are left alone. Every error names the file, the
//! line and the field.

mod file;
mod model;
mod render;

pub use file::{MAX_FILE_BYTES, ReadError, read, read_bytes};
pub use model::{FileError, Parsed, parse, parse_file};
pub use render::render;
