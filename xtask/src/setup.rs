//! `cargo xtask setup [FOR]`: installs what one command needs, and nothing else; does
//! nothing (one `ok` line per item) when all of it is there. Every command that builds or
//! runs something sets itself up first (`cargo xtask demo` for the demo, ...).
//!
//! What each command needs is the [`NEEDS`] table: an item, why, and the commands that
//! need it ([`For`]). Add a command to [`For`], or an item to the table, there.
//!
//! Debian packages are installed in one apt transaction, simulated first
//! (`apt-get -s`): one that would remove a package this machine has is refused, naming
//! it, unless asking for the new packages at that package's own version keeps it (a
//! `qemu-utils` from bookworm-backports, say, breaks bookworm's `qemu-system-common`:
//! the backports `qemu-system-x86` of the same version keeps it, where apt's sources have it).

use std::env;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{cmd, host, workspace::EBPF_TOOLCHAIN};

/// Where Debian's llvm-22-dev puts LLVM; bpf-linker is built against it.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// The commands setup prepares for. Each needs what [`NEEDS`] lists for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum For {
    /// Building shaper: nightly's rust-src, bpf-linker and the LLVM it links (also `fuzz`)
    Build,
    /// `cargo xtask demo` and `lab`: a build, iproute2 and bpffs
    Demo,
    /// `cargo xtask bench`: the demo's, and the peers and tools it measures with
    Bench,
    /// `cargo xtask test`: what every test uses
    Test,
    /// `cargo xtask test --kernel` (and `bench --kernel`): the tests', and QEMU's
    Matrix,
    /// `cargo xtask dist`: a build, and dpkg's tools
    Dist,
    /// `cargo xtask image`: dist's, and what builds and runs the image
    Image,
    /// `cargo xtask mutants`: a build, and cargo-mutants
    Mutants,
    /// Everything above
    All,
}

use For::{Bench, Build, Demo, Dist, Image, Matrix, Mutants, Test};

/// Every command that builds shaper.
const BUILDS: &[For] = &[Build, Demo, Bench, Test, Matrix, Dist, Image, Mutants];
/// Every command that loads shaper into this machine's kernel and pins it.
const RUNS: &[For] = &[Demo, Bench, Test];
/// The tests, on this machine's kernel or in the guests (which run on this machine's
/// files: a program the tests spawn there is this machine's).
const TESTS: &[For] = &[Test, Matrix];
/// The tests and the benchmarks.
const MEASURES: &[For] = &[Bench, Test, Matrix];

/// One thing a command needs.
struct Need {
    item: Item,
    /// The commands that need it.
    by: &'static [For],
}

