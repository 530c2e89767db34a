//! What every run of `bench/run stall` shares: the dataset, the store
//! and its shards, the delay proxy, and the contenders with how each one
//! is started.

use super::Options;
use crate::data::{self, Dataset};
use crate::delay_proxy::DelayProxy;
use crate::light_store::LightStore;
use crate::s3_data;
use crate::seaweed::Seaweed;
use crate::stall_loaders;
use crate::store::Store;
use granary_testkit::cc::cc_against_libgranary;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, String>;

pub(super) const BUCKET: &str = "granary-bench";
pub(super) const PREFIX: &str = "synth";
pub(super) const DATASET: &str = "stall";
pub(super) const SEED: u64 = 42;
/// How many times calibration lengthens the step by a quarter (×14.6 in all)
/// before giving up.
pub(super) const CALIBRATION_GROWTHS: u32 = 12;
/// The shard readers: contender and shard format (`stall_shards.py
/// --format`), which is also the folder of the bucket its shards go in.
pub(super) const SHARD_READERS: &[(&str, &str)] = &[
    ("streaming", "mds"),
    ("litdata", "litdata"),
    ("webdataset", "wds"),
    // DALI's `fn.readers.webdataset` reads the webdataset contender's shards.
    ("dali", "wds"),
];
pub(super) static RUN_NO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Every contender, in the default order (Granary first).
pub const ALL: &[&str] = stall_loaders::CONTENDERS;

/// The JPEG dataset of `--decode` (`bench/stall_decode.py make`, once).
pub(super) fn jpeg_dataset(python: &str, root: &Path, files: u64, side: u32) -> Result<Dataset> {
    let dir = data::data_root().join(format!("jpeg-{files}x{side}"));
    let status = Command::new(python)
        .arg(root.join("bench/stall_decode.py"))
        .arg("make")
        .arg(&dir)
        .args([files.to_string(), side.to_string()])
        .status()
        .map_err(|e| format!("stall_decode.py: {e}"))?;
    if !status.success() {
        return Err(format!("stall_decode.py make: {status}"));
    }
    data::from_dir(&dir).map_err(|e| format!("dataset: {e}"))
}

/// The checkout: where this binary was built from, else the current
/// folder (a binary carried to another machine and run from a copy of the
/// checkout's root).
pub fn repo_root() -> Result<PathBuf> {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf);
    let here = std::env::current_dir().ok();
    built
        .into_iter()
        .chain(here)
        .find(|d| d.join("bench/stall_train.py").is_file())
        .ok_or_else(|| {
            "no checkout with bench/stall_train.py (run from the checkout's root)".into()
        })
}

/// Every contender but `granary_w0`, which is run on request only: the same
/// agent read in the training process, where its per-batch work is not
/// hidden behind the GPU step (docs/benchmarks.md has a run of it); the
/// decode-only ones (`dali`) with `--decode` (`decode` > 0) only.
pub fn default_contenders(decode: u32) -> Vec<&'static str> {
    ALL.iter()
        .copied()
        .filter(|&n| n != "granary_w0")
        .filter(|n| decode > 0 || !stall_loaders::DECODE_ONLY.contains(n))
        .collect()
}

/// How contender `name` decodes with `--decode` (its description line's end).
pub(super) fn decoder_note(name: &str) -> String {
    match (name, stall_loaders::decoder(name)) {
        ("granary", _) => "samples prepared by the agent (decodes nothing)".to_owned(),
        (_, Some(d)) => format!("decoder {d}"),
        (_, None) => "does not decode".to_owned(),
    }
}

/// How one contender is started.
#[derive(Clone, Debug)]
pub(super) enum Launch {
    /// `stall_train.py` with these arguments.
    Python(Vec<String>),
    /// The C consumer, built at this path.
    C(PathBuf),
    /// Not runnable here, and why.
    Missing(String),
}

#[derive(Clone, Debug)]
pub(super) struct Contender {
    pub(super) name: String,
    pub(super) launch: Launch,
    /// Needs a fresh Granary agent per run.
    pub(super) agent: bool,
    pub(super) settings: &'static str,
}

pub(super) fn py_args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

