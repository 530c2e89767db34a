//! A dataset's provenance: what a saved session state records of the
//! catalog it was taken against, and how the agent names what changed.
//!
//! Two parts ([`granary_shm::handshake::CatalogId`]):
//!
//! * the **fingerprint**, the dataset fingerprint peers agree on
//!   (`crate::peers::fingerprint`): SHA-256 over every sample's id, size
//!   and version token (an object's ETag, a file's mtime, a row's CRC-32C),
//!   cut to 64 bits. Equal fingerprints mean the same catalog.
//! * a **difference sketch**: an invertible Bloom lookup table of
//!   [`CELLS`] cells over the set of `(hash(name), hash(size, token))`
//!   pairs, one per sample. Subtracting the sketch a state carries from the
//!   current catalog's leaves only the samples that differ; when they are
//!   few (up to about a dozen changed objects) the table peels into them
//!   and the agent names each one (`describe`): replaced (same name, other
//!   size or version), added, or gone. With more, it says how the
//!   fingerprints differ and that more objects changed than it can name.
//!
//! The sketch is 1,764 bytes whatever the dataset's size; its hash is
//! FNV-1a 64 followed by SplitMix64's finalizer (stable across versions,
//! not meant to resist an adversary: the fingerprint is what decides
//! whether a catalog is the same).
//!
//! Layout of the sketch: [`CELLS`] cells of 28 bytes, each `i32 count`,
//! `u64 key_xor`, `u64 value_xor`, `u64 check_xor`, little-endian. A pair
//! goes into one cell of each of three sub-tables of [`SUBTABLE`] cells,
//! chosen by the hash of the whole pair.

use crate::planner::mix64;
use crate::source::SampleSource;
use granary_shm::handshake::CatalogId;
use std::collections::HashMap;

/// Cells of one sub-table.
pub const SUBTABLE: usize = 21;
/// Cells of the sketch: three sub-tables.
pub const CELLS: usize = 3 * SUBTABLE;
/// Bytes of one cell.
const CELL_BYTES: usize = 4 + 8 + 8 + 8;
/// Bytes of a sketch.
pub const SKETCH_BYTES: usize = CELLS * CELL_BYTES;
const _: () = assert!(SKETCH_BYTES <= granary_shm::handshake::MAX_SKETCH);
/// At most this many changed samples are named in one message.
const NAMED: usize = 8;

/// FNV-1a 64 of `bytes`, finalized with SplitMix64's mixer.
fn hash(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// One pair's check value.
fn check(key: u64, value: u64) -> u64 {
    mix64(key ^ mix64(value ^ 0x7072_6f76_656e_616e))
}

/// The three cells of the pair `(key, value)`, one per sub-table (by the
/// whole pair, so that two versions of one sample land apart).
fn cells_of(key: u64, value: u64) -> [usize; 3] {
    let pair = check(key, value);
    let mut out = [0; 3];
    for (t, slot) in out.iter_mut().enumerate() {
        let h = mix64(pair.wrapping_add((t as u64 + 1).wrapping_mul(granary_base::hash::GAMMA)));
        *slot = t * SUBTABLE + (h % SUBTABLE as u64) as usize;
    }
    out
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cell {
    count: i32,
    key: u64,
    value: u64,
    check: u64,
}

impl Cell {
    fn toggle(&mut self, sign: i32, key: u64, value: u64) {
        self.count = self.count.wrapping_add(sign);
        self.key ^= key;
        self.value ^= value;
        self.check ^= check(key, value);
    }

    fn is_pure(&self) -> bool {
        (self.count == 1 || self.count == -1) && self.check == check(self.key, self.value)
    }

    fn is_empty(&self) -> bool {
        *self == Cell::default()
    }
}

/// The difference sketch of a set of `(key, value)` pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sketch {
    cells: Vec<Cell>,
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch {
            cells: vec![Cell::default(); CELLS],
        }
    }
}

/// One sample's pair: the hash of its name, the hash of its size and
/// version token.
pub fn sample_pair(name: &str, size: u64, token: &[u8]) -> (u64, u64) {
    let key = hash(1, name.as_bytes());
    let mut v = Vec::with_capacity(8 + token.len());
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(token);
    (key, hash(2, &v))
}

