//! Benchmark datasets: synthetic ImageNet-like trees
//! ([`granary_tools::synth`]) generated once and reused.
//!
//! They live under `$GRANARY_BENCH_DATA` when set, else under `bench/.data/`
//! of this checkout (ignored by git), one folder per dataset shape, so a
//! second run finds them ready (the generator's marker file says so).

use granary_agent::source::fs::Catalog;
use granary_tools::progress::ProgressBar;
use granary_tools::synth::{self, SynthSpec};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where benchmark datasets are kept.
pub fn data_root() -> PathBuf {
    match std::env::var_os("GRANARY_BENCH_DATA") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".data"),
    }
}

/// A synthetic dataset of `num_files` files of mean size `mean_size` in
/// `num_classes` folders, with the generator's other defaults.
pub fn spec(num_files: u64, mean_size: u64, num_classes: u32) -> SynthSpec {
    let root = data_root().join(format!("synth-{num_files}x{mean_size}"));
    let mut s = SynthSpec::new(root);
    s.num_files = num_files;
    s.mean_size = mean_size;
    s.num_classes = num_classes.clamp(1, u32::try_from(num_files).unwrap_or(u32::MAX));
    s
}

/// A dataset on disk and its catalog, as the agent will see it.
pub struct Dataset {
    /// What was generated.
    pub spec: SynthSpec,
    /// The tree's catalog (sample `i` is file `i`).
    pub catalog: Catalog,
    /// Sum of the file sizes.
    pub bytes: u64,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.catalog.len() as u64
    }

    /// True when the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.catalog.is_empty()
    }

    /// Sample sizes by index.
    pub fn sizes(&self) -> Vec<u64> {
        self.catalog.entries().iter().map(|e| e.size).collect()
    }

    /// `N files, G GB, mean M bytes (root)`, as the benchmarks print it.
    pub fn describe(&self) -> String {
        format!(
            "{} files, {:.3} GB, mean {:.0} bytes ({})",
            self.len(),
            self.bytes as f64 / 1e9,
            self.bytes as f64 / self.len().max(1) as f64,
            self.spec.root.display()
        )
    }

    /// Bytes the samples take in an arena whose extents are rounded up to
    /// `align`.
    pub fn aligned_bytes(&self, align: u64) -> u64 {
        self.catalog
            .entries()
            .iter()
            .map(|e| e.size.next_multiple_of(align))
            .sum()
    }
}

/// Generates `spec` unless it is already there (with a progress bar), then
/// catalogs it.
pub fn ensure(spec: &SynthSpec) -> io::Result<Dataset> {
    let total = spec.num_files;
    let mut bar = ProgressBar::new(&format!("dataset {}", spec.root.display()), total);
    let summary = synth::generate(spec, |done, bytes| bar.update(done, bytes))?;
    bar.finish(summary.files, summary.bytes);
    if !summary.skipped {
        eprintln!(
            "generated {} files, {:.2} GB in {:.1} s",
            summary.files,
            summary.bytes as f64 / 1e9,
            summary.elapsed.as_secs_f64()
        );
    }
    let catalog = Catalog::from_dir(&spec.root)
        .map_err(|e| io::Error::other(format!("{}: {e}", spec.root.display())))?;
    if catalog.len() as u64 != spec.num_files {
        return Err(io::Error::other(format!(
            "{}: {} files catalogued, {} expected",
            spec.root.display(),
            catalog.len(),
            spec.num_files
        )));
    }
    Ok(Dataset {
        spec: spec.clone(),
        bytes: catalog.total_bytes(),
        catalog,
    })
}

/// A dataset some other tool wrote under `root` (class folders, as the
/// synthetic set's; its `spec` records the root and the file count only).
pub fn from_dir(root: &Path) -> io::Result<Dataset> {
    let catalog = Catalog::from_dir(root)
        .map_err(|e| io::Error::other(format!("{}: {e}", root.display())))?;
    if catalog.is_empty() {
        return Err(io::Error::other(format!("{}: no files", root.display())));
    }
    let mut spec = SynthSpec::new(root.to_path_buf());
    spec.num_files = catalog.len() as u64;
    Ok(Dataset {
        spec,
        bytes: catalog.total_bytes(),
        catalog,
    })
}

/// Stats every file of the dataset (what a catalog build does), so that
/// directory entries and inodes are cached while file data is not.
pub fn stat_all(ds: &Dataset) -> io::Result<Duration> {
    let t = Instant::now();
    for e in ds.catalog.entries() {
        std::fs::metadata(&e.path)?;
    }
    Ok(t.elapsed())
}
