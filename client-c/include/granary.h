/*
 * granary.h: the C API of libgranary, the loader side of Granary.
 *
 * ABI version 1 (GRANARY_ABI_VERSION). Link with -lgranary (libgranary.so),
 * or with libgranary.a plus -lpthread -ldl -lm. Lifecycle, error codes and
 * thread safety: docs/c-api.md.
 *
 * Generated from client-c/src/ffi by cbindgen; do not edit by hand.
 */

#ifndef GRANARY_H
#define GRANARY_H

#include <stddef.h>
#include <stdint.h>

/**
 * Version of this C API. `granary_session_options.abi_version` must name a
 * version the library speaks (1 up to this value).
 */
#define GRANARY_ABI_VERSION 1

/**
 * `timeout_ms` value that waits without limit.
 */
#define GRANARY_WAIT_FOREVER -1

/**
 * Bit of `granary_batch_flags()`: the last batch of its epoch.
 */
#define GRANARY_BATCH_END_OF_EPOCH 1

/**
 * Bit of `granary_batch_flags()`: the last batch of the stream.
 */
#define GRANARY_BATCH_END_OF_STREAM 2

/**
 * `resume_timeout_ms` value: do not wait for a lost agent, fail at once.
 */
#define GRANARY_RESUME_OFF UINT32_MAX

/**
 * Most bytes of a session state (`granary_session_state()`).
 */
#define GRANARY_STATE_MAX 4096

/**
 * Longest note of `granary_assignment_info`, NUL included.
 */
#define GRANARY_NOTE_MAX 512

/**
 * Longest string field of `granary_peer_identity`, NUL included.
 */
#define GRANARY_NAME_MAX 256

/**
 * Return codes of every `int` function: `GRANARY_OK` (0) or a negative
 * `GRANARY_E_*` value. `granary_strerror()` describes each one.
 */
typedef enum granary_status {
    /**
     * Success.
     */
    GRANARY_OK = 0,
    /**
     * An argument was null, out of range or inconsistent.
     */
    GRANARY_E_INVALID_ARGUMENT = -1,
    /**
     * A blocking call reached its timeout.
     */
    GRANARY_E_TIMEOUT = -2,
    /**
     * A non-blocking call found no batch ready.
     */
    GRANARY_E_WOULD_BLOCK = -3,
    /**
     * The agent went away (socket hang-up, closed session) or cannot be reached.
     */
    GRANARY_E_DISCONNECTED = -4,
    /**
     * The agent sent a malformed message.
     */
    GRANARY_E_PROTOCOL = -5,
    /**
     * Protocol, ABI or layout version mismatch.
     */
    GRANARY_E_VERSION = -6,
    /**
     * The caller is not on the agent's allowlist.
     */
    GRANARY_E_PERMISSION = -7,
    /**
     * No such dataset (or session).
     */
    GRANARY_E_NOT_FOUND = -8,
    /**
     * The agent fenced the session after a protocol violation.
     */
    GRANARY_E_FENCED = -9,
    /**
     * Every batch of the requested epochs has been delivered.
     */
    GRANARY_E_END_OF_STREAM = -10,
    /**
     * The data source failed to read a sample (per batch or per sample): a
     * transient failure that persisted through every retry.
     */
    GRANARY_E_IO = -11,
    /**
     * Memory (arena or process) is exhausted.
     */
    GRANARY_E_NO_MEMORY = -12,
    /**
     * A descriptor or sample table failed validation.
     */
    GRANARY_E_CORRUPT = -13,
    /**
     * The agent refuses more sessions.
     */
    GRANARY_E_BUSY = -14,
    /**
     * An internal error in the agent or the library.
     */
    GRANARY_E_INTERNAL = -15,
    /**
     * The object was already released or closed.
     */
    GRANARY_E_CLOSED = -16,
    /**
     * A sample is shorter or longer than catalogued: it changed in the
     * source since the catalog was made (a sample's `status`).
     */
    GRANARY_E_SHORT_READ = -17,
    /**
     * The dataset's catalog is not the one a saved session state was
     * taken against (`granary_session_open` with `resume_state`).
     */
    GRANARY_E_DATASET_CHANGED = -18,
    /**
     * The agent's prepare stage could not decode the sample (not a JPEG,
     * corrupt data, or more pixels than it allows; a sample's `status`).
     */
    GRANARY_E_DECODE = -19,
} granary_status;

/**
 * A batch on loan from the agent (opaque).
 */
typedef struct granary_batch granary_batch;

/**
 * A connection point to one agent (opaque).
 */
typedef struct granary_client granary_client;

/**
 * An open session: a stream of batches (opaque).
 */
typedef struct granary_session granary_session;

/**
 * Parameters of `granary_session_open()`. Fill it with
 * `granary_session_options_init()`, then set the fields you need.
 */