pub(super) fn contender(name: &str, python: &str, c_loader: &Result<PathBuf>) -> Result<Contender> {
    // `stall_train.py` with the contender's arguments, or why it cannot run
    // (its package does not import).
    let script = |needs: Option<(&str, &str)>| -> Launch {
        let missing = needs.filter(|(module, _)| {
            !Command::new(python)
                .args(["-c", &format!("import {module}")])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        match (missing, stall_loaders::args(name)) {
            (Some((module, package)), _) => {
                Launch::Missing(format!("{module} does not import (pip install {package})"))
            }
            (None, Some(args)) => Launch::Python(py_args(args)),
            (None, None) => Launch::Missing(format!("{name}: no stall_train.py arguments")),
        }
    };
    let (launch, agent, settings) = match name {
        "granary" => (
            script(None),
            true,
            "GranaryDataset(batches=True, batch_size=32) in the training process through granary.cuda.prefetch (depth 2; the arena registered with CUDA when there is a GPU), no DataLoader worker; agent: max_inflight_reads 1024, window 64 batches, 1 GiB arena",
        ),
        "granary_workers" => (
            script(None),
            true,
            "GranaryDataset(batches=True, batch_size=32), DataLoader(batch_size=None, num_workers=2); agent as for granary",
        ),
        "granary_w0" => (
            script(None),
            true,
            "GranaryDataset(batches=True, batch_size=32) read in the training process, DataLoader(batch_size=None, num_workers=0); agent as for granary",
        ),
        "granary_c" => (
            match c_loader {
                Ok(p) => Launch::C(p.clone()),
                Err(e) => Launch::Missing(e.clone()),
            },
            true,
            "bench/stall_consume.c: one libgranary session in the training process; agent as for granary",
        ),
        "boto3_w8" | "boto3_w32" => (
            script(None),
            false,
            "map-style Dataset, one boto3 get_object per sample; DataLoader(batch_size=32, RandomSampler, num_workers=8 or 32)",
        ),
        "boto3_threads" => (
            script(None),
            false,
            "as boto3, each worker fetching its batch with 16 threads (__getitems__); 4 workers",
        ),
        "s3torch_map" | "s3torch_iter" => (
            script(Some(("s3torchconnector", "s3torchconnector"))),
            false,
            "s3torchconnector S3MapDataset / S3IterableDataset(enable_sharding=True) .from_objects, force_path_style; DataLoader(batch_size=32, num_workers=8)",
        ),
        "streaming" => (
            script(Some(("streaming", "mosaicml-streaming"))),
            false,
            "mosaicml-streaming StreamingDataset(shuffle=True, batch_size=32) over MDS shards (MDSWriter defaults: 64 MiB, uncompressed) in the same store, a fresh local cache per run; DataLoader(batch_size=32, num_workers=8)",
        ),
        "litdata" => (
            script(Some(("litdata", "litdata"))),
            false,
            "litdata StreamingDataset(shuffle=True) over litdata.optimize chunks (64 MB, uncompressed) in the same store, a fresh local cache per run, boto3 standard retries; StreamingDataLoader(batch_size=32, num_workers=8)",
        ),
        "webdataset" => (
            script(Some(("webdataset", "webdataset"))),
            false,
            "webdataset WebDataset over 64 MiB tar shards in the same store, each read by `pipe:curl` on a presigned URL, shard shuffle + shuffle(1000), batched(32) in the workers; WebLoader(batch_size=None, num_workers=8)",
        ),
        "dali" => (
            script(Some(("nvidia.dali", "nvidia-dali-cuda120"))),
            false,
            "NVIDIA DALI on the CPU (device_id=None): fn.readers.webdataset over the webdataset contender's tar shards (downloaded through the proxy into a fresh local cache at start, in shuffled order), random_shuffle with initial_fill 1000, batch 32, 8 DALI threads, DALIGenericIterator in the training process",
        ),
        other => {
            return Err(format!(
                "--contenders: unknown contender {other:?} (known: {})",
                ALL.join(", ")
            ))
        }
    };
    Ok(Contender {
        name: name.to_owned(),
        launch,
        agent,
        settings,
    })
}

/// Builds `bench/stall_consume.c` against libgranary.so (built by
/// `bench/run stall`) into `dir`.
pub(super) fn build_c_loader(root: &Path, dir: &Path) -> Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("release");
    if !target.join("libgranary.so").is_file() {
        return Err(format!(
            "{}/libgranary.so is missing (cargo build --release -p granary-client)",
            target.display()
        ));
    }
    let out = dir.join("stall_consume");
    let mut cc = cc_against_libgranary(
        &root.join("client-c/include"),
        &root.join("bench/stall_consume.c"),
        &target,
        &out,
    );
    let cc_name = cc.get_program().to_string_lossy().into_owned();
    let status = cc.status().map_err(|e| format!("{cc_name}: {e}"))?;
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{cc_name} bench/stall_consume.c: {status}"))
    }
}

