//! One scenario run: agents and loaders in the node namespaces, epoch by
//! epoch, their counters scraped and every step checked against the
//! planner.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use super::netns::{self, Net};
use super::node::{self, parse_line};
use super::options::{Kind, Opts};
use super::procs::{cpu_secs, AgentProc, Proc};
use super::results::{
    add_steps, EpochResult, Monotone, NodeEpoch, Point, Relaunch, ScenarioResult,
};
use super::scenario::{
    agent_toml, arena_mib, batches_per_epoch, hand_view, layout, node_arena, planned_step_ids,
    planned_steps, relaunch_layout, spec_args, Env,
};
use super::{Result, EPOCH_LIMIT, METRICS, PEER_PORT, PROXY_PORT, STORE_PORT};

pub fn run_scenario(o: &Opts, env: &Env, store_pids: &[u32], kind: Kind) -> Result<ScenarioResult> {
    let dir = env.work.join(kind.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let arena = arena_mib(o, env, kind);
    let slow_node = o.nodes - 1;
    if kind == Kind::Slow {
        env.net.set_node_rate(slow_node, o.slow_mbit)?;
    }
    let restore = |net: &Net| {
        if kind == Kind::Slow {
            let _ = net.set_node_rate(slow_node, o.node_mbit);
        }
    };
    let res = scenario_body(o, env, store_pids, kind, &dir, arena);
    restore(&env.net);
    res
}

/// Writes every node's agent configuration and starts its `granaryd`.
fn start_agents(o: &Opts, env: &Env, kind: Kind, dir: &Path, arena: u64) -> Result<Vec<AgentProc>> {
    let p = env.net.prefix().to_owned();
    let mut agents = Vec::new();
    for k in 0..o.nodes {
        let sock = dir.join(format!("n{k}.sock"));
        let config = dir.join(format!("n{k}.toml"));
        std::fs::write(
            &config,
            agent_toml(o, kind, k, node_arena(o, kind, arena, k), &sock),
        )
        .map_err(|e| format!("{}: {e}", config.display()))?;
        agents.push(AgentProc {
            name: format!("granaryd n{k}"),
            ns: netns::node_ns(&p, k),
            bin: env.granaryd.clone(),
            config,
            sock,
            log: dir.join(format!("n{k}.agent.log")),
            child: None,
            cpu_before: 0.0,
        });
    }
    for a in &mut agents {
        a.start()?;
    }
    Ok(agents)
}

/// Starts one loader process per node, in its namespace, each waiting for
/// its first epoch.
#[allow(clippy::too_many_arguments)]
fn start_loaders(
    o: &Opts,
    env: &Env,
    kind: Kind,
    dir: &Path,
    agents: &[AgentProc],
    view_file: &Path,
    victim: usize,
    victim_half: u64,
) -> Result<Vec<Proc>> {
    let p = env.net.prefix().to_owned();
    let mut nodes = Vec::new();
    for (k, agent) in agents.iter().enumerate() {
        let ranks: Vec<String> = o.ranks_in(kind, k).iter().map(u32::to_string).collect();
        let mut c = Net::exec(&netns::node_ns(&p, k), &env.me);
        c.args(["--role", "node"])
            .arg("--sock")
            .arg(&agent.sock)
            .args(["--metrics", METRICS, "--ranks", &ranks.join(",")])
            .args(["--world", &o.world_in(kind).to_string()])
            .args(["--batch", &o.batch_in(kind).to_string(), "--seed", "1"])
            .args(["--probe", &format!("{}:{STORE_PORT}", netns::store_ip())])
            .args(spec_args(&env.spec));
        if kind == Kind::Locality {
            let l: Vec<String> = layout(o).iter().map(u32::to_string).collect();
            c.args(["--layout", &l.join(",")])
                .args(["--nodes", &o.nodes.to_string()])
                .arg("--view")
                .arg(view_file);
        }
        if kind == Kind::Relaunch && o.relaunch_locality {
            let all: Vec<usize> = (0..o.nodes).collect();
            c.args(["--layout", &relaunch_layout(&all)])
                .args(["--nodes", &o.nodes.to_string()])
                .arg("--view")
                .arg(view_file);
        }
        if kind == Kind::Kill && k == victim {
            c.args([
                "--mark-epoch",
                "1",
                "--mark-batches",
                &victim_half.to_string(),
            ]);
        }
        if kind == Kind::Corrupt {
            let ip = netns::node_ip(k);
            c.args(["--proxy-listen", &format!("{ip}:{PROXY_PORT}")])
                .args(["--proxy-upstream", &format!("{ip}:{PEER_PORT}")])
                .args(["--corrupt-every", &o.corrupt_every.to_string()])
                // The first corrupted block early, so that every proxy
                // corrupts some even in a short run.
                .args(["--corrupt-first", &(50 + 17 * k).to_string()]);
        }
        let mut node = Proc::spawn(
            &format!("loader n{k}"),
            c,
            dir.join(format!("n{k}.loader.log")),
        )?;
        node.expect("ready", Duration::from_secs(30))?;
        nodes.push(node);
    }
    Ok(nodes)
}

/// What the epochs of a scenario measured.
struct Measured {
    epochs: Vec<EpochResult>,
    restart_secs: Option<f64>,
    relaunch: Option<Relaunch>,
    timeline: Vec<Point>,
    marks: Vec<f64>,
}

/// `relaunch`'s change in the middle of an epoch: the last node lost.
struct Change<'a> {
    o: &'a Opts,
    kind: Kind,
    dir: &'a Path,
    e: u32,
    /// The global step the relaunched job starts at.
    from: u64,
    /// The node lost.
    lost: usize,
}

