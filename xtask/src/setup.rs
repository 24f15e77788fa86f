//! `cargo xtask setup`: installs what building, testing and the demo need, and does nothing
//! (printing one `ok` line per item) when everything is already there.
//!
//! What gets installed is the [`ITEMS`] table; extend it there.

use std::env;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

use crate::{cmd, host};

/// Where Debian's llvm-22-dev puts LLVM; bpf-linker is built against it.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Everything setup makes sure of, in order. Order matters: bpf-linker is built against
/// llvm-22-dev, and rust-src goes into the nightly toolchain.
const ITEMS: &[Item] = &[
    // bpf-linker links to the system LLVM.
    Item::Apt {
        package: "llvm-22-dev",
        // llvm-config itself belongs to llvm-22; this file only to llvm-22-dev.
        present: Present::File("/usr/lib/llvm-22/lib/cmake/llvm/LLVMConfig.cmake"),
    },
    // Tools the kernel tests and shaper-lab spawn.
    Item::Apt {
        package: "iproute2",
        present: Present::Programs(&["ip", "tc"]),
    },
    Item::Apt {
        package: "util-linux",
        present: Present::Programs(&["setpriv"]),
    },
    Item::Apt {
        package: "bpftool",
        present: Present::Programs(&["bpftool"]),
    },
    Item::Apt {
        package: "iperf3",
        present: Present::Programs(&["iperf3"]),
    },
    // live_vlan.rs turns the veth's VLAN offload off, so the tags are in the frames.
    Item::Apt {
        package: "ethtool",
        present: Present::Programs(&["ethtool"]),
    },
    // The service's files: its unit is checked with systemd-analyze (verify looks the
    // unit's man pages up with man), and `cargo xtask dist` packs a .deb with dpkg-deb.
    Item::Apt {
        package: "systemd",
        present: Present::Programs(&["systemd-analyze"]),
    },
    Item::Apt {
        package: "man-db",
        present: Present::Programs(&["man"]),
    },
    Item::Apt {
        package: "dpkg-dev",
        present: Present::Programs(&["dpkg-deb", "dpkg-shlibdeps"]),
    },
    // The bench's per-source peers: an nft meter in netdev ingress, iptables hashlimit.
    Item::Apt {
        package: "nftables",
        present: Present::Programs(&["nft"]),
    },
    Item::Apt {
        package: "iptables",
        present: Present::Programs(&["iptables"]),
    },
    // The daemon's tests scrape /metrics with curl and check it with the Prometheus
    // project's own OpenMetrics parser.
    Item::Apt {
        package: "curl",
        present: Present::Programs(&["curl"]),
    },
    // `shaper top`'s test drives it in a terminal: tmux's send-keys and capture-pane.
    Item::Apt {
        package: "tmux",
        present: Present::Programs(&["tmux"]),
    },
    Item::Apt {
        package: "python3-prometheus-client",
        present: Present::File(
            "/usr/lib/python3/dist-packages/prometheus_client/openmetrics/parser.py",
        ),
    },
    // Production parts (issue 26): Prometheus scrapes the daemon in the lab and promtool
    // tests dist/prometheus/'s rules; systemd-nspawn boots systemd as PID 1 on a Debian
    // root that mmdebstrap builds, for the unit's test and `cargo xtask image`'s root;
    // podman assembles and runs the image. (On a host run by systemd, the prometheus
    // package enables and starts its own server on :9090; the tests start their own.)
    Item::Apt {
        package: "prometheus",
        present: Present::Programs(&["prometheus", "promtool"]),
    },
    Item::Apt {
        package: "systemd-container",
        present: Present::Programs(&["systemd-nspawn"]),
    },
    Item::Apt {
        package: "mmdebstrap",
        present: Present::Programs(&["mmdebstrap"]),
    },
    Item::Apt {
        package: "podman",
        present: Present::Programs(&["podman"]),
    },
    // dist/kubernetes/ is checked against the Kubernetes API's JSON schemas by
    // kubernetes-validate (PyPI, schemas bundled), installed in a venv of its own by pipx.
    // podman's runtime: crun refuses hybrid cgroups (v1 controllers beside v2's), which
    // some hosts have; runc runs there.
    Item::Apt {
        package: "runc",
        present: Present::Programs(&["runc"]),
    },
    // `podman kube play` builds its pod's pause image around catatonit.
    Item::Apt {
        package: "catatonit",
        present: Present::Programs(&["catatonit"]),
    },
    // image.rs turns the DaemonSet into the Pod `podman kube play` runs.
    Item::Apt {
        package: "python3-yaml",
        present: Present::File("/usr/lib/python3/dist-packages/yaml/__init__.py"),
    },
    Item::Apt {
        package: "pipx",
        present: Present::Programs(&["pipx"]),
    },
    Item::Pipx {
        package: "kubernetes-validate",
        version: "1.37.0",
    },
    // The kernel matrix (`cargo xtask test --kernel`): Debian's kernels boot under QEMU with
    // a busybox initramfs; modprobe and depmod resolve their modules, and load them in the
    // guest (which runs on this machine's files).
    Item::Apt {
        package: "qemu-system-x86",
        present: Present::Programs(&["qemu-system-x86_64"]),
    },
    // Static: the initramfs holds this one binary and no libraries.
    Item::Apt {
        package: "busybox-static",
        present: Present::StaticProgram("busybox"),
    },
    Item::Apt {
        package: "kmod",
        present: Present::Programs(&["modprobe", "depmod"]),
    },
    // The eBPF crate is built with nightly's -Z build-std, which needs rust-src.
    Item::Toolchain {
        name: "nightly",
        components: &["rust-src"],
    },
    Item::Component {
        name: "rust-src",
        toolchain: "nightly",
    },
    Item::Crate {
        name: "bpf-linker",
        version: "0.13.0",
        // The default feature links LLVM 23; Debian bookworm ships 22.
        args: &["--no-default-features", "--features", "llvm-22"],
        env: &[("LLVM_PREFIX", LLVM_PREFIX)],
    },
    // shaper pins its link and maps there; systemd mounts it on most hosts, a bare
    // container or VM may not (bpftool mounts it on demand the same way).
    Item::Bpffs {
        path: "/sys/fs/bpf",
    },
];

