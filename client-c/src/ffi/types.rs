//! Types of the C API: the status codes, the option, info and sample
//! structs, and the opaque handles.

use std::ffi::c_char;

use crate::batch::Batch;
use crate::client::Client;
use crate::session::Session;

/// Version of this C API. `granary_session_options.abi_version` must name a
/// version the library speaks (1 up to this value).
pub const GRANARY_ABI_VERSION: u32 = 1;

/// `timeout_ms` value that waits without limit.
pub const GRANARY_WAIT_FOREVER: i32 = -1;

/// Bit of `granary_batch_flags()`: the last batch of its epoch.
pub const GRANARY_BATCH_END_OF_EPOCH: u32 = 1;

/// Bit of `granary_batch_flags()`: the last batch of the stream.
pub const GRANARY_BATCH_END_OF_STREAM: u32 = 2;

/// `resume_timeout_ms` value: do not wait for a lost agent, fail at once.
pub const GRANARY_RESUME_OFF: u32 = u32::MAX;

/// Return codes of every `int` function: `GRANARY_OK` (0) or a negative
/// `GRANARY_E_*` value. `granary_strerror()` describes each one.
#[repr(C)]
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GranaryStatus {
    /// Success.
    GranaryOk = 0,
    /// An argument was null, out of range or inconsistent.
    GranaryEInvalidArgument = -1,
    /// A blocking call reached its timeout.
    GranaryETimeout = -2,
    /// A non-blocking call found no batch ready.
    GranaryEWouldBlock = -3,
    /// The agent went away (socket hang-up, closed session) or cannot be reached.
    GranaryEDisconnected = -4,
    /// The agent sent a malformed message.
    GranaryEProtocol = -5,
    /// Protocol, ABI or layout version mismatch.
    GranaryEVersion = -6,
    /// The caller is not on the agent's allowlist.
    GranaryEPermission = -7,
    /// No such dataset (or session).
    GranaryENotFound = -8,
    /// The agent fenced the session after a protocol violation.
    GranaryEFenced = -9,
    /// Every batch of the requested epochs has been delivered.
    GranaryEEndOfStream = -10,
    /// The data source failed to read a sample (per batch or per sample): a
    /// transient failure that persisted through every retry.
    GranaryEIo = -11,
    /// Memory (arena or process) is exhausted.
    GranaryENoMemory = -12,
    /// A descriptor or sample table failed validation.
    GranaryECorrupt = -13,
    /// The agent refuses more sessions.
    GranaryEBusy = -14,
    /// An internal error in the agent or the library.
    GranaryEInternal = -15,
    /// The object was already released or closed.
    GranaryEClosed = -16,
    /// A sample is shorter or longer than catalogued: it changed in the
    /// source since the catalog was made (a sample's `status`).
    GranaryEShortRead = -17,
    /// The dataset's catalog is not the one a saved session state was
    /// taken against (`granary_session_open` with `resume_state`).
    GranaryEDatasetChanged = -18,
    /// The agent's prepare stage could not decode the sample (not a JPEG,
    /// corrupt data, or more pixels than it allows; a sample's `status`).
    GranaryEDecode = -19,
}

