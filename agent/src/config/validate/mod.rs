//! The rules single settings and relations between settings must obey,
//! checked once the TOML has been read. Every problem is reported, each
//! naming its field.

use super::arena::{ARENA_BYTES_PER_INFLIGHT_READ, ARENA_GRANULE, MIN_ARENA_BYTES};
use super::prefetch::{MAX_INFLIGHT_READS, MAX_READ_RETRIES};
use super::sessions::MAX_RING_CAPACITY;
use super::socket::MAX_SOCKET_PATH_BYTES;
use super::{ByteSize, Config, ConfigError, DatasetConfig, Problem, RetrySettings};
use std::net::SocketAddr;

mod datasets;
mod peers;

/// Collects problems.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn bad(&mut self, field: &str, reason: impl Into<String>) {
        self.0.push(Problem::new(field, reason.into()));
    }
}

impl Config {
    /// Checks the rules that single fields and relations between fields must
    /// obey; reports every problem found, each naming its field.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::default();
        self.validate_arena(&mut p);
        self.validate_socket(&mut p);
        self.validate_prefetch(&mut p);
        self.validate_sessions(&mut p);
        self.validate_peers(&mut p);
        let addr = &self.metrics.address;
        if !addr.is_empty() && addr.parse::<SocketAddr>().is_err() {
            p.bad(
                "metrics.address",
                format!("{addr:?} is not IP:PORT (e.g. \"127.0.0.1:9464\"); use \"\" to disable metrics"),
            );
        }
        if let Some(dir) = &self.cache.shard_index_dir {
            if !dir.as_os_str().is_empty() && !dir.is_absolute() {
                p.bad(
                    "cache.shard_index_dir",
                    format!(
                        "{:?} is not an absolute path (use \"\" to keep no shard index)",
                        dir.display().to_string()
                    ),
                );
            }
        }
        self.validate_datasets(&mut p);
        let names: Vec<&str> = self.datasets.iter().map(DatasetConfig::name).collect();
        for (field, why) in super::mixture::problems(&self.mixtures, &names) {
            p.bad(&field, why);
        }
        if p.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                file: None,
                problems: p.0,
            })
        }
    }

    fn validate_arena(&self, p: &mut Problems) {
        let size = self.arena.size.bytes();
        if size < MIN_ARENA_BYTES {
            p.bad(
                "arena.size",
                format!("{} is below the minimum of 64 MiB", self.arena.size),
            );
        }
        if !size.is_multiple_of(ARENA_GRANULE) {
            let up = size.div_ceil(ARENA_GRANULE).saturating_mul(ARENA_GRANULE);
            p.bad(
                "arena.size",
                format!(
                    "{size} bytes is not a multiple of 2 MiB (the huge page size); use {up} ({})",
                    ByteSize(up)
                ),
            );
        }
        let need = u64::from(self.prefetch.max_inflight_reads) * ARENA_BYTES_PER_INFLIGHT_READ;
        if size >= MIN_ARENA_BYTES && size < need {
            p.bad(
                "arena.size",
                format!(
                    "{} cannot hold the prefetch window: prefetch.max_inflight_reads = {} needs at least {} \
                     (1 MiB per in-flight read)",
                    self.arena.size,
                    self.prefetch.max_inflight_reads,
                    ByteSize(need)
                ),
            );
        }
    }

    fn validate_socket(&self, p: &mut Problems) {
        let sock = self.socket.path.as_os_str();
        if sock.is_empty() {
            p.bad("socket.path", "must not be empty");
        } else if sock.len() > MAX_SOCKET_PATH_BYTES {
            p.bad(
                "socket.path",
                format!(
                    "{} is {} bytes long; a Unix socket path holds at most {MAX_SOCKET_PATH_BYTES}",
                    self.socket.path.display(),
                    sock.len()
                ),
            );
        }
        let mode = self.socket.mode.bits();
        if mode & 0o600 != 0o600 {
            p.bad(
                "socket.mode",
                format!(
                    "{} does not give the owner read and write permission (0600)",
                    self.socket.mode
                ),
            );
        }
        if !self.socket.allowed_gids.is_empty() && mode & 0o060 != 0o060 {
            p.bad(
                "socket.mode",
                format!(
                    "{} does not give the group read and write permission (0060), \
                     so the members of socket.allowed_gids could not connect",
                    self.socket.mode
                ),
            );
        }
    }

    fn validate_prefetch(&self, p: &mut Problems) {
        let pf = &self.prefetch;
        if pf.window_batches == 0 {
            p.bad("prefetch.window_batches", "must be at least 1");
        }
        if pf.max_inflight_reads == 0 || pf.max_inflight_reads > MAX_INFLIGHT_READS {
            p.bad(
                "prefetch.max_inflight_reads",
                format!(
                    "{} is outside 1..={MAX_INFLIGHT_READS}",
                    pf.max_inflight_reads
                ),
            );
        }
        if pf.initial_window == 0 {
            p.bad("prefetch.initial_window", "must be at least 1");
        } else if pf.initial_window > pf.window_batches {
            p.bad(
                "prefetch.initial_window",
                format!(
                    "{} exceeds prefetch.window_batches = {}",
                    pf.initial_window, pf.window_batches
                ),
            );
        }
        if pf.read_timeout_ms == 0 {
            p.bad("prefetch.read_timeout_ms", "must be at least 1");
        } else if pf.read_timeout_ms >= self.sessions.client_timeout_ms {
            p.bad(
                "prefetch.read_timeout_ms",
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms, or a loader waiting on \
                     a slow read would be taken for dead before the read fails",
                    pf.read_timeout_ms, self.sessions.client_timeout_ms
                ),
            );
        }
        let retry = pf.retry_settings(&Default::default());
        self.validate_retry(&retry, "prefetch.", p);
    }

    /// The rules of retry settings, in `[prefetch]` (`prefix` =
    /// `"prefetch."`) or a dataset's `[dataset.retry]`.
    fn validate_retry(&self, r: &RetrySettings, prefix: &str, p: &mut Problems) {
        let field = |k: &str| format!("{prefix}{k}");
        let ms = |d: std::time::Duration| d.as_millis();
        if r.retries > MAX_READ_RETRIES {
            p.bad(
                &field("read_retries"),
                format!("{} is above the maximum of {MAX_READ_RETRIES}", r.retries),
            );
        }
        if r.backoff.is_zero() {
            p.bad(&field("retry_backoff_ms"), "must be at least 1");
        } else if r.backoff_max < r.backoff {
            p.bad(
                &field("retry_backoff_max_ms"),
                format!(
                    "{} ms is below retry_backoff_ms = {} ms",
                    ms(r.backoff_max),
                    ms(r.backoff)
                ),
            );
        }
        let read_timeout = u128::from(self.prefetch.read_timeout_ms);
        if ms(r.deadline) < read_timeout {
            p.bad(
                &field("sample_deadline_ms"),
                format!(
                    "{} ms is below prefetch.read_timeout_ms = {read_timeout} ms: a sample must \
                     have time for at least one whole read",
                    ms(r.deadline)
                ),
            );
        } else if ms(r.deadline) >= u128::from(self.sessions.client_timeout_ms) {
            p.bad(
                &field("sample_deadline_ms"),
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms, or a loader waiting \
                     on a failing sample would be taken for dead before the sample fails",
                    ms(r.deadline),
                    self.sessions.client_timeout_ms
                ),
            );
        }
    }

    fn validate_sessions(&self, p: &mut Problems) {
        let ss = &self.sessions;
        if ss.max_sessions == 0 {
            p.bad("sessions.max_sessions", "must be at least 1");
        }
        if ss.max_sessions_per_uid == Some(0) {
            p.bad("sessions.max_sessions_per_uid", "must be at least 1");
        }
        if !(1..=100).contains(&ss.max_pinned_percent) {
            p.bad(
                "sessions.max_pinned_percent",
                format!("is {}, must be 1 to 100", ss.max_pinned_percent),
            );
        }
        for (field, cap) in [
            ("sessions.ready_ring_capacity", ss.ready_ring_capacity),
            ("sessions.release_ring_capacity", ss.release_ring_capacity),
        ] {
            if !cap.is_power_of_two() || !(2..=MAX_RING_CAPACITY).contains(&cap) {
                p.bad(
                    field,
                    format!("{cap} is not a power of two in 2..={MAX_RING_CAPACITY}"),
                );
            }
        }
        if ss.client_timeout_ms == 0 {
            p.bad("sessions.client_timeout_ms", "must be at least 1");
        }
        if ss.heartbeat_ms == 0 {
            p.bad("sessions.heartbeat_ms", "must be at least 1");
        } else if ss.heartbeat_ms >= ss.client_timeout_ms {
            p.bad(
                "sessions.heartbeat_ms",
                format!(
                    "{} ms must be below sessions.client_timeout_ms = {} ms",
                    ss.heartbeat_ms, ss.client_timeout_ms
                ),
            );
        }
    }
}
