//! The locality-aware assignment end to end: three real `granaryd`
//! processes on 127.0.0.2, .3 and .4 (`peers.membership = "session"`), two
//! loader ranks each, a dataset of 6,144 small samples in a directory every
//! agent reads as its store.
//!
//! * every rank asks its agent for the assignment's digest, the job agrees,
//!   and two epochs run in locality mode, then the same two in exact
//!   order: per step, the sorted sample ids of the whole job are the same
//!   in both modes, every rank gets exactly its batch size, and every
//!   sample arrives byte for byte;
//! * the second locality epoch's peer traffic is within 1 percentage point
//!   of the law 0.40·√((p−1)/p)/√q (p = 3 nodes, q = 32 samples per node
//!   and step: 5.8 %), and the placement metric says the same;
//! * a rank whose inputs differ (another layout) makes the job agree on
//!   exact order, with a reason naming it; opening in locality mode with
//!   a digest its agent does not compute is refused;
//! * a killed peer leaves the other agents' assignment (its digest)
//!   unchanged.

mod common;
mod common_peers;

use common::{next_or_end, verify, watchdog_fn};
use common_peers::SessionJob;
use granary::{agree, encode_layout, Agreement, Client, ErrorCode, SessionOptions};
use std::time::Duration;

const NODES: usize = 3;
const RANKS_PER_NODE: u32 = 2;
const WORLD: u32 = NODES as u32 * RANKS_PER_NODE;
const BATCH: u32 = 16;
/// 64 global steps of `WORLD · BATCH` samples.
const FILES: u64 = 64 * (WORLD as u64) * (BATCH as u64);
const SEED: u64 = 11;

type Job = SessionJob;

fn start_job() -> Job {
    SessionJob::start(
        NODES,
        FILES,
        10,
        "96MiB",
        "max_inflight_reads = 64\nwindow_batches = 4\ninitial_window = 2",
        "locality-job",
    )
}

impl Job {
    /// Rank `rank`'s node.
    fn node_of(rank: u32) -> usize {
        (rank / RANKS_PER_NODE) as usize
    }

    /// The session options of `rank` for `epoch`, with the job's view and
    /// the layout placing rank `r` on `placed(r)`.
    fn options(&self, rank: u32, epoch: u32, placed: impl Fn(u32) -> usize) -> SessionOptions {
        let ids: Vec<&str> = (0..WORLD)
            .map(|r| self.node_ids[placed(r)].as_str())
            .collect();
        let mut o = SessionOptions::new("data");
        o.seed = SEED;
        o.rank = rank;
        o.world_size = WORLD;
        o.batch_size = BATCH;
        o.first_epoch = epoch;
        o.epoch_count = 1;
        o.view = Some(self.view.clone());
        o.view_required = true;
        o.layout = Some(encode_layout(&self.view, &ids, 1).unwrap());
        o
    }

    /// Every rank asks its agent; the job's decision. Rank `odd`, if any,
    /// hands in a layout that places the last rank on node 0.
    fn agree(&self, epoch: u32, odd: Option<u32>) -> Agreement {
        let infos: Vec<_> = (0..WORLD)
            .map(|r| {
                let o = if Some(r) == odd {
                    self.options(r, epoch, odd_layout)
                } else {
                    self.options(r, epoch, Job::node_of)
                };
                Client::connect(&self.agents[Job::node_of(r)].sock)
                    .unwrap()
                    .assignment(&o)
                    .unwrap()
            })
            .collect();
        agree(&infos)
    }

    /// Runs `epoch` on every rank (locality mode with `digest`, else
    /// exact); per batch index, the job's sorted sample ids.
    fn run(&self, epoch: u32, digest: Option<[u8; 32]>) -> Vec<Vec<u64>> {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                let mut o = self.options(rank, epoch, Job::node_of);
                o.locality = digest;
                let sock = self.agents[Job::node_of(rank)].sock.clone();
                let spec = self.spec.clone();
                std::thread::spawn(move || {
                    let client = Client::connect(&sock).unwrap();
                    let mut s = client.open_session(&o).unwrap();
                    let mut batches: Vec<Vec<u64>> = Vec::new();
                    while let Some(b) = next_or_end(
                        &mut s,
                        Duration::from_secs(60),
                        &format!("rank {rank} epoch {epoch}"),
                    ) {
                        assert_eq!(b.index() as usize, batches.len());
                        let mut ids = Vec::new();
                        for smp in b.samples() {
                            verify(&spec, &smp);
                            ids.push(smp.id());
                        }
                        assert_eq!(ids.len() as u32, BATCH, "rank {rank}: batch size");
                        batches.push(ids);
                        let end = b.is_end_of_epoch();
                        s.release(b).unwrap();
                        if end {
                            break;
                        }
                    }
                    s.close().unwrap();
                    batches
                })
            })
            .collect();
        let per_rank: Vec<Vec<Vec<u64>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let steps = per_rank[0].len();
        assert!(
            per_rank.iter().all(|r| r.len() == steps),
            "ranks disagree on the step count"
        );
        (0..steps)
            .map(|k| {
                let mut all: Vec<u64> = per_rank.iter().flat_map(|r| r[k].clone()).collect();
                all.sort_unstable();
                all
            })
            .collect()
    }

    fn sum(&self, name: &str, with: &str) -> f64 {
        self.agents.iter().map(|a| a.metric(name, with)).sum()
    }
}