/// Everything setup makes sure of, in order. Order matters: bpf-linker is built against
/// llvm-22-dev, and rust-src goes into the pinned nightly toolchain.
const NEEDS: &[Need] = &[
    // bpf-linker links to the system LLVM.
    Need {
        item: Item::Apt {
            package: "llvm-22-dev",
            // llvm-config itself belongs to llvm-22; this file only to llvm-22-dev.
            present: Present::File("/usr/lib/llvm-22/lib/cmake/llvm/LLVMConfig.cmake"),
        },
        by: BUILDS,
    },
    // The lab's namespaces, veths and qdiscs.
    Need {
        item: Item::Apt {
            package: "iproute2",
            present: Present::Programs(&["ip", "tc"]),
        },
        by: &[Demo, Bench, Test, Matrix],
    },
    // The tests run shaper without privileges, and with exactly the unit's capabilities.
    Need {
        item: Item::Apt {
            package: "util-linux",
            present: Present::Programs(&["setpriv"]),
        },
        by: TESTS,
    },
    // The fault tests read maps; the bench reads the maps' memory.
    Need {
        item: Item::Apt {
            package: "bpftool",
            present: Present::Programs(&["bpftool"]),
        },
        by: MEASURES,
    },
    // TCP through police and shape (live_shape, bench tcp).
    Need {
        item: Item::Apt {
            package: "iperf3",
            present: Present::Programs(&["iperf3"]),
        },
        by: MEASURES,
    },
    // live_vlan.rs turns the veth's VLAN offload off, so the tags are in the frames.
    Need {
        item: Item::Apt {
            package: "ethtool",
            present: Present::Programs(&["ethtool"]),
        },
        by: TESTS,
    },
    // The bench's per-source peers: an nft meter in netdev ingress, iptables hashlimit
    // (the bench's own tests run them too).
    Need {
        item: Item::Apt {
            package: "nftables",
            present: Present::Programs(&["nft"]),
        },
        by: MEASURES,
    },
    Need {
        item: Item::Apt {
            package: "iptables",
            present: Present::Programs(&["iptables"]),
        },
        by: MEASURES,
    },
    // The service's files: its unit is checked with systemd-analyze (verify looks the
    // unit's man pages up with man), and the package's test installs a .deb.
    Need {
        item: Item::Apt {
            package: "systemd",
            present: Present::Programs(&["systemd-analyze"]),
        },
        by: &[Test],
    },
    Need {
        item: Item::Apt {
            package: "man-db",
            present: Present::Programs(&["man"]),
        },
        by: &[Test],
    },
    // `cargo xtask dist` packs the .deb; the kernel matrix unpacks Debian's kernels.
    Need {
        item: Item::Apt {
            package: "dpkg-dev",
            present: Present::Programs(&["dpkg-deb", "dpkg-shlibdeps"]),
        },
        by: &[Test, Matrix, Dist, Image],
    },
    // The daemon's tests scrape /metrics with curl and check it with the Prometheus
    // project's own OpenMetrics parser.
    Need {
        item: Item::Apt {
            package: "curl",
            present: Present::Programs(&["curl"]),
        },
        by: &[Test],
    },
    Need {
        item: Item::Apt {
            package: "python3-prometheus-client",
            present: Present::File(
                "/usr/lib/python3/dist-packages/prometheus_client/openmetrics/parser.py",
            ),
        },
        by: &[Test],
    },
    // metrics.rs counts the bpf calls of a scrape with strace.
    Need {
        item: Item::Apt {
            package: "strace",
            present: Present::Programs(&["strace"]),
        },
        by: &[Test],
    },
    // The daemon's RADIUS test (issue 33) sends CoA and Disconnect requests with
    // FreeRADIUS's radclient, a real client.
    Need {
        item: Item::Apt {
            package: "freeradius-utils",
            present: Present::Programs(&["radclient"]),
        },
        by: &[Test],
    },
    // Its accounting test runs FreeRADIUS itself as the accounting server, in the
    // test's namespace with a config of its own (a host run by systemd also gets the
    // package's service on 1812/1813 of the host's namespace, which the test never uses).
    Need {
        item: Item::Apt {
            package: "freeradius",
            present: Present::Programs(&["freeradius"]),
        },
        by: &[Test],
    },
    // `shaper top`'s test drives it in a terminal: tmux's send-keys and capture-pane.
    Need {
        item: Item::Apt {
            package: "tmux",
            present: Present::Programs(&["tmux"]),
        },
        by: &[Test],
    },
    // Production parts (issue 26): Prometheus scrapes the daemon in the lab and promtool
    // tests dist/prometheus/'s rules; systemd-nspawn boots systemd as PID 1 on a Debian
    // root that mmdebstrap builds, for the unit's test and `cargo xtask image`'s root;
    // podman assembles and runs the image. (On a host run by systemd, the prometheus
    // package enables and starts its own server on :9090; the tests start their own.)
    Need {
        item: Item::Apt {
            package: "prometheus",
            present: Present::Programs(&["prometheus", "promtool"]),
        },
        by: &[Test],
    },
    Need {
        item: Item::Apt {
            package: "systemd-container",
            present: Present::Programs(&["systemd-nspawn"]),
        },
        by: &[Test],
    },
    Need {
        item: Item::Apt {
            package: "mmdebstrap",
            present: Present::Programs(&["mmdebstrap"]),
        },
        by: &[Test, Image],
    },
    Need {
        item: Item::Apt {
            package: "podman",
            present: Present::Programs(&["podman"]),
        },
        by: &[Test, Image],
    },
    // podman's runtime: crun refuses hybrid cgroups (v1 controllers beside v2's), which
    // some hosts have; runc runs there.
    Need {
        item: Item::Apt {
            package: "runc",
            present: Present::Programs(&["runc"]),
        },
        by: &[Test, Image],
    },
    // `podman kube play` builds its pod's pause image around catatonit.
    Need {
        item: Item::Apt {
            package: "catatonit",
            present: Present::Programs(&["catatonit"]),
        },
        by: &[Test],
    },
    // image.rs turns the DaemonSet into the Pod `podman kube play` runs.
    Need {
        item: Item::Apt {
            package: "python3-yaml",
            present: Present::File("/usr/lib/python3/dist-packages/yaml/__init__.py"),
        },
        by: &[Test],
    },
    // dist/kubernetes/ is checked against the Kubernetes API's JSON schemas by
    // kubernetes-validate (PyPI, schemas bundled), installed in a venv of its own by pipx.
    Need {
        item: Item::Apt {
            package: "pipx",
            present: Present::Programs(&["pipx"]),
        },
        by: &[Test],
    },
    Need {
        item: Item::Pipx {
            package: "kubernetes-validate",
            version: "1.37.0",
        },
        by: &[Test],
    },
    // The kernel matrix: Debian's kernels boot under QEMU with a busybox initramfs;
    // modprobe and depmod resolve their modules, and load them in the guest.
    Need {
        item: Item::Apt {
            package: "qemu-system-x86",
            present: Present::Programs(&["qemu-system-x86_64"]),
        },
        by: &[Matrix],
    },
    // Static: the initramfs holds this one binary and no libraries.
    Need {
        item: Item::Apt {
            package: "busybox-static",
            present: Present::StaticProgram("busybox"),
        },
        by: &[Matrix],
    },
    Need {
        item: Item::Apt {
            package: "kmod",
            present: Present::Programs(&["modprobe", "depmod"]),
        },
        by: &[Matrix],
    },
    // The eBPF crate is built with the pinned nightly's -Z build-std, which needs rust-src.
    Need {
        item: Item::Toolchain {
            name: EBPF_TOOLCHAIN,
            components: &["rust-src"],
        },
        by: BUILDS,
    },
    Need {
        item: Item::Component {
            name: "rust-src",
            toolchain: EBPF_TOOLCHAIN,
        },
        by: BUILDS,
    },
    Need {
        item: Item::Crate {
            name: "bpf-linker",
            version: "0.13.0",
            version_args: &["--version"],
            // The default feature links LLVM 23; Debian bookworm ships 22.
            args: &["--no-default-features", "--features", "llvm-22"],
            env: &[("LLVM_PREFIX", LLVM_PREFIX)],
        },
        by: BUILDS,
    },
    // Mutation testing (not part of CI: `cargo xtask mutants`).
    Need {
        item: Item::Crate {
            name: "cargo-mutants",
            version: "27.1.0",
            version_args: &["mutants", "--version"],
            args: &[],
            env: &[],
        },
        by: &[Mutants],
    },
    // shaper pins its link and maps there; systemd mounts it on most hosts, a bare
    // container or VM may not (bpftool mounts it on demand the same way). Mounted 0700.
    Need {
        item: Item::Bpffs {
            path: "/sys/fs/bpf",
        },
        by: RUNS,
    },
];

