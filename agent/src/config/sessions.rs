//! `[sessions]`: limits and timeouts of loader sessions.

use serde::Deserialize;

/// Largest ring capacity, in slots (the shared-memory layout's limit).
pub(crate) const MAX_RING_CAPACITY: u32 = 1 << 20;

/// `[sessions]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// `sessions.max_sessions`: concurrent loader sessions; further
    /// connections are refused. Default 64.
    pub max_sessions: u32,
    /// `sessions.max_sessions_per_uid`: concurrent sessions one user (the
    /// loader's uid) may hold; further opens by that user are refused.
    /// Left out: `max_sessions`.
    pub max_sessions_per_uid: Option<u32>,
    /// `sessions.ready_ring_capacity`: slots of each session's ready ring
    /// (batches published to the loader); a power of two in 2..=1048576.
    /// Default 64.
    pub ready_ring_capacity: u32,
    /// `sessions.release_ring_capacity`: slots of each session's release ring
    /// (batches handed back by the loader); a power of two in 2..=1048576.
    /// Default 64.
    pub release_ring_capacity: u32,
    /// `sessions.client_timeout_ms`: a loader silent (no heartbeat, no
    /// release) for this long, in milliseconds, is taken for dead and its
    /// session is closed. Default 60000.
    pub client_timeout_ms: u64,
    /// `sessions.heartbeat_ms`: how often, in milliseconds, the agent and the
    /// loaders signal liveness to each other. Default 1000.
    pub heartbeat_ms: u64,
    /// `sessions.max_pinned_percent`: the share of the sample cache, in
    /// percent (1..=100), that one session's batches being prepared and on
    /// loan may pin; at its cap a session waits for its loader's releases.
    /// Default 50.
    pub max_pinned_percent: u32,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            max_sessions: 64,
            max_sessions_per_uid: None,
            ready_ring_capacity: 64,
            release_ring_capacity: 64,
            client_timeout_ms: 60_000,
            heartbeat_ms: 1_000,
            max_pinned_percent: 50,
        }
    }
}
