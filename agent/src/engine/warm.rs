//! Warm restart in the engine: the samples of the previous agent's index
//! put back when their dataset is ready, and the index rewritten while the
//! cache changes ([`crate::warm`] has the files and their format).

use super::{key, Engine};
use crate::cache::SampleKey;
use crate::warm::{DatasetIndex, Index, JournalRecord, Record, Warm, SNAPSHOT_EVERY};
use std::collections::HashMap;
use std::io::Write;
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
    /// The journal, opened for appending (`None` when it cannot be).
    journal: Option<std::fs::File>,
    /// Samples taken from the cache's journal, and their bytes.
    taken: Vec<(SampleKey, u64, u64, u32)>,
    bytes: Vec<u8>,
}

impl WarmState {
    pub(crate) fn new(files: Warm, now: Instant) -> WarmState {
        use std::os::unix::fs::OpenOptionsExt;
        let journal = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&files.files.journal)
            .map_err(|e| {
                tracing::warn!(
                    "warm restart: the journal {} cannot be opened ({e}): samples read after the last index are not remembered",
                    files.files.journal.display()
                )
            })
            .ok();
        WarmState {
            files,
            fingerprints: Vec::new(),
            // The first turn writes the index.
            last_write: now.checked_sub(SNAPSHOT_EVERY).unwrap_or(now),
            written: None,
            every: SNAPSHOT_EVERY,
            journal,
            taken: Vec::new(),
            bytes: Vec::new(),
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
        // The candidates for each sample, the most recent first: the
        // journal from its end, then the index.
        let mut candidates: Vec<(Record, bool)> = Vec::new();
        let (journal, rest): (Vec<JournalRecord>, Vec<JournalRecord>) =
            std::mem::take(&mut w.files.pending_journal)
                .into_iter()
                .partition(|j| j.fingerprint == fp);
        w.files.pending_journal = rest;
        candidates.extend(journal.iter().rev().map(|j| (j.record, true)));
        let mut changed_dataset = 0u64;
        if let Some(pos) = w.files.pending.iter().position(|p| p.name == name) {
            let entry = w.files.pending.swap_remove(pos);
            if entry.fingerprint == fp {
                candidates.extend(entry.records.iter().map(|r| (*r, false)));
            } else {
                changed_dataset = entry.records.len() as u64;
                tracing::warn!(
                    dataset = %name,
                    samples = entry.records.len(),
                    "warm restart: the dataset changed since its samples were cached (fingerprint {:016x}, now {fp:016x}); its {} samples are dropped",
                    entry.fingerprint,
                    entry.records.len()
                );
            }
        }
        if candidates.is_empty() && changed_dataset == 0 {
            return;
        }
        let mut out = Outcomes::default();
        out.0[2] = changed_dataset;
        // Per sample: recovered by the first candidate that checks out, or
        // dropped for the reason of the most recent one.
        let mut outcome: HashMap<u64, usize> = HashMap::new();
        for (r, _from_journal) in &candidates {
            if outcome.get(&r.index) == Some(&0) {
                continue;
            }
            let o = self.warm_check(d, r);
            outcome
                .entry(r.index)
                .and_modify(|e| {
                    if o == 0 {
                        *e = 0;
                    }
                })
                .or_insert(o);
        }
        for o in outcome.values() {
            out.0[*o] += 1;
        }
        tracing::info!(
            dataset = %name,
            recovered = out.0[0],
            dropped_crc = out.0[1],
            dropped_changed = out.0[2],
            dropped_placement = out.0[3],
            "warm restart: {} samples recovered, {} dropped",
            out.0[0],
            out.0[1] + out.0[2] + out.0[3]
        );
        for (c, n) in self.metrics.warm_restart.iter().zip(out.0) {
            c.inc_by(n);
        }
        self.update_gauges();
    }

    /// Checks one candidate of dataset `d` and puts it back: 0 recovered,
    /// 1 its bytes fail their CRC-32C, 2 the sample is no longer of that
    /// size (or no longer exists), 3 its extent is taken or outside the
    /// cache's areas (the outcomes' order in `WARM_OUTCOMES`).
    fn warm_check(&mut self, d: usize, r: &Record) -> usize {
        let Some(src) = self.datasets[d].source() else {
            return 2;
        };
        let size_now = (r.index < src.len()).then(|| src.meta(r.index).size);
        if size_now != Some(r.len) {
            return 2;
        }
        let Ok(len) = usize::try_from(r.len) else {
            return 2;
        };
        match self.arena.crc32c(r.offset, len) {
            Ok(c) if c == r.crc32c => {}
            _ => return 1,
        }
        if self
            .cache
            .restore(key(d, r.index), r.offset, r.len, r.crc32c)
        {
            0
        } else {
            3
        }
    }

    /// Appends to the journal the samples that became ready this turn.
    pub(super) fn warm_journal(&mut self) {
        let Some(w) = self.warm.as_mut() else {
            return;
        };
        self.cache.take_journal(&mut w.taken);
        if w.taken.is_empty() {
            return;
        }
        w.bytes.clear();
        for (k, offset, len, crc32c) in w.taken.drain(..) {
            if let Some(Some(fp)) = w.fingerprints.get(k.dataset as usize) {
                JournalRecord {
                    fingerprint: *fp,
                    record: Record {
                        index: k.index,
                        offset,
                        len,
                        crc32c,
                    },
                }
                .encode(&mut w.bytes);
            }
        }
        if let Some(f) = w.journal.as_mut() {
            if let Err(e) = f.write_all(&w.bytes) {
                tracing::warn!("warm restart: the journal could not be appended to: {e}");
                w.journal = None;
            }
        }
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
            Ok(()) => {
                w.written = Some(changes);
                // The index holds what the journal said; the journal keeps
                // only the records of datasets still loading.
                if let Some(f) = w.journal.as_mut() {
                    w.bytes.clear();
                    for j in &w.files.pending_journal {
                        j.encode(&mut w.bytes);
                    }
                    if let Err(e) = f.set_len(0).and_then(|()| f.write_all(&w.bytes)) {
                        tracing::warn!("warm restart: the journal could not be cut: {e}");
                        w.journal = None;
                    }
                }
            }
            Err(e) => tracing::warn!(
                "warm restart: the index {} could not be written: {e}",
                w.files.files.index.display()
            ),
        }
        w.last_write = now;
        w.every = SNAPSHOT_EVERY.max(started.elapsed() * 10);
    }
}
