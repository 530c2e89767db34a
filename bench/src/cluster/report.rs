//! What a run prints: each scenario's table, its JSON object, the timeline
//! and the plot.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use super::goals::Verdict;
use super::options::{Kind, Opts};
use super::results::{EpochResult, NodeEpoch, Relaunch, ScenarioResult};
use super::{pct, Result};
use crate::report::{percentile, Json};

pub fn print_scenario(o: &Opts, r: &ScenarioResult) {
    let n = o.samples as f64;
    println!(
        "\n== {} (arena {} MiB per agent{})",
        r.kind.name(),
        r.arena_mib,
        if r.kind.keep_pct() > 0 {
            format!(
                ", keep areas together {} % of the dataset",
                r.kind.keep_pct()
            )
        } else {
            ", no peers".into()
        }
    );
    println!(
        "{:>5} {:>4} {:>7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>7} {:>8} {:>8} {:>8} {:>9}",
        "epoch",
        "node",
        "samples",
        "local",
        "peer",
        "reads",
        "MB peer",
        "MB store",
        "secs",
        "p50 ms",
        "p99 ms",
        "served",
        "lost/dup"
    );
    for (e, ep) in r.epochs.iter().enumerate() {
        print_epoch(n, e, ep);
    }
    let total: u64 = r.epochs.iter().map(EpochResult::samples).sum();
    let cpu: Vec<String> = (0..o.nodes)
        .map(|k| {
            let s = r.node_samples(k).max(1) as f64;
            format!(
                "n{k}: granaryd {:.0} µs, loader {:.0} µs",
                r.agent_cpu[k] / s * 1e6,
                r.loader_cpu[k] / s * 1e6
            )
        })
        .collect();
    println!(
        "  CPU per delivered sample: {}; store (SeaweedFS + delay proxy) {:.0} µs",
        cpu.join("; "),
        r.store_cpu / total.max(1) as f64 * 1e6
    );
    if r.kind == Kind::Corrupt {
        println!(
            "  corrupting proxies: {} blocks forwarded, {} corrupted",
            r.proxied_blocks, r.corrupted
        );
    }
    if let Some(s) = r.restart_secs {
        println!("  kill: the agent answered again {s:.2} s after the kill");
    }
    if let Some(x) = &r.relaunch {
        print_relaunch(o, x);
    }
}

/// One epoch's table: every node, the whole job, the peer requests, and
/// the errors and reopened sessions.
fn print_epoch(n: f64, e: usize, ep: &EpochResult) {
    for (k, ne) in ep.nodes.iter().enumerate() {
        let g = |key: &str| ne.m.get(key).copied().unwrap_or(0.0);
        let mut w = ne.waits_us.clone();
        w.sort_unstable();
        println!(
            "{:>5} {:>4} {:>7} {:>7.0} {:>7.0} {:>7.0} {:>9.1} {:>9.1} {:>7.2} {:>8.2} {:>8.2} {:>8.0} {:>9}",
            e,
            format!("n{k}"),
            ne.samples,
            g("arena"),
            g("peer"),
            g("reads"),
            g("peer_b") / 1e6,
            g("store_b") / 1e6,
            ne.secs,
            percentile(&w, 50.0).unwrap_or(0) as f64 / 1e3,
            percentile(&w, 99.0).unwrap_or(0) as f64 / 1e3,
            g("served"),
            format!("{}/{}", ne.lost, ne.dup),
        );
    }
    let w = ep.waits();
    let (lost, dup, bad, errs) = ep.broken();
    println!(
        "{:>5} {:>4} {:>7} {:>7.0} {:>7.0} {:>7.0}  store reads {} of the dataset, {:.2} s, {:.0} samples/s, p50 {:.2} ms, p99 {:.2} ms, lost {lost}, duplicated {dup}, bad bytes {bad}, errors {errs}, CRC failures {:.0}, hedged {:.0}",
        e,
        "all",
        ep.samples(),
        ep.total("arena"),
        ep.total("peer"),
        ep.total("reads"),
        pct(ep.total("reads") / n),
        ep.secs,
        ep.samples() as f64 / ep.secs,
        percentile(&w, 50.0).unwrap_or(0) as f64 / 1e3,
        percentile(&w, 99.0).unwrap_or(0) as f64 / 1e3,
        ep.total("crc"),
        ep.total("hedged"),
    );
    println!(
        "{:>5} {:>4}  {} order; global steps differing from the planner: {} of {}; assigned samples kept on another node: {}",
        e,
        "job",
        if ep.locality { "locality-aware" } else { "exact" },
        ep.step_mismatch,
        ep.steps,
        pct(ep.moved_frac()),
    );
    // Where the peer requests went: hedged, routed around a slow peer,
    // cancelled at the owner (and what the owners did with cancels).
    let asked: Vec<String> = ep
        .nodes
        .iter()
        .enumerate()
        .map(|(k, ne)| {
            let g = |key: &str| ne.m.get(key).copied().unwrap_or(0.0);
            format!(
                "n{k} {:.0}/{:.0}/{:.0}/{:.0}/{:.0}",
                g("hedged"),
                g("slow_routed"),
                g("cancels"),
                g("cancelled"),
                g("not_started")
            )
        })
        .collect();
    println!(
        "{:>5} {:>4}  peer requests hedged/slow-routed/cancels sent; cancelled here/reads not started: {}",
        e,
        "reqs",
        asked.join(", ")
    );
    for ne in &ep.nodes {
        for err in &ne.errors {
            println!("      error: {err}");
        }
        for why in &ne.reasons {
            println!("      session reopened: {}", why.replace('_', " "));
        }
    }
}

