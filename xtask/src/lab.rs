//! `cargo xtask demo|bench|lab|fuzz`: build the release binaries and hand over to shaper-lab,
//! which needs root to load eBPF programs and create network namespaces.

use std::process::{Command, ExitCode};

use anyhow::{Result, bail};

use crate::{cmd, host, old_shaper, setup, test, vm, workspace};

/// Runs `shaper-lab <subcommand> --shaper <shaper> <args>` on freshly built release binaries
/// (`fuzz` runs no shaper command, so it gets no `--shaper`).
///
/// `bench --kernel 6.12 [--] ARGS` runs `shaper-lab bench ARGS` in a QEMU guest of that
/// Debian kernel instead (as `cargo xtask test --kernel` runs the tests), told that it is
/// under emulation; its results land in the work tree's bench/ all the same.
///
/// `bench` also gets the baseline it measures today's build against (built here for
/// release from its commit, once: `old_shaper::build_baseline`) and, when it writes the
/// committed results, the workspace, whose generated table in the docs it rewrites.
pub fn run(subcommand: &str, args: &[String]) -> Result<ExitCode> {
    let (kernel, args) = split_kernel(args)?;
    let args = args.as_slice();
    // Before setup and the build, so a non-root run fails at once instead of after minutes.
    if !host::is_root()? {
        bail!(
            "`cargo xtask {subcommand}` needs root (shaper-lab loads eBPF programs and creates network namespaces)"
        );
    }
    setup::run(match (subcommand, &kernel) {
        (_, Some(_)) => setup::For::Matrix,
        ("bench", None) => setup::For::Bench,
        ("fuzz", None) => setup::For::Build,
        _ => setup::For::Demo,
    })?;
    cmd::run(workspace::cargo().args([
        "build",
        "--release",
        "-p",
        "shaper-user",
        "-p",
        "shaper-lab",
        "--bins",
    ]))?;

    let release = workspace::target_dir().join("release");
    let mut lab = Command::new(release.join("shaper-lab"));
    lab.arg(subcommand);
    if subcommand != "fuzz" {
        lab.arg("--shaper").arg(release.join("shaper"));
    }
    if subcommand == "bench" {
        let given = |flag: &str| {
            args.iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        };
        // The committed results live in the workspace's bench/, wherever this is run from,
        // and the docs' generated table is rewritten from them (not from results
        // written elsewhere).
        if !given("--out") {
            lab.arg("--out").arg(workspace::root().join("bench"));
            if !given("--docs") {
                lab.arg("--docs").arg(workspace::root());
            }
        }
        if !given("--baseline") {
            lab.arg("--baseline").arg(old_shaper::build_baseline()?);
        }
    }
    lab.args(args);
    if let Some(test::Kernels::Guests(series)) = kernel {
        let mut words: Vec<String> = lab
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        words.push("--emulated".to_owned());
        words.push("QEMU TCG (the CPU emulated, no KVM), 2 vCPUs".to_owned());
        return vm::run_command(&series, "shaper-lab", &release.join("shaper-lab"), words);
    }
    // shaper-lab keeps the caller's current directory, so relative paths in `args` work.
    Err(cmd::exec(&mut lab))
}

/// `--kernel K` at the front of `bench`'s arguments (and a `--` after it), split off.
fn split_kernel(args: &[String]) -> Result<(Option<test::Kernels>, Vec<String>)> {
    match args {
        [flag, kernel, rest @ ..] if flag == "--kernel" => {
            let kernels = test::kernels(kernel).map_err(anyhow::Error::msg)?;
            let rest = match rest {
                [dashes, rest @ ..] if dashes == "--" => rest,
                rest => rest,
            };
            Ok((Some(kernels), rest.to_vec()))
        }
        args => Ok((None, args.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_is_split_off() {
        let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (k, rest) = split_kernel(&words(&["--kernel", "6.12", "--", "--only", "tcp"])).unwrap();
        assert!(matches!(k, Some(test::Kernels::Guests(s)) if s[0].name == "6.12"));
        assert_eq!(rest, ["--only", "tcp"]);
        let (k, rest) = split_kernel(&words(&["--only", "tcp"])).unwrap();
        assert!(k.is_none());
        assert_eq!(rest, ["--only", "tcp"]);
        assert!(split_kernel(&words(&["--kernel", "5.4"])).is_err());
    }
}
