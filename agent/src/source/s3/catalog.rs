//! The catalog of an S3 dataset: which objects (or byte ranges of objects)
//! are its samples, in which order, with which labels and sizes.
//!
//! **Listing** (`S3Catalog::list`). Every object below `prefix` (taken as
//! a folder: `train` lists `train/…`; the empty prefix lists the bucket) is
//! a sample, with the rules of the filesystem tree
//! ([`crate::source::Catalog::from_dir`]) applied to the key below the
//! prefix: the first component names the class, classes get labels `0..k-1`
//! in the byte order of their names, objects directly under the prefix get
//! label `-1`, keys with a component starting with `.` are skipped, and
//! samples are ordered by label (unlabelled first), then by key compared
//! component by component in byte order. The sample id is the position in
//! that order; a tree uploaded by `granary ingest` therefore gets the same
//! ids, labels and sizes as the folder it came from. (A class folder without
//! files has no object, so it takes no label here, where the filesystem
//! catalog would give it one.) Sizes come from the listing.
//!
//! **Manifest** (`S3Catalog::from_manifest_object`,
//! `S3Catalog::from_manifest_file`). One sample per line, fields separated
//! by tabs: `key<TAB>label` (the whole object) or
//! `key<TAB>label<TAB>offset<TAB>length` (`length` bytes at `offset` of the
//! object, fetched with a ranged GET). Blank lines and lines starting with
//! `#` are skipped; a trailing `\r` is ignored. Keys in a manifest object
//! are relative to the manifest's folder unless they start with `/` (then
//! from the bucket root); keys in a local manifest file are from the bucket
//! root. The sample id is the position among the sample lines. Sizes of
//! whole-object samples come from one listing of the keys' common folder,
//! and a HEAD request for any key the listing did not show.

use super::{classify, once, Bucket, S3Error};
use crate::source::samples::{deref_to_samples, meta_from_fields, EntryMeta, SampleList};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One sample of an S3 dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Entry {
    /// Stable id: the sample's position in the catalog.
    pub sample_id: u64,
    /// The object holding the sample.
    pub key: ObjectPath,
    /// Class label (`-1`: none).
    pub label: i32,
    /// Where the sample starts in the object.
    pub offset: u64,
    /// Sample length in bytes.
    pub size: u64,
    /// Whether the sample is the whole object (a plain GET that must
    /// return exactly `size` bytes) rather than a range of it.
    pub whole_object: bool,
    /// The object's ETag when it was catalogued (from the listing or a
    /// HEAD), if the store gave one: every GET must find the same version
    /// (`If-Match`, and the ETag of the response compared).
    pub etag: Option<Arc<str>>,
}

/// The ordered list of an S3 dataset's samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Catalog {
    bucket: Bucket,
    samples: SampleList<S3Entry>,
    class_names: Vec<String>,
}

deref_to_samples!(S3Catalog, S3Entry);

impl EntryMeta for S3Entry {
    meta_from_fields!();

    /// What the GET asks for: the key's length (u32, little-endian) and
    /// bytes, the offset (u64, little-endian), then the ETag it must match
    /// (`If-Match`) as the store gave it, quotes included; nothing when
    /// the store gave none. The bucket and endpoint are left out.
    fn version(&self, out: &mut Vec<u8>) {
        let key = self.key.as_ref().as_bytes();
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&self.offset.to_le_bytes());
        if let Some(etag) = &self.etag {
            out.extend_from_slice(etag.as_bytes());
        }
    }
}

/// Lists every object below `prefix` (as a folder).
async fn list_all(
    store: &dyn ObjectStore,
    bucket: &Bucket,
    prefix: &str,
) -> Result<Vec<(ObjectPath, u64, Option<Arc<str>>)>, S3Error> {
    let folder = ObjectPath::from(prefix);
    let arg = (!prefix.is_empty()).then_some(&folder);
    once(|| async {
        let mut out = Vec::new();
        let mut stream = store.list(arg);
        while let Some(meta) = stream.next().await {
            let meta = meta?;
            out.push((meta.location, meta.size, meta.e_tag.map(Arc::from)));
        }
        Ok(out)
    })
    .await
    .map_err(|(source, _)| S3Error::Request {
        what: format!("list {bucket}/{prefix}"),
        retryable: classify(&source).retryable,
        source,
    })
}

/// An object's size and ETag.
type Stamp = (u64, Option<Arc<str>>);

/// Compares two keys component by component, in byte order.
fn cmp_components(a: &str, b: &str) -> Ordering {
    a.split('/').cmp(b.split('/'))
}

