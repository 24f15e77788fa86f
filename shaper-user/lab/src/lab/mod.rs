//! A throwaway test network: two network namespaces joined by one veth pair, for the kernel
//! integration tests, `shaper-lab demo` and the benchmarks.
//!
//! ```text
//!  netns <tx>                                      netns <rx>
//!  sht...  198.18.0.11/24, .12, ...  <== veth ==>  shr...  198.18.0.1/24   (shaper attaches here)
//! ```
//!
//! [`Lab::routed`] puts a router namespace in between, for the benchmarks:
//!
//! ```text
//!  netns <tx>                  netns <rt> (forwards)                 netns <rx>
//!  sht... 198.18.0.11/24 <==> shi... 198.18.0.254/24
//!                             sho... 198.19.0.254/24  <==>  shr... 198.19.0.1/24
//! ```
//!
//! A queue in the sender's own namespace pushes back on the sending socket (the queued
//! packets still count against its send buffer), so a tc limiter there can never be
//! offered more than it lets through. A routed packet has left its socket (IP input
//! orphans it), so a queue on the router's egress `sho...` sees the offered load as it is,
//! as a router's queue on a real link does.
//!
//! Everything lives in namespaces this module creates, so the machine's own interfaces are
//! never touched, and addresses come from 198.18.0.0/15 (RFC 2544, benchmarking). Dropping
//! the [`Lab`] deletes the namespaces, which deletes the veth pairs with them.

pub mod ns;
pub mod ping;
mod queues;
pub mod raw;
pub mod tcp;
pub mod traffic;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, Result, bail, ensure};

pub use ns::Netns;
pub use traffic::{Flow, FlowResult, Late, RunOptions, RunReport, run_udp, run_udp_with};

/// The receiver's address, on the rx veth.
pub const RX_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The receiver's address in a routed lab, and the router's addresses on each side.
pub const ROUTED_RX_ADDR: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const ROUTER_TX_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);
const ROUTER_RX_SIDE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 254);
/// The receiver's IPv6 address (2001:2::/48 is IPv6's benchmarking block, RFC 5180); the
/// sources are 2001:2:0:1::11, 2001:2:0:2::11, ...: one /64 each, so that shaper's default
/// IPv6 key (the /64) meters them apart.
pub const RX_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1);

/// What a lab has besides its IPv4 sources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LabOptions {
    /// A router namespace between tx and rx ([`Lab::routed`]).
    pub routed: bool,
    /// IPv6 addresses too: one per source ([`Lab::sources6`]) and [`RX_ADDR6`].
    pub ipv6: bool,
    /// A veth with a queue pair per online CPU, each CPU sending on its own queue (XPS),
    /// so that frames sent on a CPU are received, and run through XDP, on that CPU (a
    /// veth receive queue's NAPI runs where its sender scheduled it). Not routed.
    pub queue_per_cpu: bool,
}
/// Host part of the first source address; sources are .11, .12, ...
const FIRST_SOURCE_HOST: u8 = 11;
/// Most sources one lab has (.11 ..= .210 stays inside the /24).
pub const MAX_SOURCES: usize = 200;
const PREFIX_LEN: u8 = 24;
/// Linux interface names hold at most 15 bytes (IFNAMSIZ minus the NUL).
const MAX_IFNAME_LEN: usize = 15;

/// Numbers the labs of this process, so parallel tests never pick the same names.
static NEXT_LAB: AtomicU32 = AtomicU32::new(0);

/// Two namespaces, sender `tx` and receiver `rx`, joined by a veth pair, with static
/// neighbour entries both ways so no ARP happens while traffic runs.
#[derive(Debug)]
pub struct Lab {
    // Each Netns deletes its namespace when dropped; that is all the cleanup a lab needs.
    tx: Netns,
    rx: Netns,
    router: Option<Router>,
    tx_iface: String,
    rx_iface: String,
    rx_addr: Ipv4Addr,
    sources: Vec<Ipv4Addr>,
    /// Empty unless the lab has IPv6.
    sources6: Vec<Ipv6Addr>,
}

