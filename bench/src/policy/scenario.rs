//! The scenario: the synthetic dataset, an arena half its bytes, and the
//! session's plan the simulator replays.

use granary_agent::planner::{PlanParams, SessionPlan};

use super::{Options, Result};
use crate::data::{self, Dataset};

const MIB: u64 = 1 << 20;

/// The bytes the engine keeps for sample tables at the head of an arena of
/// `arena` bytes (mirrors `engine::table_area`).
pub fn table_area(arena: u64) -> u64 {
    (arena / 64).clamp(MIB, 64 * MIB) & !4095
}

/// The arena for a dataset of `bytes`: half of it in 2 MiB units, at least
/// 64 MiB.
pub fn arena_for(bytes: u64) -> u64 {
    (bytes / 2 / (2 * MIB) * (2 * MIB)).max(64 * MIB)
}

/// What every policy runs against.
pub struct Scenario {
    /// The dataset.
    pub ds: Dataset,
    /// The agent's arena.
    pub arena: u64,
    /// The arena less the sample tables: the cache's bytes.
    pub cache_bytes: u64,
    /// The session every policy runs, as the simulator replays it.
    pub plan: SessionPlan,
}

impl Scenario {
    /// Generates the dataset (once) and prints the set-up.
    pub fn prepare(o: &Options) -> Result<Scenario> {
        let ds = data::ensure(&data::spec(o.files, o.mean_size, 40))
            .map_err(|e| format!("dataset: {e}"))?;
        let arena = arena_for(ds.bytes);
        let cache_bytes = arena - table_area(arena);
        println!(
            "dataset: {} files, {:.1} MB ({:.1} MB in 4 KiB extents); arena {:.1} MB ({:.2}× smaller), \
             of which {:.1} MB for samples; batch {}, window {}, ready ring {}, {} reads in flight, {} epochs, seed {}",
            ds.len(),
            ds.bytes as f64 / 1e6,
            ds.aligned_bytes(4096) as f64 / 1e6,
            arena as f64 / 1e6,
            ds.bytes as f64 / arena as f64,
            cache_bytes as f64 / 1e6,
            o.batch,
            o.window,
            o.ready,
            o.inflight,
            o.epochs,
            o.seed,
        );
        let params = PlanParams {
            num_samples: ds.len(),
            seed: o.seed,
            rank: 0,
            world_size: 1,
            batch_size: o.batch,
            drop_last: false,
        };
        let plan = SessionPlan::new(params, 0, o.epochs).map_err(|e| format!("plan: {e}"))?;
        Ok(Scenario {
            ds,
            arena,
            cache_bytes,
            plan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_is_half_the_dataset_less_its_tables() {
        assert_eq!(arena_for(200 * MIB), 100 * MIB);
        assert_eq!(arena_for(201 * MIB), 100 * MIB);
        assert_eq!(arena_for(10 * MIB), 64 * MIB);
        assert_eq!(table_area(64 * MIB), MIB);
        assert_eq!(table_area(1 << 40), 64 * MIB);
        assert_eq!(table_area(640 * MIB), 10 * MIB);
    }
}