/// `relaunch`: the change, the step checks and the store reads after it.
fn print_relaunch(o: &Opts, x: &Relaunch) {
    let n = o.samples as f64;
    println!(
        "  relaunch ({} order): node n{} lost at global step {} of {} in epoch {}: {} ranks x {} -> {} x {} ({:.2} s from the stop to the relaunched ranks' command)",
        if x.locality { "locality" } else { "exact" },
        o.nodes - 1,
        x.at,
        x.steps,
        x.epoch,
        x.world.0,
        x.batch.0,
        x.world.1,
        x.batch.1,
        x.change_secs
    );
    let Relaunch {
        epoch,
        differing,
        twice,
        missing,
        wrong_side,
        union_extra,
        union_missing,
        padding,
        planner_differing,
        steps,
        ..
    } = x;
    println!(
        "  relaunch: epoch {epoch} steps differing from the planner {differing}, delivered twice {twice}, missing {missing}, on the wrong side of the change {wrong_side}; \
         the plan's union {union_extra} extra copies, {union_missing} samples missing (padding {padding}); the planner's steps differ between the two worlds in {planner_differing} of {steps}"
    );
    let later: Vec<String> = x.reads_later.iter().map(|v| format!("{v:.0}")).collect();
    println!(
        "  relaunch: store reads before the change {:.0}, rest of epoch {} {:.0}, later epochs {}: after the change {:.0} ({}); \
         the lost node's owned share (its epoch-0 store reads) {:.0}",
        x.reads_before,
        x.epoch,
        x.reads_rest,
        if later.is_empty() { "-".to_owned() } else { later.join(", ") },
        x.reads_after(),
        pct(x.reads_after() / n),
        x.lost_share
    );
}

pub fn scenario_json(o: &Opts, r: &ScenarioResult) -> String {
    let n = o.samples as f64;
    let mut j = Json::default();
    j.int("arena_mib", r.arena_mib)
        .int("keep_pct_of_dataset", r.kind.keep_pct());
    let per = |f: &dyn Fn(&EpochResult) -> f64| -> Vec<f64> { r.epochs.iter().map(f).collect() };
    j.nums("epoch_secs", &per(&|e| e.secs), 3)
        .nums("samples_per_s", &per(&|e| e.samples() as f64 / e.secs), 1)
        .nums("samples", &per(&|e| e.samples() as f64), 0)
        .nums("store_reads_frac", &per(&|e| e.total("reads") / n), 4)
        .nums("tier_local", &per(&|e| e.total("arena")), 0)
        .nums("tier_peer", &per(&|e| e.total("peer")), 0)
        .nums("tier_store", &per(&|e| e.total("store")), 0)
        .nums("bytes_peer", &per(&|e| e.total("peer_b")), 0)
        .nums("bytes_store", &per(&|e| e.total("store_b")), 0)
        .nums(
            "p50_wait_ms",
            &per(&|e| percentile(&e.waits(), 50.0).unwrap_or(0) as f64 / 1e3),
            3,
        )
        .nums(
            "p99_wait_ms",
            &per(&|e| percentile(&e.waits(), 99.0).unwrap_or(0) as f64 / 1e3),
            3,
        )
        .nums(
            "max_wait_ms",
            &per(&|e| e.waits().last().copied().unwrap_or(0) as f64 / 1e3),
            3,
        )
        .nums("crc_failures", &per(&|e| e.total("crc")), 0)
        .nums("hedged", &per(&|e| e.total("hedged")), 0)
        .nums("locality", &per(&|e| f64::from(u8::from(e.locality))), 0)
        .nums("moved_frac", &per(&EpochResult::moved_frac), 4)
        .nums("steps_differing", &per(&|e| e.step_mismatch as f64), 0);
    let nodes: Vec<String> = (0..o.nodes).map(|k| node_json(r, k)).collect();
    j.raw("nodes", &format!("[{}]", nodes.join(",")));
    let total: u64 = r.epochs.iter().map(EpochResult::samples).sum();
    j.num(
        "store_cpu_us_per_sample",
        r.store_cpu / total.max(1) as f64 * 1e6,
        1,
    );
    let (lost, dup, bad, errs) = r.broken();
    j.int("lost", lost)
        .int("duplicated", dup)
        .int("bad_bytes", bad)
        .int("errors", errs as u64);
    if r.kind == Kind::Corrupt {
        j.int("blocks_corrupted", r.corrupted)
            .int("blocks_proxied", r.proxied_blocks);
    }
    if let Some(s) = r.restart_secs {
        j.num("restart_secs", s, 3);
    }
    if let Some(x) = &r.relaunch {
        j.raw("relaunch", &relaunch_json(x));
    }
    j.line()
}

