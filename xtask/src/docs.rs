//! `cargo xtask docs`: the figures of README.md and docs/ against the committed bench
//! results they cite (docs/contributing/docs.md says how to cite). A copied table is
//! rewritten from its source; an inline figure that no longer matches is listed, since
//! the sentence around it may need rewriting too. The host test below fails on any
//! figure that does not match, so `cargo xtask test` does.
//!
//! Two forms:
//! - `1.36×<!-- results: per_packet.cases[id=pass_existing].ratio_to_floor -->`: the
//!   number just before the marker (a unit may stand between) is the value at that path
//!   of bench/results.json, rounded to the decimals written. A path is field names
//!   joined by dots; `[field=value]` keeps the entries of a list whose field is that
//!   value, `[N]` takes the Nth (from 0); a list must come down to one entry.
//! - `<!-- table: bench/results.md#Heading -->` ... `<!-- end table -->`: the lines
//!   between are the first table under that heading of that file, verbatim.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::workspace;

const INLINE: &str = "<!-- results: ";
const TABLE: &str = "<!-- table: ";
const END_TABLE: &str = "<!-- end table -->";
const RESULTS: &str = "bench/results.json";

/// Rewrites every copied table from its source; fails listing the inline figures that
/// do not match.
pub fn run() -> Result<()> {
    let root = workspace::root();
    let results = read_results(root)?;
    let mut stale = Vec::new();
    for page in pages(root)? {
        let text = fs::read_to_string(&page)?;
        let name = relative(root, &page);
        let (copied, problems) = check(&name, &text, &results, root);
        if copied != text {
            fs::write(&page, &copied).with_context(|| format!("cannot write {name}"))?;
            println!("rewrote the copied tables of {name}");
        }
        stale.extend(problems.into_iter().filter(|p| !p.contains(": table ")));
    }
    if !stale.is_empty() {
        bail!(
            "figures that do not match the results they cite:\n{}",
            stale.join("\n")
        );
    }
    println!("every cited figure matches the committed results");
    Ok(())
}

