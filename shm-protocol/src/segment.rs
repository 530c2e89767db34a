//! A session's ring segment: a small read-write memfd holding a
//! [`SegmentHeader`], the ready ring (agent → loader) and the release ring
//! (loader → agent).
//!
//! Bring-up: the agent creates the memfd with `memfd_create`, sizes and seals
//! it against shrinking and growing, fills every field, and stores
//! `instance_epoch`, `layout_version` and finally `magic` with release
//! ordering. The loader maps the fd it received, loads `magic` with acquire
//! ordering and rejects a wrong magic, version, epoch, or a segment shorter
//! than its header claims (see [`crate::validate::HeaderSnapshot::validate`]).
//!
//! The agent never reads the geometry back from shared memory: it keeps the
//! [`crate::layout::SegmentGeometry`] it created, because the loader can
//! write the segment.
//!
//! Under the `loom` feature the mapped segments are compiled out (loom's
//! atomics cannot live in a mapping); [`model`] then runs the same
//! publication ([`publish_header`]) and attach loads
//! ([`crate::validate::load_identity`]) over loom memory.

use crate::layout::{state, SegmentHeader, LAYOUT_VERSION, SEGMENT_MAGIC};
use crate::sync::Ordering;
#[cfg(not(feature = "loom"))]
use crate::{
    barrier::Barriers,
    error::{AttachError, Violation},
    layout::{BatchDescriptor, ReleaseDescriptor, SegmentGeometry, SEGMENT_HEADER_SIZE},
    region::Region,
    ring::{consumer_from_raw, producer_from_raw, Consumer, Producer},
    validate::HeaderSnapshot,
};
#[cfg(not(feature = "loom"))]
use std::{
    io,
    mem::size_of,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    ptr::NonNull,
    sync::Arc,
};

/// What the agent decides when it creates a segment.
///
/// `Default` gives zeros (no valid capacities): fill what matters and take
/// the rest with `..SegmentSpec::default()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentSpec {
    /// Session id.
    pub session_id: u64,
    /// Ready ring capacity (power of two).
    pub ready_capacity: u32,
    /// Release ring capacity (power of two).
    pub release_capacity: u32,
    /// Size of the arena the descriptors will point into.
    pub arena_size: u64,
    /// Per-creation random value echoed in the handshake reply.
    pub instance_epoch: u64,
    /// How often the agent beats ([`AgentSegment::heartbeat`]) and expects
    /// the loader's counter to change, in milliseconds; 0: no liveness
    /// checks either way.
    pub heartbeat_interval_ms: u64,
}

#[cfg(not(feature = "loom"))]
/// The agent's side of a segment.
pub struct AgentSegment {
    region: Arc<Region>,
    fd: Option<OwnedFd>,
    geometry: SegmentGeometry,
    spec: SegmentSpec,
    /// Segment flags as created (trusted copy).
    flags: u32,
    endpoints_taken: bool,
}

#[cfg(not(feature = "loom"))]
fn header(region: &Region) -> &SegmentHeader {
    // SAFETY: every region holding a segment is at least SEGMENT_HEADER_SIZE
    // long (checked at creation and attach) and page aligned; the fields read
    // through this reference after creation are atomics.
    unsafe { &*(region.as_ptr() as *const SegmentHeader) }
}

#[cfg(not(feature = "loom"))]
impl AgentSegment {
    /// Creates a segment in a sealed memfd (the fd is what the loader receives).
    pub fn create_memfd(spec: SegmentSpec) -> io::Result<AgentSegment> {
        let geometry = geometry_for(&spec)?;
        let name = format!("granary-session-{}", spec.session_id);
        let fd = crate::memfd::create(&name, geometry.segment_size, false)?;
        crate::memfd::add_seals(
            fd.as_fd(),
            crate::memfd::SEAL_SHRINK | crate::memfd::SEAL_GROW | crate::memfd::SEAL_SEAL,
        )?;
        let region = Region::map_shared_rw(fd.as_fd(), geometry.segment_size as usize, true)?;
        let flags = if crate::barrier::register_agent() {
            crate::layout::SEGMENT_FLAG_ASYMMETRIC
        } else {
            0
        };
        Ok(Self::init(
            Arc::new(region),
            Some(fd),
            geometry,
            spec,
            flags,
        ))
    }