typedef struct granary_session_options {
    /**
     * `sizeof(granary_session_options)` as the caller compiled it (set by
     * init). Larger values are accepted (newer headers); smaller are not.
     */
    uint32_t struct_size;
    /**
     * `GRANARY_ABI_VERSION` as the caller compiled it (set by init).
     */
    uint32_t abi_version;
    /**
     * NUL-terminated UTF-8 name of a dataset the agent serves (required).
     */
    const char *dataset;
    /**
     * Shuffle seed: the same seed, rank and world size give the same order.
     */
    uint64_t seed;
    /**
     * First epoch to deliver (default 0).
     */
    uint32_t first_epoch;
    /**
     * Number of epochs to deliver (default 1).
     */
    uint32_t epoch_count;
    /**
     * Samples per batch (default 32).
     */
    uint32_t batch_size;
    /**
     * This loader's rank, below `world_size` (default 0).
     */
    uint32_t rank;
    /**
     * Number of ranks sharing the dataset (default 1).
     */
    uint32_t world_size;
    /**
     * Non-zero: drop the last, partial batch of each epoch (default 0).
     */
    uint32_t drop_last;
    /**
     * Ready ring capacity: 0 for the agent's default, else a power of two.
     */
    uint32_t ready_capacity;
    /**
     * Release ring capacity: 0 for the agent's default, else a power of two.
     */
    uint32_t release_capacity;
    /**
     * The job's membership view to hand the agent first (bytes from
     * `granary_view_encode()`), or NULL (default): the session uses the
     * view the agent holds. Read during `granary_session_open()` only.
     */
    const uint8_t *view;
    /**
     * Length of `view` in bytes.
     */
    size_t view_len;
    /**
     * Non-zero: fail the open when the agent refuses `view` (default 0:
     * open anyway; see `granary_session_view()`).
     */
    uint32_t view_required;
    /**
     * Zero.
     */
    uint32_t reserved;
    /**
     * The job's rank layout to hand the agent first (bytes from
     * `granary_layout_encode()`), or NULL (default). Needed by
     * `granary_assignment_query()` and by opens with `locality` set.
     */
    const uint8_t *layout;
    /**
     * Length of `layout` in bytes.
     */
    size_t layout_len;
    /**
     * Non-zero: deliver the locality-aware assignment whose inputs have
     * `locality_digest`, the digest every rank of the job got from
     * `granary_assignment_query()` (the open fails if the agent's inputs
     * differ). Zero (default): exact `DistributedSampler` order.
     */
    uint32_t locality;
    /**
     * Zero.
     */
    uint32_t reserved2;
    /**
     * See `locality`.
     */
    uint8_t locality_digest[32];
    /**
     * Non-zero: hand samples out without checking their bytes against the
     * CRC-32C the agent recorded (default 0: checked; a mismatch makes the
     * sample a `GRANARY_E_CORRUPT` failure, never different bytes).
     */
    uint32_t no_crc_check;
    /**
     * When the agent goes away (a crash, a restart: it hangs up or stops
     * beating), how long `granary_next_batch()` waits for it to come back,
     * in milliseconds, before failing with `GRANARY_E_DISCONNECTED`; the
     * session then reopens itself after the batches it has handed out, so
     * the loader sees every batch once. 0 (default): 60 000 ms.
     * `GRANARY_RESUME_OFF`: fail at once.
     */
    uint32_t resume_timeout_ms;
    /**
     * Skip the session's first `first_batch` batches, counted across its
     * epochs (default 0): a loader resuming after its agent went away
     * names how many it has handed out.
     */
    uint64_t first_batch;
    /**
     * A saved session state (bytes from `granary_session_state()`), or
     * NULL (default). When set, the session opens at the state's committed
     * position with the state's plan: its dataset, seed, epochs, batch
     * size, rank, world size, `drop_last`, worker split and locality
     * digest replace those fields of these options (`dataset` may be
     * NULL); the client-side fields (rings, view, layout, CRC check,
     * resume timeout) are taken from these options. The agent refuses the
     * open with `GRANARY_E_DATASET_CHANGED`, naming the dataset and the
     * changed objects, when the dataset's catalog is not the one the state
     * was taken against. Read during `granary_session_open()` only.
     */
    const uint8_t *resume_state;
    /**
     * Length of `resume_state` in bytes.
     */
    size_t resume_state_len;
    /**
     * Non-zero: open from `resume_state` even when the dataset changed
     * since the state was saved (the agent logs what changed).
     */
    uint32_t accept_changed_dataset;
    /**
     * With `workers` > 1: take only batches `worker`, `worker + workers`,
     * … of each epoch of the rank (one of `workers` processes sharing the
     * rank's batches round robin). Default 0.
     */
    uint32_t worker;
    /**
     * How many processes share the rank's batches; 0 or 1 (default): the
     * session takes every batch of the rank.
     */
    uint32_t workers;
    /**
     * Zero.
     */
    uint32_t reserved3;
} granary_session_options;

