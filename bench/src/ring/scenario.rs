//! What every run shares: the items and their checksum, which ring a run
//! measures, how the producer publishes, and the shared memory both
//! processes map.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use granary_shm::layout::BatchDescriptor;
use granary_shm::memfd;
use granary_shm::region::Region;
use granary_shm::segment::{AgentSegment, SegmentSpec};

use super::Result;
use crate::baseline::{self, Tuning, Variant};

/// The `i`-th item: every field depends on `i`, so a lost, duplicated, torn
/// or reordered item changes the consumer's checks.
#[inline]
pub fn item(i: u64) -> BatchDescriptor {
    BatchDescriptor {
        seq: i,
        token: i.wrapping_mul(granary_base::GAMMA),
        table_offset: i << 6,
        batch_index: i >> 5,
        total_bytes: !i,
        epoch: (i >> 20) as u32,
        sample_count: 32,
        status: 0,
        flags: (i & 1) as u32,
        reserved: i ^ 0x5555_5555,
    }
}

/// Sum of every field of `d` (what the consumer accumulates per item).
#[inline]
pub fn fold(d: &BatchDescriptor) -> u64 {
    d.seq
        .wrapping_add(d.token)
        .wrapping_add(d.table_offset)
        .wrapping_add(d.batch_index)
        .wrapping_add(d.total_bytes)
        .wrapping_add(u64::from(d.epoch))
        .wrapping_add(u64::from(d.sample_count))
        .wrapping_add(u64::from(d.status as u32))
        .wrapping_add(u64::from(d.flags))
        .wrapping_add(d.reserved)
}

/// Consumer work per popped chunk: sequence check and checksum.
#[inline]
pub fn absorb(items: &[BatchDescriptor], next: &mut u64, sum: &mut u64) -> bool {
    let mut ok = true;
    for d in items {
        ok &= d.seq == *next;
        *next += 1;
        *sum = sum.wrapping_add(fold(d));
    }
    ok
}

pub fn expected_sum(n: u64) -> u64 {
    (0..n).fold(0u64, |s, i| s.wrapping_add(fold(&item(i))))
}

/// Which ring a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Granary,
    /// The baseline ring, plain or with diagnostic extra work.
    Baseline(Variant),
    /// The plain baseline ring with cached peer indices on both ends.
    MinRing,
}

pub const BASELINE: Kind = Kind::Baseline(Variant::PLAIN);

impl Kind {
    /// For the baseline code paths: how the ends work (`None` for
    /// granary's ring).
    pub fn baseline(self) -> Option<Tuning> {
        match self {
            Kind::Granary => None,
            Kind::Baseline(variant) => Some(Tuning {
                variant,
                cache_peer: false,
            }),
            Kind::MinRing => Some(Tuning {
                cache_peer: true,
                ..Tuning::PLAIN
            }),
        }
    }
}

impl Kind {
    pub fn name(self) -> String {
        match self {
            Kind::Granary => "granary".to_owned(),
            Kind::Baseline(c) => format!("baseline{}", c.suffix()),
            Kind::MinRing => "minring".to_owned(),
        }
    }

    pub fn parse(s: &str) -> Result<Kind> {
        if s == "granary" {
            return Ok(Kind::Granary);
        }
        if s == "minring" {
            return Ok(Kind::MinRing);
        }
        s.strip_prefix("baseline")
            .and_then(Variant::from_suffix)
            .map(Kind::Baseline)
            .ok_or_else(|| format!("unknown ring kind {s}").into())
    }
}

/// A fresh session segment in a sealed memfd; returns it and a duplicate of
/// its fd for the peer.
pub fn granary_segment(ready: u32, release: u32, epoch: u64) -> Result<(AgentSegment, OwnedFd)> {
    let seg = AgentSegment::create_memfd(SegmentSpec {
        session_id: epoch & 0xffff_ffff,
        ready_capacity: ready,
        release_capacity: release,
        arena_size: 1 << 20,
        instance_epoch: epoch,
        // The ring benchmark measures the rings only: no liveness checks.
        heartbeat_interval_ms: 0,
    })?;
    let fd = seg
        .fd()
        .ok_or("memfd segment without an fd")?
        .try_clone_to_owned()?;
    Ok((seg, fd))
}

/// A zeroed memfd of at least `len` bytes, mapped shared; returns the mapping
/// and the fd for the peer.
pub fn baseline_memory(len: usize) -> Result<(Arc<Region>, OwnedFd)> {
    let len = len.div_ceil(4096) * 4096;
    let fd = memfd::create("granary-bench-baseline", len as u64, false)?;
    let region = Region::map_shared_rw(fd.as_fd(), len, true)?;
    Ok((Arc::new(region), fd))
}

/// The peer's mapping of the baseline memfd.
pub fn baseline_attach(fd: BorrowedFd<'_>) -> Result<Arc<Region>> {
    let len = usize::try_from(memfd::file_size(fd)?)?;
    Ok(Arc::new(Region::map_shared_rw(fd, len, true)?))
}

/// Offset of the second baseline ring (ping-pong) in the same memfd.
pub fn second_ring_offset<T>(capacity: usize) -> usize {
    baseline::ring_bytes::<T>(capacity).div_ceil(128) * 128
}

pub fn new_epoch(run: u64) -> u64 {
    (u64::from(std::process::id()) << 32) | run
}

/// How the producer publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// `try_push` per item (baseline: one tail store per item).
    PerItem,
    /// `stage_with` k items, then `publish` (baseline: k slots, one tail store).
    Batched(u64),
}

impl Publish {
    pub fn k(self) -> u64 {
        match self {
            Publish::PerItem => 1,
            Publish::Batched(k) => k,
        }
    }

    pub fn label(self) -> String {
        match self {
            Publish::PerItem => "per-item".to_owned(),
            Publish::Batched(k) => format!("batched k={k}"),
        }
    }
}