/// Every node's counters at the change, how long the change took, and with
/// `--relaunch-locality` the new job's agreement.
type Relaunched = (Vec<BTreeMap<String, f64>>, f64, Option<Option<[u8; 32]>>);

impl Change<'_> {
    /// Kills the lost node's agent and loader, hands the survivors a new
    /// view and relaunches the job on them with one rank fewer and the same
    /// global batch, at the step every rank had committed.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        nodes: &mut [Proc],
        agents: &mut [AgentProc],
        active: &mut [bool],
        mono: &mut [Monotone],
        prev: &mut [BTreeMap<String, f64>],
        loader_cpu: &mut [f64],
        (world, batch): (&mut u32, &mut u32),
    ) -> Result<Relaunched> {
        let Change {
            o,
            kind,
            dir,
            e,
            from,
            lost,
        } = *self;
        let mut locality = None;
        let at = Instant::now();
        // Store reads split at the change: every node's counters
        // now, the lost one's included.
        let at_change = scrape_deltas(nodes, active, mono, prev)?;
        // The last node is lost (agent and loader killed); the job
        // is relaunched on the others with a new view (epoch 2),
        // one rank fewer and the same global batch, at the step
        // every rank had committed.
        active[lost] = false;
        agents[lost].kill9();
        loader_cpu[lost] = cpu_secs(nodes[lost].pid());
        nodes[lost].kill9();
        let survivors: Vec<usize> = (0..o.nodes).filter(|&k| active[k]).collect();
        let view2 = hand_view(agents, &survivors, "relaunch", 2)?;
        let old = (*world, *batch);
        *world -= o.ranks_in(kind, lost).len() as u32;
        *batch = (o.global_batch() / u64::from(*world)) as u32;
        let mut words = format!("world {world} batch={batch}");
        if o.relaunch_locality {
            // The new job's layout over the new view, then its
            // agreement: the same global batch, another layout.
            let f = dir.join("view2.bin");
            std::fs::write(&f, &view2).map_err(|e| format!("{}: {e}", f.display()))?;
            let _ = write!(
                words,
                " layout={} nodes={} view={}",
                relaunch_layout(&survivors),
                survivors.len(),
                f.display()
            );
        }
        for &k in &survivors {
            nodes[k].send(&words)?;
            nodes[k].expect("world", Duration::from_secs(10))?;
        }
        if o.relaunch_locality {
            locality = Some(agree_epoch(nodes, active, *world, e)?);
        }
        let change_secs = at.elapsed().as_secs_f64();
        eprintln!(
            "  relaunch: node n{lost} lost at global step {from} of epoch {e} ({} ranks x {}); \
             the job goes on at step {from} with {world} ranks x {batch} on {} nodes",
            old.0,
            old.1,
            survivors.len()
        );
        Ok((at_change, change_secs, locality))
    }
}