impl For {
    /// Whether a need of `by` is one of this command's.
    fn needs(self, by: &[For]) -> bool {
        self == For::All || by.contains(&self)
    }

    fn name(self) -> &'static str {
        match self {
            Build => "building",
            Demo => "cargo xtask demo",
            Bench => "cargo xtask bench",
            Test => "cargo xtask test",
            Matrix => "cargo xtask test --kernel",
            Dist => "cargo xtask dist",
            Image => "cargo xtask image",
            Mutants => "cargo xtask mutants",
            For::All => "every command",
        }
    }
}

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
    /// A binary crate from crates.io, present when `<name> <version_args>` mentions `version`.
    Crate {
        name: &'static str,
        version: &'static str,
        /// `--version`, or `mutants --version` for a cargo subcommand that wants its name.
        version_args: &'static [&'static str],
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

/// Makes sure of everything `purpose` needs; says first what it will install.
pub fn run(purpose: For) -> Result<()> {
    let needs: Vec<&Item> = NEEDS
        .iter()
        .filter(|n| purpose.needs(n.by))
        .map(|n| &n.item)
        .collect();
    let mut missing = Vec::new();
    for item in &needs {
        if item.is_present()? {
            println!("ok   {}", item.label());
        } else {
            missing.push(*item);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let labels: Vec<String> = missing.iter().map(|i| i.label()).collect();
    println!(
        "setup for {}: installs {}",
        purpose.name(),
        labels.join(", ")
    );
    // Check for root before installing anything, so a non-root run fails at once, in one
    // line naming all that is missing, rather than at the first one.
    let root_needed = missing.iter().any(|i| i.needs_root());
    if root_needed && !host::is_root()? {
        bail!(
            "setting up {} needs root: missing {} (run `cargo xtask setup {}` as root)",
            purpose.name(),
            labels.join(", "),
            format!("{purpose:?}").to_lowercase(),
        );
    }
    let packages: Vec<&str> = missing
        .iter()
        .filter_map(|i| match i {
            Item::Apt { package, .. } => Some(*package),
            _ => None,
        })
        .collect();
    if !packages.is_empty() {
        apt_install(&packages)?;
    }
    for item in missing {
        // An earlier step may have brought it (the toolchain its component).
        if !matches!(item, Item::Apt { .. }) && !item.is_present()? {
            println!("install {} ...", item.label());
            item.install()?;
        }
        // Catches a package that installed fine but does not provide what we look for.
        if !item.is_present()? {
            bail!("installed {}, but it is still not found", item.label());
        }
    }
    Ok(())
}

/// Installs `packages` in one apt transaction, simulated first: refused if it would
/// remove a package this machine has, or apt cannot make it, unless asking for the
/// packages at the version of the package at odds with them makes it whole; says every
/// package it installs, those pulled in with them too.
fn apt_install(packages: &[&str]) -> Result<()> {
    cmd::run(apt_get().arg("update"))?;
    let asked: Vec<String> = packages.iter().map(|p| (*p).to_owned()).collect();
    let mut plan = simulate(&asked)?;
    let mut install = asked.clone();
    if !plan.whole() && backports_needed(&plan.at_odds())? {
        // A package of this machine from backports (qemu-utils, on this kind of machine)
        // whose release is not in apt's sources: the same versions are there.
        add_backports()?;
        cmd::run(apt_get().arg("update"))?;
        plan = simulate(&asked)?;
    }
    if !plan.whole() {
        let pinned = pin_to(&asked, &plan.at_odds())?;
        let repinned = simulate(&pinned)?;
        if pinned != asked && repinned.whole() {
            println!(
                "asking for {} keeps {} as it is",
                pinned.join(" "),
                plan.at_odds().join(", ")
            );
            install = pinned;
            plan = repinned;
        } else {
            bail!(
                "refused: installing {} would {}; nothing was installed (apt's sources have no {} of the release that would keep it): install them yourself in a way that keeps it",
                packages.join(" "),
                plan.harm(),
                packages.join(", "),
            );
        }
    }
    println!("apt installs: {}", plan.installs().join(" "));
    cmd::run(
        apt_get()
            .args(["install", "-y", "--no-install-recommends"])
            .args(&install),
    )
}

/// What `apt-get -s install` said it would do.
struct Simulation {
    ok: bool,
    /// Its output, stdout then stderr: `Inst`/`Remv` lines, or why it cannot.
    text: String,
}

/// `apt-get -s install` of `packages`.
fn simulate(packages: &[String]) -> Result<Simulation> {
    let mut apt = apt_get();
    apt.args(["-s", "install", "--no-install-recommends"])
        .args(packages);
    let out = apt
        .output()
        .with_context(|| format!("could not start `{}`", cmd::display(&apt)))?;
    Ok(Simulation {
        ok: out.status.success(),
        text: String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr),
    })
}

impl Simulation {
    /// Whether apt can do it and removes nothing.
    fn whole(&self) -> bool {
        self.ok && self.removals().is_empty()
    }

    /// The packages it removes, with their installed versions.
    fn removals(&self) -> Vec<(String, String)> {
        self.text
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("Remv ")?;
                let (name, rest) = rest.split_once(' ').unwrap_or((rest, ""));
                let version = rest
                    .strip_prefix('[')
                    .and_then(|r| r.split_once(']'))
                    .map_or("", |(v, _)| v);
                Some((name.to_owned(), version.to_owned()))
            })
            .collect()
    }

    /// The installed packages in the way: those it removes, or those whose dependencies
    /// apt cannot meet (` qemu-utils : Breaks: qemu-system-common (< 1:8.0) ...`).
    fn at_odds(&self) -> Vec<String> {
        let mut names: Vec<String> = self.removals().into_iter().map(|(n, _)| n).collect();
        if !self.ok {
            names.extend(self.text.lines().filter_map(|line| {
                let (name, rest) = line.trim_start().split_once(" : ")?;
                rest.contains(':').then(|| name.to_owned())
            }));
        }
        names.dedup();
        names
    }

    /// What it would do that setup refuses, in words.
    fn harm(&self) -> String {
        let removed = self.removals();
        if removed.is_empty() {
            return format!(
                "not go through apt ({})",
                self.text
                    .lines()
                    .filter(|l| l.contains(" : ") || l.starts_with("E:"))
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        let removed: Vec<String> = removed
            .iter()
            .map(|(name, version)| format!("{name} ({version})"))
            .collect();
        format!(
            "remove {}, which this machine has installed",
            removed.join(", ")
        )
    }

    /// The packages it installs or upgrades.
    fn installs(&self) -> Vec<&str> {
        self.text
            .lines()
            .filter_map(|line| line.strip_prefix("Inst ")?.split(' ').next())
            .collect()
    }
}

/// The sources list of this machine's release's backports (`target/apt/backports.list`),
/// which apt reads beside its own sources once [`add_backports`] has written it.
fn backports_list() -> PathBuf {
    crate::workspace::target_dir()
        .join("apt")
        .join("backports.list")
}

/// Whether a package in the way was installed from backports (`~bpo12+1`) whose release
/// apt's sources do not have: then asking for the new packages from there keeps it.
fn backports_needed(at_odds: &[String]) -> Result<bool> {
    if backports_list().exists() {
        return Ok(false);
    }
    for name in at_odds {
        let policy = cmd::stdout(apt_cache().args(["policy", name]))?;
        if let Some(version) = installed_version(&policy)
            && version.contains("~bpo")
            && !policy.contains("-backports")
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Writes [`backports_list`]: this release's backports (its name from `/etc/os-release`),
/// read by every apt command of setup from then on (`apt_get`, `apt_cache`), and by no
/// other: this machine's own apt configuration is left as it is.
fn add_backports() -> Result<()> {
    let os = std::fs::read_to_string("/etc/os-release").context("cannot read /etc/os-release")?;
    let codename = os
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"'))
        .filter(|c| !c.is_empty())
        .context("/etc/os-release names no VERSION_CODENAME")?;
    let list = backports_list();
    println!(
        "adding {codename}-backports to apt's sources for setup's own commands ({})",
        list.display()
    );
    std::fs::create_dir_all(list.parent().expect("a file in a directory"))?;
    std::fs::write(
        &list,
        format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {codename}-backports main\n"
        ),
    )
    .with_context(|| format!("cannot write {}", list.display()))
}

/// `packages`, each asked for from the release (`qemu-system-x86/bookworm-backports`)
/// that has it at the installed version of one of `at_odds`, where apt's sources have
/// one: apt then takes its dependencies from that release too.
fn pin_to(packages: &[String], at_odds: &[String]) -> Result<Vec<String>> {
    let mut versions = Vec::new();
    for name in at_odds {
        let policy = cmd::stdout(apt_cache().args(["policy", name]))?;
        if let Some(v) = installed_version(&policy) {
            versions.push(v.to_owned());
        }
    }
    let mut pinned = Vec::new();
    for package in packages {
        let madison = cmd::stdout(apt_cache().args(["madison", package]))?;
        let release = versions
            .iter()
            .find_map(|v| release_of(&madison, v).map(str::to_owned));
        pinned.push(match release {
            Some(release) => format!("{package}/{release}"),
            None => package.clone(),
        });
    }
    Ok(pinned)
}

/// The release of an `apt-cache madison` text (` qemu-system-x86 | VERSION |
/// http://deb.debian.org/debian bookworm-backports/main amd64 Packages`) that offers
/// `version`.
fn release_of<'a>(madison: &'a str, version: &str) -> Option<&'a str> {
    madison.lines().find_map(|line| {
        let mut fields = line.split('|').map(str::trim);
        let (_, v, from) = (fields.next()?, fields.next()?, fields.next()?);
        let suite = from.split_whitespace().nth(1)?;
        (v == version).then(|| suite.split('/').next().unwrap_or(suite))
    })
}

