//! A catalog's samples in sample-id order, with the accessors the
//! filesystem, S3 and CQL catalogs share: each catalog dereferences to its
//! [`SampleList`], and each source answers [`SampleSource`]'s `len`,
//! `meta` and `total_bytes` from it.
//!
//! [`SampleSource`]: super::SampleSource

use super::SampleMeta;

/// A catalog entry's id, label and size: what the engine knows of a sample
/// before reading it; and its version token.
pub trait EntryMeta {
    /// The entry as the engine sees it.
    fn meta(&self) -> SampleMeta;
    /// Appends the entry's version token to `out`: what a store read of the
    /// sample asks for and checks besides its length (an object's key and
    /// ETag, a file's mtime, a row's id and CRC), so that the dataset
    /// fingerprint peers must share covers it (`docs/peers.md`, "Dataset
    /// identity").
    fn version(&self, out: &mut Vec<u8>);
}

/// `Deref` of catalog type `$cat` to its `samples: SampleList<$entry>`:
/// the shared accessors (`len`, `entries`, `get`, `meta`, `total_bytes`).
macro_rules! deref_to_samples {
    ($cat:ty, $entry:ty) => {
        impl std::ops::Deref for $cat {
            type Target = $crate::source::samples::SampleList<$entry>;

            fn deref(&self) -> &Self::Target {
                &self.samples
            }
        }
    };
}
pub(crate) use deref_to_samples;

/// [`EntryMeta::meta`] of an entry with `sample_id`, `label` and `size`
/// fields.
macro_rules! meta_from_fields {
    () => {
        fn meta(&self) -> $crate::source::SampleMeta {
            $crate::source::SampleMeta {
                sample_id: self.sample_id,
                label: self.label,
                size: self.size,
            }
        }
    };
}
pub(crate) use meta_from_fields;

/// The [`SampleSource`](crate::source::SampleSource) methods a source
/// answers from its `catalog` (a [`SampleList`] behind `Deref`): `len`,
/// `meta`, `version`, `total_bytes`.
macro_rules! catalog_methods {
    () => {
        fn len(&self) -> u64 {
            self.catalog.len() as u64
        }

        fn meta(&self, index: u64) -> $crate::source::SampleMeta {
            self.catalog.meta(index)
        }

        fn version(&self, index: u64, out: &mut Vec<u8>) {
            self.catalog.version(index, out);
        }

        fn total_bytes(&self) -> u64 {
            self.catalog.total_bytes()
        }
    };
}
pub(crate) use catalog_methods;

/// The samples of one catalog, in sample-id order (entry `i` has id `i`),
/// and the sum of their sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleList<E> {
    entries: Vec<E>,
    total_bytes: u64,
}

impl<E: EntryMeta> SampleList<E> {
    /// The list of `entries`, already in sample-id order.
    pub(crate) fn new(entries: Vec<E>) -> SampleList<E> {
        let total_bytes = entries
            .iter()
            .map(|e| e.meta().size)
            .fold(0u64, u64::saturating_add);
        SampleList {
            entries,
            total_bytes,
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the list holds no sample (never true for a built catalog).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All samples, in sample-id order.
    pub fn entries(&self) -> &[E] {
        &self.entries
    }

    /// The sample with this id.
    pub fn get(&self, sample_id: u64) -> Option<&E> {
        usize::try_from(sample_id)
            .ok()
            .and_then(|i| self.entries.get(i))
    }

    /// Sample `index`'s id, label and size; `index < len()`.
    pub fn meta(&self, index: u64) -> SampleMeta {
        self.entries[index as usize].meta()
    }

    /// Appends sample `index`'s version token to `out`; `index < len()`.
    pub fn version(&self, index: u64, out: &mut Vec<u8>) {
        self.entries[index as usize].version(out);
    }

    /// Sum of all sample sizes, in bytes (saturating).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Size of the largest sample, in bytes (0 when empty).
    #[cfg(test)]
    pub(crate) fn max_size(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.meta().size)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(u64);

    impl EntryMeta for E {
        fn meta(&self) -> SampleMeta {
            SampleMeta {
                sample_id: self.0,
                label: -1,
                size: self.0 * 10,
            }
        }
        fn version(&self, out: &mut Vec<u8>) {
            out.push(self.0 as u8);
        }
    }

    #[test]
    fn accessors_answer_from_the_entries() {
        let l = SampleList::new(vec![E(0), E(1), E(2)]);
        assert_eq!(l.len(), 3);
        assert!(!l.is_empty());
        assert_eq!(l.total_bytes(), 30);
        assert_eq!(l.max_size(), 20);
        assert_eq!(l.meta(2).size, 20);
        assert_eq!(l.get(1).map(|e| e.0), Some(1));
        assert!(l.get(3).is_none());
        assert!(l.get(u64::MAX).is_none());
        let mut v = vec![9];
        l.version(2, &mut v);
        assert_eq!(v, [9, 2], "appended");
    }

    #[test]
    fn total_bytes_saturates() {
        struct Big;
        impl EntryMeta for Big {
            fn meta(&self) -> SampleMeta {
                SampleMeta {
                    sample_id: 0,
                    label: 0,
                    size: u64::MAX / 2 + 1,
                }
            }
            fn version(&self, _: &mut Vec<u8>) {}
        }
        assert_eq!(SampleList::new(vec![Big, Big]).total_bytes(), u64::MAX);
    }
}
