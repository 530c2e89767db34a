//! Checks of a configuration against the machine it is to run on, made by
//! `granaryd validate` and `granaryd run` ([`Config::load_for_this_machine`]).
//! [`Config::validate`] stays free of them, so that a configuration can be
//! checked (and tested) away from the machine that will run it.

use super::error::Problem;
use super::size::ByteSize;
use super::{Config, ConfigError};
use std::path::Path;

impl Config {
    /// [`Config::load`], then `Config::check_machine`.
    ///
    /// # Errors
    ///
    /// As [`Config::load`], and [`ConfigError::Invalid`] naming the file
    /// and the setting the machine cannot satisfy.
    pub fn load_for_this_machine(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let cfg = Config::load(path)?;
        cfg.check_machine().map_err(|e| e.with_file(path))?;
        Ok(cfg)
    }

    /// Checks the configuration against this machine: the arena, which the
    /// agent faults in at start-up, must not be larger than the machine's
    /// memory (`MemTotal` in `/proc/meminfo`). A machine whose memory cannot
    /// be read passes.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `arena.size`, with both sizes.
    pub(crate) fn check_machine(&self) -> Result<(), ConfigError> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        match mem_total(&meminfo) {
            Some(total) => self.check_memory(total),
            None => Ok(()),
        }
    }

    /// [`check_machine`](Self::check_machine) for a machine of `mem_total`
    /// bytes of memory.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `arena.size`.
    pub(crate) fn check_memory(&self, mem_total: u64) -> Result<(), ConfigError> {
        let size = self.arena.size.bytes();
        if size <= mem_total {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            file: None,
            problems: vec![Problem::new(
                "arena.size",
                format!(
                    "{} is more than this machine's memory ({} GiB, MemTotal in /proc/meminfo): \
                     the agent would be killed for lack of memory while faulting the arena in; \
                     give it a share of the memory, e.g. {}",
                    self.arena.size,
                    gib(mem_total),
                    ByteSize((mem_total / 2) & !((2 << 20) - 1))
                ),
            )],
        })
    }
}

/// `bytes` in GiB, to one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1u32 << 30))
}

/// The `MemTotal` line of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .and_then(|kib| kib.checked_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(size: &str) -> Config {
        Config::from_toml_str(&format!(
            "[arena]\nsize = \"{size}\"\n[[dataset]]\nname = \"d\"\nroot = \"/d\"\n"
        ))
        .unwrap()
    }

    #[test]
    fn an_arena_larger_than_the_memory_is_refused_naming_the_setting() {
        let cfg = config("64TiB");
        let e = cfg.check_memory(16 << 30).unwrap_err();
        assert_eq!(e.field(), Some("arena.size"));
        let text = e.to_string();
        assert!(
            text.contains("64 TiB") && text.contains("16.0 GiB"),
            "{text}"
        );
        assert!(text.contains("MemTotal"), "{text}");
        assert!(text.contains("8 GiB"), "a suggestion: {text}");
        assert!(config("4GiB").check_memory(4 << 30).is_ok());
        assert!(config("4GiB").check_memory((4 << 30) - 1).is_err());
    }

    #[test]
    fn mem_total_is_read_from_meminfo() {
        let text = "MemFree:  100 kB\nMemTotal:       65536 kB\nHugepagesize: 2048 kB\n";
        assert_eq!(mem_total(text), Some(64 << 20));
        assert_eq!(mem_total("MemTotal: lots\n"), None);
        assert_eq!(mem_total(""), None);
        let here = std::fs::read_to_string("/proc/meminfo").unwrap();
        assert!(mem_total(&here).is_some_and(|m| m > 0));
    }
}
