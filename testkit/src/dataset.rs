//! Synthetic datasets on disk (`granary_tools::synth`) for tests: a
//! dataset in a directory of the test's, and [`AgentDir`], a temporary
//! directory holding a dataset and a `granaryd`'s socket and configuration
//! paths beside it.

use granary_tools::synth::{self, SynthSpec};
use std::path::{Path, PathBuf};

/// The dataset name the kit's configurations give the synthetic dataset.
pub const DATASET: &str = "synth";

/// Generates a synthetic dataset of `files` files (mean `mean_size` bytes,
/// `classes` classes) under `dir/synth`.
pub fn synth(dir: &Path, files: u64, classes: u32, mean_size: u64) -> SynthSpec {
    synth_at(&dir.join("synth"), files, classes, mean_size)
}

/// The same at `root` itself.
pub fn synth_at(root: &Path, files: u64, classes: u32, mean_size: u64) -> SynthSpec {
    let mut spec = SynthSpec::new(root);
    spec.num_files = files;
    spec.num_classes = classes;
    spec.mean_size = mean_size;
    synth::generate(&spec, |_, _| {}).expect("synthetic dataset");
    spec
}

/// A temporary directory holding a synthetic dataset (`synth/`) and the
/// paths of a `granaryd`'s socket and configuration file beside it, for
/// tests that run the real binary. Dropping it removes the directory and
/// the warm-restart files (arena, index, journal in /dev/shm) a `granaryd`
/// run here left.
pub struct AgentDir {
    /// The directory.
    pub dir: tempfile::TempDir,
    /// The dataset's root (`dir/synth`).
    pub data: PathBuf,
    /// The dataset's parameters.
    pub spec: SynthSpec,
    /// The agent's socket path (`dir/granary.sock`).
    pub sock: PathBuf,
    /// The configuration file's path (`dir/granaryd.toml`).
    pub config: PathBuf,
}

impl AgentDir {
    /// `files` synthetic files of about `mean_size` bytes (the generator's
    /// default classes), in a new directory under `parent` (the system's
    /// temporary directory if `None`).
    pub fn new(parent: Option<&Path>, files: u64, mean_size: u64) -> AgentDir {
        AgentDir::with(parent, |spec| {
            spec.num_files = files;
            spec.mean_size = mean_size;
        })
    }

    /// A dataset whose parameters `set` chooses.
    pub fn with(parent: Option<&Path>, set: impl FnOnce(&mut SynthSpec)) -> AgentDir {
        let dir = match parent {
            Some(p) => tempfile::tempdir_in(p),
            None => tempfile::tempdir(),
        }
        .expect("temp dir");
        let data = dir.path().join("synth");
        let mut spec = SynthSpec::new(&data);
        set(&mut spec);
        synth::generate(&spec, |_, _| {}).expect("synthetic dataset");
        let sock = dir.path().join("granary.sock");
        let config = dir.path().join("granaryd.toml");
        AgentDir {
            dir,
            data,
            spec,
            sock,
            config,
        }
    }

    /// Writes the configuration: an arena of `arena` with `hugepages`,
    /// the socket, 32 reads in flight (`extra` may go on with more
    /// `[prefetch]` keys, then tables of its own), and the dataset `synth`.
    pub fn write_config(&self, arena: &str, hugepages: &str, extra: &str) {
        std::fs::write(
            &self.config,
            format!(
                "[arena]\nsize = \"{arena}\"\nhugepages = \"{hugepages}\"\n[socket]\npath = \"{}\"\n\
                 [prefetch]\nmax_inflight_reads = 32\n{extra}\n\
                 [[dataset]]\nname = \"{DATASET}\"\nroot = \"{}\"\n",
                self.sock.display(),
                self.data.display()
            ),
        )
        .expect("write the configuration");
    }

    /// The path of a file in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for AgentDir {
    fn drop(&mut self) {
        granary_agent::warm::Files::for_socket(&self.sock).remove();
    }
}
