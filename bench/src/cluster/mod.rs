//! `bench/run cluster`. Multi-node cluster: node namespaces and a far store (veth, bridge, tbf, delay proxy), peers on/off, a peer killed, corrupted blocks, a slow link (root).
//!
//! Builds node namespaces `gcl-n0…` and a store namespace `gcl-store` on a
//! bridge ([`netns`]), with rate-limited links; runs SeaweedFS
//! behind the delay proxy in the store namespace, and in every node
//! namespace one `granaryd` and one loader process (two ranks on node 0).
//! Each scenario reads the same dataset for `--epochs` epochs, epoch by
//! epoch (all loaders finish an epoch before the next starts), and reports
//! per node and epoch the samples and bytes by tier, store reads, epoch
//! time, batch waits, CPU per sample, and the check of every delivered
//! batch against the planner. Goals from the benchmark's issue are printed
//! as met / not met; the last line is one JSON object.
//!
//! Scenarios: `b0` (no peers, a small arena: every node reads its share
//! from the store each epoch), `peers150` and `peers75` (exact mode, the
//! agents' keep areas together holding 150 % and 75 % of the dataset),
//! `peers150off` (as peers150 with `peers.encryption = "off"`: records
//! authenticated, not encrypted),
//! `kill` (as peers150, node 1's agent killed with SIGKILL half-way through
//! epoch 1 and restarted `--restart-ms` later), `corrupt` (as peers150, one
//! block record in `--corrupt-every` changed on the wire by a proxy in
//! front of every peer listener: the channel rejects the changed record
//! and closes the connection), `slow` (as peers150, the last node's
//! link at `--slow-mbit`), `locality` (as peers150 with every rank in the
//! locality-aware assignment, agreed by the job before each epoch; each
//! agent's arena proportional to its ranks, so that ownership follows the
//! quotas), `relaunch` (as peers150 with views handed in by the job
//! (`membership = "session"`) and one rank per node, world size = nodes;
//! the world size drops by one in the middle of epoch 1: see below).
//!
//! `relaunch`: every rank's batch is `--batch` x (nodes - 1) / nodes (24
//! with the defaults), so that the global batch `G` stays `--batch` x
//! (nodes - 1) when the job loses a rank. Epoch 0 warms the caches. Epoch 1
//! runs until every rank has consumed `K` global steps (half the epoch; in
//! data-parallel training every rank commits the same steps); then the last
//! node is lost (its `granaryd` and its loader killed with SIGKILL), the
//! others get a new view (epoch 2), and the job is relaunched with one rank
//! fewer and `--batch` per rank: the survivors' sessions open epoch 1 at
//! batch `K` (`first_batch`). Global step `k` is the permutation's entries
//! `[k·G, (k+1)·G)` whatever the world size, so the two parts together
//! must be the epoch's plan, each step once; the later epochs run with the
//! new world. Checked and reported: per step of epoch 1 the delivered
//! multiset against the planner's (old world before `K`, new from `K`),
//! steps delivered twice, missing, or on the wrong side of the change; the
//! plan's union against the dataset (with `--samples` not a multiple of
//! both world sizes the planner pads, as `DistributedSampler` does, and
//! those samples come twice); whether the planner's step hashes differ
//! between the two worlds; and the store reads after the change (the rest
//! of epoch 1, then the later epochs) against the lost node's owned share
//! (its store reads in epoch 0). With `--relaunch-locality` both jobs run
//! the locality-aware assignment: the old one agreed on before each epoch
//! (one rank per node), the relaunched one agreed on again after the
//! change, over the new view and layout; the checks are the same (a global
//! step's samples do not depend on the layout).
//!
//! Every epoch is checked job-wide: per global step, the multiset of the
//! samples all ranks received equals the planner's step (a multiset hash
//! per step, summed over the nodes).
//!
//! `--smoke`: two nodes, 2,048 samples, `peers150` and `locality`,
//! asserting the invariants (nothing lost or duplicated, every global step
//! the planner's, every byte right, store reads bound, locality order in
//! every epoch of `locality`); exit status 1 when one fails.
//!
//! Needs root, iproute2 and SeaweedFS's `weed`. `--cleanup` removes what a
//! run killed with SIGKILL left behind.
//!
//! Layout: `options` (the scenarios and the options), `scenario` (the
//! environment, each agent's configuration, the planner's steps), `procs`
//! (the child processes), `measure` (one scenario, epoch by epoch),
//! `results` (what a scenario measured), `goals` (the goals),
//! `report` (the tables, the timeline and the result line); the processes
//! inside the namespaces: `roles` (`--role store|node`), [`node`],
//! [`store`], and [`netns`] (namespaces, bridge, links). `bin/cluster.rs`
//! parses the options.

