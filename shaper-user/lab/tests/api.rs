//! `shaper run`'s local API on its Unix socket, with curl as the client: a subscriber (an
//! IPv4 address and an IPv6 prefix) set, read back as `shaper -j subscriber show` reads
//! the kernel's maps, and deleted; policies of both families set, read and deleted; bad
//! bodies refused with a one-line error naming the field, nothing changed; a user
//! without privileges cannot connect, nor (the socket opened up by hand) be answered;
//! the socket removed when the daemon exits.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::{shaper, shaper_ok};
use serde_json::Value;
use shaper_lab::{
    cli::AttachGuard,
    daemon::{Daemon, config, scratch},
    lab::Netns,
};

const IFACE: &str = "sha0";

/// curl's request on `socket`, as `user` (`None`: root): its output.
fn curl_as(user: Option<u32>, socket: &Path, method: &str, path: &str, body: &str) -> Output {
    let mut cmd = match user {
        None => Command::new("curl"),
        Some(uid) => {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "curl",
                // What connect(2) said: curl's own line does not.
                "-v",
            ]);
            c
        }
    };
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ])
    .arg("--unix-socket")
    .arg(socket);
    if !body.is_empty() {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
        ]);
    }
    cmd.arg(format!("http://localhost{path}")).output().unwrap()
}

/// The API's answer as root: its status and JSON body.
fn call(socket: &Path, method: &str, path: &str, body: &str) -> (u16, Value) {
    let out = curl_as(None, socket, method, path, body);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "curl {method} {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (body, code) = text.rsplit_once('\n').unwrap();
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"));
    (code.parse().unwrap(), json)
}

/// The error of a refused call: one line, its status as expected.
fn refused(socket: &Path, method: &str, path: &str, body: &str, status: u16) -> String {
    let (code, json) = call(socket, method, path, body);
    assert_eq!(code, status, "{method} {path} {body}: {json}");
    let error = json["error"].as_str().unwrap().to_owned();
    assert!(!error.contains('\n'), "{error}");
    error
}

/// What the command line reads of the kernel's maps: `-j subscriber show` (`None` if it
/// has no such subscriber).
fn cli_show(ns: &str, direction: &str, id: &str) -> Option<Value> {
    let args = [
        "-j",
        "--direction",
        direction,
        "subscriber",
        "show",
        IFACE,
        id,
    ];
    let out = shaper(ns, &args);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

fn cli_policies(ns: &str) -> Value {
    serde_json::from_str(&shaper_ok(ns, &["-j", "policy", "list", IFACE])).unwrap()
}

/// A namespace with [`IFACE`] attached both ways (room for 16 subscribers), a daemon's
/// file with a `[plan.gold]`, and a directory of the test's own under /run for the API's
/// socket (one nobody may look into, so that only the socket's mode keeps them out).
struct ApiLab {
    _guards: [AttachGuard; 2],
    _ns: Netns,
    name: String,
    dir: PathBuf,
    run_dir: PathBuf,
}

impl Drop for ApiLab {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_dir_all(&self.run_dir);
    }
}

fn api_lab(tag: &str) -> ApiLab {
    let name = format!("{tag}-{}", std::process::id());
    let ns = Netns::create(&name).unwrap();
    ns.ip(&["link", "add", IFACE, "type", "dummy"])
        .or_else(|_| ns.ip(&["link", "add", IFACE, "type", "bridge"]))
        .unwrap();
    ns.ip(&["link", "set", "dev", IFACE, "up"]).unwrap();
    let mut guards = ["ingress", "egress"]
        .map(|d| AttachGuard::toward(shaper_lab::bins::shaper(), &name, IFACE, d));
    for g in &mut guards {
        g.attach(&[
            "--rate",
            "8mbit",
            "--burst",
            "64k",
            "--max-subscribers",
            "16",
        ])
        .unwrap();
    }
    let dir = scratch(tag);
    let text = config(IFACE, "8mbit")
        + &config(IFACE, "8mbit")
        + "direction = \"egress\"\n\n[plan.gold]\nrate = \"25mbit\"\nburst = \"128k\"\n";
    fs::write(dir.join("shaper.toml"), text).unwrap();
    let run_dir = PathBuf::from(format!("/run/shaper-{name}"));
    let _ = fs::remove_dir_all(&run_dir);
    fs::create_dir(&run_dir).unwrap();
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o755)).unwrap();
    ApiLab {
        _guards: guards,
        _ns: ns,
        name,
        dir,
        run_dir,
    }
}