/// Parameters of `granary_session_open()`. Fill it with
/// `granary_session_options_init()`, then set the fields you need.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GranarySessionOptions {
    /// `sizeof(granary_session_options)` as the caller compiled it (set by
    /// init). Larger values are accepted (newer headers); smaller are not.
    pub struct_size: u32,
    /// `GRANARY_ABI_VERSION` as the caller compiled it (set by init).
    pub abi_version: u32,
    /// NUL-terminated UTF-8 name of a dataset the agent serves (required).
    pub dataset: *const c_char,
    /// Shuffle seed: the same seed, rank and world size give the same order.
    pub seed: u64,
    /// First epoch to deliver (default 0).
    pub first_epoch: u32,
    /// Number of epochs to deliver (default 1).
    pub epoch_count: u32,
    /// Samples per batch (default 32).
    pub batch_size: u32,
    /// This loader's rank, below `world_size` (default 0).
    pub rank: u32,
    /// Number of ranks sharing the dataset (default 1).
    pub world_size: u32,
    /// Non-zero: drop the last, partial batch of each epoch (default 0).
    pub drop_last: u32,
    /// Ready ring capacity: 0 for the agent's default, else a power of two.
    pub ready_capacity: u32,
    /// Release ring capacity: 0 for the agent's default, else a power of two.
    pub release_capacity: u32,
    /// The job's membership view to hand the agent first (bytes from
    /// `granary_view_encode()`), or NULL (default): the session uses the
    /// view the agent holds. Read during `granary_session_open()` only.
    pub view: *const u8,
    /// Length of `view` in bytes.
    pub view_len: usize,
    /// Non-zero: fail the open when the agent refuses `view` (default 0:
    /// open anyway; see `granary_session_view()`).
    pub view_required: u32,
    /// Zero.
    pub reserved: u32,
    /// The job's rank layout to hand the agent first (bytes from
    /// `granary_layout_encode()`), or NULL (default). Needed by
    /// `granary_assignment_query()` and by opens with `locality` set.
    pub layout: *const u8,
    /// Length of `layout` in bytes.
    pub layout_len: usize,
    /// Non-zero: deliver the locality-aware assignment whose inputs have
    /// `locality_digest`, the digest every rank of the job got from
    /// `granary_assignment_query()` (the open fails if the agent's inputs
    /// differ). Zero (default): exact `DistributedSampler` order.
    pub locality: u32,
    /// Zero.
    pub reserved2: u32,
    /// See `locality`.
    pub locality_digest: [u8; 32],
    /// Non-zero: hand samples out without checking their bytes against the
    /// CRC-32C the agent recorded; 0: check every sample's bytes before each
    /// batch is handed out (a mismatch makes the sample a
    /// `GRANARY_E_CORRUPT` failure, never different bytes; one pass over
    /// the bytes). `granary_session_options_init()` sets 1 (no byte pass):
    /// the agent checked the bytes when they landed, no loader can write
    /// the arena, and every sample's identity (its table entry) is checked
    /// either way.
    pub no_crc_check: u32,
    /// When the agent goes away (a crash, a restart: it hangs up or stops
    /// beating), how long `granary_next_batch()` waits for it to come back,
    /// in milliseconds, before failing with `GRANARY_E_DISCONNECTED`; the
    /// session then reopens itself after the batches it has handed out, so
    /// the loader sees every batch once. 0 (default): 60 000 ms.
    /// `GRANARY_RESUME_OFF`: fail at once.
    pub resume_timeout_ms: u32,
    /// Skip the session's first `first_batch` batches, counted across its
    /// epochs (default 0): a loader resuming after its agent went away
    /// names how many it has handed out.
    pub first_batch: u64,
    /// A saved session state (bytes from `granary_session_state()`), or
    /// NULL (default). When set, the session opens at the state's committed
    /// position with the state's plan: its dataset, seed, epochs, batch
    /// size, rank, world size, `drop_last`, worker split and locality
    /// digest replace those fields of these options (`dataset` may be
    /// NULL); the client-side fields (rings, view, layout, CRC check,
    /// resume timeout) are taken from these options. The agent refuses the
    /// open with `GRANARY_E_DATASET_CHANGED`, naming the dataset and the
    /// changed objects, when the dataset's catalog is not the one the state
    /// was taken against. Read during `granary_session_open()` only.
    pub resume_state: *const u8,
    /// Length of `resume_state` in bytes.
    pub resume_state_len: usize,
    /// Non-zero: open from `resume_state` even when the dataset changed
    /// since the state was saved (the agent logs what changed).
    pub accept_changed_dataset: u32,
    /// With `workers` > 1: take only batches `worker`, `worker + workers`,
    /// … of each epoch of the rank (one of `workers` processes sharing the
    /// rank's batches round robin). Default 0.
    pub worker: u32,
    /// How many processes share the rank's batches; 0 or 1 (default): the
    /// session takes every batch of the rank.
    pub workers: u32,
    /// Zero.
    pub reserved3: u32,
}

/// Most bytes of a session state (`granary_session_state()`).
pub const GRANARY_STATE_MAX: usize = 4096;

/// Size of `granary_session_options` before the view fields: callers built
/// against that header still work (their sessions hand in no view).
pub(crate) const OPTIONS_V1_SIZE: usize = 56;

/// Size of `granary_session_options` before the layout and locality
/// fields: callers built against that header open in exact order.
pub(crate) const OPTIONS_V2_SIZE: usize = 80;

/// Size of `granary_session_options` before `no_crc_check`: callers built
/// against it get the default (no pass over the bytes).
pub(crate) const OPTIONS_V3_SIZE: usize = 136;

/// Size of `granary_session_options` before `resume_state`: callers built
/// against it open fresh sessions.
pub(crate) const OPTIONS_V4_SIZE: usize = 152;

/// Longest note of `granary_assignment_info`, NUL included.
pub const GRANARY_NOTE_MAX: usize = 512;

