//! `shaper man [--dir DIR]` (hidden): manual pages in section 8 (system administration),
//! generated from the command-line definition, as bpftool has one page per object.
//! Without `--dir`, shaper(8) on stdout; with it, one page per command (`shaper.8`,
//! `shaper-attach.8`, `shaper-policy-set.8`, ...) written into DIR.
//!
//! A page is clap_mangen's sections (name, synopsis, description from the long help,
//! options, subcommands), then EXAMPLES from the command's `after_long_help` (its
//! "Examples:" block: a command line indented two spaces, what it does six), then SEE
//! ALSO (the command's parent and children, and the tools it works beside) and VERSION.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;

/// The section shaper's pages go in: commands for the administrator.
pub const SECTION: &str = "8";

/// The tools every page refers to.
const SEE_ALSO: &[&str] = &["tc(8)", "ip(8)", "bpftool(8)"];

/// Print the manual page, or write one per command into a directory
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write shaper.8 and a page per subcommand into this directory
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    match &args.dir {
        None => {
            render(&command(), &mut std::io::stdout().lock()).context("writing the manual page")
        }
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

/// `shaper-policy-set`: a command's page name.
fn page_name(cmd: &clap::Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned()
}

/// `cmd`'s page, as roff.
fn render(cmd: &clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone())
        .section(SECTION)
        .manual("System Administration");
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(out)?;
    }
    if let Some(help) = cmd.get_after_long_help() {
        out.write_all(examples(&help.to_string()).as_bytes())?;
    }
    out.write_all(see_also(cmd).as_bytes())?;
    if cmd.get_version().is_some() {
        man.render_version_section(out)?;
    }
    Ok(())
}

/// An "Examples:" block as an EXAMPLES section: each command line bold and unfilled,
/// what it does indented under it.
fn examples(help: &str) -> String {
    let mut roff = String::from(".SH EXAMPLES\n");
    let mut saying = false;
    for line in help.lines().skip_while(|l| l.trim() != "Examples:").skip(1) {
        if let Some(said) = line.strip_prefix("      ") {
            if !saying {
                roff += ".RS 4\n";
                saying = true;
            }
            roff += &format!("{}\n", escape(said.trim()));
            continue;
        }
        if saying {
            roff += ".RE\n";
            saying = false;
        }
        if let Some(command) = line.strip_prefix("  ") {
            roff += &format!(".PP\n.nf\n\\fB{}\\fR\n.fi\n", escape(command.trim()));
        }
    }
    if saying {
        roff += ".RE\n";
    }
    roff
}

/// SEE ALSO: the parent command's page, the children's, and the tools.
fn see_also(cmd: &clap::Command) -> String {
    let name = page_name(cmd);
    let mut pages = Vec::new();
    if let Some((parent, _)) = name.rsplit_once('-') {
        pages.push(format!("{parent}({SECTION})"));
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages.push(format!("{}({SECTION})", page_name(sub)));
    }
    pages.extend(SEE_ALSO.iter().map(|p| (*p).to_owned()));
    let refs: Vec<String> = pages
        .iter()
        .map(|p| {
            let (page, section) = p.split_once('(').unwrap_or((p, ""));
            format!("\\fB{}\\fR({section}", escape(page))
        })
        .collect();
    format!(".SH \"SEE ALSO\"\n{}\n", refs.join(", "))
}

/// `text` as roff text: backslashes and minus signs escaped, a leading dot or quote kept
/// from reading as a request.
fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    if text.starts_with(['.', '\'']) {
        format!("\\&{text}")
    } else {
        text
    }
}

/// Writes a page for the command and every visible subcommand into `dir`; returns their
/// paths.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(cmd: &clap::Command, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, dir, out)?;
        }
        let path = dir.join(format!("{}.{SECTION}", page_name(cmd)));
        let mut text = Vec::new();
        render(cmd, &mut text)?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        out.push(path);
        Ok(())
    }
    let mut paths = Vec::new();
    walk(&command(), dir, &mut paths)?;
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
        let attach = std::fs::read_to_string(dir.join("shaper-attach.8")).unwrap();
        assert!(
            attach.contains(".SH EXAMPLES\n.PP\n.nf\n\\fBshaper attach eth0 \\-\\-rate 10mbit \\-\\-burst 64k\\fR\n.fi\n"),
            "{attach}"
        );
        assert!(
            attach.contains(".SH \"SEE ALSO\"\n\\fBshaper\\fR(8), \\fBtc\\fR(8)"),
            "{attach}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The reference lives with the command: every page a man reader can open has a
    /// description beyond its one line, and examples.
    #[test]
    fn every_command_has_its_reference_and_examples() {
        fn walk(cmd: &clap::Command, missing: &mut Vec<String>) {
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                walk(sub, missing);
            }
            let name = page_name(cmd);
            if cmd.get_long_about().is_none() {
                missing.push(format!("{name}: no long help"));
            }
            let examples = cmd
                .get_after_long_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            if !examples.starts_with("Examples:\n  ") {
                missing.push(format!("{name}: no examples"));
            }
        }
        let mut missing = Vec::new();
        walk(&command(), &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn roff_is_escaped() {
        assert_eq!(escape("a-b\\c"), "a\\-b\\ec");
        assert_eq!(escape(".x"), "\\&.x");
    }
}