/// The forwarding namespace of a routed lab and its two veth ends.
#[derive(Debug)]
struct Router {
    ns: Netns,
    /// Peer of the tx veth.
    in_iface: String,
    /// Peer of the rx veth; its egress carries everything to the receiver.
    out_iface: String,
}

/// The names one lab uses, unique per process (pid) and per call (counter).
struct Names {
    tx_ns: String,
    rx_ns: String,
    router_ns: String,
    tx_iface: String,
    rx_iface: String,
    router_in: String,
    router_out: String,
}

impl Names {
    fn new(tag: &str) -> Result<Names> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        ensure!(
            !tag.is_empty() && tag.len() <= 32 && tag.chars().all(allowed),
            "bad lab tag {tag:?}: use 1..=32 of [A-Za-z0-9_-]"
        );
        let pid = std::process::id();
        let n = NEXT_LAB.fetch_add(1, Ordering::Relaxed);
        // The pid is zero-padded to a fixed width so "pid 1, lab 23" and "pid 12, lab 3"
        // cannot spell the same interface name.
        let short = format!("{:05}{n}", pid % 100_000);
        let names = Names {
            tx_ns: format!("shlab-{tag}-{pid}-{n}-tx"),
            rx_ns: format!("shlab-{tag}-{pid}-{n}-rx"),
            router_ns: format!("shlab-{tag}-{pid}-{n}-rt"),
            tx_iface: format!("sht{short}"),
            rx_iface: format!("shr{short}"),
            router_in: format!("shi{short}"),
            router_out: format!("sho{short}"),
        };
        if names.tx_iface.len() > MAX_IFNAME_LEN {
            bail!(
                "interface name {} is longer than {MAX_IFNAME_LEN} bytes (too many labs in one process)",
                names.tx_iface
            );
        }
        Ok(names)
    }
}

impl Lab {
    /// Creates the two namespaces, the veth pair, `sources` sender addresses
    /// (198.18.0.11, .12, ...; 1..=200) and the receiver address 198.18.0.1.
    ///
    /// `tag` (1..=32 of `[A-Za-z0-9_-]`) goes into the namespace names, to tell labs apart
    /// in `ip netns list`.
    pub fn new(tag: &str, sources: usize) -> Result<Lab> {
        Lab::with(tag, sources, LabOptions::default())
    }

    /// Like [`Lab::new`], with a router namespace between tx and rx (see the module
    /// docs): the receiver is 198.19.0.1 and tc limiters go on [`Lab::egress`].
    pub fn routed(tag: &str, sources: usize) -> Result<Lab> {
        let options = LabOptions {
            routed: true,
            ..LabOptions::default()
        };
        Lab::with(tag, sources, options)
    }

    /// A lab with `options` (IPv6, a router).
    pub fn with(tag: &str, sources: usize, options: LabOptions) -> Result<Lab> {
        let routed = options.routed;
        ensure!(
            (1..=MAX_SOURCES).contains(&sources),
            "a lab has 1..={MAX_SOURCES} sources, not {sources}"
        );
        ensure!(
            !(options.routed && (options.ipv6 || options.queue_per_cpu)),
            "a routed lab is IPv4 only, with a queue per veth"
        );
        let names = Names::new(tag)?;
        // From here on every created namespace is owned by a Netns, so an error (or panic)
        // in a later step removes what was made so far.
        let rx = Netns::create(&names.rx_ns)?;
        let tx = Netns::create(&names.tx_ns)?;
        let router = if routed {
            Some(Router {
                ns: Netns::create(&names.router_ns)?,
                in_iface: names.router_in,
                out_iface: names.router_out,
            })
        } else {
            None
        };
        let lab = Lab {
            tx,
            rx,
            router,
            tx_iface: names.tx_iface,
            rx_iface: names.rx_iface,
            rx_addr: if routed { ROUTED_RX_ADDR } else { RX_ADDR },
            sources: (0..sources)
                .map(|i| {
                    let host = FIRST_SOURCE_HOST + u8::try_from(i).expect("at most 200 sources");
                    Ipv4Addr::new(198, 18, 0, host)
                })
                .collect(),
            sources6: if options.ipv6 {
                (0..sources)
                    .map(|i| {
                        let subnet = u16::try_from(i + 1).expect("at most 200 sources");
                        Ipv6Addr::new(0x2001, 2, 0, subnet, 0, 0, 0, 0x11)
                    })
                    .collect()
            } else {
                Vec::new()
            },
        };
        let queues = if options.queue_per_cpu {
            crate::bench::cpus::online_cpus()
        } else {
            1
        };
        let set_up = match &lab.router {
            None => lab.set_up(queues),
            Some(router) => lab.set_up_routed(router),
        };
        set_up.with_context(|| format!("cannot set up lab {}/{}", lab.tx_ns(), lab.rx_ns()))?;
        Ok(lab)
    }