/**
 * What `granary_session_get_info()` reports. Set `struct_size` to
 * `sizeof(granary_session_info)` before the call.
 */
typedef struct granary_session_info {
    /**
     * Set by the caller to `sizeof(granary_session_info)`.
     */
    uint32_t struct_size;
    /**
     * Ready ring capacity chosen by the agent.
     */
    uint32_t ready_capacity;
    /**
     * Release ring capacity chosen by the agent.
     */
    uint32_t release_capacity;
    /**
     * Zero.
     */
    uint32_t reserved;
    /**
     * Session id assigned by the agent.
     */
    uint64_t session_id;
    /**
     * Samples this rank receives per epoch.
     */
    uint64_t samples_per_epoch;
    /**
     * Batches this rank receives per epoch.
     */
    uint64_t batches_per_epoch;
    /**
     * Size of the read-only arena mapping in bytes.
     */
    uint64_t arena_size;
    /**
     * Batches the whole rank receives per epoch (`batches_per_epoch` is
     * this session's part when `workers` > 1); 0 from an agent that does
     * not say.
     */
    uint64_t rank_batches_per_epoch;
    /**
     * Height of every sample when the agent prepares the dataset
     * (`[dataset.prepare]`: each sample is `prepared_height *
     * prepared_width * prepared_channels` uint8, row-major, RGB); 0 for a
     * dataset served as stored bytes.
     */
    uint32_t prepared_height;
    /**
     * Width of every prepared sample; 0 when not prepared.
     */
    uint32_t prepared_width;
    /**
     * Channels of every prepared sample (3, RGB); 0 when not prepared.
     */
    uint32_t prepared_channels;
    /**
     * Zero.
     */
    uint32_t reserved2;
} granary_session_info;

/**
 * One sample of a batch, as filled in by `granary_batch_sample()`.
 */
typedef struct granary_sample {
    /**
     * First byte, inside the read-only arena mapping; NULL when `status` is
     * not 0. Valid until the batch is released.
     */
    const uint8_t *data;
    /**
     * Number of bytes.
     */
    uint64_t length;
    /**
     * Stable sample id within the dataset.
     */
    uint64_t id;
    /**
     * Class label, -1 when the dataset has none.
     */
    int32_t label;
    /**
     * 0, or why this sample failed (then `length` is 0):
     * `GRANARY_E_NOT_FOUND` (gone from the source), `GRANARY_E_IO` (a
     * transient failure persisted), `GRANARY_E_TIMEOUT` (the read timed
     * out), `GRANARY_E_CORRUPT` (the bytes failed a check),
     * `GRANARY_E_SHORT_READ` (the size changed since the catalog was made)
     * or `GRANARY_E_DECODE` (the agent's prepare stage could not decode
     * it).
     */
    int32_t status;
    /**
     * CRC-32C (Castagnoli) of the bytes, as recorded by the agent.
     */
    uint32_t crc32c;
} granary_sample;

/**
 * What `granary_get_peer_identity()` reports: who the agent is among its job's
 * agents and the view it holds. Set `struct_size` first.
 */
typedef struct granary_peer_identity {
    /**
     * Set by the caller to `sizeof(granary_peer_identity)`.
     */
    uint32_t struct_size;
    /**
     * Where its membership comes from: 0 off, 1 static list, 2 Slurm,
     * 3 views handed in at session open, 4 a DNS name the agent resolves.
     */
    uint32_t membership;
    /**
     * Bytes of its arena kept for the job (its capacity in a view).
     */
    uint64_t capacity;
    /**
     * Epoch of the view it holds (0 without one).
     */
    uint64_t view_epoch;
    /**
     * Members of the view it holds (0 without one).
     */
    uint32_t members;
    /**
     * Zero.
     */
    uint32_t reserved;
    /**
     * Digest of the view it holds (zeros without one).
     */
    uint8_t view_digest[32];
    /**
     * Its node id, NUL-terminated (empty when peers are off).
     */
    char node_id[GRANARY_NAME_MAX];
    /**
     * `HOST:PORT` its peers reach it at, NUL-terminated.
     */
    char addr[GRANARY_NAME_MAX];
    /**
     * The job of the view it holds, NUL-terminated (empty without one).
     */
    char job_id[GRANARY_NAME_MAX];
} granary_peer_identity;

/**
 * What `granary_job_position()` reports: where the job stands in a
 * session's plan, as the agent knows it from its own sessions and its
 * peers' job status. Set `struct_size` first.
 */
