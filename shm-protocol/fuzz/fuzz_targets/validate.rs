//! Fuzzes everything a loader or the agent reads from memory the other side
//! can write: segment headers (through `LoaderSegment::attach_region`), the
//! rings of an attached segment, batch descriptors and sample tables
//! (`validate::check_batch`, `validate::copy_sample_table`).
//!
//! The first input byte picks how the rest is used:
//! * `0`: the bytes are the whole segment, exactly as long as the input;
//! * `1`: the bytes start a 16 KiB zero-padded segment;
//! * `2`: a valid heap segment with traffic on both rings is patched with
//!   `(offset, word)` writes taken from the input, then attached and used
//!   from both sides;
//! * `3`: 64 bytes of batch descriptor, then the arena's bytes.
//!
//! Nothing may panic; accepted headers and tables must satisfy every rule.
#![no_main]

use granary_shm::layout::{
    BatchDescriptor, ReleaseDescriptor, SampleEntry, LAYOUT_VERSION, SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
};
use granary_shm::region::Region;
use granary_shm::segment::{AgentSegment, LoaderSegment, SegmentSpec};
use granary_shm::validate;
use granary_shm::AttachError;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use std::time::Duration;

const PADDED: usize = 16 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => raw_segment(rest, rest.len()),
        1 => raw_segment(rest, rest.len().max(PADDED)),
        2 => patched_segment(rest),
        _ => batch(rest),
    }
});

/// A zeroed heap region of `len` bytes starting with `bytes`.
fn region_with(bytes: &[u8], len: usize) -> Region {
    let region = Region::heap(len);
    let n = bytes.len().min(len);
    // SAFETY: the region is `len` ≥ `n` bytes long and freshly allocated, so
    // it cannot overlap `bytes`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), region.as_ptr(), n) };
    region
}

