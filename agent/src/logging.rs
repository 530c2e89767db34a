//! The agent's log: `tracing` events written to standard error as text
//! (the default) or as one JSON object per line.
//!
//! The format comes from `granaryd --log-format`, else `$GRANARY_LOG_FORMAT`
//! (`text` or `json`). Which events are written comes from `$RUST_LOG`
//! (`tracing-subscriber`'s `EnvFilter` syntax: `info`, `granary_agent=debug`,
//! ...), `info` when it is not set. Under systemd the journal adds its own
//! timestamps; the text format keeps one anyway so a log file reads alone.

use std::fmt;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines: time, level, target, message, fields.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

/// The environment variable read when no format is given on the command line.
pub const FORMAT_ENV: &str = "GRANARY_LOG_FORMAT";

/// A format name that is neither `text` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFormat(pub String);

impl fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown log format {:?}: expected text or json", self.0)
    }
}

impl std::error::Error for UnknownFormat {}

impl FromStr for LogFormat {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<LogFormat, UnknownFormat> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(UnknownFormat(s.to_owned())),
        }
    }
}

impl LogFormat {
    /// `given`, else `$GRANARY_LOG_FORMAT`, else text.
    pub fn resolve(given: Option<LogFormat>) -> Result<LogFormat, UnknownFormat> {
        match given {
            Some(f) => Ok(f),
            None => match std::env::var(FORMAT_ENV) {
                Ok(v) if !v.trim().is_empty() => v.parse(),
                _ => Ok(LogFormat::Text),
            },
        }
    }
}

/// Installs the global subscriber. A second call (tests) changes nothing.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_bad_names_are_named() {
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert_eq!(" JSON ".parse(), Ok(LogFormat::Json));
        let e = "yaml".parse::<LogFormat>().unwrap_err();
        assert!(e.to_string().contains("\"yaml\""), "{e}");
        assert_eq!(
            LogFormat::resolve(Some(LogFormat::Json)),
            Ok(LogFormat::Json)
        );
    }
}
