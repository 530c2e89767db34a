//! Sources: where a dataset's samples come from.
//!
//! Every source starts from a *catalog*: the ordered list of the dataset's
//! samples with their stable ids, labels and sizes, which the planner
//! permutes and the fetcher reads. The filesystem source ([`fs`]) is what the
//! engine serves; the S3 source ([`s3`]) lists and fetches on its own and is
//! not wired into the engine yet.

pub mod fs;
pub mod s3;

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
        SourceKind::S3 => Err(CatalogError::Io {
            path: format!(
                "s3://{}/{}",
                dataset.bucket.as_deref().unwrap_or(""),
                dataset.prefix.as_deref().unwrap_or("")
            )
            .into(),
            action: "serve",
            source: std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the engine serves kind = \"fs\" datasets only so far; S3 datasets are \
                 listed and fetched by granary_agent::source::s3 (see docs/s3.md)",
            ),
        }),
    }
}