impl S3Catalog {
    /// Lists `prefix` in `bucket` (see the module docs for the rules).
    pub(crate) async fn list(
        store: &dyn ObjectStore,
        bucket: &Bucket,
        prefix: &str,
    ) -> Result<S3Catalog, S3Error> {
        let prefix = prefix.trim_matches('/');
        let objects = list_all(store, bucket, prefix).await?;
        let strip = if prefix.is_empty() {
            0
        } else {
            prefix.len() + 1
        };
        // (label-to-be, relative key, key, size and ETag); label -1 or a
        // class name.
        type Row = (Option<String>, String, ObjectPath, Stamp);
        let mut rows: Vec<Row> = Vec::new();
        for (key, size, etag) in objects {
            let Some(rel) = key.as_ref().get(strip..) else {
                continue;
            };
            if rel.is_empty() || rel.split('/').any(|c| c.is_empty() || c.starts_with('.')) {
                continue;
            }
            let class = rel.split_once('/').map(|(c, _)| c.to_owned());
            rows.push((class, rel.to_owned(), key, (size, etag)));
        }
        let mut class_names: Vec<String> = rows.iter().filter_map(|r| r.0.clone()).collect();
        class_names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        class_names.dedup();
        if i32::try_from(class_names.len()).is_err() {
            return Err(S3Error::Settings(format!(
                "{bucket}/{prefix}: more class folders than 32-bit labels"
            )));
        }
        let label_of = |c: &Option<String>| -> i32 {
            match c {
                None => -1,
                Some(name) => class_names
                    .binary_search_by(|n| n.as_bytes().cmp(name.as_bytes()))
                    .map_or(-1, |i| i as i32),
            }
        };
        let mut labelled: Vec<(i32, String, ObjectPath, Stamp)> = rows
            .into_iter()
            .map(|(c, rel, key, size)| (label_of(&c), rel, key, size))
            .collect();
        labelled.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| cmp_components(&a.1, &b.1)));
        let entries = labelled
            .into_iter()
            .enumerate()
            .map(|(i, (label, _, key, (size, etag)))| S3Entry {
                sample_id: i as u64,
                key,
                label,
                offset: 0,
                size,
                whole_object: true,
                etag,
            })
            .collect();
        Self::finish(bucket, entries, class_names, &format!("{bucket}/{prefix}"))
    }

    /// Reads a manifest object from the bucket and catalogs what it lists.
    pub(crate) async fn from_manifest_object(
        store: &dyn ObjectStore,
        bucket: &Bucket,
        manifest_key: &str,
    ) -> Result<S3Catalog, S3Error> {
        let manifest_key = manifest_key.trim_start_matches('/');
        let name = format!("{bucket}/{manifest_key}");
        let path = ObjectPath::from(manifest_key);
        let text = once(|| async {
            store
                .get_opts(&path, GetOptions::default())
                .await?
                .bytes()
                .await
        })
        .await
        .map_err(|(source, _)| S3Error::Request {
            what: format!("read manifest {name}"),
            retryable: classify(&source).retryable,
            source,
        })?;
        let base = manifest_key.rsplit_once('/').map_or("", |(d, _)| d);
        Self::from_manifest_text(store, bucket, &name, &text, base).await
    }

    /// Reads a manifest from a local file and catalogs what it lists (keys
    /// from the bucket root).
    pub(crate) async fn from_manifest_file(
        store: &dyn ObjectStore,
        bucket: &Bucket,
        file: &Path,
    ) -> Result<S3Catalog, S3Error> {
        let text = std::fs::read(file).map_err(|source| S3Error::Io {
            what: format!("read manifest {}", file.display()),
            source,
        })?;
        let name = file.display().to_string();
        Self::from_manifest_text(store, bucket, &name, &text, "").await
    }

    /// Parses manifest `text` (named `name` in errors; relative keys joined
    /// to `base`) and catalogs it.
    pub(crate) async fn from_manifest_text(
        store: &dyn ObjectStore,
        bucket: &Bucket,
        name: &str,
        text: &[u8],
        base: &str,
    ) -> Result<S3Catalog, S3Error> {
        let lines = parse_manifest(name, text, base)?;
        // Sizes and ETags of whole-object samples: one listing of their
        // common folder, then HEAD for the rest. A ranged sample takes its
        // object's ETag from that listing when it covered the object (else
        // it has none: ranges never trigger a listing of their own).
        let mut sizes: HashMap<String, Stamp> = HashMap::new();
        let wanted: Vec<&str> = lines
            .iter()
            .filter(|l| l.range.is_none())
            .map(|l| l.key.as_str())
            .collect();
        if let Some(first) = wanted.first() {
            let mut common = first.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
            for k in &wanted[1..] {
                while !common.is_empty() && !k.starts_with(&format!("{common}/")) {
                    common = common.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
                }
            }
            for (key, size, etag) in list_all(store, bucket, &common).await? {
                sizes.insert(key.as_ref().to_owned(), (size, etag));
            }
        }
        let mut entries = Vec::with_capacity(lines.len());
        for (i, l) in lines.into_iter().enumerate() {
            let key = ObjectPath::parse(&l.key).map_err(|e| S3Error::Manifest {
                manifest: name.to_owned(),
                line: l.line,
                reason: format!("key {:?} is not usable: {e}", l.key),
            })?;
            let (offset, size, whole_object, etag) = match l.range {
                Some((offset, len)) => {
                    let etag = sizes.get(key.as_ref()).and_then(|s| s.1.clone());
                    (offset, len, false, etag)
                }
                None => match sizes.get(key.as_ref()) {
                    Some((size, etag)) => (0, *size, true, etag.clone()),
                    None => {
                        let head = once(|| async {
                            let opts = GetOptions {
                                head: true,
                                ..GetOptions::default()
                            };
                            Ok(store.get_opts(&key, opts).await?.meta)
                        })
                        .await;
                        match head {
                            Ok(meta) => {
                                let etag: Option<Arc<str>> = meta.e_tag.map(Arc::from);
                                sizes.insert(l.key.clone(), (meta.size, etag.clone()));
                                (0, meta.size, true, etag)
                            }
                            Err((e, _)) => {
                                return Err(S3Error::Manifest {
                                    manifest: name.to_owned(),
                                    line: l.line,
                                    reason: format!(
                                        "{bucket}/{}: {}: {e}",
                                        l.key,
                                        classify(&e).what
                                    ),
                                })
                            }
                        }
                    }
                },
            };
            entries.push(S3Entry {
                sample_id: i as u64,
                key,
                label: l.label,
                offset,
                size,
                whole_object,
                etag,
            });
        }
        Self::finish(bucket, entries, Vec::new(), name)
    }

    pub(crate) fn finish(
        bucket: &Bucket,
        entries: Vec<S3Entry>,
        class_names: Vec<String>,
        origin: &str,
    ) -> Result<S3Catalog, S3Error> {
        if entries.is_empty() {
            return Err(S3Error::Empty {
                location: origin.to_owned(),
            });
        }
        Ok(S3Catalog {
            bucket: bucket.clone(),
            samples: SampleList::new(entries),
            class_names,
        })
    }

    /// The bucket (or container) name.
    pub fn bucket(&self) -> &str {
        &self.bucket.name
    }

    /// The bucket and its store.
    pub fn location(&self) -> &Bucket {
        &self.bucket
    }

    /// Class folder names, indexed by label (listings only).
    pub fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// The fetch request for sample `sample_id` into `dest`, tagged `tag`;
    /// `None` when the id is out of range or the sample is larger than a
    /// request can carry (4 GiB).
    pub fn request(
        &self,
        sample_id: u64,
        tag: u64,
        dest: granary_shm::arena::ArenaSlice,
    ) -> Option<super::FetchRequest> {
        let e = self.get(sample_id)?;
        let len = u32::try_from(e.size).ok()?;
        Some(super::FetchRequest {
            tag,
            key: e.key.clone(),
            offset: e.offset,
            len,
            whole_object: e.whole_object,
            etag: e.etag.clone(),
            dest,
        })
    }
}