impl Sketch {
    /// Adds a pair.
    pub fn insert(&mut self, key: u64, value: u64) {
        for c in cells_of(key, value) {
            self.cells[c].toggle(1, key, value);
        }
    }

    /// The sketch's bytes (the module's layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SKETCH_BYTES);
        for c in &self.cells {
            out.extend_from_slice(&c.count.to_le_bytes());
            out.extend_from_slice(&c.key.to_le_bytes());
            out.extend_from_slice(&c.value.to_le_bytes());
            out.extend_from_slice(&c.check.to_le_bytes());
        }
        out
    }

    /// A sketch from its bytes; `None` unless exactly [`SKETCH_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Sketch> {
        if bytes.len() != SKETCH_BYTES {
            return None;
        }
        let u64_at = |b: &[u8], at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let cells = bytes
            .chunks_exact(CELL_BYTES)
            .map(|b| Cell {
                count: i32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                key: u64_at(b, 4),
                value: u64_at(b, 12),
                check: u64_at(b, 20),
            })
            .collect();
        Some(Sketch { cells })
    }

    /// The pairs in `self` and not in `other` (`+1`) and in `other` and not
    /// in `self` (`-1`), or `None` when there are too many to peel.
    pub fn difference(&self, other: &Sketch) -> Option<Vec<(i32, u64, u64)>> {
        let mut d: Vec<Cell> = self
            .cells
            .iter()
            .zip(&other.cells)
            .map(|(a, b)| Cell {
                count: a.count.wrapping_sub(b.count),
                key: a.key ^ b.key,
                value: a.value ^ b.value,
                check: a.check ^ b.check,
            })
            .collect();
        let mut out = Vec::new();
        while let Some(i) = d.iter().position(Cell::is_pure) {
            let Cell {
                count, key, value, ..
            } = d[i];
            out.push((count, key, value));
            for c in cells_of(key, value) {
                d[c].toggle(-count, key, value);
            }
        }
        d.iter().all(Cell::is_empty).then_some(out)
    }
}

/// The catalog id of dataset `name` served from `src`: its fingerprint and
/// difference sketch. Reads the whole catalog (once per dataset load).
pub fn catalog_id(name: &str, src: &dyn SampleSource) -> CatalogId {
    let mut sketch = Sketch::default();
    let mut token = Vec::new();
    for i in 0..src.len() {
        token.clear();
        src.version(i, &mut token);
        let (k, v) = sample_pair(&src.describe(i), src.meta(i).size, &token);
        sketch.insert(k, v);
    }
    CatalogId {
        fingerprint: crate::peers::fingerprint(name, src),
        sketch: sketch.to_bytes(),
    }
}

