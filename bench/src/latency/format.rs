//! `bench/run latency --format webdataset|mds|parquet`: per-sample reads
//! from shards against one object per sample, at the same round-trip time,
//! in the same run.
//!
//! The synthetic dataset's files and the same files written as shards of
//! `--shard-mib` (default 64) by `granary ingest`'s writers are served by
//! one light store (two prefixes of one bucket) behind the delay proxy.
//! For each repeat, a fresh in-process agent reads the first epoch of each
//! side (the order alternates from one repeat to the next): `files` as a
//! `kind = "s3"` dataset of one object per sample, `shards` as the same
//! with `format = FMT`, where every sample is a byte range of its shard.
//! Samples/s are counted in a window after a warm-up, as the rest of the
//! benchmark does; every 16th sample's payload is verified byte for byte
//! (a WebDataset sample's payload is its largest member). The goal (issue
//! 27): at 100 ms, shards ≥ 0.9 × files (`format_ratio`, medians).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use granary::Client;
use granary_tools::synth;

use super::loaders::first_epoch;
use super::DATASET;
use crate::agent::{Agent, AgentSettings, S3Dataset};
use crate::data::{self, Dataset};
use crate::delay_proxy::DelayProxy;
use crate::light_store::LightStore;
use crate::loader::{self, Wait};
use crate::report::{median, Goal, Json};
use crate::sys;

type Result<T> = std::result::Result<T, String>;

const BUCKET: &str = "granary-bench";
const STOP_EARLY: &str = "window closed";

/// The goal: shards at least 0.9 × one object per sample.
pub const GOAL: Goal = Goal::at_least("goal_format", 0.9);

/// A shard format the agent reads per sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// WebDataset tar shards.
    WebDataset,
    /// Mosaic MDS shards.
    Mds,
    /// Parquet files.
    Parquet,
}

impl Format {
    /// From its configuration name.
    pub fn parse(s: &str) -> Result<Format> {
        match s {
            "webdataset" => Ok(Format::WebDataset),
            "mds" => Ok(Format::Mds),
            "parquet" => Ok(Format::Parquet),
            other => Err(format!(
                "--format: {other:?} is not webdataset, mds or parquet"
            )),
        }
    }

    /// Its configuration name (`format = ...`).
    pub fn name(self) -> &'static str {
        match self {
            Format::WebDataset => "webdataset",
            Format::Mds => "mds",
            Format::Parquet => "parquet",
        }
    }

    /// The sample's payload in what the agent delivers.
    fn payload(self, bytes: &[u8]) -> Result<&[u8]> {
        match self {
            Format::WebDataset => {
                let mut best: &[u8] = &[];
                for f in granary_shm::tar::fields(bytes) {
                    let f = f.map_err(|e| format!("tar fragment: {e}"))?;
                    if f.data.len() > best.len() {
                        best = f.data;
                    }
                }
                Ok(best)
            }
            Format::Mds | Format::Parquet => Ok(bytes),
        }
    }
}

/// What the comparison needs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The shard format.
    pub format: Format,
    /// Round-trip time of the comparison, in ms.
    pub rtt_ms: u64,
    /// Measurements of each side.
    pub repeat: u32,
    /// Shard size.
    pub shard_bytes: u64,
    /// Warm-up before the window.
    pub warmup: Duration,
    /// The window.
    pub window: Duration,
    /// The agent's knobs: batch, reads in flight, window in batches, arena.
    pub batch: u32,
    /// `prefetch.max_inflight_reads`.
    pub inflight: u32,
    /// `prefetch.window_batches`.
    pub window_batches: u32,
    /// Arena bytes.
    pub arena: u64,
}

/// One side's measurement.
#[derive(Debug, Clone, Copy)]
struct Point {
    samples_per_s: f64,
    mb_per_s: f64,
}