/// Where a shard reader's shards go.
pub(super) enum ShardsTo<'a> {
    /// Uploaded into SeaweedFS's bucket under the format's prefix (written
    /// in `work` first).
    Upload(&'a Seaweed, &'a Path),
    /// Written into this folder, which the light store then serves under
    /// the format's prefix.
    Folder(PathBuf),
}

/// Writes the shards of a shard-reading contender in `format`
/// (`bench/stall_shards.py`).
pub(super) fn write_shards(
    python: &str,
    root: &Path,
    to: &ShardsTo,
    keys: &Path,
    ds: &Dataset,
    format: &str,
) -> Result<()> {
    let mut cmd = Command::new(python);
    cmd.arg(root.join("bench/stall_shards.py"))
        .args(["--format", format])
        .arg("--keys")
        .arg(keys)
        .arg("--local-root")
        .arg(&ds.spec.root);
    let work = match to {
        ShardsTo::Upload(weed, work) => {
            let work = work.join("shards-work");
            cmd.args(["--endpoint", &weed.endpoint(), "--bucket", weed.bucket()])
                .args(["--prefix", format])
                .arg("--work")
                .arg(&work)
                .envs(weed.env());
            Some(work)
        }
        ShardsTo::Folder(dir) => {
            cmd.arg("--out").arg(dir);
            None
        }
    };
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("stall_shards.py: {e}"))?;
    if let Some(work) = work {
        let _ = std::fs::remove_dir_all(&work);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "stall_shards.py --format {format} exited with {}: {text}",
            out.status
        ));
    }
    // The writer's own messages come before the last line (litdata's
    // optimize prints on stdout).
    println!(
        "{format} shards: {}",
        text.trim().lines().last().unwrap_or("")
    );
    Ok(())
}

/// What every run shares.
pub(super) struct Ctx {
    pub(super) python: String,
    pub(super) root: PathBuf,
    pub(super) store: Store,
    /// A folder of this run's own (keys, the C loader, shard caches).
    pub(super) work: PathBuf,
    pub(super) proxy: DelayProxy,
    pub(super) keys: PathBuf,
    pub(super) ds: Dataset,
    pub(super) batch: u32,
    pub(super) batches: u64,
    pub(super) window_s: f64,
    pub(super) warmup: u64,
    pub(super) quiet: Duration,
    /// `--gpu-step`: the model of the real step, if any.
    pub(super) gpu_step: Option<String>,
    /// `--decode`: the side the loaders resize to (0: bytes, no decode).
    pub(super) decode: u32,
}

impl Ctx {
    /// Stops the proxy and the store and removes the run's folder.
    pub(super) fn finish(self) {
        let Ctx {
            store, proxy, work, ..
        } = self;
        drop(proxy);
        drop(store);
        let _ = std::fs::remove_dir_all(&work);
    }

    /// Batches consumed before the window: `--warmup-batches`, and with
    /// `--decode` a whole epoch before them.
    pub(super) fn warmup_batches(&self) -> u64 {
        if self.decode == 0 {
            self.warmup
        } else {
            self.warmup + self.ds.len().div_ceil(u64::from(self.batch))
        }
    }

    /// Epochs a Granary pass is opened for: enough for the warm-up and the
    /// window.
    pub(super) fn epochs(&self) -> u64 {
        let samples = (self.warmup_batches() + self.batches) * u64::from(self.batch);
        samples.div_ceil(self.ds.len().max(1)) + 1
    }
}