    /// Creates a segment in heap memory (tests, Miri).
    pub fn create_heap(spec: SegmentSpec) -> io::Result<AgentSegment> {
        let geometry = geometry_for(&spec)?;
        let region = Region::heap(geometry.segment_size as usize);
        Ok(Self::init(Arc::new(region), None, geometry, spec, 0))
    }

    fn init(
        region: Arc<Region>,
        fd: Option<OwnedFd>,
        geometry: SegmentGeometry,
        spec: SegmentSpec,
        flags: u32,
    ) -> AgentSegment {
        let hdr = region.as_ptr() as *mut SegmentHeader;
        // SAFETY: the region is fresh, zeroed, at least a header long, page
        // aligned and not yet visible to any other process (its fd has not
        // left this process), so an exclusive reference cannot race; it ends
        // before `publish_header` takes a shared one.
        let h = unsafe { &mut *hdr };
        h.header_size = SEGMENT_HEADER_SIZE as u32;
        h.creator_pid = std::process::id();
        h.flags = flags;
        h.segment_size = geometry.segment_size;
        h.session_id = spec.session_id;
        h.ready_offset = geometry.ready_offset;
        h.ready_capacity = geometry.ready_capacity;
        h.ready_item_size = size_of::<BatchDescriptor>() as u32;
        h.release_offset = geometry.release_offset;
        h.release_capacity = geometry.release_capacity;
        h.release_item_size = size_of::<ReleaseDescriptor>() as u32;
        h.arena_size = spec.arena_size;
        h.heartbeat_interval_ms = spec.heartbeat_interval_ms;
        // A loader that attaches before the agent's first periodic beat
        // sees a fresh heartbeat, not zero.
        h.heartbeat_ms
            .store(crate::clock::monotonic_ms(), Ordering::Relaxed);
        publish_header(header(&region), spec.instance_epoch);
        AgentSegment {
            region,
            fd,
            geometry,
            spec,
            flags,
            endpoints_taken: false,
        }
    }

    /// The memfd to send to the loader (`None` for heap segments).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// The mapped region (heap segments hand this to [`LoaderSegment::attach_region`]).
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The geometry this segment was created with (trusted copy).
    pub fn geometry(&self) -> SegmentGeometry {
        self.geometry
    }

    /// The spec this segment was created with.
    pub fn spec(&self) -> SegmentSpec {
        self.spec
    }

    /// The agent's ring ends: producer of the ready ring, consumer of the
    /// release ring. Returns `None` after the first call.
    pub fn take_endpoints(
        &mut self,
    ) -> Option<(Producer<BatchDescriptor>, Consumer<ReleaseDescriptor>)> {
        if self.endpoints_taken {
            return None;
        }
        self.endpoints_taken = true;
        let (ready, release) = ring_bases(&self.region, &self.geometry);
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.region.clone();
        // SAFETY: bases come from the trusted geometry, lie inside the mapping
        // kept alive by `keep`, are 128-aligned; this is the only agent-side
        // producer/consumer pair (endpoints_taken).
        let mut p = unsafe {
            producer_from_raw(ready, self.geometry.ready_capacity, "ready", keep.clone())
        };
        // SAFETY: as above, for the release ring's only agent-side consumer.
        let mut c =
            unsafe { consumer_from_raw(release, self.geometry.release_capacity, "release", keep) };
        if self.flags & crate::layout::SEGMENT_FLAG_ASYMMETRIC != 0 {
            p.set_barriers(Barriers::Agent);
            c.set_barriers(Barriers::Agent);
        }
        Some((p, c))
    }

    /// Marks the session fenced for `violation` and wakes a parked loader.
    pub fn fence(&self, violation: &Violation) {
        let h = header(&self.region);
        h.violation.store(violation.code(), Ordering::Relaxed);
        h.state.store(state::FENCED, Ordering::Release);
        self.wake_loader();
    }

    /// Marks the session closed (agent shutdown) and wakes a parked loader.
    pub fn close(&self) {
        header(&self.region)
            .state
            .store(state::CLOSED, Ordering::Release);
        self.wake_loader();
    }

