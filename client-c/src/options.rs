//! What a loader asks for when it opens a session, and what it gets back.

use std::time::Duration;

use granary_shm::handshake::{CatalogCheck, OpenSession, SessionOpened};
use granary_shm::validate::HeaderSnapshot;

use crate::ABI_VERSION;

/// How long opening a session waits for the agent's reply by default.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Samples per batch when none is given (the protocol's default).
pub use granary_shm::handshake::DEFAULT_BATCH_SIZE;

/// Parameters of a session (the fields of the handshake's open-session
/// request, plus client-side settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Name of a dataset the agent serves.
    pub dataset: String,
    /// Shuffle seed: the same seed, rank and world size give the same order.
    pub seed: u64,
    /// First epoch to deliver.
    pub first_epoch: u32,
    /// Number of epochs to deliver (at least 1).
    pub epoch_count: u32,
    /// Samples per batch (at least 1).
    pub batch_size: u32,
    /// This loader's rank, below `world_size`.
    pub rank: u32,
    /// Number of ranks sharing the dataset (at least 1).
    pub world_size: u32,
    /// Drop the last, partial batch of each epoch.
    pub drop_last: bool,
    /// Ready ring capacity: 0 for the agent's default, else a power of two.
    pub ready_capacity: u32,
    /// Release ring capacity: 0 for the agent's default, else a power of two.
    pub release_capacity: u32,
    /// How long to wait for the agent's answer to the open request.
    pub open_timeout: Duration,
    /// The job's membership view to hand the agent before the session
    /// opens (the canonical encoding, see [`crate::encode_view`]); `None`:
    /// the session uses whatever view the agent holds.
    pub view: Option<Vec<u8>>,
    /// Fail the open when the agent refuses `view` (default: open anyway;
    /// the samples are the same, only where the bytes come from differs;
    /// [`crate::Session::view_status`] tells what happened).
    pub view_required: bool,
    /// The job's rank layout ([`crate::encode_layout`]), handed to the agent
    /// before the session opens; needed by the locality-aware assignment.
    pub layout: Option<Vec<u8>>,
    /// `Some(digest)`: deliver the locality-aware assignment whose inputs
    /// the whole job agreed on (every rank asked
    /// [`crate::Client::assignment`] with the same options and got this
    /// digest); the agent refuses the open if its inputs differ. `None`:
    /// exact (`DistributedSampler`) order.
    pub locality: Option<[u8; 32]>,
    /// Check every sample's bytes against the CRC-32C the agent recorded
    /// when they landed, before each batch is handed out (default: off). A
    /// mismatch makes that sample a `Corrupt` failure (empty, its own
    /// status), never different bytes. Costs one pass over the bytes of
    /// every batch. Off, the session still checks each sample's identity
    /// (its table entry: inside the arena, of one of the session's epochs,
    /// clear of the batch's table, lengths adding up) but not its bytes:
    /// the agent checked those when they landed and no loader can write
    /// the arena (docs/reliability.md, "What the loader checks"). Turn it
    /// on to also catch what changes bytes after they landed: a fault of
    /// the agent itself, of the machine's memory, or a write by root.
    pub verify_crc: bool,
    /// Report how long each `next_batch` took and how busy the calling
    /// thread was to the agent, through the session's shared header, for
    /// its per-rank wait metrics and verdicts (default: on; Rust API only,
    /// for comparing the cost: two clock reads per batch).
    pub report_waits: bool,
    /// Skip the session's first `first_batch` batches, counted across its
    /// epochs (default 0): a loader resuming after its agent went away
    /// names how many it has handed out, and gets every later batch of the
    /// same plan (the same seed, epochs and assignment).
    pub first_batch: u64,
    /// When the agent goes away (it hangs up, closes the session, or stops
    /// beating), how long [`Session::next_batch`](crate::Session::next_batch)
    /// waits for it to come back before failing with `Disconnected`; the
    /// session then reopens itself after the batches it has handed out, so
    /// the loader sees every batch of the plan once (default
    /// [`DEFAULT_RESUME_TIMEOUT`]). `None`: fail at once.
    pub resume_timeout: Option<Duration>,
    /// With `workers` > 1, take only batches `worker`, `worker + workers`,
    /// … of each epoch of the rank: one of `workers` DataLoader workers
    /// sharing the rank's batches round robin, so that together they hand
    /// the training loop the rank's batches in the rank's order (default
    /// 0 of 1: every batch).
    pub worker: u32,
    /// How many workers share the rank's batches (default 1).
    pub workers: u32,
    /// Set by [`SessionOptions::from_state`]: the catalog the saved state
    /// was taken against, and whether to open when the dataset changed
    /// since (the agent refuses with `DatasetChanged` otherwise).
    pub catalog_check: Option<CatalogCheck>,
}