    fn set_up(&self, queues: usize) -> Result<()> {
        veth_pair(&self.tx, &self.tx_iface, &self.rx, &self.rx_iface, queues)?;
        if queues > 1 {
            queues::send_on_own_queue(&self.tx, &self.tx_iface, queues)?;
        }
        self.add_addresses()?;
        for (ns, iface) in [(&self.tx, &self.tx_iface), (&self.rx, &self.rx_iface)] {
            quiet(ns, iface)?;
            ns.ip(&["link", "set", "dev", "lo", "up"])?;
            ns.ip(&["link", "set", "dev", iface, "up"])?;
        }
        self.add_neighbours()?;
        if !self.sources6.is_empty() {
            self.add_ipv6()?;
        }
        Ok(())
    }

    /// IPv6 addresses without duplicate address detection (usable at once, and no DAD
    /// packets), an on-link route each way and permanent neighbours (no neighbour
    /// discovery while traffic runs).
    fn add_ipv6(&self) -> Result<()> {
        // Each address joins its solicited-node group, and the sender reports it (MLD,
        // from `::`, a key of its own) at once and again within the unsolicited report
        // interval (1 s): a test attaching right after may meter one such report. With
        // the interval at its least (1 ms) the reports are over before the lab is.
        let iface = self.tx_iface.clone();
        shaper_user::netns::run_in(self.tx.name(), move || -> std::io::Result<()> {
            for version in ["mldv1", "mldv2"] {
                std::fs::write(
                    format!(
                        "/proc/sys/net/ipv6/conf/{iface}/{version}_unsolicited_report_interval"
                    ),
                    "1",
                )?;
            }
            Ok(())
        })?
        .context("cannot set the sender's MLD report interval")?;
        self.add_ipv6_addresses()?;
        std::thread::sleep(std::time::Duration::from_millis(100));
        Ok(())
    }

    fn add_ipv6_addresses(&self) -> Result<()> {
        let tx_mac = mac_of(&self.tx, &self.tx_iface)?;
        let rx_mac = mac_of(&self.rx, &self.rx_iface)?;
        let (tx, rx) = (&self.tx_iface, &self.rx_iface);
        let mut tx_lines: Vec<String> = self
            .sources6
            .iter()
            .map(|src| format!("addr add {src}/64 dev {tx} nodad"))
            .collect();
        tx_lines.push(format!("route add {RX_ADDR6}/128 dev {tx}"));
        tx_lines.push(format!(
            "neigh replace {RX_ADDR6} lladdr {rx_mac} dev {tx} nud permanent"
        ));
        self.tx.ip_batch(&tx_lines)?;
        let mut rx_lines = vec![
            format!("addr add {RX_ADDR6}/64 dev {rx} nodad"),
            format!("route add 2001:2::/48 dev {rx}"),
        ];
        rx_lines.extend(
            self.sources6
                .iter()
                .map(|src| format!("neigh replace {src} lladdr {tx_mac} dev {rx} nud permanent")),
        );
        self.rx.ip_batch(&rx_lines)
    }

