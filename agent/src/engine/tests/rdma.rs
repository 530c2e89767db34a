//! Two engines in one process as the peers of one job, their TCP
//! transports on 127.0.0.1 and their RDMA links on one fake fabric, each
//! with its whole arena registered in place: the queue pairs are set up
//! over the authenticated TCP connection, a block a loader needs lands by
//! RDMA write in the requester's arena extent and reaches the loader byte
//! for byte, an error completion sends a request over TCP and a late one
//! to the store, and RDMA comes back after the probe.

use super::two_peers::{free_port, peers_toml, Engines};
use super::*;
use crate::engine::key;
use crate::engine::Engine;
use crate::peers::transport::{LinkTransport, Nic, OpenNic};
use granary_rdma::fake::Fabric;
use granary_rdma::verbs::{Opcode, WcStatus};
use std::sync::Arc;

/// The requester: member 1. The owner: member 0 (it offers the queue
/// pair, being the lower index, on a connection it accepted).
const OWNER: usize = 0;
const ASKER: usize = 1;
/// Fabric hosts, in the order the engines opened their NICs.
const OWNER_HOST: usize = 0;
const ASKER_HOST: usize = 1;
const HEDGE_MS: u64 = 400;

/// RDMA carries payloads in clear: only on trusted fabrics.
fn job_toml(me: usize, ports: [u16; 2]) -> String {
    let extra = format!("hedge_after_ms = {HEDGE_MS}\nencryption = \"off\"");
    peers_toml(me, ports, &extra)
}

struct Job {
    fabric: Fabric,
    /// By member index.
    agents: Vec<Harness>,
}

impl Engines for Job {
    fn turns(&mut self, n: usize) {
        for _ in 0..n {
            for h in &mut self.agents {
                h.engine.turn().unwrap();
            }
        }
    }
}

impl Job {
    fn start() -> Job {
        let ports = [free_port(), free_port()];
        let fabric = Fabric::new(11);
        let mut agents = Vec::new();
        for me in [OWNER, ASKER] {
            let mut h = harness_with(&job_toml(me, ports), false, &[("fake", 0)]);
            h.auto(true);
            let f = fabric.clone();
            let open: OpenNic = Arc::new(move || Ok(Box::new(f.add_host()) as Nic));
            h.engine.restart_peers_over(open);
            agents.push(h);
        }
        let mut job = Job { fabric, agents };
        job.turns(2);
        // Directories are computed off the engine thread.
        job.until("both directories", |j| {
            j.agents
                .iter()
                .all(|h| h.engine.peers.as_ref().unwrap().fingerprint_of(0).is_some())
        });
        job
    }

    fn asker(&mut self) -> &mut Engine {
        &mut self.agents[ASKER].engine
    }

    fn asker_tier(&mut self) -> &mut crate::peers::PeerTier {
        self.asker().peers.as_mut().expect("the asker's peer tier")
    }

    fn link(&self) -> LinkTransport {
        self.agents[ASKER]
            .engine
            .peers
            .as_ref()
            .unwrap()
            .link(OWNER)
    }

    fn owner_link(&self) -> LinkTransport {
        let t = self.agents[OWNER].engine.peers.as_ref().unwrap();
        t.link(ASKER)
    }

    /// Samples the owner owns and keeps.
    fn owned(&self) -> Vec<u64> {
        let t = self.agents[ASKER].engine.peers.as_ref().unwrap();
        let dir = t.directory(0).expect("directory");
        (0..SAMPLES)
            .filter(|&i| dir.owner(i) == Some(OWNER) && dir.is_kept(i))
            .collect()
    }

    /// The asker reserves sample `i`'s extent and asks the owner for it
    /// (as its request phase does); returns the extent's offset.
    fn ask(&mut self, i: u64) -> u64 {
        let e = self.asker();
        let r = e.cache.reserve(key(0, i), size(i)).unwrap();
        e.start_peer_get(OWNER, key(0, i), r.extent.offset, size(i) as u32);
        r.extent.offset
    }

    fn ready(&self, i: u64) -> bool {
        matches!(
            self.agents[ASKER].engine.cache.lookup(key(0, i)),
            Lookup::Ready(_)
        )
    }

    /// The asker's bytes of sample `i` at `offset`.
    fn bytes_at(&self, offset: u64, i: u64) -> Vec<u8> {
        let e = &self.agents[ASKER].engine;
        e.arena.read_at(offset, size(i) as usize).unwrap()
    }

    fn store_reads(&self, member: usize, i: u64) -> u32 {
        let s = self.agents[member].script.lock().unwrap();
        s.attempts.get(&i).copied().unwrap_or(0)
    }

    fn peer_samples(&self) -> u64 {
        self.agents[ASKER].engine.metrics.peers.peer_samples.get()
    }
}