/// One parsed manifest line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ManifestLine {
    pub line: usize,
    pub key: String,
    pub label: i32,
    pub range: Option<(u64, u64)>,
}

/// Parses manifest `text`; relative keys are joined to `base`.
pub(crate) fn parse_manifest(
    name: &str,
    text: &[u8],
    base: &str,
) -> Result<Vec<ManifestLine>, S3Error> {
    let bad = |line: usize, reason: String| S3Error::Manifest {
        manifest: name.to_owned(),
        line,
        reason,
    };
    let text = std::str::from_utf8(text).map_err(|e| {
        let line = 1 + text[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        bad(line, "not UTF-8 text (S3 keys are UTF-8)".to_owned())
    })?;
    let base = base.trim_matches('/');
    let mut out = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line_no = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != 2 && fields.len() != 4 {
            return Err(bad(
                line_no,
                format!(
                    "expected `key<TAB>label` or `key<TAB>label<TAB>offset<TAB>length`, found {} field(s) in {line:?}",
                    fields.len()
                ),
            ));
        }
        let key = fields[0];
        if key.is_empty() || key == "/" {
            return Err(bad(line_no, "empty key before the tab".to_owned()));
        }
        let label = fields[1].trim().parse::<i32>().map_err(|_| {
            bad(
                line_no,
                format!("label {:?} is not a 32-bit integer", fields[1]),
            )
        })?;
        let range = if fields.len() == 4 {
            let num = |s: &str, what: &str| {
                s.trim()
                    .parse::<u64>()
                    .map_err(|_| bad(line_no, format!("{what} {s:?} is not a byte count")))
            };
            let offset = num(fields[2], "offset")?;
            let len = num(fields[3], "length")?;
            if len > u64::from(u32::MAX) {
                return Err(bad(line_no, format!("length {len} is above 4 GiB")));
            }
            if offset.checked_add(len).is_none() {
                return Err(bad(line_no, "offset + length overflows".to_owned()));
            }
            Some((offset, len))
        } else {
            None
        };
        let key = match key.strip_prefix('/') {
            Some(abs) => abs.to_owned(),
            None if base.is_empty() => key.to_owned(),
            None => format!("{base}/{key}"),
        };
        out.push(ManifestLine {
            line: line_no,
            key,
            label,
            range,
        });
    }
    Ok(out)
}