mod goals;
mod measure;
pub mod netns;
pub mod node;
mod options;
mod procs;
mod report;
mod results;
mod roles;
mod scenario;
pub mod store;
/// A fraction as a percentage with one decimal, e.g. `12.5 %`.
pub fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use granary_tools::synth;

use crate::sys;
use netns::{Net, NetSpec};
pub use options::Options;
use options::{Kind, Opts};
use procs::Proc;
use results::ScenarioResult;
pub use roles::run_role;
use scenario::{spec_args, Env};

type Result<T> = std::result::Result<T, String>;

const PREFIX: &str = "gcl";
const PEER_PORT: u16 = 7170;
const PROXY_PORT: u16 = 7171;
const STORE_PORT: u16 = 9000;
const METRICS: &str = "127.0.0.1:9100";
const SECRET: &str = "8159dcb5e0454eb92e9adeff3647662612ceeb706beb34aa1581c73752f8af65";
/// The longest one epoch may take before the run is abandoned.
const EPOCH_LIMIT: Duration = Duration::from_secs(1200);

/// How a run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every invariant held.
    Held,
    /// An invariant broke (exit status 1).
    Broken,
}

/// `--cleanup`: removes the namespaces and links a killed run left; the
/// names that could not be removed.
pub fn cleanup() -> std::result::Result<String, String> {
    let left = netns::teardown(PREFIX);
    if left.is_empty() {
        Ok(format!("cluster: nothing of {PREFIX}-* left"))
    } else {
        Err(format!("cluster: could not remove {}", left.join(", ")))
    }
}

/// Checks the options (an error here is a usage error).
pub fn check(o: &Options) -> Result<()> {
    Opts::parse(o).map(|_| ())
}

/// Runs the benchmark (as root); prints the result line last.
pub fn run(options: &Options) -> Result<Outcome> {
    let o = &Opts::parse(options)?;
    let (env, mut store, store_pids, regime0) = start(o)?;
    let mut results = Vec::new();
    for &kind in &o.scenarios {
        eprintln!("scenario {} …", kind.name());
        let r = measure::run_scenario(o, &env, &store_pids, kind)?;
        report::print_scenario(o, &r);
        results.push(r);
    }
    let _ = store.send("quit");
    store.finish();
    let regime1 = sys::regime();
    println!("\nregime at end: {regime1}");
    let broken = invariants(o, &results);
    let gs = if o.smoke {
        Vec::new()
    } else {
        goals::goals(o, &results)
    };
    report::print_verdicts(o, &broken, &gs);
    report::timeline_and_plot(o, &results)?;
    let line = report::Line {
        o,
        dataset_bytes: env.dataset_bytes,
        regimes: [&regime0, &regime1],
        results: &results,
        goals: &gs,
        broken: &broken,
    }
    .json();
    drop(env);
    println!("{}", line.line());
    Ok(if broken.is_empty() {
        Outcome::Held
    } else {
        Outcome::Broken
    })
}

