//! `cargo xtask image`: an OCI container image of shaper, built from this repository and
//! Debian's packages with no registry: the root is `mmdebstrap --variant=extract` of the
//! binary's libraries (libc6, libgcc-s1, from this machine's Debian release, the one the
//! binary is built against) with the `.deb` of `cargo xtask dist` unpacked over it; podman
//! imports it as `localhost/shaper:VERSION` and saves it as
//! `target/dist/shaper_VERSION_ARCH.oci.tar` (`podman load`/`skopeo copy` take it to a
//! registry of the fleet's own). No shell, no package manager: the binary, its libraries,
//! the unit, the manual pages and the example configuration.
//!
//! It runs `shaper run -f /etc/shaper/shaper.toml`; a host (or a pod, see
//! dist/kubernetes/) gives it the host's network namespace, its bpffs at /sys/fs/bpf,
//! CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, and the configuration file.

use std::{fs, process::Command};

use anyhow::{Context as _, Result};

use crate::{cmd, dist, workspace};

/// The Debian packages the binary links to (dpkg-shlibdeps says which, `cargo xtask dist`
/// checks): nothing else goes in the root.
const LIBRARIES: &str = "libc6,libgcc-s1";

/// What the image runs: the daemon, with the file a pod mounts there (its metrics stay on
/// loopback unless the arguments say otherwise, as the DaemonSet's do).
const ENTRYPOINT: &str = r#"ENTRYPOINT ["/usr/sbin/shaper"]"#;
const CMD: &str = r#"CMD ["run", "-f", "/etc/shaper/shaper.toml"]"#;

pub fn run() -> Result<()> {
    let deb = dist::run()?;
    let target = workspace::target_dir();
    let work = target.join("image");
    let root = work.join("root");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("cannot remove {}", work.display()))?;
    }
    fs::create_dir_all(&work)?;
    let release = codename()?;
    // The commit's time, so that the same tree gives the same files.
    let epoch = cmd::stdout(Command::new("git").args(["log", "-1", "--format=%ct"]))?;
    cmd::run(
        Command::new("mmdebstrap")
            .args(["--variant=extract", "--quiet", "--format=directory"])
            .arg(format!("--include={LIBRARIES}"))
            .arg(&release)
            .arg(&root)
            .env("SOURCE_DATE_EPOCH", epoch.trim()),
    )?;
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    // A bpffs is mounted here; a pod mounts its file in /etc/shaper.
    fs::create_dir_all(root.join("sys/fs/bpf"))?;
    let version = deb
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('_').nth(1))
        .context("the package's file name has no version")?
        .to_owned();
    let arch = cmd::stdout(Command::new("dpkg").arg("--print-architecture"))?
        .trim()
        .to_owned();
    let name = format!("localhost/shaper:{version}");
    let tar = work.join("root.tar");
    cmd::run(
        Command::new("tar")
            .args(["--sort=name", "--numeric-owner", "--owner=0", "--group=0"])
            .arg(format!("--mtime=@{}", epoch.trim()))
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    )?;
    let revision = cmd::stdout(Command::new("git").args(["rev-parse", "HEAD"]))?;
    cmd::run(
        Command::new("podman")
            .arg("import")
            .args(["--change", ENTRYPOINT, "--change", CMD])
            .args(["--change", "LABEL org.opencontainers.image.title=shaper"])
            .arg("--change")
            .arg(format!(
                "LABEL org.opencontainers.image.version={version} org.opencontainers.image.revision={}",
                revision.trim()
            ))
            .arg(&tar)
            .arg(&name),
    )?;
    let archive = target
        .join("dist")
        .join(format!("shaper_{version}_{arch}.oci.tar"));
    let _ = fs::remove_file(&archive);
    cmd::run(
        Command::new("podman")
            .args(["save", "--format", "oci-archive", "-o"])
            .arg(&archive)
            .arg(&name),
    )?;
    fs::remove_dir_all(&work)?;
    let size = cmd::stdout(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Size}}",
        &name,
    ]))?;
    let size: f64 = size.trim().parse().context("podman's image size")?;
    println!(
        "built {name} ({:.1} MB; {} {:.1} MB)",
        size / 1e6,
        archive.display(),
        fs::metadata(&archive)?.len() as f64 / 1e6
    );
    Ok(())
}

/// This machine's Debian release (`bookworm`): the binary is built against its libc.
fn codename() -> Result<String> {
    let text = fs::read_to_string("/etc/os-release").context("cannot read /etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .context("/etc/os-release names no VERSION_CODENAME")
}
