//! `cargo xtask`: project automation for shaper (setup, test, demo, bench, lab).
//!
//! This crate deliberately depends on no other workspace crate: `shaper-user`'s build script
//! needs the nightly toolchain and bpf-linker that `cargo xtask setup` installs, so xtask must
//! build without them. Everything else is driven by spawning `cargo`, `rustup`, `apt-get`, ...

mod apt;
mod cmd;
mod dist;
mod docs;
mod host;
mod image;
mod lab;
mod mutants;
mod old_shaper;
mod phases;
mod setup;
mod tally;
mod test;
mod vm;
mod workspace;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Project automation for shaper"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what one command needs (default: test), saying what first; refuses to let
    /// apt remove a package this machine has; does nothing when all is present
    Setup(SetupArgs),
    /// Run setup, cargo fmt --check, clippy, host tests, then kernel tests (root only)
    Test(test::Args),
    /// Rewrite the tables README.md and docs/ copy from bench/results*.md, and list the
    /// figures that no longer match the bench/results.json entries they cite
    Docs,
    /// Build target/dist/shaper_<version>_<arch>.deb: the binary, systemd unit, manual pages,
    /// shell completions and an example /etc/shaper/shaper.toml
    Dist,
    /// Build the container image localhost/shaper:<version> (podman) from the package and
    /// Debian's libraries (mmdebstrap), saved as target/dist/shaper_<version>_<arch>.oci.tar
    Image,
    /// Build release binaries and run `shaper-lab demo` (needs root)
    Demo(LabArgs),
    /// Build release binaries and the baseline (the previous build, from its commit) and run
    /// `shaper-lab bench` (needs root), e.g. `bench --quick`, `bench -- --only kernel`,
    /// `bench --kernel 6.12 -- --only kernel`
    Bench(LabArgs),
    /// Build release binaries and run `shaper-lab lab` (needs root)
    Lab(LabArgs),
    /// Build release binaries and run `shaper-lab fuzz` (needs root): fuzzed frames through
    /// the XDP program, e.g. `fuzz --frames 1000000 --seed 0x5eed` (default 10 000 000)
    Fuzz(LabArgs),
    /// Mutation testing with cargo-mutants over shaper-common and the userspace library's
    /// logic, each mutant tested by its package's unit tests (not part of CI: tens of
    /// minutes), e.g. `mutants --scope common`, `mutants -- --list`
    Mutants(mutants::Args),
}

#[derive(clap::Args)]
struct SetupArgs {
    /// The command to set up for
    #[arg(value_enum, default_value_t = setup::For::Test)]
    r#for: setup::For,
}

