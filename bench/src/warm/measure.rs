//! One measurement: an agent with one configuration ([`Knobs`]), a session
//! of a warm-up epoch and the timed epochs, and the memory baselines run by
//! the loader at the start of every timed epoch ([`Outcome`]).

use std::time::{Duration, Instant};

use granary::{Client, SessionOptions};
use granary_tools::synth;

use super::Result;
use crate::agent::{Agent, AgentSettings};
use crate::data;
use crate::loader::{self, Wait};
use crate::sys;
use crate::touch::{gbps, touch, MemRead};

/// One agent-and-loader configuration.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    /// Samples per batch.
    pub batch: u32,
    /// `prefetch.window_batches`.
    pub window: u32,
    /// `sessions.ready_ring_capacity` (and the release ring's).
    pub ready: u32,
    /// The loader polls instead of blocking.
    pub spin: bool,
    /// The loader checks every sample's bytes against its CRC-32C
    /// (`verify_crc`; off by default in libgranary, as here).
    pub crc: bool,
    /// The loader reports its waits to the agent (libgranary's default).
    pub waits: bool,
}

impl Knobs {
    /// The configuration in words.
    pub fn label(&self) -> String {
        format!(
            "batch {} window {} ready {}{}{}{}",
            self.batch,
            self.window,
            self.ready,
            if self.spin { " spin" } else { "" },
            if self.crc { " full-crc-check" } else { "" },
            if self.waits { "" } else { " no-wait-reports" }
        )
    }
}

/// What one configuration measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The configuration.
    pub knobs: Knobs,
    /// Bytes of the timed epochs / their time, GB/s.
    pub gbps: f64,
    /// The streaming baseline over the same epochs (NaN without baselines).
    pub memread: f64,
    /// The same samples in the same order, one by one, from the private
    /// mapping, over the same epochs.
    pub by_sample: f64,
    /// Samples of the timed epochs / their time.
    pub samples_per_s: f64,
    /// Per timed epoch: granary, memread and by-sample GB/s.
    pub per_epoch: Vec<(f64, f64, f64)>,
    /// Fraction of the timed span the loader spent inside next_batch.
    pub waited: f64,
    /// next_batch calls over 100 µs, and the longest.
    pub long_waits: u64,
    /// The longest `next_batch`.
    pub max_wait: Duration,
    /// Engine thread CPU time / timed span.
    pub engine_busy: f64,
    /// Loader thread CPU time / timed span.
    pub loader_busy: f64,
    /// Batches of the timed epochs / their time.
    pub batches_per_s: f64,
    /// The arena got 2 MiB pages.
    pub hugepages: bool,
}

impl Outcome {
    /// Against the streaming read.
    pub fn ratio(&self) -> f64 {
        self.gbps / self.memread
    }

    /// Against the same samples in the same order from the mapping.
    pub fn ratio_shuffled(&self) -> f64 {
        self.gbps / self.by_sample
    }
}

/// Marks taken by the loader at the edges of the timed epochs.
#[derive(Default)]
struct Marks {
    /// Per timed epoch: when its granary part started (after the baselines).
    go: Vec<Instant>,
    /// Per timed epoch: baseline pass durations (streaming, by sample).
    stream: Vec<Duration>,
    by_sample: Vec<Duration>,
    /// CPU time of every thread (and the loader's own, exactly) when each
    /// epoch's granary part started and ended (the end of epoch k is taken
    /// at the first sample of k + 1, before its baselines, or at the very
    /// last sample).
    cpu_go: Vec<(Vec<(String, Duration)>, Duration)>,
    cpu_stop: Vec<(Vec<(String, Duration)>, Duration)>,
}