/// The dataset (made once), the store with the shard readers' shards, the
/// delay proxy in front of it, and the contenders (those that cannot run
/// here marked with why).
pub(super) fn setup(o: &Options, root: &Path) -> Result<(Ctx, Vec<Contender>)> {
    let ds = if o.decode > 0 {
        jpeg_dataset(&o.python, root, o.files, o.jpeg_side)?
    } else {
        data::ensure(&data::spec(o.files, o.mean_size, 100)).map_err(|e| format!("dataset: {e}"))?
    };
    println!("dataset: {}", ds.describe());
    let work = std::env::temp_dir().join(format!("granary-stall-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let keys = work.join("keys.tsv");
    s3_data::write_keys_at(&keys, &ds, PREFIX)?;
    let c_loader = match (&o.gpu_step, o.decode) {
        (Some(_), _) => Err("with --gpu-step: the C loader has no GPU step".to_owned()),
        (None, 1..) => Err("with --decode: the C loader does not decode".to_owned()),
        (None, 0) => build_c_loader(root, &work),
    };
    let mut contenders = o
        .contenders
        .iter()
        .map(|n| contender(n, &o.python, &c_loader))
        .collect::<Result<Vec<_>>>()?;
    let mut formats: Vec<&str> = Vec::new();
    for format in contenders
        .iter()
        .filter(|c| matches!(c.launch, Launch::Python(_)))
        .filter_map(|c| SHARD_READERS.iter().find(|r| r.0 == c.name).map(|r| r.1))
    {
        // webdataset and dali read the same shards: written once.
        if !formats.contains(&format) {
            formats.push(format);
        }
    }
    let mut shard_errors = Vec::new();
    let store = if o.store == "light" {
        let mut mounts = vec![(ds.spec.root.clone(), PREFIX.to_owned())];
        for format in &formats {
            let dir = work.join("shards").join(format);
            match write_shards(
                &o.python,
                root,
                &ShardsTo::Folder(dir.clone()),
                &keys,
                &ds,
                format,
            ) {
                Ok(()) => mounts.push((dir, (*format).to_owned())),
                Err(e) => shard_errors.push((*format, e)),
            }
        }
        let mounts: Vec<(&Path, &str)> = mounts
            .iter()
            .map(|(d, p)| (d.as_path(), p.as_str()))
            .collect();
        let light = LightStore::start_mounts(&mounts, BUCKET, o.light_threads)
            .map_err(|e| format!("light store: {e}"))?;
        println!(
            "light store: S3 on {} ({} objects, {} worker threads)",
            light.endpoint(),
            light.len(),
            o.light_threads
        );
        // Every file read once, so that the first run is served from the
        // page cache like the others (SeaweedFS's ingest reads its objects
        // back for the same reason).
        let t = Instant::now();
        let warmed = s3_data::read_all(&ds)?;
        println!(
            "page cache: every file read once ({:.3} GB) in {:.1} s",
            warmed as f64 / 1e9,
            t.elapsed().as_secs_f64()
        );
        Store::Light(light)
    } else {
        let weed = Seaweed::try_start(BUCKET)?;
        println!(
            "SeaweedFS: S3 on {} (pid {})",
            weed.endpoint(),
            weed.pid().unwrap_or(0)
        );
        s3_data::upload(&weed, &ds, PREFIX)?;
        println!(
            "SeaweedFS idle {:.1} s after the ingest",
            s3_data::settle(&weed).as_secs_f64()
        );
        for format in &formats {
            let to = ShardsTo::Upload(&weed, &work);
            if let Err(e) = write_shards(&o.python, root, &to, &keys, &ds, format) {
                shard_errors.push((*format, e));
            }
        }
        Store::Weed(weed)
    };
    for c in &mut contenders {
        let Some((_, format)) = SHARD_READERS.iter().find(|r| r.0 == c.name) else {
            continue;
        };
        if let Some((_, e)) = shard_errors.iter().find(|(f, _)| f == format) {
            c.launch = Launch::Missing(e.clone());
        }
    }
    for c in &contenders {
        match &c.launch {
            Launch::Missing(e) => println!("contender {}: NOT RUN: {e}", c.name),
            _ if o.decode > 0 => println!(
                "contender {}: {}; {}",
                c.name,
                c.settings,
                decoder_note(&c.name)
            ),
            _ => println!("contender {}: {}", c.name, c.settings),
        }
    }
    let proxy = DelayProxy::loopback(store.addr(), Duration::ZERO)
        .map_err(|e| format!("delay proxy: {e}"))?;
    println!(
        "delay proxy: {} -> {} ({})",
        proxy.local_addr(),
        store.addr(),
        store.describe()
    );
    let ctx = Ctx {
        python: o.python.clone(),
        root: root.to_path_buf(),
        store,
        work,
        proxy,
        keys,
        ds,
        batch: o.batch,
        batches: o.batches,
        window_s: o.window_s,
        warmup: o.warmup,
        quiet: Duration::from_secs_f64(o.quiet_s),
        gpu_step: o.gpu_step.clone(),
        decode: o.decode,
    };
    Ok((ctx, contenders))
}