    /// Records agent liveness for the loader: `now_ms` is
    /// [`crate::monotonic_ms`] (loaders compare it with their own reading).
    pub fn heartbeat(&self, now_ms: u64) {
        header(&self.region)
            .heartbeat_ms
            .store(now_ms, Ordering::Relaxed);
    }

    /// The loader's heartbeat counter. Untrusted: any value is possible;
    /// only compare it with an earlier reading to see whether it changed.
    pub fn loader_heartbeat(&self) -> u64 {
        header(&self.region)
            .loader_heartbeat
            .load(Ordering::Relaxed)
    }

    /// What the loader reported of its waits and its thread's busy time
    /// (untrusted numbers: compare two reports with
    /// [`LoaderReport::since`]).
    pub fn loader_report(&self) -> LoaderReport {
        let h = header(&self.region);
        let mut r = LoaderReport {
            wait_ns: h.loader_wait_ns.load(Ordering::Relaxed),
            batches: h.loader_batches.load(Ordering::Relaxed),
            busy_ns: h.loader_busy_ns.load(Ordering::Relaxed),
            busy_wall_ns: h.loader_busy_wall_ns.load(Ordering::Relaxed),
            ..LoaderReport::default()
        };
        for (b, w) in r.wait_buckets.iter_mut().zip(&h.loader_wait_buckets) {
            *b = w.load(Ordering::Relaxed);
        }
        r
    }

    /// Bumps the ready ring's futex word and wakes a parked loader.
    pub fn wake_loader(&self) {
        let (ready, _) = ring_bases(&self.region, &self.geometry);
        // SAFETY: the ready ring's control block lies at `ready` inside the
        // live mapping; its fields are atomics.
        let ctrl = unsafe { ready.cast::<crate::layout::RingControl>().as_ref() };
        ctrl.producer.data_seq.fetch_add(1, Ordering::Release);
        crate::futex::wake_all(&ctrl.producer.data_seq);
    }
}

/// Makes a filled header visible: stores `state`, then `instance_epoch`,
/// `layout_version` and finally `magic`, each with release ordering. Every
/// other field must be written before this call. Pairs with the acquire load
/// of `magic` in [`crate::validate::load_identity`]: a loader that reads the
/// magic also sees every field written before it.
pub(crate) fn publish_header(h: &SegmentHeader, instance_epoch: u64) {
    h.state.store(state::LIVE, Ordering::Relaxed);
    h.instance_epoch.store(instance_epoch, Ordering::Release);
    h.layout_version.store(LAYOUT_VERSION, Ordering::Release);
    h.magic.store(SEGMENT_MAGIC, Ordering::Release); // release: pairs with attach's acquire
}

/// The header publication protocol over loom memory, for the loom tests.
///
/// A [`ModelSegment`] holds a real [`SegmentHeader`] (whose atomics are
/// loom's under this feature) for the identity words and keeps the plain
/// fields in a `loom::cell::UnsafeCell`, so loom reports any read of them
/// that is not ordered after their write. [`ModelSegment::create`] and
/// [`ModelSegment::attach`] call the same [`publish_header`] and
/// [`crate::validate::load_identity`] as the mapped segments, and the same
/// [`crate::validate::HeaderSnapshot::validate`].
#[cfg(feature = "loom")]
pub mod model {
    use super::*;
    use crate::error::AttachError;
    use crate::layout::{BatchDescriptor, ReleaseDescriptor, SegmentGeometry, SEGMENT_HEADER_SIZE};
    use crate::sync::{AtomicU32, AtomicU64};
    use crate::validate::{load_identity, HeaderSnapshot};
    use std::mem::size_of;

    /// A segment header shared by a creating and an attaching loom thread.
    pub struct ModelSegment {
        header: SegmentHeader,
        fields: loom::cell::UnsafeCell<HeaderSnapshot>,
    }

    // SAFETY: `fields` is only accessed through loom's cell, which checks
    // that every access is ordered against every write; the rest are atomics.
    unsafe impl Sync for ModelSegment {}

    impl Default for ModelSegment {
        fn default() -> Self {
            Self::new()
        }
    }

