//! `bench/run stall --two-jobs`: two training jobs on one node share one
//! agent and one dataset in the store at 100 ms RTT, one with a GPU step
//! half the other's; the sum of their GPU-idle fractions with
//! `prefetch.balance = "stall"` against `"static"`, in the same run
//! (issue 26 part 5, key `lobster_idle_ratio`, goal ≤ 0.67).
//!
//! The regime, fixed before any run (docs/benchmarks.md):
//!
//! * the light store in this process (2 worker threads) behind the delay
//!   proxy at 100 ms RTT; a synthetic dataset (default 32,000 files of
//!   ~8 KB);
//! * one fresh agent per pair of jobs, as `bench/run stall` sets it up
//!   (1 GiB arena, `window_batches = 64`) but with
//!   `prefetch.max_inflight_reads = 80` (`--max-inflight`): 80 reads per
//!   100 ms carry about 800 samples/s, and the two jobs consume 600
//!   (slow: 32 samples per 160 ms step; fast: per 80 ms), so the cap binds
//!   whenever both want more than a steady trickle (while windows fill)
//!   but not in the steady state;
//! * each job is `bench/stall_consume.c` (one libgranary session, the GPU
//!   step a sleep), its own seed (its own order over the same samples),
//!   no warm-up: its GPU-idle fraction is the time in `granary_next_batch`
//!   over the `--window-s` seconds (default 20) from its session's open;
//! * the second job starts 200 ms after the first (the first one's session
//!   is the older); which job goes first alternates between repetitions,
//!   and both policies run with the same order in each repetition
//!   (interleaved: static, stall; then stall, static; …);
//! * the figure: the mean over repetitions of (slow idle + fast idle), with
//!   "stall" over the same with "static".

use crate::agent::{Agent, AgentSettings, S3Dataset};
use crate::data;
use crate::delay_proxy::DelayProxy;
use crate::light_store::LightStore;
use crate::report::{json_num, Goal, Json};
use crate::s3_data;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `lobster_idle_ratio` must be at most this (issue 26).
pub const GOAL: Goal = Goal::at_most("lobster_goal", 0.67);

const BUCKET: &str = "granary-bench";
const PREFIX: &str = "synth";
const DATASET: &str = "stall";
/// The policies, in the order of the first repetition.
const POLICIES: [&str; 2] = ["static", "stall"];

type Result<T> = std::result::Result<T, String>;

/// The options of `--two-jobs`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--files`: files in the synthetic dataset.
    pub files: u64,
    /// `--mean-size`: their mean size in bytes.
    pub mean_size: u64,
    /// `--batch`: samples per batch, both jobs.
    pub batch: u32,
    /// `--step-ms`: the slow job's step; the fast job's is half.
    pub step_ms: f64,
    /// `--window-s`: how long each job runs, from its session's open.
    pub window_s: f64,
    /// `--reps`: pairs of runs (one per policy each).
    pub reps: u64,
    /// `--max-inflight`: the agent's `prefetch.max_inflight_reads`.
    pub max_inflight: u32,
    /// `--window-batches`: the agent's `prefetch.window_batches`.
    pub window_batches: u32,
    /// `--rtt`: the proxy's round trip, in ms.
    pub rtt_ms: u64,
}

impl Default for Settings {
    /// The defaults of `bench/run stall --two-jobs`.
    fn default() -> Settings {
        Settings {
            files: 32_000,
            mean_size: 8_000,
            batch: 32,
            step_ms: 160.0,
            window_s: 20.0,
            reps: 2,
            max_inflight: 80,
            window_batches: 64,
            rtt_ms: 100,
        }
    }
}

/// One job's figures in one run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Job {
    /// Time in `granary_next_batch` / wall time, from the session's open.
    pub idle: f64,
    /// Samples delivered per second.
    pub img_per_s: f64,
    /// From the loader's start to its first batch, in s.
    pub first_batch_s: f64,
    /// The 99th percentile of the per-batch wait, in ms.
    pub wait_p99_ms: f64,
}

impl Job {
    fn from_line(line: &str) -> Result<Job> {
        let get = |k: &str| json_num(line, k).ok_or_else(|| format!("no {k:?} in {line}"));
        Ok(Job {
            idle: get("idle")?,
            img_per_s: get("img_per_s")?,
            first_batch_s: get("first_batch_s")?,
            wait_p99_ms: get("wait_p99_ms")?,
        })
    }
}

/// One pair of jobs under one policy: `[slow, fast]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair {
    /// The slow job's figures, then the fast one's.
    pub jobs: [Job; 2],
}

