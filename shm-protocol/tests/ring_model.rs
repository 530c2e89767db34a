//! Property tests of the SPSC ring against a reference model.
//!
//! Random sequences of every ring operation run, single-threaded, against a
//! heap ring and against [`Model`]: a `VecDeque` bounded by the ring's
//! capacity plus the four indices the ring keeps (private tail, published
//! tail, private head, committed head) and the two cached peer indices. Every
//! return value must match the model, which makes these properties checked
//! after each step:
//!
//! * FIFO order, no loss and no duplication (also checked end to end by
//!   draining the ring after the sequence);
//! * full exactly when `capacity` items are staged, published or taken but
//!   not committed; empty exactly when nothing published is left to take;
//! * staged items are invisible to the consumer until `publish`;
//! * taken items keep their slots until `commit` (or `try_pop` / `pop_into`);
//! * `free` and `available` report exact counts whenever they say full or
//!   empty, and never more than the true count otherwise (the ends refresh a
//!   cached peer index only when their cached view says full or empty);
//! * the same holds for a segment's ready ring whose indices start anywhere,
//!   including just below `u64::MAX` (the indices wrap).
#![cfg(not(feature = "loom"))]

mod common;

use granary_shm::layout::{BatchDescriptor, RingControl, RingItem};
use granary_shm::ring::{heap_ring, Consumer, Producer};
use granary_shm::segment::{AgentSegment, LoaderSegment, SegmentSpec};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Clone, Debug)]
enum Op {
    Stage(u64),
    Publish,
    Push(u64),
    Take,
    Commit,
    Pop,
    PopInto(usize),
    Free,
    Available,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u64>().prop_map(Op::Stage),
        2 => Just(Op::Publish),
        4 => any::<u64>().prop_map(Op::Push),
        3 => Just(Op::Take),
        2 => Just(Op::Commit),
        3 => Just(Op::Pop),
        2 => (0usize..=80).prop_map(Op::PopInto),
        1 => Just(Op::Free),
        1 => Just(Op::Available),
    ]
}

fn capacity() -> impl Strategy<Value = u32> {
    (1u32..=6).prop_map(|shift| 1 << shift)
}

/// The reference ring: items of indices `committed..tail` in a bounded
/// `VecDeque`, and the indices that tell staged, published, taken and
/// committed apart.
struct Model {
    capacity: u64,
    /// Values of indices `committed..tail`, oldest first.
    items: VecDeque<u64>,
    tail: u64,
    published: u64,
    head: u64,
    committed: u64,
    /// The producer's view of `committed`, refreshed only when it says full.
    cached_head: u64,
    /// The consumer's view of `published`, refreshed only when it says empty.
    cached_tail: u64,
}

/// Distance from `from` to `to` on the free-running (modulo 2^64) indices.
fn dist(from: u64, to: u64) -> u64 {
    to.wrapping_sub(from)
}

impl Model {
    /// An empty ring whose indices all start at `start`.
    fn new(capacity: u32, start: u64) -> Model {
        Model {
            capacity: u64::from(capacity),
            items: VecDeque::with_capacity(capacity as usize),
            tail: start,
            published: start,
            head: start,
            committed: start,
            cached_head: start,
            cached_tail: start,
        }
    }

    fn check_invariants(&self) {
        let used = dist(self.committed, self.tail);
        assert!(dist(self.committed, self.head) <= used);
        assert!(dist(self.committed, self.published) <= used);
        assert!(dist(self.head, self.published) <= used);
        assert!(used <= self.capacity);
        assert_eq!(self.items.len() as u64, used);
        assert!(self.items.capacity() >= self.capacity as usize);
    }

    fn truly_full(&self) -> bool {
        dist(self.committed, self.tail) == self.capacity
    }

    fn true_free(&self) -> usize {
        (self.capacity - dist(self.committed, self.tail)) as usize
    }

    fn true_available(&self) -> usize {
        dist(self.head, self.published) as usize
    }

    fn free(&mut self) -> usize {
        if dist(self.cached_head, self.tail) == self.capacity {
            self.cached_head = self.committed;
        }
        (self.capacity - dist(self.cached_head, self.tail)) as usize
    }

    fn try_stage(&mut self, v: u64) -> bool {
        if self.free() == 0 {
            return false;
        }
        self.items.push_back(v);
        self.tail = self.tail.wrapping_add(1);
        true
    }

    fn publish(&mut self) {
        self.published = self.tail;
    }

    fn available(&mut self) -> usize {
        if self.head == self.cached_tail {
            self.cached_tail = self.published;
        }
        dist(self.head, self.cached_tail) as usize
    }

