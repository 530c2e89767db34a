//! Checks of a configuration against the machine it is to run on, made by
//! `granaryd validate` and `granaryd run` (through `startup::load_for_this_machine`).
//! [`Config::validate`] stays free of them, so that a configuration can be
//! checked (and tested) away from the machine that will run it.

use super::error::Problem;
use super::size::ByteSize;
use super::{Config, ConfigError, HugePages};
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
    /// memory (`MemTotal` in `/proc/meminfo`), and with `arena.hugepages =
    /// "required"` not larger than what the hugepage pool can give
    /// ([`HugePool`]). What cannot be read passes.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `arena.size`, with the sizes.
    pub(crate) fn check_machine(&self) -> Result<(), ConfigError> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        if let Some(total) = mem_total(&meminfo) {
            self.check_memory(total)?;
        }
        if self.arena.hugepages == HugePages::Required {
            if let Some(mut pool) = HugePool::from_meminfo(&meminfo) {
                pool.overcommit_left = overcommit_left(pool.page_size);
                self.check_hugepages(&pool)?;
            }
        }
        self.check_secret_file()
    }

    /// With peers on and `peers.secret_file` set, reads the file and checks
    /// the secret as the agent does at start-up: readable, not empty, and
    /// strong enough (`config::peer_secret`).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `peers.secret_file`.
    pub(crate) fn check_secret_file(&self) -> Result<(), ConfigError> {
        use crate::peers::MembershipError;
        let Some(path) = self
            .peers
            .secret_file
            .as_ref()
            .filter(|_| self.peers.enabled())
        else {
            return Ok(());
        };
        let reason = match crate::peers::load_secret(&self.peers) {
            Ok(_) => return Ok(()),
            Err(MembershipError::SecretFile(_, e)) => {
                format!("cannot read {}: {e}", path.display())
            }
            Err(MembershipError::WeakSecret { weak, .. }) => {
                format!("{}: the secret {weak}", path.display())
            }
            Err(MembershipError::NoSecret) => format!("{} holds no secret", path.display()),
            Err(e) => e.to_string(),
        };
        Err(ConfigError::Invalid {
            file: None,
            problems: vec![Problem::new("peers.secret_file", reason)],
        })
    }

    /// With `arena.hugepages = "required"`, checks that the arena (rounded
    /// up to whole hugepages) fits in what `pool` can give. Other settings
    /// of `arena.hugepages` pass.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `arena.size`, with the arena's pages
    /// and the pool's numbers.
    pub(crate) fn check_hugepages(&self, pool: &HugePool) -> Result<(), ConfigError> {
        if self.arena.hugepages != HugePages::Required || pool.page_size == 0 {
            return Ok(());
        }
        let size = self.arena.size.bytes();
        let pages = size.div_ceil(pool.page_size);
        let available = pool.available();
        if pages <= available {
            return Ok(());
        }
        let overcommit = if pool.overcommit_left > 0 {
            format!(
                " plus {} the kernel may add (nr_overcommit_hugepages)",
                pool.overcommit_left
            )
        } else {
            String::new()
        };
        Err(ConfigError::Invalid {
            file: None,
            problems: vec![Problem::new(
                "arena.size",
                format!(
                    "{} needs {pages} hugepages of {} KiB with arena.hugepages = \"required\", \
                     but the pool can give {available} ({} GiB: HugePages_Free {} less \
                     HugePages_Rsvd {} in /proc/meminfo{overcommit}); reserve {} more as root \
                     (e.g. `sysctl vm.nr_hugepages={}`), shrink arena.size, or set \
                     arena.hugepages = \"try\"",
                    self.arena.size,
                    pool.page_size / 1024,
                    gib(available.saturating_mul(pool.page_size)),
                    pool.free,
                    pool.reserved,
                    pages - available,
                    pool.total.saturating_add(pages - available),
                ),
            )],
        })
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

/// The default-size hugepage pool, the one `MFD_HUGETLB` draws from, as
/// `/proc/meminfo` and `/sys/kernel/mm/hugepages` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct HugePool {
    /// `Hugepagesize`, in bytes.
    pub page_size: u64,
    /// `HugePages_Total`.
    pub total: u64,
    /// `HugePages_Free`: pages not faulted in by anyone.
    pub free: u64,
    /// `HugePages_Rsvd`: free pages already promised to a mapping.
    pub reserved: u64,
    /// Surplus pages the kernel may still add on demand
    /// (`nr_overcommit_hugepages` less `surplus_hugepages`).
    pub overcommit_left: u64,
}

impl HugePool {
    /// The pool as a `/proc/meminfo` text gives it (no overcommit); `None`
    /// without a `Hugepagesize` line (a kernel without hugetlbfs).
    pub(crate) fn from_meminfo(meminfo: &str) -> Option<HugePool> {
        Some(HugePool {
            page_size: meminfo_kib(meminfo, "Hugepagesize:")?.checked_mul(1024)?,
            total: meminfo_count(meminfo, "HugePages_Total:").unwrap_or(0),
            free: meminfo_count(meminfo, "HugePages_Free:").unwrap_or(0),
            reserved: meminfo_count(meminfo, "HugePages_Rsvd:").unwrap_or(0),
            overcommit_left: 0,
        })
    }

    /// Pages a new mapping can have.
    pub(crate) fn available(&self) -> u64 {
        self.free
            .saturating_sub(self.reserved)
            .saturating_add(self.overcommit_left)
    }
}