/// The whole API over curl, on an IPv4 address and an IPv6 prefix, subscribers and
/// policies; and its fences.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn the_api_sets_reads_and_deletes_and_refuses_bad_bodies_and_other_users() {
    let lab = api_lab("api");
    let ns = lab.name.as_str();
    let socket = lab.run_dir.join("api.sock");
    let socket_arg = socket.to_str().unwrap();
    let daemon = Daemon::start(
        ns,
        &lab.dir.join("shaper.toml"),
        &["--no-watch", "--no-metrics", "--api-socket", socket_arg],
    );
    let mode = fs::symlink_metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let s = socket.as_path();
    let subs = format!("/v1/interfaces/{IFACE}/subscribers");

    // Set, read back as the command line reads the kernel's maps.
    let body = r#"{"name": "Smith", "prefixes": ["100.64.0.14", "fdd7:b724:0:100::/56"], "rate": "20mbit", "burst": "256k"}"#;
    let (code, json) = call(s, "PUT", &format!("{subs}/c1042"), body);
    assert_eq!(
        (code, json["result"].as_str()),
        (200, Some("added")),
        "{json}"
    );
    let (code, got) = call(s, "GET", &format!("{subs}/c1042"), "");
    assert_eq!(code, 200, "{got}");
    let cli = cli_show(ns, "ingress", "c1042").expect("set in the kernel's maps");
    assert_eq!(got, cli);
    assert_eq!(cli["rate_bps"], 20_000_000);
    assert_eq!(
        cli["prefixes"],
        serde_json::json!(["100.64.0.14/32", "fdd7:b724:0:100::/56"])
    );
    let (code, list) = call(s, "GET", &subs, "");
    assert_eq!((code, list), (200, Value::Array(vec![cli.clone()])));
    // A named plan of the daemon's file, on the egress attachment.
    let body = r#"{"prefixes": ["100.64.0.14", "fdd7:b724:0:100::/56"], "plan": "gold"}"#;
    let (code, json) = call(s, "PUT", &format!("{subs}/c1042?direction=egress"), body);
    assert_eq!(code, 200, "{json}");
    assert_eq!(
        cli_show(ns, "egress", "c1042").unwrap()["rate_bps"],
        25_000_000
    );

    // Bad bodies: one line naming the field and value; nothing changed.
    let put = format!("{subs}/c1042");
    let e = refused(
        s,
        "PUT",
        &put,
        r#"{"prefixes": ["100.64.0.14"], "rat": "1mbit", "burst": "64k"}"#,
        400,
    );
    assert!(e.contains("unknown field `rat`"), "{e}");
    let e = refused(
        s,
        "PUT",
        &put,
        r#"{"prefixes": ["100.64.0.14"], "rate": "10mbitz", "burst": "64k"}"#,
        400,
    );
    assert!(e.starts_with("rate: ") && e.contains("10mbitz"), "{e}");
    let e = refused(
        s,
        "PUT",
        &put,
        r#"{"prefixes": ["fdd7:b724::/129"], "rate": "1mbit", "burst": "64k"}"#,
        400,
    );
    assert!(e.starts_with("prefixes: ") && e.contains("/129"), "{e}");
    let e = refused(
        s,
        "PUT",
        &format!("{subs}/c2"),
        r#"{"prefixes": ["fdd7:b724:0:100::/56"], "rate": "1mbit", "burst": "64k"}"#,
        409,
    );
    assert!(e.contains("fdd7:b724:0:100::/56"), "{e}");
    assert_eq!(cli_show(ns, "ingress", "c1042").unwrap(), cli);
    assert_eq!(cli_show(ns, "ingress", "c2"), None);
    let e = refused(s, "GET", "/v1/interfaces/nosuch0/subscribers", "", 404);
    assert!(e.contains("not attached to nosuch0"), "{e}");
    refused(s, "POST", &subs, "{}", 405);
    let e = refused(s, "GET", &format!("{subs}/c%20d"), "", 400);
    assert!(e.contains("'c d'"), "{e}");

    // Deleted: gone from the maps.
    let (code, json) = call(s, "DELETE", &put, "");
    assert_eq!(
        (code, json["result"].as_str()),
        (200, Some("removed")),
        "{json}"
    );
    assert_eq!(cli_show(ns, "ingress", "c1042"), None);
    refused(s, "GET", &put, "", 404);
    refused(s, "DELETE", &put, "", 404);

    // Policies of both families: the prefix encoded, or not.
    let pols = format!("/v1/interfaces/{IFACE}/policies");
    let (code, json) = call(
        s,
        "PUT",
        &format!("{pols}/203.0.113.0%2F24"),
        r#"{"rate": "4mbit", "burst": "64k", "aggregate_rate": "10mbit", "aggregate_burst": "128k"}"#,
    );
    assert_eq!(
        (code, json["result"].as_str()),
        (200, Some("added")),
        "{json}"
    );
    let (code, json) = call(
        s,
        "PUT",
        &format!("{pols}/2001:db8:bad::/48"),
        r#"{"action": "drop"}"#,
    );
    assert_eq!(code, 200, "{json}");
    let cli = cli_policies(ns);
    assert_eq!(call(s, "GET", &pols, ""), (200, cli.clone()));
    let v6 = cli
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["prefix"] == "2001:db8:bad::/48");
    assert_eq!(v6.unwrap()["action"], "drop");
    let (code, one) = call(s, "GET", &format!("{pols}/203.0.113.0%2F24"), "");
    assert_eq!(code, 200);
    assert_eq!(one["rate_bps"], 4_000_000);
    assert_eq!(one["aggregate_rate_bps"], 10_000_000);
    let e = refused(
        s,
        "PUT",
        &format!("{pols}/198.51.100.0%2F24"),
        r#"{"action": "pass", "rate": "4mbit"}"#,
        400,
    );
    assert!(e.starts_with("rate: has no meaning"), "{e}");
    let e = refused(
        s,
        "PUT",
        &format!("{pols}/198.51.100.1%2F24"),
        r#"{"action": "drop"}"#,
        400,
    );
    assert!(
        e.starts_with("prefix: ") && e.contains("198.51.100.1/24"),
        "{e}"
    );
    assert_eq!(cli_policies(ns), cli);
    for p in ["203.0.113.0%2F24", "2001:db8:bad::%2F48"] {
        let (code, json) = call(s, "DELETE", &format!("{pols}/{p}"), "");
        assert_eq!(code, 200, "{json}");
    }
    assert_eq!(cli_policies(ns).as_array().unwrap().len(), 1);

    // Another user: refused by the socket's mode; opened up by hand, by its credentials.
    let out = curl_as(Some(65534), s, "GET", &subs, "");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("Permission denied"),
        "{said}"
    );
    fs::set_permissions(s, fs::Permissions::from_mode(0o666)).unwrap();
    // Connected, then closed unanswered (curl says "Empty reply" or, closed before it
    // looked, "Couldn't connect"): no HTTP status at all.
    let out = curl_as(Some(65534), s, "GET", &subs, "");
    let said = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && stdout.ends_with("000") && !said.contains("Permission denied"),
        "{stdout} {said}"
    );
    fs::set_permissions(s, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(call(s, "GET", &subs, "").0, 200);

    let (status, log) = daemon.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("shaper: api: PUT"), "{log}");
    assert!(!socket.exists(), "the socket stays after exit: {log}");
}