    fn try_take(&mut self) -> Option<u64> {
        if self.available() == 0 {
            return None;
        }
        let v = self.items[dist(self.committed, self.head) as usize];
        self.head = self.head.wrapping_add(1);
        Some(v)
    }

    fn commit(&mut self) {
        for _ in 0..dist(self.committed, self.head) {
            self.items.pop_front();
        }
        self.committed = self.head;
    }
}

/// Runs `ops` against a heap ring of `capacity` items of `T` and the model;
/// `make` turns a model value into a ring item (injective).
fn run<T>(capacity: u32, ops: &[Op], make: impl Fn(u64) -> T)
where
    T: RingItem + PartialEq + Debug,
{
    let (p, c): (Producer<T>, Consumer<T>) = heap_ring(capacity, "model");
    run_ends(p, c, 0, ops, make);
}

/// Runs `ops` against the two ends of an empty ring whose indices start at
/// `start`, and against the model.
fn run_ends<T>(
    mut p: Producer<T>,
    mut c: Consumer<T>,
    start: u64,
    ops: &[Op],
    make: impl Fn(u64) -> T,
) where
    T: RingItem + PartialEq + Debug,
{
    let capacity = p.capacity() as u32;
    assert_eq!(c.capacity(), p.capacity());
    p.set_spin(Duration::ZERO);
    c.set_spin(Duration::ZERO);
    let mut m = Model::new(capacity, start);
    let mut accepted: Vec<u64> = Vec::new();
    let mut delivered: Vec<u64> = Vec::new();
    let mut buf = [T::default(); 80];

    for (step, op) in ops.iter().enumerate() {
        let ctx = || format!("step {step}: {op:?}");
        match *op {
            Op::Stage(v) => {
                let want = m.try_stage(v);
                assert_eq!(p.try_stage(make(v)).unwrap(), want, "{}", ctx());
                if want {
                    accepted.push(v);
                } else {
                    assert!(m.truly_full(), "{}: refused while not full", ctx());
                }
            }
            Op::Publish => {
                m.publish();
                p.publish();
            }
            Op::Push(v) => {
                let want = m.try_stage(v);
                if want {
                    m.publish();
                    accepted.push(v);
                }
                assert_eq!(p.try_push(make(v)).unwrap(), want, "{}", ctx());
            }
            Op::Take => {
                let want = m.try_take();
                assert_eq!(c.try_take().unwrap(), want.map(&make), "{}", ctx());
                delivered.extend(want);
            }
            Op::Commit => {
                m.commit();
                c.commit();
            }
            Op::Pop => {
                let want = m.try_take();
                if want.is_some() {
                    m.commit();
                }
                assert_eq!(c.try_pop().unwrap(), want.map(&make), "{}", ctx());
                delivered.extend(want);
            }
            Op::PopInto(n) => {
                let want: Vec<u64> = std::iter::from_fn(|| m.try_take()).take(n).collect();
                m.commit();
                let got = c.pop_into(&mut buf[..n]).unwrap();
                assert_eq!(got, want.len(), "{}", ctx());
                let want_items: Vec<T> = want.iter().map(|&v| make(v)).collect();
                assert_eq!(&buf[..got], &want_items[..], "{}", ctx());
                delivered.extend(want);
            }
            Op::Free => {
                let want = m.free();
                let got = p.free().unwrap();
                assert_eq!(got, want, "{}", ctx());
                assert!(got <= m.true_free(), "{}", ctx());
                assert_eq!(got == 0, m.truly_full(), "{}", ctx());
            }
            Op::Available => {
                let want = m.available();
                let got = c.available().unwrap();
                assert_eq!(got, want, "{}", ctx());
                assert!(got <= m.true_available(), "{}", ctx());
                assert_eq!(got == 0, m.true_available() == 0, "{}", ctx());
            }
        }
        m.check_invariants();
        assert_eq!(p.tail(), m.tail, "{}", ctx());
        assert_eq!(p.staged() as u64, dist(m.published, m.tail), "{}", ctx());
        assert_eq!(c.head(), m.head, "{}", ctx());
    }

    // Drain: publish what is staged, commit what is taken, pop the rest.
    p.publish();
    m.publish();
    c.commit();
    m.commit();
    loop {
        let want = m.try_take();
        if want.is_some() {
            m.commit();
        }
        let got = c.try_pop().unwrap();
        assert_eq!(got, want.map(&make), "drain");
        match want {
            Some(v) => delivered.push(v),
            None => break,
        }
    }
    assert_eq!(
        delivered, accepted,
        "every accepted item arrives once, in order"
    );
    // Empty again; every slot is free (the producer's cached view may lag
    // until it next sees the ring full, exactly as the model's does).
    assert_eq!(c.available().unwrap(), 0);
    assert_eq!(m.tail, m.committed);
    assert_eq!(p.free().unwrap(), m.free());
    while p.try_stage(make(0)).unwrap() {}
    assert_eq!(
        p.staged(),
        capacity as usize,
        "a drained ring takes `capacity` items"
    );
}

