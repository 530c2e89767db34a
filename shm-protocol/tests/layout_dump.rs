//! The checked-in layout dump: every shared-memory type's size, alignment and
//! field offsets, compared with `tests/layout.txt`. A layout change makes this
//! test fail until the dump is regenerated (`GRANARY_BLESS=1`) — and the
//! reviewer then sees the diff and checks that `LAYOUT_VERSION` was bumped.
#![cfg(not(feature = "loom"))]

use granary_shm::layout::*;
use std::fmt::Write;
use std::mem::{align_of, offset_of, size_of};

macro_rules! dump {
    ($out:ident, $ty:ty { $($field:ident),* $(,)? }) => {{
        writeln!($out, "{} size={} align={}", stringify!($ty), size_of::<$ty>(), align_of::<$ty>()).unwrap();
        $( writeln!($out, "  {:<20} @{}", stringify!($field), offset_of!($ty, $field)).unwrap(); )*
    }};
}

fn render() -> String {
    let mut s = String::new();
    writeln!(s, "LAYOUT_VERSION={LAYOUT_VERSION}").unwrap();
    writeln!(s, "SEGMENT_MAGIC={SEGMENT_MAGIC:#018x}").unwrap();
    writeln!(s, "LINE={LINE} SEGMENT_HEADER_SIZE={SEGMENT_HEADER_SIZE} SEGMENT_ALIGN={SEGMENT_ALIGN} MAX_RING_CAPACITY={MAX_RING_CAPACITY}").unwrap();
    dump!(
        s,
        SegmentHeader {
            magic,
            layout_version,
            header_size,
            instance_epoch,
            creator_pid,
            flags,
            segment_size,
            session_id,
            ready_offset,
            ready_capacity,
            ready_item_size,
            release_offset,
            release_capacity,
            release_item_size,
            arena_size,
            state,
            violation,
            heartbeat_ms,
            heartbeat_interval_ms,
            loader_heartbeat,
            loader_wait_ns,
            loader_batches,
            loader_busy_ns,
            loader_busy_wall_ns,
            loader_wait_buckets,
            reserved
        }
    );
    dump!(
        s,
        ProducerLine {
            tail,
            data_seq,
            producer_waiting
        }
    );
    dump!(
        s,
        ConsumerLine {
            head,
            space_seq,
            consumer_waiting
        }
    );
    dump!(s, RingControl { producer, consumer });
    dump!(
        s,
        BatchDescriptor {
            seq,
            token,
            table_offset,
            batch_index,
            total_bytes,
            epoch,
            sample_count,
            status,
            flags,
            reserved
        }
    );
    dump!(s, ReleaseDescriptor { seq, token });
    dump!(
        s,
        SampleEntry {
            sample_id,
            offset,
            length,
            label,
            crc32c,
            status
        }
    );
    let g = SegmentGeometry::new(256, 256).unwrap();
    writeln!(
        s,
        "geometry(256,256): ready@{} release@{} size={}",
        g.ready_offset, g.release_offset, g.segment_size
    )
    .unwrap();
    writeln!(
        s,
        "flags: END_OF_EPOCH={BATCH_END_OF_EPOCH} END_OF_STREAM={BATCH_END_OF_STREAM}"
    )
    .unwrap();
    writeln!(
        s,
        "state: LIVE={} FENCED={} CLOSED={}",
        state::LIVE,
        state::FENCED,
        state::CLOSED
    )
    .unwrap();
    s
}

#[test]
fn layout_matches_checked_in_dump() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/layout.txt");
    let now = render();
    if std::env::var_os("GRANARY_BLESS").is_some() {
        std::fs::write(path, &now).unwrap();
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        now == want,
        "shared-memory layout changed; bump LAYOUT_VERSION if it did on purpose and \
         regenerate with GRANARY_BLESS=1.\n--- checked in\n{want}\n--- now\n{now}"
    );
}