impl Pair {
    /// The sum of the two GPU-idle fractions.
    pub fn idle_sum(&self) -> f64 {
        self.jobs[0].idle + self.jobs[1].idle
    }
}

/// The mean idle sum of `pairs`.
pub fn mean_idle_sum(pairs: &[Pair]) -> f64 {
    if pairs.is_empty() {
        return f64::NAN;
    }
    pairs.iter().map(Pair::idle_sum).sum::<f64>() / pairs.len() as f64
}

/// `lobster_idle_ratio`: the mean idle sum with "stall" over that with
/// "static".
pub fn idle_ratio(stall: &[Pair], fixed: &[Pair]) -> f64 {
    mean_idle_sum(stall) / mean_idle_sum(fixed)
}

/// The policies' order in repetition `rep` (interleaved, alternating).
pub fn policy_order(rep: u64) -> [&'static str; 2] {
    if rep.is_multiple_of(2) {
        POLICIES
    } else {
        [POLICIES[1], POLICIES[0]]
    }
}

/// Whether the slow job starts first in repetition `rep`.
pub fn slow_first(rep: u64) -> bool {
    rep.is_multiple_of(2)
}

struct Ctx<'a> {
    s: &'a Settings,
    c_loader: &'a Path,
    store: LightStore,
    proxy: DelayProxy,
}