    impl ModelSegment {
        /// An all-zero header, as a fresh memfd holds.
        pub fn new() -> ModelSegment {
            ModelSegment {
                header: SegmentHeader {
                    magic: AtomicU64::new(0),
                    layout_version: AtomicU32::new(0),
                    header_size: 0,
                    instance_epoch: AtomicU64::new(0),
                    creator_pid: 0,
                    flags: 0,
                    segment_size: 0,
                    session_id: 0,
                    ready_offset: 0,
                    ready_capacity: 0,
                    ready_item_size: 0,
                    release_offset: 0,
                    release_capacity: 0,
                    release_item_size: 0,
                    arena_size: 0,
                    state: AtomicU32::new(0),
                    violation: AtomicU32::new(0),
                    heartbeat_ms: AtomicU64::new(0),
                    heartbeat_interval_ms: 0,
                    loader_heartbeat: AtomicU64::new(0),
                    loader_wait_ns: AtomicU64::new(0),
                    loader_batches: AtomicU64::new(0),
                    loader_busy_ns: AtomicU64::new(0),
                    loader_busy_wall_ns: AtomicU64::new(0),
                    loader_wait_buckets: Default::default(),
                    reserved: [0; 1],
                },
                fields: loom::cell::UnsafeCell::new(HeaderSnapshot::default()),
            }
        }

        /// The creator: fills every plain field, then [`publish_header`].
        pub fn create(&self, spec: SegmentSpec) {
            let g = SegmentGeometry::new(spec.ready_capacity, spec.release_capacity)
                .expect("model spec has valid capacities");
            self.fields.with_mut(|p| {
                // SAFETY: loom checks that no attach read races this write.
                unsafe {
                    p.write(HeaderSnapshot {
                        header_size: SEGMENT_HEADER_SIZE as u32,
                        segment_size: g.segment_size,
                        session_id: spec.session_id,
                        ready_offset: g.ready_offset,
                        ready_capacity: g.ready_capacity,
                        ready_item_size: size_of::<BatchDescriptor>() as u32,
                        release_offset: g.release_offset,
                        release_capacity: g.release_capacity,
                        release_item_size: size_of::<ReleaseDescriptor>() as u32,
                        arena_size: spec.arena_size,
                        heartbeat_interval_ms: spec.heartbeat_interval_ms,
                        ..HeaderSnapshot::default()
                    })
                }
            });
            publish_header(&self.header, spec.instance_epoch);
        }

        /// The loader: loads the identity words (magic first, acquire); only
        /// when the magic is right reads the plain fields, then validates the
        /// snapshot against a mapping of exactly `segment_size` bytes.
        pub fn attach(
            &self,
            expected_epoch: Option<u64>,
        ) -> Result<(HeaderSnapshot, SegmentGeometry), AttachError> {
            let (magic, layout_version, instance_epoch) = load_identity(&self.header);
            if magic != SEGMENT_MAGIC {
                // A real loader gets the fd only after creation; here the
                // creator may still be writing, so the fields are not read.
                return Err(AttachError::BadMagic(magic));
            }
            // SAFETY: loom checks that this read is ordered after the write.
            let fields = self.fields.with(|p| unsafe { p.read() });
            let snapshot = HeaderSnapshot {
                magic,
                layout_version,
                instance_epoch,
                ..fields
            };
            let g = snapshot.validate(fields.segment_size, expected_epoch)?;
            Ok((snapshot, g))
        }
    }
}

#[cfg(not(feature = "loom"))]
fn geometry_for(spec: &SegmentSpec) -> io::Result<SegmentGeometry> {
    SegmentGeometry::new(spec.ready_capacity, spec.release_capacity).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "ring capacities must be powers of two in 2..=MAX_RING_CAPACITY",
        )
    })
}

#[cfg(not(feature = "loom"))]
fn ring_bases(region: &Region, g: &SegmentGeometry) -> (NonNull<u8>, NonNull<u8>) {
    let base = region.as_ptr();
    // Offsets come from a validated geometry and lie inside the region.
    let ready = NonNull::new(base.wrapping_add(g.ready_offset as usize)).expect("non-null");
    let release = NonNull::new(base.wrapping_add(g.release_offset as usize)).expect("non-null");
    (ready, release)
}

#[cfg(not(feature = "loom"))]
/// The loader's side of a segment.
pub struct LoaderSegment {
    region: Arc<Region>,
    snapshot: HeaderSnapshot,
    geometry: SegmentGeometry,
    endpoints_taken: bool,
}

