//! Shared by shaper's kernel programs (`shaper-ebpf`, `no_std`) and userspace
//! (`shaper-user`, with feature `user`): the GCRA arithmetic and the map layouts.
#![no_std]

pub mod bench;
#[cfg(feature = "user")]
pub mod config;
pub mod gcra;
pub mod maps;
pub mod rescale;