/// One agent with `k`, one session of `1 + epochs` epochs.
pub fn measure(
    ds: &data::Dataset,
    arena: u64,
    hugepages: &str,
    k: Knobs,
    epochs: u32,
    mem: Option<&MemRead>,
) -> Result<Outcome> {
    let mut settings = AgentSettings::new(arena, "warm", &ds.spec.root);
    settings.hugepages = hugepages.to_owned();
    settings.window_batches = k.window;
    settings.ready_ring_capacity = k.ready;
    settings.release_ring_capacity = k.ready;
    let agent = Agent::start(&settings).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let mut opts = SessionOptions::new("warm");
    opts.seed = 42;
    opts.batch_size = k.batch;
    opts.epoch_count = 1 + epochs;
    opts.verify_crc = k.crc;
    opts.report_waits = k.waits;

    let total = ds.len() * u64::from(1 + epochs);
    let mut seen = 0u64;
    let mut epoch = 0u32;
    let mut marks = Marks::default();
    // Per timed epoch: the sample ids in the order they were delivered.
    let mut orders: Vec<Vec<usize>> = Vec::with_capacity(epochs as usize);
    let run = loader::consume(
        &client,
        &opts,
        if k.spin { Wait::Spin } else { Wait::Block },
        |s| {
            if s.epoch == 0 {
                let info = synth::verify_sample(s.bytes)
                    .map_err(|e| format!("sample {} corrupt: {e}", s.id))?;
                if info.file_id != s.id || i64::from(info.class) != i64::from(s.label) {
                    return Err(format!("sample {} carries file {}", s.id, info.file_id));
                }
            } else if s.epoch != epoch {
                // First sample of a timed epoch: close the previous one,
                // run the baselines, start this one.
                epoch = s.epoch;
                if epoch > 1 {
                    marks.cpu_stop.push((sys::thread_cpu(), sys::own_cpu()));
                }
                if let Some(m) = mem {
                    marks.stream.push(m.stream_pass().0);
                    // The previous timed epoch, replayed in its order.
                    if let Some(prev) = orders.last() {
                        marks.by_sample.push(m.sample_pass(prev).0);
                    }
                }
                orders.push(Vec::with_capacity(ds.len() as usize));
                marks.cpu_go.push((sys::thread_cpu(), sys::own_cpu()));
                marks.go.push(Instant::now());
            }
            if s.epoch > 0 {
                if let Some(o) = orders.last_mut() {
                    o.push(s.id as usize);
                }
            }
            seen += 1;
            let x = touch(s.bytes);
            if seen == total {
                marks.cpu_stop.push((sys::thread_cpu(), sys::own_cpu()));
            }
            Ok(x)
        },
    )?;
    if run.epochs.len() != 1 + epochs as usize || marks.go.len() != epochs as usize {
        return Err(format!(
            "{} epochs delivered, {} expected",
            run.epochs.len(),
            1 + epochs
        ));
    }
    for e in &run.epochs {
        if e.samples != ds.len() {
            return Err(format!(
                "epoch {}: {} samples, {} expected",
                e.epoch,
                e.samples,
                ds.len()
            ));
        }
    }
    // The last timed epoch's replay (the agent is idle now).
    if let (Some(m), Some(last)) = (mem, orders.last()) {
        marks.by_sample.push(m.sample_pass(last).0);
    }
    if orders.iter().any(|o| o.len() as u64 != ds.len()) {
        return Err("a timed epoch's recorded order misses samples".into());
    }
    let lookups = agent.epoch_lookups("warm");
    let reads = agent.metrics().reads_submitted.get();
    let cold_timed: u64 = lookups
        .iter()
        .filter(|l| l.epoch > 0)
        .map(|l| l.misses)
        .sum();
    if cold_timed > 0 || reads != ds.len() {
        return Err(format!(
            "the cache was not warm: {cold_timed} misses in the timed epochs, {reads} reads for {} samples",
            ds.len()
        ));
    }
    let hugepages = agent.hugepages();
    drop(client);
    agent.stop().map_err(|e| format!("agent: {e}"))?;

    let timed = &run.epochs[1..];
    let times: Vec<Duration> = timed
        .iter()
        .zip(&marks.go)
        .map(|(e, go)| e.end.saturating_duration_since(*go))
        .collect();
    let span: Duration = times.iter().sum();
    let secs = span.as_secs_f64().max(1e-9);
    let bytes: u64 = timed.iter().map(|e| e.bytes).sum();
    let samples: u64 = timed.iter().map(|e| e.samples).sum();
    let batches: u64 = timed.iter().map(|e| e.batches).sum();
    let waited: Duration = timed.iter().map(|e| e.waited).sum();
    let pairs = || marks.cpu_go.iter().zip(&marks.cpu_stop);
    let engine_cpu: f64 = pairs()
        .map(|(a, b)| {
            sys::cpu_of(&b.0, "granary-engine")
                .saturating_sub(sys::cpu_of(&a.0, "granary-engine"))
                .as_secs_f64()
        })
        .sum();
    let loader_cpu: f64 = pairs()
        .map(|(a, b)| b.1.saturating_sub(a.1).as_secs_f64())
        .sum();
    let rate_of = |d: &[Duration]| -> f64 {
        if d.is_empty() {
            f64::NAN
        } else {
            gbps(ds.bytes * d.len() as u64, d.iter().sum())
        }
    };
    let per_epoch = timed
        .iter()
        .zip(&times)
        .enumerate()
        .map(|(i, (e, t))| {
            let m = marks.stream.get(i).map_or(f64::NAN, |d| gbps(ds.bytes, *d));
            let b = marks
                .by_sample
                .get(i)
                .map_or(f64::NAN, |d| gbps(ds.bytes, *d));
            (gbps(e.bytes, *t), m, b)
        })
        .collect();
    let warm = &run.epochs[0];
    println!(
        "  warm-up epoch: {:.2} s ({:.2} GB/s, verifying), first batch after {:.1} ms; fold {:016x}",
        warm.elapsed().as_secs_f64(),
        gbps(warm.bytes, warm.elapsed()),
        run.first_batch.as_secs_f64() * 1e3,
        run.fold
    );
    Ok(Outcome {
        knobs: k,
        gbps: gbps(bytes, span),
        memread: rate_of(&marks.stream),
        by_sample: rate_of(&marks.by_sample),
        samples_per_s: samples as f64 / secs,
        per_epoch,
        waited: waited.as_secs_f64() / secs,
        long_waits: timed.iter().map(|e| e.long_waits).sum(),
        max_wait: timed.iter().map(|e| e.max_wait).max().unwrap_or_default(),
        engine_busy: engine_cpu / secs,
        loader_busy: loader_cpu / secs,
        batches_per_s: batches as f64 / secs,
        hugepages,
    })
}

/// The page size in words.
pub fn pages(huge: bool) -> &'static str {
    if huge {
        "2 MiB pages"
    } else {
        "4 KiB pages"
    }
}
