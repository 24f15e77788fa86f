//! A named network namespace owned by a value: created by [`Netns::create`], removed when the
//! value is dropped (also while unwinding from a panic), plus running `ip` inside it.
//!
//! To put a thread or a socket into the namespace, use [`shaper_user::netns::enter`] or
//! [`shaper_user::netns::run_in`] with [`Netns::name`].

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// A network namespace under `/run/netns` that is deleted when this value is dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace (`ip netns add NAME`). Fails if it already exists, so a value
    /// never owns (and never deletes) a namespace it did not create.
    pub fn create(name: &str) -> Result<Netns> {
        validate_name(name)?;
        run_command(Command::new("ip").args(["netns", "add", name]))
            .with_context(|| format!("cannot create network namespace {name}"))?;
        Ok(Netns {
            name: name.to_owned(),
        })
    }

    /// The namespace's name, as `ip -n NAME` and [`shaper_user::netns::enter`] take it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME args...`.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        self.ip_output(args).map(drop)
    }

    /// Runs `ip -n NAME args...` and returns its standard output.
    pub fn ip_output(&self, args: &[&str]) -> Result<String> {
        run_command(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// Runs several `ip` commands (lines without the leading `ip`) in one process with
    /// `ip -n NAME -batch -`; stops at the first failing line.
    ///
    /// One process instead of hundreds keeps setting up 200 addresses fast.
    pub fn ip_batch(&self, lines: &[String]) -> Result<()> {
        batch("ip", &self.name, lines)
    }
}

/// Runs `PROGRAM -n NS -batch -` (`ip` or `tc`) with `lines` on its standard input; fails
/// naming the batch if any line fails.
pub fn batch(program: &str, ns: &str, lines: &[String]) -> Result<()> {
    let mut cmd = Command::new(program);
    cmd.args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run `{}`", describe(&cmd)))?;
    let mut script = lines.join("\n");
    script.push('\n');
    // Write then close stdin (dropping it) so the program sees end of input.
    let written = child
        .stdin
        .take()
        .with_context(|| format!("{program}'s stdin is not piped"))?
        .write_all(script.as_bytes());
    let output = child
        .wait_with_output()
        .with_context(|| format!("cannot wait for `{}`", describe(&cmd)))?;
    if let Err(e) = check_output(&cmd, &output) {
        bail!("{e} (batch: {})", lines.join("; "));
    }
    written.with_context(|| format!("cannot write to `{}`", describe(&cmd)))?;
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        // A warning, not a panic: this can run while unwinding, where a second panic would
        // abort, and there is nothing better to do than leave the namespace for `ip netns
        // del`. Deleting the namespace also deletes the interfaces inside it (a veth end).
        if let Err(e) = run_command(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Rejects names `ip netns` would refuse or misread, with a clearer message than iproute2's.
fn validate_name(name: &str) -> Result<()> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.is_empty() || name.len() > 200 || !name.chars().all(allowed) {
        bail!("bad network namespace name {name:?}: use 1..=200 of [A-Za-z0-9_-]");
    }
    Ok(())
}

/// Runs a command to completion and returns its standard output; on failure the error
/// names the command line and carries its standard error.
pub fn run_command(cmd: &mut Command) -> Result<String> {
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{}`", describe(cmd)))?;
    check_output(cmd, &output)?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn check_output(cmd: &Command, output: &std::process::Output) -> Result<()> {
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The command line as one string, for error messages.
fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|arg| arg.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
