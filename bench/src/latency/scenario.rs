//! What every store's sweep is run with: the agent's knobs, the timing
//! rules, the loaders compared with Granary, and the stores themselves.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Options, Result, BUCKET, PREFIX};
use crate::data::Dataset;
use crate::light_store::LightStore;
use crate::s3_data;
use crate::seaweed::Seaweed;
use crate::stall_loaders;
use crate::store::Store;

/// The Granary knobs of a run.
#[derive(Clone, Debug)]
pub struct GranaryKnobs {
    pub batch: u32,
    pub inflight: u32,
    pub window: u32,
    pub initial_window: u32,
    pub arena: u64,
    pub ready: u32,
    /// (section, line): extra agent keys; section `dataset` is the table.
    pub extra: Vec<(String, String)>,
    pub verify_every: u64,
}

/// Timing rules of a measurement.
#[derive(Clone, Copy, Debug)]
pub struct Windowing {
    pub warmup: Duration,
    pub window: Duration,
}

/// A loader of the sweep other than Granary.
#[derive(Clone, Debug)]
pub struct Loader {
    /// Its name in the tables and in the last line's keys.
    pub name: String,
    pub how: LoaderKind,
}

#[derive(Clone, Debug)]
pub enum LoaderKind {
    /// `bench/latency_dataloader.py` with this many workers.
    DataLoader(u64),
    /// `bench/stall_train.py` with these arguments (`--contender NAME ...`),
    /// with no GPU step: a loader of `bench/run stall`, at full speed.
    Train(Vec<String>),
}

/// A per-sample loader of `bench/run stall` (`stall_loaders::PER_SAMPLE`),
/// with its `stall` arguments. The shard readers are left out: the light
/// store serves the dataset's files, not shards.
pub fn train_loader(name: &str) -> Result<Loader> {
    let args = stall_loaders::args(name)
        .filter(|_| stall_loaders::PER_SAMPLE.contains(&name))
        .ok_or_else(|| {
            format!(
                "--contenders: {name:?} is not one of {}",
                stall_loaders::PER_SAMPLE.join(", ")
            )
        })?;
    Ok(Loader {
        name: name.to_owned(),
        how: LoaderKind::Train(args.iter().map(|s| (*s).to_owned()).collect()),
    })
}

/// `section.key=value;...` into (section, `key = value`) pairs.
pub fn parse_keys(s: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (lhs, value) = part
            .split_once('=')
            .ok_or_else(|| format!("--agent-keys: {part:?} is not section.key=value"))?;
        let (section, key) = lhs
            .trim()
            .split_once('.')
            .ok_or_else(|| format!("--agent-keys: {lhs:?} names no section"))?;
        out.push((section.to_owned(), format!("{key} = {}", value.trim())));
    }
    Ok(out)
}

pub fn granary_config_line(k: &GranaryKnobs) -> String {
    let mut s = format!(
        "batch {}, prefetch.max_inflight_reads {}, prefetch.window_batches {}, prefetch.initial_window {}, arena {} MiB, ready ring {}, verify every {}",
        k.batch,
        k.inflight,
        k.window,
        k.initial_window.min(k.window),
        k.arena >> 20,
        k.ready,
        k.verify_every
    );
    for (sec, line) in &k.extra {
        let _ = write!(s, ", {sec}.{line}");
    }
    s
}

/// The options turned into what the sweep is run with (every store's sweep
/// alike).
pub struct Setup {
    pub rtts: Vec<u64>,
    pub loaders: Vec<Loader>,
    pub inflights: Vec<u64>,
    pub knobs: GranaryKnobs,
    pub win: Windowing,
    pub quiet: Duration,
    pub retries: u32,
    pub repeat: u32,
    pub pair: bool,
    pub do_granary: bool,
    pub do_loader: bool,
    pub python: String,
    pub plot: Option<PathBuf>,
    pub stores: Vec<String>,
    pub light_threads: usize,
    pub bench_dir: PathBuf,
}

/// `value` seconds, when it is a number ≥ 0.
fn secs(name: &str, value: f64) -> Result<Duration> {
    Some(value)
        .filter(|x| x.is_finite() && *x >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("--{name}: not a number of seconds: {value}"))
}

