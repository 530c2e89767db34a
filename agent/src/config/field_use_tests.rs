//! Every configuration field is read by the agent outside this module, or
//! is listed in [`PENDING`]. The check scans the sources of `agent/src`
//! (outside `config/`): a field counts as read where
//!
//! * it is reached through [`Config`](super::Config) by its section, as in
//!   `cfg.prefetch.window_batches`;
//! * or a file that names its struct (`SocketConfig`, `DatasetConfig::S3`,
//!   …) reads `.field` (not a method call);
//! * or it is read inside `config/` by one of the accessors of [`VIA`], and
//!   those accessors are all called outside `config/`.

use super::tests::every_key;
use std::path::Path;

/// Settings documented and validated whose behaviour is not built yet. The
/// test fails when one of them becomes read (remove it from here) as it
/// does when any other field is read by nothing.
const PENDING: &[&str] = &[];

/// For each section, the type names whose presence in a file makes its
/// `.field` reads count.
const TYPES: &[(&str, &[&str])] = &[
    ("arena", &["ArenaConfig"]),
    ("socket", &["SocketConfig"]),
    ("prefetch", &["PrefetchConfig"]),
    ("cache", &["CacheConfig"]),
    ("sessions", &["SessionsConfig"]),
    ("metrics", &["MetricsConfig"]),
    ("peers", &["PeersConfig"]),
    ("dataset.fs", &["FsConfig", "DatasetConfig::Fs"]),
    ("dataset.s3", &["S3Config", "DatasetConfig::S3"]),
    ("dataset.cql", &["CqlConfig", "DatasetConfig::Cql"]),
    ("dataset.gcs", &["GcsConfig", "DatasetConfig::Gcs"]),
    ("dataset.azure", &["AzureConfig", "DatasetConfig::Azure"]),
    ("dataset.retry", &["RetryOverride"]),
    ("dataset.prepare", &["PrepareConfig"]),
    ("mixture", &["MixtureConfig"]),
    ("mixture.source", &["MixtureSource"]),
];

/// Fields read through accessors of `config/`: (key pattern — `*` for any
/// dataset kind —, the accessor whose body reads the field, the accessors
/// that must be called outside `config/`, `a|b` meaning either).
const VIA: &[(&str, &str, &[&str])] = &[
    ("dataset.*.name", "name", &["name"]),
    ("dataset.*.order", "order", &["order"]),
    ("dataset.*.retry", "retry", &["retry_for"]),
    ("dataset.*.prepare", "prepare", &["prepare"]),
    ("dataset.fs.root", "location", &["location"]),
    ("dataset.fs.format", "shards", &["shards"]),
    ("dataset.fs.label_field", "shards", &["shards"]),
    ("dataset.s3.format", "shards", &["shards"]),
    ("dataset.s3.label_field", "shards", &["shards"]),
    ("dataset.fs.sample_field", "shards", &["shards"]),
    ("dataset.s3.sample_field", "shards", &["shards"]),
    ("dataset.fs.wids_index", "shards", &["shards"]),
    ("dataset.s3.wids_index", "shards", &["shards"]),
    ("dataset.fs.manifest", "location", &["location"]),
    ("socket.allowed_uids", "allows", &["allows"]),
    ("socket.allowed_gids", "allows", &["allows"]),
    ("metrics.address", "socket_addr", &["socket_addr"]),
    (
        "cache.shard_index_dir",
        "shard_index_dir",
        &["shard_index_dir"],
    ),
    (
        "prefetch.read_retries",
        "retry_settings",
        &["retry_for|retry_settings", "decide"],
    ),
    (
        "prefetch.retry_backoff_ms",
        "retry_settings",
        &["retry_for|retry_settings", "delay"],
    ),
    (
        "prefetch.retry_backoff_max_ms",
        "retry_settings",
        &["retry_for|retry_settings", "delay"],
    ),
    (
        "prefetch.sample_deadline_ms",
        "retry_settings",
        &["retry_for|retry_settings", "decide"],
    ),
    (
        "dataset.retry.read_retries",
        "retry_settings",
        &["retry_for", "decide"],
    ),
    (
        "dataset.retry.retry_backoff_ms",
        "retry_settings",
        &["retry_for", "delay"],
    ),
    (
        "dataset.retry.retry_backoff_max_ms",
        "retry_settings",
        &["retry_for", "delay"],
    ),
    (
        "dataset.retry.sample_deadline_ms",
        "retry_settings",
        &["retry_for", "decide"],
    ),
];