fn raw_segment(bytes: &[u8], len: usize) {
    let region = Arc::new(region_with(bytes, len));
    match LoaderSegment::attach_region(region, None) {
        Ok(seg) => use_loader(seg, len),
        Err(AttachError::TooShort { needed, actual }) => {
            assert_eq!(actual, len as u64);
            assert!(needed > actual);
        }
        Err(AttachError::Os(e)) => panic!("heap attach reported an OS error: {e}"),
        Err(_) => {}
    }
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    for (i, x) in w.iter_mut().enumerate() {
        *x = b.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(w)
}

fn patched_segment(bytes: &[u8]) {
    let cap = |b: Option<&u8>| 2u32 << (b.copied().unwrap_or(0) % 5);
    let spec = SegmentSpec {
        session_id: 7,
        ready_capacity: cap(bytes.first()),
        release_capacity: cap(bytes.get(1)),
        arena_size: le_u64(bytes, 2),
        instance_epoch: 0xe90c,
        heartbeat_interval_ms: le_u64(bytes, 10),
    };
    let mut agent = AgentSegment::create_heap(spec).expect("valid capacities");
    let len = agent.geometry().segment_size as usize;
    let (mut ready, mut release) = agent.take_endpoints().expect("agent endpoints");
    ready.set_spin(Duration::ZERO);
    release.set_spin(Duration::ZERO);
    // Some traffic before the corruption, so indices are not all zero.
    let traffic = bytes.get(10).copied().unwrap_or(0) % 8;
    for i in 0..u64::from(traffic) {
        let _ = ready.try_push(BatchDescriptor {
            seq: i,
            ..Default::default()
        });
    }
    // Patch: 10-byte records (u16 word index, u64 value).
    let base = agent.region().as_ptr();
    for rec in bytes.get(11..).unwrap_or(&[]).chunks_exact(10) {
        let word = usize::from(u16::from_le_bytes([rec[0], rec[1]])) % (len / 8);
        let value = le_u64(rec, 2);
        // SAFETY: word < len / 8, so the aligned 8-byte word lies inside the
        // live heap region; the ring ends only read it through atomics and
        // volatile copies, as they would memory another process writes.
        unsafe { base.cast::<u64>().wrapping_add(word).write_volatile(value) };
    }
    match LoaderSegment::attach_region(agent.region().clone(), Some(0xe90c)) {
        Ok(seg) => use_loader(seg, len),
        Err(AttachError::Os(e)) => panic!("heap attach reported an OS error: {e}"),
        Err(_) => {}
    }
    // The agent's ends over the corrupted rings: typed results only.
    for i in 0..4 {
        let _ = ready.try_push(BatchDescriptor {
            seq: 100 + i,
            ..Default::default()
        });
        let _ = ready.free();
        let _ = release.try_pop();
        let _ = release.available();
    }
    let _ = ready.wait_for_space(Some(Duration::ZERO));
    let _ = release.wait_for_data(Some(Duration::ZERO));
    let _ = release.pop_into(&mut [ReleaseDescriptor::default(); 4]);
    agent.heartbeat(1);
    let _ = agent.loader_heartbeat();
    agent.wake_loader();
}

/// An accepted header satisfies every attach rule; its rings are then
/// driven from the loader's side.
fn use_loader(mut seg: LoaderSegment, len: usize) {
    let info = *seg.info();
    assert_eq!(info.magic, SEGMENT_MAGIC);
    assert_eq!(info.layout_version, LAYOUT_VERSION);
    assert_eq!(info.header_size as usize, SEGMENT_HEADER_SIZE);
    assert!(info.segment_size <= len as u64);
    assert!(info.ready_capacity.is_power_of_two() && info.release_capacity.is_power_of_two());
    let (mut ready, mut release) = seg.take_endpoints().expect("fresh endpoints");
    assert!(seg.take_endpoints().is_none());
    ready.set_spin(Duration::ZERO);
    release.set_spin(Duration::ZERO);
    let mut buf = [BatchDescriptor::default(); 8];
    for i in 0..4 {
        if let Ok(Some(d)) = ready.try_pop() {
            let _ = validate::check_batch(&d, info.arena_size);
        }
        let _ = ready.available();
        let _ = ready.pop_into(&mut buf);
        let _ = release.try_push(ReleaseDescriptor { seq: i, token: i });
        let _ = release.free();
    }
    let _ = ready.wait_for_data(Some(Duration::ZERO));
    let _ = release.wait_for_space(Some(Duration::ZERO));
    let _ = seg.state();
    let _ = seg.violation();
    let _ = seg.heartbeat_ms();
    let _ = seg.heartbeat_interval_ms();
    seg.beat();
}

fn batch(bytes: &[u8]) {
    let w = |i: usize| le_u64(bytes, i * 8);
    let d = BatchDescriptor {
        seq: w(0),
        token: w(1),
        table_offset: w(2),
        batch_index: w(3),
        total_bytes: w(4),
        epoch: w(5) as u32,
        sample_count: (w(5) >> 32) as u32,
        status: w(6) as u32 as i32,
        flags: (w(6) >> 32) as u32,
        reserved: w(7),
    };
    let arena_bytes = bytes.get(64..).unwrap_or(&[]);
    let arena = region_with(arena_bytes, arena_bytes.len());
    let arena_size = arena.len() as u64;

    // Overflow-safe range checks agree with 128-bit arithmetic.
    let (off, len, limit) = (d.seq, d.token, d.batch_index);
    let fits = u128::from(off) + u128::from(len) <= u128::from(limit);
    assert_eq!(validate::check_range("x", off, len, limit).is_ok(), fits);

    let header_ok = validate::check_batch(&d, arena_size).is_ok();
    let mut out = Vec::new();
    if validate::copy_sample_table(&arena, &d, &mut out).is_ok() {
        assert!(header_ok);
        assert_eq!(out.len(), d.sample_count as usize);
        let table_end = u128::from(d.table_offset)
            + u128::from(d.sample_count) * std::mem::size_of::<SampleEntry>() as u128;
        assert!(d.sample_count == 0 || table_end <= u128::from(arena_size));
        for e in &out {
            assert!(validate::check_sample(e, arena_size).is_ok());
            assert!(u128::from(e.offset) + u128::from(e.length) <= u128::from(arena_size));
        }
    }
}
