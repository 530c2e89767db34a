//! README.md and docs/*.md as tests read them: their fenced code blocks
//! and the `granary` / `granaryd` command lines they show, so that tests
//! can hold the docs to what the code does.

use std::path::{Path, PathBuf};

/// A fenced code block of a markdown file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// `FILE:LINE` of the block's first line (after the fence).
    pub place: String,
    /// The block's text, the fence's indentation removed, each line ending
    /// in a newline.
    pub text: String,
    /// The last non-blank line before the fence, trimmed (a marker such as
    /// `<!-- invalid -->`).
    pub before: String,
}

/// README.md, then docs/*.md in name order.
#[must_use]
pub fn files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("read docs/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.insert(0, root.join("README.md"));
    files
}

/// Each of [`files`] as (its file name, its text).
#[must_use]
pub fn texts() -> Vec<(String, String)> {
    files()
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name.into_owned(), text)
        })
        .collect()
}

/// The blocks of `doc` (named `name` in [`Block::place`]) fenced with
/// three backquotes and `lang`.
///
/// # Panics
///
/// On a block that is not closed.
#[must_use]
pub fn fenced_blocks(name: &str, doc: &str, lang: &str) -> Vec<Block> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let open = lines[i].trim_start();
        if open.strip_prefix("```").map(str::trim_end) != Some(lang) {
            i += 1;
            continue;
        }
        let indent = lines[i].len() - open.len();
        let before = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or("", |l| l.trim());
        let start = i + 1;
        let mut text = String::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            text.push_str(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
            text.push('\n');
            i += 1;
        }
        assert!(i < lines.len(), "{name}:{start}: unclosed ```{lang} block");
        blocks.push(Block {
            place: format!("{name}:{}", start + 1),
            text,
            before: before.to_owned(),
        });
        i += 1;
    }
    blocks
}

/// The blocks of every one of [`files`] fenced with `lang`.
#[must_use]
pub fn all_fenced_blocks(lang: &str) -> Vec<Block> {
    texts()
        .iter()
        .flat_map(|(name, text)| fenced_blocks(name, text, lang))
        .collect()
}

/// A command line of `bin` shown in the docs: its subcommand path and the
/// `--flags` given to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// `FILE:LINE`.
    pub place: String,
    /// The subcommand words, e.g. `["secret", "new"]`.
    pub subcommand: Vec<String>,
    /// The long options written after it, e.g. `["--config"]`.
    pub flags: Vec<String>,
}

/// Every place in `doc` where `bin` is followed by one of `subcommands`
/// (longest first wins: `"secret new"` before `"secret"`), with the long
/// options that follow on the same line (a line ending in a backslash goes
/// on), up to the end of the code span, a table cell or a shell separator.
#[must_use]
pub fn invocations(name: &str, doc: &str, bin: &str, subcommands: &[&str]) -> Vec<Invocation> {
    let mut subs: Vec<&str> = subcommands.to_vec();
    subs.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = Vec::new();
    let lines: Vec<&str> = doc.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let first = i;
        let mut line = lines[i].to_owned();
        while line.ends_with('\\') && i + 1 < lines.len() {
            line.pop();
            i += 1;
            line.push(' ');
            line.push_str(lines[i].trim_start());
        }
        i += 1;
        let mut rest = line.as_str();
        while let Some(at) = find_word(rest, bin) {
            rest = &rest[at + bin.len()..];
            let args = rest.strip_prefix(' ').unwrap_or("");
            let Some(sub) = subs.iter().find(|s| starts_with_word(args, s)) else {
                continue;
            };
            let tail = &args[sub.len()..];
            let end = tail
                .find(['`', '|', ';', '&', ')', '('])
                .unwrap_or(tail.len());
            // `--flag`, `--flag=V`, `[--flag]`, `[--flag V]`.
            let flags = tail[..end]
                .split_whitespace()
                .map(|w| w.trim_start_matches('['))
                .filter_map(|w| {
                    let name = w.strip_prefix("--")?;
                    let len = name
                        .find(|c: char| !(c.is_alphanumeric() || c == '-'))
                        .unwrap_or(name.len());
                    (len > 0).then(|| format!("--{}", &name[..len]))
                })
                .collect();
            out.push(Invocation {
                place: format!("{name}:{}", first + 1),
                subcommand: sub.split(' ').map(str::to_owned).collect(),
                flags,
            });
        }
    }
    out
}