typedef struct granary_job_position_info {
    /**
     * Set by the caller to `sizeof(granary_job_position_info)`.
     */
    uint32_t struct_size;
    /**
     * The epoch of the job's committed step.
     */
    uint32_t epoch;
    /**
     * The committed step: batches of `epoch` every known rank has taken.
     */
    uint64_t step;
    /**
     * Ranks of the plan whose position the agent knows.
     */
    uint32_t ranks_known;
    /**
     * Agents whose reports named a rank of the plan (its own included).
     */
    uint32_t nodes;
    /**
     * The `first_batch` for the queried options to open at the committed
     * step (counted across their epochs, for their worker split).
     */
    uint64_t first_batch;
    /**
     * 1 when the queried rank's own position is known (below), else 0.
     */
    uint32_t rank_known;
    /**
     * The queried rank's epoch (0 unless `rank_known`).
     */
    uint32_t rank_epoch;
    /**
     * Batches of `rank_epoch` the queried rank has taken.
     */
    uint64_t rank_step;
} granary_job_position_info;

/**
 * One agent of a job, for `granary_view_encode()`.
 */
typedef struct granary_view_member {
    /**
     * NUL-terminated node id (`granary_peer_identity.node_id`).
     */
    const char *id;
    /**
     * NUL-terminated `HOST:PORT` (`granary_peer_identity.addr`).
     */
    const char *addr;
    /**
     * Keep bytes (`granary_peer_identity.capacity`).
     */
    uint64_t capacity;
} granary_view_member;

/**
 * What `granary_assignment_query()` reports. Set `struct_size` first.
 */
typedef struct granary_assignment_info {
    /**
     * Set by the caller to `sizeof(granary_assignment_info)`.
     */
    uint32_t struct_size;
    /**
     * 1 when the locality-aware assignment is available for the session
     * described, 0 when not (see `note`).
     */
    uint32_t locality;
    /**
     * SHA-256 of the assignment's inputs (zeros when `locality` is 0):
     * every rank of the job must report the same one.
     */
    uint8_t digest[32];
    /**
     * Why not, NUL-terminated (empty when `locality` is 1).
     */
    char note[GRANARY_NOTE_MAX];
} granary_assignment_info;

/**
 * One named field of a sample, as filled in by
 * `granary_sample_next_field()`: a member of a WebDataset sample.
 */
typedef struct granary_field {
    /**
     * The field's name (the member's extension, such as `jpg`), inside
     * the sample; not NUL-terminated.
     */
    const uint8_t *name;
    /**
     * Bytes of the name.
     */
    uint64_t name_length;
    /**
     * The field's first byte, inside the sample.
     */
    const uint8_t *data;
    /**
     * Bytes of the field.
     */
    uint64_t length;
} granary_field;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The ABI version this library implements (`GRANARY_ABI_VERSION` of its
 * header).
 *
 * Thread safety: may be called from any thread at any time.
 */
uint32_t granary_abi_version(void);

/**
 * A static, NUL-terminated description of `code`; "unknown error" for a
 * value that is not a `GRANARY_E_*` code. Never NULL; never free it.
 *
 * Thread safety: may be called from any thread at any time.
 */
const char *granary_strerror(int code);

/**
 * The detail of the last failure on the calling thread (for example the
 * agent's own words when it refused a session); "" if none yet. Never
 * NULL; valid until the next failing call on the same thread; never free it.
 *
 * Thread safety: per thread; each thread sees its own message.
 */
const char *granary_last_error_message(void);

/**
 * Connects to the agent listening on the Unix socket `socket_path` and
 * stores a new client handle in `*out` (NULL on failure).
 *
 * Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT`,
 * `GRANARY_E_DISCONNECTED` (no agent there), `GRANARY_E_PERMISSION`.
 *
 * Thread safety: may be called from any thread. A client may be shared by
 * threads that open sessions on it concurrently.
 *
 * # Safety
 * `socket_path` is NULL or a NUL-terminated string; `out` is NULL or
 * writable.
 */
int granary_connect(const char *socket_path, struct granary_client **out);

/**
 * Frees a client. Sessions opened from it stay open and usable. NULL is
 * ignored.
 *
 * Thread safety: no other call may use the client at the same time.
 *
 * # Safety
 * `client` is NULL or a handle from `granary_connect` not yet freed.
 */
void granary_client_free(struct granary_client *client);

/**
 * Fills `*opts` with the defaults (seed 0, epoch 0, one epoch, batches of
 * 32, rank 0 of 1, keep partial batches, the agent's ring sizes, no
 * dataset) and sets `struct_size` and `abi_version`.
 *
 * Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT` (NULL).
 *
 * Thread safety: may be called from any thread.
 *
 * # Safety
 * `opts` is NULL or writable for `sizeof(granary_session_options)` bytes.
 */