#[derive(clap::Args)]
struct LabArgs {
    /// Arguments passed on to shaper-lab (use `-- --help` for shaper-lab's own help)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup(args) => setup::run(args.r#for).map(|()| ExitCode::SUCCESS),
        Command::Test(args) => test::run(&args),
        Command::Docs => docs::run().map(|()| ExitCode::SUCCESS),
        Command::Dist => setup::run(setup::For::Dist)
            .and_then(|()| dist::run())
            .map(|_| ExitCode::SUCCESS),
        Command::Image => setup::run(setup::For::Image)
            .and_then(|()| image::run())
            .map(|_| ExitCode::SUCCESS),
        Command::Demo(LabArgs { args }) => lab::run("demo", &args),
        Command::Bench(LabArgs { args }) => lab::run("bench", &args),
        Command::Lab(LabArgs { args }) => lab::run("lab", &args),
        Command::Fuzz(LabArgs { args }) => lab::run("fuzz", &args),
        Command::Mutants(args) => mutants::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            // `{:#}` keeps the whole context chain on one line, which is what a failing step
            // should leave at the bottom of a long log.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab_args(argv: &[&str]) -> Vec<String> {
        match Cli::try_parse_from(argv).map(|cli| cli.command) {
            Ok(Command::Bench(LabArgs { args })) => args,
            _ => panic!("{argv:?} did not parse as bench"),
        }
    }

    #[test]
    fn shaper_lab_args_pass_through() {
        assert_eq!(lab_args(&["xtask", "bench", "--quick"]), ["--quick"]);
        assert_eq!(
            lab_args(&["xtask", "bench", "--quick", "--help"]),
            ["--quick", "--help"]
        );
        assert_eq!(lab_args(&["xtask", "bench", "--", "--help"]), ["--help"]);
        // lab.rs splits `--kernel K` (and the `--`) off again.
        let args = lab_args(&["xtask", "bench", "--kernel", "6.12", "--", "--only", "tcp"]);
        assert_eq!(args[..2], ["--kernel", "6.12"]);
        assert_eq!(args.last().map(String::as_str), Some("tcp"));
    }

    #[test]
    fn fuzz_args_pass_through() {
        let Ok(Command::Fuzz(LabArgs { args })) =
            Cli::try_parse_from(["xtask", "fuzz", "--frames", "1000", "--seed", "0x5eed"])
                .map(|cli| cli.command)
        else {
            panic!("did not parse as fuzz");
        };
        assert_eq!(args, ["--frames", "1000", "--seed", "0x5eed"]);
    }

    #[test]
    fn mutants_scopes() {
        let scopes = |argv: &[&str]| match Cli::try_parse_from(argv).map(|cli| cli.command) {
            Ok(Command::Mutants(args)) => {
                Ok(args.scope.0.iter().map(|s| s.name).collect::<Vec<_>>())
            }
            Ok(_) => panic!("{argv:?} did not parse as mutants"),
            Err(err) => Err(err),
        };
        let all: Vec<&str> = mutants::SCOPES.iter().map(|s| s.name).collect();
        assert_eq!(scopes(&["xtask", "mutants"]).unwrap(), all);
        assert_eq!(
            scopes(&["xtask", "mutants", "--scope", "user"]).unwrap(),
            ["user"]
        );
        assert!(scopes(&["xtask", "mutants", "--scope", "ebpf"]).is_err());
        // The kernel's only when named (root, --in-place).
        assert!(!all.contains(&"kernel"));
        assert_eq!(
            scopes(&["xtask", "mutants", "--scope", "kernel"]).unwrap(),
            ["kernel"]
        );
    }

    #[test]
    fn kernel_test_filter_after_dashes() {
        let Ok(Command::Test(args)) =
            Cli::try_parse_from(["xtask", "test", "--", "live_rate"]).map(|cli| cli.command)
        else {
            panic!("did not parse as test");
        };
        assert_eq!(args.kernel_test_args, ["live_rate"]);
        assert!(!args.host_only);
    }

    fn test_args(argv: &[&str]) -> Result<test::Args, clap::Error> {
        match Cli::try_parse_from(argv)?.command {
            Command::Test(args) => Ok(args),
            _ => panic!("{argv:?} did not parse as test"),
        }
    }

    fn kernel_names(argv: &[&str]) -> Option<Vec<&'static str>> {
        match test_args(argv).unwrap().kernel {
            test::Kernels::Host => None,
            test::Kernels::Guests(series) => Some(series.iter().map(|s| s.name).collect()),
        }
    }

    #[test]
    fn kernel_choices() {
        assert_eq!(kernel_names(&["xtask", "test"]), None);
        assert_eq!(kernel_names(&["xtask", "test", "--kernel", "host"]), None);
        assert_eq!(
            kernel_names(&["xtask", "test", "--kernel", "all"]),
            Some(vec!["5.10", "6.1", "6.12"])
        );
        assert_eq!(
            kernel_names(&["xtask", "test", "--kernel", "6.12,6.1,6.12"]),
            Some(vec!["6.12", "6.1"])
        );
        assert_eq!(
            kernel_names(&["xtask", "test", "--kernel", "5.10"]),
            Some(vec!["5.10"])
        );
        assert!(test_args(&["xtask", "test", "--kernel", "5.4"]).is_err());
        // --host-only goes with this machine's kernel only.
        assert!(
            test_args(&["xtask", "test", "--host-only"])
                .unwrap()
                .host_only
        );
        assert!(test_args(&["xtask", "test", "--kernel", "6.1", "--host-only"]).is_err());
        // A filter after `--` goes to the guests' test binaries too.
        let args = test_args(&["xtask", "test", "--kernel", "6.1", "--", "golden"]).unwrap();
        assert_eq!(args.kernel_test_args, ["golden"]);
    }
}
