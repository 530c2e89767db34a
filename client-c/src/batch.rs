//! Batches lent by the agent, and the samples in them.
//!
//! A [`Batch`] owns a validated copy of its sample table (copied out of the
//! arena once, bounds-checked entry by entry) and a reference to the arena
//! mapping, so the bytes it points at stay mapped for as long as the batch
//! lives, even past the end of its session.
//!
//! A batch is on loan until it is released: [`crate::Session::release`]
//! hands it back at once; a batch that is simply dropped is handed back by
//! its session's next call.

use std::sync::{Arc, Mutex, PoisonError};

use granary_shm::arena::ArenaView;
use granary_shm::layout::{BATCH_END_OF_EPOCH, BATCH_END_OF_STREAM};
use granary_shm::{BatchDescriptor, ErrorCode, ReleaseDescriptor, SampleEntry};

/// The error a status word names (validated tables hold only known codes).
fn status_code(status: i32) -> Option<ErrorCode> {
    match status {
        0 => None,
        s => Some(ErrorCode::from_i32(s).unwrap_or(ErrorCode::Internal)),
    }
}

/// Releases of batches dropped without [`crate::Session::release`]; the
/// session drains it into the release ring on its next call.
#[derive(Debug, Default)]
pub(crate) struct Returns {
    queue: Mutex<Vec<ReleaseDescriptor>>,
}

impl Returns {
    fn push(&self, r: ReleaseDescriptor) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(r);
    }

    /// Everything queued so far (usually nothing: one uncontended lock).
    pub(crate) fn take_all(&self) -> Vec<ReleaseDescriptor> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// One batch of samples on loan from the agent.
#[derive(Debug)]
pub struct Batch {
    session_key: u64,
    desc: BatchDescriptor,
    samples: Vec<SampleEntry>,
    arena: ArenaView,
    /// `Some` while on loan and not yet released through the session.
    returns: Option<Arc<Returns>>,
}

impl Batch {
    /// Wraps a validated descriptor and its validated sample table.
    pub(crate) fn new(
        session_key: u64,
        desc: BatchDescriptor,
        samples: Vec<SampleEntry>,
        arena: ArenaView,
        returns: Arc<Returns>,
    ) -> Batch {
        Batch {
            session_key,
            desc,
            samples,
            arena,
            returns: Some(returns),
        }
    }

    /// The process-unique key of the session that lent this batch.
    pub(crate) fn session_key(&self) -> u64 {
        self.session_key
    }

    /// Ends the loan from this side: the caller pushes the returned release
    /// itself; the sample table comes back for reuse.
    pub(crate) fn disarm(mut self) -> (ReleaseDescriptor, Vec<SampleEntry>) {
        self.returns = None;
        (self.release_descriptor(), std::mem::take(&mut self.samples))
    }

    fn release_descriptor(&self) -> ReleaseDescriptor {
        ReleaseDescriptor {
            seq: self.desc.seq,
            token: self.desc.token,
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when the batch has no samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Epoch the batch belongs to.
    pub fn epoch(&self) -> u32 {
        self.desc.epoch
    }

    /// Index of the batch within its epoch for this rank.
    pub fn index(&self) -> u64 {
        self.desc.batch_index
    }

    /// Session-wide sequence number (0, 1, 2, ... in delivery order).
    pub fn seq(&self) -> u64 {
        self.desc.seq
    }

    /// Sum of the samples' lengths.
    pub fn total_bytes(&self) -> u64 {
        self.desc.total_bytes
    }

    /// 0, or the negative [`ErrorCode`] value that applies to the whole batch
    /// (e.g. `Io` when the source failed). Such a batch must still be released.
    pub fn status(&self) -> i32 {
        self.desc.status
    }

    /// The batch's error, if its status is not 0.
    pub fn error(&self) -> Option<ErrorCode> {
        status_code(self.desc.status)
    }

    /// True for the last batch of its epoch.
    pub fn is_end_of_epoch(&self) -> bool {
        self.desc.flags & BATCH_END_OF_EPOCH != 0
    }

    /// True for the last batch of the stream.
    pub fn is_end_of_stream(&self) -> bool {
        self.desc.flags & BATCH_END_OF_STREAM != 0
    }

    /// The `i`-th sample, if `i < len()`.
    pub fn sample(&self, i: usize) -> Option<Sample<'_>> {
        self.samples.get(i).map(|entry| Sample {
            entry,
            arena: &self.arena,
        })
    }

    /// Every sample, in table order.
    pub fn samples(&self) -> impl ExactSizeIterator<Item = Sample<'_>> + '_ {
        self.samples.iter().map(|entry| Sample {
            entry,
            arena: &self.arena,
        })
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(returns) = self.returns.take() {
            returns.push(self.release_descriptor());
        }
    }
}

/// One sample of a [`Batch`]: its bytes lie in the read-only arena mapping.
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    entry: &'a SampleEntry,
    arena: &'a ArenaView,
}