int granary_session_options_init(struct granary_session_options *opts);

/**
 * Opens a session on `client` and stores its handle in `*out` (NULL on
 * failure). Sends the request, waits (up to 30 s) for the agent's answer,
 * maps the arena read-only and attaches the ring segment.
 *
 * Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL pointer, bad
 * field, `struct_size` too small), `GRANARY_E_VERSION` (`abi_version` not
 * spoken), or what the agent answered: `GRANARY_E_NOT_FOUND` (unknown
 * dataset), `GRANARY_E_PERMISSION`, `GRANARY_E_BUSY`, ...; also
 * `GRANARY_E_DISCONNECTED`, `GRANARY_E_TIMEOUT`, `GRANARY_E_PROTOCOL`.
 *
 * Thread safety: may be called concurrently on the same client.
 *
 * # Safety
 * `client` is NULL or a live client handle; `opts` is NULL or a readable
 * options struct (see `struct_size`); `out` is NULL or writable.
 */
int granary_session_open(const struct granary_client *client,
                         const struct granary_session_options *opts,
                         struct granary_session **out);

/**
 * Fills `*out` with the session's id, samples and batches per epoch,
 * arena size and ring capacities. The caller sets `out->struct_size`
 * first; the library writes this version's fields and sets `struct_size`
 * to the size it wrote.
 *
 * Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT`.
 *
 * Thread safety: like every call on a session, one thread at a time.
 *
 * # Safety
 * `session` is NULL or a live session handle; `out` is NULL or writable
 * for `out->struct_size` bytes.
 */
int granary_session_get_info(const struct granary_session *session,
                             struct granary_session_info *out);

/**
 * Stores the first byte and the size of the session's read-only arena
 * mapping in `*base` and `*size`. Every sample's `data` lies in
 * `[base, base + size)`; the mapping stays valid until the session is
 * closed. Useful to check that a loader reads samples in place, or to
 * register the arena once with a device (e.g. as pinned host memory).
 *
 * Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT` (a NULL argument).
 *
 * Thread safety: read-only; any thread while the session is open.
 *
 * # Safety
 * `session` is NULL or a live session handle; `base` and `size` are NULL
 * or writable.
 */
int granary_session_arena(const struct granary_session *session,
                          const uint8_t **base,
                          uint64_t *size);

/**
 * Takes the next batch and stores its handle in `*out`. Waits up to
 * `timeout_ms` milliseconds; a negative value (`GRANARY_WAIT_FOREVER`)
 * waits without limit, 0 does not wait.
 *
 * Returns `GRANARY_OK` with a batch; or, with a batch in `*out` too, the
 * batch's own negative status when the agent could not fill it (e.g.
 * `GRANARY_E_IO`): inspect it and release it like any other. With `*out`
 * NULL: `GRANARY_E_END_OF_STREAM` (all epochs delivered),
 * `GRANARY_E_TIMEOUT`, `GRANARY_E_WOULD_BLOCK` (timeout 0, nothing ready),
 * `GRANARY_E_FENCED`, `GRANARY_E_DISCONNECTED` (the agent went away; a dead
 * agent never blocks the caller past its timeout), `GRANARY_E_CORRUPT` (a
 * descriptor failed validation; the stream goes on), or
 * `GRANARY_E_INVALID_ARGUMENT`.
 *
 * Thread safety: one thread at a time per session.
 *
 * # Safety
 * `session` is NULL or a live session handle; `out` is NULL or writable.
 */
int granary_next_batch(struct granary_session *session, int timeout_ms, struct granary_batch **out);

/**
 * `granary_next_batch(session, 0, out)`: `GRANARY_E_WOULD_BLOCK` when no
 * batch is ready.
 *
 * Thread safety: one thread at a time per session.
 *
 * # Safety
 * As for `granary_next_batch`.
 */
int granary_try_next_batch(struct granary_session *session, struct granary_batch **out);

/**
 * Number of samples in the batch (0 for NULL).
 *
 * Thread safety: read-only; any thread while the batch is not being released.
 *
 * # Safety
 * `batch` is NULL or a live batch handle.
 */
size_t granary_batch_len(const struct granary_batch *batch);

/**
 * Epoch of the batch (0 for NULL).
 *
 * Thread safety: read-only; any thread while the batch is not being released.
 *
 * # Safety
 * `batch` is NULL or a live batch handle.
 */
uint32_t granary_batch_epoch(const struct granary_batch *batch);

/**
 * Index of the batch within its epoch for this rank (0 for NULL).
 *
 * Thread safety: read-only; any thread while the batch is not being released.
 *
 * # Safety
 * `batch` is NULL or a live batch handle.
 */
uint64_t granary_batch_index(const struct granary_batch *batch);

