//! Warm restart in the engine: the samples of the previous agent's index
//! put back when their dataset is ready, and the index rewritten while the
//! cache changes ([`crate::warm`] has the files and their format).

use super::{key, Engine};
use crate::warm::{DatasetIndex, Index, Record, Warm, SNAPSHOT_EVERY};
use std::time::{Duration, Instant};

/// The engine's side of a warm restart.
pub(crate) struct WarmState {
    files: Warm,
    /// Each dataset's fingerprint, once it is ready.
    fingerprints: Vec<Option<u64>>,
    last_write: Instant,
    /// The cache's change count the last index was written at.
    written: Option<u64>,
    /// The shortest time between two index writes: `SNAPSHOT_EVERY`, or
    /// ten times the last write's cost when that is longer.
    every: Duration,
}

impl WarmState {
    pub(crate) fn new(files: Warm, now: Instant) -> WarmState {
        WarmState {
            files,
            fingerprints: Vec::new(),
            last_write: now,
            written: None,
            every: SNAPSHOT_EVERY,
        }
    }
}

/// Counts of one dataset's restored samples by outcome (the order of
/// `crate::metrics::WARM_OUTCOMES`).
#[derive(Debug, Default, Clone, Copy)]
struct Outcomes([u64; 4]);

impl Engine {
    /// Dataset `d` is ready: its fingerprint is taken, and the samples the
    /// previous agent's index lists for it are checked (fingerprint, size,
    /// CRC-32C of the bytes in the arena) and put back where they are.
    pub(super) fn warm_restore(&mut self, d: usize) {
        let Some(w) = self.warm.as_mut() else {
            return;
        };
        let Some(src) = self.datasets[d].source() else {
            return;
        };
        let name = self.datasets[d].name.clone();
        let fp = crate::peers::fingerprint(&name, src);
        if w.fingerprints.len() < self.datasets.len() {
            w.fingerprints.resize(self.datasets.len(), None);
        }
        w.fingerprints[d] = Some(fp);
        let Some(pos) = w.files.pending.iter().position(|p| p.name == name) else {
            return;
        };
        let entry = w.files.pending.swap_remove(pos);
        let mut out = Outcomes::default();
        if entry.fingerprint != fp {
            out.0[2] = entry.records.len() as u64;
            tracing::warn!(
                dataset = %name,
                samples = entry.records.len(),
                "warm restart: the dataset changed since its samples were cached (fingerprint {:016x}, now {fp:016x}); its {} samples are dropped",
                entry.fingerprint,
                entry.records.len()
            );
        } else {
            for r in &entry.records {
                let size_now = (r.index < src.len()).then(|| src.meta(r.index).size);
                if size_now != Some(r.len) {
                    out.0[2] += 1;
                    continue;
                }
                let Ok(len) = usize::try_from(r.len) else {
                    out.0[2] += 1;
                    continue;
                };
                match self.arena.crc32c(r.offset, len) {
                    Ok(c) if c == r.crc32c => {}
                    _ => {
                        out.0[1] += 1;
                        continue;
                    }
                }
                if self.cache.restore(key(d, r.index), r.offset, r.len, r.crc32c) {
                    out.0[0] += 1;
                } else {
                    out.0[3] += 1;
                }
            }
            tracing::info!(
                dataset = %name,
                recovered = out.0[0],
                dropped_crc = out.0[1],
                dropped_changed = out.0[2],
                dropped_placement = out.0[3],
                "warm restart: {} of {} samples recovered",
                out.0[0],
                entry.records.len()
            );
        }
        for (c, n) in self.metrics.warm_restart.iter().zip(out.0) {
            c.inc_by(n);
        }
        self.update_gauges();
    }

    /// Rewrites the index when the cache changed and the last write is at
    /// least `every` old, or at once when `now_anyway` (the agent stops).
    pub(super) fn warm_snapshot(&mut self, now: Instant, now_anyway: bool) {
        let changes = self.cache.changes();
        let Some(w) = self.warm.as_mut() else {
            return;
        };
        if w.written == Some(changes)
            || (!now_anyway && now.saturating_duration_since(w.last_write) < w.every)
        {
            return;
        }
        let started = Instant::now();
        let mut per: Vec<Vec<Record>> = vec![Vec::new(); self.datasets.len()];
        for (k, offset, len, crc32c, _kept) in self.cache.warm_entries() {
            if let Some(v) = per.get_mut(k.dataset as usize) {
                v.push(Record {
                    index: k.index,
                    offset,
                    len,
                    crc32c,
                });
            }
        }
        let mut datasets: Vec<DatasetIndex> = Vec::new();
        for (d, records) in per.into_iter().enumerate() {
            if let Some(Some(fp)) = w.fingerprints.get(d) {
                datasets.push(DatasetIndex {
                    name: self.datasets[d].name.clone(),
                    fingerprint: *fp,
                    records,
                });
            }
        }
        // Datasets still loading keep what the previous index said of them.
        datasets.extend(w.files.pending.iter().cloned());
        let index = Index {
            arena_path: w.files.arena_path.clone(),
            arena_size: self.arena.size(),
            hugepages: self.arena.is_hugepage(),
            socket: w.files.socket.clone(),
            datasets,
        };
        match index.write(&w.files.files.index) {
            Ok(()) => w.written = Some(changes),
            Err(e) => tracing::warn!(
                "warm restart: the index {} could not be written: {e}",
                w.files.files.index.display()
            ),
        }
        w.last_write = now;
        w.every = SNAPSHOT_EVERY.max(started.elapsed() * 10);
    }
}
