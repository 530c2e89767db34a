//! [`SampleMap`]: per-sample values indexed by the sample's position, not
//! hashed. Sample keys are dense (a small dataset id, an index below the
//! catalog's length), so a lookup is two vector indexings.

use super::SampleKey;
use std::collections::HashMap;

/// Datasets and indices below these go in the dense tables; the rest (none
/// in practice: the engine's dataset ids count its datasets, indices stay
/// below the catalog's length) in a hash map, so that no key can make a
/// table grow without bound. So do values whose slot does not fit a `u32`
/// (none in practice either).
const DENSE_DATASETS: u32 = 1 << 10;
const DENSE_INDICES: u64 = 1 << 26;

/// A map from [`SampleKey`] to `V`: the values in a slab, found through
/// one table of slot numbers per dataset indexed by the sample's index.
/// A value keeps its slot until removed.
#[derive(Debug, Clone)]
pub(crate) struct SampleMap<V> {
    /// Per dataset, per sample index: the value's slot plus one (0: none).
    dense: Vec<Vec<u32>>,
    /// Slots of keys outside the dense tables.
    sparse: HashMap<SampleKey, usize>,
    values: slab::Slab<(SampleKey, V)>,
}

impl<V> Default for SampleMap<V> {
    fn default() -> Self {
        SampleMap {
            dense: Vec::new(),
            sparse: HashMap::new(),
            values: slab::Slab::new(),
        }
    }
}

fn is_dense(key: SampleKey) -> bool {
    key.dataset < DENSE_DATASETS && key.index < DENSE_INDICES
}

impl<V> SampleMap<V> {
    /// An empty map.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The slot of `key`'s value.
    pub(crate) fn slot(&self, key: &SampleKey) -> Option<usize> {
        if is_dense(*key) {
            let s = self
                .dense
                .get(key.dataset as usize)
                .and_then(|t| t.get(key.index as usize))
                .copied()
                .unwrap_or(0);
            if s != 0 {
                return Some(s as usize - 1);
            }
            if self.sparse.is_empty() {
                return None;
            }
        }
        self.sparse.get(key).copied()
    }

    pub(crate) fn get(&self, key: &SampleKey) -> Option<&V> {
        self.slot(key).map(|s| &self.values[s].1)
    }

    pub(crate) fn get_mut(&mut self, key: &SampleKey) -> Option<&mut V> {
        self.slot(key).map(|s| &mut self.values[s].1)
    }

    pub(crate) fn contains_key(&self, key: &SampleKey) -> bool {
        self.slot(key).is_some()
    }

    /// Sets `key`'s value; returns the previous one. The key keeps its slot
    /// when it had one.
    pub(crate) fn insert(&mut self, key: SampleKey, value: V) -> Option<V> {
        if let Some(s) = self.slot(&key) {
            return Some(std::mem::replace(&mut self.values[s].1, value));
        }
        let slot = self.values.insert((key, value));
        match u32::try_from(slot + 1) {
            Ok(s) if is_dense(key) => {
                let d = key.dataset as usize;
                if self.dense.len() <= d {
                    self.dense.resize_with(d + 1, Vec::new);
                }
                let table = &mut self.dense[d];
                let i = key.index as usize;
                if table.len() <= i {
                    // Doubling, so that filling a dataset in index order
                    // costs amortised O(1) per sample.
                    let want = (i + 1).max(table.len() * 2).min(DENSE_INDICES as usize);
                    table.resize(want, 0);
                }
                table[i] = s;
            }
            _ => {
                self.sparse.insert(key, slot);
            }
        }
        None
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, key: &SampleKey) -> Option<V> {
        let dense = if is_dense(*key) {
            self.dense
                .get_mut(key.dataset as usize)
                .and_then(|t| t.get_mut(key.index as usize))
                .map_or(0, std::mem::take)
        } else {
            0
        };
        let slot = match dense {
            0 => self.sparse.remove(key)?,
            s => s as usize - 1,
        };
        Some(self.values.remove(slot).1)
    }

    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Every key and value, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&SampleKey, &V)> {
        self.values.iter().map(|(_, (k, v))| (k, v))
    }
}

impl<'a, V> IntoIterator for &'a SampleMap<V> {
    type Item = (&'a SampleKey, &'a V);
    type IntoIter = Box<dyn Iterator<Item = (&'a SampleKey, &'a V)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(dataset: u32, index: u64) -> SampleKey {
        SampleKey { dataset, index }
    }

    #[test]
    fn behaves_like_a_hash_map() {
        let mut m = SampleMap::new();
        let mut h = HashMap::new();
        let keys = [
            k(0, 0),
            k(0, 7),
            k(3, 1),
            k(0, DENSE_INDICES),
            k(DENSE_DATASETS, 2),
            k(u32::MAX, u64::MAX),
            k(1, 100_000),
        ];
        for (n, &key) in keys.iter().cycle().take(40).enumerate() {
            if n % 3 == 2 {
                assert_eq!(m.remove(&key), h.remove(&key), "remove {key}");
            } else {
                assert_eq!(m.insert(key, n), h.insert(key, n), "insert {key}");
            }
            assert_eq!(m.len(), h.len());
            for key in keys {
                assert_eq!(m.get(&key), h.get(&key), "get {key}");
                assert_eq!(m.contains_key(&key), h.contains_key(&key));
            }
        }
        let mut got: Vec<_> = m.iter().map(|(k, v)| (*k, *v)).collect();
        let mut want: Vec<_> = h.iter().map(|(k, v)| (*k, *v)).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        if let Some(v) = m.get_mut(&k(0, 7)) {
            *v = 1000;
        }
        assert_eq!(m.get(&k(0, 7)).copied().unwrap_or(1000), 1000);
    }

    #[test]
    fn a_value_keeps_its_slot_until_removed() {
        let mut m = SampleMap::new();
        m.insert(k(0, 5), 'a');
        m.insert(k(1, 5), 'b');
        let s = m.slot(&k(1, 5)).unwrap();
        m.insert(k(1, 5), 'c');
        assert_eq!(m.slot(&k(1, 5)), Some(s));
        assert_eq!(m.get(&k(1, 5)), Some(&'c'));
        assert_eq!(m.remove(&k(1, 5)), Some('c'));
        assert_eq!(m.slot(&k(1, 5)), None);
        assert_eq!(m.remove(&k(1, 5)), None);
        assert_eq!(m.remove(&k(9, 9)), None);
        assert!(!m.is_empty());
        m.remove(&k(0, 5));
        assert!(m.is_empty());
    }
}
