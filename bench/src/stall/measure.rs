//! One measured run of one contender (a fresh agent and loader process,
//! CPU counters at the window's edges), the two-job runs of `--decode`,
//! the GPU step's calibration, and every run of the benchmark interleaved.

use super::jobs2::{self, DecodeSpan, Jobs2};
use super::scenario::{
    py_args, Contender, Ctx, Launch, CALIBRATION_GROWTHS, DATASET, PREFIX, RUN_NO, SEED,
    SHARD_READERS,
};
use super::stats::{self, Run, GOAL_RTT_MS};
use super::Options;
use crate::agent::{Agent, AgentSettings, S3Dataset};
use crate::light_store;
use crate::report;
use crate::sys::{self, process_cpu, tree_cpu, MachineCpu};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, String>;

/// CPU counters at one edge of a window.
pub(super) struct Mark {
    at: Instant,
    client: Duration,
    threads: Vec<(String, Duration)>,
    weed: Duration,
    machine: MachineCpu,
}

impl Mark {
    fn take(child: u32, weed: Option<u32>) -> Mark {
        Mark {
            at: Instant::now(),
            client: tree_cpu(child),
            threads: sys::thread_cpu(),
            weed: weed.map_or(Duration::ZERO, process_cpu),
            machine: MachineCpu::read(),
        }
    }
}

/// This process's CPU seconds between two snapshots of its threads, split
/// by whose they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Own {
    proxy: f64,
    /// The light store's threads (zero with SeaweedFS).
    store: f64,
    /// Every other thread but the main one: the agent's.
    agent: f64,
}

pub(super) fn split_own(a: &[(String, Duration)], b: &[(String, Duration)]) -> Own {
    let total = |s: &[(String, Duration)]| -> Duration { s.iter().map(|(_, d)| *d).sum() };
    let of = |name: &str| sys::cpu_of(b, name).saturating_sub(sys::cpu_of(a, name));
    let proxy = of("delay-proxy");
    let store = of(light_store::THREAD_NAME);
    let main = of("stall");
    let all = total(b).saturating_sub(total(a));
    Own {
        proxy: proxy.as_secs_f64(),
        store: store.as_secs_f64(),
        agent: all
            .saturating_sub(proxy)
            .saturating_sub(store)
            .saturating_sub(main)
            .as_secs_f64(),
    }
}

/// One run of one contender at the proxy's current delay.
pub(super) fn measure(ctx: &Ctx, c: &Contender, step_ms: f64) -> Run {
    if !ctx.quiet.is_zero() {
        sys::wait_quiet(ctx.quiet);
    }
    measure_once(ctx, c, step_ms).unwrap_or_else(Run::failed)
}

/// The agent a contender needs (None for the others): a fresh one for
/// every run, so every sample comes from the store.
pub(super) fn start_agent(ctx: &Ctx, c: &Contender) -> Result<Option<Agent>> {
    if !c.agent {
        return Ok(None);
    }
    let settings = ctx.store.settings_via(ctx.proxy.local_addr());
    let mut cfg = AgentSettings::new_s3(1 << 30, S3Dataset::new(DATASET, settings, PREFIX));
    if ctx.decode > 0 && c.name == "granary" {
        // The agent decodes and resizes once; every loader then reads
        // prepared samples (docs/prepare.md).
        cfg.s3_datasets[0].extra.push(format!(
            "prepare = {{ resize = [{0}, {0}], mode = \"stretch\" }}",
            ctx.decode
        ));
    }
    cfg.window_batches = 64;
    cfg.max_inflight_reads = 1024;
    Agent::start(&cfg)
        .map(Some)
        .map_err(|e| format!("agent: {e}"))
}

