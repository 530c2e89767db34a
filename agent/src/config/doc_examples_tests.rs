//! Every ```toml block of README.md and docs/*.md is a configuration the
//! agent accepts, as `granaryd validate` checks it (parsed, validated and
//! the job secret's file read), unless the line before it is
//! `<!-- invalid -->`: then the agent must refuse it.
//!
//! A block without a `[[dataset]]` is a fragment: it is checked with one
//! `[[dataset]]` (`root = "/data"`) added for each name its mixture sources
//! use, or one named "d" when they use none. A `secret_file` is pointed at a
//! freshly made secret.
use super::*;
use granary_testkit::docs;

/// The marker, alone on the line before a block, of an example the agent
/// must refuse.
const INVALID: &str = "<!-- invalid -->";

/// A fragment made a whole configuration (see the module's comment).
fn whole(text: &str) -> String {
    if text.lines().any(|l| l.trim() == "[[dataset]]") {
        return text.to_owned();
    }
    let mut names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("dataset"))
        .filter_map(|l| l.trim_start().strip_prefix('='))
        .filter_map(|l| l.trim().strip_prefix('"')?.split('"').next())
        .collect();
    names.dedup();
    if names.is_empty() {
        names.push("d");
    }
    let mut out = text.to_owned();
    for n in names {
        out.push_str(&format!(
            "\n[[dataset]]\nname = \"{n}\"\nroot = \"/data\"\n"
        ));
    }
    out
}

/// `text` with every `secret_file = "…"` pointed at `secret`.
fn with_secret(text: &str, secret: &Path) -> String {
    text.lines()
        .map(|l| match l.trim_start().strip_prefix("secret_file") {
            Some(rest) if rest.trim_start().starts_with('=') => {
                format!("secret_file = \"{}\"", secret.display())
            }
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `granaryd validate` checks, short of this machine's memory.
fn validate_file(text: &str, dir: &Path) -> Result<Config, ConfigError> {
    let path = dir.join("granary.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(&path)?;
    cfg.check_secret_file()?;
    Ok(cfg)
}

#[test]
fn fragments_are_made_whole() {
    assert!(docs::all_fenced_blocks("toml").len() >= 15);
    let w = whole("[[mixture]]\nname = \"m\"\n[[mixture.source]]\ndataset = \"a\"\n");
    assert!(w.contains("name = \"a\"\nroot = \"/data\""), "{w}");
    assert!(whole("[arena]\n").contains("name = \"d\""));
    let s = with_secret("[peers]\n secret_file = \"/x\"\n", Path::new("/s"));
    assert_eq!(s, "[peers]\nsecret_file = \"/s\"");
}

#[test]
fn doc_toml_blocks_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("job.secret");
    std::fs::write(&secret, peer_secret::generate().unwrap()).unwrap();
    for b in docs::all_fenced_blocks("toml") {
        let text = whole(&b.text);
        let parsed = Config::from_toml_str(&text);
        let checked = validate_file(&with_secret(&text, &secret), dir.path());
        if b.before == INVALID {
            // Refused by the parser, the rules or the secret's check.
            assert!(checked.is_err(), "{}: marked invalid but accepted", b.place);
        } else {
            if let Err(e) = parsed {
                panic!("{}: {e}\n{text}", b.place);
            }
            if let Err(e) = checked {
                panic!("{}: {e}\n{text}", b.place);
            }
        }
    }
}

/// The lines of the error examples in configuration.md's "How errors are
/// reported" (less the file name, each cut at a trailing "...").
fn documented_error_lines() -> Vec<String> {
    let (_, doc) = docs::texts()
        .into_iter()
        .find(|(n, _)| n == "configuration.md")
        .unwrap();
    let section = doc
        .split("## How errors are reported")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap()
        .to_owned();
    docs::fenced_blocks("configuration.md", &section, "text")
        .iter()
        .flat_map(|b| b.text.lines().map(str::to_owned).collect::<Vec<_>>())
        .map(|l| {
            let l = l.strip_prefix("granary.toml: ").unwrap_or(&l);
            l.strip_suffix("...").unwrap_or(l).to_owned()
        })
        .collect()
}

#[test]
fn documented_error_messages_are_the_agents() {
    let lines = documented_error_lines();
    assert!(lines.len() >= 12, "{lines:?}");
    let errors = [
        "[arena]\nsize = \"2XB\"\n",
        "[[dataset]]\nname = \"d\"\nroot = \"/data\"\nbucket = \"b\"\n",
        "[prefetch]\nwindow_batches = 16\n\ninitial_window = 40\nread_timeout_ms = 90000\n",
    ]
    .map(|t| parse_error(&whole(t)));
    for l in &lines {
        assert!(
            errors
                .iter()
                .any(|e| e.lines().any(|el| el.starts_with(l.as_str()))),
            "configuration.md shows {l:?}, which no error says:\n{}",
            errors.join("\n")
        );
    }
}

fn parse_error(text: &str) -> String {
    Config::from_toml_str(text)
        .expect_err("refused")
        .to_string()
}
