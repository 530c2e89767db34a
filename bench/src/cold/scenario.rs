//! What every side shares: the dataset, the arena's size, the readers the
//! agent is compared with, and making the page cache cold before each run.

use std::cell::Cell;
use std::process::Command;
use std::time::Duration;

use super::{Options, Result};
use crate::data::{self, Dataset};
use crate::sys;
use crate::uring_read::FileToRead;

/// A reader the agent is compared with.
pub enum Reader {
    /// fio with this block setting.
    Fio(String),
    /// The minimal io_uring whole-file reader.
    Uring {
        /// `O_DIRECT` reads.
        direct: bool,
    },
}

impl Reader {
    /// The reader's name in the output.
    pub fn name(&self) -> String {
        match self {
            Reader::Fio(bs) => format!("fio {bs}"),
            Reader::Uring { direct: false } => "uring".to_owned(),
            Reader::Uring { direct: true } => "uring-direct".to_owned(),
        }
    }
}

/// The dataset and the readers.
pub struct Scenario {
    /// The synthetic dataset.
    pub ds: Dataset,
    /// The arena's size.
    pub arena: u64,
    /// Every file, for the io_uring reader.
    pub files: Vec<FileToRead>,
    /// Every reader besides the agent; each runs at `depth`.
    pub readers: Vec<Reader>,
    /// Every reader's queue depth (the agent's `max_inflight_reads`).
    pub depth: u32,
    /// `--warm-page-cache`: every run starts with the dataset cached.
    pub warm_cache: bool,
    /// Whether every run so far started with a dropped page cache.
    cold: Cell<bool>,
}

impl Scenario {
    /// Generates (once) the dataset and picks the readers.
    pub fn prepare(o: &Options) -> Result<Scenario> {
        let root = sys::is_root();
        let warm_cache = o.warm_page_cache;
        if warm_cache {
            println!("cold: --warm-page-cache: every file is read before each run: NOTHING BELOW IS A COLD READ, and the goal is not judged");
        } else if !root {
            println!("cold: WARNING: NOT ROOT: the page cache cannot be dropped, so NOTHING BELOW IS A COLD READ");
        }
        let ds = data::ensure(&data::spec(o.files, o.mean_size, 100))
            .map_err(|e| format!("dataset: {e}"))?;
        let arena = (ds.aligned_bytes(4096) * 5 / 4 + (128 << 20)).next_multiple_of(2 << 20);
        println!(
            "dataset: {} files, {:.3} GB in {}; arena {:.3} GB",
            ds.len(),
            ds.bytes as f64 / 1e9,
            ds.spec.root.display(),
            arena as f64 / 1e9
        );
        let fio = !o.no_fio && fio_version().is_some();
        if !o.no_fio && !fio {
            return Err(
                "fio not found (bench/run cold installs it with apt-get; or pass --no-fio)".into(),
            );
        }
        if let Some(v) = fio_version() {
            println!("fio: {v}");
        }
        let files = ds
            .catalog
            .entries()
            .iter()
            .map(|e| FileToRead {
                path: e.path.clone(),
                size: e.size,
            })
            .collect();
        let mut readers: Vec<Reader> = Vec::new();
        if !o.no_uring {
            readers.push(Reader::Uring { direct: false });
            readers.push(Reader::Uring { direct: true });
        }
        if fio {
            let bs = o.fio_bs.split(',').map(str::trim).filter(|v| !v.is_empty());
            readers.extend(bs.map(|bs| Reader::Fio(bs.to_owned())));
        }
        let depth = o.inflight;
        println!(
            "depth: {depth} (agent prefetch.max_inflight_reads; every reader's queue depth / files in flight)"
        );
        Ok(Scenario {
            ds,
            arena,
            files,
            readers,
            depth,
            warm_cache,
            cold: Cell::new(root && !warm_cache),
        })
    }

    /// Whether every run so far read from a dropped page cache.
    pub fn was_cold(&self) -> bool {
        self.cold.get()
    }

    /// Drops the page cache (or records that it could not; with
    /// `--warm-page-cache` reads every file instead), then stats every file.
    /// Returns how long the stat pass took.
    pub fn make_cold(&self) -> Result<Duration> {
        let ds = &self.ds;
        if self.warm_cache {
            for e in ds.catalog.entries() {
                std::fs::read(&e.path).map_err(|err| format!("{}: {err}", e.path.display()))?;
            }
        } else if self.cold.get() {
            if let Err(e) = sys::drop_caches() {
                println!("cold: WARNING: {e}: the page cache was NOT dropped");
                self.cold.set(false);
            }
        }
        data::stat_all(ds).map_err(|e| format!("stat: {e}"))
    }
}

/// `fio --version`, when fio runs.
pub fn fio_version() -> Option<String> {
    let o = Command::new("fio").arg("--version").output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}
