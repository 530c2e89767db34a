//! What a scenario runs on: the namespaces and binaries ([`Env`]), each
//! agent's configuration, the ranks' layout and the planner's steps.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use granary_tools::synth::SynthSpec;

use super::netns::{self, Net};
use super::node::{self, DATASET};
use super::options::{Kind, Opts};
use super::procs::AgentProc;
use super::{Result, METRICS, PEER_PORT, PROXY_PORT, SECRET, STORE_PORT};
use crate::seaweed::{ACCESS_KEY, BUCKET, REGION, SECRET_KEY};

pub struct Env {
    pub net: Net,
    pub spec: SynthSpec,
    pub dataset_bytes: u64,
    pub work: PathBuf,
    pub granaryd: PathBuf,
    pub me: PathBuf,
}

pub fn agent_toml(o: &Opts, kind: Kind, k: usize, arena_mib: u64, sock: &Path) -> String {
    let ip = netns::node_ip(k);
    let prefetch = "max_inflight_reads = 64\nwindow_batches = 4\ninitial_window = 2\n\
                    read_retries = 3\nretry_backoff_ms = 50";
    let mut t =
        granary_testkit::agent_toml::head(&format!("{arena_mib}MiB"), sock, prefetch, METRICS);
    if kind.keep_pct() > 0 {
        let port = if kind == Kind::Corrupt {
            PROXY_PORT
        } else {
            PEER_PORT
        };
        let members: Vec<String> = (0..o.nodes)
            .map(|n| {
                format!(
                    "{{ id = \"n{n}\", addr = \"{}:{port}\" }}",
                    netns::node_ip(n)
                )
            })
            .collect();
        let membership = if matches!(kind, Kind::Relaunch | Kind::Locality) {
            // The job hands its view in (with every agent's own keep bytes;
            // after the loss in `relaunch`, a new one).
            "membership = \"session\"\n".to_string()
        } else {
            format!(
                "membership = \"static\"\njob_id = \"{}\"\nmembers = [{}]\n",
                kind.name(),
                members.join(", ")
            )
        };
        let _ = write!(
            t,
            r#"[peers]
{membership}node_id = "n{k}"
listen = "{ip}:{PEER_PORT}"
secret = "{SECRET}"
keep_percent = {kp}
hedge_after_ms = {hedge}
owner_grace_ms = {grace}
encryption = "{enc}"
"#,
            kp = o.keep_percent,
            hedge = o.hedge_ms,
            grace = o.owner_grace_ms,
            enc = if kind == Kind::Peers150Off {
                "off"
            } else {
                "on"
            },
        );
    }
    let _ = write!(
        t,
        r#"[[dataset]]
name = "{DATASET}"
kind = "s3"
endpoint = "http://{store}:{STORE_PORT}"
allow_http = true
region = "{REGION}"
bucket = "{BUCKET}"
prefix = "cluster"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
"#,
        store = netns::store_ip(),
    );
    t
}

/// The arena of each agent in MiB: the keep areas together hold
/// `keep_pct` % of the dataset (rounded up), or the b0 arena.
pub fn arena_mib(o: &Opts, env: &Env, kind: Kind) -> u64 {
    if kind.keep_pct() == 0 {
        return o.b0_arena_mib.div_ceil(2) * 2;
    }
    let keep_node = env.dataset_bytes * kind.keep_pct() / 100 / o.nodes as u64;
    let arena = keep_node * 100 / o.keep_percent;
    // Arenas are whole 2 MiB pages.
    arena.div_ceil(2 << 20) * 2
}

/// Node `k`'s arena in MiB: `arena` everywhere, but in `locality` the
/// same total split in proportion to the node's ranks (a node's share of
/// the keep areas, hence of ownership, then matches its share of every
/// step).
pub fn node_arena(o: &Opts, kind: Kind, arena: u64, k: usize) -> u64 {
    if kind != Kind::Locality {
        return arena;
    }
    let total = arena * o.nodes as u64;
    let mine = total * o.ranks(k).len() as u64 / u64::from(o.world());
    mine.div_ceil(2) * 2
}

/// The view index of node `k`: members are sorted by node id (`n0`,
/// `n1`, … as strings).
pub fn view_index(o: &Opts, k: usize) -> u32 {
    let mut ids: Vec<String> = (0..o.nodes).map(|n| format!("n{n}")).collect();
    ids.sort();
    ids.iter()
        .position(|id| *id == format!("n{k}"))
        .unwrap_or(0) as u32
}

