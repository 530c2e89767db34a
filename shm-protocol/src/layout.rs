//! Byte layouts of everything that lives in shared memory.
//!
//! Every type here is `#[repr(C)]` with explicit padding, and its size and
//! field offsets are pinned by `const` assertions below and by the checked-in
//! layout dump (`tests/layout_dump.rs`, `docs/shm-layout.md`). Any change to
//! these types must bump [`LAYOUT_VERSION`].
//!
//! A session's *ring segment* is laid out as:
//!
//! ```text
//! 0                     SegmentHeader (256 bytes)
//! ready_offset          RingControl (256 bytes) + ready_capacity × BatchDescriptor (64 bytes)
//! release_offset        RingControl (256 bytes) + release_capacity × ReleaseDescriptor (16 bytes)
//! segment_size          (end, a multiple of 4096)
//! ```
//!
//! The *arena* holds sample bytes and sample tables ([`SampleEntry`] arrays);
//! batch descriptors point at tables by arena offset.

use crate::sync::{AtomicU32, AtomicU64};

/// Magic number at offset 0 of a ring segment: the ASCII bytes `GRNRYSEG`
/// read as a little-endian u64.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"GRNRYSEG");

/// Version of every layout in this module. Attach rejects any other value.
pub const LAYOUT_VERSION: u32 = 4;

/// Producer and consumer words live on separate lines of this size (two
/// 64-byte lines, so the adjacent-line prefetcher cannot couple them either).
pub const LINE: usize = 128;

/// Size of [`SegmentHeader`].
pub const SEGMENT_HEADER_SIZE: usize = 256;

/// Segment sizes are rounded up to this.
pub const SEGMENT_ALIGN: usize = 4096;

/// Largest ring capacity accepted (items); keeps every offset computation far
/// from overflow.
pub const MAX_RING_CAPACITY: u32 = 1 << 20;

/// Bit in [`SegmentHeader::flags`]: the agent registered for expedited
/// global memory barriers, so its publications skip the `SeqCst` fence and a
/// loader must call `membarrier` before parking ([`crate::barrier`]).
pub const SEGMENT_FLAG_ASYMMETRIC: u32 = 1 << 0;
/// Every defined segment flag.
pub const SEGMENT_FLAGS_ALL: u32 = SEGMENT_FLAG_ASYMMETRIC;

/// Session states stored in [`SegmentHeader::state`].
pub mod state {
    /// The session is serving.
    pub const LIVE: u32 = 0;
    /// The agent fenced the session after a violation; see `violation`.
    pub const FENCED: u32 = 1;
    /// The agent closed the session (shutdown or end of stream).
    pub const CLOSED: u32 = 2;
}

