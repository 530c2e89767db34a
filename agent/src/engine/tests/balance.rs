//! `prefetch.balance`: with reads scarce, a session that has nothing ready
//! gets its reads before one that is batches ahead (`"stall"`), where the
//! older session takes them all first (`"static"`).

use super::*;

/// A harness over one fake dataset of `n` samples whose source takes
/// `capacity` reads at a time.
fn harness_of(n: u64, capacity: u32, extra: &str) -> Harness {
    harness_sized(extra, false, &[("fake", 0)], n, capacity)
}

/// Session A (opened first, batches ahead of its loader) and session B
/// (just opened, nothing ready) both want reads; the source takes 8 at a
/// time. Returns (A's, B's) samples requested after the turn in which both
/// want them, and the batch's size.
fn contend(balance: &str) -> (usize, usize) {
    // 4,096 samples: what B reads first is not what A read before.
    let mut h = harness_of(4096, 8, &format!("balance = \"{balance}\""));
    let (a, mut la) = h.open(4, 20);
    h.auto(true);
    // A's loader consumes a batch every 10 ms for a while (its rate is
    // learnt), then stops: its window fills with 4 ready batches.
    for _ in 0..30 {
        h.turns(1);
        la.take_and_give_back();
        h.clock.advance(Duration::from_millis(10));
    }
    h.turns(20);
    let sa = &h.engine.sessions[&a];
    assert!(sa.pending().is_empty() && sa.loans() == 4, "{sa:?}");
    h.auto(false);
    let (b, _lb) = h.open_with(OpenSession {
        seed: 5,
        ..request("fake", 4, 20, 0)
    });
    // A's loader takes two batches and releases them: A wants two
    // batches (8 reads) with two ready; B wants its first batch (4 reads)
    // with nothing ready.
    let taken = la.take();
    for (d, _) in taken.iter().take(2) {
        la.give_back(d);
    }
    h.turns(1);
    let requested = |sid: u64| -> usize {
        h.engine.sessions[&sid]
            .pending()
            .iter()
            .map(|p| p.requested)
            .sum()
    };
    (requested(a), requested(b))
}

#[test]
fn the_session_nearest_a_stall_is_read_first() {
    let (a, b) = contend("stall");
    // B's whole first batch is being read; A got the rest of the 8 reads
    // (more only where a sample of its is one B reads).
    assert_eq!(b, 4, "B's first batch");
    assert!((4..8).contains(&a), "A requested {a}");
    let (a, b) = contend("static");
    assert_eq!(a, 8, "A, opened first, takes its two batches");
    assert!(b < 4, "B waits: {b} of its 4 samples requested");
}
