//! Locality mode across a replacement and a relaunch
//! (`docs/reliability.md`, "Another world size in locality mode"): two
//! real `granaryd` processes on 127.0.0.2 and .3
//! (`peers.membership = "session"`), a job of four ranks in locality mode
//! (two per node, batch 6: a global batch of 24).
//!
//! * every rank takes 6 batches but rank 3, which takes 4 and goes away;
//!   node A learns from B's job status where the locality plan stands
//!   (step 4, rank 3 at 4) and its replacement on B opens at the
//!   `first_batch` B answers and takes batches 4 and 5;
//! * the job is relaunched with three ranks (two on A, one on B, batch 8:
//!   the same global batch) and a new agreed digest; every new rank asks
//!   its agent where the old plan stands (step 6) and opens there;
//! * every sample of the epoch arrives exactly once across the old ranks,
//!   the replacement and the new ranks, byte for byte, and every new batch
//!   holds exactly 8 samples.

mod common;
mod common_peers;

use common::{verify, wait_for, wait_for_position, watchdog};
use common_peers::SessionJob;
use granary::{agree, encode_layout, Agreement, Client, ErrorCode, Session, SessionOptions};
use granary_testkit::agent_toml::PEER_PREFETCH;
use std::time::Duration;

const NODES: usize = 2;
/// The global batch: 4 × 6 before the relaunch, 3 × 8 after.
const GLOBAL: u64 = 24;
/// 16 global steps.
const FILES: u64 = 16 * GLOBAL;
const SEED: u64 = 13;

type Job = SessionJob;

fn start_job() -> Job {
    SessionJob::start(NODES, FILES, 4, "64MiB", PEER_PREFETCH, "locality-resume")
}

impl Job {
    /// Rank `rank`'s options in a job whose rank `r` runs on
    /// `layout[r]`, with batch size `GLOBAL / layout.len()`.
    fn options(&self, rank: u32, layout: &[usize]) -> SessionOptions {
        let ids: Vec<&str> = layout.iter().map(|&v| self.node_ids[v].as_str()).collect();
        let mut o = SessionOptions::new("data");
        o.seed = SEED;
        o.rank = rank;
        o.world_size = layout.len() as u32;
        o.batch_size = (GLOBAL / layout.len() as u64) as u32;
        o.epoch_count = 1;
        o.view = Some(self.view.clone());
        o.view_required = true;
        o.layout = Some(encode_layout(&self.view, &ids, 1).unwrap());
        o
    }

    fn client(&self, node: usize) -> Client {
        Client::connect(&self.agents[node].sock).unwrap()
    }

    /// Every rank asks its agent; the job must agree on locality mode.
    fn agree(&self, layout: &[usize]) -> [u8; 32] {
        let infos: Vec<_> = (0..layout.len() as u32)
            .map(|r| {
                self.client(layout[r as usize])
                    .assignment(&self.options(r, layout))
                    .unwrap()
            })
            .collect();
        match agree(&infos) {
            Agreement::Locality(d) => d,
            Agreement::Exact(why) => panic!("the job should agree on locality mode: {why}"),
        }
    }
}

/// Takes up to `max` batches (all with `None`), verifying every sample and
/// each batch's size.
fn take(s: &mut Session, job: &Job, size: usize, max: Option<usize>, ids: &mut Vec<u64>) -> usize {
    let mut n = 0;
    while max.is_none_or(|m| n < m) {
        let b = match s.next_batch(Some(Duration::from_secs(60))) {
            Ok(b) => b,
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(e) => panic!("next batch: {e}"),
        };
        assert_eq!(b.samples().len(), size, "batch {}", b.index());
        for smp in b.samples() {
            verify(&job.spec, &smp);
            ids.push(smp.id());
        }
        s.release(b).unwrap();
        n += 1;
    }
    n
}

#[test]
fn a_locality_job_goes_on_after_a_replacement_and_a_relaunch_with_another_world_size() {
    let _w = watchdog("locality_resume", 300);
    let job = start_job();
    let old: [usize; 4] = [0, 0, 1, 1];
    let digest = job.agree(&old);
    let mut ids = Vec::new();

    // The old job: ranks 0-2 take 6 batches, rank 3 takes 4 and goes away.
    let mut sessions = Vec::new();
    for rank in 0..4u32 {
        let mut o = job.options(rank, &old);
        o.locality = Some(digest);
        let mut s = job.client(old[rank as usize]).open_session(&o).unwrap();
        let want = if rank == 3 { 4 } else { 6 };
        assert_eq!(take(&mut s, &job, 6, Some(want), &mut ids), want);
        sessions.push(s);
    }
    let mut o3 = job.options(3, &old);
    o3.locality = Some(digest);
    // Node A learns rank 3's position from B's job status.
    let what = "A to learn where the locality plan stands";
    let pos = wait_for_position(what, &job.client(0), &o3, |p| {
        p.ranks_known == 4 && p.rank_position == Some((0, 4))
    });
    assert_eq!((pos.epoch, pos.step, pos.nodes), (0, 4, 2), "{pos:?}");
    assert_eq!(pos.first_batch, 4);
    drop(sessions.pop());

    // Its replacement on B, asking B, opens there and takes batches 4, 5.
    let at = job.client(1).job_position(&o3).unwrap();
    assert_eq!(at.first_batch, 4, "{at:?}");
    o3.first_batch = at.first_batch;
    let mut s3 = job.client(1).open_session(&o3).unwrap();
    assert_eq!(take(&mut s3, &job, 6, Some(2), &mut ids), 2);
    sessions.push(s3);
    wait_for(
        "A to see the job at step 6",
        Duration::from_secs(30),
        || {
            job.client(0)
                .job_position(&o3)
                .is_ok_and(|p| (p.epoch, p.step) == (0, 6))
        },
    );
    // The metrics say the same: the locality plan's four ranks, at step 6.
    wait_for(
        "A's metrics to show the plan",
        Duration::from_secs(30),
        || {
            let a = &job.agents[0];
            a.metric("granary_job_ranks_known", "dataset=\"data\"") == 4.0
                && a.metric("granary_job_committed_step", "dataset=\"data\"") == 6.0
        },
    );
    for s in sessions {
        s.close().unwrap();
    }
    assert_eq!(ids.len() as u64, 6 * GLOBAL);

    // The relaunch: three ranks, batch 8, a new layout and digest. Each
    // asks its agent where the old plan stands.
    let new: [usize; 3] = [0, 0, 1];
    let digest_new = job.agree(&new);
    assert_ne!(digest_new, digest, "another layout, another assignment");
    let mut opened = Vec::new();
    for rank in 0..3u32 {
        let node = new[rank as usize];
        let mut asked = job.options(rank, &old);
        asked.locality = Some(digest);
        let p = job.client(node).job_position(&asked).unwrap();
        assert_eq!((p.epoch, p.step), (0, 6), "rank {rank}: {p:?}");
        let mut o = job.options(rank, &new);
        o.locality = Some(digest_new);
        // The same global batch: the old plan's step is the new plan's.
        o.first_batch = p.step;
        opened.push(job.client(node).open_session(&o).unwrap());
    }
    for mut s in opened {
        assert_eq!(take(&mut s, &job, 8, None, &mut ids), 10);
        s.close().unwrap();
    }

    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..FILES).collect::<Vec<_>>(),
        "every sample of the epoch exactly once"
    );
}