/**
 * `GRANARY_BATCH_END_OF_EPOCH` and/or `GRANARY_BATCH_END_OF_STREAM`
 * (0 for NULL).
 *
 * Thread safety: read-only; any thread while the batch is not being released.
 *
 * # Safety
 * `batch` is NULL or a live batch handle.
 */
uint32_t granary_batch_flags(const struct granary_batch *batch);

/**
 * 0, or the batch's negative `GRANARY_E_*` status (e.g. `GRANARY_E_IO`);
 * `GRANARY_E_INVALID_ARGUMENT` for NULL.
 *
 * Thread safety: read-only; any thread while the batch is not being released.
 *
 * # Safety
 * `batch` is NULL or a live batch handle.
 */
int granary_batch_status(const struct granary_batch *batch);

/**
 * Fills `*out` with sample `i` (0-based, below `granary_batch_len`). Its
 * `data` points into the read-only arena and stays valid until the batch
 * is released.
 *
 * Returns `GRANARY_OK` or `GRANARY_E_INVALID_ARGUMENT` (NULL, `i` out of range).
 *
 * Thread safety: read-only; any thread while the batch is not being released.
 *
 * # Safety
 * `batch` is NULL or a live batch handle; `out` is NULL or writable.
 */
int granary_batch_sample(const struct granary_batch *batch, size_t i, struct granary_sample *out);

/**
 * Hands the batch back to the agent and frees its handle; its sample
 * pointers become invalid. Every batch must be released, including those
 * that carry an error status.
 *
 * Returns `GRANARY_OK`; `GRANARY_E_INVALID_ARGUMENT` for NULL or a batch
 * that this session did not lend or that was already released (then
 * nothing is freed); `GRANARY_E_FENCED` / `GRANARY_E_DISCONNECTED` if the
 * release ring stayed full and the agent is gone, `GRANARY_E_CORRUPT` if
 * the agent broke the ring (the handle is freed in these cases too). A
 * release that finds the ring full for a second is kept and pushed by a
 * later call.
 *
 * Thread safety: one thread at a time per session.
 *
 * # Safety
 * `session` is NULL or a live session handle; `batch` is NULL or a
 * pointer that `granary_next_batch` stored (it is checked against the
 * session's outstanding batches before use).
 */
int granary_batch_release(struct granary_session *session, struct granary_batch *batch);

/**
 * Releases every batch the session still lends (their handles are freed),
 * tells the agent the session is over, unmaps its memory and frees the
 * handle.
 *
 * Returns `GRANARY_OK` (also when the agent is already gone),
 * `GRANARY_E_INVALID_ARGUMENT` (NULL), or `GRANARY_E_CORRUPT` if the agent
 * broke the release ring; the handle is freed in every case but NULL.
 *
 * Thread safety: no other call may use the session or its batches at the
 * same time.
 *
 * # Safety
 * `session` is NULL or a live session handle, not used afterwards.
 */
int granary_session_close(struct granary_session *session);

/**
 * Asks the agent who it is among its job's agents and stores the answer
 * in `*out` (the caller sets `out->struct_size` first). Each rank of a job
 * asks its own agent; the job gathers the answers and builds its view
 * with `granary_view_encode()`. Waits up to `timeout_ms`
 * (`GRANARY_WAIT_FOREVER`: no limit) on a connection of its own.
 *
 * Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL, `struct_size`
 * too small), `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`,
 * `GRANARY_E_PROTOCOL`.
 *
 * Thread safety: may be called concurrently on the same client.
 *
 * # Safety
 * `client` is NULL or a live client handle; `out` is NULL or writable for
 * `out->struct_size` bytes.
 */
int granary_get_peer_identity(const struct granary_client *client,
                              struct granary_peer_identity *out,
                              int timeout_ms);

/**
 * Asks the agent where the job stands in the plan `opts` describe
 * (dataset, seed, batch size, world size, `drop_last`) and stores the
 * answer in `*out` (the caller sets `out->struct_size` first): the job's
 * committed step, from the agent's own sessions and its peers' job
 * status, and the `first_batch` for a session with these options (its
 * rank, epochs and worker split) to open there. A replacement rank sets
 * `opts->first_batch` to it and opens. Waits up to the options'
 * `open_timeout_ms`, on a connection of its own.
 *
 * Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL, bad field,
 * `struct_size` too small), `GRANARY_E_NOT_FOUND`
 * (unknown dataset, or no agent of the job reported a rank of the plan),
 * `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`, `GRANARY_E_PROTOCOL`.
 *
 * Thread safety: may be called concurrently on the same client.
 *
 * # Safety
 * `client` is NULL or a live client handle; `opts` is NULL or a readable
 * options struct; `out` is NULL or writable for `out->struct_size` bytes.
 */
int granary_job_position(const struct granary_client *client,
                         const struct granary_session_options *opts,
                         struct granary_job_position_info *out);

