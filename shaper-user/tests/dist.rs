//! The files the package installs beside the binary (`dist/`): the systemd unit passes
//! `systemd-analyze verify` and holds a low exposure in `systemd-analyze security`, and
//! the example configuration is valid. Host only: nothing is started.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

const UNIT: &str = include_str!("../dist/shaper.service");
const CONFIG: &str = include_str!("../dist/shaper.toml");
/// Where the package puts the binary; the tests point the unit at the one just built.
const INSTALLED_BIN: &str = "/usr/sbin/shaper";

/// A scratch directory holding the unit (run from the built binary) and shaper's manual
/// pages (which the unit's `Documentation=` names, and verify looks up with man).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shaper-dist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("man/man8")).unwrap();
        let unit = UNIT.replace(INSTALLED_BIN, env!("CARGO_BIN_EXE_shaper"));
        std::fs::write(dir.join("shaper.service"), unit).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_shaper"))
            .args(["man", "--dir"])
            .arg(dir.join("man/man8"))
            .output()
            .unwrap();
        assert!(out.status.success(), "shaper man: {out:?}");
        Scratch(dir)
    }

    fn unit(&self) -> PathBuf {
        self.0.join("shaper.service")
    }

    fn analyze(&self, args: &[&str]) -> std::process::Output {
        Command::new("systemd-analyze")
            .args(args)
            .arg(self.unit())
            .env("MANPATH", self.0.join("man"))
            .output()
            .expect("systemd-analyze (Debian's systemd package; cargo xtask setup installs it)")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_unit_verifies() {
    let scratch = Scratch::new("verify");
    let out = scratch.analyze(&["verify"]);
    // Units of other packages the host has (freeradius's, installed for the lab, warns
    // of MemoryLimit=) are loaded beside ours: their lines are not ours to answer for.
    let said = text(&out);
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| {
            !["/lib/systemd/", "/usr/lib/systemd/", "/etc/systemd/"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {said}"
    );
}

/// Exposure (0 safest, 10 unprotected) at most 2.5: the unit keeps the capabilities to
/// load and attach programs and nothing else it can drop.
#[test]
fn the_unit_is_hardened() {
    let scratch = Scratch::new("security");
    let out = scratch.analyze(&["security", "--offline=true", "--threshold=25"]);
    assert!(out.status.success(), "{}", text(&out));
    let report = text(&out);
    for granted in ["CAP_BPF", "CAP_NET_ADMIN"] {
        assert!(report.contains(granted), "{report}");
    }
    for kept_out in ["CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_PTRACE"] {
        let line = report
            .lines()
            .find(|l| l.contains(&format!("CapabilityBoundingSet=~{kept_out}")))
            .unwrap_or_else(|| panic!("no {kept_out} line in {report}"));
        assert!(line.starts_with('✓'), "{line}");
    }
}

#[test]
fn the_unit_grants_what_check_privileges_asks_for() {
    for key in ["CapabilityBoundingSet=", "AmbientCapabilities="] {
        let line = UNIT.lines().find(|l| l.starts_with(key)).unwrap();
        for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"] {
            assert!(line.contains(cap), "{line}");
        }
    }
}

#[test]
fn the_example_configuration_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/shaper.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_shaper"))
        .args(["apply", "--check", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let interfaces = shaper_user::config_file::parse(
        "shaper.toml",
        CONFIG,
        shaper_user::pins::Direction::Ingress,
    )
    .unwrap();
    assert_eq!(interfaces.len(), 1);
}

/// The Prometheus rules (`dist/prometheus/`) load, and each recording rule and alert
/// passes its unit tests (`promtool test rules`).
#[test]
fn the_prometheus_rules_pass_their_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/prometheus");
    for args in [
        &["check", "rules", "shaper-rules.yml"][..],
        &["test", "rules", "shaper-rules.test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool (Debian's prometheus package; cargo xtask setup installs it)");
        println!("promtool {}:\n{}", args.join(" "), text(&out));
        assert!(out.status.success(), "promtool {args:?}: {}", text(&out));
    }
}

/// Where pipx put kubernetes-validate (`cargo xtask setup` installs it): on PATH or in
/// `~/.local/bin`.
fn kubernetes_validate() -> PathBuf {
    let name = "kubernetes-validate";
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain(std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/bin")))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .expect("kubernetes-validate (PyPI, through pipx: cargo xtask setup installs it)")
}

/// dist/kubernetes/ against the Kubernetes API's JSON schemas, strictly (an unknown or
/// misspelt field, a wrong type, a missing required field fail), for the oldest and the
/// newest release the validator carries schemas of.
#[test]
fn the_kubernetes_manifests_validate_against_the_api_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/kubernetes");
    for version in ["1.25.0", "1.37.0"] {
        let out = Command::new(kubernetes_validate())
            .args(["--strict", "--kubernetes-version", version])
            .args(["daemonset.yaml", "configmap.yaml"])
            .current_dir(&dir)
            .output()
            .unwrap();
        let said = text(&out);
        println!("{said}");
        assert!(
            out.status.success() && said.matches(" passed ").count() == 2,
            "{said}"
        );
    }
}

/// The manifests say what the rest of the tree says: the DaemonSet grants the unit's
/// capabilities and no others, its metrics port is the one its annotations name, and the
/// ConfigMap's shaper.toml is a valid file.
#[test]
fn the_kubernetes_manifests_agree_with_the_unit_and_the_daemon() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/kubernetes");
    let daemonset = std::fs::read_to_string(dir.join("daemonset.yaml")).unwrap();
    let unit_caps: Vec<&str> = UNIT
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .unwrap()
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_"))
        .collect();
    let added = daemonset
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: "))
        .unwrap();
    let added: Vec<&str> = added
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|c| c.trim().trim_matches('"'))
        .collect();
    assert_eq!(added, unit_caps);
    assert!(daemonset.contains("drop: [\"ALL\"]") && daemonset.contains("privileged: false"));
    assert!(daemonset.contains("prometheus.io/port: \"9753\"") && daemonset.contains(":9753\"]"));

    let configmap = std::fs::read_to_string(dir.join("configmap.yaml")).unwrap();
    let (_, body) = configmap.split_once("shaper.toml: |\n").unwrap();
    let toml: String = body
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let scratch =
        std::env::temp_dir().join(format!("shaper-configmap-{}.toml", std::process::id()));
    std::fs::write(&scratch, toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shaper"))
        .args(["apply", "--check", "-f"])
        .arg(&scratch)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&scratch);
    assert!(out.status.success(), "{}", text(&out));
}