/// The shards of `ds` in `fmt`, written once under `bench/.data/`.
fn ensure_shards(ds: &Dataset, fmt: Format, shard_bytes: u64) -> Result<PathBuf> {
    let name = ds
        .spec
        .root
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("synth");
    let out = data::data_root().join(format!("{name}-{}-{}MiB", fmt.name(), shard_bytes >> 20));
    let done = out.join(".complete");
    if done.exists() {
        return Ok(out);
    }
    let _ = std::fs::remove_dir_all(&out);
    let t = Instant::now();
    let root = &ds.spec.root;
    let written = match fmt {
        Format::WebDataset => {
            granary_tools::ingest::shards::write_webdataset(root, &out, shard_bytes)
        }
        Format::Mds => granary_tools::ingest::mds::write_mds(root, &out, shard_bytes),
        Format::Parquet => granary_tools::ingest::parquet::write_parquet(root, &out, shard_bytes),
    }
    .map_err(|e| format!("writing {} shards: {e}", fmt.name()))?;
    std::fs::write(&done, b"").map_err(|e| format!("{}: {e}", done.display()))?;
    println!(
        "shards: {} {} shards of {} samples in {:.1} s ({})",
        written.shards.len(),
        fmt.name(),
        written.samples,
        t.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(out)
}

/// Reads every file under `dir` once (the page cache warm for every side).
fn warm_page_cache(dir: &Path) -> Result<u64> {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
            let p = e.map_err(|e| e.to_string())?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                total += std::fs::read(&p).map_or(0, |b| b.len() as u64);
            }
        }
    }
    Ok(total)
}

/// One epoch's window read by a fresh agent over `prefix` (with `extra`
/// dataset lines).
fn measure(
    store: &LightStore,
    proxy: SocketAddr,
    prefix: &str,
    format: Option<Format>,
    plan: &Plan,
    n: u64,
) -> Result<Point> {
    let format_line = format.map(|f| vec![format!("format = \"{}\"", f.name())]);
    let dataset = S3Dataset {
        extra: format_line.unwrap_or_default(),
        ..S3Dataset::new(DATASET, store.settings_via(proxy), prefix)
    };
    let mut cfg = AgentSettings::new_s3(plan.arena, dataset);
    cfg.window_batches = plan.window_batches;
    cfg.initial_window = 2;
    cfg.max_inflight_reads = plan.inflight;
    let agent = Agent::start(&cfg).map_err(|e| format!("agent: {e}"))?;
    let client = Client::connect(agent.socket()).map_err(|e| format!("connect: {e}"))?;
    let opts = first_epoch(plan.batch, Duration::from_secs(300));
    let mut first: Option<Instant> = None;
    let mut mark: Option<(Instant, u64, u64)> = None;
    let mut end: Option<(Instant, u64, u64)> = None;
    let (mut seen, mut bytes) = (0u64, 0u64);
    let fmt = format.unwrap_or(Format::Mds);
    let consumed = loader::consume(&client, &opts, Wait::Block, |s| {
        let payload = fmt.payload(s.bytes)?;
        if payload.is_empty() {
            return Err(format!("sample {}: empty", s.id));
        }
        if seen % 16 == 0 {
            synth::verify_sample(payload).map_err(|e| format!("sample {} corrupt: {e}", s.id))?;
        }
        let now = Instant::now();
        let t0 = *first.get_or_insert(now);
        if mark.is_none() && now.duration_since(t0) >= plan.warmup {
            mark = Some((now, seen, bytes));
        }
        seen += 1;
        bytes += payload.len() as u64;
        if let Some((at, _, _)) = mark {
            if end.is_none() && (now.duration_since(at) >= plan.window || seen >= n * 95 / 100) {
                end = Some((now, seen, bytes));
                return Err(STOP_EARLY.to_owned());
            }
        }
        Ok(0)
    });
    drop(client);
    agent.stop().map_err(|e| format!("agent: {e}"))?;
    match consumed {
        Ok(_) => {}
        Err(e) if e == STOP_EARLY => {}
        Err(e) => return Err(e),
    }
    let (Some((a, s0, b0)), Some((b, s1, b1))) = (mark, end) else {
        return Err("the epoch ended before the window could open: raise --files".to_owned());
    };
    let span = b.duration_since(a).as_secs_f64().max(1e-9);
    Ok(Point {
        samples_per_s: (s1 - s0) as f64 / span,
        mb_per_s: (b1 - b0) as f64 / span / 1e6,
    })
}