/// Header at offset 0 of a session's ring segment.
///
/// Written by the agent once at creation; `magic`, `layout_version` and
/// `instance_epoch` are stored last with release ordering. The loader can
/// write this memory, so the agent never reads the geometry fields back: it
/// keeps its own copy from creation. After creation the agent writes only
/// `state`, `violation` and `heartbeat_ms`, and the loader writes only
/// `loader_heartbeat` (which the agent treats as an untrusted number and only
/// compares for change).
#[repr(C)]
pub struct SegmentHeader {
    /// [`SEGMENT_MAGIC`], stored last.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`], stored just before `magic`.
    pub layout_version: AtomicU32,
    /// Size of this header in bytes ([`SEGMENT_HEADER_SIZE`]).
    pub header_size: u32,
    /// Random per-creation value, stored before version and magic; the
    /// handshake reply repeats it so a loader can tell a fresh segment from a
    /// recycled one.
    pub instance_epoch: AtomicU64,
    /// Process id of the creator (the agent).
    pub creator_pid: u32,
    /// [`SEGMENT_FLAG_ASYMMETRIC`] or zero.
    pub flags: u32,
    /// Total size of the segment in bytes.
    pub segment_size: u64,
    /// Session id assigned by the agent.
    pub session_id: u64,
    /// Offset of the ready ring's [`RingControl`].
    pub ready_offset: u64,
    /// Ready ring capacity in items (power of two).
    pub ready_capacity: u32,
    /// Size of one ready item (`size_of::<BatchDescriptor>()`).
    pub ready_item_size: u32,
    /// Offset of the release ring's [`RingControl`].
    pub release_offset: u64,
    /// Release ring capacity in items (power of two).
    pub release_capacity: u32,
    /// Size of one release item (`size_of::<ReleaseDescriptor>()`).
    pub release_item_size: u32,
    /// Size of the arena the descriptors point into.
    pub arena_size: u64,
    /// One of [`state`]'s values.
    pub state: AtomicU32,
    /// When fenced: the [`crate::Violation::code`] that caused it.
    pub violation: AtomicU32,
    /// Agent liveness: milliseconds of `CLOCK_MONOTONIC` ([`crate::monotonic_ms`],
    /// one clock for every process of the machine), stored at creation and
    /// then every `heartbeat_interval_ms`.
    pub heartbeat_ms: AtomicU64,
    /// How often the agent stores `heartbeat_ms`, and how often it expects
    /// `loader_heartbeat` to change, in milliseconds; 0: no liveness checks
    /// either way. Written once at creation.
    pub heartbeat_interval_ms: u64,
    /// Loader liveness: a counter only the loader writes, bumped on every
    /// library call and by a background thread every
    /// `heartbeat_interval_ms / 2`. Its value means nothing; only change does.
    pub loader_heartbeat: AtomicU64,
    /// Loader-reported: nanoseconds spent in `next_batch`, summed (the time
    /// the training loop waited for data). Only the loader writes the
    /// `loader_*` words below; the agent reads them as untrusted numbers for
    /// its metrics and verdicts, never for a decision about memory.
    pub loader_wait_ns: AtomicU64,
    /// Loader-reported: `next_batch` calls that returned, summed.
    pub loader_batches: AtomicU64,
    /// Loader-reported: nanoseconds the calling thread was on a CPU or
    /// waiting for one (its `schedstat`), over `loader_busy_wall_ns`.
    pub loader_busy_ns: AtomicU64,
    /// Loader-reported: the wall-clock nanoseconds `loader_busy_ns` covers.
    pub loader_busy_wall_ns: AtomicU64,
    /// Loader-reported: `next_batch` waits by duration: bucket `i` counts
    /// waits up to [`WAIT_BUCKET_BOUNDS_US`]`[i]` microseconds (and above the
    /// bound before it); the last counts the longer ones.
    pub loader_wait_buckets: [AtomicU64; WAIT_BUCKETS],
    /// Zero; room for a later field without moving the rings.
    pub reserved: [u64; 1],
}

/// Upper bounds, in microseconds, of the loader's wait buckets (the last
/// bucket, above the last bound, has none).
pub const WAIT_BUCKET_BOUNDS_US: [u64; WAIT_BUCKETS - 1] = [
    100, 1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
];

/// Number of wait buckets in the segment header.
pub const WAIT_BUCKETS: usize = 12;

/// The wait bucket of a `next_batch` that took `ns` nanoseconds.
pub fn wait_bucket(ns: u64) -> usize {
    WAIT_BUCKET_BOUNDS_US
        .iter()
        .position(|&b| ns <= b * 1_000)
        .unwrap_or(WAIT_BUCKETS - 1)
}

/// One cache-line pair written only by a ring's producer.
#[repr(C, align(128))]
pub struct ProducerLine {
    /// Free-running count of items published (the producer's index).
    pub tail: AtomicU64,
    /// Futex word the consumer sleeps on; the producer bumps it to wake.
    pub data_seq: AtomicU32,
    /// Non-zero while the producer is (about to be) parked waiting for space.
    pub producer_waiting: AtomicU32,
}

/// One cache-line pair written only by a ring's consumer.
#[repr(C, align(128))]
pub struct ConsumerLine {
    /// Free-running count of items consumed (the consumer's index).
    pub head: AtomicU64,
    /// Futex word the producer sleeps on; the consumer bumps it to wake.
    pub space_seq: AtomicU32,
    /// Non-zero while the consumer is (about to be) parked waiting for data.
    pub consumer_waiting: AtomicU32,
}

/// Control block at the start of each ring; the item array follows it.
#[repr(C)]
pub struct RingControl {
    /// Words the producer writes.
    pub producer: ProducerLine,
    /// Words the consumer writes.
    pub consumer: ConsumerLine,
}

