//! The job status between agents (`docs/peers.md`, "Job status"): two
//! real `granaryd` processes on 127.0.0.2 and .3 (static membership), one
//! rank each of a job of two ranks.
//!
//! * rank 1 on node B reads its whole epoch; rank 0 on node A takes 10
//!   batches, waits a few intervals with its session open and goes away;
//! * B learns from A's job status where rank 0 stood (its committed step,
//!   10) and A's ranks' waits (`granary_job_rank_wait_seconds{node="n0"}`);
//! * a replacement rank 0 opened on B at the `first_batch` B answers
//!   reads the rest of the epoch, and every sample of the epoch arrives
//!   exactly once across rank 0's old session, its replacement and rank 1.

mod common;
mod common_peers;

use common::{next_or_end, verify, wait_for, wait_for_position, watchdog};
use common_peers::{free_port, Agent};
use granary::{Client, ErrorCode, Session, SessionOptions};
use granary_agent::metrics::{parse_text, scrape};
use granary_testkit::agent_toml::{fs_dataset, static_peers, PEER_PREFETCH, TEST_SECRET as SECRET};
use granary_tools::synth::{self, SynthSpec};
use std::collections::BTreeMap;
use std::time::Duration;

const WORLD: u32 = 2;
const BATCH: u32 = 8;
/// 32 steps of `WORLD · BATCH` samples.
const FILES: u64 = 32 * (WORLD as u64) * (BATCH as u64);
const SEED: u64 = 5;

fn start() -> (tempfile::TempDir, SynthSpec, Vec<Agent>) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut spec = SynthSpec::new(&data);
    spec.num_files = FILES;
    spec.num_classes = 4;
    spec.mean_size = 1_500;
    synth::generate(&spec, |_, _| {}).unwrap();
    let listens: Vec<String> = (0..2)
        .map(|n| format!("{}:{}", Agent::ip(n), free_port(&Agent::ip(n))))
        .collect();
    let members = format!(
        "[{{ id = \"n0\", addr = \"{}\", keep = \"16MiB\" }}, {{ id = \"n1\", addr = \"{}\", keep = \"16MiB\" }}]",
        listens[0], listens[1]
    );
    let mut agents = Vec::new();
    for (node, listen) in listens.iter().enumerate() {
        let tables = static_peers("steps-job", &format!("n{node}"), listen, SECRET, &members)
            + &fs_dataset("data", &data, "");
        let mut a = Agent::new(tmp.path(), node, "64MiB", PEER_PREFETCH, &tables);
        a.start();
        agents.push(a);
    }
    (tmp, spec, agents)
}

fn options(rank: u32) -> SessionOptions {
    let mut o = SessionOptions::new("data");
    o.batch_size = BATCH;
    o.world_size = WORLD;
    o.rank = rank;
    o.seed = SEED;
    o.epoch_count = 1;
    o
}

/// Takes up to `max` batches (all with `None`), verifying every sample.
fn take(s: &mut Session, spec: &SynthSpec, max: Option<usize>, ids: &mut Vec<u64>) -> usize {
    let mut n = 0;
    while max.is_none_or(|m| n < m) {
        let Some(b) = next_or_end(s, Duration::from_secs(60), "next batch") else {
            break;
        };
        for smp in b.samples() {
            verify(spec, &smp);
            ids.push(smp.id());
        }
        s.release(b).unwrap();
        n += 1;
    }
    n
}

/// The series of `name` on `a`, by their label text.
fn series(a: &Agent, name: &str) -> BTreeMap<String, f64> {
    let body = scrape(a.metrics, Duration::from_secs(5)).unwrap();
    parse_text(&body)
        .into_iter()
        .filter(|(k, _)| k.split('{').next() == Some(name))
        .collect()
}

#[test]
fn a_replacement_rank_on_another_node_opens_at_the_jobs_committed_step() {
    let _w = watchdog("job_status", 240);
    let (_tmp, spec, agents) = start();
    let (a, b) = (&agents[0], &agents[1]);
    let ca = Client::connect(&a.sock).unwrap();
    let cb = Client::connect(&b.sock).unwrap();

    // Rank 1 on B: its whole epoch, then open a few intervals (its waits
    // are recorded).
    let mut rank1 = Vec::new();
    let mut s1 = cb.open_session(&options(1)).unwrap();
    let per_rank = take(&mut s1, &spec, None, &mut rank1);
    assert_eq!(per_rank as u64, FILES / u64::from(WORLD * BATCH));
    std::thread::sleep(Duration::from_millis(2500));
    s1.close().unwrap();

    // Rank 0 on A: 10 batches, then a few intervals open (its waits are
    // recorded), then it goes away.
    let mut rank0_old = Vec::new();
    let mut s0 = ca.open_session(&options(0)).unwrap();
    assert_eq!(take(&mut s0, &spec, Some(10), &mut rank0_old), 10);
    std::thread::sleep(Duration::from_millis(2500));
    drop(s0);

    // B learns where rank 0 stands, and A's ranks' waits.
    let pos = wait_for_position("B to learn rank 0's position", &cb, &options(0), |p| {
        p.rank_position == Some((0, 10))
    });
    // Rank 1 finished its epoch: the job stands at rank 0's step.
    assert_eq!((pos.epoch, pos.step), (0, 10), "{pos:?}");
    assert_eq!((pos.ranks_known, pos.nodes), (2, 2), "{pos:?}");
    assert_eq!(pos.first_batch, 10);
    wait_for("B to show A's rank waits", Duration::from_secs(30), || {
        series(b, "granary_job_rank_wait_seconds")
            .keys()
            .any(|k| k.contains("node=\"n0\"") && k.contains("rank=\"0\""))
    });
    let straggler = series(b, "granary_job_rank_straggler");
    assert!(
        straggler.keys().any(|k| k.contains("node=\"n0\"")),
        "{straggler:?}"
    );
    assert!(
        straggler.keys().any(|k| k.contains("node=\"n1\"")),
        "B's own rank is listed too: {straggler:?}"
    );
    assert_eq!(b.metric("granary_job_ranks_known", "dataset=\"data\""), 2.0);
    let step = series(b, "granary_job_committed_step");
    assert_eq!(
        step.values().copied().collect::<Vec<_>>(),
        [10.0],
        "{step:?}"
    );

    // Another plan (another seed) is unknown.
    let mut other = options(0);
    other.seed = SEED + 1;
    let e = cb.job_position(&other).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");

    // The replacement rank 0 on B opens at the job's committed step.
    let mut o = options(0);
    o.first_batch = pos.first_batch;
    let mut s0 = cb.open_session(&o).unwrap();
    let mut rank0_new = Vec::new();
    let rest = take(&mut s0, &spec, None, &mut rank0_new);
    s0.close().unwrap();
    assert_eq!(rest, per_rank - 10);

    // Every sample of the epoch exactly once.
    let mut all: Vec<u64> = rank0_old
        .into_iter()
        .chain(rank0_new)
        .chain(rank1)
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..FILES).collect::<Vec<_>>());

    // A learns B's position of rank 0 in turn (the replacement ended the
    // epoch on B): the job is at the start of epoch 1.
    wait_for(
        "A to learn the replacement's position",
        Duration::from_secs(30),
        || {
            ca.job_position(&options(0))
                .is_ok_and(|p| (p.epoch, p.step) == (1, 0))
        },
    );
}