/**
 * Encodes the membership view of job `job_id` at `epoch` (a relaunch uses
 * a higher epoch) with the `count` agents of `members` (any order; the
 * same agent listed more than once, as every rank of a node lists it,
 * counts once) into `buf` (`cap` bytes), and stores the encoding's length
 * in `*len`. With `buf` NULL or `cap` too small nothing is written but
 * `*len`, and the call returns `GRANARY_E_NO_MEMORY`: call again with a
 * buffer of `*len` bytes. Every rank that hands in the same members, job
 * and epoch gets the same bytes.
 *
 * Returns `GRANARY_OK`, `GRANARY_E_NO_MEMORY` (see above),
 * `GRANARY_E_INVALID_ARGUMENT` (NULL, an empty job id or member list, an
 * agent listed with two addresses or capacities, names over 255 bytes).
 *
 * Thread safety: may be called from any thread.
 *
 * # Safety
 * `job_id` is NULL or a NUL-terminated string; `members` is NULL or
 * readable for `count` entries whose strings are NUL-terminated; `buf` is
 * NULL or writable for `cap` bytes; `len` is NULL or writable.
 */
int granary_view_encode(const char *job_id,
                        uint64_t epoch,
                        const struct granary_view_member *members,
                        size_t count,
                        uint8_t *buf,
                        size_t cap,
                        size_t *len);

/**
 * What became of the view handed in with `options.view`: `GRANARY_OK`
 * when the agent holds it (and stores its epoch in `*view_epoch` if not
 * NULL; the session ends if a newer view of the job replaces it),
 * `GRANARY_E_NOT_FOUND` when no view was handed in, or the agent's
 * refusal (`GRANARY_E_INVALID_ARGUMENT`: stale, conflicting or not
 * matching its configuration; `GRANARY_E_BUSY`: it serves another job;
 * `GRANARY_E_PERMISSION`: a job it does not take), its reason in
 * `granary_last_error_message()`. A refused view does not stop the
 * session: its samples are the same, only where the bytes come from
 * differs.
 *
 * Thread safety: like every call on a session, one thread at a time.
 *
 * # Safety
 * `session` is NULL or a live session handle; `view_epoch` is NULL or
 * writable.
 */
int granary_session_view(const struct granary_session *session, uint64_t *view_epoch);

/**
 * Writes the session's checkpointable state into `buf` (`cap` bytes) and
 * its length into `*len`: the plan's inputs, the committed position (the
 * batches `granary_next_batch()` handed out so far) and the dataset's
 * provenance (the catalog's fingerprint and difference sketch). Save the
 * bytes with the training checkpoint; `granary_session_open()` with
 * `options.resume_state` opens the session again at the next batch, in
 * any process, against this agent or a restarted one. At most
 * `GRANARY_STATE_MAX` bytes. With `buf` NULL, only `*len` is written.
 *
 * Returns `GRANARY_OK`, or `GRANARY_E_INVALID_ARGUMENT` (NULL `session`
 * or `len`, or `cap` below the state's length, which is then in `*len`).
 *
 * Thread safety: like every call on a session, one thread at a time.
 *
 * # Safety
 * `session` is NULL or a live session handle; `buf` is NULL or writable
 * for `cap` bytes; `len` is NULL or writable.
 */
int granary_session_state(const struct granary_session *session,
                          uint8_t *buf,
                          size_t cap,
                          size_t *len);

/**
 * How many times the session reopened itself after its agent went away
 * (see `resume_timeout_ms`), into `*count`. After a resume the session's
 * id and arena (`granary_session_get_info()`, `granary_session_arena()`)
 * are the new agent's; batches taken before it stay readable until
 * released.
 *
 * Thread safety: like every call on a session, one thread at a time.
 *
 * # Safety
 * `session` is NULL or a live session handle; `count` is NULL or writable.
 */
int granary_session_resumes(const struct granary_session *session, uint32_t *count);

/**
 * Hands the agent the job's membership view (`view_len` bytes from
 * `granary_view_encode()`) without opening a session, and stores the
 * epoch of the view it holds now in `*view_epoch` (if not NULL). A job
 * calls it on every rank once the view is gathered, then waits at a
 * barrier before reading: every agent then listens for its peers before
 * the first sample is asked for. Waits up to `timeout_ms`.
 *
 * Returns `GRANARY_OK`, `GRANARY_E_INVALID_ARGUMENT` (NULL, a malformed,
 * stale or conflicting view, one the agent's configuration does not
 * match), `GRANARY_E_BUSY` (the agent serves another job's view to live
 * sessions), `GRANARY_E_PERMISSION` (a job the agent does not take),
 * `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`.
 *
 * Thread safety: may be called concurrently on the same client.
 *
 * # Safety
 * `client` is NULL or a live client handle; `view` is NULL or readable for
 * `view_len` bytes; `view_epoch` is NULL or writable.
 */
