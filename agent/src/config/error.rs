//! Why a configuration could not be loaded: [`ConfigError`], and the
//! [`Problem`]s that validation reports.

use super::document::{line_col, Document};
use std::fmt;
use std::path::{Path, PathBuf};

/// One problem found by `Config::validate`: the
/// field's full path, its line when known, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Full path of the offending field, e.g. `prefetch.window_batches` or
    /// `dataset[1].name`.
    pub field: String,
    /// 1-based line of the field in the TOML text (of its table when the
    /// field is not written), when the configuration came from text.
    pub line: Option<usize>,
    /// What is wrong with it.
    pub(crate) reason: String,
}

impl Problem {
    pub(crate) fn new(field: &str, reason: String) -> Problem {
        Problem {
            field: field.to_owned(),
            line: None,
            reason,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.field)?;
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug)]
pub enum ConfigError {
    /// The file could not be read.
    Io {
        /// The configuration file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The TOML did not parse or did not match the schema (unknown field,
    /// wrong type, bad value).
    Parse {
        /// The configuration file, when loaded from one.
        file: Option<PathBuf>,
        /// Full path of the field the error points at, when it can be told
        /// from the document (`arena.size`, `dataset[0]`).
        field: Option<String>,
        /// 1-based line of the error, when known.
        line: Option<usize>,
        /// 1-based column of the error, when known.
        column: Option<usize>,
        /// The parser's message, with its line, column and an excerpt.
        message: String,
    },
    /// The configuration parsed but breaks one or more rules.
    Invalid {
        /// The configuration file, when loaded from one.
        file: Option<PathBuf>,
        /// Every problem found (at least one).
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// The problems of an [`ConfigError::Invalid`] error, or an empty slice.
    #[cfg(test)]
    pub(crate) fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }

    /// The full path of the offending field, when the error names one (the
    /// first problem's for [`ConfigError::Invalid`]).
    #[cfg(test)]
    pub(crate) fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Io { .. } => None,
            ConfigError::Parse { field, .. } => field.as_deref(),
            ConfigError::Invalid { problems, .. } => problems.first().map(|p| p.field.as_str()),
        }
    }

    /// An error of the TOML parser or of deserialization, with the path of
    /// the field it points at when `doc` can tell.
    pub(super) fn from_toml(text: &str, doc: Option<&Document>, mut e: toml::de::Error) -> Self {
        e.set_input(Some(text));
        let span = e.span();
        let (line, column) = span.as_ref().map(|r| line_col(text, r.start)).unzip();
        let mut field = span.and_then(|r| doc?.path_at(r.start)).map(str::to_owned);
        // A missing key has no position of its own: the error points at
        // its table, and the message names the key.
        if let Some(key) = e
            .message()
            .strip_prefix("missing field `")
            .and_then(|m| m.split('`').next())
        {
            field = Some(match field {
                Some(table) => format!("{table}.{key}"),
                None => key.to_owned(),
            });
        }
        ConfigError::Parse {
            file: None,
            field,
            line,
            column,
            message: e.to_string(),
        }
    }

    /// Gives every validation problem its line in `text`.
    pub(super) fn with_lines(mut self, doc: &Document) -> Self {
        if let ConfigError::Invalid { problems, .. } = &mut self {
            for p in problems {
                p.line = doc.line_of(&p.field);
            }
        }
        self
    }

    pub(crate) fn with_file(mut self, path: &Path) -> Self {
        match &mut self {
            ConfigError::Io { .. } => {}
            ConfigError::Parse { file, .. } | ConfigError::Invalid { file, .. } => {
                *file = Some(path.to_path_buf())
            }
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io { path, source } => {
                write!(f, "cannot read configuration {}: {source}", path.display())
            }
            ConfigError::Parse {
                file,
                field,
                message,
                ..
            } => {
                if let Some(file) = file {
                    write!(f, "{}: ", file.display())?;
                }
                if let Some(field) = field {
                    write!(f, "in `{field}`: ")?;
                }
                write!(f, "{}", message.trim_end())
            }
            ConfigError::Invalid { file, problems } => {
                if let Some(file) = file {
                    write!(f, "{}: ", file.display())?;
                }
                match problems.as_slice() {
                    [one] => write!(f, "invalid configuration: {one}"),
                    many => {
                        write!(f, "invalid configuration ({} problems):", many.len())?;
                        for p in many {
                            write!(f, "\n  {p}")?;
                        }
                        Ok(())
                    }
                }
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
