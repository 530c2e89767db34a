//! What every measurement shares: the dataset, the arena's size, the
//! hugepages reserved for the arena and the baseline, and the private
//! mapping the baselines read.

use super::measure::{self, pages, Knobs, Outcome};
use super::{Options, Result};
use crate::data::{self, Dataset};
use crate::sys;
use crate::touch::MemRead;

/// The dataset and the memory both sides read.
pub(super) struct Scenario {
    pub ds: Dataset,
    /// The arena's size: room for every sample.
    pub arena: u64,
    /// `arena.hugepages`.
    pub hugepages: String,
    /// Timed epochs per measurement.
    pub epochs: u32,
    /// The baselines' private mapping (`None` with `--no-baseline`).
    pub mem: Option<MemRead>,
    /// Hugepages reserved for the run, given back when it ends.
    _reservation: Option<sys::HugepageReservation>,
}

impl Scenario {
    /// Generates (once) the dataset, reserves hugepages as root and loads
    /// the baseline mapping.
    pub fn prepare(o: &Options) -> Result<Scenario> {
        let (files, mean, hugepages) = (o.files, o.mean_size, o.hugepages.clone());
        let ds =
            data::ensure(&data::spec(files, mean, 100)).map_err(|e| format!("dataset: {e}"))?;
        let aligned = ds.aligned_bytes(4096);
        // Room for every sample (extents are 4 KiB-aligned), the engine's sample
        // tables (1/64) and its transient reserve (1/16 of the rest, or one
        // prefetch window), with slack; checked after the run (every timed
        // lookup must hit).
        let arena = (aligned + aligned / 8 + (64 << 20)).next_multiple_of(2 << 20);
        println!(
            "dataset: {} files, {:.3} GB ({:.3} GB in 4 KiB extents); arena {:.3} GB",
            ds.len(),
            ds.bytes as f64 / 1e9,
            aligned as f64 / 1e9,
            arena as f64 / 1e9
        );
        let want_huge = hugepages != "off";
        // 2 MiB pages for the arena and the baseline mapping, with slack.
        let huge_need = arena.div_ceil(2 << 20) + aligned.div_ceil(2 << 20) + 8;
        let reservation = if want_huge && sys::is_root() {
            match sys::HugepageReservation::reserve(huge_need) {
                Ok(r) => {
                    println!(
                        "hugepages: nr_hugepages {} -> {} (asked for {huge_need} more; restored at the end)",
                        r.old(),
                        r.now
                    );
                    Some(r)
                }
                Err(e) => {
                    println!("hugepages: WARNING: {e}: nothing reserved");
                    None
                }
            }
        } else {
            if want_huge {
                println!(
                    "hugepages: not root: nothing reserved (both sides get what the system has)"
                );
            }
            None
        };
        let mem = if o.no_baseline {
            None
        } else {
            let files: Vec<(&std::path::Path, u64)> = ds
                .catalog
                .entries()
                .iter()
                .map(|e| (e.path.as_path(), e.size))
                .collect();
            let m =
                MemRead::load(&files, want_huge).map_err(|e| format!("baseline mapping: {e}"))?;
            println!(
                "baseline: a private mapping of {:.3} GB on {}",
                m.bytes() as f64 / 1e9,
                pages(m.hugepages())
            );
            Some(m)
        };
        Ok(Scenario {
            ds,
            arena,
            hugepages,
            epochs: o.epochs,
            mem,
            _reservation: reservation,
        })
    }

    /// One measurement with `k`.
    pub fn measure(&self, k: Knobs) -> Result<Outcome> {
        measure::measure(
            &self.ds,
            self.arena,
            &self.hugepages,
            k,
            self.epochs,
            self.mem.as_ref(),
        )
    }
}
