//! The grace for an owner that went away (`peers.owner_grace_ms`,
//! `peers/tier_grace.rs`): two engines in one process as the peers of one
//! job over TCP on 127.0.0.1; the owner's engine is dropped (its
//! connections close, as a killed agent's do) and, in some tests, started
//! again on the same port. The requester does not read the owner's samples
//! from the store while it waits, reads them from the owner once it is
//! back, reads them from the store when the grace ends, and reads a
//! sample its loader is blocked on after `peers.owner_grace_blocked_ms`.

use super::two_peers::{free_port, peers_toml, Engines};
use super::*;
use crate::engine::key;
use crate::engine::Engine;
use crate::peers::Route;
use std::time::Instant;

const OWNER: usize = 0;
const ASKER: usize = 1;

fn job_toml(me: usize, ports: [u16; 2], grace_ms: u64, blocked_ms: u64) -> String {
    let extra = format!(
        "transport = \"tcp\"\nhedge_after_ms = 20000\n\
         owner_grace_ms = {grace_ms}\nowner_grace_blocked_ms = {blocked_ms}"
    );
    peers_toml(me, ports, &extra)
}

struct Job {
    ports: [u16; 2],
    grace_ms: u64,
    blocked_ms: u64,
    /// By member index; the owner's is `None` while it is away.
    agents: [Option<Harness>; 2],
}

impl Engines for Job {
    fn turns(&mut self, n: usize) {
        for _ in 0..n {
            for h in self.agents.iter_mut().flatten() {
                h.engine.turn().unwrap();
            }
        }
    }
}

impl Job {
    fn start(grace_ms: u64, blocked_ms: u64) -> Job {
        let ports = [free_port(), free_port()];
        let mut job = Job {
            ports,
            grace_ms,
            blocked_ms,
            agents: [None, None],
        };
        job.start_agent(OWNER);
        job.start_agent(ASKER);
        job
    }

    fn start_agent(&mut self, me: usize) {
        let toml = job_toml(me, self.ports, self.grace_ms, self.blocked_ms);
        let h = harness_with(&toml, false, &[("fake", 0)]);
        h.auto(true);
        self.agents[me] = Some(h);
        self.until("the directory", |j| {
            j.agents[me]
                .as_ref()
                .is_some_and(|h| h.engine.peers.as_ref().unwrap().fingerprint_of(0).is_some())
        });
    }

    /// Drops the owner's engine: its listener and connections close.
    fn kill_owner(&mut self) {
        self.agents[OWNER] = None;
        self.until("the asker to see the owner go", |j| {
            let t = j.asker().peers.as_ref().unwrap();
            !t.is_up_for_test(OWNER)
        });
    }