/// Bit in [`BatchDescriptor::flags`]: the last batch of its epoch for this session.
pub const BATCH_END_OF_EPOCH: u32 = 1 << 0;
/// Bit in [`BatchDescriptor::flags`]: no batch follows; `sample_count` may be 0.
pub const BATCH_END_OF_STREAM: u32 = 1 << 1;
/// Every defined batch flag.
pub const BATCH_FLAGS_ALL: u32 = BATCH_END_OF_EPOCH | BATCH_END_OF_STREAM;

/// Ready-ring item: one batch the agent lends to the loader.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchDescriptor {
    /// Session-wide sequence number: 0, 1, 2, ... in publication order.
    pub seq: u64,
    /// Lease token; the loader returns it unchanged in its release.
    pub token: u64,
    /// Arena offset of `sample_count` [`SampleEntry`] records (8-aligned).
    pub table_offset: u64,
    /// Index of this batch within its epoch for this rank.
    pub batch_index: u64,
    /// Sum of the samples' lengths.
    pub total_bytes: u64,
    /// Epoch number.
    pub epoch: u32,
    /// Number of samples in the table.
    pub sample_count: u32,
    /// 0, or a negative [`crate::ErrorCode`] that applies to the whole batch.
    pub status: i32,
    /// [`BATCH_END_OF_EPOCH`] | [`BATCH_END_OF_STREAM`].
    pub flags: u32,
    /// Zero.
    pub reserved: u64,
}

/// Release-ring item: the loader hands a batch back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReleaseDescriptor {
    /// `seq` of the batch being returned.
    pub seq: u64,
    /// `token` of the batch being returned.
    pub token: u64,
}

/// One sample in a batch's table (in the arena).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleEntry {
    /// Stable sample id within the dataset.
    pub sample_id: u64,
    /// Arena offset of the sample's bytes.
    pub offset: u64,
    /// Length in bytes.
    pub length: u32,
    /// Class label (or -1 when the dataset has none).
    pub label: i32,
    /// CRC-32C (Castagnoli) of the sample's bytes.
    pub crc32c: u32,
    /// 0, or a negative [`crate::ErrorCode`] for this sample (then `length`
    /// is 0): one of [`crate::ErrorCode::SAMPLE_FAILURES`], naming why the
    /// read failed.
    pub status: i32,
}

/// Plain-old-data items that may travel through a ring.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain no padding and no pointers, and
/// every bit pattern must be a valid value: items are copied to and from
/// memory another process can write.
pub unsafe trait RingItem: Copy + Default + Send + 'static {}

// SAFETY: repr(C), five u64 + four 32-bit words, no padding (size asserted
// below), every bit pattern valid.
unsafe impl RingItem for BatchDescriptor {}
// SAFETY: repr(C), two u64, no padding, every bit pattern valid.
unsafe impl RingItem for ReleaseDescriptor {}
// SAFETY: repr(C) 64-byte array of integers; used by the ring benchmark.
unsafe impl RingItem for [u64; 8] {}
// SAFETY: a plain integer.
unsafe impl RingItem for u64 {}

/// Bytes a ring with `capacity` items of `T` occupies (control block included).
pub const fn ring_bytes<T>(capacity: u32) -> usize {
    std::mem::size_of::<RingControl>() + capacity as usize * std::mem::size_of::<T>()
}

const fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// Geometry of a ring segment, computed by the creator from two capacities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentGeometry {
    /// Ready ring capacity (items).
    pub ready_capacity: u32,
    /// Release ring capacity (items).
    pub release_capacity: u32,
    /// Offset of the ready ring control block.
    pub ready_offset: u64,
    /// Offset of the release ring control block.
    pub release_offset: u64,
    /// Total segment size.
    pub segment_size: u64,
}