    fn set_up_routed(&self, router: &Router) -> Result<()> {
        let rt = &router.ns;
        let (rin, rout) = (router.in_iface.as_str(), router.out_iface.as_str());
        veth_pair(&self.tx, &self.tx_iface, rt, rin, 1)?;
        veth_pair(rt, rout, &self.rx, &self.rx_iface, 1)?;
        self.add_source_addresses()?;
        rt.ip(&[
            "addr",
            "add",
            &format!("{ROUTER_TX_SIDE}/{PREFIX_LEN}"),
            "dev",
            rin,
        ])?;
        rt.ip(&[
            "addr",
            "add",
            &format!("{ROUTER_RX_SIDE}/{PREFIX_LEN}"),
            "dev",
            rout,
        ])?;
        let rx_addr = format!("{}/{PREFIX_LEN}", self.rx_addr);
        self.rx
            .ip(&["addr", "add", &rx_addr, "dev", &self.rx_iface])?;
        for (ns, iface) in [
            (&self.tx, self.tx_iface.as_str()),
            (rt, rin),
            (rt, rout),
            (&self.rx, self.rx_iface.as_str()),
        ] {
            quiet(ns, iface)?;
            ns.ip(&["link", "set", "dev", "lo", "up"])?;
            ns.ip(&["link", "set", "dev", iface, "up"])?;
        }
        let rin_owned = rin.to_owned();
        shaper_user::netns::run_in(rt.name(), move || -> std::io::Result<()> {
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
            // No reverse-path filter: the router forwards a spoofed flood from sources it
            // has no route to, as a transit router does (a namespace's IPv4 settings are
            // the host's, which may filter).
            for conf in ["all", "default", rin_owned.as_str()] {
                std::fs::write(format!("/proc/sys/net/ipv4/conf/{conf}/rp_filter"), "0")?;
            }
            Ok(())
        })?
        .context("cannot enable forwarding in the router namespace")?;
        let rx_net = format!("{}/{PREFIX_LEN}", Ipv4Addr::new(198, 19, 0, 0));
        let tx_net = format!("{}/{PREFIX_LEN}", Ipv4Addr::new(198, 18, 0, 0));
        let (to_rt_tx, to_rt_rx) = (ROUTER_TX_SIDE.to_string(), ROUTER_RX_SIDE.to_string());
        self.tx.ip(&[
            "route",
            "add",
            &rx_net,
            "via",
            &to_rt_tx,
            "dev",
            &self.tx_iface,
        ])?;
        self.rx.ip(&[
            "route",
            "add",
            &tx_net,
            "via",
            &to_rt_rx,
            "dev",
            &self.rx_iface,
        ])?;

        // Static neighbours on every hop, as in the plain lab.
        let tx_mac = mac_of(&self.tx, &self.tx_iface)?;
        let rin_mac = mac_of(rt, rin)?;
        let rout_mac = mac_of(rt, rout)?;
        let rx_mac = mac_of(&self.rx, &self.rx_iface)?;
        permanent_neighbour(&self.tx, &self.tx_iface, ROUTER_TX_SIDE, &rin_mac)?;
        permanent_neighbour(&self.rx, &self.rx_iface, ROUTER_RX_SIDE, &rout_mac)?;
        let mut lines = self.source_neighbours(rin, &tx_mac);
        lines.push(format!(
            "neigh replace {} lladdr {rx_mac} dev {rout} nud permanent",
            self.rx_addr
        ));
        rt.ip_batch(&lines)
    }

    fn add_addresses(&self) -> Result<()> {
        let rx_addr = format!("{}/{PREFIX_LEN}", self.rx_addr);
        self.rx
            .ip(&["addr", "add", &rx_addr, "dev", &self.rx_iface])?;
        self.add_source_addresses()
    }

    fn add_source_addresses(&self) -> Result<()> {
        let lines: Vec<String> = self
            .sources
            .iter()
            .map(|src| format!("addr add {src}/{PREFIX_LEN} dev {}", self.tx_iface))
            .collect();
        self.tx.ip_batch(&lines)
    }