    /// Turns the engines for `d`.
    fn run_for(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.turns(1);
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    fn asker(&mut self) -> &mut Engine {
        &mut self.agents[ASKER].as_mut().unwrap().engine
    }

    /// Samples the owner owns and keeps.
    fn owned(&self) -> Vec<u64> {
        let t = self.agents[ASKER].as_ref().unwrap().engine.peers.as_ref();
        let dir = t.unwrap().directory(0).expect("directory");
        (0..SAMPLES)
            .filter(|&i| dir.owner(i) == Some(OWNER) && dir.is_kept(i))
            .collect()
    }

    /// The asker reserves sample `i`'s extent and reads it where its
    /// request phase would (`route`); returns the route.
    fn read(&mut self, i: u64) -> Route {
        let e = self.asker();
        let route = e.peers.as_ref().unwrap().route(0, i);
        let r = e.cache.reserve(key(0, i), size(i)).unwrap();
        let (dest, len) = (r.extent.offset, size(i) as u32);
        match route {
            Route::Peer(m) => e.start_peer_get(m, key(0, i), dest, len),
            Route::Wait(m) => e.park_peer_get(m, key(0, i), dest, len, false, 0),
            Route::Store | Route::Keep => e.read_store_instead(crate::peers::PeerToken {
                key: key(0, i),
                dest,
                len,
            }),
        }
        route
    }

    fn ready(&self, i: u64) -> bool {
        let e = &self.agents[ASKER].as_ref().unwrap().engine;
        matches!(e.cache.lookup(key(0, i)), Lookup::Ready(_))
    }

    fn bytes(&self, i: u64) -> Vec<u8> {
        let e = &self.agents[ASKER].as_ref().unwrap().engine;
        let Lookup::Ready(r) = e.cache.lookup(key(0, i)) else {
            panic!("{i} is not ready");
        };
        e.arena.read_at(r.offset, r.len as usize).unwrap()
    }

    /// The asker's store reads of sample `i`.
    fn store_reads(&self, i: u64) -> u32 {
        let s = self.agents[ASKER].as_ref().unwrap().script.lock().unwrap();
        s.attempts.get(&i).copied().unwrap_or(0)
    }

    fn grace(&self, outcome: &str) -> u64 {
        let e = &self.agents[ASKER].as_ref().unwrap().engine;
        e.metrics.peers.grace_count(outcome)
    }
}

#[test]
fn reads_wait_for_an_owner_that_went_away_and_are_served_by_it_when_it_is_back() {
    let mut job = Job::start(4000, 4000);
    let owned = job.owned();
    assert!(
        owned.len() >= 4,
        "the owner keeps enough samples: {owned:?}"
    );
    // The connection is up: the first sample comes from the owner.
    assert_eq!(job.read(owned[0]), Route::Peer(OWNER));
    job.until("the first block", |j| j.ready(owned[0]));
    // A get in flight when the owner goes: its store read never ends, so
    // the get is still waiting when the connection drops.
    let held = owned[1];
    {
        let owner = job.agents[OWNER].as_ref().unwrap();
        owner.script.lock().unwrap().held.push(held);
    }
    assert_eq!(job.read(held), Route::Peer(OWNER));
    job.run_for(Duration::from_millis(100));
    assert!(!job.ready(held));

    job.kill_owner();
    // A new read of the owner's sample waits for it.
    let later = owned[2];
    assert_eq!(job.read(later), Route::Wait(OWNER));
    job.run_for(Duration::from_millis(1500));
    for i in [held, later] {
        assert!(!job.ready(i), "{i} waits for its owner");
        assert_eq!(job.store_reads(i), 0, "{i} is not read from the store");
    }
    assert_eq!(job.grace("parked"), 2, "the lost get and the new read");

    // The owner is back (a restarted agent, cold here): the asker's probe
    // finds it and the reads go to it.
    job.start_agent(OWNER);
    job.until("both samples from the owner", |j| {
        j.ready(held) && j.ready(later)
    });
    for i in [held, later] {
        assert_eq!(job.store_reads(i), 0, "{i} came from the owner");
        assert_eq!(job.bytes(i), content(i));
    }
    assert!(job.grace("returned") >= 2);
    assert_eq!(job.grace("expired") + job.grace("blocked"), 0);
    // And new reads go to it as before.
    assert_eq!(job.read(owned[3]), Route::Peer(OWNER));
    job.until("a read after the return", |j| j.ready(owned[3]));
    assert_eq!(job.store_reads(owned[3]), 0);
}

#[test]
fn an_owner_that_stays_away_is_read_from_the_store_when_its_grace_ends() {
    let mut job = Job::start(1500, 1500);
    let owned = job.owned();
    assert_eq!(job.read(owned[0]), Route::Peer(OWNER));
    job.until("the first block", |j| j.ready(owned[0]));
    let killed = Instant::now();
    job.kill_owner();
    assert_eq!(job.read(owned[1]), Route::Wait(OWNER));
    job.run_for(Duration::from_millis(1000));
    assert!(!job.ready(owned[1]));
    assert_eq!(job.store_reads(owned[1]), 0, "still within the grace");
    job.until("the store read after the grace", |j| j.ready(owned[1]));
    assert!(
        killed.elapsed() >= Duration::from_millis(1500),
        "not before the grace ended: {:?}",
        killed.elapsed()
    );
    assert_eq!(job.store_reads(owned[1]), 1);
    assert_eq!(job.bytes(owned[1]), content(owned[1]));
    assert_eq!(job.grace("expired"), 1);
    // The grace is over: the owner's samples go to the store as before
    // the grace (a dial that fails first, once the member's redial delay
    // has passed).
    assert_ne!(job.read(owned[2]), Route::Wait(OWNER));
    let t = Instant::now();
    job.until("a store read at once", |j| j.ready(owned[2]));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(job.store_reads(owned[2]), 1);
}

#[test]
fn without_a_grace_a_dropped_owners_samples_go_to_the_store_at_once() {
    let mut job = Job::start(0, 0);
    let owned = job.owned();
    assert_eq!(job.read(owned[0]), Route::Peer(OWNER));
    job.until("the first block", |j| j.ready(owned[0]));
    job.kill_owner();
    assert_eq!(job.read(owned[1]), Route::Store);
    job.until("the store read", |j| j.ready(owned[1]));
    assert_eq!(job.grace("parked"), 0);
}

#[test]
fn a_sample_a_loader_is_blocked_on_goes_to_the_store_and_the_others_wait() {
    // Blocked samples wait 300 ms; the others the whole grace (20 s).
    let mut job = Job::start(20_000, 300);
    let owned = job.owned();
    assert_eq!(job.read(owned[0]), Route::Peer(OWNER));
    job.until("the first block", |j| j.ready(owned[0]));
    job.kill_owner();

    // A session of 8-sample batches (a window of 1 batch, growing by one
    // per batch published): its first batch is what its loader waits for.
    let h = job.agents[ASKER].as_mut().unwrap();
    let (sid, mut loader) = h.open(8, 1);
    let loans = |j: &mut Job| j.asker().sessions[&sid].loans();
    let start = Instant::now();
    job.until("the first batch", |j| loans(j) >= 1);
    let first_took = start.elapsed();
    assert!(
        first_took >= Duration::from_millis(250) && first_took < Duration::from_secs(5),
        "the batch the loader waits on waited the blocked bound, not the grace: {first_took:?}"
    );

    // The loader has not taken it: the batch behind it is prepared, and
    // its owner's samples wait for the owner.
    job.run_for(Duration::from_millis(1000));
    let waiting: Vec<u64> = {
        let e = job.asker();
        let s = &e.sessions[&sid];
        assert_eq!(s.pending().len(), 1, "the second batch is prepared");
        s.pending()[0].slots.iter().map(|s| s.sample).collect()
    };
    let waiting: Vec<u64> = waiting
        .into_iter()
        .filter(|&i| owned.contains(&i) && !job.ready(i))
        .collect();
    assert!(!waiting.is_empty(), "the second batch holds owner samples");
    for &i in &waiting {
        assert_eq!(job.store_reads(i), 0, "{i} waits for its owner");
    }

    // The first batch's owner samples were read from the store.
    let first = loader.take();
    assert_eq!(first.len(), 1);
    let ids: Vec<u64> = first[0].1.iter().map(|e| e.sample_id - 1000).collect();
    for (e, &i) in first[0].1.iter().zip(&ids) {
        assert_eq!(loader.bytes(e), content(i));
    }
    let in_first: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|i| owned.contains(i) && *i != owned[0])
        .collect();
    assert!(
        !in_first.is_empty(),
        "the first batch holds owner samples: {ids:?} {owned:?}"
    );
    for &i in &in_first {
        assert_eq!(job.store_reads(i), 1, "{i} was read from the store");
    }
    assert_eq!(job.grace("blocked"), in_first.len() as u64);

    // Now the loader waits for the second batch: its owner samples go to
    // the store after the blocked bound too.
    let start = Instant::now();
    job.until("the second batch", |j| loans(j) >= 2);
    assert!(start.elapsed() < Duration::from_secs(5));
    for &i in &waiting {
        assert_eq!(job.store_reads(i), 1, "{i} was read from the store");
    }
}
