//! shaper's userspace: loading, attaching and pinning the kernel programs, reading their
//! maps, and the pieces the `shaper` command is made of.

pub mod apply;
pub mod bpf;
pub mod config_file;
pub mod crash;
pub mod explain;
pub mod journal;
pub mod kernel;
pub mod link;
pub mod loader;
pub mod maps;
pub mod metrics;
pub mod netns;
pub mod pins;
pub mod policy;
pub mod setting;
pub mod sources;
pub mod system;
pub mod tc;
pub mod units;
pub mod upgrade;
pub mod watch;