/// How long a session waits for its agent to come back by default.
pub const DEFAULT_RESUME_TIMEOUT: Duration = Duration::from_secs(60);

impl SessionOptions {
    /// Options for `dataset` with the defaults: seed 0, epoch 0 only, batches
    /// of [`DEFAULT_BATCH_SIZE`], rank 0 of 1, keep the last partial batch,
    /// the agent's ring capacities.
    pub fn new(dataset: impl Into<String>) -> SessionOptions {
        SessionOptions {
            dataset: dataset.into(),
            seed: 0,
            first_epoch: 0,
            epoch_count: 1,
            batch_size: DEFAULT_BATCH_SIZE,
            rank: 0,
            world_size: 1,
            drop_last: false,
            ready_capacity: 0,
            release_capacity: 0,
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            view: None,
            view_required: false,
            layout: None,
            locality: None,
            verify_crc: false,
            report_waits: true,
            first_batch: 0,
            resume_timeout: Some(DEFAULT_RESUME_TIMEOUT),
            worker: 0,
            workers: 1,
            catalog_check: None,
        }
    }

    /// The handshake request these options describe.
    pub fn request(&self) -> OpenSession {
        OpenSession {
            dataset: self.dataset.clone(),
            seed: self.seed,
            first_epoch: self.first_epoch,
            epoch_count: self.epoch_count,
            batch_size: self.batch_size,
            rank: self.rank,
            world_size: self.world_size,
            drop_last: self.drop_last,
            ready_capacity: self.ready_capacity,
            release_capacity: self.release_capacity,
            client_abi: ABI_VERSION,
            locality: self.locality,
            first_batch: self.first_batch,
            worker: self.worker,
            workers: self.workers,
            catalog: self.catalog_check.clone(),
            wants_catalog: true,
        }
    }
}

/// What the agent told the loader about an open session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// Session id assigned by the agent.
    pub session_id: u64,
    /// Samples this rank receives per epoch.
    pub samples_per_epoch: u64,
    /// Batches this session receives per epoch (its worker's part of the
    /// rank's when `workers` > 1).
    pub batches_per_epoch: u64,
    /// Batches the whole rank receives per epoch (0 from an agent that
    /// does not say).
    pub rank_batches_per_epoch: u64,
    /// Size of the arena mapping in bytes.
    pub arena_size: u64,
    /// Ready ring capacity chosen by the agent.
    pub ready_capacity: u32,
    /// Release ring capacity chosen by the agent.
    pub release_capacity: u32,
    /// How often the agent beats and expects this loader to, in
    /// milliseconds; 0: no liveness checks.
    pub heartbeat_interval_ms: u64,
    /// `[height, width, channels]` of every sample when the agent prepares
    /// the dataset (`[dataset.prepare]`: uint8, height × width × channels,
    /// row-major); `None` for a dataset served as stored bytes.
    pub prepared: Option<[u32; 3]>,
}

impl SessionInfo {
    pub(crate) fn new(reply: &SessionOpened, segment: &HeaderSnapshot) -> Self {
        SessionInfo {
            session_id: reply.session_id,
            samples_per_epoch: reply.samples_per_epoch,
            batches_per_epoch: reply.batches_per_epoch,
            rank_batches_per_epoch: reply.rank_batches_per_epoch,
            arena_size: reply.arena_size,
            ready_capacity: segment.ready_capacity,
            release_capacity: segment.release_capacity,
            heartbeat_interval_ms: segment.heartbeat_interval_ms,
            prepared: reply.prepared,
        }
    }
}