fn read_results(root: &Path) -> Result<Value> {
    let path = root.join(RESULTS);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// README.md and every Markdown page under docs/.
fn pages(root: &Path) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut pages = vec![root.join("README.md")];
    let docs = root.join("docs");
    if docs.is_dir() {
        walk(&docs, &mut pages)?;
    }
    pages.sort();
    Ok(pages)
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `text` (the page `name`) with its copied tables as their sources have them, and what
/// is wrong with it: `name:LINE: ...`, one a problem.
fn check(name: &str, text: &str, results: &Value, root: &Path) -> (String, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut lines = text.lines().enumerate();
    // Markers inside a fenced code block are examples, not citations.
    let mut fenced = false;
    while let Some((i, line)) = lines.next() {
        out.push(line.to_owned());
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        for (figure, path) in inline_figures(line) {
            if let Err(e) = check_figure(&figure, &path, results) {
                problems.push(format!("{name}:{}: {e}", i + 1));
            }
        }
        let Some(source) = line
            .trim()
            .strip_prefix(TABLE)
            .and_then(|s| s.strip_suffix("-->"))
            .map(str::trim)
        else {
            continue;
        };
        let mut copied = Vec::new();
        let mut ended = false;
        for (_, line) in lines.by_ref() {
            if line.trim() == END_TABLE {
                ended = true;
                break;
            }
            copied.push(line);
        }
        if !ended {
            problems.push(format!("{name}:{}: table {source}: no {END_TABLE}", i + 1));
            out.extend(copied.iter().map(|l| (*l).to_owned()));
            continue;
        }
        match table_of(root, source) {
            Ok(table) => {
                if copied != table.iter().map(String::as_str).collect::<Vec<_>>() {
                    problems.push(format!(
                        "{name}:{}: table {source}: differs from its source",
                        i + 1
                    ));
                }
                out.extend(table);
            }
            Err(e) => {
                problems.push(format!("{name}:{}: table {source}: {e}", i + 1));
                out.extend(copied.iter().map(|l| (*l).to_owned()));
            }
        }
        out.push(END_TABLE.to_owned());
    }
    let mut copied = out.join("\n");
    if text.ends_with('\n') {
        copied.push('\n');
    }
    (copied, problems)
}

/// The figures cited inline on `line`: the number written before each marker, and the
/// marker's path.
fn inline_figures(line: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(INLINE) {
        let before = &rest[..at];
        let after = &rest[at + INLINE.len()..];
        let Some(end) = after.find("-->") else {
            found.push((String::new(), after.to_owned()));
            break;
        };
        found.push((last_number(before), after[..end].trim().to_owned()));
        rest = &after[end + 3..];
    }
    found
}

/// The last number of `text` (`-0.1`, `1,399,657`, `44.0`), skipping what follows it
/// (a unit, `**`, a closing parenthesis).
fn last_number(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let Some(end) = chars.iter().rposition(char::is_ascii_digit) else {
        return String::new();
    };
    let mut start = end;
    while start > 0 && (chars[start - 1].is_ascii_digit() || ".,".contains(chars[start - 1])) {
        start -= 1;
    }
    if start > 0 && "-−".contains(chars[start - 1]) {
        start -= 1;
    }
    chars[start..=end]
        .iter()
        .filter(|c| **c != ',')
        .map(|c| if *c == '−' { '-' } else { *c })
        .collect()
}

/// Whether `figure` is the value at `path`, rounded as written.
fn check_figure(figure: &str, path: &str, results: &Value) -> Result<()> {
    if figure.is_empty() {
        bail!("no figure before the marker of {path}");
    }
    let value = lookup(results, path)?;
    let Some(number) = value.as_f64() else {
        bail!("{path} is {value}, not a number");
    };
    let decimals = figure.split_once('.').map_or(0, |(_, d)| d.len());
    let rounded = format!("{number:.decimals$}");
    // -0.0 and 0.0 are one figure.
    let same = rounded == figure
        || rounded.trim_start_matches('-') == figure.trim_start_matches('-')
            && figure.trim_start_matches(['-', '0', '.']).is_empty();
    if !same {
        bail!("{figure} cites {path}, which is {rounded} ({number})");
    }
    Ok(())
}

/// The value at `path` (see the module docs).
fn lookup<'a>(results: &'a Value, path: &str) -> Result<&'a Value> {
    let mut here = results;
    for segment in split_path(path) {
        let (field, selectors) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        if !field.is_empty() {
            here = here
                .get(field)
                .with_context(|| format!("{path}: no field {field}"))?;
        }
        if selectors.is_empty() {
            continue;
        }
        let Some(list) = here.as_array() else {
            bail!("{path}: {field} is not a list");
        };
        let mut entries: Vec<&Value> = list.iter().collect();
        for selector in selectors.split(']').filter_map(|s| s.strip_prefix('[')) {
            entries = match selector.split_once('=') {
                Some((key, want)) => entries
                    .into_iter()
                    .filter(|e| e.get(key).is_some_and(|v| matches(v, want)))
                    .collect(),
                None => {
                    let n: usize = selector
                        .parse()
                        .with_context(|| format!("{path}: [{selector}] is no index"))?;
                    entries.get(n).map(|e| vec![*e]).unwrap_or_default()
                }
            };
        }
        here = match entries.as_slice() {
            [one] => one,
            [] => bail!("{path}: no entry of {field} is {selectors}"),
            _ => bail!(
                "{path}: {} entries of {field} are {selectors}: add [N]",
                entries.len()
            ),
        };
    }
    Ok(here)
}