int granary_join_view(const struct granary_client *client,
                      const uint8_t *view,
                      size_t view_len,
                      uint64_t *view_epoch,
                      int timeout_ms);

/**
 * Encodes the job's rank layout for the locality-aware assignment into
 * `buf` (`cap` bytes) and stores its length in `*len`: `node_ids[r]` is
 * the node id (`granary_peer_identity.node_id`) rank `r` of `ranks` runs
 * on, each a member of the encoded view `view` (`view_len` bytes); with
 * `workers` sessions per rank, session rank `r * workers + w` runs where
 * rank `r` does. With `buf` NULL or `cap` too small nothing is written
 * but `*len`, and the call returns `GRANARY_E_NO_MEMORY`: call again with
 * a buffer of `*len` bytes.
 *
 * Returns `GRANARY_OK`, `GRANARY_E_NO_MEMORY` (see above),
 * `GRANARY_E_INVALID_ARGUMENT` (NULL, a malformed view, a node id not in
 * it, no ranks, `workers` 0).
 *
 * Thread safety: may be called from any thread.
 *
 * # Safety
 * `view` is NULL or readable for `view_len` bytes; `node_ids` is NULL or
 * readable for `ranks` NUL-terminated strings; `buf` is NULL or writable
 * for `cap` bytes; `len` is NULL or writable.
 */
int granary_layout_encode(const uint8_t *view,
                          size_t view_len,
                          const char *const *node_ids,
                          size_t ranks,
                          uint32_t workers,
                          uint8_t *buf,
                          size_t cap,
                          size_t *len);

/**
 * Asks the agent whether the session `opts` describes (with its `view` and
 * `layout`; `locality` is ignored) could be delivered in the
 * locality-aware assignment, and stores the answer and the digest of its
 * inputs in `*out` (the caller sets `out->struct_size` first), on a
 * connection of its own. Every rank of the job asks and the job compares
 * the answers: only when every rank reports `locality` 1 with the same
 * `digest` does every rank open with `locality` 1 and that digest;
 * otherwise every rank opens in exact order (mixing the two would lose
 * and repeat samples).
 *
 * Returns `GRANARY_OK` (whatever the answer), `GRANARY_E_INVALID_ARGUMENT`
 * (NULL, a bad field, `struct_size` too small), `GRANARY_E_NOT_FOUND` (no
 * such dataset), `GRANARY_E_TIMEOUT`, `GRANARY_E_DISCONNECTED`.
 *
 * Thread safety: may be called concurrently on the same client.
 *
 * # Safety
 * `client` is NULL or a live client handle; `opts` as for
 * `granary_session_open()`; `out` is NULL or writable for
 * `out->struct_size` bytes.
 */
int granary_assignment_query(const struct granary_client *client,
                             const struct granary_session_options *opts,
                             struct granary_assignment_info *out);

/**
 * Finds the field `name` (a member's extension, such as `"jpg"` or
 * `"cls"`) of a sample of a `format = "webdataset"` dataset: `*data` and
 * `*length` are set to its bytes, inside the sample (valid until the batch
 * is released; no copy).
 *
 * Returns `GRANARY_OK`; `GRANARY_E_NOT_FOUND` when the sample has no such
 * field; `GRANARY_E_CORRUPT` when its bytes are not a well-formed tar
 * fragment (a bad header checksum, a member past the sample's end);
 * `GRANARY_E_INVALID_ARGUMENT` for NULL or a failed sample.
 *
 * Thread safety: read-only; any thread while the batch is live.
 *
 * # Safety
 * `sample` is NULL or was filled by `granary_batch_sample` for a batch
 * that is still live; `name` is NULL or a NUL-terminated string; `data`
 * and `length` are NULL or writable.
 */
int granary_sample_field(const struct granary_sample *sample,
                         const char *name,
                         const uint8_t **data,
                         uint64_t *length);

/**
 * Enumerates the fields of a sample: start with `*cursor = 0`; each call
 * fills `*out` with the next field (its name, the member's extension, is
 * not NUL-terminated: use `name_length`) and advances `*cursor`.
 *
 * Returns 1 when `*out` was filled, 0 when there are no more fields,
 * `GRANARY_E_CORRUPT` for a malformed header (checksum, bounds),
 * `GRANARY_E_INVALID_ARGUMENT` for NULL, a failed sample or a cursor past
 * the sample's end.
 *
 * # Safety
 * As `granary_sample_field`; `cursor` and `out` are NULL or writable.
 */
int granary_sample_next_field(const struct granary_sample *sample,
                              uint64_t *cursor,
                              struct granary_field *out);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* GRANARY_H */