/// One thing setup installs.
enum Item {
    /// A Debian package, installed with apt-get (needs root).
    Apt {
        package: &'static str,
        present: Present,
    },
    /// A rustup toolchain, installed with the minimal profile plus `components`.
    Toolchain {
        name: &'static str,
        components: &'static [&'static str],
    },
    /// A rustup component of an installed toolchain.
    Component {
        name: &'static str,
        toolchain: &'static str,
    },
    /// A binary crate from crates.io, present when `<name> --version` mentions `version`.
    Crate {
        name: &'static str,
        version: &'static str,
        args: &'static [&'static str],
        env: &'static [(&'static str, &'static str)],
    },
    /// A bpf filesystem mounted at `path` (needs root).
    Bpffs { path: &'static str },
    /// A PyPI package's command, in a venv of its own (`pipx install`), present when
    /// `<package> --version` says `version`.
    Pipx {
        package: &'static str,
        version: &'static str,
    },
}

/// How to tell that a Debian package is installed without asking dpkg, which also works for
/// tools that came from elsewhere.
enum Present {
    /// This file exists.
    File(&'static str),
    /// These programs are on PATH (or in /usr/sbin, /sbin).
    Programs(&'static [&'static str]),
    /// This program is on PATH and statically linked (Debian's plain `busybox` is not).
    StaticProgram(&'static str),
}

impl Present {
    fn holds(&self) -> bool {
        match self {
            Present::File(path) => std::path::Path::new(path).exists(),
            Present::Programs(names) => names.iter().all(|name| host::find_program(name).is_some()),
            Present::StaticProgram(name) => host::find_program(name)
                .is_some_and(|path| host::is_static_elf(&path).unwrap_or(false)),
        }
    }
}

/// State shared by the installs of one setup run.
#[derive(Default)]
struct Installer {
    /// `apt-get update` is slow, so it runs once per setup run, and only if something is missing.
    apt_updated: bool,
}

pub fn run() -> Result<()> {
    // Check for root before installing anything, so a non-root run fails at once, in one line
    // naming every missing package, rather than at the first one.
    let missing_apt: Vec<&str> = ITEMS
        .iter()
        .filter_map(|item| match item {
            Item::Apt { package, present } if !present.holds() => Some(*package),
            _ => None,
        })
        .collect();
    let needs_root = !missing_apt.is_empty()
        || ITEMS
            .iter()
            .any(|item| matches!(item, Item::Bpffs { .. }) && !item.is_present().unwrap_or(false));
    if needs_root && !host::is_root()? {
        bail!(
            "missing Debian packages ({}) or the bpffs mount; setting them up needs root (run `cargo xtask setup` as root)",
            missing_apt.join(" ")
        );
    }

    let mut installer = Installer::default();
    for item in ITEMS {
        let label = item.label();
        if item.is_present()? {
            println!("ok   {label}");
            continue;
        }
        println!("install {label} ...");
        installer.install(item)?;
        // Catches a package that installed fine but does not provide what we look for.
        if !item.is_present()? {
            bail!("installed {label}, but it is still not found");
        }
    }
    Ok(())
}

impl Item {
    fn label(&self) -> String {
        match self {
            Item::Apt {
                package,
                present: Present::Programs(programs),
            } if programs != &[*package] => format!("{package} ({})", programs.join(", ")),
            Item::Apt {
                package,
                present: Present::StaticProgram(program),
            } => format!("{package} ({program}, static)"),
            Item::Apt { package, .. } => (*package).to_owned(),
            Item::Toolchain { name, .. } => format!("toolchain {name}"),
            Item::Component { name, toolchain } => format!("{name} ({toolchain})"),
            Item::Crate { name, version, .. } => format!("{name} {version}"),
            Item::Bpffs { path } => format!("bpffs at {path}"),
            Item::Pipx { package, version } => format!("{package} {version} (pipx)"),
        }
    }

