//! Shared by shaper's kernel programs (`shaper-ebpf`, `no_std`) and userspace
//! (`shaper-user`, with feature `user`): the GCRA arithmetic, the map types and the
//! table of pin layouts.
#![no_std]

pub mod bench;
#[cfg(feature = "user")]
pub mod config;
pub mod dscp;
pub mod gcra;
pub mod keys;
pub mod layout;
pub mod maps;
pub mod rescale;
pub mod shape;
pub mod sources;
