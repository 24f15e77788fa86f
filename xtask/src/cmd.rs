//! Running external commands: each is echoed as `$ program args` before it runs, so a log shows
//! exactly what happened, and a failure becomes an error naming the command.

use std::ffi::OsStr;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Error, Result, anyhow, bail};

/// Runs `cmd` with inherited stdio; a non-zero exit is an error naming the command.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    println!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Replaces this process with `cmd`, so that the program owns the terminal: Ctrl-C then reaches
/// only it and the shell waits until it has cleaned up, and its exit status is ours. Returns only
/// on failure to start.
pub fn exec(cmd: &mut Command) -> Error {
    let line = display(cmd);
    println!("$ {line}");
    let err = cmd.exec();
    anyhow!(err).context(format!("could not start `{line}`"))
}

/// Runs `cmd` quietly (it is a check, not a step worth echoing) and returns its stdout; a
/// non-zero exit is an error carrying the command's stderr.
pub fn stdout(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("`{line}` failed ({}): {}", output.status, stderr.trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `cmd` as a shell would read it, with the environment variables it sets in front.
pub fn display(cmd: &Command) -> String {
    let envs = cmd.get_envs().filter_map(|(key, value)| {
        value.map(|value| format!("{}={}", key.to_string_lossy(), quote(value)))
    });
    let words = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(quote);
    envs.chain(words).collect::<Vec<_>>().join(" ")
}

/// Quotes `word` for a POSIX shell when it holds anything but plainly safe characters, so an
/// echoed command can be pasted back into a shell.
fn quote(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.into_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_and_shows_env() {
        let mut cmd = Command::new("cargo");
        cmd.env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .args(["test", "--", "it's", ""]);
        assert_eq!(
            display(&cmd),
            r"LLVM_PREFIX=/usr/lib/llvm-22 cargo test -- 'it'\''s' ''"
        );
    }
}
