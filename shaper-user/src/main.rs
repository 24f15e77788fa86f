//! The `shaper` command. Errors are one line on stderr and a non-zero exit.

mod cli;

use std::{path::Path, process::ExitCode};

use clap::{Parser as _, error::ErrorKind};
use cli::{Cli, Command};
use shaper_common::maps::PIN_ROOT;
use shaper_user::{journal, netns, pins, system};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader goes away
    // (`shaper stats eth0 | head`) instead of panicking in println!.
    // SAFETY: restoring the default disposition of one signal, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shaper: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// clap's errors, but on one line (help and version print as usual).
fn usage_error(e: clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("shaper: {}", one_line(&e.to_string()));
            ExitCode::from(2)
        }
    }
}

/// clap's message with what it puts on further lines (the missing arguments, the possible
/// values) joined on, and without the usage and tips.
fn one_line(text: &str) -> String {
    let mut parts = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line.trim_start_matches("error: "));
    }
    parts.join(" ")
}

/// Whether `command` works on the pins alone (and so does not need the interface's
/// namespace to exist).
fn pins_only(command: &Command) -> bool {
    matches!(
        command,
        Command::Detach(_)
            | Command::Status(_)
            | Command::Stats(_)
            | Command::Top(_)
            | Command::Policy(cli::policy::Command::List(_))
            | Command::Subscriber(cli::subscriber::Command::List(_))
            | Command::Subscriber(cli::subscriber::Command::Show(_))
            | Command::Config(_)
    )
}

/// Refuses an interface or namespace name that could not be one (`..`, `a/b`, ...).
fn check_names(cli: &Cli) -> Result<(), pins::PinError> {
    if let Some(ns) = &cli.netns {
        pins::check_netns_name(ns)?;
    }
    match cli.command.iface() {
        Some(iface) => {
            pins::Attachment::toward(iface, cli.netns.as_deref(), cli.direction).check_names()
        }
        None => Ok(()),
    }
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    // Arithmetic only: no privileges, no bpffs, no namespace.
    match &cli.command {
        Command::Explain(args) => return cli::explain::run(args, cli.json),
        Command::Completions(args) => return cli::completions::run(args),
        Command::Man(args) => return cli::man::run(args),
        Command::Apply(args) if args.check => {
            return cli::apply::check(args, cli.direction);
        }
        _ => {}
    }
    // The names become paths: checked before anything else.
    check_names(cli)?;
    // Checked before anything else so that nothing is half done for want of them.
    system::check_privileges()?;
    system::check_bpffs(Path::new(PIN_ROOT).parent().unwrap_or(Path::new("/")))?;
    // No pin is read or written under a directory someone else could change.
    pins::check_root()?;
    // A change killed half way is rolled back before anything reads or writes the pins
    // (it needs the pins only: no namespace, no interface). Without a journal nothing is
    // under way or interrupted, and a command that only reads need not wait for the lock.
    if journal::pending() {
        let _lock = system::lock()?;
        if let Some(line) = journal::recover()? {
            eprintln!("shaper: {line}");
        }
    }
    // The current-thread runtime runs everything on this thread, so entering the
    // namespace here covers all that follows.
    let ns = cli.netns.as_deref();
    if let Some(ns) = ns {
        match netns::enter(ns) {
            Ok(()) => {}
            // The pins of a deleted namespace's interfaces stay until detached: what reads
            // or removes only pins goes on without it.
            Err(e) if e.is_missing() && pins_only(&cli.command) => {}
            Err(e) => {
                let left = pins::list_all()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|at| at.netns.as_deref() == Some(ns))
                    .map(|at| at.iface)
                    .collect::<Vec<_>>();
                if left.is_empty() {
                    return Err(e.into());
                }
                anyhow::bail!(
                    "{e}; shaper's pins for {} are left there: `shaper -n {ns} detach IFACE` removes them",
                    left.join(", ")
                );
            }
        }
    }
    let scope = cli::Scope {
        netns: ns,
        direction: cli.direction,
    };
    match &cli.command {
        Command::Attach(args) => cli::attach::run(args, scope),
        Command::Detach(args) => cli::detach::run(args, scope),
        Command::Status(args) => cli::status::run(args, scope, cli.json),
        Command::Stats(args) => cli::stats::run(args, scope, cli.json),
        Command::Top(args) => cli::top::run(args, scope, cli.json),
        Command::Policy(command) => cli::policy::run(command, scope, cli.json),
        Command::Subscriber(command) => cli::subscriber::run(command, scope, cli.json),
        Command::Apply(args) => cli::apply::run(args, scope, cli.json),
        Command::Config(command) => cli::config::run(command, scope),
        Command::Explain(args) => cli::explain::run(args, cli.json),
        Command::Completions(args) => cli::completions::run(args),
        Command::Man(args) => cli::man::run(args),
        Command::Run(args) => cli::run::run(args, scope).await,
        Command::Watch(args) => cli::watch::run(args, scope, cli.json).await,
    }
}