    fn is_present(&self) -> Result<bool> {
        Ok(match self {
            Item::Apt { present, .. } => present.holds(),
            Item::Toolchain { name, .. } => {
                let list = cmd::stdout(Command::new("rustup").args(["toolchain", "list"]))?;
                list.lines().any(|line| is_toolchain(line, name))
            }
            Item::Component { name, toolchain } => {
                let list = cmd::stdout(Command::new("rustup").args([
                    "component",
                    "list",
                    "--toolchain",
                    toolchain,
                    "--installed",
                ]))?;
                // Lines are `rust-src` or `rust-std-x86_64-unknown-linux-gnu`.
                list.lines().any(|line| {
                    line.strip_prefix(name)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
                })
            }
            Item::Bpffs { path } => std::fs::read_to_string("/proc/mounts")?
                .lines()
                .any(|line| {
                    let mut fields = line.split_whitespace().skip(1);
                    fields.next() == Some(path) && fields.next() == Some("bpf")
                }),
            Item::Pipx { package, version } => pipx_binary(package).is_some_and(|binary| {
                cmd::stdout(Command::new(binary).arg("--version"))
                    .is_ok_and(|out| out.trim() == *version)
            }),
            Item::Crate { name, version, .. } => crate_binaries(name).iter().any(|binary| {
                // A binary that does not run counts as missing: reinstalling fixes it.
                cmd::stdout(Command::new(binary).arg("--version"))
                    .is_ok_and(|out| out.lines().any(|line| line.contains(version)))
            }),
        })
    }
}

/// Whether a `rustup toolchain list` line (`nightly-x86_64-unknown-linux-gnu (default)`) is the
/// toolchain `name`. A dated `nightly-2025-01-01-...` is not `nightly`: `+nightly` would not
/// pick it.
fn is_toolchain(line: &str, name: &str) -> bool {
    line.split_whitespace()
        .next()
        .and_then(|toolchain| toolchain.strip_prefix(name))
        .is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix('-')
                    .is_some_and(|host| !host.starts_with(|c: char| c.is_ascii_digit()))
        })
}