/// The `.rs` files under `dir`, recursively, with `//` comments removed.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let code: Vec<&str> = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default())
                .collect();
            out.push((path.display().to_string(), code.join("\n")));
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `code` holds `needle` (not preceded by an identifier character
/// when it starts with one) followed by a character that passes `after`.
fn has(code: &str, needle: &str, after: impl Fn(Option<char>) -> bool) -> bool {
    let starts_ident = needle.starts_with(is_ident);
    code.match_indices(needle).any(|(i, _)| {
        (!starts_ident || !code[..i].ends_with(is_ident))
            && after(code[i + needle.len()..].chars().next())
    })
}

/// A field access (not followed by more identifier or a call).
fn reads_field(code: &str, access: &str) -> bool {
    has(code, access, |c| {
        !c.is_some_and(|c| is_ident(c) || c == '(')
    })
}

/// A call of the method or function `name` (not its definition).
fn calls(code: &str, name: &str) -> bool {
    let needle = format!("{name}(");
    code.match_indices(&needle).any(|(i, _)| {
        let before = &code[..i];
        !before.ends_with(is_ident) && !before.ends_with("fn ")
    })
}

/// The body of `fn name(` in `code`: from the signature to the first line
/// that closes it at the signature's indentation.
fn body_of<'a>(code: &'a str, name: &str) -> Option<&'a str> {
    let start = code.find(&format!("fn {name}("))?;
    let line_start = code[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = &code[line_start..start];
    let indent = &indent[..indent.len() - indent.trim_start().len()];
    let close = format!("\n{indent}}}");
    let end = code[start..].find(&close)? + start;
    Some(&code[start..end])
}

#[test]
fn every_field_is_read_outside_the_config_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let config_dir = src.join("config").display().to_string();
    let (inside, outside): (Vec<_>, Vec<_>) =
        files.iter().partition(|(p, _)| p.starts_with(&config_dir));
    assert!(outside.len() > 20 && inside.len() > 8, "sources not found");
    let called_outside = |names: &str| {
        names
            .split('|')
            .any(|n| outside.iter().any(|(_, code)| calls(code, n)))
    };

    let mut unread = Vec::new();
    for key in every_key() {
        let (section, field) = key.rsplit_once('.').unwrap();
        let types = TYPES
            .iter()
            .find(|(s, _)| *s == section)
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("no types listed for section {section}"));
        let qualified = format!("{section}.{field}");
        let direct = outside.iter().any(|(_, code)| {
            reads_field(code, &qualified)
                || (types.iter().any(|t| code.contains(t))
                    && reads_field(code, &format!(".{field}")))
        });
        let via = VIA.iter().any(|(pattern, accessor, callers)| {
            let matches = match pattern.strip_prefix("dataset.*.") {
                Some(f) => {
                    section.starts_with("dataset.")
                        && section != "dataset.retry"
                        && section != "dataset.prepare"
                        && f == field
                }
                None => *pattern == key,
            };
            matches
                && inside.iter().any(|(_, code)| {
                    body_of(code, accessor).is_some_and(|b| reads_field(b, &format!(".{field}")))
                })
                && callers.iter().all(|c| called_outside(c))
        });
        if !direct && !via {
            unread.push(key);
        }
    }
    let newly_read: Vec<_> = PENDING
        .iter()
        .filter(|p| !unread.iter().any(|u| u == *p))
        .collect();
    assert!(
        newly_read.is_empty(),
        "now read, so remove from PENDING: {newly_read:?}"
    );
    let not_pending: Vec<_> = unread
        .iter()
        .filter(|u| !PENDING.contains(&u.as_str()))
        .collect();
    assert!(
        not_pending.is_empty(),
        "configuration fields read by nothing outside config/: {not_pending:?}"
    );
}

#[test]
fn the_scanner_tells_reads_from_look_alikes() {
    assert!(reads_field(
        "let x = cfg.prefetch.window_batches;",
        "prefetch.window_batches"
    ));
    assert!(!reads_field(
        "cfg.prefetch.window_batches_max",
        "prefetch.window_batches"
    ));
    assert!(!reads_field("d.name()", ".name"));
    assert!(reads_field("d.name.clone()", ".name"));
    assert!(calls("x.retry_for(&d)", "retry_for"));
    assert!(!calls("pub fn retry_for(&self) {}", "retry_for"));
    let code = "impl A {\n    fn a(&self) -> u32 {\n        self.x\n    }\n    fn b(&self) -> u32 {\n        self.y\n    }\n}\n";
    assert_eq!(body_of(code, "a").map(|b| b.contains("self.x")), Some(true));
    assert_eq!(
        body_of(code, "a").map(|b| b.contains("self.y")),
        Some(false)
    );
}