impl SegmentGeometry {
    /// Lays out a segment. Capacities must be powers of two in 2..=[`MAX_RING_CAPACITY`].
    pub fn new(ready_capacity: u32, release_capacity: u32) -> Option<SegmentGeometry> {
        let ok = |c: u32| c.is_power_of_two() && (2..=MAX_RING_CAPACITY).contains(&c);
        if !ok(ready_capacity) || !ok(release_capacity) {
            return None;
        }
        let ready_offset = SEGMENT_HEADER_SIZE;
        let release_offset = round_up(
            ready_offset + ring_bytes::<BatchDescriptor>(ready_capacity),
            LINE,
        );
        let end = round_up(
            release_offset + ring_bytes::<ReleaseDescriptor>(release_capacity),
            SEGMENT_ALIGN,
        );
        Some(SegmentGeometry {
            ready_capacity,
            release_capacity,
            ready_offset: ready_offset as u64,
            release_offset: release_offset as u64,
            segment_size: end as u64,
        })
    }
}

// ---- Pinned layouts (not under loom, whose atomics have other sizes) ------

#[cfg(not(feature = "loom"))]
mod pinned {
    use super::*;
    use std::mem::{align_of, size_of};

    const _: () = assert!(size_of::<SegmentHeader>() == SEGMENT_HEADER_SIZE);
    const _: () = assert!(size_of::<ProducerLine>() == LINE && align_of::<ProducerLine>() == LINE);
    const _: () = assert!(size_of::<ConsumerLine>() == LINE && align_of::<ConsumerLine>() == LINE);
    const _: () = assert!(size_of::<RingControl>() == 2 * LINE);
    const _: () = assert!(size_of::<BatchDescriptor>() == 64);
    const _: () = assert!(size_of::<ReleaseDescriptor>() == 16);
    const _: () = assert!(size_of::<SampleEntry>() == 32);

    granary_base::assert_offsets! {
        SegmentHeader {
            magic: 0,
            layout_version: 8,
            header_size: 12,
            instance_epoch: 16,
            creator_pid: 24,
            flags: 28,
            segment_size: 32,
            session_id: 40,
            ready_offset: 48,
            ready_capacity: 56,
            ready_item_size: 60,
            release_offset: 64,
            release_capacity: 72,
            release_item_size: 76,
            arena_size: 80,
            state: 88,
            violation: 92,
            heartbeat_ms: 96,
            heartbeat_interval_ms: 104,
            loader_heartbeat: 112,
            loader_wait_ns: 120,
            loader_batches: 128,
            loader_busy_ns: 136,
            loader_busy_wall_ns: 144,
            loader_wait_buckets: 152,
            reserved: 248,
        }
        ProducerLine {
            tail: 0,
            data_seq: 8,
            producer_waiting: 12,
        }
        ConsumerLine {
            head: 0,
            space_seq: 8,
            consumer_waiting: 12,
        }
        RingControl {
            consumer: LINE,
        }
        BatchDescriptor {
            seq: 0,
            token: 8,
            table_offset: 16,
            batch_index: 24,
            total_bytes: 32,
            epoch: 40,
            sample_count: 44,
            status: 48,
            flags: 52,
            reserved: 56,
        }
        ReleaseDescriptor {
            seq: 0,
            token: 8,
        }
        SampleEntry {
            sample_id: 0,
            offset: 8,
            length: 16,
            label: 20,
            crc32c: 24,
            status: 28,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_aligned_and_disjoint() {
        let g = SegmentGeometry::new(256, 512).unwrap();
        assert_eq!(g.ready_offset, SEGMENT_HEADER_SIZE as u64);
        assert_eq!(g.release_offset % LINE as u64, 0);
        assert!(g.release_offset >= g.ready_offset + ring_bytes::<BatchDescriptor>(256) as u64);
        assert!(g.segment_size >= g.release_offset + ring_bytes::<ReleaseDescriptor>(512) as u64);
        assert_eq!(g.segment_size % SEGMENT_ALIGN as u64, 0);
    }

    #[test]
    fn geometry_rejects_bad_capacities() {
        assert!(SegmentGeometry::new(0, 4).is_none());
        assert!(SegmentGeometry::new(3, 4).is_none());
        assert!(SegmentGeometry::new(4, 1).is_none());
        assert!(SegmentGeometry::new(MAX_RING_CAPACITY * 2, 4).is_none());
        assert!(SegmentGeometry::new(MAX_RING_CAPACITY, MAX_RING_CAPACITY).is_some());
    }
}
