//! `[prefetch]`: how far ahead and how hard the fetcher reads, and how a
//! failed read is retried ([`RetrySettings`], overridable per dataset by a
//! `[dataset.retry]` table).

use serde::Deserialize;
use std::time::Duration;

/// Largest `prefetch.max_inflight_reads` (the io_uring submission queue limit).
pub(crate) const MAX_INFLIGHT_READS: u32 = 32_768;
/// Largest `prefetch.read_retries`.
pub(crate) const MAX_READ_RETRIES: u32 = 100;

/// `[prefetch]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefetchConfig {
    /// `prefetch.window_batches`: per session, how many batches ahead of the
    /// loader the fetcher reads once the window is fully open. Default 16.
    pub window_batches: u32,
    /// `prefetch.max_inflight_reads`: reads in flight per dataset, across
    /// all its sessions: a filesystem dataset's io_uring queue depth; a
    /// remote dataset's `max_inflight` overrides it. Default 256, at most
    /// 32768.
    pub max_inflight_reads: u32,
    /// `prefetch.initial_window`: the window a new session starts with, in
    /// batches; it grows toward `window_batches` as batches complete (slow
    /// start). Default 2.
    pub initial_window: u32,
    /// `prefetch.read_retries`: how many times a failed read is retried
    /// before the sample is reported to the loader as failed. Default 3, at
    /// most 100.
    pub read_retries: u32,
    /// `prefetch.retry_backoff_ms`: delay before the first retry, in
    /// milliseconds; doubled for each further retry up to
    /// `retry_backoff_max_ms`. Default 100.
    pub retry_backoff_ms: u64,
    /// `prefetch.retry_backoff_max_ms`: the longest delay between two
    /// attempts, in milliseconds; at least `retry_backoff_ms`. Default 2000.
    pub retry_backoff_max_ms: u64,
    /// `prefetch.sample_deadline_ms`: no retry of a sample starts later than
    /// this after its first attempt started, in milliseconds; at least
    /// `read_timeout_ms` and below `sessions.client_timeout_ms`. Default
    /// 20000, so that a sample fails at most `sample_deadline_ms +
    /// read_timeout_ms` = 30 s after its first attempt.
    pub sample_deadline_ms: u64,
    /// `prefetch.read_timeout_ms`: one read attempt that takes longer than
    /// this, in milliseconds, counts as failed. Default 10000.
    pub read_timeout_ms: u64,
    /// `prefetch.balance`: how a dataset's free reads are divided among
    /// its sessions each turn. Default `"stall"`.
    pub balance: Balance,
}

/// `prefetch.balance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// `"static"`: sessions are served in the order they opened, each
    /// taking what its window wants while reads are free.
    Static,
    /// `"stall"`: the reads go first to the sessions nearest a stall (their
    /// lead over their loader divided by its consumption rate), with a
    /// floor for every session ([`crate::balance`]). The default.
    #[default]
    Stall,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        Self {
            window_batches: 16,
            max_inflight_reads: 256,
            initial_window: 2,
            read_retries: 3,
            retry_backoff_ms: 100,
            retry_backoff_max_ms: 2_000,
            sample_deadline_ms: 20_000,
            read_timeout_ms: 10_000,
            balance: Balance::Stall,
        }
    }
}

/// `[dataset.retry]`: a dataset's own retry settings; each key left out
/// takes `[prefetch]`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryOverride {
    /// `dataset[i].retry.read_retries`: see `prefetch.read_retries`.
    pub read_retries: Option<u32>,
    /// `dataset[i].retry.retry_backoff_ms`: see `prefetch.retry_backoff_ms`.
    pub retry_backoff_ms: Option<u64>,
    /// `dataset[i].retry.retry_backoff_max_ms`: see
    /// `prefetch.retry_backoff_max_ms`.
    pub retry_backoff_max_ms: Option<u64>,
    /// `dataset[i].retry.sample_deadline_ms`: see
    /// `prefetch.sample_deadline_ms`.
    pub sample_deadline_ms: Option<u64>,
}

/// How the reads of one dataset are retried: the values of `[prefetch]`
/// with the dataset's `[dataset.retry]` applied
/// (`Config::retry_for`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Retries after the first attempt.
    pub retries: u32,
    /// Delay before the first retry.
    pub backoff: Duration,
    /// Longest delay between two attempts.
    pub(crate) backoff_max: Duration,
    /// No retry starts later than this after the first attempt started.
    pub deadline: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        PrefetchConfig::default().retry_settings(&RetryOverride::default())
    }
}

impl PrefetchConfig {
    /// These retry settings with `over` applied.
    pub(crate) fn retry_settings(&self, over: &RetryOverride) -> RetrySettings {
        let ms = |o: Option<u64>, d: u64| Duration::from_millis(o.unwrap_or(d));
        RetrySettings {
            retries: over.read_retries.unwrap_or(self.read_retries),
            backoff: ms(over.retry_backoff_ms, self.retry_backoff_ms),
            backoff_max: ms(over.retry_backoff_max_ms, self.retry_backoff_max_ms),
            deadline: ms(over.sample_deadline_ms, self.sample_deadline_ms),
        }
    }
}