/// Surplus hugepages of `page_size` bytes the kernel may still add, from
/// `/sys/kernel/mm/hugepages`; 0 when unreadable.
fn overcommit_left(page_size: u64) -> u64 {
    let dir = format!("/sys/kernel/mm/hugepages/hugepages-{}kB", page_size / 1024);
    let read = |name: &str| {
        std::fs::read_to_string(format!("{dir}/{name}"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    match (read("nr_overcommit_hugepages"), read("surplus_hugepages")) {
        (Some(limit), Some(surplus)) => limit.saturating_sub(surplus),
        _ => 0,
    }
}

/// A `KEY: N` count line of a `/proc/meminfo` text.
fn meminfo_count(meminfo: &str, key: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim().parse::<u64>().ok())
}

/// A `KEY: N kB` line of a `/proc/meminfo` text, in KiB.
fn meminfo_kib(meminfo: &str, key: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
}

/// `bytes` in GiB, to one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1u32 << 30))
}

/// The `MemTotal` line of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo_kib(meminfo, "MemTotal:").and_then(|kib| kib.checked_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(size: &str) -> Config {
        config_with(size, "try")
    }

    fn config_with(size: &str, hugepages: &str) -> Config {
        Config::from_toml_str(&format!(
            "[arena]\nsize = \"{size}\"\nhugepages = \"{hugepages}\"\n\
             [[dataset]]\nname = \"d\"\nroot = \"/d\"\n"
        ))
        .unwrap()
    }

    const MEMINFO: &str = "MemTotal:       65536000 kB\n\
        HugePages_Total:     512\n\
        HugePages_Free:      300\n\
        HugePages_Rsvd:       44\n\
        HugePages_Surp:        0\n\
        Hugepagesize:       2048 kB\n\
        Hugetlb:         1048576 kB\n";

    #[test]
    fn the_hugepage_pool_is_read_from_meminfo() {
        let pool = HugePool::from_meminfo(MEMINFO).unwrap();
        assert_eq!(
            pool,
            HugePool {
                page_size: 2 << 20,
                total: 512,
                free: 300,
                reserved: 44,
                overcommit_left: 0,
            }
        );
        assert_eq!(pool.available(), 256);
        assert_eq!(HugePool::from_meminfo("MemTotal: 1 kB\n"), None);
        let here = std::fs::read_to_string("/proc/meminfo").unwrap();
        if let Some(p) = HugePool::from_meminfo(&here) {
            assert!(p.page_size >= 4096 && p.free <= p.total, "{p:?}");
        }
    }

    #[test]
    fn a_required_hugepage_arena_larger_than_the_pool_is_refused_with_the_numbers() {
        let pool = HugePool::from_meminfo(MEMINFO).unwrap();
        let required =
            |size: &str, pool: &HugePool| config_with(size, "required").check_hugepages(pool);
        // 256 pages of 2 MiB = 512 MiB available.
        assert!(required("512MiB", &pool).is_ok());
        let e = required("514MiB", &pool).unwrap_err();
        assert_eq!(e.field(), Some("arena.size"));
        let text = e.to_string();
        for want in [
            "257 hugepages of 2048 KiB",
            "can give 256",
            "0.5 GiB",
            "HugePages_Free 300",
            "HugePages_Rsvd 44",
            "reserve 1 more",
            "vm.nr_hugepages=513",
            "arena.hugepages",
        ] {
            assert!(text.contains(want), "{want:?} in {text}");
        }
        // Only "required" is checked; overcommit counts as available.
        assert!(config_with("4GiB", "try").check_hugepages(&pool).is_ok());
        assert!(config_with("4GiB", "off").check_hugepages(&pool).is_ok());
        let grown = HugePool {
            overcommit_left: 2048,
            ..pool
        };
        assert!(required("4GiB", &grown).is_ok());
        let e = required("8GiB", &grown).unwrap_err();
        assert!(e.to_string().contains("nr_overcommit_hugepages"), "{e}");
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

    #[test]
    fn the_secret_file_is_read_and_judged_like_at_start_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.secret");
        let cfg = Config::from_toml_str(&format!(
            "[peers]\nmembership = \"session\"\nsecret_file = \"{}\"\n\
             [[dataset]]\nname = \"d\"\nroot = \"/d\"\n",
            path.display()
        ))
        .unwrap();
        let reason = |c: &Config| {
            let e = c.check_secret_file().unwrap_err();
            assert_eq!(e.field(), Some("peers.secret_file"));
            e.to_string()
        };
        assert!(reason(&cfg).contains("cannot read"), "{}", reason(&cfg));
        std::fs::write(&path, "password\n").unwrap();
        let r = reason(&cfg);
        assert!(
            r.contains("too weak") && r.contains("granary secret new PATH"),
            "{r}"
        );
        assert!(!r.contains("password\n"), "{r}");
        std::fs::write(&path, "\n\n").unwrap();
        assert!(reason(&cfg).contains("holds no secret"), "{}", reason(&cfg));
        let good = crate::config::peer_secret::generate().unwrap();
        std::fs::write(&path, format!("{good}\n")).unwrap();
        cfg.check_secret_file().unwrap();
        // Peers off: the file is not looked at.
        let off = Config::from_toml_str(&format!(
            "[peers]\nsecret_file = \"{}\"\n[[dataset]]\nname = \"d\"\nroot = \"/d\"\n",
            dir.path().join("absent").display()
        ))
        .unwrap();
        off.check_secret_file().unwrap();
    }
}
