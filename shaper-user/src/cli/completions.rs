//! `shaper completions bash|zsh|fish` (hidden): the shell's completion script for shaper,
//! generated from the command-line definition, on stdout.

use anyhow::Result;
use clap::CommandFactory as _;
use clap_complete::Shell;

/// Print the completion script for a shell
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell
    #[arg(value_parser = ["bash", "zsh", "fish"])]
    pub shell: String,
}

pub fn run(args: &Args) -> Result<()> {
    let shell: Shell = args
        .shell
        .parse()
        .map_err(|e| anyhow::anyhow!("shell '{}': {e}", args.shell))?;
    write(shell, &mut std::io::stdout().lock());
    Ok(())
}

/// Writes `shell`'s completion script for the whole command.
pub fn write(shell: Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut super::Cli::command(), "shaper", out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(shell: Shell) -> String {
        let mut out = Vec::new();
        write(shell, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_shell_completes_subcommands_and_their_flags() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let text = script(shell);
            // fish names long options without their dashes (`-l rate`).
            for word in ["attach", "policy", "apply", "rate", "new-sources"] {
                assert!(text.contains(word), "{shell}: no '{word}' in the script");
            }
        }
    }
}
