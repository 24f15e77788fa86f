//! What the kernel objects share: the product's (`main.rs`, the `shaper-ebpf` object) and the
//! benchmark's (`bench/main.rs`, the `shaper-ebpf-bench` object, which the product never loads).
#![no_std]
// The bpfel target has no compare-and-swap in core::sync::atomic; see `atomic`.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(internal_features, reason = "core_intrinsics, see atomic.rs")
)]

pub mod atomic;
