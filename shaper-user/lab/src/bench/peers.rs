//! The per-source limiters people reach for on Linux today, set up on an interface of a lab
//! namespace for the benchmarks to measure shaper against:
//!
//! - an **nft meter** in the netdev family's ingress hook (before the IP stack, as close to
//!   XDP as nftables gets): `update @m { ip saddr limit rate over R bytes/second burst B
//!   bytes } drop`, a dynamic set of per-source limits;
//! - **iptables hashlimit** in the raw table's PREROUTING chain (the first IP hook, before
//!   connection tracking): `-m hashlimit --hashlimit-above Rb/s --hashlimit-burst Bb
//!   --hashlimit-mode srcip -j DROP`. (Debian's `iptables` is `iptables-nft`: the match is
//!   the kernel's `xt_hashlimit`, run through nf_tables' compatibility expression.)
//!
//! - an **nft meter in the netdev family's egress hook** (Linux 5.16+), the same meter on
//!   what a device sends: the hook runs in `dev_queue_xmit` just before tc egress (where
//!   shaper's `--direction egress` program and the qdiscs sit), on every frame the device
//!   sends, forwarded or local, with its Ethernet header. (inet `output` sees only what the
//!   host itself sends, never what it forwards; `postrouting` sees both but before the
//!   device, in the IP stack: netdev egress is the fair equivalent of tc egress.)
//!
//! All are policers like shaper: a frame over the limit is dropped, never queued. Each is
//! given the same table size as shaper's default source map, so a flood meets the same room.
//!
//! Everything is made inside the namespace given and removed by [`Peer`]'s `Drop` (the
//! namespace going removes it too).

use std::{
    io::Write as _,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, Result, bail};

/// The nft table the meter lives in.
const NFT_TABLE: &str = "shaperbench";
/// The hashlimit tables' names (`/proc/net/ipt_hashlimit/NAME`): this and a number, new for
/// each rule, so a table the kernel has not yet freed is never found and reused (a rule
/// with a known name shares the table of that name, entries and all).
const HASHLIMIT_NAME: &str = "shaperbench";
static NEXT_HASHLIMIT: AtomicU32 = AtomicU32::new(0);
/// Entries each peer's table may hold: shaper's default `--max-sources`.
pub const TABLE_ENTRIES: u32 = 262_144;

/// Which peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// netdev ingress, per source.
    Nft,
    /// netdev egress, per source.
    NftEgress,
    Hashlimit,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Nft => "nft",
            Kind::NftEgress => "nft egress",
            Kind::Hashlimit => "hashlimit",
        }
    }
}

/// The burst `kind` is actually given when `burst` bytes are asked for at `rate_bps`:
/// hashlimit in byte mode refuses a burst below one second of its rate (`burst cannot be
/// smaller than ...`, a second of its rate after its own rounding), so it gets a second
/// of the rate and 1% more.
pub fn burst_given(kind: Kind, rate_bps: u64, burst: u64) -> u64 {
    match kind {
        Kind::Nft | Kind::NftEgress => burst,
        // A second of the rate as hashlimit rounds it (it refused 1250000 at 10 Mbit/s,
        // asking for 1250016), with 1% to spare.
        Kind::Hashlimit => burst.max(rate_bps.div_ceil(8) * 101 / 100),
    }
}

/// A peer limiter set up on `iface` in namespace `ns`; removed when dropped.
#[derive(Debug)]
pub struct Peer {
    kind: Kind,
    ns: String,
    iface: String,
}

impl Peer {
    /// Limits every source address arriving on `iface` (leaving it, for
    /// [`Kind::NftEgress`]) to `rate_bps` with a burst of
    /// [`burst_given`]`(kind, rate_bps, burst)` bytes.
    pub fn install(kind: Kind, ns: &str, iface: &str, rate_bps: u64, burst: u64) -> Result<Peer> {
        // The guard exists before the first step, so a failing step undoes the others.
        let peer = Peer {
            kind,
            ns: ns.to_owned(),
            iface: iface.to_owned(),
        };
        let bytes_per_sec = rate_bps / 8;
        let burst = burst_given(kind, rate_bps, burst);
        match kind {
            Kind::Nft | Kind::NftEgress => {
                let hook = if kind == Kind::Nft {
                    "ingress"
                } else {
                    "egress"
                };
                let ruleset = format!(
                    "table netdev {NFT_TABLE} {{\n\
                     \tset m {{ type ipv4_addr; size {TABLE_ENTRIES}; flags dynamic; }}\n\
                     \tchain in {{\n\
                     \t\ttype filter hook {hook} device \"{iface}\" priority 0; policy accept;\n\
                     \t\tupdate @m {{ ip saddr limit rate over {bytes_per_sec} bytes/second burst {burst} bytes }} drop\n\
                     \t}}\n\
                     }}\n"
                );
                nft_file(ns, &ruleset).context("cannot set up the nft meter")?;
            }
            Kind::Hashlimit => {
                let name = format!(
                    "{HASHLIMIT_NAME}{}",
                    NEXT_HASHLIMIT.fetch_add(1, Ordering::Relaxed)
                );
                let args = [
                    "-t",
                    "raw",
                    "-A",
                    "PREROUTING",
                    "-i",
                    iface,
                    "-m",
                    "hashlimit",
                    "--hashlimit-above",
                    &format!("{bytes_per_sec}b/s"),
                    "--hashlimit-burst",
                    &format!("{burst}b"),
                    "--hashlimit-mode",
                    "srcip",
                    "--hashlimit-name",
                    &name,
                    "--hashlimit-htable-size",
                    "65536",
                    "--hashlimit-htable-max",
                    &TABLE_ENTRIES.to_string(),
                    "-j",
                    "DROP",
                ];
                let out = Command::new("ip")
                    .args(["netns", "exec", ns, "iptables"])
                    .args(args)
                    .stdin(Stdio::null())
                    .output()
                    .context("cannot run iptables (cargo xtask setup installs it)")?;
                if !out.status.success() {
                    bail!(
                        "iptables hashlimit: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
            }
        }
        Ok(peer)
    }
}

/// `nft -f -` in namespace `ns` with `ruleset` on its standard input.
fn nft_file(ns: &str, ruleset: &str) -> Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft (cargo xtask setup installs it)")?;
    child
        .stdin
        .take()
        .context("nft's stdin is not piped")?
        .write_all(ruleset.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft -f: {} (ruleset: {ruleset})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Drop for Peer {
    fn drop(&mut self) {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]);
        match self.kind {
            Kind::Nft | Kind::NftEgress => {
                cmd.args(["nft", "delete", "table", "netdev", NFT_TABLE]);
            }
            Kind::Hashlimit => {
                cmd.args(["iptables", "-t", "raw", "-F", "PREROUTING"]);
            }
        }
        // Errors ignored: this may run while unwinding, and the namespace goes soon after.
        let _ = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = &self.iface;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashlimit_gets_at_least_a_second_of_rate() {
        assert_eq!(burst_given(Kind::Nft, 8_000_000, 32_768), 32_768);
        assert_eq!(burst_given(Kind::Hashlimit, 8_000_000, 32_768), 1_010_000);
        assert_eq!(burst_given(Kind::Hashlimit, 100_000, 65_536), 65_536);
    }
}
