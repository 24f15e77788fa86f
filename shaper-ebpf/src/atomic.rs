//! The two atomic operations the per-packet path needs on shared map values.
//!
//! The bpfel target has no compare-and-swap in `core::sync::atomic`, so on BPF these use
//! the compiler intrinsics (`BPF_CMPXCHG`, `BPF_ADD`); the host build uses std's atomics
//! so the crate still builds and lints there.
//!
//! # Safety
//! Every function takes a pointer to an aligned, live `u64` that other CPUs access only
//! through these functions: a map value, or a value of the program's own.

#[cfg(target_arch = "bpf")]
use core::intrinsics::{AtomicOrdering::SeqCst, atomic_cxchg, atomic_xadd};

/// Reads a u64 another CPU may be writing. (An atomic load does not compile at the
/// default BPF cpu version; an aligned 64-bit load is single-copy atomic anyway.)
///
/// # Safety
/// See the module.
#[inline(always)]
pub unsafe fn load(p: *const u64) -> u64 {
    unsafe { core::ptr::read_volatile(p) }
}

/// Stores `new` if `*p == old`; otherwise returns the value found.
///
/// # Safety
/// See the module.
#[inline(always)]
pub unsafe fn compare_exchange(p: *mut u64, old: u64, new: u64) -> Result<(), u64> {
    #[cfg(target_arch = "bpf")]
    let (found, ok) = unsafe { atomic_cxchg::<u64, { SeqCst }, { SeqCst }>(p, old, new) };
    #[cfg(not(target_arch = "bpf"))]
    let (found, ok) = {
        use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
        match unsafe { AtomicU64::from_ptr(p) }.compare_exchange(old, new, SeqCst, SeqCst) {
            Ok(v) => (v, true),
            Err(v) => (v, false),
        }
    };
    if ok { Ok(()) } else { Err(found) }
}

/// `*p += v`, atomically.
///
/// # Safety
/// See the module.
#[inline(always)]
pub unsafe fn add(p: *mut u64, v: u64) {
    #[cfg(target_arch = "bpf")]
    unsafe {
        atomic_xadd::<u64, u64, { SeqCst }>(p, v);
    }
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(p)
            .fetch_add(v, core::sync::atomic::Ordering::SeqCst);
    }
}