    /// Static (permanent) entries both ways: traffic starts at full rate without ARP, and
    /// a shaper that drops ARP replies under load cannot starve a test.
    fn add_neighbours(&self) -> Result<()> {
        let tx_mac = mac_of(&self.tx, &self.tx_iface)?;
        let rx_mac = mac_of(&self.rx, &self.rx_iface)?;
        permanent_neighbour(&self.tx, &self.tx_iface, self.rx_addr, &rx_mac)?;
        self.rx
            .ip_batch(&self.source_neighbours(&self.rx_iface, &tx_mac))
    }

    /// `ip -batch` lines making every IPv4 source a permanent neighbour at `tx_mac` on `dev`.
    fn source_neighbours(&self, dev: &str, tx_mac: &str) -> Vec<String> {
        self.sources
            .iter()
            .map(|src| format!("neigh replace {src} lladdr {tx_mac} dev {dev} nud permanent"))
            .collect()
    }

    /// The receiver namespace's name (where the shaper attaches: `shaper -n RX ...`).
    pub fn rx_ns(&self) -> &str {
        self.rx.name()
    }

    /// The sender namespace's name.
    pub fn tx_ns(&self) -> &str {
        self.tx.name()
    }

    /// The receiver namespace, to run `ip` in it.
    pub fn rx_netns(&self) -> &Netns {
        &self.rx
    }

    /// The sender namespace, to run `ip` in it.
    pub fn tx_netns(&self) -> &Netns {
        &self.tx
    }

    /// The veth end in the receiver namespace; traffic from the sources arrives here.
    pub fn rx_iface(&self) -> &str {
        &self.rx_iface
    }

    /// The veth end in the sender namespace.
    pub fn tx_iface(&self) -> &str {
        &self.tx_iface
    }

    /// The receiver's address (198.18.0.1; 198.19.0.1 in a routed lab).
    pub fn rx_addr(&self) -> Ipv4Addr {
        self.rx_addr
    }

    /// The receiver's IPv6 address, if the lab has IPv6.
    pub fn rx_addr6(&self) -> Option<Ipv6Addr> {
        (!self.sources6.is_empty()).then_some(RX_ADDR6)
    }

    /// The sender IPv6 addresses (2001:2:0:1::11, 2001:2:0:2::11, ...), if the lab has
    /// IPv6; empty otherwise.
    pub fn sources6(&self) -> &[Ipv6Addr] {
        &self.sources6
    }

    /// Where an egress limiter (tc qdisc) goes: the router's interface towards rx in a
    /// routed lab, else the tx veth (where the senders' sockets feel its queue).
    pub fn egress(&self) -> (&Netns, &str) {
        match &self.router {
            Some(router) => (&router.ns, &router.out_iface),
            None => (&self.tx, &self.tx_iface),
        }
    }

    /// Where an ingress limiter goes: the router's interface from the senders in a routed
    /// lab (shaper's XDP, an nft netdev ingress hook, hashlimit in PREROUTING all meet the
    /// traffic there), else the rx veth.
    pub fn ingress(&self) -> (&Netns, &str) {
        match &self.router {
            Some(router) => (&router.ns, &router.in_iface),
            None => (&self.rx, &self.rx_iface),
        }
    }

    /// Every veth end with the direction whose `dropped` count means the lab's own path
    /// lost frames: what each end sends (tx) or receives (rx) on the way to the receiver.
    pub(crate) fn path_ends(&self) -> Vec<(&Netns, &str, &'static str)> {
        let mut ends = vec![(&self.tx, self.tx_iface.as_str(), "tx")];
        if let Some(router) = &self.router {
            ends.push((&router.ns, &router.in_iface, "rx"));
            ends.push((&router.ns, &router.out_iface, "tx"));
        }
        ends.push((&self.rx, &self.rx_iface, "rx"));
        ends
    }