/// What `granary_assignment_query()` reports. Set `struct_size` first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GranaryAssignmentInfo {
    /// Set by the caller to `sizeof(granary_assignment_info)`.
    pub struct_size: u32,
    /// 1 when the locality-aware assignment is available for the session
    /// described, 0 when not (see `note`).
    pub locality: u32,
    /// SHA-256 of the assignment's inputs (zeros when `locality` is 0):
    /// every rank of the job must report the same one.
    pub digest: [u8; 32],
    /// Why not, NUL-terminated (empty when `locality` is 1).
    pub note: [c_char; GRANARY_NOTE_MAX],
}

/// One agent of a job, for `granary_view_encode()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GranaryViewMember {
    /// NUL-terminated node id (`granary_peer_identity.node_id`).
    pub id: *const c_char,
    /// NUL-terminated `HOST:PORT` (`granary_peer_identity.addr`).
    pub addr: *const c_char,
    /// Keep bytes (`granary_peer_identity.capacity`).
    pub capacity: u64,
}

/// Longest string field of `granary_peer_identity`, NUL included.
pub const GRANARY_NAME_MAX: usize = 256;

/// What `granary_get_peer_identity()` reports: who the agent is among its job's
/// agents and the view it holds. Set `struct_size` first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GranaryPeerIdentity {
    /// Set by the caller to `sizeof(granary_peer_identity)`.
    pub struct_size: u32,
    /// Where its membership comes from: 0 off, 1 static list, 2 Slurm,
    /// 3 views handed in at session open, 4 a DNS name the agent resolves.
    pub membership: u32,
    /// Bytes of its arena kept for the job (its capacity in a view).
    pub capacity: u64,
    /// Epoch of the view it holds (0 without one).
    pub view_epoch: u64,
    /// Members of the view it holds (0 without one).
    pub members: u32,
    /// Zero.
    pub reserved: u32,
    /// Digest of the view it holds (zeros without one).
    pub view_digest: [u8; 32],
    /// Its node id, NUL-terminated (empty when peers are off).
    pub node_id: [c_char; GRANARY_NAME_MAX],
    /// `HOST:PORT` its peers reach it at, NUL-terminated.
    pub addr: [c_char; GRANARY_NAME_MAX],
    /// The job of the view it holds, NUL-terminated (empty without one).
    pub job_id: [c_char; GRANARY_NAME_MAX],
}

/// What `granary_job_position()` reports: where the job stands in a
/// session's plan, as the agent knows it from its own sessions and its
/// peers' job status. Set `struct_size` first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GranaryJobPosition {
    /// Set by the caller to `sizeof(granary_job_position_info)`.
    pub struct_size: u32,
    /// The epoch of the job's committed step.
    pub epoch: u32,
    /// The committed step: batches of `epoch` every known rank has taken.
    pub step: u64,
    /// Ranks of the plan whose position the agent knows.
    pub ranks_known: u32,
    /// Agents whose reports named a rank of the plan (its own included).
    pub nodes: u32,
    /// The `first_batch` for the queried options to open at the committed
    /// step (counted across their epochs, for their worker split).
    pub first_batch: u64,
    /// 1 when the queried rank's own position is known (below), else 0.
    pub rank_known: u32,
    /// The queried rank's epoch (0 unless `rank_known`).
    pub rank_epoch: u32,
    /// Batches of `rank_epoch` the queried rank has taken.
    pub rank_step: u64,
}

/// What `granary_session_get_info()` reports. Set `struct_size` to
/// `sizeof(granary_session_info)` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GranarySessionInfo {
    /// Set by the caller to `sizeof(granary_session_info)`.
    pub struct_size: u32,
    /// Ready ring capacity chosen by the agent.
    pub ready_capacity: u32,
    /// Release ring capacity chosen by the agent.
    pub release_capacity: u32,
    /// Zero.
    pub reserved: u32,
    /// Session id assigned by the agent.
    pub session_id: u64,
    /// Samples this rank receives per epoch.
    pub samples_per_epoch: u64,
    /// Batches this rank receives per epoch.
    pub batches_per_epoch: u64,
    /// Size of the read-only arena mapping in bytes.
    pub arena_size: u64,
    /// Batches the whole rank receives per epoch (`batches_per_epoch` is
    /// this session's part when `workers` > 1); 0 from an agent that does
    /// not say.
    pub rank_batches_per_epoch: u64,
    /// Height of every sample when the agent prepares the dataset
    /// (`[dataset.prepare]`: each sample is `prepared_height *
    /// prepared_width * prepared_channels` uint8, row-major, RGB); 0 for a
    /// dataset served as stored bytes.
    pub prepared_height: u32,
    /// Width of every prepared sample; 0 when not prepared.
    pub prepared_width: u32,
    /// Channels of every prepared sample (3, RGB); 0 when not prepared.
    pub prepared_channels: u32,
    /// Zero.
    pub reserved2: u32,
}

