#![no_std]
//! Empty library target: shaper-user lists this crate as a build dependency so cargo
//! rebuilds the loader when the kernel programs change. The programs are in `main.rs`.
