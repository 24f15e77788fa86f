//! `shaper man [--dir DIR]` (hidden): manual pages in section 8 (system administration),
//! generated from the command-line definition. Without `--dir`, shaper(8) on stdout; with
//! it, one page per command (`shaper.8`, `shaper-attach.8`, `shaper-policy-set.8`, ...)
//! written into DIR.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;

/// The section shaper's pages go in: commands for the administrator.
pub const SECTION: &str = "8";

/// Print the manual page, or write one per command into a directory
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write shaper.8 and a page per subcommand into this directory
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    match &args.dir {
        None => page(command())
            .render(&mut std::io::stdout().lock())
            .context("writing the manual page"),
        Some(dir) => {
            for path in write_all(dir)? {
                println!("{}", path.display());
            }
            Ok(())
        }
    }
}

/// The whole command, built (so that subcommands carry their full names).
fn command() -> clap::Command {
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

fn page(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd)
        .section(SECTION)
        .manual("System Administration")
}

/// Writes a page for the command and every visible subcommand into `dir`; returns their
/// paths.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(cmd: clap::Command, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub.clone(), dir, out)?;
        }
        let man = page(cmd);
        let path = dir.join(man.get_filename());
        man.generate_to(dir)
            .with_context(|| format!("cannot write {}", path.display()))?;
        out.push(path);
        Ok(())
    }
    let mut paths = Vec::new();
    walk(command(), dir, &mut paths)?;
    paths.reverse();
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_visible_command_in_section_8() {
        let dir = std::env::temp_dir().join(format!("shaper-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths = write_all(&dir).unwrap();
        let names: Vec<String> = paths
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in ["shaper.8", "shaper-attach.8", "shaper-policy-set.8"] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        assert!(
            !names
                .iter()
                .any(|n| n.contains("man") || n.contains("completions"))
        );
        let main = std::fs::read_to_string(dir.join("shaper.8")).unwrap();
        assert!(main.starts_with(".ie \\n(.g .ds Aq"), "{}", &main[..80]);
        assert!(main.contains(".TH shaper 8"), "{}", &main[..200]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