/// Where a `cargo install`ed binary may be: on PATH, and in cargo's bin directory, which is not
/// always on PATH (e.g. under sudo).
fn crate_binaries(name: &str) -> Vec<PathBuf> {
    let cargo_home = env::var_os("CARGO_HOME")
        .filter(|home| !home.is_empty())
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    let mut binaries: Vec<PathBuf> = host::find_program(name).into_iter().collect();
    if let Some(home) = cargo_home {
        let binary = home.join("bin").join(name);
        if binary.exists() && !binaries.contains(&binary) {
            binaries.push(binary);
        }
    }
    binaries
}

/// Where pipx put a package's command: on PATH, or in pipx's default bin directory
/// (`~/.local/bin`), which is not always on PATH. The tests look for it the same way.
pub fn pipx_binary(name: &str) -> Option<PathBuf> {
    host::find_program(name).or_else(|| {
        let binary = PathBuf::from(env::var_os("HOME")?)
            .join(".local/bin")
            .join(name);
        binary.exists().then_some(binary)
    })
}

impl Installer {
    fn install(&mut self, item: &Item) -> Result<()> {
        match item {
            Item::Apt { package, .. } => {
                if !self.apt_updated {
                    cmd::run(apt_get().arg("update"))?;
                    self.apt_updated = true;
                }
                cmd::run(apt_get().args(["install", "-y", "--no-install-recommends", package]))
            }
            Item::Toolchain { name, components } => {
                let mut rustup = Command::new("rustup");
                rustup.args(["toolchain", "install", name, "--profile", "minimal"]);
                for component in *components {
                    rustup.args(["--component", component]);
                }
                cmd::run(&mut rustup)
            }
            Item::Component { name, toolchain } => cmd::run(Command::new("rustup").args([
                "component",
                "add",
                name,
                "--toolchain",
                toolchain,
            ])),
            Item::Crate {
                name,
                version,
                args,
                env,
            } => {
                let mut cargo = Command::new("cargo");
                cargo
                    .args(["install", name, "--version", version, "--locked"])
                    .args(*args)
                    .envs(env.iter().copied())
                    // cargo install reads .cargo/config.toml and rust-toolchain files from the
                    // current directory; a project's (e.g. a default bpf target) must not leak
                    // into installing a host tool.
                    .current_dir(env::temp_dir());
                cmd::run(&mut cargo)
            }
            Item::Bpffs { path } => {
                cmd::run(Command::new("mount").args(["-t", "bpf", "bpf", path]))
            }
            Item::Pipx { package, version } => cmd::run(Command::new("pipx").args([
                "install",
                "--force",
                &format!("{package}=={version}"),
            ])),
        }
    }
}

/// apt-get that never stops to ask: iperf3's postinst, for one, asks whether to start a daemon.
fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolchain_lines() {
        assert!(is_toolchain("nightly-x86_64-unknown-linux-gnu", "nightly"));
        assert!(is_toolchain(
            "nightly-x86_64-unknown-linux-gnu (active)",
            "nightly"
        ));
        assert!(is_toolchain("nightly", "nightly"));
        assert!(!is_toolchain(
            "nightly-2025-01-01-x86_64-unknown-linux-gnu",
            "nightly"
        ));
        assert!(!is_toolchain(
            "stable-x86_64-unknown-linux-gnu (default)",
            "nightly"
        ));
    }

    #[test]
    fn labels() {
        assert_eq!(ITEMS[0].label(), "llvm-22-dev");
        assert_eq!(ITEMS[1].label(), "iproute2 (ip, tc)");
        assert_eq!(ITEMS[3].label(), "bpftool");
    }
}