/// A change the API makes, its daemon killed half way (after the subscriber's entry, before
/// its routes): the next command rolls it back whole, as the command line's; and the next
/// daemon replaces the socket the killed one left.
#[test]
#[ignore = "needs root: loads XDP programs and creates network namespaces (cargo xtask test)"]
fn an_api_change_killed_half_way_is_rolled_back_whole() {
    let lab = api_lab("api-kill");
    let ns = lab.name.as_str();
    let socket = lab.run_dir.join("api.sock");
    let file = lab.dir.join("shaper.toml");
    let args = [
        "--no-watch",
        "--no-metrics",
        "--api-socket",
        socket.to_str().unwrap(),
    ];
    let put = format!("/v1/interfaces/{IFACE}/subscribers/c1");
    shaper_ok(
        ns,
        &["subscriber", "set", IFACE, "c1", "--prefix", "100.64.0.1"]
            .into_iter()
            .chain(["--prefix", "fdd7:b724:0:100::/56"])
            .chain(["--rate", "20mbit", "--burst", "256k"])
            .collect::<Vec<_>>(),
    );
    let before = cli_show(ns, "ingress", "c1").unwrap();

    let crash = [(shaper_user::crash::CRASH_AT_VAR, "subscriber-step")];
    let mut daemon = Daemon::start_with_env(ns, &file, &args, &crash);
    let body = r#"{"prefixes": ["100.64.0.1", "fdd7:b724:0:100::/56", "fdd7:b724:0:200::/56"], "rate": "30mbit", "burst": "256k"}"#;
    let out = curl_as(None, &socket, "PUT", &put, body);
    assert!(!out.status.success(), "answered: {:?}", out.stdout);
    let status = daemon.child.wait().unwrap();
    assert!(!status.success(), "not killed: {}", daemon.log());
    let out = shaper(ns, &["status", IFACE]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The journal is the host's: another command beside the test may have rolled back.
    assert!(
        stderr.is_empty() || (stderr.contains("interrupted") && stderr.contains("subscriber set")),
        "{stderr}"
    );
    assert_eq!(cli_show(ns, "ingress", "c1").unwrap(), before, "{stderr}");

    // The killed daemon's socket is still there: the next one replaces it.
    assert!(socket.exists());
    let daemon = Daemon::start(ns, &file, &args);
    let (code, json) = call(&socket, "GET", &put, "");
    assert_eq!((code, json), (200, before));
    let (status, log) = daemon.stop();
    assert!(status.success(), "{log}");
}