/// `word` at a word boundary in `s` (not inside `granary-agent`,
/// `libgranary` or a path such as `target/release/granary` is fine).
fn find_word(s: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = s[from..].find(word).map(|a| a + from) {
        let before = s[..at].chars().next_back();
        let after = s[at + word.len()..].chars().next();
        let part = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
        if !part(before) && !part(after) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

fn starts_with_word(s: &str, word: &str) -> bool {
    s.strip_prefix(word).is_some_and(|r| {
        r.chars()
            .next()
            .is_none_or(|c| !c.is_alphanumeric() && c != '-')
    })
}

/// `bin ARGS --help`'s text.
fn help(bin: &Path, args: &[String]) -> String {
    let out = std::process::Command::new(bin)
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {args:?} --help failed",
        bin.display()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands `bin ARGS --help` lists (its "Commands:" section, less
/// `help`).
fn subcommands_of(bin: &Path, args: &[String]) -> Vec<String> {
    help(bin, args)
        .lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// Checks that every `name SUBCOMMAND --flag` that README.md and docs/*.md
/// show is a subcommand of the binary `bin` (called `name` in the docs)
/// whose `--help` lists that flag; returns how many command lines it
/// checked.
///
/// # Panics
///
/// On a documented flag the subcommand lacks, naming the place.
#[must_use]
pub fn check_documented_command_lines(bin: &Path, name: &str) -> usize {
    let mut subs = Vec::new();
    for sub in subcommands_of(bin, &[]) {
        for nested in subcommands_of(bin, std::slice::from_ref(&sub)) {
            subs.push(format!("{sub} {nested}"));
        }
        subs.push(sub);
    }
    let subs: Vec<&str> = subs.iter().map(String::as_str).collect();
    let mut checked = 0;
    for (file, text) in texts() {
        for inv in invocations(&file, &text, name, &subs) {
            let help = help(bin, &inv.subcommand);
            for flag in &inv.flags {
                let listed = help
                    .split(|c: char| !(c.is_alphanumeric() || c == '-'))
                    .any(|w| w == flag);
                assert!(
                    listed,
                    "{}: `{name} {}` has no {flag}:\n{help}",
                    inv.place,
                    inv.subcommand.join(" ")
                );
            }
            checked += 1;
        }
    }
    checked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_invocations_are_read() {
        let doc = "x\n<!-- invalid -->\n\n```toml\n[arena]\n```\n  ```toml\n  [socket]\n  ```\n";
        let b = fenced_blocks("t.md", doc, "toml");
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].before, "<!-- invalid -->");
        assert_eq!(b[0].text, "[arena]\n");
        assert_eq!(b[1].text, "[socket]\n");
        assert_eq!(b[1].place, "t.md:8");
        let doc = "Run `granaryd validate --config f` (or `granary-agent run`);\n\
                   granary secret new - | kubectl --dry-run\n\
                   granary ingest d \\\n  --to s3://b --verify\n\
                   | `granary secret new PATH [--force]` | `granaryd run [--log-format text\\|json]`\n";
        let v = invocations("t.md", doc, "granaryd", &["run", "validate"]);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].flags, ["--config"]);
        assert_eq!(v[1].subcommand, ["run"]);
        assert_eq!(v[1].flags, ["--log-format"]);
        let v = invocations("t.md", doc, "granary", &["secret", "secret new", "ingest"]);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].subcommand, ["secret", "new"]);
        assert!(v[0].flags.is_empty());
        assert_eq!(v[1].place, "t.md:3");
        assert_eq!(v[1].flags, ["--to", "--verify"]);
        assert_eq!(v[2].flags, ["--force"]);
    }
}