fn batch(v: u64) -> BatchDescriptor {
    BatchDescriptor {
        seq: v,
        token: !v,
        table_offset: v.rotate_left(17),
        batch_index: v ^ 0x5555,
        total_bytes: v.wrapping_mul(3),
        epoch: (v >> 32) as u32,
        sample_count: v as u32,
        status: (v >> 7) as i32,
        flags: (v >> 40) as u32,
        reserved: v.swap_bytes(),
    }
}

/// The ready ring of a heap segment whose indices were left at `start` (as a
/// long-lived session, or a hostile peer, may leave them): the agent's
/// producer and a loader's consumer.
fn segment_ready_ring(
    capacity: u32,
    start: u64,
) -> (Producer<BatchDescriptor>, Consumer<BatchDescriptor>) {
    let mut agent = AgentSegment::create_heap(SegmentSpec {
        session_id: 1,
        ready_capacity: capacity,
        release_capacity: 2,
        arena_size: 0,
        instance_epoch: 5,
        heartbeat_interval_ms: 0,
    })
    .expect("heap segment");
    let ctrl = agent
        .region()
        .as_ptr()
        .wrapping_add(agent.geometry().ready_offset as usize)
        .cast::<RingControl>();
    // SAFETY: the ready ring's control block lies at ready_offset inside the
    // live heap region, 128-byte aligned; its index words are atomics.
    let ctrl = unsafe { &*ctrl };
    ctrl.producer.tail.store(start, Ordering::Relaxed);
    ctrl.consumer.head.store(start, Ordering::Relaxed);
    let (p, _release) = agent.take_endpoints().expect("agent endpoints");
    let mut loader =
        LoaderSegment::attach_region(agent.region().clone(), Some(5)).expect("attach heap segment");
    let (c, _release) = loader.take_endpoints().expect("loader endpoints");
    (p, c)
}

fn start_index() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        (0u64..300).prop_map(|k| u64::MAX - k),
        any::<u64>(),
    ]
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 512 },
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn ring_of_u64_matches_model(cap in capacity(), ops in prop::collection::vec(op(), 0..400)) {
        let _w = granary_testkit::watchdog("ring_of_u64_matches_model", Duration::from_secs(60));
        run(cap, &ops, |v| v);
    }

    #[test]
    fn ring_of_batch_descriptors_matches_model(
        cap in capacity(),
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let _w = granary_testkit::watchdog("ring_of_batch_descriptors_matches_model", Duration::from_secs(60));
        run(cap, &ops, batch);
    }

    #[test]
    fn segment_ring_from_any_start_index_matches_model(
        cap in capacity(),
        start in start_index(),
        ops in prop::collection::vec(op(), 0..300),
    ) {
        let _w = granary_testkit::watchdog("segment_ring_from_any_start_index", Duration::from_secs(60));
        let (p, c) = segment_ready_ring(cap, start);
        run_ends(p, c, start, &ops, batch);
    }
}

/// A long deterministic run that wraps the free-running indices many times
/// around small rings (the random sequences above rarely go past a few
/// hundred items).
#[test]
fn long_run_wraps_many_times() {
    let _w = granary_testkit::watchdog("long_run_wraps_many_times", Duration::from_secs(60));
    let mut rng = common::SplitMix(0x0dd_c0ffee);
    for cap in [2u32, 4, 8, 64] {
        let ops: Vec<Op> = (0..20_000)
            .map(|_| match rng.next_u64() % 9 {
                0 => Op::Stage(rng.next_u64()),
                1 => Op::Publish,
                2 | 3 => Op::Push(rng.next_u64()),
                4 => Op::Take,
                5 => Op::Commit,
                6 => Op::Pop,
                7 => Op::PopInto((rng.next_u64() % 70) as usize),
                _ => {
                    if rng.next_u64().is_multiple_of(2) {
                        Op::Free
                    } else {
                        Op::Available
                    }
                }
            })
            .collect();
        run(cap, &ops, |v| v);
    }
}
