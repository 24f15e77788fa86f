//! The CPUs a measurement runs on: how many are online, and pinning a thread to one
//! (`BPF_PROG_TEST_RUN` runs on the calling CPU).

use anyhow::{Context as _, Result};

/// Pins the calling thread to `cpu` (`BPF_PROG_TEST_RUN` runs on the calling CPU).
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t filled by the libc helper, valid for the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("pinning a thread to CPU {cpu}"));
        }
    }
    Ok(())
}

/// CPUs online now.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}
