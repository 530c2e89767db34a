//! Loom models of the ring and of segment header publication.
//!
//! Built only with the crate feature `loom`, which swaps the ring's atomics,
//! slots and futex for loom's, so these models check the code that ships:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 cargo test --release -p granary-shm --features loom --test loom
//! ```
//!
//! Loom runs every interleaving (up to the preemption bound) and every value
//! a load may legally return under the C++ memory model. A slot read that is
//! not ordered after its write (or a write not ordered after the previous
//! read) is reported as a causality violation; a lost wake-up leaves a thread
//! parked on the modelled futex forever, which loom reports as a deadlock.
#![cfg(feature = "loom")]

mod common;

use granary_shm::error::AttachError;
use granary_shm::layout::{LAYOUT_VERSION, SEGMENT_MAGIC};
use granary_shm::ring::{heap_ring, Consumer, Producer};
use granary_shm::segment::model::ModelSegment;
use granary_shm::segment::SegmentSpec;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

/// Default preemption bound when `LOOM_MAX_PREEMPTIONS` is not set.
const DEFAULT_PREEMPTIONS: usize = 3;

/// Runs `f` under loom with a bounded number of preemptions and a watchdog.
fn model<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let _w = granary_testkit::watchdog(name, Duration::from_secs(240));
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    b.check(f);
}

fn ring(capacity: u32) -> (Producer<u64>, Consumer<u64>) {
    let (mut p, mut c) = heap_ring::<u64>(capacity, "loom");
    p.set_spin(Duration::ZERO);
    c.set_spin(Duration::ZERO);
    (p, c)
}

/// Pushes `items` with `try_push`, yielding while the ring is full.
fn push_spinning(p: &mut Producer<u64>, items: std::ops::Range<u64>) {
    for v in items {
        while !p.try_push(v).expect("no violation") {
            thread::yield_now();
        }
    }
}

/// Pops `n` items with `try_pop`, yielding while the ring is empty, and
/// checks they are `0..n` in order.
fn pop_spinning(c: &mut Consumer<u64>, n: u64) {
    let mut next = 0;
    while next < n {
        match c.try_pop().expect("no violation") {
            Some(v) => {
                assert_eq!(v, next, "FIFO order");
                next += 1;
            }
            None => thread::yield_now(),
        }
    }
}

/// Two items through a roomy ring: every item arrives once, in order, and
/// each slot read is ordered after its write (pair (A)).
#[test]
fn push_pop() {
    model("push_pop", || {
        let (mut p, mut c) = ring(4);
        let h = thread::spawn(move || push_spinning(&mut p, 0..2));
        pop_spinning(&mut c, 2);
        h.join().unwrap();
        assert_eq!(c.try_pop().unwrap(), None);
    });
}

/// Four items through a two-slot ring: indices wrap and every slot is
/// reused; the producer's reuse must be ordered after the consumer's read
/// (pair (B)), or loom reports the slot write as racing the read.
#[test]
fn wrap_around() {
    model("wrap_around", || {
        let (mut p, mut c) = ring(2);
        let h = thread::spawn(move || push_spinning(&mut p, 0..4));
        pop_spinning(&mut c, 4);
        h.join().unwrap();
    });
}

/// A full ring: the producer fills both slots, then must wait for space
/// while the consumer holds a taken-but-uncommitted item; the third item
/// lands only after the commit.
#[test]
fn full_producer_waits_for_space() {
    model("full_producer_waits_for_space", || {
        let (mut p, mut c) = ring(2);
        let h = thread::spawn(move || {
            assert!(p.try_push(0).unwrap());
            assert!(p.try_push(1).unwrap());
            while !p.try_push(2).unwrap() {
                thread::yield_now();
            }
        });
        let first = loop {
            if let Some(v) = c.try_take().unwrap() {
                break v;
            }
            thread::yield_now();
        };
        assert_eq!(first, 0);
        // Not committed yet: the producer cannot have reused slot 0.
        thread::yield_now();
        c.commit();
        let mut next = 1;
        while next < 3 {
            match c.try_pop().unwrap() {
                Some(v) => {
                    assert_eq!(v, next);
                    next += 1;
                }
                None => thread::yield_now(),
            }
        }
        h.join().unwrap();
    });
}

/// An empty ring: the consumer polls before anything is published and never
/// sees more than was published, nor an item twice.
#[test]
fn empty_consumer_waits() {
    model("empty_consumer_waits", || {
        let (mut p, mut c) = ring(4);
        let h = thread::spawn(move || {
            thread::yield_now();
            push_spinning(&mut p, 0..2);
        });
        let mut next = 0;
        while next < 2 {
            let avail = c.available().unwrap();
            assert!(
                avail <= (2 - next) as usize,
                "more available than published"
            );
            if avail == 0 {
                thread::yield_now();
                continue;
            }
            assert_eq!(c.try_pop().unwrap(), Some(next));
            next += 1;
        }
        h.join().unwrap();
        assert_eq!(c.available().unwrap(), 0);
    });
}