/// The `Installed:` version of an `apt-cache policy` text, if any.
fn installed_version(policy: &str) -> Option<&str> {
    policy
        .lines()
        .find_map(|line| line.trim().strip_prefix("Installed: "))
        .filter(|v| *v != "(none)")
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
                // Not there either when its toolchain is not. Asked first: a newer rustup
                // installs a toolchain named to `component list` on the spot, unlogged.
                let toolchains = cmd::stdout(Command::new("rustup").args(["toolchain", "list"]))?;
                if !toolchains.lines().any(|line| is_toolchain(line, toolchain)) {
                    return Ok(false);
                }
                let Ok(list) = cmd::stdout(Command::new("rustup").args([
                    "component",
                    "list",
                    "--toolchain",
                    toolchain,
                    "--installed",
                ])) else {
                    return Ok(false);
                };
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
            Item::Crate {
                name,
                version,
                version_args,
                ..
            } => crate_binaries(name).iter().any(|binary| {
                // A binary that does not run counts as missing: reinstalling fixes it.
                cmd::stdout(Command::new(binary).args(*version_args))
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

impl Item {
    /// Installs what is not an apt package (those go in one transaction: [`apt_install`]).
    fn install(&self) -> Result<()> {
        match self {
            Item::Apt { package, .. } => apt_install(&[package]),
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
                ..
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
                // Root's alone: on the default 1777 any user could make shaper's pin root
                // first (shaper would then refuse it).
                cmd::run(Command::new("mount").args(["-t", "bpf", "-o", "mode=0700", "bpf", path]))
            }
            Item::Pipx { package, version } => cmd::run(Command::new("pipx").args([
                "install",
                "--force",
                &format!("{package}=={version}"),
            ])),
        }
    }

    /// Whether installing it needs root.
    fn needs_root(&self) -> bool {
        matches!(self, Item::Apt { .. } | Item::Bpffs { .. })
    }
}

/// apt-get that never stops to ask: iperf3's postinst, for one, asks whether to start a daemon.
fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    with_backports(&mut cmd);
    cmd
}

/// apt-cache, reading the same sources as [`apt_get`].
fn apt_cache() -> Command {
    let mut cmd = Command::new("apt-cache");
    with_backports(&mut cmd);
    cmd
}

/// Makes `cmd` read [`backports_list`] as its sources list, where setup wrote one (this
/// machine has no `/etc/apt/sources.list` of its own to replace: its sources are in
/// `sources.list.d`, which apt still reads).
/// Its packages are preferred (`APT::Default-Release`), so that what the new packages
/// depend on comes from backports too, as the installed backports package needs.
fn with_backports(cmd: &mut Command) {
    let list = backports_list();
    if std::path::Path::new("/etc/apt/sources.list").exists() {
        return;
    }
    let Ok(text) = std::fs::read_to_string(&list) else {
        return;
    };
    let Some(suite) = text.split_whitespace().find(|w| w.ends_with("-backports")) else {
        return;
    };
    cmd.arg("-o")
        .arg(format!("Dir::Etc::SourceList={}", list.display()))
        .arg("-o")
        .arg(format!("APT::Default-Release={suite}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dated_toolchain_is_found_by_its_name() {
        assert!(is_toolchain(
            &format!("{EBPF_TOOLCHAIN}-x86_64-unknown-linux-gnu"),
            EBPF_TOOLCHAIN
        ));
    }

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

    fn packages(purpose: For) -> Vec<&'static str> {
        NEEDS
            .iter()
            .filter(|n| purpose.needs(n.by))
            .filter_map(|n| match n.item {
                Item::Apt { package, .. } => Some(package),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn each_command_installs_what_it_uses_only() {
        // LLVM for bpf-linker, iproute2 for the lab: no test, bench or QEMU package. (The
        // C toolchain Rust links with must be there before xtask itself builds.)
        assert_eq!(packages(Demo), ["llvm-22-dev", "iproute2"]);
        assert_eq!(packages(Build), ["llvm-22-dev"]);
        assert!(!packages(Test).contains(&"qemu-system-x86"));
        assert!(packages(Matrix).contains(&"qemu-system-x86"));
        assert!(packages(Bench).contains(&"nftables"));
        assert!(!packages(Dist).contains(&"iproute2"));
        // Every item is some command's.
        for need in NEEDS {
            assert!(!need.by.is_empty(), "{} is nobody's", need.item.label());
        }
        assert_eq!(
            packages(For::All).len(),
            NEEDS
                .iter()
                .filter(|n| matches!(n.item, Item::Apt { .. }))
                .count()
        );
    }

    #[test]
    fn labels() {
        let label = |package| {
            NEEDS
                .iter()
                .find(|n| matches!(n.item, Item::Apt { package: p, .. } if p == package))
                .unwrap()
                .item
                .label()
        };
        assert_eq!(label("llvm-22-dev"), "llvm-22-dev");
        assert_eq!(label("iproute2"), "iproute2 (ip, tc)");
        assert_eq!(label("busybox-static"), "busybox-static (busybox, static)");
    }

    /// What `apt-get -s install qemu-system-x86` printed on a machine with bookworm's
    /// sources and qemu-utils from bookworm-backports (its Inst lines shortened).
    const SIMULATION: &str = "NOTE: This is only a simulation!
Reading package lists...
Remv qemu-utils [1:10.0.2+ds-2+deb13u1~bpo12+1]
Inst libfdt1 (1.6.1-4+b1 Debian:12.12/oldstable [amd64])
Inst qemu-system-common (1:7.2+dfsg-7+deb12u18+b3 Debian:12.12/oldstable [amd64])
Inst qemu-system-x86 (1:7.2+dfsg-7+deb12u18+b3 Debian:12.12/oldstable [amd64])
Conf libfdt1 (1.6.1-4+b1 Debian:12.12/oldstable [amd64])
";

    #[test]
    fn a_simulation_says_what_goes_and_what_comes() {
        let sim = |ok, text: &str| Simulation {
            ok,
            text: text.to_owned(),
        };
        let removing = sim(true, SIMULATION);
        assert!(!removing.whole());
        assert_eq!(
            removing.removals(),
            [(
                "qemu-utils".to_owned(),
                "1:10.0.2+ds-2+deb13u1~bpo12+1".to_owned()
            )]
        );
        assert_eq!(
            removing.installs(),
            ["libfdt1", "qemu-system-common", "qemu-system-x86"]
        );
        assert_eq!(removing.at_odds(), ["qemu-utils"]);
        assert!(
            removing
                .harm()
                .starts_with("remove qemu-utils (1:10.0.2+ds-2+deb13u1~bpo12+1)")
        );
        assert!(
            sim(
                true,
                "Inst iproute2 (6.1.0-3 Debian:12.12/oldstable [amd64])"
            )
            .whole()
        );
        // With bookworm-backports in the sources, apt cannot downgrade qemu-utils and says
        // so rather than remove it.
        let stuck = sim(
            false,
            "The following packages have unmet dependencies:
 qemu-utils : Breaks: qemu-system-common (< 1:8.0+dfsg-5~) but 1:7.2+dfsg-7+deb12u18+b3 is to be installed
E: Error, pkgProblemResolver::Resolve generated breaks, this may be caused by held packages.
",
        );
        assert!(!stuck.whole());
        assert_eq!(stuck.at_odds(), ["qemu-utils"]);
        assert_eq!(
            installed_version(
                "qemu-utils:\n  Installed: 1:10.0.2+ds-2+deb13u1~bpo12+1\n  Candidate: 1:10.0.2+ds-2+deb13u1~bpo12+1\n"
            ),
            Some("1:10.0.2+ds-2+deb13u1~bpo12+1")
        );
        assert_eq!(installed_version("  Installed: (none)\n"), None);
        let madison = " qemu-system-x86 | 1:10.0.2+ds-2+deb13u1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
 qemu-system-x86 | 1:7.2+dfsg-7+deb12u18+b3 | http://deb.debian.org/debian bookworm/main amd64 Packages
";
        assert_eq!(
            release_of(madison, "1:10.0.2+ds-2+deb13u1~bpo12+1"),
            Some("bookworm-backports")
        );
        assert_eq!(release_of(madison, "1:9.0"), None);
    }
}