/// The asker's `granary_peer_transport{peer="n0",transport=...}`.
fn transport_metric(job: &Job, transport: &str) -> f64 {
    let text = job.agents[ASKER].engine.metrics.render();
    crate::metrics::parse_text(&text)
        .into_iter()
        .find(|(name, _)| {
            name.starts_with("granary_peer_transport{")
                && name.contains(r#"peer="n0""#)
                && name.contains(&format!(r#"transport="{transport}""#))
        })
        .map_or(-1.0, |(_, v)| v)
}

#[test]
fn blocks_go_by_rdma_write_into_the_arena_and_fall_back_to_tcp_and_the_store() {
    let mut job = Job::start();
    let owned = job.owned();
    assert!(
        owned.len() >= 12,
        "the owner keeps enough samples: {owned:?}"
    );
    assert_eq!(job.link(), LinkTransport::RdmaFallback, "no queue pair yet");

    // The first request goes over TCP and opens the connection; the queue
    // pair is set up over it.
    let first = owned[0];
    let at = job.ask(first);
    job.until("the first block over TCP", |j| j.ready(first));
    assert_eq!(job.bytes_at(at, first), content(first));
    job.until("the RDMA link, both ways", |j| {
        j.link() == LinkTransport::Rdma && j.owner_link() == LinkTransport::Rdma
    });
    assert_eq!(job.fabric.stats().writes, 0, "the first block came by TCP");

    // Blocks by RDMA write, straight into the reserved extents.
    let batch = &owned[1..6];
    let extents: Vec<u64> = batch.iter().map(|&i| job.ask(i)).collect();
    job.until("five blocks by RDMA", |j| batch.iter().all(|&i| j.ready(i)));
    assert_eq!(job.fabric.stats().writes, 5, "one RDMA write per block");
    for (&i, &at) in batch.iter().zip(&extents) {
        assert_eq!(job.bytes_at(at, i), content(i), "sample {i} in its extent");
        assert_eq!(job.store_reads(ASKER, i), 0, "sample {i} not read here");
        assert_eq!(job.store_reads(OWNER, i), 1, "sample {i} read once");
    }
    assert_eq!(job.peer_samples(), 6);
    assert_eq!(transport_metric(&job, "rdma"), 1.0);
    assert_eq!(transport_metric(&job, "rdma-fallback"), 0.0);

    // A block whose bytes were corrupted on the way fails its CRC and is
    // read from the store into the same extent.
    job.fabric.corrupt_next_write(OWNER_HOST);
    let bad = owned[9];
    let at = job.ask(bad);
    job.until("the corrupted block from the store", |j| j.ready(bad));
    assert_eq!(job.fabric.stats().writes, 6, "it was written");
    assert_eq!(job.store_reads(ASKER, bad), 1, "then read from the store");
    assert_eq!(job.bytes_at(at, bad), content(bad));
    let m = &job.agents[ASKER].engine.metrics.peers;
    assert_eq!(m.crc_failures.get(), 1);
    // A sample the owner does not own: a miss over the queue pair, then
    // the store.
    let theirs = (0..SAMPLES).find(|i| !owned.contains(i)).unwrap();
    let at = job.ask(theirs);
    job.until("the missed sample from the store", |j| j.ready(theirs));
    assert_eq!(job.store_reads(ASKER, theirs), 1);
    assert_eq!(job.bytes_at(at, theirs), content(theirs));
    assert_eq!(job.fabric.stats().writes, 6, "no block for a miss");
    assert_eq!(job.link(), LinkTransport::Rdma, "the link stays up");
    assert_eq!(job.peer_samples(), 6);

    // An error completion on the asker's next send: the queue pair goes
    // down and the request, not yet due, goes over TCP.
    job.fabric.inject(
        ASKER_HOST,
        None,
        Some(Opcode::Send),
        WcStatus::RetryExceeded,
    );
    let tcp = owned[6];
    let at = job.ask(tcp);
    job.until("the request back over TCP", |j| j.ready(tcp));
    assert_eq!(job.bytes_at(at, tcp), content(tcp));
    assert_eq!(job.store_reads(ASKER, tcp), 0, "came from the peer, by TCP");
    assert_eq!(job.fabric.stats().writes, 6, "no RDMA write for it");
    assert_eq!(job.fabric.stats().injected, 1);
    assert_eq!(job.peer_samples(), 7);

    // RDMA comes back once the backoff is over: the asker probes.
    job.until("the RDMA link again", |j| j.link() == LinkTransport::Rdma);
    let again = owned[7];
    let at = job.ask(again);
    job.until("a block by RDMA again", |j| j.ready(again));
    assert_eq!(job.bytes_at(at, again), content(again));
    assert_eq!(job.fabric.stats().writes, 7);

    // An owner that stops answering: the transfer timeout (the hedge
    // delay) tears the queue pair down first, and the request, now past
    // due, is read from the store into the same extent.
    job.fabric.hold(OWNER_HOST, true);
    let late = owned[8];
    let at = job.ask(late);
    job.until("the late request from the store", |j| j.ready(late));
    assert_eq!(job.store_reads(ASKER, late), 1, "read from the store");
    assert_eq!(job.bytes_at(at, late), content(late));
    job.fabric.hold(OWNER_HOST, false);
    job.turns(20);
    assert_eq!(
        job.fabric.stats().writes,
        7,
        "nothing landed after the fallback"
    );
    assert_eq!(job.bytes_at(at, late), content(late));

    // A loader of the asker gets every sample byte for byte, the owner's
    // by RDMA once the link is back.
    job.until("the RDMA link after the timeout", |j| {
        j.link() == LinkTransport::Rdma
    });
    let before = job.fabric.stats().writes;
    let (_, mut loader) = job.agents[ASKER].open(8, 1);
    let mut seen = Vec::new();
    job.until("the loader's epoch", |j| {
        for (d, table) in loader.take() {
            loader.give_back(&d);
            for e in &table {
                seen.push((e.sample_id, loader.bytes(e)));
            }
            if d.flags & BATCH_END_OF_STREAM != 0 {
                return true;
            }
        }
        let _ = j;
        false
    });
    assert_eq!(seen.len() as u64, SAMPLES);
    for (id, bytes) in &seen {
        let i = id - 1000;
        assert_eq!(bytes, &content(i), "sample {i} as the loader reads it");
    }
    let fresh = owned.len() as u64 - 10;
    assert_eq!(
        job.fabric.stats().writes - before,
        fresh,
        "each owned sample not yet here came by RDMA"
    );
    // The owner let go of every block it served: no request left in its
    // serving queue, no pin left on a sample.
    job.until("the owner's serving queue empty", |j| {
        j.agents[OWNER]
            .engine
            .peers
            .as_ref()
            .unwrap()
            .serving_count()
            == 0
    });
    let owner = &job.agents[OWNER].engine;
    for &i in &owned {
        assert_eq!(owner.cache.pins(key(0, i)), 0, "sample {i} still pinned");
    }
}

/// A queue pair lives and dies with the one authenticated connection it
/// was set up over. Setup bytes arriving from the owner on any other
/// connection (here: a queue pair of a stranger's, offered as if on a
/// second connection authenticated as the owner) are refused and leave
/// the queue pair carrying blocks; another connection of the owner's
/// ending leaves it too; only its own connection ending closes it.
#[test]
fn a_queue_pair_lives_and_dies_with_the_connection_it_was_set_up_over() {
    use crate::peers::rdma_link::RdmaLinks;
    use granary_rdma::DriverConfig;

    let mut job = Job::start();
    let owned = job.owned();
    let first = owned[0];
    job.ask(first);
    job.until("the first block over TCP", |j| j.ready(first));
    job.until("the RDMA link, both ways", |j| {
        j.link() == LinkTransport::Rdma && j.owner_link() == LinkTransport::Rdma
    });
    let channel = |job: &Job| {
        let t = job.agents[ASKER].engine.peers.as_ref().unwrap();
        t.rdma_links().unwrap().channel(OWNER)
    };
    let conn = channel(&job).expect("the queue pair's connection");
    let other = conn + 1_000;
    let qps = job.fabric.qp_count(ASKER_HOST);

    let mut stranger =
        RdmaLinks::new(job.fabric.add_host(), 1 << 20, DriverConfig::default()).unwrap();
    let offer = stranger.offer(ASKER, 1, 1).unwrap();
    for _ in 0..5 {
        job.asker_tier().rdma_setup(other, OWNER, &offer);
    }
    assert_eq!(channel(&job), Some(conn), "the channel is unchanged");
    assert_eq!(job.link(), LinkTransport::Rdma);
    assert_eq!(
        job.fabric.qp_count(ASKER_HOST),
        qps,
        "no queue pair made or replaced"
    );
    assert_eq!(
        stranger.link(ASKER),
        LinkTransport::RdmaFallback,
        "nobody answered the stranger"
    );
    // One line logged for the first refusal; the four after it, within
    // the second, held back and counted in the next line.
    let t = job.agents[ASKER].engine.peers.as_mut().unwrap();
    let later = t.nanos() + 2_000_000_000;
    assert_eq!(
        t.rdma_links_mut().unwrap().refusal_due(OWNER, later),
        Some(4)
    );

    // Blocks still come by RDMA over the owner's queue pair.
    let next = owned[1];
    let at = job.ask(next);
    job.until("a block by RDMA", |j| j.ready(next));
    assert_eq!(job.fabric.stats().writes, 1);
    assert_eq!(job.bytes_at(at, next), content(next));

    // Another connection of the owner's ending changes nothing.
    job.asker_tier().rdma_conn_down(other, OWNER);
    assert_eq!(job.link(), LinkTransport::Rdma);
    assert_eq!(channel(&job), Some(conn));
    let more = owned[2];
    job.ask(more);
    job.until("another block by RDMA", |j| j.ready(more));
    assert_eq!(job.fabric.stats().writes, 2);

    // The queue pair's own connection ending closes it.
    job.asker_tier().rdma_conn_down(conn, OWNER);
    assert_eq!(job.link(), LinkTransport::RdmaFallback);
    assert_eq!(channel(&job), None);
    assert_eq!(job.fabric.qp_count(ASKER_HOST), qps - 1);
}