/// The consumer parks at once (no spinning) while the producer pushes: the
/// waiting-flag / fence / re-check protocol (C) must never lose a wake-up,
/// which here would leave the consumer parked forever (a loom deadlock).
#[test]
fn blocking_pop_parks_and_is_woken() {
    model("blocking_pop_parks_and_is_woken", || {
        let (mut p, mut c) = ring(4);
        let h = thread::spawn(move || {
            assert!(p.try_push(0).unwrap());
            assert!(p.try_push(1).unwrap());
        });
        assert_eq!(c.pop_blocking(None), Ok(0));
        assert_eq!(c.pop_blocking(None), Ok(1));
        h.join().unwrap();
    });
}

/// The barriers production uses when the agent registered for `membarrier`
/// (`SEGMENT_FLAG_ASYMMETRIC`): the agent publishes with a compiler fence
/// only, the loader parks at once and calls the modelled `membarrier`, which
/// the agent's thread serves with a full barrier at one of its interrupt
/// points (`barrier::model`). No wake-up may be lost wherever it lands.
#[test]
fn asymmetric_blocking_pop_parks_and_is_woken() {
    use granary_shm::barrier::{model as interrupts, Barriers};
    model("asymmetric_blocking_pop_parks_and_is_woken", || {
        let (mut p, mut c) = ring(4);
        p.set_barriers(Barriers::Agent);
        c.set_barriers(Barriers::Loader);
        let h = thread::spawn(move || {
            for v in 0..2 {
                interrupts::interrupt_point(); // before the index store
                assert!(p.try_push(v).unwrap()); // in after_publish: between store and flag load
                interrupts::interrupt_point(); // after the flag load
            }
            interrupts::agent_exit();
        });
        assert_eq!(c.pop_blocking(None), Ok(0));
        assert_eq!(c.pop_blocking(None), Ok(1));
        h.join().unwrap();
    });
}

/// The producer parks at once on a full two-slot ring while the consumer
/// pops with `try_pop`: the consumer's commit must wake it.
#[test]
fn blocking_push_parks_and_is_woken() {
    model("blocking_push_parks_and_is_woken", || {
        let (mut p, mut c) = ring(2);
        let h = thread::spawn(move || {
            for v in 0..3 {
                p.push_blocking(v, None).unwrap();
            }
        });
        pop_spinning(&mut c, 3);
        h.join().unwrap();
    });
}

/// Both ends park: blocking push into a two-slot ring against blocking pop.
#[test]
fn blocking_both_ends() {
    model("blocking_both_ends", || {
        let (mut p, mut c) = ring(2);
        let h = thread::spawn(move || {
            for v in 0..3 {
                p.push_blocking(v, None).unwrap();
            }
        });
        for v in 0..3 {
            assert_eq!(c.pop_blocking(None), Ok(v));
        }
        h.join().unwrap();
    });
}

/// Batched publication: three staged items become visible together with
/// one store of the tail, never one by one, and `pop_into` commits them
/// with one store of the head.
#[test]
fn batched_publication() {
    model("batched_publication", || {
        let (mut p, mut c) = ring(4);
        let h = thread::spawn(move || {
            for v in 0..3 {
                assert!(p.try_stage(v).unwrap());
            }
            p.publish();
            p
        });
        let mut buf = [u64::MAX; 4];
        loop {
            match c.available().unwrap() {
                0 => thread::yield_now(),
                3 => break,
                n => panic!("saw {n} of 3 items published together"),
            }
        }
        assert_eq!(c.pop_into(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], &[0, 1, 2]);
        // One commit freed all three slots: four items fit again.
        let mut p = h.join().unwrap();
        for v in 3..7 {
            assert!(p.try_stage(v).unwrap());
        }
        assert!(!p.try_stage(7).unwrap());
    });
}

/// Segment bring-up: the creator fills the header fields and stores the
/// identity words last (magic with release); a concurrent attach that loads
/// the right magic (acquire) must see every field and the right version and
/// epoch, and one that does not gets `BadMagic` without touching the fields.
#[test]
fn header_publish_attach() {
    const EPOCH: u64 = 0x5eed_f00d;
    let spec = SegmentSpec {
        session_id: 42,
        ready_capacity: 8,
        release_capacity: 16,
        arena_size: 1 << 20,
        instance_epoch: EPOCH,
        heartbeat_interval_ms: 100,
    };
    model("header_publish_attach", move || {
        let seg = Arc::new(ModelSegment::new());
        let creator = Arc::clone(&seg);
        let h = thread::spawn(move || creator.create(spec));
        match seg.attach(Some(EPOCH)) {
            Ok((snap, g)) => {
                assert_eq!(snap.magic, SEGMENT_MAGIC);
                assert_eq!(snap.layout_version, LAYOUT_VERSION);
                assert_eq!(snap.instance_epoch, EPOCH);
                assert_eq!(snap.session_id, 42);
                assert_eq!(snap.arena_size, 1 << 20);
                assert_eq!(snap.heartbeat_interval_ms, 100);
                assert_eq!((g.ready_capacity, g.release_capacity), (8, 16));
            }
            Err(AttachError::BadMagic(0)) => {}
            Err(e) => panic!("attach during creation returned {e:?}"),
        }
        h.join().unwrap();
        let (snap, _) = seg.attach(Some(EPOCH)).expect("attach after creation");
        assert_eq!(snap.session_id, 42);
    });
}