/// A shard reader's local cache: fresh for every run, so its shards come
/// from the store.
pub(super) fn fresh_cache(ctx: &Ctx) -> PathBuf {
    ctx.work.join(format!(
        "shard-cache-{}",
        RUN_NO.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
}

/// The command line of one loader process of contender `c`.
pub(super) fn loader_command(
    ctx: &Ctx,
    c: &Contender,
    agent: Option<&Agent>,
    cache: &Path,
    step_ms: f64,
) -> Result<Command> {
    let socket = agent
        .map(|a| a.socket().display().to_string())
        .unwrap_or_default();
    let (batch, step) = (ctx.batch.to_string(), format!("{step_ms:.3}"));
    let (warm, batches, window) = (
        ctx.warmup_batches().to_string(),
        ctx.batches.to_string(),
        ctx.window_s.to_string(),
    );
    let mut cmd = match &c.launch {
        Launch::Missing(e) => return Err(format!("not run: {e}")),
        Launch::C(bin) => {
            let mut cmd = Command::new(bin);
            cmd.args([
                socket.as_str(),
                DATASET,
                &batch,
                &step,
                &warm,
                &batches,
                &window,
                &SEED.to_string(),
            ]);
            cmd
        }
        Launch::Python(args) => {
            let mut cmd = Command::new(&ctx.python);
            cmd.arg(ctx.root.join("bench/stall_train.py"))
                .args(args)
                .args(["--batch", &batch, "--step-ms", &step])
                .args(["--warmup-batches", &warm, "--batches", &batches])
                .args(["--window-s", &window, "--seed", &SEED.to_string()])
                .arg("--keys")
                .arg(&ctx.keys)
                .arg("--local-root")
                .arg(&ctx.ds.spec.root)
                .args(["--endpoint", &format!("http://{}", ctx.proxy.local_addr())])
                .args(["--bucket", ctx.store.bucket(), "--marks"]);
            if let Some(model) = &ctx.gpu_step {
                cmd.args(["--gpu-step", model]);
            }
            if ctx.decode > 0 {
                cmd.args(["--decode", &ctx.decode.to_string()])
                    .args(["--epochs", &ctx.epochs().to_string()]);
                if let Some(d) = crate::stall_loaders::decoder(&c.name) {
                    cmd.args(["--decoder", d]);
                }
            }
            if c.agent {
                cmd.args(["--socket", &socket, "--dataset", DATASET]);
            }
            if let Some((_, prefix)) = SHARD_READERS.iter().find(|r| r.0 == c.name) {
                cmd.args(["--remote", &format!("s3://{}/{prefix}", ctx.store.bucket())])
                    .arg("--cache")
                    .arg(cache)
                    // mosaicml-streaming's boto3 client reads its endpoint here.
                    .env(
                        "S3_ENDPOINT_URL",
                        format!("http://{}", ctx.proxy.local_addr()),
                    );
            }
            cmd
        }
    };
    cmd.envs(ctx.store.env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    Ok(cmd)
}

/// What one loader process printed: its JSON line and the marks taken at
/// its window's edges.
pub(super) struct Printed {
    line: String,
    start: Mark,
    end: Mark,
}

/// Reads a loader's output to its end (its other lines echoed), taking a
/// [`Mark`] at each window edge, and waits for it.
pub(super) fn follow(
    name: &str,
    mut child: std::process::Child,
    weed: Option<u32>,
) -> Result<Printed> {
    let pid = child.id();
    let out = child.stdout.take().ok_or("no stdout")?;
    let (mut m0, mut m1, mut line) = (None, None, None);
    for l in BufReader::new(out).lines() {
        let l = l.map_err(|e| e.to_string())?;
        match l.trim() {
            "mark window-start" => m0 = Some(Mark::take(pid, weed)),
            "mark window-end" => m1 = Some(Mark::take(pid, weed)),
            l if l.starts_with('{') => line = Some(l.to_owned()),
            l => println!("    {name}: {l}"),
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let line = line
        .filter(|_| status.success())
        .ok_or_else(|| format!("{name} exited with {status}"))?;
    let (Some(start), Some(end)) = (m0, m1) else {
        return Err(format!("{name}: no window marks"));
    };
    Ok(Printed { line, start, end })
}

pub(super) fn measure_once(ctx: &Ctx, c: &Contender, step_ms: f64) -> Result<Run> {
    let t_setup = Instant::now();
    // This process's threads before the agent starts: its CPU from the start.
    let threads_at_launch = sys::thread_cpu();
    let agent = start_agent(ctx, c)?;
    let cache = fresh_cache(ctx);
    let mut cmd = loader_command(ctx, c, agent.as_ref(), &cache, step_ms)?;
    let setup_s = t_setup.elapsed().as_secs_f64();
    let child = cmd.spawn().map_err(|e| format!("{}: {e}", c.name))?;
    let printed = follow(&c.name, child, ctx.store.weed_pid());
    drop(agent);
    let _ = std::fs::remove_dir_all(&cache);
    let Printed {
        line,
        start: a,
        end: b,
    } = printed?;
    let mut r = Run::from_loader_line(&line, setup_s)?;
    // The loader's tree did not exist before the launch: its CPU at the
    // window's end is all it spent.
    r.cpu_from_start_s = b.client.as_secs_f64() + split_own(&threads_at_launch, &b.threads).agent;
    r.samples_from_start = samples_from_start(ctx, &line, r.samples);
    // The agent started after `threads_at_launch`: its prepare workers'
    // CPU at the window's end is all they spent.
    r.prep_cpu_s = jobs2::prep_cpu(&b.threads).as_secs_f64();
    let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
    r.client_cpu_s = b.client.saturating_sub(a.client).as_secs_f64();
    let own = split_own(&a.threads, &b.threads);
    (r.proxy_cpu_s, r.agent_cpu_s) = (own.proxy, own.agent);
    r.store_cpu_s = b.weed.saturating_sub(a.weed).as_secs_f64() + own.store;
    let (busy, _, _) = b.machine.since(&a.machine);
    let ours = (r.client_cpu_s + r.proxy_cpu_s + r.agent_cpu_s + r.store_cpu_s) / secs;
    r.others_cores = (busy - ours).max(0.0);
    Ok(r)
}

/// Samples a loader delivered from its start to its window's end: its
/// warm-up batches (as it reports them) and the window's.
pub(super) fn samples_from_start(ctx: &Ctx, line: &str, window_samples: u64) -> u64 {
    let warmed =
        report::json_num(line, "warmup_batches").map_or(ctx.warmup_batches(), |n| n as u64);
    window_samples + warmed * u64::from(ctx.batch)
}

/// `--decode`: two `granary` jobs at once on one agent with `prepare`
/// ([`super::jobs2`]). Returns both jobs' runs and the decode
/// span over both.
pub(super) fn measure_jobs2(
    ctx: &Ctx,
    c: &Contender,
    step_ms: f64,
) -> Result<([Run; 2], DecodeSpan)> {
    if !ctx.quiet.is_zero() {
        sys::wait_quiet(ctx.quiet);
    }
    let t_setup = Instant::now();
    let agent = start_agent(ctx, c)?.ok_or("two jobs: the contender has no agent")?;
    let cache = fresh_cache(ctx);
    let setup_s = t_setup.elapsed().as_secs_f64();
    let weed = ctx.store.weed_pid();
    let printed: Vec<Result<Printed>> = std::thread::scope(|s| {
        let jobs: Vec<_> = (1..=2)
            .map(|j| {
                let cmd = loader_command(ctx, c, Some(&agent), &cache, step_ms);
                s.spawn(move || {
                    let name = format!("{} job {j}", c.name);
                    let child = cmd?.spawn().map_err(|e| format!("{name}: {e}"))?;
                    follow(&name, child, weed)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a job's thread panicked".into()))
            })
            .collect()
    });
    drop(agent);
    let _ = std::fs::remove_dir_all(&cache);
    let mut span = DecodeSpan::default();
    let mut runs = Vec::new();
    for p in printed {
        let p = p?;
        let mut r = Run::from_loader_line(&p.line, setup_s)?;
        r.samples_from_start = samples_from_start(ctx, &p.line, r.samples);
        // The later window's end covers both jobs' spans.
        r.prep_cpu_s = jobs2::prep_cpu(&p.end.threads).as_secs_f64();
        span.prep_cpu_s = span.prep_cpu_s.max(r.prep_cpu_s);
        span.samples += r.samples_from_start;
        runs.push(r);
    }
    let runs: [Run; 2] = runs.try_into().map_err(|_| "two jobs: not two runs")?;
    Ok((runs, span))
}

pub(super) fn print_run(name: &str, r: &Run) {
    if let Some(e) = &r.error {
        println!("  {name}: FAILED: {e}");
        return;
    }
    println!(
        "  {name}: idle {:.1} % ({:.1} % from the start), {:.0} img/s, wait p50 {:.1} ms p99 {:.1} ms, first batch {:.2} s; CPU µs/sample: loader {:.0} (agent {:.0}; {:.0} from the start), proxy {:.0}, store {:.0}; others {:.2} cores",
        r.idle * 100.0,
        r.idle_from_start * 100.0,
        r.img_per_s,
        r.wait_p50_ms,
        r.wait_p99_ms,
        r.first_batch_s,
        r.loader_us(),
        r.agent_cpu_s / r.samples.max(1) as f64 * 1e6,
        r.loader_us_from_start(),
        r.proxy_us(),
        r.store_us(),
        r.others_cores
    );
}

/// The GPU step: the shortest that the local-disk DataLoader keeps ≥ 95 %
/// busy (see the module documentation). Returns (step ms, the loader's
/// rate with no step, its idle fraction at the step).
pub(super) fn calibrate(ctx: &Ctx) -> Result<(f64, f64, f64)> {
    let local = Contender {
        name: "local".to_owned(),
        launch: Launch::Python(py_args(&[
            "--contender",
            "local",
            "--workers",
            &crate::cpu::online_cpus().to_string(),
        ])),
        agent: false,
        settings: "",
    };
    let free = measure(ctx, &local, 0.0);
    print_run("local disk, no GPU step", &free);
    if let Some(e) = &free.error {
        return Err(format!("calibration: {e}"));
    }
    let mut step = f64::from(ctx.batch) / (0.95 * free.img_per_s) * 1e3;
    for _ in 0..=CALIBRATION_GROWTHS {
        let r = measure(ctx, &local, step);
        print_run(&format!("local disk, step {step:.2} ms"), &r);
        if let Some(e) = &r.error {
            return Err(format!("calibration: {e}"));
        }
        if r.idle <= stats::CALIBRATION_IDLE {
            return Ok((step, free.img_per_s, r.idle));
        }
        step *= 1.25;
    }
    Err(format!(
        "calibration: the local-disk loader never got under {} % idle",
        stats::CALIBRATION_IDLE * 100.0
    ))
}

/// The GPU step every contender's loop runs.
pub(super) struct Step {
    /// The sleep per batch, in ms (0 with a real step).
    pub(super) ms: f64,
    /// The local-disk loader's rate with no step (NaN unless calibrated).
    pub(super) local_rate: f64,
    /// Its idle fraction at the step (NaN unless calibrated).
    pub(super) local_idle: f64,
}

/// The step: a real one (`--gpu-step`), `--step-ms`, or calibrated on the
/// local-disk loader.
pub(super) fn step(ctx: &Ctx, o: &Options) -> Result<Step> {
    let batch = ctx.batch;
    let step = match (&ctx.gpu_step, o.step_ms) {
        (Some(_), _) => Step {
            ms: 0.0,
            local_rate: f64::NAN,
            local_idle: f64::NAN,
        },
        (None, Some(ms)) => Step {
            ms,
            local_rate: f64::NAN,
            local_idle: f64::NAN,
        },
        (None, None) => {
            println!("--- calibrating the GPU step on the local-disk DataLoader");
            let (ms, local_rate, local_idle) = calibrate(ctx)?;
            Step {
                ms,
                local_rate,
                local_idle,
            }
        }
    };
    match &ctx.gpu_step {
        Some(model) => println!(
            "GPU step: {model} forward and backward on each batch of {batch} (bf16 autocast, channels_last, SGD; on CUDA when present), synchronised, timed by the loop"
        ),
        None => println!(
            "GPU step: {:.2} ms per batch of {batch} ({:.0} img/s when never waiting); local-disk loader: {:.0} img/s with no step, idle {:.1} % at this step",
            step.ms,
            f64::from(batch) / step.ms * 1e3,
            step.local_rate,
            step.local_idle * 100.0
        ),
    }
    Ok(step)
}

/// Every run: each round-trip time, `--reps` rounds of every contender in
/// turn (and, with `--decode`, the two-job runs at the goal's RTT).
pub(super) struct Measured {
    /// Runs per contender, per RTT.
    pub(super) runs: Vec<Vec<Vec<Run>>>,
    /// `--decode`'s two jobs against one (NaN when not run).
    pub(super) jobs2: Jobs2,
}

pub(super) fn run_all(ctx: &Ctx, contenders: &[Contender], o: &Options, step_ms: f64) -> Measured {
    let rtts = &o.rtts;
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); rtts.len()]; contenders.len()];
    // `--decode`: two `granary` jobs on one agent, at the goal's RTT,
    // interleaved with the other runs.
    let jobs2_on = o.jobs2();
    let mut jobs2_spans = Vec::new();
    for (i, &rtt) in rtts.iter().enumerate() {
        ctx.proxy.set_delay(Duration::from_micros(rtt * 500));
        println!("--- RTT {rtt} ms");
        for rep in 0..o.reps {
            for (k, c) in contenders.iter().enumerate() {
                let r = measure(ctx, c, step_ms);
                print_run(&format!("{} (run {})", c.name, rep + 1), &r);
                runs[k][i].push(r);
            }
            if jobs2_on && rtt == GOAL_RTT_MS {
                match measure_jobs2(ctx, &contenders[0], step_ms) {
                    Ok((two, span)) => {
                        for (j, r) in two.iter().enumerate() {
                            println!(
                                "  granary, two jobs: job {} (run {}): idle {:.1} % ({:.1} % from the start), {:.0} img/s, wait p99 {:.1} ms, first batch {:.2} s",
                                j + 1,
                                rep + 1,
                                r.idle * 100.0,
                                r.idle_from_start * 100.0,
                                r.img_per_s,
                                r.wait_p99_ms,
                                r.first_batch_s
                            );
                        }
                        println!(
                            "  granary, two jobs (run {}): decode CPU {:.2} s for {} samples delivered ({:.0} µs/sample)",
                            rep + 1,
                            span.prep_cpu_s,
                            span.samples,
                            span.us_per_sample()
                        );
                        jobs2_spans.push(span);
                    }
                    Err(e) => println!("  granary, two jobs (run {}): FAILED: {e}", rep + 1),
                }
            }
        }
    }
    let one_job_spans: Vec<DecodeSpan> = rtts
        .iter()
        .position(|&r| r == GOAL_RTT_MS)
        .map(|i| {
            runs[0][i]
                .iter()
                .filter(|r| r.error.is_none())
                .map(|r| DecodeSpan {
                    prep_cpu_s: r.prep_cpu_s,
                    samples: r.samples_from_start,
                })
                .collect()
        })
        .unwrap_or_default();
    let jobs2 = Jobs2::judge(&one_job_spans, &jobs2_spans);
    Measured { runs, jobs2 }
}

#[cfg(test)]
mod tests {
    use super::super::scenario::contender;
    use super::super::scenario::default_contenders;
    use super::*;

    #[test]
    fn own_threads_split_into_proxy_and_agent() {
        let s = |v: &[(&str, u64)]| -> Vec<(String, Duration)> {
            v.iter()
                .map(|(n, ms)| ((*n).to_owned(), Duration::from_millis(*ms)))
                .collect()
        };
        let a = s(&[("stall", 100), ("delay-proxy", 10), ("granary-engine", 5)]);
        let b = s(&[
            ("stall", 150),
            ("delay-proxy", 40),
            ("granary-engine", 25),
            ("granary-s3", 30),
        ]);
        let own = split_own(&a, &b);
        assert!((own.proxy - 0.030).abs() < 1e-9);
        assert!((own.agent - 0.050).abs() < 1e-9);
        assert_eq!(own.store, 0.0);
        let c = s(&[
            ("stall", 150),
            ("delay-proxy", 40),
            ("granary-engine", 25),
            ("granary-s3", 30),
            (light_store::THREAD_NAME, 70),
        ]);
        let own = split_own(&a, &c);
        assert!((own.store - 0.070).abs() < 1e-9);
        assert!(
            (own.agent - 0.050).abs() < 1e-9,
            "the store is not the agent"
        );
    }

    #[test]
    fn contender_names_are_checked() {
        let none: Result<PathBuf> = Err("no C loader".into());
        assert!(contender("nope", "python3", &none).is_err());
        let c = contender("granary_c", "python3", &none).unwrap();
        assert!(matches!(c.launch, Launch::Missing(_)));
        for name in default_contenders(224) {
            assert!(contender(name, "python3", &none).is_ok(), "{name}");
        }
        assert!(!default_contenders(0).contains(&"granary_w0"));
        assert_eq!(default_contenders(0)[0], "granary");
        assert!(
            !default_contenders(0).contains(&"dali"),
            "dali decodes only"
        );
        assert!(default_contenders(224).contains(&"dali"));
        let c = contender("boto3_w32", "python3", &none).unwrap();
        match c.launch {
            Launch::Python(a) => assert!(a.windows(2).any(|w| w == ["--workers", "32"])),
            other => panic!("{other:?}"),
        }
    }
}