/// Node `k`'s series in a scenario's JSON object, one value per epoch.
fn node_json(r: &ScenarioResult, k: usize) -> String {
    let mut nj = Json::default();
    let per = |f: &dyn Fn(&NodeEpoch) -> f64| -> Vec<f64> {
        r.epochs.iter().map(|e| f(&e.nodes[k])).collect()
    };
    let g = |key: &'static str| move |ne: &NodeEpoch| ne.m.get(key).copied().unwrap_or(0.0);
    // The `p`-th percentile of the loader's waits, ms.
    let wait_ms = |p: f64| {
        move |ne: &NodeEpoch| {
            let mut w = ne.waits_us.clone();
            w.sort_unstable();
            percentile(&w, p).unwrap_or(0) as f64 / 1e3
        }
    };
    let s = r.node_samples(k).max(1) as f64;
    nj.nums("samples", &per(&|ne| ne.samples as f64), 0)
        .nums("bytes", &per(&|ne| ne.bytes as f64), 0)
        .nums("reopens", &per(&|ne| ne.reopens as f64), 0)
        .nums("local", &per(&g("arena")), 0)
        .nums("peer", &per(&g("peer")), 0)
        .nums("store", &per(&g("store")), 0)
        .nums("store_reads", &per(&g("reads")), 0)
        .nums("bytes_peer", &per(&g("peer_b")), 0)
        .nums("bytes_store", &per(&g("store_b")), 0)
        .nums("secs", &per(&|ne| ne.secs), 3)
        .nums("p50_wait_ms", &per(&wait_ms(50.0)), 3)
        .nums("p99_wait_ms", &per(&wait_ms(99.0)), 3)
        .nums("lost", &per(&|ne| ne.lost as f64), 0)
        .nums("duplicated", &per(&|ne| ne.dup as f64), 0)
        .nums("bad_bytes", &per(&|ne| ne.bad as f64), 0)
        .nums("replayed_batches", &per(&|ne| ne.replayed as f64), 0)
        .num("agent_cpu_us_per_sample", r.agent_cpu[k] / s * 1e6, 1)
        .num("loader_cpu_us_per_sample", r.loader_cpu[k] / s * 1e6, 1);
    nj.line()
}