/// What watching one part of an epoch needs besides the processes.
struct Watch<'a> {
    o: &'a Opts,
    kind: Kind,
    e: u32,
    /// The node whose agent `kill` kills (at its loader's `mark`).
    victim: usize,
    /// When the scenario and the epoch began.
    t0: Instant,
    start: Instant,
}

impl Watch<'_> {
    /// Reads every active loader's lines until each has said `done`:
    /// timeline ticks, and in `kill` the victim's agent killed and restarted
    /// at its mark; every active node's epoch.
    #[allow(clippy::too_many_arguments)]
    fn wait(
        &self,
        nodes: &mut [Proc],
        agents: &mut [AgentProc],
        active: &[bool],
        mono: &mut [Monotone],
        timeline: &mut Vec<Point>,
        killed: &mut bool,
        restart_secs: &mut Option<f64>,
    ) -> Result<Vec<Option<NodeEpoch>>> {
        let Watch {
            o,
            kind,
            e,
            victim,
            t0,
            start,
        } = *self;
        let mut done: Vec<Option<NodeEpoch>> = (0..o.nodes)
            .map(|k| (!active[k]).then(NodeEpoch::default))
            .collect();
        while done.iter().any(Option::is_none) {
            let mut idle = true;
            for k in 0..o.nodes {
                if !active[k] {
                    continue;
                }
                while let Some(line) = nodes[k].try_next()? {
                    idle = false;
                    let (verb, kv) = parse_line(&line);
                    match verb.as_str() {
                        "tick" => {
                            if let Some(m) = mono[k].feed(&kv) {
                                timeline.push(Point {
                                    t: t0.elapsed().as_secs_f64(),
                                    node: k,
                                    arena: m["arena"],
                                    peer: m["peer"],
                                    store: m["store"],
                                    reads: m["reads"],
                                });
                            }
                        }
                        "mark" if kind == Kind::Kill && e == 1 && k == victim && !*killed => {
                            *killed = true;
                            let at = Instant::now();
                            agents[victim].kill9();
                            eprintln!(
                                "  kill: granaryd n{victim} killed (SIGKILL) after {} batches of epoch 1",
                                kv.get("batches").map_or("?", String::as_str)
                            );
                            std::thread::sleep(Duration::from_millis(o.restart_ms));
                            agents[victim].start()?;
                            let s = at.elapsed().as_secs_f64();
                            eprintln!(
                                "  kill: granaryd n{victim} answering again {s:.2} s after the kill"
                            );
                            *restart_secs = Some(s);
                        }
                        "done" => done[k] = Some(node_epoch(&kv)),
                        _ => {}
                    }
                }
            }
            if start.elapsed() > EPOCH_LIMIT {
                return Err(format!(
                    "{}: epoch {e} did not finish in {EPOCH_LIMIT:?}",
                    kind.name()
                ));
            }
            if idle {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(done)
    }
}

/// The job's steps this epoch and how many of the delivered steps differ
/// from the planner's (`want`), the parts' step hashes added up.
fn compare_steps(part_steps: &[(Vec<u64>, u32, u32)], want: &[u64]) -> (u64, u64) {
    let mut got = Vec::new();
    for (steps, _, _) in part_steps {
        add_steps(&mut got, steps);
    }
    let mismatch = (0..got.len().max(want.len()))
        .filter(|&i| got.get(i).copied().unwrap_or(0) != want.get(i).copied().unwrap_or(0))
        .count() as u64;
    (want.len() as u64, mismatch)
}

/// Every node's counters of the epoch: those up to a change (`at_change`)
/// plus those after it.
fn add_counters(
    res: &mut EpochResult,
    at_change: &[BTreeMap<String, f64>],
    after: &[BTreeMap<String, f64>],
) {
    for (k, node) in res.nodes.iter_mut().enumerate() {
        let mut m = at_change[k].clone();
        for (key, v) in &after[k] {
            *m.entry(key.clone()).or_insert(0.0) += v;
        }
        node.m = m;
    }
}

/// The command that runs one part of epoch `e` on a loader: in locality
/// order when the job agreed on `locality`, from global step `from`, up to
/// `stop`.
fn epoch_command(e: u32, locality: Option<&[u8; 32]>, from: u64, stop: Option<u64>) -> String {
    let mut cmd = format!("epoch {e}");
    if let Some(d) = locality {
        let _ = write!(cmd, " locality={}", node::digest_hex(d));
    }
    if from > 0 {
        let _ = write!(cmd, " from={from}");
    }
    if let Some(s) = stop {
        let _ = write!(cmd, " stop={s}");
    }
    cmd
}

/// Store reads of every node's counters together.
fn total_reads(ms: &[BTreeMap<String, f64>]) -> f64 {
    ms.iter().filter_map(|m| m.get("reads")).sum()
}

/// Stops the loaders (reading their last counters) and the agents; the
/// scenario's result with every process's CPU time.
#[allow(clippy::too_many_arguments)]
fn finish(
    kind: Kind,
    arena: u64,
    agents: Vec<AgentProc>,
    mut nodes: Vec<Proc>,
    active: &[bool],
    mut loader_cpu: Vec<f64>,
    store_pids: &[u32],
    store_cpu0: f64,
    m: Measured,
) -> Result<ScenarioResult> {
    let Measured {
        epochs,
        restart_secs,
        relaunch,
        timeline,
        marks,
    } = m;
    let agent_cpu: Vec<f64> = agents.iter().map(AgentProc::cpu).collect();
    for (k, n) in nodes.iter().enumerate() {
        if active[k] {
            loader_cpu[k] = cpu_secs(n.pid());
        }
    }
    let store_cpu = store_pids.iter().map(|&p| cpu_secs(p)).sum::<f64>() - store_cpu0;
    let (mut corrupted, mut proxied_blocks) = (0, 0);
    for (k, n) in nodes.iter_mut().enumerate() {
        if !active[k] {
            continue;
        }
        n.send("quit")?;
        let kv = n.expect("final", Duration::from_secs(10))?;
        corrupted += kv
            .get("corrupted")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        proxied_blocks += kv
            .get("blocks")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    for n in nodes {
        n.finish();
    }
    drop(agents);
    Ok(ScenarioResult {
        kind,
        arena_mib: arena,
        epochs,
        agent_cpu,
        loader_cpu,
        store_cpu,
        corrupted,
        proxied_blocks,
        restart_secs,
        relaunch,
        timeline,
        marks,
    })
}

/// A scenario's processes and what they have measured so far, epoch by
/// epoch.
struct Run<'a> {
    o: &'a Opts,
    kind: Kind,
    dir: &'a Path,
    agents: Vec<AgentProc>,
    nodes: Vec<Proc>,
    /// Whether each node still runs (`relaunch` loses the last one).
    active: Vec<bool>,
    mono: Vec<Monotone>,
    prev: Vec<BTreeMap<String, f64>>,
    timeline: Vec<Point>,
    /// Seconds since the scenario began at the start of each epoch.
    marks: Vec<f64>,
    restart_secs: Option<f64>,
    loader_cpu: Vec<f64>,
    /// The job's world size and every rank's batch now.
    world: u32,
    batch: u32,
    t0: Instant,
    /// The node whose agent `kill` kills, and the node `relaunch` loses.
    victim: usize,
    lost: usize,
    /// `relaunch`: the epoch the last node is lost in, after a warm-up.
    split: u32,
}

impl Run<'_> {
    /// Runs epoch `e` (in `relaunch`'s split epoch, the old job's part,
    /// the change and the relaunched job's part); `epochs` are those before
    /// it, and `relaunch` records the change's checks and the later epochs'
    /// store reads.
    fn epoch(
        &mut self,
        e: u32,
        epochs: &[EpochResult],
        relaunch: &mut Option<Relaunch>,
    ) -> Result<EpochResult> {
        let (o, kind, dir) = (self.o, self.kind, self.dir);
        let (t0, victim, lost, split) = (self.t0, self.victim, self.lost, self.split);
        let mut locality =
            if kind == Kind::Locality || (kind == Kind::Relaunch && o.relaunch_locality) {
                agree_epoch(&mut self.nodes, &self.active, self.world, e)?
            } else {
                None
            };
        // Whether every part of the epoch ran in locality order.
        let mut every_part_locality = true;
        // The parts of the epoch, (from, stop): in `relaunch`'s split
        // epoch, the old job runs global steps 0..K (about half) and the
        // relaunched one K.. .
        let parts: Vec<(u64, Option<u64>)> = if kind == Kind::Relaunch && e == split {
            let k = planned_steps(o, self.world, self.batch, e).len() as u64 / 2;
            vec![(0, Some(k)), (k, None)]
        } else {
            vec![(0, None)]
        };
        let start = Instant::now();
        self.marks.push(t0.elapsed().as_secs_f64());
        let mut merged: Vec<NodeEpoch> = vec![NodeEpoch::default(); o.nodes];
        // Per part: the job-wide hash of every step delivered, and the
        // (world, batch) it ran with.
        let mut part_steps: Vec<(Vec<u64>, u32, u32)> = Vec::new();
        let mut want: Vec<u64> = Vec::new();
        let mut at_change: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new(); o.nodes];
        let mut change_secs = 0.0;
        let mut killed = false;
        for (pi, &(from, stop)) in parts.iter().enumerate() {
            if pi > 0 {
                let change = Change {
                    o,
                    kind,
                    dir,
                    e,
                    from,
                    lost,
                };
                let relaunched = change.apply(
                    &mut self.nodes,
                    &mut self.agents,
                    &mut self.active,
                    &mut self.mono,
                    &mut self.prev,
                    &mut self.loader_cpu,
                    (&mut self.world, &mut self.batch),
                )?;
                at_change = relaunched.0;
                change_secs = relaunched.1;
                if let Some(l) = relaunched.2 {
                    locality = l;
                }
            }
            every_part_locality &= locality.is_some();
            let plan = planned_steps(o, self.world, self.batch, e);
            let hi = stop.map_or(plan.len(), |s| s as usize).min(plan.len());
            if want.len() < plan.len() {
                want.resize(plan.len(), 0);
            }
            want[from as usize..hi].copy_from_slice(&plan[from as usize..hi]);
            let cmd = epoch_command(e, locality.as_ref(), from, stop);
            for (k, n) in self.nodes.iter_mut().enumerate() {
                if self.active[k] {
                    n.send(&cmd)?;
                }
            }
            let watch = Watch {
                o,
                kind,
                e,
                victim,
                t0,
                start,
            };
            let done = watch.wait(
                &mut self.nodes,
                &mut self.agents,
                &self.active,
                &mut self.mono,
                &mut self.timeline,
                &mut killed,
                &mut self.restart_secs,
            )?;
            let mut job = Vec::new();
            for (k, ne) in done.into_iter().enumerate() {
                let ne = ne.unwrap_or_default();
                add_steps(&mut job, &ne.steps);
                merged[k].merge(ne);
            }
            part_steps.push((job, self.world, self.batch));
        }
        let secs = start.elapsed().as_secs_f64();
        let mut res = EpochResult {
            secs,
            nodes: merged,
            locality: every_part_locality,
            ..EpochResult::default()
        };
        (res.steps, res.step_mismatch) = compare_steps(&part_steps, &want);
        let after = scrape_deltas(
            &mut self.nodes,
            &self.active,
            &mut self.mono,
            &mut self.prev,
        )?;
        add_counters(&mut res, &at_change, &after);
        if parts.len() > 1 {
            let mut r = check_steps(o, e, parts[1].0, &part_steps);
            r.differing = res.step_mismatch;
            r.reads_before = total_reads(&at_change);
            r.reads_rest = total_reads(&after);
            r.lost_share = epochs[0].nodes[lost].m.get("reads").copied().unwrap_or(0.0);
            r.change_secs = change_secs;
            r.locality = every_part_locality;
            *relaunch = Some(r);
        } else if let Some(r) = relaunch.as_mut() {
            r.reads_later.push(res.total("reads"));
        }
        eprintln!(
            "  {} epoch {e}: {:.1} s, {} samples, store reads {:.0}, steps differing from the planner {} of {}",
            kind.name(),
            secs,
            res.samples(),
            res.total("reads"),
            res.step_mismatch,
            res.steps
        );
        Ok(res)
    }
}

