//! Every check applied to memory another process can write.
//!
//! The rule: copy once, check the copy with overflow-safe arithmetic, then use
//! only the copy. Nothing here panics on what it reads; every failure is a
//! typed [`Violation`] (or [`AttachError`] for segment headers).

use crate::error::{AttachError, ErrorCode, Violation};
use crate::layout::{
    BatchDescriptor, ReleaseDescriptor, SampleEntry, SegmentGeometry, SegmentHeader,
    BATCH_FLAGS_ALL, LAYOUT_VERSION, SEGMENT_HEADER_SIZE, SEGMENT_MAGIC,
};
use crate::region::Region;
use crate::sync::Ordering;
use std::mem::size_of;

/// Largest number of samples one batch may carry.
pub const MAX_BATCH_SAMPLES: u32 = 1 << 16;

/// Checks that `offset..offset+len` lies inside `0..limit` without overflow.
pub fn check_range(what: &'static str, offset: u64, len: u64, limit: u64) -> Result<(), Violation> {
    match offset.checked_add(len) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(Violation::OutOfBounds {
            what,
            offset,
            len,
            limit,
        }),
    }
}

/// A status word must be 0 or a known negative [`ErrorCode`].
fn check_status(field: &'static str, status: i32) -> Result<(), Violation> {
    if status == 0 || (status < 0 && ErrorCode::from_i32(status).is_some()) {
        Ok(())
    } else {
        Err(Violation::BadField {
            field,
            value: status as u32 as u64,
        })
    }
}

/// A one-time copy of a segment header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderSnapshot {
    /// Magic number.
    pub magic: u64,
    /// Layout version.
    pub layout_version: u32,
    /// Header size.
    pub header_size: u32,
    /// Instance epoch.
    pub instance_epoch: u64,
    /// Creator's pid.
    pub creator_pid: u32,
    /// Flags.
    pub flags: u32,
    /// Segment size.
    pub segment_size: u64,
    /// Session id.
    pub session_id: u64,
    /// Ready ring offset.
    pub ready_offset: u64,
    /// Ready ring capacity.
    pub ready_capacity: u32,
    /// Ready item size.
    pub ready_item_size: u32,
    /// Release ring offset.
    pub release_offset: u64,
    /// Release ring capacity.
    pub release_capacity: u32,
    /// Release item size.
    pub release_item_size: u32,
    /// Arena size.
    pub arena_size: u64,
    /// Agent heartbeat interval in milliseconds (0: no liveness checks).
    pub heartbeat_interval_ms: u64,
}

