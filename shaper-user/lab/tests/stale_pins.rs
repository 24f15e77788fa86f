//! Pins outlive their interface when it is deleted; shaper must notice rather than
//! "update" a link that holds nothing.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use common::{attach, shaper};
use shaper_lab::lab::Lab;

fn status_json(ns: &str, iface: &str) -> serde_json::Value {
    let out = shaper(ns, &["-j", "status", iface]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0].clone()
}

#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn a_deleted_interface_leaves_stale_pins_that_attach_replaces() {
    let lab = Lab::new("stale", 1).unwrap();
    let ns = lab.rx_ns();
    let rx = lab.rx_netns();
    let add = || {
        rx.ip(&[
            "link", "add", "shst0", "type", "veth", "peer", "name", "shst1",
        ])
        .unwrap();
        rx.ip(&["link", "set", "shst0", "up"]).unwrap();
    };
    add();
    let guard = attach(ns, "shst0", "8mbit", "64k");
    assert_eq!(status_json(ns, "shst0")["interface_present"], true);

    rx.ip(&["link", "del", "shst0"]).unwrap();
    assert_eq!(status_json(ns, "shst0")["interface_present"], false);

    // Same name, new interface: attach must attach for real, not update the dead link.
    add();
    let out = shaper(
        ns,
        &["attach", "shst0", "--rate", "4mbit", "--burst", "64k"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("attached"));
    let status = status_json(ns, "shst0");
    assert_eq!(status["interface_present"], true);
    assert_eq!(status["rate_bits_per_sec"], 4_000_000);
    let link = rx
        .ip_output(&["-j", "-d", "link", "show", "dev", "shst0"])
        .unwrap();
    assert!(
        link.contains("\"xdp\""),
        "no XDP program on the new interface: {link}"
    );

    if let Err(e) = guard.detach() {
        panic!("{e:#}");
    }
    assert!(
        !std::path::Path::new("/sys/fs/bpf/shaper/netns")
            .join(ns)
            .exists()
    );
}