/// The path's segments: split at dots outside brackets (a selector's value may hold one).
fn split_path(path: &str) -> Vec<&str> {
    let mut segments = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in path.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            '.' if depth == 0 => {
                segments.push(&path[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    segments.push(&path[start..]);
    segments
}

/// Whether a JSON value is the selector's `want`.
fn matches(value: &Value, want: &str) -> bool {
    match value {
        Value::String(s) => s == want,
        Value::Number(n) => want.parse::<f64>().ok() == n.as_f64(),
        Value::Bool(b) => want.parse::<bool>().ok() == Some(*b),
        _ => false,
    }
}

/// The first table (its `|` lines) under the heading of `source`
/// (`bench/results.md#Heading`).
fn table_of(root: &Path, source: &str) -> Result<Vec<String>> {
    let Some((file, heading)) = source.split_once('#') else {
        bail!("not FILE#Heading");
    };
    let text =
        fs::read_to_string(root.join(file)).with_context(|| format!("cannot read {file}"))?;
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim_start_matches('#').trim() != heading || !l.starts_with('#'));
    if lines.next().is_none() {
        bail!("{file} has no heading '{heading}'");
    }
    let table: Vec<String> = lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(str::to_owned)
        .collect();
    if table.is_empty() {
        bail!("no table under '{heading}' in {file}");
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every figure the README and docs/ cite is the committed result's, and every table
    /// they copy is its source's (`cargo xtask docs` rewrites stale tables).
    #[test]
    fn docs_cite_the_committed_results() {
        let root = workspace::root();
        let results = read_results(root).unwrap();
        let mut problems = Vec::new();
        for page in pages(root).unwrap() {
            let text = fs::read_to_string(&page).unwrap();
            problems.extend(check(&relative(root, &page), &text, &results, root).1);
        }
        assert!(
            problems.is_empty(),
            "run `cargo xtask docs`, then fix what it lists:\n{}",
            problems.join("\n")
        );
    }

    fn results() -> Value {
        serde_json::json!({
            "flood": [
                {"limiter": "hashlimit", "flood_passed_pct": 31.0961},
                {"limiter": "nft meter", "flood_passed_pct": 100.0},
            ],
            "duration": [
                {"limiter": "nft", "seconds": 3.0, "excess_pct": 34.133},
                {"limiter": "nft", "seconds": 5.0, "excess_pct": 20.945},
                {"limiter": "shaper", "seconds": 3.0, "excess_pct": -0.093},
            ],
        })
    }

    #[test]
    fn inline_figures_are_checked_at_the_decimals_written() {
        let r = results();
        let check_line = |line: &str| -> Vec<String> {
            inline_figures(line)
                .into_iter()
                .filter_map(|(f, p)| check_figure(&f, &p, &r).err().map(|e| e.to_string()))
                .collect()
        };
        let ok =
            "passed **31.1%**<!-- results: flood[limiter=hashlimit].flood_passed_pct --> of it";
        assert_eq!(check_line(ok), Vec::<String>::new());
        assert_eq!(
            check_line("31%<!-- results: flood[limiter=hashlimit].flood_passed_pct -->"),
            Vec::<String>::new()
        );
        let stale = "44.0%<!-- results: flood[limiter=hashlimit].flood_passed_pct -->";
        assert_eq!(
            check_line(stale),
            ["44.0 cites flood[limiter=hashlimit].flood_passed_pct, which is 31.1 (31.0961)"]
        );
        assert!(check_line("+21%<!-- results: duration[limiter=nft][1].excess_pct -->").is_empty());
        assert!(
            check_line("−0.1%<!-- results: duration[limiter=shaper].excess_pct -->").is_empty()
        );
        let ambiguous = check_line("34%<!-- results: duration[limiter=nft].excess_pct -->");
        assert!(ambiguous[0].contains("2 entries"), "{ambiguous:?}");
        let missing = check_line("1<!-- results: flood[limiter=tbf].flood_passed_pct -->");
        assert!(missing[0].contains("no entry"), "{missing:?}");
        assert!(check_line("<!-- results: flood -->")[0].contains("no figure"));
    }

    #[test]
    fn copied_tables_are_rewritten_from_their_source() {
        let root = std::env::temp_dir().join(format!("xtask-docs-{}", std::process::id()));
        fs::create_dir_all(root.join("bench")).unwrap();
        fs::write(
            root.join("bench/results.md"),
            "# r\n\n## Flood\n\nSome words.\n\n| a | b |\n| - | - |\n| 1 | 2 |\n\nafter\n",
        )
        .unwrap();
        let page = "x\n<!-- table: bench/results.md#Flood -->\n| a | b |\n| - | - |\n| 9 | 9 |\n<!-- end table -->\ny\n";
        let (copied, problems) = check("page.md", page, &results(), &root);
        assert_eq!(
            copied,
            "x\n<!-- table: bench/results.md#Flood -->\n| a | b |\n| - | - |\n| 1 | 2 |\n<!-- end table -->\ny\n"
        );
        assert_eq!(
            problems,
            ["page.md:2: table bench/results.md#Flood: differs from its source"]
        );
        assert!(check("page.md", &copied, &results(), &root).1.is_empty());
        // In a fenced block a marker is an example.
        let example =
            "```markdown\n<!-- table: bench/results.md#Flood -->\n<!-- end table -->\n```\n";
        assert_eq!(
            check("page.md", example, &results(), &root),
            (example.to_owned(), vec![])
        );
        let (_, problems) = check(
            "p.md",
            "<!-- table: bench/results.md#Nowhere -->\n<!-- end table -->\n",
            &results(),
            &root,
        );
        assert!(problems[0].contains("no heading 'Nowhere'"), "{problems:?}");
        fs::remove_dir_all(&root).unwrap();
    }
}
