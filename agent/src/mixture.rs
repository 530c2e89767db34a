//! The order of a mixture (`[[mixture]]`, `docs/mixtures.md`): a dataset
//! made of other datasets, each with a fixed share of every batch.
//!
//! A mixture's samples are its sources' samples one after the other:
//! sample `offset[k] + i` is sample `i` of source `k`, where `offset[k]` is
//! the number of samples of the sources before it. Each epoch takes
//! `quota[k]` samples from source `k` (its weight's share of the epoch, or
//! its `repeat`/`choose` count), `E = Σ quota[k]` in all, and the planner
//! deals them to ranks and batches as it deals a dataset's permutation
//! ([`MixtureOrder::sequence`] takes its place). Everything is a pure
//! function of the seed and the epoch, built from the planner's own
//! [`stream_key`], [`mix64`] and [`epoch_permutation`]:
//!
//! 1. **Streams.** Source `k`'s samples of epoch `e` are the first
//!    `quota[k]` entries of its passes `p = 0, 1, …`, pass `p` being
//!    `epoch_permutation(mix64(seed ^ mix64(k · 2^32 + p + 1)), e, n[k])`:
//!    an upsampled source repeats whole shuffled passes, a downsampled one
//!    takes a different part of one pass every epoch.
//! 2. **Chunks.** The epoch is cut into the ranks' batches: `⌊E / (b·ws)⌋`
//!    global steps of `ws` batches of `b` samples, then one tail chunk of
//!    the rest. Chunk `t` takes from every source its largest-remainder
//!    quota with the remainders carried: each source first gets
//!    `⌊size · quota[k] / E⌋`, and the samples left over go, one each, to
//!    the sources furthest behind their exact share of the epoch so far
//!    (ties: the earlier source). The last chunk takes what is left, so an
//!    epoch's totals are the quotas exactly.
//! 3. **Shuffle and lay out.** A chunk's samples (source by source, each in
//!    stream order) are shuffled by
//!    `epoch_permutation(mix64(stream_key(seed, e) ^ mix64(t + 1)), e, size)`
//!    and laid out so that the planner's `DistributedSampler` striding
//!    gives rank `r` chunk `j · ws + r` as its batch `j`: position
//!    `(j·b + i)·ws + r` holds entry `i` of that chunk. The tail chunk lies
//!    as it is (the ranks' last batches share its quotas).

use crate::config::{Choose, MixtureConfig, MixtureSource};
use crate::planner::params::{PlanError, MAX_SAMPLES};
use crate::planner::permutation::{epoch_permutation, mix64, stream_key};
use std::fmt;

/// The order of one mixture over its sources' catalogs.
#[derive(Clone, PartialEq, Eq)]
pub struct MixtureOrder {
    name: String,
    /// The sources' dataset names, in order.
    names: Vec<String>,
    /// `offsets[k]`: the first mixture index of source `k`; one more entry
    /// at the end, the mixture's number of samples.
    offsets: Vec<u64>,
    /// Samples of each source per epoch.
    quotas: Vec<u64>,
    /// Samples per epoch, `Σ quotas`.
    epoch_len: u64,
}

impl fmt::Debug for MixtureOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MixtureOrder")
            .field("name", &self.name)
            .field("names", &self.names)
            .field("quotas", &self.quotas)
            .finish_non_exhaustive()
    }
}

