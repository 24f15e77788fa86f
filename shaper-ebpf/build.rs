use which::which;

/// Rebuild when bpf-linker changes: it is the linker of every eBPF artifact here,
/// but cargo cannot see it as a dependency.
fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
