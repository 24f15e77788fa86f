//! The kernel programs are built once, by shaper-user's build script, which says where
//! (`links`): the lab embeds the bench object (`shaper-ebpf-bench`: the no-op, the floor
//! and the softirq tracepoints) from there with `include_bytes_aligned!`.

fn main() {
    let dir = std::env::var("DEP_SHAPER_EBPF_OUT_DIR")
        .expect("shaper-user's build script names where it built the kernel programs");
    println!("cargo::rerun-if-env-changed=DEP_SHAPER_EBPF_OUT_DIR");
    println!("cargo::rustc-env=SHAPER_EBPF_DIR={dir}");
}