impl MixtureOrder {
    /// The order of mixture `cfg` (validated) over sources of `sizes`
    /// samples (in `cfg.source`' order).
    ///
    /// # Errors
    ///
    /// A message when a source is empty, gets no sample per epoch, or the
    /// mixture is larger than the planner takes.
    pub fn new(cfg: &MixtureConfig, sizes: &[u64]) -> Result<MixtureOrder, String> {
        if sizes.len() != cfg.source.len() || sizes.is_empty() {
            return Err(format!(
                "mixture {:?}: {} sources, {} catalogs",
                cfg.name,
                cfg.source.len(),
                sizes.len()
            ));
        }
        let mut offsets = Vec::with_capacity(sizes.len() + 1);
        let mut total = 0u64;
        for (s, &n) in cfg.source.iter().zip(sizes) {
            if n == 0 {
                return Err(format!(
                    "mixture {:?}: dataset {:?} has no samples",
                    cfg.name, s.dataset
                ));
            }
            offsets.push(total);
            total = total.saturating_add(n);
        }
        offsets.push(total);
        if total > MAX_SAMPLES {
            return Err(format!(
                "mixture {:?}: its datasets have {total} samples; the planner takes at most {MAX_SAMPLES}",
                cfg.name
            ));
        }
        let quotas = if cfg.weighted() {
            let e = cfg.epoch_samples.unwrap_or(total);
            let weights: Vec<f64> = cfg.source.iter().map(|s| s.weight.unwrap_or(0.0)).collect();
            largest_remainder(e, &weights)
        } else {
            cfg.source
                .iter()
                .zip(sizes)
                .map(
                    |(s, &n): (&MixtureSource, &u64)| match (s.repeat, s.choose) {
                        (Some(r), _) => round(r * n as f64),
                        (None, Some(Choose::Count(c))) => c,
                        (None, Some(Choose::Fraction(f))) => round(f * n as f64),
                        (None, None) => n,
                    },
                )
                .collect()
        };
        for (s, &q) in cfg.source.iter().zip(&quotas) {
            if q == 0 {
                return Err(format!(
                    "mixture {:?}: dataset {:?} gets no sample per epoch (raise its share)",
                    cfg.name, s.dataset
                ));
            }
        }
        let epoch_len = quotas.iter().fold(0u64, |a, &q| a.saturating_add(q));
        if epoch_len > MAX_SAMPLES {
            return Err(format!(
                "mixture {:?}: {epoch_len} samples per epoch; the planner takes at most {MAX_SAMPLES}",
                cfg.name
            ));
        }
        Ok(MixtureOrder {
            name: cfg.name.clone(),
            names: cfg.source.iter().map(|s| s.dataset.clone()).collect(),
            offsets,
            quotas,
            epoch_len,
        })
    }

    /// The mixture's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples per epoch (what the planner deals to ranks).
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// The mixture's samples: its sources' added up. Sample indices are
    /// below this.
    pub fn index_space(&self) -> u64 {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Samples of each source per epoch, in the sources' order.
    pub fn quotas(&self) -> &[u64] {
        &self.quotas
    }

    /// The sources' dataset names, in order.
    pub fn sources(&self) -> &[String] {
        &self.names
    }

    /// The first mixture index of each source.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets[..self.names.len()]
    }

    /// The source of mixture sample `index` and its index there.
    pub fn member_of(&self, index: u64) -> (usize, u64) {
        let k = self
            .offsets
            .partition_point(|&o| o <= index)
            .saturating_sub(1)
            .min(self.names.len() - 1);
        (k, index - self.offsets[k])
    }

    /// Source `k`'s samples of `epoch`, as mixture indices, in stream order.
    fn stream(&self, seed: u64, epoch: u32, k: usize) -> Result<Vec<u64>, PlanError> {
        let (offset, n) = (self.offsets[k], self.offsets[k + 1] - self.offsets[k]);
        let q = self.quotas[k];
        let mut out: Vec<u64> = Vec::new();
        out.try_reserve_exact(usize::try_from(q).unwrap_or(usize::MAX))
            .map_err(|_| PlanError::OutOfMemory { num_samples: q })?;
        let mut pass = 0u64;
        while (out.len() as u64) < q {
            let sub = seed ^ mix64((((k as u64) << 32) | pass).wrapping_add(1));
            let perm = epoch_permutation(mix64(sub), epoch, n)?;
            let take = (q - out.len() as u64).min(n) as usize;
            out.extend(perm[..take].iter().map(|&i| offset + i));
            pass += 1;
        }
        Ok(out)
    }

    /// How many samples each source gives the chunk of `size` samples that
    /// ends at epoch position `end`, when `taken[k]` were taken before it;
    /// `last`: the epoch's last chunk, which takes what is left.
    pub(crate) fn chunk_counts(&self, end: u64, size: u64, last: bool, taken: &[u64]) -> Vec<u64> {
        if last {
            return self
                .quotas
                .iter()
                .zip(taken)
                .map(|(&q, &t)| q.saturating_sub(t))
                .collect();
        }
        let e = u128::from(self.epoch_len);
        let mut counts: Vec<u64> = self
            .quotas
            .iter()
            .map(|&q| (u128::from(size) * u128::from(q) / e) as u64)
            .collect();
        let mut left = size - counts.iter().sum::<u64>();
        // E × (exact share so far − what the source has), after the floors.
        let behind = |k: usize, c: &[u64]| -> i128 {
            (u128::from(end) * u128::from(self.quotas[k])) as i128
                - (u128::from(taken[k] + c[k]) * e) as i128
        };
        let mut order: Vec<usize> = (0..self.quotas.len()).collect();
        order.sort_by(|&a, &b| behind(b, &counts).cmp(&behind(a, &counts)).then(a.cmp(&b)));
        for &k in order.iter().cycle().take(order.len() * 2) {
            if left == 0 {
                break;
            }
            if taken[k] + counts[k] < self.quotas[k] {
                counts[k] += 1;
                left -= 1;
            }
        }
        counts
    }

