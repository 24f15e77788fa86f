//! Real VLAN sub-interfaces: an 802.1Q device and an 802.1ad (QinQ) device with an 802.1Q
//! device on top, on each end of the lab's veth, with shaper attached to the rx veth
//! itself, so the program sees the frames tagged as they are on the wire (the sending
//! veth's VLAN offload is off, so the tags are in the frames' bytes). Traffic from an
//! address on each tagged device must be metered by its source address, within one
//! bucket, and reach the tagged device at the other end.
//!
//! The host kernel this was written on has no 8021q module, so this runs in the kernel
//! matrix's guests only (`xtask/src/vm.rs`), where time is emulated: the rate is checked
//! as a bound (what passed is no more than rate × time + burst), never as accuracy.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use shaper_lab::{bins, cli, cli::AttachGuard, lab::Lab};
use shaper_user::netns;

const RATE_BPS: u64 = 1_000_000;
const BURST: u64 = 16_384;
/// UDP payload: 1000 + 28 + 14 bytes of headers, and 4 per tag.
const PAYLOAD: usize = 1000;
const FRAMES: u64 = 1000;
const PORT: u16 = 9;

/// One tagged path: the device on each end (made on the veth ends), and the addresses.
struct Tagged {
    name: &'static str,
    /// `ip link add` arguments after `link PARENT name DEV`, one device after another.
    stack: &'static [(&'static str, &'static [&'static str])],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    tags: usize,
}

const PATHS: &[Tagged] = &[
    Tagged {
        name: "802.1Q",
        stack: &[("v100", &["type", "vlan", "protocol", "802.1Q", "id", "100"])],
        src: Ipv4Addr::new(198, 18, 1, 11),
        dst: Ipv4Addr::new(198, 18, 1, 1),
        tags: 1,
    },
    Tagged {
        name: "802.1ad + 802.1Q",
        stack: &[
            (
                "s200",
                &["type", "vlan", "protocol", "802.1ad", "id", "200"],
            ),
            ("c300", &["type", "vlan", "protocol", "802.1Q", "id", "300"]),
        ],
        src: Ipv4Addr::new(198, 18, 2, 11),
        dst: Ipv4Addr::new(198, 18, 2, 1),
        tags: 2,
    },
];

/// Makes `path`'s devices on `parent` in `ns` with `addr`; returns the top device.
fn make(ns: &shaper_lab::lab::Netns, parent: &str, path: &Tagged, addr: Ipv4Addr) -> String {
    let mut below = parent.to_owned();
    for (suffix, args) in path.stack {
        let dev = format!("{}{suffix}", &parent[..3]);
        let mut all = vec!["link", "add", "link", &below, "name", &dev];
        all.extend_from_slice(args);
        ns.ip(&all).unwrap();
        ns.ip(&["link", "set", "dev", &dev, "up"]).unwrap();
        below = dev;
    }
    ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", &below])
        .unwrap();
    below
}

/// The MAC address of `dev` in `ns`.
fn mac(ns: &shaper_lab::lab::Netns, dev: &str) -> String {
    let out = ns.ip_output(&["-j", "link", "show", "dev", dev]).unwrap();
    let links: serde_json::Value = serde_json::from_str(&out).unwrap();
    links[0]["address"].as_str().unwrap().to_owned()
}

#[test]
#[ignore = "needs root and the 8021q module: the kernel matrix's guests (cargo xtask test --kernel)"]
fn tagged_frames_on_vlan_devices_are_metered_by_source() {
    let lab = Lab::new("vlan", 1).unwrap();
    let (tx, rx) = (lab.tx_netns(), lab.rx_netns());
    let shaper = bins::shaper();
    let mut guard = AttachGuard::new(shaper, lab.rx_ns(), lab.rx_iface());
    for path in PATHS {
        let tx_dev = make(tx, lab.tx_iface(), path, path.src);
        let rx_dev = make(rx, lab.rx_iface(), path, path.dst);
        // No ARP: each end knows the other (VLAN devices take their parent's address).
        let (tx_mac, rx_mac) = (mac(tx, &tx_dev), mac(rx, &rx_dev));
        for (ns, dev, addr, at) in [
            (tx, &tx_dev, path.dst, &rx_mac),
            (rx, &rx_dev, path.src, &tx_mac),
        ] {
            let addr = addr.to_string();
            ns.ip(&[
                "neigh",
                "replace",
                &addr,
                "lladdr",
                at,
                "dev",
                dev,
                "nud",
                "permanent",
            ])
            .unwrap();
        }
    }
    // The sending veth inserts the tags itself: with its VLAN offload on, the tags would
    // travel beside the frame (skb metadata), and XDP on the peer would never see them.
    let script = format!(
        "ethtool -K {} tx-vlan-hw-insert off tx-vlan-stag-hw-insert off",
        lab.tx_iface()
    );
    let exec = ["netns", "exec", lab.tx_ns(), "sh", "-c", &script];
    let out = std::process::Command::new("ip")
        .args(exec)
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {out:?}");
    guard
        .attach(&["--rate", "1mbit", "--burst", "16k"])
        .unwrap();

    let start = Instant::now();
    for path in PATHS {
        let dst = path.dst;
        let receiver = netns::run_in(lab.rx_ns(), move || UdpSocket::bind((dst, PORT)))
            .unwrap()
            .unwrap();
        receiver.set_nonblocking(true).unwrap();
        let src = path.src;
        let sender = netns::run_in(lab.tx_ns(), move || UdpSocket::bind((src, 0)))
            .unwrap()
            .unwrap();
        let to = SocketAddr::from((path.dst, PORT));
        let payload = [0u8; PAYLOAD];
        let sent = (0..FRAMES)
            .filter(|_| sender.send_to(&payload, to).is_ok())
            .count() as u64;
        // Let what is under way arrive, then count it.
        std::thread::sleep(Duration::from_millis(500));
        let mut buf = [0u8; 2048];
        let mut received = 0u64;
        while receiver.recv_from(&mut buf).is_ok() {
            received += 1;
        }
        let elapsed = start.elapsed().as_secs_f64();
        let stats = cli::stats(shaper, lab.rx_ns(), lab.rx_iface()).unwrap();
        let counts = stats.key(path.src);
        let frame = (PAYLOAD + 42 + 4 * path.tags) as u64;
        let bound = RATE_BPS as f64 / 8.0 * elapsed + BURST as f64;
        println!(
            "{}: sent {sent} frames of {frame} bytes, metered {} ({} passed, {} bytes; {} dropped), received {received}; bound {bound:.0} bytes after {elapsed:.2} s",
            path.name,
            counts.packets(),
            counts.passed_packets,
            counts.passed_bytes,
            counts.dropped_packets
        );
        // Metered by its source address: the tags were read, not counted as another
        // ethertype; each frame charged its whole length, tags included.
        assert!(counts.packets() > 0 && counts.packets() <= sent);
        assert_eq!(counts.passed_bytes, counts.passed_packets * frame);
        assert!(
            counts.passed_bytes as f64 <= bound,
            "{} bytes passed, one bucket allows {bound:.0}",
            counts.passed_bytes
        );
        assert!(counts.dropped_packets > 0, "never over its rate");
        // What passed reached the tagged device at the other end.
        assert!(received > 0 && received <= counts.passed_packets);
    }
    let stats = cli::stats(shaper, lab.rx_ns(), lab.rx_iface()).unwrap();
    assert_eq!(stats.total("vlan_too_deep_packets"), 0);
    guard.detach().unwrap();
}