#[cfg(not(feature = "loom"))]
impl LoaderSegment {
    /// Maps a segment fd received from the agent and validates its header.
    pub fn attach_fd(
        fd: BorrowedFd<'_>,
        expected_epoch: Option<u64>,
    ) -> Result<LoaderSegment, AttachError> {
        let len = crate::memfd::file_size(fd).map_err(AttachError::Os)?;
        if len < SEGMENT_HEADER_SIZE as u64 {
            return Err(AttachError::TooShort {
                needed: SEGMENT_HEADER_SIZE as u64,
                actual: len,
            });
        }
        let len = usize::try_from(len).map_err(|_| AttachError::TooShort {
            needed: u64::MAX,
            actual: len,
        })?;
        let region = Region::map_shared_rw(fd, len, true).map_err(AttachError::Os)?;
        Self::attach_region(Arc::new(region), expected_epoch)
    }

    /// Validates a segment already mapped (or heap-backed) in `region`.
    pub fn attach_region(
        region: Arc<Region>,
        expected_epoch: Option<u64>,
    ) -> Result<LoaderSegment, AttachError> {
        if region.len() < SEGMENT_HEADER_SIZE {
            return Err(AttachError::TooShort {
                needed: SEGMENT_HEADER_SIZE as u64,
                actual: region.len() as u64,
            });
        }
        if !(region.as_ptr() as usize).is_multiple_of(128) {
            return Err(Violation::Misaligned {
                what: "segment base",
                offset: region.as_ptr() as u64,
            }
            .into());
        }
        // SAFETY: the region is at least a header long and 128-aligned.
        let snapshot = unsafe { HeaderSnapshot::read(region.as_ptr() as *const SegmentHeader) };
        let geometry = snapshot.validate(region.len() as u64, expected_epoch)?;
        Ok(LoaderSegment {
            region,
            snapshot,
            geometry,
            endpoints_taken: false,
        })
    }

    /// The header as read (once) at attach.
    pub fn info(&self) -> &HeaderSnapshot {
        &self.snapshot
    }

    /// The loader's ring ends: consumer of the ready ring, producer of the
    /// release ring. Returns `None` after the first call.
    pub fn take_endpoints(
        &mut self,
    ) -> Option<(Consumer<BatchDescriptor>, Producer<ReleaseDescriptor>)> {
        if self.endpoints_taken {
            return None;
        }
        self.endpoints_taken = true;
        let (ready, release) = ring_bases(&self.region, &self.geometry);
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.region.clone();
        // SAFETY: the geometry was validated to be exactly what the creator
        // lays out for these capacities and to fit inside the mapping, which
        // `keep` keeps alive; bases are 128-aligned; one pair per attach.
        let mut c = unsafe {
            consumer_from_raw(ready, self.geometry.ready_capacity, "ready", keep.clone())
        };
        // SAFETY: as above, for the release ring's only loader-side producer.
        let mut p =
            unsafe { producer_from_raw(release, self.geometry.release_capacity, "release", keep) };
        if self.snapshot.flags & crate::layout::SEGMENT_FLAG_ASYMMETRIC != 0 {
            c.set_barriers(Barriers::Loader);
            p.set_barriers(Barriers::Loader);
        }
        Some((c, p))
    }

    /// The session state word ([`crate::layout::state`]).
    pub fn state(&self) -> u32 {
        header(&self.region).state.load(Ordering::Acquire)
    }

    /// The violation code recorded when the session was fenced.
    pub fn violation(&self) -> u32 {
        header(&self.region).violation.load(Ordering::Relaxed)
    }

    /// The agent's last heartbeat: [`crate::monotonic_ms`] when it beat.
    /// Untrusted like everything the agent's side of the header holds; a
    /// loader compares it with its own [`crate::monotonic_ms`].
    pub fn heartbeat_ms(&self) -> u64 {
        header(&self.region).heartbeat_ms.load(Ordering::Relaxed)
    }

    /// How often the agent beats and expects this loader to, in
    /// milliseconds, as read at attach; 0: no liveness checks.
    pub fn heartbeat_interval_ms(&self) -> u64 {
        self.snapshot.heartbeat_interval_ms
    }

