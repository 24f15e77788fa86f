//! Transmit queue per CPU on a veth: XPS (transmit packet steering) maps queue `i` to CPU
//! `i`, so what a thread on CPU `i` sends leaves on queue `i` and arrives on the peer's
//! receive queue `i`, whose NAPI (and XDP program) then runs on CPU `i`.

use std::process::Command;

use anyhow::{Context as _, Result};

use super::{Netns, ns::run_command};

/// Steers each CPU's frames on `iface` (in `ns`, with `queues` transmit queues) to a
/// queue of its own. The files are in the namespace's own sysfs, which `ip netns exec`
/// mounts for the command it runs (in a mount namespace of the command's own).
pub(crate) fn send_on_own_queue(ns: &Netns, iface: &str, queues: usize) -> Result<()> {
    let script: String = (0..queues)
        .map(|i| {
            format!(
                "echo {} > /sys/class/net/{iface}/queues/tx-{i}/xps_cpus; ",
                cpu_mask(i)
            )
        })
        .collect();
    run_command(Command::new("ip").args(["netns", "exec", ns.name(), "sh", "-c", &script]))
        .with_context(|| format!("cannot steer {iface}'s transmit queues by CPU"))
        .map(drop)
}

/// The CPU mask of CPU `cpu` as sysfs writes it: hex, in comma-separated 32-bit words.
fn cpu_mask(cpu: usize) -> String {
    format!("{:x}{}", 1u32 << (cpu % 32), ",00000000".repeat(cpu / 32))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_masks_are_in_32_bit_words() {
        assert_eq!(super::cpu_mask(0), "1");
        assert_eq!(super::cpu_mask(5), "20");
        assert_eq!(super::cpu_mask(33), "2,00000000");
    }
}