/// The network, the dataset and the store (SeaweedFS behind the delay
/// proxy, in its namespace); the store's pids and the regime at start.
fn start(o: &Opts) -> Result<(Env, Proc, [u32; 2], String)> {
    if !sys::is_root() {
        return Err("bench/run cluster needs root (network namespaces, tc)".into());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let granaryd = crate::attack_agent::find_granaryd()?;
    let work = o.out.join("work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    netns::on_interrupt(PREFIX, &work)?;
    let regime0 = sys::regime();
    println!("regime at start: {regime0}");
    let spec = o.spec();
    let summary = synth::generate(&spec, |_, _| {}).map_err(|e| format!("dataset: {e}"))?;
    let dataset_bytes = spec.total_bytes();
    println!(
        "dataset: {} samples, mean {} KiB, sigma {}, {:.1} MB ({}), {} nodes, {} ranks (two on n0; relaunch: one per node), batch {}, {} epochs",
        o.samples,
        o.mean / 1024,
        o.sigma,
        dataset_bytes as f64 / 1e6,
        if summary.skipped { "reused" } else { "generated" },
        o.nodes,
        o.world(),
        o.batch,
        o.epochs
    );
    println!(
        "links: nodes {} Mbit/s, store {} Mbit/s + {} ms RTT (delay proxy); hedge after {} ms; owner grace {} ms; keep_percent {}",
        o.node_mbit, o.store_mbit, o.rtt_ms, o.hedge_ms, o.owner_grace_ms, o.keep_percent
    );
    let net = Net::create(NetSpec {
        prefix: PREFIX.into(),
        nodes: o.nodes,
        node_mbit: o.node_mbit,
        store_mbit: o.store_mbit,
    })?;
    let mut sc = Net::exec(&netns::store_ns(PREFIX), &me);
    sc.args(["--role", "store", "--prefix", "cluster"])
        .args(["--listen", &format!("{}:{STORE_PORT}", netns::store_ip())])
        .args(["--delay-us", &(o.rtt_ms * 1000 / 2).to_string()])
        .args(spec_args(&spec));
    let t = Instant::now();
    let mut store = Proc::spawn("store", sc, work.join("store.log"))?;
    let ready = store.expect("ready", Duration::from_secs(900))?;
    let weed_pid: u32 = ready
        .get("weed_pid")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    println!(
        "store ready (SeaweedFS + ingest + delay proxy) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let store_pids = [store.pid(), weed_pid];
    let env = Env {
        net,
        spec,
        dataset_bytes,
        work,
        granaryd,
        me,
    };
    Ok((env, store, store_pids, regime0))
}

/// The invariants that broke: every consumer got exactly its plan, every
/// byte right (with `--smoke` also the store reads' bounds and the
/// locality order).
fn invariants(o: &Opts, results: &[ScenarioResult]) -> Vec<String> {
    let mut invariants = Vec::new();
    for r in results {
        let (lost, dup, bad, errs) = r.broken();
        if lost + dup + bad > 0 || errs > 0 {
            invariants.push(format!(
                "{}: lost {lost}, duplicated {dup}, bad bytes {bad}, errors {errs}",
                r.kind.name()
            ));
        }
        for (e, ep) in r.epochs.iter().enumerate() {
            if ep.step_mismatch > 0 || ep.steps == 0 {
                invariants.push(format!(
                    "{} epoch {e}: {} of {} global steps differ from the planner's",
                    r.kind.name(),
                    ep.step_mismatch,
                    ep.steps
                ));
            }
        }
        if o.smoke && r.kind == Kind::Locality && !r.epochs.iter().all(|e| e.locality) {
            invariants.push("locality: an epoch ran in exact order".into());
        }
        if o.smoke && matches!(r.kind, Kind::Peers150 | Kind::Locality) {
            smoke_bounds(o, r, &mut invariants);
        }
    }
    invariants
}

/// `--smoke`: epoch 0 reads at most 1.01 × the dataset from the store, the
/// later epochs at most 1 % of it.
fn smoke_bounds(o: &Opts, r: &ScenarioResult, invariants: &mut Vec<String>) {
    let n = o.samples as f64;
    let r0 = r.epochs[0].total("reads");
    if r0 > 1.01 * n {
        invariants.push(format!(
            "epoch 0 read {r0} samples from the store (bound {:.0})",
            1.01 * n
        ));
    }
    for (e, ep) in r.epochs.iter().enumerate().skip(1) {
        let x = ep.total("reads");
        if x > 0.01 * n {
            invariants.push(format!(
                "epoch {e} read {x} samples from the store (bound {:.0})",
                0.01 * n
            ));
        }
    }
}