/// Every rank's view index, in rank order.
/// `relaunch`'s layout over the view of nodes `which` (one rank per node,
/// rank `i` on `which[i]`): each rank's view index (members sorted by
/// node id), comma-separated.
pub fn relaunch_layout(which: &[usize]) -> String {
    let mut ids: Vec<String> = which.iter().map(|k| format!("n{k}")).collect();
    ids.sort();
    which
        .iter()
        .map(|k| {
            let id = format!("n{k}");
            ids.iter().position(|x| *x == id).unwrap_or(0).to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub fn layout(o: &Opts) -> Vec<u32> {
    let mut node_of = vec![0u32; o.world() as usize];
    for k in 0..o.nodes {
        for r in o.ranks(k) {
            node_of[r as usize] = view_index(o, k);
        }
    }
    node_of
}

/// Per global step of `epoch` with `world` ranks of `batch`, the samples
/// of every rank's batch of that index (rank after rank).
pub fn planned_step_ids(o: &Opts, world: u32, batch: u32, epoch: u32) -> Vec<Vec<u64>> {
    let mut steps: Vec<Vec<u64>> = Vec::new();
    for rank in 0..world {
        let p = granary_agent::planner::PlanParams {
            num_samples: o.samples,
            seed: 1,
            rank,
            world_size: world,
            batch_size: batch,
            drop_last: false,
        };
        let Ok(plan) = granary_agent::planner::EpochPlan::new(&p, epoch) else {
            continue;
        };
        for (k, b) in plan.batches().enumerate() {
            if steps.len() <= k {
                steps.resize(k + 1, Vec::new());
            }
            steps[k].extend_from_slice(b);
        }
    }
    steps
}

/// Per global step of `epoch` with `world` ranks of `batch`, the planner's
/// multiset hash (the sum of every rank's batch's terms). With the same
/// global batch `world x batch` it does not depend on the world size:
/// global step `k` is the permutation's entries `[k·G, (k+1)·G)` (padding
/// aside: see `relaunch`'s check).
pub fn planned_steps(o: &Opts, world: u32, batch: u32, epoch: u32) -> Vec<u64> {
    planned_step_ids(o, world, batch, epoch)
        .iter()
        .map(|ids| {
            ids.iter()
                .fold(0u64, |h, &id| h.wrapping_add(node::step_term(id)))
        })
        .collect()
}

/// The moved fraction the assignment gives on average over 2,000 steps
/// whose samples are each held by a uniformly random node, for ranks on
/// `node_of_rank` and batches of `b`.
pub fn predicted_moved(nodes: u32, node_of_rank: &[u32], b: u32) -> f64 {
    let Ok(layout) = granary_peer::assign::Layout::new(nodes, node_of_rank.to_vec()) else {
        return 0.0;
    };
    let n = node_of_rank.len() * b as usize;
    let samples: Vec<u64> = (0..n as u64).collect();
    let (mut moved, mut all) = (0u64, 0u64);
    let mut gen = granary_base::SplitMix64(0x6772_616e_6172_7931);
    for _ in 0..2000 {
        let holders: Vec<Option<u32>> = (0..n)
            .map(|_| Some((gen.next_u64() % u64::from(nodes)) as u32))
            .collect();
        if let Ok(a) = granary_peer::assign::assign_step(&samples, &holders, &layout, b) {
            moved += a.stats().moved;
            all += a.stats().samples;
        }
    }
    moved as f64 / all.max(1) as f64
}

/// Gathers the identities of the agents `which`, hands them the view of
/// epoch `epoch` and waits for the peers to see each other.
pub fn hand_view(agents: &[AgentProc], which: &[usize], job: &str, epoch: u64) -> Result<Vec<u8>> {
    let mut members = Vec::new();
    for &k in which {
        let id = granary::Client::connect(&agents[k].sock)
            .and_then(|c| c.peer_identity(Duration::from_secs(10)))
            .map_err(|e| format!("{}: peer identity: {e}", agents[k].name))?;
        members.push(granary::ViewMember {
            id: id.node_id,
            addr: id.addr,
            capacity: id.capacity,
        });
    }
    let view = granary::encode_view(job, epoch, &members).map_err(|e| format!("view: {e}"))?;
    for &k in which {
        granary::Client::connect(&agents[k].sock)
            .and_then(|c| c.join_view(&view, Duration::from_secs(10)))
            .map_err(|e| format!("{}: join view: {e}", agents[k].name))?;
    }
    // The barrier: every agent holds the view before anyone reads.
    std::thread::sleep(Duration::from_millis(500));
    Ok(view)
}

pub fn batches_per_epoch(o: &Opts, rank: u32) -> u64 {
    let p = granary_agent::planner::PlanParams {
        num_samples: o.samples,
        seed: 1,
        rank,
        world_size: o.world(),
        batch_size: o.batch,
        drop_last: false,
    };
    granary_agent::planner::batches_per_epoch(&p).unwrap_or(0)
}

pub fn spec_args(s: &SynthSpec) -> Vec<String> {
    vec![
        "--data-root".into(),
        s.root.display().to_string(),
        "--samples".into(),
        s.num_files.to_string(),
        "--mean".into(),
        s.mean_size.to_string(),
        "--sigma".into(),
        s.sigma.to_string(),
        "--classes".into(),
        s.num_classes.to_string(),
    ]
}