pub fn scenario_body(
    o: &Opts,
    env: &Env,
    store_pids: &[u32],
    kind: Kind,
    dir: &Path,
    arena: u64,
) -> Result<ScenarioResult> {
    let agents = start_agents(o, env, kind, dir, arena)?;
    let view_file = dir.join("view.bin");
    if matches!(kind, Kind::Relaunch | Kind::Locality) {
        let all: Vec<usize> = (0..o.nodes).collect();
        let view = hand_view(&agents, &all, kind.name(), 1)?;
        std::fs::write(&view_file, view).map_err(|e| format!("{}: {e}", view_file.display()))?;
    }
    let victim = 1usize;
    let victim_half: u64 = o
        .ranks(victim)
        .iter()
        .map(|&r| batches_per_epoch(o, r))
        .sum::<u64>()
        / 2;
    let nodes = start_loaders(o, env, kind, dir, &agents, &view_file, victim, victim_half)?;
    let store_cpu0: f64 = store_pids.iter().map(|&p| cpu_secs(p)).sum();
    let mut run = Run {
        o,
        kind,
        dir,
        agents,
        nodes,
        active: vec![true; o.nodes],
        mono: (0..o.nodes).map(|_| Monotone::default()).collect(),
        prev: vec![BTreeMap::new(); o.nodes],
        timeline: Vec::new(),
        marks: Vec::new(),
        restart_secs: None,
        loader_cpu: vec![0.0; o.nodes],
        world: o.world_in(kind),
        batch: o.batch_in(kind),
        t0: Instant::now(),
        victim,
        lost: o.nodes - 1,
        split: 1,
    };
    let mut epochs: Vec<EpochResult> = Vec::new();
    let mut relaunch: Option<Relaunch> = None;
    for e in 0..o.epochs {
        let res = run.epoch(e, &epochs, &mut relaunch)?;
        epochs.push(res);
    }
    let measured = Measured {
        epochs,
        restart_secs: run.restart_secs,
        relaunch,
        timeline: run.timeline,
        marks: run.marks,
    };
    finish(
        kind,
        arena,
        run.agents,
        run.nodes,
        &run.active,
        run.loader_cpu,
        store_pids,
        store_cpu0,
        measured,
    )
}

