//! A policy simulator: replays sessions' planned sample sequences against a
//! [`Cache`] and reports hit rates per epoch.
//!
//! The simulator drives the real cache exactly as the session engine does,
//! with reads that complete at once:
//!
//! 1. Sessions take turns, one batch each (lockstep: every session delivers
//!    at the same rate, which is also what the clairvoyant policy assumes).
//! 2. For each sample of the batch: [`Cache::access`]; a hit is pinned, a
//!    miss is reserved (which pins it), read and completed.
//! 3. The session's position moves past the batch
//!    ([`Cache::advance_session`]): the batch has been published.
//! 4. The batch is released: every pin taken in step 2 is dropped.
//!
//! A hit is a sample found Ready at step 2. A miss that finds no room
//! ([`CacheError::NoSpace`], possible only when the transient reserve is
//! smaller than the batches being assembled) is counted as a miss and as
//! `unserved`, and is not cached.
//!
//! All sessions read dataset 0, whose sample `i` is `sample_sizes[i]` bytes.

use std::fmt;

use super::{Cache, CacheConfig, CacheError, Lookup, PolicyKind, SampleKey};
use crate::planner::{PlanError, SessionPlan};

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// The arena's size in bytes.
    pub arena_size: u64,
    /// Extent alignment (see [`CacheConfig::align`]).
    pub align: u64,
    /// Bytes kept for transient reads (see
    /// [`CacheConfig::transient_reserve`]).
    pub transient_reserve: u64,
    /// The size of every sample of the dataset, by index.
    pub sample_sizes: Vec<u64>,
    /// The sessions, all on the same dataset.
    pub sessions: Vec<SessionPlan>,
}

impl SimConfig {
    /// A configuration whose transient reserve holds one batch of the
    /// largest samples per session, each rounded up to the alignment, so
    /// no read ever waits for room.
    #[cfg(test)]
    pub(crate) fn with_batch_reserve(
        arena_size: u64,
        align: u64,
        sample_sizes: Vec<u64>,
        sessions: Vec<SessionPlan>,
    ) -> Self {
        let largest = sample_sizes
            .iter()
            .max()
            .map_or(0, |&m| m.next_multiple_of(align.max(1)));
        let batches: u64 = sessions
            .iter()
            .map(|s| u64::from(s.params().batch_size))
            .sum();
        SimConfig {
            arena_size,
            align,
            transient_reserve: largest.saturating_mul(batches).min(arena_size),
            sample_sizes,
            sessions,
        }
    }
}

/// Hits and accesses over some span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HitCount {
    /// Samples delivered.
    pub accesses: u64,
    /// Of those, samples found Ready in the cache.
    pub hits: u64,
}

impl HitCount {
    /// `hits / accesses` (0 when there was no access).
    pub fn rate(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.hits as f64 / self.accesses as f64
        }
    }

    fn add(&mut self, hit: bool) {
        self.accesses += 1;
        self.hits += u64::from(hit);
    }
}

/// The outcome of one simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    /// The policy simulated.
    pub policy: PolicyKind,
    /// Hits per epoch, all sessions together; entry `k` is every session's
    /// `k`-th epoch.
    pub epochs: Vec<HitCount>,
    /// Hits per session (in [`SimConfig::sessions`] order) and epoch.
    pub sessions: Vec<Vec<HitCount>>,
    /// Bytes read from the (simulated) source: the sizes of all misses.
    pub bytes_read: u64,
    /// Entries evicted.
    pub evictions: u64,
    /// Misses read transiently (not kept).
    pub transient_reads: u64,
    /// Misses that found no room at all.
    pub unserved: u64,
    /// Mean over batches of the bytes held by retained extents, as a
    /// fraction of the retain limit.
    pub mean_fill: f64,
    /// At the end of each of the first session's epochs: the samples and
    /// bytes the cache retains.
    pub epoch_end_retained: Vec<(u64, u64)>,
}