impl HeaderSnapshot {
    /// Reads a header: `magic` first with acquire ordering (pairing with the
    /// creator's release store, written last), then every other field once.
    ///
    /// # Safety
    /// `hdr` must be valid for reads of [`SEGMENT_HEADER_SIZE`] bytes and
    /// 8-byte aligned.
    #[cfg(not(feature = "loom"))]
    #[allow(
        clippy::multiple_unsafe_ops_per_block,
        reason = "one volatile copy per header field, all under the one safety contract"
    )]
    pub(crate) unsafe fn read(hdr: *const SegmentHeader) -> HeaderSnapshot {
        use std::ptr::addr_of;
        // SAFETY: caller guarantees the header is readable; the atomics are
        // accessed as atomics, the plain fields by volatile copies because
        // another process may write them concurrently.
        unsafe {
            let (magic, layout_version, instance_epoch) = load_identity(&*hdr);
            HeaderSnapshot {
                magic,
                layout_version,
                instance_epoch,
                header_size: addr_of!((*hdr).header_size).read_volatile(),
                creator_pid: addr_of!((*hdr).creator_pid).read_volatile(),
                flags: addr_of!((*hdr).flags).read_volatile(),
                segment_size: addr_of!((*hdr).segment_size).read_volatile(),
                session_id: addr_of!((*hdr).session_id).read_volatile(),
                ready_offset: addr_of!((*hdr).ready_offset).read_volatile(),
                ready_capacity: addr_of!((*hdr).ready_capacity).read_volatile(),
                ready_item_size: addr_of!((*hdr).ready_item_size).read_volatile(),
                release_offset: addr_of!((*hdr).release_offset).read_volatile(),
                release_capacity: addr_of!((*hdr).release_capacity).read_volatile(),
                release_item_size: addr_of!((*hdr).release_item_size).read_volatile(),
                arena_size: addr_of!((*hdr).arena_size).read_volatile(),
                heartbeat_interval_ms: addr_of!((*hdr).heartbeat_interval_ms).read_volatile(),
            }
        }
    }

    /// Validates a header copied from a mapping of `mapped_len` bytes.
    ///
    /// Accepts only the exact geometry this library would have created for
    /// the two capacities: anything else (garbage, a different layout, a
    /// truncated file) is rejected with a typed error.
    pub fn validate(
        &self,
        mapped_len: u64,
        expected_epoch: Option<u64>,
    ) -> Result<SegmentGeometry, AttachError> {
        if self.magic != SEGMENT_MAGIC {
            return Err(AttachError::BadMagic(self.magic));
        }
        if self.layout_version != LAYOUT_VERSION {
            return Err(AttachError::BadVersion {
                found: self.layout_version,
                expected: LAYOUT_VERSION,
            });
        }
        if let Some(e) = expected_epoch {
            if e != self.instance_epoch {
                return Err(AttachError::StaleEpoch {
                    found: self.instance_epoch,
                    expected: e,
                });
            }
        }
        if self.header_size as usize != SEGMENT_HEADER_SIZE {
            return Err(Violation::BadField {
                field: "header_size",
                value: self.header_size.into(),
            }
            .into());
        }
        if self.flags & !crate::layout::SEGMENT_FLAGS_ALL != 0 {
            return Err(Violation::BadField {
                field: "flags",
                value: self.flags.into(),
            }
            .into());
        }
        if self.segment_size > mapped_len {
            return Err(AttachError::TooShort {
                needed: self.segment_size,
                actual: mapped_len,
            });
        }
        if self.ready_item_size as usize != size_of::<BatchDescriptor>() {
            return Err(Violation::BadField {
                field: "ready_item_size",
                value: self.ready_item_size.into(),
            }
            .into());
        }
        if self.release_item_size as usize != size_of::<ReleaseDescriptor>() {
            return Err(Violation::BadField {
                field: "release_item_size",
                value: self.release_item_size.into(),
            }
            .into());
        }
        let g = SegmentGeometry::new(self.ready_capacity, self.release_capacity).ok_or(
            Violation::BadField {
                field: "ring_capacity",
                value: (u64::from(self.ready_capacity) << 32) | u64::from(self.release_capacity),
            },
        )?;
        for (field, found, want) in [
            ("ready_offset", self.ready_offset, g.ready_offset),
            ("release_offset", self.release_offset, g.release_offset),
            ("segment_size", self.segment_size, g.segment_size),
        ] {
            if found != want {
                return Err(Violation::BadField {
                    field,
                    value: found,
                }
                .into());
            }
        }
        Ok(g)
    }
}

/// Loads a header's identity words: `magic` first with acquire ordering
/// (pairing with the release store of `magic` that the creator issues last,
/// see `segment::publish_header`), then `layout_version` and
/// `instance_epoch`. Returns `(magic, layout_version, instance_epoch)`.
pub(crate) fn load_identity(h: &SegmentHeader) -> (u64, u32, u64) {
    let magic = h.magic.load(Ordering::Acquire); // acquire: pairs with publish_header
    let layout_version = h.layout_version.load(Ordering::Acquire);
    let instance_epoch = h.instance_epoch.load(Ordering::Acquire);
    (magic, layout_version, instance_epoch)
}

/// Checks a batch descriptor read from the ready ring against an arena of
/// `arena_size` bytes: flags, status, sample count, table bounds and alignment.
pub fn check_batch(d: &BatchDescriptor, arena_size: u64) -> Result<(), Violation> {
    if d.flags & !BATCH_FLAGS_ALL != 0 {
        return Err(Violation::BadField {
            field: "batch.flags",
            value: d.flags.into(),
        });
    }
    check_status("batch.status", d.status)?;
    if d.sample_count > MAX_BATCH_SAMPLES {
        return Err(Violation::BadField {
            field: "batch.sample_count",
            value: d.sample_count.into(),
        });
    }
    if d.sample_count > 0 {
        if !d.table_offset.is_multiple_of(8) {
            return Err(Violation::Misaligned {
                what: "sample table",
                offset: d.table_offset,
            });
        }
        let table_len = u64::from(d.sample_count) * size_of::<SampleEntry>() as u64;
        check_range("sample table", d.table_offset, table_len, arena_size)?;
    }
    Ok(())
}