/// Every active node's counters now, as deltas from `prev` (which they
/// replace); an empty map for the nodes no longer active.
pub fn scrape_deltas(
    nodes: &mut [Proc],
    active: &[bool],
    mono: &mut [Monotone],
    prev: &mut [BTreeMap<String, f64>],
) -> Result<Vec<BTreeMap<String, f64>>> {
    let mut out = vec![BTreeMap::new(); nodes.len()];
    for (k, n) in nodes.iter_mut().enumerate() {
        if !active[k] {
            continue;
        }
        n.send("scrape")?;
        let kv = n.expect("scraped", Duration::from_secs(10))?;
        let now = mono[k].feed(&kv).unwrap_or_else(|| prev[k].clone());
        out[k] = now
            .iter()
            .map(|(key, v)| (key.clone(), v - prev[k].get(key).copied().unwrap_or(0.0)))
            .collect();
        prev[k] = now;
    }
    Ok(out)
}

/// `relaunch`'s step checks for epoch `e`, the job changed at global step
/// `at`: `parts` holds the job-wide step hashes delivered before and after
/// the change, each with its (world, batch). A step nobody delivered has
/// hash 0 (a delivered one is 0 with probability 2^-64).
pub fn check_steps(o: &Opts, e: u32, at: u64, parts: &[(Vec<u64>, u32, u32)]) -> Relaunch {
    let (before, w0, b0) = &parts[0];
    let (after, w1, b1) = &parts[1];
    let plan0 = planned_step_ids(o, *w0, *b0, e);
    let plan1 = planned_step_ids(o, *w1, *b1, e);
    let hash = |ids: &[u64]| {
        ids.iter()
            .fold(0u64, |h, &id| h.wrapping_add(node::step_term(id)))
    };
    let steps = plan0.len().max(plan1.len());
    let planner_differing = (0..steps)
        .filter(|&i| plan0.get(i).map(|x| hash(x)) != plan1.get(i).map(|x| hash(x)))
        .count() as u64;
    let at = at as usize;
    let on = |v: &Vec<u64>, i: usize| v.get(i).is_some_and(|&h| h != 0);
    let twice = (0..steps)
        .filter(|&i| on(before, i) && on(after, i))
        .count() as u64;
    let missing = (0..steps)
        .filter(|&i| !on(before, i) && !on(after, i))
        .count() as u64;
    let wrong_side = (0..steps.max(before.len()).max(after.len()))
        .filter(|&i| (i >= at && on(before, i)) || (i < at && on(after, i)))
        .count() as u64;
    // The plan's union: steps 0..at of the old world, at.. of the new.
    let mut count = vec![0u32; o.samples as usize];
    let ids = plan0.iter().take(at).chain(plan1.iter().skip(at)).flatten();
    for &id in ids {
        if let Some(c) = count.get_mut(id as usize) {
            *c += 1;
        }
    }
    let union_extra = count.iter().map(|&c| u64::from(c.saturating_sub(1))).sum();
    let union_missing = count.iter().filter(|&&c| c == 0).count() as u64;
    let w = u64::from(*w1);
    Relaunch {
        epoch: e,
        at: at as u64,
        steps: steps as u64,
        world: (*w0, *w1),
        batch: (*b0, *b1),
        planner_differing,
        twice,
        missing,
        wrong_side,
        union_extra,
        union_missing,
        padding: o.samples.div_ceil(w) * w - o.samples,
        ..Relaunch::default()
    }
}