impl SimResult {
    /// The per-epoch hit rates, all sessions together.
    pub fn hit_rates(&self) -> Vec<f64> {
        self.epochs.iter().map(HitCount::rate).collect()
    }
}

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq)]
pub enum SimError {
    /// A session's dataset has more samples than `sample_sizes` lists.
    MissingSizes {
        /// Samples in the session's dataset.
        num_samples: u64,
        /// Sizes given.
        sizes: usize,
    },
    /// The cache refused the configuration or a call.
    Cache(CacheError),
    /// A session could not be planned.
    Plan(PlanError),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::MissingSizes { num_samples, sizes } => write!(
                f,
                "the dataset has {num_samples} samples but only {sizes} sizes are given"
            ),
            SimError::Cache(e) => write!(f, "{e}"),
            SimError::Plan(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SimError {}

impl From<CacheError> for SimError {
    fn from(e: CacheError) -> Self {
        SimError::Cache(e)
    }
}

impl From<PlanError> for SimError {
    fn from(e: PlanError) -> Self {
        SimError::Plan(e)
    }
}

/// Replays `config`'s sessions under `policy` (see the module docs).
///
/// # Errors
///
/// [`SimError`] for a bad configuration; a cache call that fails otherwise
/// than for lack of room is reported too (it would be a cache bug).
pub fn simulate(config: &SimConfig, policy: PolicyKind) -> Result<SimResult, SimError> {
    for s in &config.sessions {
        let n = s.params().num_samples;
        if n > config.sample_sizes.len() as u64 {
            return Err(SimError::MissingSizes {
                num_samples: n,
                sizes: config.sample_sizes.len(),
            });
        }
    }
    let mut cache = Cache::new(CacheConfig {
        base: 0,
        arena_size: config.arena_size,
        align: config.align,
        transient_reserve: config.transient_reserve,
        keep_reserve: 0,
        policy,
    })?;
    let retain_limit = cache.config().retain_limit().max(1);
    let mut cursors = Vec::with_capacity(config.sessions.len());
    let mut positions = vec![0u64; config.sessions.len()];
    for (i, plan) in config.sessions.iter().enumerate() {
        cache.add_session(i as u64, 0, plan.clone())?;
        cursors.push(plan.cursor_at(0));
    }
    let mut result = SimResult {
        policy,
        epochs: Vec::new(),
        sessions: vec![Vec::new(); config.sessions.len()],
        bytes_read: 0,
        evictions: 0,
        transient_reads: 0,
        unserved: 0,
        mean_fill: 0.0,
        epoch_end_retained: Vec::new(),
    };
    let mut fill_sum = 0.0;
    let mut batches = 0u64;
    let mut pinned: Vec<SampleKey> = Vec::new();
    let mut live = config.sessions.len();
    let mut done = vec![false; config.sessions.len()];
    while live > 0 {
        for (i, cursor) in cursors.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            let Some(batch) = cursor.next_batch()? else {
                done[i] = true;
                live -= 1;
                cache.remove_session(i as u64)?;
                continue;
            };
            let epoch_index = (u64::from(batch.epoch) - config.sessions[i].epochs().start) as usize;
            let batch_ends_epoch = batch.index + 1 == config.sessions[i].batches_per_epoch();
            if result.epochs.len() <= epoch_index {
                result.epochs.resize(epoch_index + 1, HitCount::default());
            }
            let per_session = &mut result.sessions[i];
            if per_session.len() <= epoch_index {
                per_session.resize(epoch_index + 1, HitCount::default());
            }
            pinned.clear();
            for &index in batch.samples {
                let key = SampleKey { dataset: 0, index };
                let hit = match cache.access(key) {
                    Lookup::Ready(_) => {
                        cache.pin(key)?;
                        pinned.push(key);
                        true
                    }
                    // Reads complete at once: nothing is ever in flight, and
                    // failed reads do not happen.
                    Lookup::InFlight { .. } | Lookup::Failed { .. } | Lookup::Absent => {
                        let len = config
                            .sample_sizes
                            .get(index as usize)
                            .copied()
                            .unwrap_or(1);
                        result.bytes_read += len;
                        match cache.reserve(key, len.max(1)) {
                            Ok(_) => {
                                cache.complete(key, 0)?;
                                pinned.push(key);
                            }
                            Err(CacheError::NoSpace { .. }) => result.unserved += 1,
                            Err(e) => return Err(e.into()),
                        }
                        false
                    }
                };
                result.epochs[epoch_index].add(hit);
                per_session[epoch_index].add(hit);
            }
            positions[i] += batch.samples.len() as u64;
            cache.advance_session(i as u64, positions[i])?;
            for &key in &pinned {
                cache.unpin(key)?;
            }
            let retained = cache.accounting().retained;
            fill_sum += retained as f64 / retain_limit as f64;
            if i == 0 && batch_ends_epoch {
                result
                    .epoch_end_retained
                    .push((cache.policy().len() as u64, retained));
            }
            batches += 1;
        }
    }
    let stats = cache.stats();
    result.evictions = stats.evictions;
    result.transient_reads = stats.transient_reservations;
    result.mean_fill = if batches == 0 {
        0.0
    } else {
        fill_sum / batches as f64
    };
    Ok(result)
}

/// [`simulate`] under every policy, in [`PolicyKind::ALL`] order
/// (clairvoyant, MinIO, LRU).
///
/// # Errors
///
/// The first [`SimError`].
#[cfg(test)]
pub(crate) fn simulate_all(config: &SimConfig) -> Result<Vec<SimResult>, SimError> {
    PolicyKind::ALL
        .iter()
        .map(|&policy| simulate(config, policy))
        .collect()
}

/// Sample sizes drawn from a log-normal distribution with the given median
/// and shape `sigma` (the standard deviation of the log), clamped to
/// `[1, 64 × median]`, deterministic for a seed. ImageNet's JPEGs are about
/// `median = 110_000`, `sigma = 0.6`.
#[cfg(test)]
pub(crate) fn lognormal_sizes(count: usize, median: u64, sigma: f64, seed: u64) -> Vec<u64> {
    let mut gen = granary_base::SplitMix64(seed);
    let mut uniform = move || {
        let z = gen.next_u64();
        // In (0, 1): 53 random bits, offset by half a step.
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let cap = median.saturating_mul(64) as f64;
    (0..count)
        .map(|_| {
            // Box–Muller.
            let (u1, u2) = (uniform(), uniform());
            let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            let size = median as f64 * (sigma * normal).exp();
            size.round().clamp(1.0, cap) as u64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u64, seed: u64, rank: u32, ws: u32, batch: u32, epochs: u32) -> SessionPlan {
        SessionPlan::for_test(n, seed, rank, ws, batch, epochs)
    }

    fn run_all(config: &SimConfig) -> Vec<SimResult> {
        simulate_all(config).unwrap()
    }

    fn table(results: &[SimResult]) -> String {
        let mut out = String::new();
        for r in results {
            let rates: Vec<String> = r
                .hit_rates()
                .iter()
                .map(|x| format!("{:5.1}%", x * 100.0))
                .collect();
            out += &format!(
                "{:<12} {}  evictions {} transient {} unserved {} fill {:.3}\n",
                r.policy.as_str(),
                rates.join(" "),
                r.evictions,
                r.transient_reads,
                r.unserved,
                r.mean_fill
            );
        }
        out
    }

    /// Checks clairvoyant >= minio > lru in epochs 2.. and returns the table.
    fn check_order(results: &[SimResult]) -> String {
        let t = table(results);
        let [c, m, l] = [0, 1, 2].map(|i| results[i].hit_rates());
        for e in 1..c.len() {
            assert!(
                c[e] >= m[e],
                "epoch {}: clairvoyant below minio\n{t}",
                e + 1
            );
            assert!(m[e] > l[e], "epoch {}: minio not above lru\n{t}", e + 1);
        }
        t
    }

    /// `sessions` over `n` samples of log-normal sizes around 110 KB (seed
    /// `seed`) in an arena of half their bytes, under each policy: the
    /// results, checked by [`check_order`], and their table (printed under
    /// `what`).
    fn half_arena(
        what: &str,
        n: usize,
        seed: u64,
        sessions: Vec<SessionPlan>,
    ) -> (Vec<SimResult>, String) {
        let sizes = lognormal_sizes(n, 110_000, 0.6, seed);
        let total: u64 = sizes.iter().sum();
        let config = SimConfig::with_batch_reserve(total / 2, 4096, sizes, sessions);
        let results = run_all(&config);
        let t = check_order(&results);
        println!("{what}, n = {n}, dataset = 2 x arena\n{t}");
        (results, t)
    }

    #[test]
    fn one_session_on_a_dataset_twice_the_arena() {
        let n = 4000;
        let one = vec![session(n as u64, 42, 0, 1, 32, 4)];
        let (results, t) = half_arena("one session", n, 1, one);
        for r in &results {
            assert_eq!(r.epochs.len(), 4);
            // Epoch 1 is cold.
            assert_eq!(r.epochs[0].hits, 0);
            assert!(r.epochs.iter().all(|e| e.accesses == n as u64));
            assert_eq!(r.unserved, 0);
        }
        let [c, m, l] = [0, 1, 2].map(|i| results[i].hit_rates());
        for e in 1..4 {
            // MinIO keeps about half the dataset; LRU keeps what a random
            // reorder reaches within half a dataset of reuse distance (1/8).
            // Clairvoyant holds more samples in the same bytes.
            assert!((0.40..0.52).contains(&m[e]), "{t}");
            assert!(l[e] < 0.2, "{t}");
            assert!(c[e] > m[e] + 0.02, "{t}");
        }
        // MinIO never evicts.
        assert_eq!(results[1].evictions, 0);
    }

    #[test]
    fn two_jobs_share_the_cache() {
        let n = 3000;
        let jobs = [1, 2].map(|seed| session(n as u64, seed, 0, 1, 16, 4));
        let (results, _) = half_arena("two jobs", n, 2, Vec::from(jobs));
        for r in &results {
            assert_eq!(r.sessions.len(), 2);
            assert!(r.sessions.iter().all(|s| s.len() == 4));
            // In epoch 1 the second job already finds some of the first's reads.
            assert!(r.epochs[0].hits > 0, "{}", r.policy);
            assert_eq!(r.unserved, 0);
        }
    }

    #[test]
    fn two_ranks_of_one_job() {
        let n = 3000;
        let ranks = [0, 1].map(|rank| session(n as u64, 5, rank, 2, 16, 4));
        half_arena("two ranks", n, 3, Vec::from(ranks));
    }

    #[test]
    fn equal_sizes_one_session_clairvoyant_matches_minio() {
        // Each sample is used once per epoch, so an epoch's hits are at most
        // the samples held across the epoch boundary: with equal sizes no
        // policy beats MinIO, and Belady matches it.
        let n = 2000;
        let config = SimConfig::with_batch_reserve(
            1000 * 4096 + 8 * 4096,
            4096,
            vec![4096; n],
            vec![session(n as u64, 3, 0, 1, 8, 4)],
        );
        let results = run_all(&config);
        let t = check_order(&results);
        println!("equal sizes, one session\n{t}");
        for r in &results[..2] {
            assert_eq!(&r.hit_rates()[1..], &[0.5, 0.5, 0.5], "{t}");
        }
    }

    /// The quickstart's dataset (20,000 samples, log-normal sizes around
    /// 110 KB) with an arena of half its size: the figures in
    /// `docs/cache.md`.
    #[test]
    fn quickstart_sized_scenarios() {
        let n = 20_000;
        let sizes = lognormal_sizes(n, 110_000, 0.6, 20);
        let total: u64 = sizes.iter().sum();
        let arena = total / 2;
        let scenarios = [
            ("one job", vec![session(n as u64, 42, 0, 1, 32, 4)]),
            (
                "two jobs",
                vec![
                    session(n as u64, 42, 0, 1, 32, 4),
                    session(n as u64, 7, 0, 1, 32, 4),
                ],
            ),
            (
                "two ranks",
                vec![
                    session(n as u64, 42, 0, 2, 32, 4),
                    session(n as u64, 42, 1, 2, 32, 4),
                ],
            ),
        ];
        for (name, sessions) in scenarios {
            let config = SimConfig::with_batch_reserve(arena, 4096, sizes.clone(), sessions);
            let results = run_all(&config);
            let t = check_order(&results);
            println!(
                "{name}: n = {n}, dataset {total} bytes, arena {arena} bytes, reserve {}\n{t}",
                config.transient_reserve
            );
        }
    }

    /// Scale check: a million samples through the clairvoyant cache (run
    /// with `--ignored`; prints the time taken).
    #[test]
    #[ignore = "scale measurement (a million samples, prints the time); run by hand"]
    fn a_million_samples() {
        let n = 1_000_000;
        let sizes = lognormal_sizes(n, 1000, 0.6, 5);
        let total: u64 = sizes.iter().sum();
        let config = SimConfig::with_batch_reserve(
            total / 2,
            64,
            sizes,
            vec![session(n as u64, 1, 0, 1, 256, 2)],
        );
        for policy in PolicyKind::ALL {
            let start = std::time::Instant::now();
            let r = simulate(&config, policy).unwrap();
            println!(
                "{policy}: {:?} for {} accesses, hit rates {:?}, retained at epoch ends {:?}",
                start.elapsed(),
                2 * n,
                r.hit_rates(),
                r.epoch_end_retained
            );
        }
    }

    #[test]
    fn everything_fits_gives_full_hits_after_epoch_one() {
        let n = 500;
        let sizes = lognormal_sizes(n, 10_000, 0.5, 4);
        let total: u64 = sizes.iter().map(|s| s.next_multiple_of(4096)).sum();
        let config = SimConfig::with_batch_reserve(
            total * 2,
            4096,
            sizes,
            vec![session(n as u64, 9, 0, 1, 8, 3)],
        );
        for r in run_all(&config) {
            assert_eq!(r.hit_rates(), vec![0.0, 1.0, 1.0], "{}", r.policy);
            assert_eq!(r.evictions, 0);
        }
    }

    #[test]
    fn bad_configurations_are_errors() {
        let config = SimConfig {
            arena_size: 1 << 20,
            align: 4096,
            transient_reserve: 0,
            sample_sizes: vec![10; 5],
            sessions: vec![session(10, 1, 0, 1, 2, 1)],
        };
        assert!(matches!(
            simulate(&config, PolicyKind::Lru),
            Err(SimError::MissingSizes { .. })
        ));
        let config = SimConfig {
            arena_size: 0,
            sample_sizes: vec![10; 10],
            ..config
        };
        assert!(matches!(
            simulate(&config, PolicyKind::Lru),
            Err(SimError::Cache(CacheError::BadConfig(_)))
        ));
    }

    #[test]
    fn lognormal_sizes_are_deterministic_and_centred() {
        let a = lognormal_sizes(20_000, 110_000, 0.6, 7);
        assert_eq!(a, lognormal_sizes(20_000, 110_000, 0.6, 7));
        assert_ne!(a, lognormal_sizes(20_000, 110_000, 0.6, 8));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        assert!((100_000..120_000).contains(&median), "median {median}");
        assert!(a.iter().all(|&s| s >= 1));
    }
}