/// Runs the comparison and returns the result line.
pub fn run(ds: &Dataset, plan: &Plan) -> Result<Json> {
    let fmt = plan.format;
    let shards = ensure_shards(ds, fmt, plan.shard_bytes)?;
    let store = LightStore::start_mounts(
        &[
            (ds.spec.root.as_path(), "files"),
            (shards.as_path(), "shards"),
        ],
        BUCKET,
        1,
    )
    .map_err(|e| format!("light store: {e}"))?;
    let warmed = warm_page_cache(&ds.spec.root)? + warm_page_cache(&shards)?;
    println!(
        "light store on {} ({} objects), page cache warmed with {:.2} GB",
        store.endpoint(),
        store.len(),
        warmed as f64 / 1e9
    );
    let proxy = DelayProxy::loopback(store.addr(), Duration::from_micros(plan.rtt_ms * 1000 / 2))
        .map_err(|e| format!("delay proxy: {e}"))?;
    let n = ds.len();
    let (mut files, mut sharded) = (Vec::new(), Vec::new());
    for round in 0..plan.repeat {
        // The order alternates, so that a drift in the machine's load does
        // not always favour one side.
        let order: [bool; 2] = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for is_shards in order {
            let (prefix, f) = if is_shards {
                ("shards", Some(fmt))
            } else {
                ("files", None)
            };
            let p = measure(&store, proxy.local_addr(), prefix, f, plan, n)?;
            println!(
                "  round {} {:>7}: {:.0} samples/s, {:.1} MB/s ({})",
                round + 1,
                if is_shards { fmt.name() } else { "files" },
                p.samples_per_s,
                p.mb_per_s,
                sys::regime()
            );
            if is_shards {
                sharded.push(p);
            } else {
                files.push(p);
            }
        }
    }
    let rate = |v: &[Point]| median(&v.iter().map(|p| p.samples_per_s).collect::<Vec<_>>());
    let (f, s) = (rate(&files), rate(&sharded));
    let ratio = s / f;
    println!(
        "result at {} ms: {} {s:.0} samples/s, files {f:.0} samples/s: format_ratio {ratio:.3} (goal {}: {})",
        plan.rtt_ms,
        fmt.name(),
        GOAL.rule(),
        GOAL.verdict(ratio)
    );
    let mut j = Json::bench("latency");
    j.str("format", fmt.name())
        .int("rtt_ms", plan.rtt_ms)
        .num("files_samples_per_s", f, 0)
        .num("shards_samples_per_s", s, 0)
        .nums(
            "files_runs",
            &files.iter().map(|p| p.samples_per_s).collect::<Vec<_>>(),
            0,
        )
        .nums(
            "shards_runs",
            &sharded.iter().map(|p| p.samples_per_s).collect::<Vec<_>>(),
            0,
        )
        .num("format_ratio", ratio, 3)
        .goal(&GOAL, ratio)
        .int("files", n)
        .int("shard_mib", plan.shard_bytes >> 20)
        .int("repeat", u64::from(plan.repeat));
    Ok(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_name_themselves() {
        for f in [Format::WebDataset, Format::Mds, Format::Parquet] {
            assert_eq!(Format::parse(f.name()), Ok(f));
        }
        assert!(Format::parse("tar").unwrap_err().contains("webdataset"));
    }

    #[test]
    fn a_webdataset_payload_is_its_largest_member() {
        let mut frag = Vec::new();
        for (name, data) in [("k.cls", &b"7"[..]), ("k.bin", &[9u8; 700][..])] {
            let h = granary_shm::tar::ustar_header(name.as_bytes(), data.len() as u64, 0).unwrap();
            frag.extend_from_slice(&h);
            frag.extend_from_slice(data);
            frag.resize(frag.len().next_multiple_of(512), 0);
        }
        assert_eq!(Format::WebDataset.payload(&frag).unwrap(), &[9u8; 700][..]);
        assert_eq!(Format::Mds.payload(b"abc").unwrap(), b"abc");
        assert!(Format::WebDataset.payload(&[1u8; 512]).is_err());
    }
}
