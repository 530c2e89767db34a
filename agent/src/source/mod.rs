//! Sources: where a dataset's samples come from.
//!
//! Every source starts from a *catalog*: the ordered list of the dataset's
//! samples with their stable ids, labels and sizes, which the planner
//! permutes and the fetcher reads. Only the filesystem source ([`fs`]) exists
//! so far.

pub mod fs;

pub use fs::{Catalog, CatalogEntry, CatalogError};

use crate::config::{DatasetConfig, DatasetLocation, SourceKind};

/// Builds the catalog of a configured dataset: a directory tree
/// ([`Catalog::from_dir`]) or a manifest ([`Catalog::from_manifest`]).
pub fn open_catalog(dataset: &DatasetConfig) -> Result<Catalog, CatalogError> {
    match dataset.kind {
        SourceKind::Fs => match dataset.location() {
            Some(DatasetLocation::Root(root)) => Catalog::from_dir(root),
            Some(DatasetLocation::Manifest(manifest)) => Catalog::from_manifest(manifest),
            None => Err(CatalogError::NoLocation {
                dataset: dataset.name.clone(),
            }),
        },
    }
}