/// Why a session state's catalog `saved` is not dataset `name`'s catalog
/// `now` (served from `src`), naming the samples that changed when the
/// sketches allow; `None` when they are the same catalog.
pub fn mismatch(
    name: &str,
    saved: &CatalogId,
    now: &CatalogId,
    src: &dyn SampleSource,
) -> Option<String> {
    if saved.fingerprint == now.fingerprint {
        return None;
    }
    let head = format!(
        "dataset {name:?} changed since the session state was saved (catalog fingerprint {:016x}, now {:016x})",
        saved.fingerprint, now.fingerprint
    );
    let diff = match (
        Sketch::from_bytes(&saved.sketch),
        Sketch::from_bytes(&now.sketch),
    ) {
        (Some(old), Some(new)) => new.difference(&old),
        _ => None,
    };
    let Some(diff) = diff.filter(|d| !d.is_empty()) else {
        return Some(format!(
            "{head}: more objects changed than the state's sketch can name"
        ));
    };
    // Name the keys found in the current catalog.
    let mut wanted: HashMap<u64, Option<String>> =
        diff.iter().map(|&(_, k, _)| (k, None)).collect();
    let mut token = Vec::new();
    for i in 0..src.len() {
        let described = src.describe(i);
        token.clear();
        src.version(i, &mut token);
        let (k, _) = sample_pair(&described, src.meta(i).size, &token);
        if let Some(slot) = wanted.get_mut(&k) {
            *slot = Some(described);
        }
    }
    let mut replaced = Vec::new();
    let mut added = Vec::new();
    let mut gone = 0usize;
    let keys_now: Vec<u64> = diff.iter().filter(|e| e.0 > 0).map(|e| e.1).collect();
    let keys_then: Vec<u64> = diff.iter().filter(|e| e.0 < 0).map(|e| e.1).collect();
    for k in &keys_now {
        let name = wanted
            .get(k)
            .cloned()
            .flatten()
            .unwrap_or_else(|| format!("{k:016x}"));
        if keys_then.contains(k) {
            replaced.push(name);
        } else {
            added.push(name);
        }
    }
    for k in &keys_then {
        if !keys_now.contains(k) {
            gone += 1;
        }
    }
    let mut parts = Vec::new();
    let list = |v: &mut Vec<String>| {
        v.sort();
        let more = v.len().saturating_sub(NAMED);
        let mut s = v.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        s
    };
    if !replaced.is_empty() {
        parts.push(format!("replaced: {}", list(&mut replaced)));
    }
    if !added.is_empty() {
        parts.push(format!("added: {}", list(&mut added)));
    }
    if gone > 0 {
        parts.push(format!("{gone} no longer in the catalog"));
    }
    Some(format!("{head}: {}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sketch_of(pairs: &[(u64, u64)]) -> Sketch {
        let mut s = Sketch::default();
        for &(k, v) in pairs {
            s.insert(k, v);
        }
        s
    }

    #[test]
    fn bytes_round_trip_and_have_the_documented_size() {
        let s = sketch_of(&[(1, 2), (3, 4)]);
        let b = s.to_bytes();
        assert_eq!(b.len(), SKETCH_BYTES);
        assert_eq!(SKETCH_BYTES, 1764);
        assert_eq!(Sketch::from_bytes(&b), Some(s));
        assert_eq!(Sketch::from_bytes(&b[1..]), None);
    }

    #[test]
    fn equal_sets_have_no_difference() {
        let pairs: Vec<(u64, u64)> = (0..10_000)
            .map(|i| sample_pair(&format!("f{i}"), i, b"t"))
            .collect();
        let a = sketch_of(&pairs);
        let mut rev = pairs.clone();
        rev.reverse();
        assert_eq!(a.difference(&sketch_of(&rev)), Some(vec![]));
    }

    #[test]
    fn a_few_changes_among_many_are_peeled() {
        let n = 100_000u64;
        let old: Vec<(u64, u64)> = (0..n)
            .map(|i| sample_pair(&format!("f{i}"), 100, b"e1"))
            .collect();
        let mut new = old.clone();
        // Replace 5, add 2, remove 1.
        for i in [7u64, 500, 9_999, 50_000, 99_999] {
            new[i as usize] = sample_pair(&format!("f{i}"), 100, b"e2");
        }
        new.push(sample_pair("extra-a", 1, b""));
        new.push(sample_pair("extra-b", 1, b""));
        new.remove(1234);
        let d = sketch_of(&new).difference(&sketch_of(&old)).expect("peels");
        let plus = d.iter().filter(|e| e.0 == 1).count();
        let minus = d.iter().filter(|e| e.0 == -1).count();
        assert_eq!((plus, minus), (7, 6), "{d:?}");
        let (k7, _) = sample_pair("f7", 100, b"e2");
        assert!(d.iter().any(|e| e.0 == 1 && e.1 == k7));
        assert!(d.iter().any(|e| e.0 == -1 && e.1 == k7));
    }

    #[test]
    fn too_many_changes_are_reported_as_such() {
        let old: Vec<(u64, u64)> = (0..1000).map(|i| (i, 1)).collect();
        let new: Vec<(u64, u64)> = (0..1000).map(|i| (i, 2)).collect();
        assert_eq!(sketch_of(&new).difference(&sketch_of(&old)), None);
    }
}