/// Asks every active node's ranks for the assignment of epoch `e` and
/// applies the job's rule: the agreed digest, or `None` (exact order, the
/// reason printed).
pub fn agree_epoch(
    nodes: &mut [Proc],
    active: &[bool],
    world: u32,
    e: u32,
) -> Result<Option<[u8; 32]>> {
    for (k, n) in nodes.iter_mut().enumerate() {
        if active[k] {
            n.send(&format!("assign {e}"))?;
        }
    }
    let mut infos: Vec<Option<granary::AssignmentInfo>> = vec![None; world as usize];
    for (k, n) in nodes.iter_mut().enumerate() {
        if !active[k] {
            continue;
        }
        let kv = n.expect("assigned", Duration::from_secs(60))?;
        for word in kv.get("infos").map_or("", String::as_str).split('|') {
            let mut parts = word.splitn(3, ':');
            let (Some(r), Some(ok), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("bad assignment answer {word:?}"));
            };
            let r: usize = r.parse().map_err(|_| format!("bad rank in {word:?}"))?;
            let info = if ok == "1" {
                granary::AssignmentInfo {
                    locality: true,
                    digest: node::parse_digest(rest)?,
                    note: String::new(),
                }
            } else {
                granary::AssignmentInfo {
                    locality: false,
                    digest: [0; 32],
                    note: rest.replace('_', " "),
                }
            };
            if let Some(slot) = infos.get_mut(r) {
                *slot = Some(info);
            }
        }
    }
    let infos: Vec<granary::AssignmentInfo> = infos
        .into_iter()
        .enumerate()
        .map(|(r, i)| {
            i.unwrap_or(granary::AssignmentInfo {
                locality: false,
                digest: [0; 32],
                note: format!("rank {r} did not answer"),
            })
        })
        .collect();
    match granary::agree(&infos) {
        granary::Agreement::Locality(d) => Ok(Some(d)),
        granary::Agreement::Exact(why) => {
            eprintln!("  locality: epoch {e} runs in exact order: {why}");
            Ok(None)
        }
    }
}

pub fn node_epoch(kv: &BTreeMap<String, String>) -> NodeEpoch {
    let u = |k: &str| kv.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let list = |k: &str| -> Vec<String> {
        kv.get(k)
            .filter(|v| v.as_str() != "-")
            .map(|v| v.split('|').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    NodeEpoch {
        samples: u("samples"),
        bytes: u("bytes"),
        secs: kv.get("secs").and_then(|v| v.parse().ok()).unwrap_or(0.0),
        lost: u("lost"),
        dup: u("dup"),
        bad: u("bad"),
        replayed: u("replayed"),
        reopens: u("reopens"),
        waits_us: kv
            .get("waits")
            .filter(|v| v.as_str() != "-")
            .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default(),
        errors: list("errors"),
        reasons: list("reasons"),
        m: BTreeMap::new(),
        steps: kv
            .get("steps")
            .filter(|v| v.as_str() != "-")
            .map(|v| {
                v.split(',')
                    .filter_map(|x| u64::from_str_radix(x, 16).ok())
                    .collect()
            })
            .unwrap_or_default(),
    }
}
