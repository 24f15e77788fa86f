//! shaper's userspace: loading, attaching and pinning the kernel programs, reading their
//! maps, and the pieces the `shaper` command is made of.

pub mod admission;
pub mod api;
pub mod apply;
pub mod attach;
pub mod bpf;
pub mod change;
pub mod colour;
pub mod config_file;
pub mod crash;
pub mod detach;
pub mod explain;
pub mod fnv;
pub mod import;
pub mod journal;
pub mod kernel;
pub mod libreqos;
pub mod link;
pub mod maps;
pub mod metrics;
pub mod netns;
pub mod object;
pub mod owned;
pub mod pins;
pub mod policy;
pub mod radius;
pub mod request;
pub mod rows;
pub mod setting;
pub mod sources;
pub mod subscriber;
pub mod system;
pub mod tc;
pub mod units;
pub mod upgrade;
pub mod watch;