/// A layout that disagrees with the job's: the last rank on node 0.
fn odd_layout(r: u32) -> usize {
    if r == WORLD - 1 {
        0
    } else {
        Job::node_of(r)
    }
}

#[test]
fn locality_mode_keeps_every_global_step_and_moves_what_the_law_says() {
    let _w = watchdog_fn!(600);
    let job = start_job();
    let Agreement::Locality(d0) = job.agree(0, None) else {
        panic!("the job should agree on locality mode");
    };
    let Agreement::Locality(d1) = job.agree(1, None) else {
        panic!("the job should agree on locality mode");
    };
    assert_ne!(d0, d1, "the digest covers the epoch");

    let loc0 = job.run(0, Some(d0));
    let gets0 = job.sum("granary_peer_gets_total", "");
    let moved0 = job.sum("granary_assigned_samples_total", "placement=\"peer\"");
    let loc1 = job.run(1, Some(d1));
    let gets1 = job.sum("granary_peer_gets_total", "") - gets0;
    let moved1 = job.sum("granary_assigned_samples_total", "placement=\"peer\"") - moved0;
    let total = FILES as f64;
    let frac = gets1 / total;
    let law = 0.40 * ((NODES as f64 - 1.0) / NODES as f64).sqrt()
        / f64::from(RANKS_PER_NODE * BATCH).sqrt();
    eprintln!(
        "locality epoch 1: {gets1} peer gets of {total} samples ({:.2} %), {moved1} planned moved; law {:.2} %",
        frac * 100.0,
        law * 100.0
    );
    assert!(
        (frac - law).abs() <= 0.01,
        "second-epoch peer traffic {:.2} % is not within 1 point of the law {:.2} %",
        frac * 100.0,
        law * 100.0
    );
    assert!(
        (moved1 / total - law).abs() <= 0.01,
        "planned moved fraction {:.2} % vs law {:.2} %",
        moved1 / total * 100.0,
        law * 100.0
    );
    assert_eq!(
        job.sum("granary_assigned_samples_total", "mode=\"exact\""),
        0.0,
        "no exact session yet"
    );

    let exact0 = job.run(0, None);
    let exact1 = job.run(1, None);
    for (mode_steps, exact_steps, epoch) in [(&loc0, &exact0, 0), (&loc1, &exact1, 1)] {
        assert_eq!(mode_steps.len(), exact_steps.len());
        assert_eq!(mode_steps.len(), 64);
        for (k, (a, b)) in mode_steps.iter().zip(exact_steps).enumerate() {
            assert_eq!(
                a, b,
                "epoch {epoch} step {k}: the global batch differs between modes"
            );
        }
        let mut every: Vec<u64> = mode_steps.iter().flatten().copied().collect();
        every.sort_unstable();
        assert_eq!(
            every,
            (0..FILES).collect::<Vec<_>>(),
            "epoch {epoch}: every sample once"
        );
    }
    let exact_peer = job.sum(
        "granary_assigned_samples_total",
        "mode=\"exact\",placement=\"peer\"",
    );
    assert!(
        exact_peer / (2.0 * total) > 0.5,
        "exact order has most samples kept elsewhere ({exact_peer} of {})",
        2.0 * total
    );

    // A rank whose layout differs: the job runs exact order, and says why.
    let infos_differ = job.agree(0, Some(WORLD - 1));
    let Agreement::Exact(why) = infos_differ else {
        panic!("a differing rank must make the job run exact order");
    };
    assert!(why.contains("rank 5's inputs"), "{why}");
    // Opening in locality mode with a digest this rank's agent does not
    // compute is refused, with the reason.
    let mut o = job.options(WORLD - 1, 0, odd_layout);
    o.locality = Some(d0);
    let Err(err) = Client::connect(&job.agents[NODES - 1].sock)
        .unwrap()
        .open_session(&o)
    else {
        panic!("a mismatched digest must be refused");
    };
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("the job agreed on"), "{err}");
    // A lost peer changes where bytes come from, never the assignment: with
    // node 2's agent killed, the others still compute the same digest (the
    // directory depends on the view and the catalog only).
    let mut job = job;
    job.agents[NODES - 1].kill9();
    for r in 0..(WORLD - RANKS_PER_NODE) {
        let info = Client::connect(&job.agents[Job::node_of(r)].sock)
            .unwrap()
            .assignment(&job.options(r, 1, Job::node_of))
            .unwrap();
        assert!(info.locality, "rank {r}: {}", info.note);
        assert_eq!(
            info.digest, d1,
            "rank {r}: the assignment changed with a peer down"
        );
    }
    // Without a layout, the agent says locality is unavailable.
    let mut o = job.options(0, 0, Job::node_of);
    o.layout = None;
    let info = Client::connect(&job.agents[0].sock)
        .unwrap()
        .assignment(&o)
        .unwrap();
    assert!(!info.locality);
    assert!(info.note.contains("no rank layout"), "{}", info.note);
}