    /// The MAC address of the interface the tx veth delivers to (the router's input veth in
    /// a routed lab, else the rx veth): the destination a crafted frame needs to be
    /// received as the host's own ([`raw`]) rather than as another host's.
    pub fn first_hop_mac(&self) -> Result<[u8; 6]> {
        let (ns, iface) = match &self.router {
            Some(router) => (&router.ns, router.in_iface.as_str()),
            None => (&self.rx, self.rx_iface.as_str()),
        };
        let text = mac_of(ns, iface)?;
        let mut mac = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut mac {
            let part = parts
                .next()
                .with_context(|| format!("bad MAC address {text:?} of {iface}"))?;
            *byte = u8::from_str_radix(part, 16)
                .with_context(|| format!("bad MAC address {text:?} of {iface}"))?;
        }
        ensure!(
            parts.next().is_none(),
            "bad MAC address {text:?} of {iface}"
        );
        Ok(mac)
    }

    /// The sender addresses (198.18.0.11, .12, ...), all on the tx veth.
    pub fn sources(&self) -> &[Ipv4Addr] {
        &self.sources
    }

    /// A UDP flow of `frame_bytes`-byte frames from each of the first IPv4 sources, offered
    /// `offered` bits per second each, in order.
    pub fn flows(&self, offered: &[u64], frame_bytes: u32) -> Vec<Flow> {
        self.sources
            .iter()
            .zip(offered)
            .map(|(&src, &offered_bps)| Flow {
                src: src.into(),
                offered_bps,
                frame_bytes,
            })
            .collect()
    }

    /// Sets the MTU of every veth end (needed for frames above 1514 bytes).
    pub fn set_mtu(&self, mtu: u32) -> Result<()> {
        let mtu = mtu.to_string();
        for (ns, iface, _) in self.path_ends() {
            ns.ip(&["link", "set", "dev", iface, "mtu", &mtu])?;
        }
        Ok(())
    }

    /// Whether any XDP program (any mode) is attached to the rx veth.
    pub fn xdp_attached(&self) -> Result<bool> {
        let link = link_json(&self.rx, &self.rx_iface, true)?;
        Ok(link.get("xdp").is_some())
    }

    /// The id of the XDP program attached to the rx veth, if any.
    pub fn xdp_prog_id(&self) -> Result<Option<u64>> {
        let link = link_json(&self.rx, &self.rx_iface, true)?;
        Ok(link["xdp"]["prog"]["id"].as_u64())
    }
}

/// A veth pair: `a_iface` in `a`, its peer `b_iface` moved straight into `b`, each end
/// with `queues` transmit and receive queues.
/// Keeps `iface` of `ns` from sending frames of its own: no link-local IPv6 address, so
/// no duplicate address detection and no router solicitations from it (up to three, 4 s
/// apart, each a source the attached program meters: a test comparing sources saw one
/// appear mid-run). The lab's addresses and neighbours are all static.
fn quiet(ns: &Netns, iface: &str) -> Result<()> {
    ns.ip(&["link", "set", "dev", iface, "addrgenmode", "none"])
}

fn veth_pair(a: &Netns, a_iface: &str, b: &Netns, b_iface: &str, queues: usize) -> Result<()> {
    let q = queues.to_string();
    let q = ["numtxqueues", &q, "numrxqueues", &q];
    let mut args = vec!["link", "add", a_iface];
    args.extend(q);
    args.extend(["type", "veth", "peer", "name", b_iface]);
    args.extend(q);
    args.extend(["netns", b.name()]);
    a.ip(&args)?;
    for (ns, iface) in [(a, a_iface), (b, b_iface)] {
        // No IPv6 link-local address means no DAD, router or MLD packets to confuse the
        // counts. Best effort: it fails only where IPv6 is off, which is just as quiet.
        let _ = ns.ip(&["link", "set", "dev", iface, "addrgenmode", "none"]);
    }
    Ok(())
}

/// A permanent neighbour entry for `addr` at `mac` on `iface`.
fn permanent_neighbour(ns: &Netns, iface: &str, addr: Ipv4Addr, mac: &str) -> Result<()> {
    ns.ip(&[
        "neigh",
        "replace",
        &addr.to_string(),
        "lladdr",
        mac,
        "dev",
        iface,
        "nud",
        "permanent",
    ])
}