/// Size of `granary_session_info` before `rank_batches_per_epoch`.
pub(crate) const SESSION_INFO_V1_SIZE: usize = 48;
/// Size of `granary_session_info` before `prepared_height`.
pub(crate) const SESSION_INFO_V2_SIZE: usize = 56;

/// One sample of a batch, as filled in by `granary_batch_sample()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GranarySample {
    /// First byte, inside the read-only arena mapping; NULL when `status` is
    /// not 0. Valid until the batch is released.
    pub data: *const u8,
    /// Number of bytes.
    pub length: u64,
    /// Stable sample id within the dataset.
    pub id: u64,
    /// Class label, -1 when the dataset has none.
    pub label: i32,
    /// 0, or why this sample failed (then `length` is 0):
    /// `GRANARY_E_NOT_FOUND` (gone from the source), `GRANARY_E_IO` (a
    /// transient failure persisted), `GRANARY_E_TIMEOUT` (the read timed
    /// out), `GRANARY_E_CORRUPT` (the bytes failed a check),
    /// `GRANARY_E_SHORT_READ` (the size changed since the catalog was made)
    /// or `GRANARY_E_DECODE` (the agent's prepare stage could not decode
    /// it).
    pub status: i32,
    /// CRC-32C (Castagnoli) of the bytes, as recorded by the agent.
    pub crc32c: u32,
}

/// One named field of a sample, as filled in by
/// `granary_sample_next_field()`: a member of a WebDataset sample.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GranaryField {
    /// The field's name (the member's extension, such as `jpg`), inside
    /// the sample; not NUL-terminated.
    pub name: *const u8,
    /// Bytes of the name.
    pub name_length: u64,
    /// The field's first byte, inside the sample.
    pub data: *const u8,
    /// Bytes of the field.
    pub length: u64,
}

/// A connection point to one agent (opaque).
pub struct GranaryClient {
    pub(crate) client: Client,
}

/// An open session: a stream of batches (opaque).
pub struct GranarySession {
    pub(crate) session: Session,
    /// Addresses of the batch handles this session lent and that are not
    /// yet released; a release is checked against it before the handle is
    /// touched.
    pub(crate) live: std::collections::HashSet<usize>,
}

/// A batch on loan from the agent (opaque).
pub struct GranaryBatch {
    pub(crate) batch: Batch,
}

// The C layout is part of the ABI: pinned here, so a change cannot slip in
// without a new ABI version.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<GranarySessionOptions>() == 184);
    assert!(size_of::<GranaryAssignmentInfo>() == 40 + GRANARY_NOTE_MAX);
    assert!(size_of::<GranaryViewMember>() == 24);
    assert!(size_of::<GranaryJobPosition>() == 48);
    assert!(size_of::<GranaryPeerIdentity>() == 64 + 3 * GRANARY_NAME_MAX);
    assert!(size_of::<GranarySessionInfo>() == 72);
    assert!(size_of::<GranarySample>() == 40);
    assert!(size_of::<GranaryField>() == 32);
};

#[cfg(target_pointer_width = "64")]
granary_base::assert_offsets! {
    GranarySessionOptions {
        struct_size: 0,
        abi_version: 4,
        dataset: 8,
        seed: 16,
        release_capacity: 52,
        view: OPTIONS_V1_SIZE,
        view_len: 64,
        view_required: 72,
        layout: OPTIONS_V2_SIZE,
        layout_len: 88,
        locality: 96,
        locality_digest: 104,
        no_crc_check: OPTIONS_V3_SIZE,
        resume_timeout_ms: 140,
        first_batch: 144,
        resume_state: OPTIONS_V4_SIZE,
        resume_state_len: 160,
        accept_changed_dataset: 168,
        workers: 176,
    }
    GranaryAssignmentInfo {
        digest: 8,
        note: 40,
    }
    GranaryViewMember {
        capacity: 16,
    }
    GranaryJobPosition {
        step: 8,
        first_batch: 24,
        rank_step: 40,
    }
    GranaryPeerIdentity {
        view_digest: 32,
        node_id: 64,
        job_id: 64 + 2 * GRANARY_NAME_MAX,
    }
    GranarySessionInfo {
        struct_size: 0,
        session_id: 16,
        rank_batches_per_epoch: SESSION_INFO_V1_SIZE,
        prepared_height: SESSION_INFO_V2_SIZE,
        prepared_channels: 64,
    }
    GranarySample {
        length: 8,
        crc32c: 32,
    }
    GranaryField {
        name_length: 8,
        data: 16,
        length: 24,
    }
}