impl<'a> Sample<'a> {
    /// Stable sample id within the dataset.
    pub fn id(&self) -> u64 {
        self.entry.sample_id
    }

    /// Class label (-1 when the dataset has none).
    pub fn label(&self) -> i32 {
        self.entry.label
    }

    /// 0, or the negative [`ErrorCode`] value for this sample (then it is
    /// empty): one of [`ErrorCode::SAMPLE_FAILURES`], naming why it failed.
    pub fn status(&self) -> i32 {
        self.entry.status
    }

    /// Why the sample failed, if it did: `NotFound` (gone from the source),
    /// `Io` (a transient failure persisted), `Timeout` (the read timed out),
    /// `Corrupt` (its bytes failed a check), `ShortRead` (its size changed
    /// since the catalog was made) or `Decode` (the agent's prepare stage
    /// could not decode it).
    pub fn error(&self) -> Option<ErrorCode> {
        status_code(self.entry.status)
    }

    /// CRC-32C (Castagnoli) of the bytes, as recorded by the agent.
    pub fn crc32c(&self) -> u32 {
        self.entry.crc32c
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.entry.length as usize
    }

    /// True when the sample has no bytes.
    pub fn is_empty(&self) -> bool {
        self.entry.length == 0
    }

    /// Address of the first byte inside the read-only arena mapping; null for
    /// a sample with a non-zero status. Valid while the batch lives.
    pub fn as_ptr(&self) -> *const u8 {
        if self.entry.status != 0 {
            return std::ptr::null();
        }
        // The table was validated: offset + length lies inside the arena,
        // whose size fits in the address space, so the cast is lossless.
        self.arena.base().wrapping_add(self.entry.offset as usize)
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        // Cannot fail: the entry was bounds-checked against this arena.
        self.arena
            .read_at(self.entry.offset, self.len())
            .unwrap_or_default()
    }

    /// Whether the bytes' CRC-32C matches the one the agent recorded.
    pub fn checksum_matches(&self) -> bool {
        crc32c::crc32c(&self.to_vec()) == self.entry.crc32c
    }

    /// The named fields of a sample of a `format = "webdataset"` dataset:
    /// its tar members by extension (`jpg`, `cls`, …), in place, without a
    /// copy. Every header's checksum and bounds are checked against the
    /// sample's length; a malformed one is yielded as an error and ends
    /// the iteration. A failed sample has none.
    ///
    /// # Safety
    ///
    /// As [`bytes`](Self::bytes): the caller trusts the agent not to write
    /// the sample while its batch is on loan, and does not keep the fields
    /// past the batch's release.
    pub unsafe fn fields(&self) -> crate::fields::Fields<'a> {
        // SAFETY: forwarded to the caller, as documented.
        crate::fields::fields(unsafe { self.bytes() })
    }

    /// The bytes in place, without a copy.
    ///
    /// # Safety
    ///
    /// The arena is shared memory that the agent can write. The agent
    /// promises not to touch a sample's bytes while its batch is on loan; the
    /// caller must rely on that promise (a trusted agent) and must not keep
    /// the slice past the batch's release.
    pub unsafe fn bytes(&self) -> &'a [u8] {
        if self.entry.status != 0 || self.entry.length == 0 {
            return &[];
        }
        // SAFETY: the entry was validated against this arena (offset + length
        // <= arena size, no overflow), the mapping is readable and lives as
        // long as `self.arena` (borrowed for 'a), and the caller vouches that
        // nobody writes these bytes while the slice is in use.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }
}