    /// The mixture's samples of `epoch` in the order the planner deals
    /// them to `world_size` ranks in batches of `batch_size` (the module
    /// docs): `epoch_len()` mixture indices.
    ///
    /// # Errors
    ///
    /// [`PlanError::OutOfMemory`], or [`PlanError::Assignment`] naming a
    /// bug when the chunks do not add up.
    pub fn sequence(
        &self,
        seed: u64,
        epoch: u32,
        world_size: u32,
        batch_size: u32,
    ) -> Result<Vec<u64>, PlanError> {
        let e = self.epoch_len;
        let len = usize::try_from(e).map_err(|_| PlanError::TooManySamples { num_samples: e })?;
        let (bs, ws) = (u64::from(batch_size.max(1)), u64::from(world_size.max(1)));
        let streams = (0..self.names.len())
            .map(|k| self.stream(seed, epoch, k))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out: Vec<u64> = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| PlanError::OutOfMemory { num_samples: e })?;
        out.resize(len, 0);
        let step = bs.saturating_mul(ws);
        let full = (e / step) * ws;
        let tail = e % step;
        let chunks = full + u64::from(tail > 0);
        let mut taken = vec![0u64; self.names.len()];
        let mut chunk: Vec<u64> = Vec::with_capacity(bs.min(e) as usize);
        let key = stream_key(seed, epoch);
        let mut start = 0u64;
        for t in 0..chunks {
            let size = if t < full { bs } else { tail };
            let counts = self.chunk_counts(start + size, size, t + 1 == chunks, &taken);
            chunk.clear();
            for (k, &c) in counts.iter().enumerate() {
                let from = taken[k] as usize;
                let to = from + c as usize;
                let Some(part) = streams[k].get(from..to) else {
                    return Err(chunk_bug(t, &counts, &taken));
                };
                chunk.extend_from_slice(part);
                taken[k] += c;
            }
            if chunk.len() as u64 != size {
                return Err(chunk_bug(t, &counts, &taken));
            }
            let shuffle = epoch_permutation(mix64(key ^ mix64(t.wrapping_add(1))), epoch, size)?;
            for (i, &p) in shuffle.iter().enumerate() {
                let i = i as u64;
                let at = if t < full {
                    let (j, r) = (t / ws, t % ws);
                    (j * bs + i) * ws + r
                } else {
                    start + i
                };
                out[at as usize] = chunk[p as usize];
            }
            start += size;
        }
        Ok(out)
    }
}

fn chunk_bug(t: u64, counts: &[u64], taken: &[u64]) -> PlanError {
    PlanError::Assignment(format!(
        "mixture chunk {t}: counts {counts:?} after {taken:?} do not fit the quotas"
    ))
}

/// `x` rounded to the nearest whole number (halves up), as a count.
fn round(x: f64) -> u64 {
    // Validated inputs: finite, non-negative, at most 2^48 × 10^6.
    x.round() as u64
}

/// `total` divided by `weights` (positive, finite) by largest remainder:
/// each gets the floor of its exact share, the rest one each to the
/// largest fractional parts (ties: the earlier one).
fn largest_remainder(total: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| total as f64 * w / sum).collect();
    let mut out: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let given: u64 = out.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    if given <= total {
        for &k in order.iter().cycle().take((total - given) as usize) {
            out[k] += 1;
        }
    } else {
        // Rounding of very large totals only: take back from the smallest
        // remainders.
        let mut over = given - total;
        for &k in order.iter().rev().cycle() {
            if over == 0 {
                break;
            }
            if out[k] > 0 {
                out[k] -= 1;
                over -= 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