impl Setup {
    /// Checks the options and derives the knobs, the loaders and the stores.
    pub fn new(o: &Options) -> Result<Setup> {
        let inflights = if o.inflight.is_empty() {
            vec![1024]
        } else {
            o.inflight.clone()
        };
        let inflight = u32::try_from(inflights[0]).map_err(|_| "--inflight: too large")?;
        let arena_default = (1u64 << 30).max(inflights.iter().max().copied().unwrap_or(0) << 20);
        let knobs = GranaryKnobs {
            batch: o.batch.max(1),
            inflight,
            window: o.window,
            initial_window: o.initial_window,
            arena: o.arena.unwrap_or(arena_default).next_multiple_of(2 << 20),
            ready: o.ready,
            extra: parse_keys(&o.agent_keys)?,
            verify_every: o.verify_every.max(1),
        };
        let python = if o.python.is_empty() {
            std::env::var("PYTHON")
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "python3".to_owned())
        } else {
            o.python.clone()
        };
        let bench_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let plot = match o.plot.as_str() {
            "" => Some(bench_dir.join("../docs/latency.png")),
            "none" => None,
            p => Some(PathBuf::from(p)),
        };
        let stores: Vec<String> = match o.store.as_str() {
            "both" => vec!["seaweed".to_owned(), "light".to_owned()],
            "seaweed" => vec!["seaweed".to_owned()],
            "light" => vec!["light".to_owned()],
            other => return Err(format!("--store: {other:?} is not light, seaweed or both")),
        };
        let light_threads = usize::try_from(o.light_threads)
            .map_err(|_| "--light-threads: too large")?
            .max(1);
        Ok(Setup {
            rtts: o.rtt_ms.clone(),
            loaders: loaders(o)?,
            inflights,
            knobs,
            win: Windowing {
                warmup: secs("warmup-s", o.warmup_s)?,
                window: secs("window-s", o.window_s)?,
            },
            quiet: secs("quiet-wait-s", o.quiet_wait_s)?,
            retries: o.retries,
            repeat: o.repeat.unwrap_or(1).max(1),
            pair: !o.no_pair,
            do_granary: !o.no_granary,
            do_loader: !o.no_dataloader,
            python,
            plot,
            stores,
            light_threads,
            bench_dir,
        })
    }
}

/// The DataLoaders (`--workers`) and the contenders (`--contenders`).
fn loaders(o: &Options) -> Result<Vec<Loader>> {
    let mut loaders: Vec<Loader> = o
        .workers
        .iter()
        .map(|&w| Loader {
            name: format!("dataloader_w{w}"),
            how: LoaderKind::DataLoader(w),
        })
        .collect();
    match o.contenders.as_str() {
        "none" | "" => {}
        list => {
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                loaders.push(train_loader(name)?);
            }
        }
    }
    Ok(loaders)
}

/// Starts one store (`seaweed` or `light`) serving the dataset, and writes
/// the key list the Python loaders read; with SeaweedFS, also the ingest's
/// time in seconds.
pub fn start_store(
    which: &str,
    ds: &Dataset,
    light_threads: usize,
) -> Result<(Store, PathBuf, Option<f64>)> {
    let t = Instant::now();
    if which == "seaweed" {
        let weed = Seaweed::try_start(BUCKET)?;
        println!(
            "=== SeaweedFS: S3 on {} (pid {}), data in {}, up in {:.1} s",
            weed.endpoint(),
            weed.pid().unwrap_or(0),
            weed.data_dir().display(),
            t.elapsed().as_secs_f64()
        );
        let ingest_s = s3_data::upload(&weed, ds, PREFIX)?;
        println!(
            "SeaweedFS idle {:.1} s after the ingest",
            s3_data::settle(&weed).as_secs_f64()
        );
        let keys = s3_data::write_keys(&weed, ds, PREFIX)?;
        return Ok((Store::Weed(weed), keys, Some(ingest_s)));
    }
    let light = LightStore::start(&ds.spec.root, BUCKET, PREFIX, light_threads)
        .map_err(|e| format!("light store: {e}"))?;
    println!(
        "=== light store: S3 on {} ({} objects of {}, {} worker threads), up in {:.1} s",
        light.endpoint(),
        light.len(),
        ds.spec.root.display(),
        light_threads,
        t.elapsed().as_secs_f64()
    );
    // Every file read once, so that every point is served from the page
    // cache, the first one included (SeaweedFS's ingest reads its objects
    // back for the same reason).
    let t = Instant::now();
    let warmed = s3_data::read_all(ds)?;
    println!(
        "page cache: every file read once ({:.3} GB) in {:.1} s",
        warmed as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    let keys =
        std::env::temp_dir().join(format!("granary-latency-keys-{}.tsv", std::process::id()));
    s3_data::write_keys_at(&keys, ds, PREFIX)?;
    Ok((Store::Light(light), keys, None))
}