/// Checks one sample entry against an arena of `arena_size` bytes.
pub fn check_sample(e: &SampleEntry, arena_size: u64) -> Result<(), Violation> {
    check_status("sample.status", e.status)?;
    if e.status != 0 && e.length != 0 {
        return Err(Violation::BadField {
            field: "sample.length",
            value: e.length.into(),
        });
    }
    check_range("sample", e.offset, e.length.into(), arena_size)
}

/// Copies a validated batch's sample table out of the arena once, then checks
/// every entry. `out` is cleared first; on error its contents are unspecified.
pub fn copy_sample_table(
    arena: &Region,
    d: &BatchDescriptor,
    out: &mut Vec<SampleEntry>,
) -> Result<(), Violation> {
    let arena_size = arena.len() as u64;
    check_batch(d, arena_size)?;
    out.clear();
    out.reserve(d.sample_count as usize);
    // Offsets are bounded by the arena size (checked above), so they fit usize.
    let table = arena.as_ptr().wrapping_add(d.table_offset as usize) as *const SampleEntry;
    for i in 0..d.sample_count as usize {
        // SAFETY: check_batch proved table_offset + count*32 <= arena length
        // and 8-byte alignment (the arena base is page aligned); every bit
        // pattern is a valid SampleEntry; volatile because the writer is
        // another process.
        let e = unsafe { table.wrapping_add(i).read_volatile() };
        check_sample(&e, arena_size)?;
        out.push(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_never_overflow() {
        assert!(check_range("x", 0, 10, 10).is_ok());
        assert!(check_range("x", 1, 10, 10).is_err());
        assert!(check_range("x", u64::MAX, 2, u64::MAX).is_err());
        assert!(check_range("x", 10, 0, 10).is_ok());
        assert!(check_range("x", 11, 0, 10).is_err());
    }

    #[test]
    fn batch_checks() {
        let ok = BatchDescriptor {
            table_offset: 64,
            sample_count: 2,
            ..Default::default()
        };
        assert!(check_batch(&ok, 128).is_ok());
        assert!(check_batch(&ok, 127).is_err());
        assert!(check_batch(&BatchDescriptor { flags: 8, ..ok }, 1 << 20).is_err());
        assert!(check_batch(&BatchDescriptor { status: 5, ..ok }, 1 << 20).is_err());
        assert!(check_batch(&BatchDescriptor { status: -999, ..ok }, 1 << 20).is_err());
        assert!(check_batch(&BatchDescriptor { status: -11, ..ok }, 1 << 20).is_ok());
        assert!(check_batch(
            &BatchDescriptor {
                table_offset: 4,
                ..ok
            },
            1 << 20
        )
        .is_err());
        assert!(check_batch(
            &BatchDescriptor {
                sample_count: MAX_BATCH_SAMPLES + 1,
                ..ok
            },
            u64::MAX
        )
        .is_err());
        assert!(check_batch(
            &BatchDescriptor {
                table_offset: u64::MAX - 7,
                ..ok
            },
            u64::MAX
        )
        .is_err());
    }

    #[test]
    fn sample_table_copy_validates_every_entry() {
        let arena = Region::heap(4096);
        let entries = [
            SampleEntry {
                sample_id: 7,
                offset: 1024,
                length: 100,
                ..Default::default()
            },
            SampleEntry {
                sample_id: 8,
                offset: 4000,
                length: 200, // past the end
                ..Default::default()
            },
        ];
        let base = arena.as_ptr() as *mut SampleEntry;
        for (i, e) in entries.iter().enumerate() {
            // SAFETY: two 32-byte entries at the start of a 4 KiB region.
            unsafe { base.wrapping_add(i).write(*e) };
        }
        let d = BatchDescriptor {
            table_offset: 0,
            sample_count: 1,
            ..Default::default()
        };
        let mut out = Vec::new();
        copy_sample_table(&arena, &d, &mut out).unwrap();
        assert_eq!(out, vec![entries[0]]);
        let d2 = BatchDescriptor {
            sample_count: 2,
            ..d
        };
        assert!(matches!(
            copy_sample_table(&arena, &d2, &mut out),
            Err(Violation::OutOfBounds { what: "sample", .. })
        ));
    }
}
