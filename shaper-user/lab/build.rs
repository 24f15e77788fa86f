use aya_build::{Package, Toolchain};

/// Builds the kernel programs (shaper-ebpf) with the nightly toolchain and bpf-linker,
/// so the lab can embed the bench object (`shaper-ebpf-bench`: the no-op, the floor and the softirq
/// tracepoints; the product object comes from shaper-user) with `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shaper-ebpf");
    aya_build::build_ebpf(
        [Package {
            name: "shaper-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
