//! The TOML text behind a configuration, parsed once with the positions of
//! its keys and values (toml's spanned [`DeTable`]), so that errors and
//! validation problems name the field's full path and its line.
//!
//! A `[[dataset]]` table is a serde enum tagged by `kind`. Serde reads an
//! internally tagged enum by buffering the table first, which loses toml's
//! positions, so each dataset table is first checked on its own against the
//! struct of its kind (the errors keep their positions), and only then is
//! the whole document read through the derived `Deserialize` impls. A
//! dataset without `kind` is a filesystem dataset: `kind = "fs"` is added
//! to its table before either step.

use super::{
    AzureConfig, Config, ConfigError, CqlConfig, FsConfig, GcsConfig, S3Config, SourceKind,
};
use serde::Deserialize;
use std::borrow::Cow;
use std::ops::Range;
use toml::de::{DeTable, DeValue, ValueDeserializer};
use toml::Spanned;

/// The full paths of a document's keys (`arena.size`, `dataset[1].root`,
/// `dataset[0].hosts[2]`) with the positions of each key and value.
#[derive(Debug, Default)]
pub(super) struct Document {
    text: String,
    entries: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    path: String,
    key: Option<Range<usize>>,
    value: Range<usize>,
}

/// Parses `text` into a [`Config`] (not validated) and its [`Document`].
pub(super) fn parse(text: &str) -> Result<(Config, Document), ConfigError> {
    let (mut root, errors) = DeTable::parse_recoverable(text);
    let doc = Document::of(text, root.get_ref());
    if let Some(e) = errors.into_iter().next() {
        return Err(ConfigError::from_toml(text, Some(&doc), e));
    }
    default_dataset_kinds(root.get_mut());
    let fail = |e| ConfigError::from_toml(text, Some(&doc), e);
    check_datasets(root.get_ref()).map_err(fail)?;
    let cfg = Config::deserialize(toml::de::Deserializer::from(root)).map_err(fail)?;
    Ok((cfg, doc))
}

/// The `[[dataset]]` tables of a document, with their positions.
fn dataset_tables<'a, 'i>(
    root: &'a DeTable<'i>,
) -> impl Iterator<Item = (Range<usize>, &'a DeTable<'i>)> {
    let array = match root.get("dataset").map(Spanned::get_ref) {
        Some(DeValue::Array(a)) => &a[..],
        _ => &[],
    };
    array.iter().filter_map(|v| match v.get_ref() {
        DeValue::Table(t) => Some((v.span(), t)),
        _ => None,
    })
}

/// Adds `kind = "fs"` to every dataset table that names no kind.
fn default_dataset_kinds(root: &mut DeTable<'_>) {
    let Some(DeValue::Array(array)) = root.get_mut("dataset").map(Spanned::get_mut) else {
        return;
    };
    for v in array.iter_mut() {
        let span = v.span();
        if let DeValue::Table(t) = v.get_mut() {
            if !t.contains_key("kind") {
                t.insert(
                    Spanned::new(span.clone(), Cow::Borrowed("kind")),
                    Spanned::new(span, DeValue::String(Cow::Borrowed("fs"))),
                );
            }
        }
    }
}

/// Reads each dataset table as the struct of its `kind`, for errors that
/// keep their positions (see the module documentation).
fn check_datasets(root: &DeTable<'_>) -> Result<(), toml::de::Error> {
    for (span, table) in dataset_tables(root) {
        let Some(kind) = table.get("kind") else {
            continue;
        };
        let kind = SourceKind::deserialize(ValueDeserializer::from(kind.clone()))?;
        let mut rest = table.clone();
        rest.remove("kind");
        let de = ValueDeserializer::from(Spanned::new(span, DeValue::Table(rest)));
        match kind {
            SourceKind::Fs => FsConfig::deserialize(de).map(drop)?,
            SourceKind::S3 => S3Config::deserialize(de).map(drop)?,
            SourceKind::Cql => CqlConfig::deserialize(de).map(drop)?,
            SourceKind::Gcs => GcsConfig::deserialize(de).map(drop)?,
            SourceKind::Azure => AzureConfig::deserialize(de).map(drop)?,
        }
    }
    Ok(())
}

impl Document {
    fn of(text: &str, root: &DeTable<'_>) -> Document {
        let mut doc = Document {
            text: text.to_owned(),
            entries: Vec::new(),
        };
        doc.walk_table(root, "");
        doc
    }

    fn walk_table(&mut self, table: &DeTable<'_>, prefix: &str) {
        for (k, v) in table.iter() {
            let path = if prefix.is_empty() {
                k.get_ref().to_string()
            } else {
                format!("{prefix}.{}", k.get_ref())
            };
            self.entries.push(Entry {
                path: path.clone(),
                key: Some(k.span()),
                value: v.span(),
            });
            self.walk_value(v.get_ref(), &path);
        }
    }

    fn walk_value(&mut self, v: &DeValue<'_>, path: &str) {
        match v {
            DeValue::Table(t) => self.walk_table(t, path),
            DeValue::Array(a) => {
                for (i, e) in a.iter().enumerate() {
                    let path = format!("{path}[{i}]");
                    self.entries.push(Entry {
                        path: path.clone(),
                        key: None,
                        value: e.span(),
                    });
                    self.walk_value(e.get_ref(), &path);
                }
            }
            _ => {}
        }
    }

    /// The full path of the key or value that most closely encloses byte
    /// `pos` of the text.
    pub(super) fn path_at(&self, pos: usize) -> Option<&str> {
        let holds = |r: &Range<usize>| r.contains(&pos) || (r.is_empty() && r.start == pos);
        let mut best: Option<(usize, &str)> = None;
        for e in &self.entries {
            for r in e.key.iter().chain([&e.value]) {
                if holds(r) && best.is_none_or(|(len, _)| r.len() <= len) {
                    best = Some((r.len(), &e.path));
                }
            }
        }
        best.map(|(_, p)| p)
    }

    /// Every key path of the document, in document order (array elements
    /// as `name[i]`).
    #[cfg(test)]
    pub(super) fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.path.as_str())
    }

    /// The 1-based line of the field at `path`, or of its nearest enclosing
    /// table when the field is not written (a missing required key).
    pub(super) fn line_of(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some(e) = self.entries.iter().find(|e| e.path == p) {
                let at = e.key.as_ref().unwrap_or(&e.value).start;
                return Some(line_col(&self.text, at).0);
            }
            p = &p[..p.rfind(['.', '['])?];
        }
    }
}

/// 1-based line and column (in characters) of byte `offset` in `s`.
pub(super) fn line_col(s: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(s.len());
    while !s.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &s[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}