/// `relaunch`'s checks in its scenario's JSON object.
fn relaunch_json(x: &Relaunch) -> String {
    let mut rj = Json::default();
    rj.int("epoch", u64::from(x.epoch))
        .str("assignment", if x.locality { "locality" } else { "exact" })
        .int("at_step", x.at)
        .int("steps", x.steps)
        .int("world_before", u64::from(x.world.0))
        .int("world_after", u64::from(x.world.1))
        .int("batch_before", u64::from(x.batch.0))
        .int("batch_after", u64::from(x.batch.1))
        .int("steps_differing", x.differing)
        .int("steps_twice", x.twice)
        .int("steps_missing", x.missing)
        .int("steps_wrong_side", x.wrong_side)
        .int("union_extra", x.union_extra)
        .int("union_missing", x.union_missing)
        .int("padding", x.padding)
        .int(
            "planner_steps_differing_between_worlds",
            x.planner_differing,
        )
        .num("reads_before_change", x.reads_before, 0)
        .num("reads_rest_of_epoch", x.reads_rest, 0)
        .nums("reads_later_epochs", &x.reads_later, 0)
        .num("reads_after_change", x.reads_after(), 0)
        .num("lost_node_owned_share", x.lost_share, 0)
        .num("change_secs", x.change_secs, 3);
    rj.line()
}
pub fn write_timeline(path: &Path, rs: &[ScenarioResult]) -> Result<()> {
    let mut s = String::from("scenario,t,node,local,peer,store,reads\n");
    for r in rs {
        for (e, t) in r.marks.iter().enumerate() {
            let _ = writeln!(s, "{},{t:.3},epoch,{e},0,0,0", r.kind.name());
        }
        for p in &r.timeline {
            let _ = writeln!(
                s,
                "{},{:.3},{},{},{},{},{}",
                r.kind.name(),
                p.t,
                p.node,
                p.arena,
                p.peer,
                p.store,
                p.reads
            );
        }
    }
    std::fs::write(path, s).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn draw(timeline: &Path, png: &Path) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster_plot.py");
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let st = Command::new(&py)
        .arg(&script)
        .arg(timeline)
        .arg(png)
        .status()
        .map_err(|e| format!("{py}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{} exited with {st}", script.display()))
    }
}

/// Prints whether the invariants held and the goals' verdicts.
pub fn print_verdicts(o: &Opts, broken: &[String], gs: &[Verdict]) {
    println!(
        "\ninvariants (every consumer received exactly its plan, per step; every byte verified{}): {}",
        if o.smoke { "; store reads bound" } else { "" },
        if broken.is_empty() {
            "hold".to_owned()
        } else {
            format!("BROKEN: {}", broken.join("; "))
        }
    );
    if !gs.is_empty() {
        println!("\ngoals:");
        for g in gs {
            println!("  [{}] {}: {}", g.verdict, g.goal, g.detail);
        }
    }
}

/// Writes `OUT/timeline.csv` and draws the plot from it.
pub fn timeline_and_plot(o: &Opts, results: &[ScenarioResult]) -> Result<()> {
    let timeline = o.out.join("timeline.csv");
    write_timeline(&timeline, results)?;
    println!("timeline: {}", timeline.display());
    if let Some(png) = &o.plot {
        match draw(&timeline, png) {
            Ok(()) => println!("plot: {}", png.display()),
            Err(e) => println!("plot: not drawn: {e}"),
        }
    }
    Ok(())
}

/// The result line's parts.
pub struct Line<'a> {
    pub o: &'a Opts,
    pub dataset_bytes: u64,
    /// The regime at the start and at the end.
    pub regimes: [&'a str; 2],
    pub results: &'a [ScenarioResult],
    pub goals: &'a [Verdict],
    /// The invariants that broke.
    pub broken: &'a [String],
}

impl Line<'_> {
    /// The result line.
    pub fn json(&self) -> Json {
        let o = self.o;
        let mut j = Json::bench(if o.smoke { "cluster-smoke" } else { "cluster" });
        j.int("samples", o.samples)
            .int("mean_bytes", o.mean)
            .num("sigma", o.sigma, 2)
            .int("dataset_bytes", self.dataset_bytes)
            .int("nodes", o.nodes as u64)
            .int("ranks", u64::from(o.world()))
            .int("batch", u64::from(o.batch))
            .int("epochs", u64::from(o.epochs))
            .int("node_mbit", u64::from(o.node_mbit))
            .int("store_mbit", u64::from(o.store_mbit))
            .int("rtt_ms", o.rtt_ms)
            .int("hedge_ms", o.hedge_ms)
            .int("owner_grace_ms", o.owner_grace_ms)
            .str("regime_start", self.regimes[0])
            .str("regime_end", self.regimes[1]);
        let sj: Vec<String> = self
            .results
            .iter()
            .map(|r| format!("\"{}\":{}", r.kind.name(), scenario_json(o, r)))
            .collect();
        j.raw("scenarios", &format!("{{{}}}", sj.join(",")));
        let gj: Vec<String> = self
            .goals
            .iter()
            .map(|g| {
                let mut x = Json::default();
                x.str("goal", g.goal)
                    .str("verdict", g.verdict)
                    .str("detail", &g.detail);
                x.line()
            })
            .collect();
        j.raw("goals", &format!("[{}]", gj.join(",")));
        j.str(
            "invariants",
            if self.broken.is_empty() {
                "hold"
            } else {
                "broken"
            },
        );
        j
    }
}