    /// Shows the agent that this loader is alive: adds 1 to the header's
    /// `loader_heartbeat` counter. Cheap (one relaxed atomic add); safe from
    /// any thread, also concurrently with the session's own calls.
    pub fn beat(&self) {
        header(&self.region)
            .loader_heartbeat
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Reports one `next_batch` that took `ns` nanoseconds (relaxed adds:
    /// the agent reads the words about once a second).
    pub fn report_wait(&self, ns: u64) {
        let h = header(&self.region);
        h.loader_wait_ns.fetch_add(ns, Ordering::Relaxed);
        h.loader_batches.fetch_add(1, Ordering::Relaxed);
        h.loader_wait_buckets[crate::layout::wait_bucket(ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// Reports that the calling thread was busy (on a CPU or waiting for
    /// one) `busy_ns` of the last `wall_ns` nanoseconds.
    pub fn report_busy(&self, busy_ns: u64, wall_ns: u64) {
        let h = header(&self.region);
        h.loader_busy_ns.fetch_add(busy_ns, Ordering::Relaxed);
        h.loader_busy_wall_ns.fetch_add(wall_ns, Ordering::Relaxed);
    }
}

/// The loader's reports in its segment header, as the agent read them: sums
/// since the session began, written by the loader alone, so nothing in them
/// is trusted beyond being numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoaderReport {
    /// Nanoseconds in `next_batch`.
    pub wait_ns: u64,
    /// `next_batch` calls that returned.
    pub batches: u64,
    /// Nanoseconds the loader's thread was busy (on a CPU or runnable).
    pub busy_ns: u64,
    /// Wall-clock nanoseconds `busy_ns` covers.
    pub busy_wall_ns: u64,
    /// Waits by [`crate::layout::WAIT_BUCKET_BOUNDS_US`].
    pub wait_buckets: [u64; crate::layout::WAIT_BUCKETS],
}

impl LoaderReport {
    /// What happened between `earlier` and `self`; `None` if any sum went
    /// down (a loader that writes nonsense). The calls are counted from the
    /// buckets, which a read racing the loader's adds keeps consistent with
    /// the histogram.
    pub fn since(&self, earlier: &LoaderReport) -> Option<LoaderReport> {
        let mut d = LoaderReport {
            wait_ns: self.wait_ns.checked_sub(earlier.wait_ns)?,
            batches: self.batches.checked_sub(earlier.batches)?,
            busy_ns: self.busy_ns.checked_sub(earlier.busy_ns)?,
            busy_wall_ns: self.busy_wall_ns.checked_sub(earlier.busy_wall_ns)?,
            ..LoaderReport::default()
        };
        let mut total = 0u64;
        for (i, b) in d.wait_buckets.iter_mut().enumerate() {
            *b = self.wait_buckets[i].checked_sub(earlier.wait_buckets[i])?;
            total = total.checked_add(*b)?;
        }
        d.batches = total;
        Some(d)
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    fn spec() -> SegmentSpec {
        SegmentSpec {
            session_id: 9,
            ready_capacity: 8,
            release_capacity: 16,
            arena_size: 1 << 20,
            instance_epoch: 0xfeed,
            heartbeat_interval_ms: 250,
        }
    }

    #[test]
    fn heap_segment_round_trip() {
        let mut a = AgentSegment::create_heap(spec()).unwrap();
        let mut l = LoaderSegment::attach_region(a.region().clone(), Some(0xfeed)).unwrap();
        assert_eq!(l.info().session_id, 9);
        assert_eq!(l.info().arena_size, 1 << 20);
        let (mut ready_p, mut release_c) = a.take_endpoints().unwrap();
        assert!(a.take_endpoints().is_none());
        let (mut ready_c, mut release_p) = l.take_endpoints().unwrap();
        let d = BatchDescriptor {
            seq: 1,
            token: 2,
            ..Default::default()
        };
        assert!(ready_p.try_push(d).unwrap());
        assert_eq!(ready_c.try_pop().unwrap(), Some(d));
        let r = ReleaseDescriptor { seq: 1, token: 2 };
        assert!(release_p.try_push(r).unwrap());
        assert_eq!(release_c.try_pop().unwrap(), Some(r));
        assert_eq!(l.state(), state::LIVE);
        a.fence(&Violation::BadField {
            field: "x",
            value: 1,
        });
        assert_eq!(l.state(), state::FENCED);
        assert_eq!(l.violation(), 3);
    }

    #[test]
    fn heartbeats_cross_in_both_directions() {
        let before = crate::monotonic_ms();
        let a = AgentSegment::create_heap(spec()).unwrap();
        let l = LoaderSegment::attach_region(a.region().clone(), Some(0xfeed)).unwrap();
        assert_eq!(l.heartbeat_interval_ms(), 250);
        assert_eq!(l.info().heartbeat_interval_ms, 250);
        // Creation stores a first agent heartbeat on the shared clock.
        let first = l.heartbeat_ms();
        assert!(first >= before && first <= crate::monotonic_ms(), "{first}");
        a.heartbeat(first + 7);
        assert_eq!(l.heartbeat_ms(), first + 7);
        // The loader's counter starts at zero and moves with every beat.
        assert_eq!(a.loader_heartbeat(), 0);
        l.beat();
        l.beat();
        assert_eq!(a.loader_heartbeat(), 2);
        let h = header(a.region());
        assert_eq!(h.reserved, [0; 1]);
    }

    #[test]
    fn loader_reports_reach_the_agent_and_nonsense_is_refused() {
        let a = AgentSegment::create_heap(spec()).unwrap();
        let l = LoaderSegment::attach_region(a.region().clone(), None).unwrap();
        let start = a.loader_report();
        assert_eq!(start, LoaderReport::default());
        l.report_wait(50_000); // 50 µs: bucket 0
        l.report_wait(3_000_000); // 3 ms: bucket 2
        l.report_wait(10_000_000_000); // 10 s: the last bucket
        l.report_busy(7, 10);
        let now = a.loader_report();
        let d = now.since(&start).unwrap();
        assert_eq!(d.batches, 3);
        assert_eq!(d.wait_ns, 10_003_050_000);
        assert_eq!((d.busy_ns, d.busy_wall_ns), (7, 10));
        assert_eq!(d.wait_buckets[0], 1);
        assert_eq!(d.wait_buckets[2], 1);
        assert_eq!(d.wait_buckets[crate::layout::WAIT_BUCKETS - 1], 1);
        // A loader that winds a sum back gets no interval.
        assert_eq!(start.since(&now), None);
    }

    #[test]
    fn wait_buckets_follow_their_bounds() {
        use crate::layout::{wait_bucket, WAIT_BUCKETS, WAIT_BUCKET_BOUNDS_US};
        assert_eq!(wait_bucket(0), 0);
        for (i, &b) in WAIT_BUCKET_BOUNDS_US.iter().enumerate() {
            assert_eq!(wait_bucket(b * 1_000), i, "at the bound {b} µs");
            assert_eq!(wait_bucket(b * 1_000 + 1), i + 1, "just above {b} µs");
        }
        assert_eq!(wait_bucket(u64::MAX), WAIT_BUCKETS - 1);
    }

    #[test]
    fn zero_interval_reads_back_as_zero() {
        let a = AgentSegment::create_heap(SegmentSpec {
            heartbeat_interval_ms: 0,
            ..spec()
        })
        .unwrap();
        let l = LoaderSegment::attach_region(a.region().clone(), None).unwrap();
        assert_eq!(l.heartbeat_interval_ms(), 0);
    }

    #[test]
    fn attach_rejects_wrong_epoch_and_garbage() {
        let a = AgentSegment::create_heap(spec()).unwrap();
        assert!(matches!(
            LoaderSegment::attach_region(a.region().clone(), Some(1)),
            Err(AttachError::StaleEpoch { .. })
        ));
        let junk = Arc::new(Region::heap(4096));
        assert!(matches!(
            LoaderSegment::attach_region(junk, None),
            Err(AttachError::BadMagic(0))
        ));
    }

    #[cfg(not(miri))]
    #[test]
    fn memfd_segment_attach_through_fd() {
        let a = AgentSegment::create_memfd(spec()).unwrap();
        let l = LoaderSegment::attach_fd(a.fd().unwrap(), Some(0xfeed)).unwrap();
        assert_eq!(l.info().segment_size, a.geometry().segment_size);
        let seals = crate::memfd::seals(a.fd().unwrap()).unwrap();
        assert_ne!(seals & crate::memfd::SEAL_SHRINK, 0);
        assert_ne!(seals & crate::memfd::SEAL_GROW, 0);
    }
}