/// `ip [-d] -j link show dev IFACE` in `ns`, as the one JSON object it describes.
fn link_json(ns: &Netns, iface: &str, details: bool) -> Result<serde_json::Value> {
    let mut args = vec!["-j"];
    if details {
        args.push("-d");
    }
    args.extend(["link", "show", "dev", iface]);
    let out = ns.ip_output(&args)?;
    let mut links: Vec<serde_json::Value> = serde_json::from_str(&out)
        .with_context(|| format!("cannot parse `ip -j link show dev {iface}` output: {out}"))?;
    ensure!(
        links.len() == 1,
        "`ip -j link show dev {iface}` in {} listed {} links, expected 1",
        ns.name(),
        links.len()
    );
    Ok(links.swap_remove(0))
}

/// The interface's MAC address, as `ip` prints it.
fn mac_of(ns: &Netns, iface: &str) -> Result<String> {
    let link = link_json(ns, iface, false)?;
    link.get("address")
        .and_then(|a| a.as_str())
        .map(str::to_owned)
        .with_context(|| format!("no MAC address for {iface} in {}", ns.name()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use shaper_user::netns::NETNS_RUN_DIR;

    fn netns_exists(name: &str) -> bool {
        Path::new(NETNS_RUN_DIR).join(name).exists()
    }

    fn ip_netns_list() -> String {
        ns::run_command(std::process::Command::new("ip").args(["netns", "list"]))
            .expect("ip netns list")
    }

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn lab_is_created_and_removed() {
        let lab = Lab::new("t-create", 3).expect("create lab");
        let (tx, rx) = (lab.tx_ns().to_owned(), lab.rx_ns().to_owned());
        assert!(netns_exists(&tx) && netns_exists(&rx));
        assert!(lab.tx_iface().len() <= MAX_IFNAME_LEN);
        assert!(lab.rx_iface().len() <= MAX_IFNAME_LEN);
        assert_eq!(
            lab.sources(),
            [
                Ipv4Addr::new(198, 18, 0, 11),
                Ipv4Addr::new(198, 18, 0, 12),
                Ipv4Addr::new(198, 18, 0, 13)
            ]
        );
        assert!(!lab.xdp_attached().expect("xdp_attached"));
        lab.set_mtu(9000).expect("set mtu");
        // The static neighbour entries are in place (and survive the MTU change).
        let neigh = lab
            .rx_netns()
            .ip_output(&["neigh", "show", "dev", lab.rx_iface()])
            .expect("ip neigh");
        assert_eq!(neigh.matches("PERMANENT").count(), 3, "{neigh}");

        // A second lab at the same time gets its own names.
        let other = Lab::new("t-create", 1).expect("create second lab");
        assert_ne!(other.rx_ns(), lab.rx_ns());
        assert_ne!(other.rx_iface(), lab.rx_iface());
        drop(other);

        drop(lab);
        assert!(!netns_exists(&tx) && !netns_exists(&rx));
        let list = ip_netns_list();
        assert!(!list.contains(&tx) && !list.contains(&rx), "{list}");
    }

    #[test]
    #[ignore = "needs root: creates network namespaces (cargo xtask test)"]
    fn routed_lab_is_created_and_removed() {
        let lab = Lab::routed("t-routed", 2).expect("create routed lab");
        let (tx, rx) = (lab.tx_ns().to_owned(), lab.rx_ns().to_owned());
        let (router, egress) = lab.egress();
        let router = router.name().to_owned();
        assert!(netns_exists(&tx) && netns_exists(&rx) && netns_exists(&router));
        assert!(egress.len() <= MAX_IFNAME_LEN);
        // Four veth ends on the way, and the MTU reaches all of them.
        assert_eq!(lab.path_ends().len(), 4);
        lab.set_mtu(9000).expect("set mtu");
        drop(lab);
        for ns in [&tx, &rx, &router] {
            assert!(!netns_exists(ns), "{ns} left behind");
        }
    }

    #[test]
    fn bad_arguments_are_rejected_before_creating_anything() {
        assert!(Lab::new("t", 0).is_err());
        assert!(Lab::new("t", MAX_SOURCES + 1).is_err());
        assert!(Lab::new("bad/tag", 1).is_err());
    }
}