fn spawn(ctx: &Ctx, socket: &str, step_ms: f64, seed: u64) -> Result<Child> {
    let batches = (ctx.s.window_s * 1e3 / step_ms).ceil() as u64 + 10;
    Command::new(ctx.c_loader)
        .args([
            socket,
            DATASET,
            &ctx.s.batch.to_string(),
            &format!("{step_ms:.3}"),
            "0",
            &batches.to_string(),
            &ctx.s.window_s.to_string(),
            &seed.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{}: {e}", ctx.c_loader.display()))
}

fn finish(mut child: Child) -> Result<Job> {
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = None;
    for l in BufReader::new(out).lines() {
        let l = l.map_err(|e| e.to_string())?;
        if l.starts_with('{') {
            line = Some(l);
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let line = line
        .filter(|_| status.success())
        .ok_or_else(|| format!("stall_consume exited with {status}"))?;
    Job::from_line(&line)
}

fn run_pair(ctx: &Ctx, balance: &str, slow_first: bool) -> Result<Pair> {
    let s3 = ctx.store.settings_via(ctx.proxy.local_addr());
    let mut cfg = AgentSettings::new_s3(1 << 30, S3Dataset::new(DATASET, s3, PREFIX));
    cfg.window_batches = ctx.s.window_batches;
    cfg.max_inflight_reads = ctx.s.max_inflight;
    cfg.extra
        .push(("prefetch".to_owned(), format!("balance = \"{balance}\"")));
    let agent = Agent::start(&cfg).map_err(|e| format!("agent: {e}"))?;
    let socket = agent.socket().display().to_string();
    let steps = [ctx.s.step_ms, ctx.s.step_ms / 2.0];
    let order: [usize; 2] = if slow_first { [0, 1] } else { [1, 0] };
    let first = spawn(ctx, &socket, steps[order[0]], 42 + order[0] as u64)?;
    std::thread::sleep(Duration::from_millis(200));
    let second = spawn(ctx, &socket, steps[order[1]], 42 + order[1] as u64);
    let a = finish(first);
    let b = second.and_then(finish);
    drop(agent);
    let (a, b) = (a?, b?);
    let mut jobs = [Job::default(); 2];
    jobs[order[0]] = a;
    jobs[order[1]] = b;
    Ok(Pair { jobs })
}

fn print_pair(balance: &str, rep: u64, p: &Pair) {
    let job = |n: &str, j: &Job| {
        format!(
            "{n} idle {:.1} %, {:.0} img/s, first batch {:.2} s, wait p99 {:.0} ms",
            j.idle * 100.0,
            j.img_per_s,
            j.first_batch_s,
            j.wait_p99_ms
        )
    };
    println!(
        "  {balance} (run {}, {} first): {}; {}; sum {:.1} %",
        rep + 1,
        if slow_first(rep) { "slow" } else { "fast" },
        job("slow", &p.jobs[0]),
        job("fast", &p.jobs[1]),
        p.idle_sum() * 100.0
    );
}

/// Runs the benchmark and prints its lines, the last one the JSON object.
pub fn run(s: &Settings, c_loader: &Path) -> Result<()> {
    let ds = data::ensure(&data::spec(s.files, s.mean_size, 100))
        .map_err(|e| format!("dataset: {e}"))?;
    println!(
        "dataset: {} files, {:.3} GB ({})",
        ds.len(),
        ds.bytes as f64 / 1e9,
        ds.spec.root.display()
    );
    let store = LightStore::start(&ds.spec.root, BUCKET, PREFIX, 2)
        .map_err(|e| format!("light store: {e}"))?;
    s3_data::read_all(&ds)?;
    let proxy = DelayProxy::loopback(store.addr(), Duration::from_micros(s.rtt_ms * 500))
        .map_err(|e| format!("delay proxy: {e}"))?;
    let demand = f64::from(s.batch) * (1e3 / s.step_ms + 2e3 / s.step_ms);
    let carry = f64::from(s.max_inflight) / (s.rtt_ms.max(1) as f64 / 1e3);
    println!(
        "two jobs: steps {:.1} and {:.1} ms, batch {}, {} s each; agent: max_inflight_reads {}, window {} batches; RTT {} ms: the jobs consume {demand:.0} samples/s, the reads in flight carry about {carry:.0}",
        s.step_ms,
        s.step_ms / 2.0,
        s.batch,
        s.window_s,
        s.max_inflight,
        s.window_batches,
        s.rtt_ms
    );
    let ctx = Ctx {
        s,
        c_loader,
        store,
        proxy,
    };
    let (mut fixed, mut stall) = (Vec::new(), Vec::new());
    for rep in 0..s.reps {
        for balance in policy_order(rep) {
            let p = run_pair(&ctx, balance, slow_first(rep))?;
            print_pair(balance, rep, &p);
            if balance == "stall" {
                stall.push(p);
            } else {
                fixed.push(p);
            }
        }
    }
    let ratio = idle_ratio(&stall, &fixed);
    let mean = |v: &[Pair], k: usize, f: fn(&Job) -> f64| -> f64 {
        v.iter().map(|p| f(&p.jobs[k])).sum::<f64>() / v.len().max(1) as f64
    };
    println!(
        "idle sum (mean of {} runs): stall {:.2} %, static {:.2} %; ratio {ratio:.3} (goal {}: {})",
        s.reps,
        mean_idle_sum(&stall) * 100.0,
        mean_idle_sum(&fixed) * 100.0,
        GOAL.rule(),
        GOAL.verdict(ratio)
    );
    let mut j = Json::bench("stall_two_jobs");
    j.num("lobster_idle_ratio", ratio, 3).goal(&GOAL, ratio);
    for (name, v) in [("stall", &stall), ("static", &fixed)] {
        j.num(&format!("{name}_idle_sum"), mean_idle_sum(v), 4);
        for (k, job) in ["slow", "fast"].iter().enumerate() {
            j.num(&format!("{name}_{job}_idle"), mean(v, k, |x| x.idle), 4)
                .num(
                    &format!("{name}_{job}_first_batch_s"),
                    mean(v, k, |x| x.first_batch_s),
                    3,
                );
        }
    }
    j.num("step_ms", s.step_ms, 3)
        .int("batch", u64::from(s.batch))
        .int("max_inflight_reads", u64::from(s.max_inflight))
        .int("window_batches", u64::from(s.window_batches))
        .int("rtt_ms", s.rtt_ms)
        .num("window_s", s.window_s, 1)
        .int("reps", s.reps)
        .int("files", s.files)
        .int("mean_size", s.mean_size)
        .str("regime", &crate::sys::regime());
    println!("{}", j.line());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(slow: f64, fast: f64) -> Pair {
        let j = |idle| Job {
            idle,
            ..Job::default()
        };
        Pair {
            jobs: [j(slow), j(fast)],
        }
    }

    #[test]
    fn the_ratio_is_of_mean_idle_sums() {
        let stall = [pair(0.01, 0.02), pair(0.03, 0.0)];
        let fixed = [pair(0.02, 0.10), pair(0.05, 0.03)];
        let r = idle_ratio(&stall, &fixed);
        assert!((r - 0.06 / 0.20).abs() < 1e-12, "{r}");
        assert_eq!(GOAL.verdict(r), "met");
        assert_eq!(GOAL.verdict(0.7), "NOT met");
        assert!(idle_ratio(&[], &fixed).is_nan());
    }

    #[test]
    fn policies_and_starts_alternate() {
        assert_eq!(policy_order(0), ["static", "stall"]);
        assert_eq!(policy_order(1), ["stall", "static"]);
        assert!(slow_first(0) && !slow_first(1));
    }
}
