//! `granary ingest … --to s3://BUCKET/PREFIX` (or `gs://BUCKET/PREFIX`,
//! `az://CONTAINER/PREFIX`): moves a local dataset folder into an object
//! store: an S3 bucket, a Google Cloud Storage bucket or an Azure Blob
//! Storage container ([`StoreSettings`]).
//!
//! File `root/REL` becomes object `prefix/REL`, so the S3 catalog of
//! `prefix` ([`granary_agent::source::s3::S3Catalog::list`]) gives the same samples
//! with the same ids, labels and sizes as the folder. The rest is
//! [`super`]'s, with these store-specific parts:
//!
//! * each file is a single PUT, retried like a sample GET (timeouts,
//!   connection errors and 5xx, with backoff and jitter), on a runtime of
//!   the ingest's own;
//! * `resume`: one listing of the prefix first; files whose object already
//!   exists with the same size are skipped;
//! * `verify`: every object is read back and compared byte for byte with
//!   its file.

use super::retry;
use super::{drive, walk, IngestError, IngestReport, Item, Items, Phase, Step, Target};
use futures_util::StreamExt;
use granary_agent::source::s3::{classify, StoreKind, StoreSettings};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore, PutOptions, PutPayload};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What to ingest, where, how.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// The dataset folder.
    pub src: PathBuf,
    /// Connection settings (the bucket included).
    pub settings: StoreSettings,
    /// Key prefix the folder's files go under (`""`: the bucket root).
    pub prefix: String,
    /// Uploads (and verification reads) in flight at once.
    pub concurrency: usize,
    /// Read every object back and compare it with its file.
    pub verify: bool,
    /// Skip files whose object already exists with the same size.
    pub resume: bool,
}

impl IngestOptions {
    /// Options with 32 uploads in flight, no verification, no resume.
    pub fn new(
        src: impl Into<PathBuf>,
        settings: impl Into<StoreSettings>,
        prefix: &str,
    ) -> IngestOptions {
        IngestOptions {
            src: src.into(),
            settings: settings.into(),
            prefix: prefix.trim_matches('/').to_owned(),
            concurrency: 32,
            verify: false,
            resume: false,
        }
    }
}

/// Splits `s3://bucket/prefix` into bucket and prefix (without slashes at
/// either end; empty for the bucket root).
pub fn parse_s3_url(url: &str) -> Result<(String, String), String> {
    match parse_store_url(url)? {
        (StoreKind::S3, bucket, prefix) => Ok((bucket, prefix)),
        _ => Err(format!("{url:?} is not an s3://BUCKET/PREFIX URL")),
    }
}

/// Splits `s3://bucket/prefix`, `gs://bucket/prefix` or
/// `az://container/prefix` into the store, the bucket (or container) and
/// the prefix (without slashes at either end; empty for the root).
pub fn parse_store_url(url: &str) -> Result<(StoreKind, String, String), String> {
    let (kind, rest) = [StoreKind::S3, StoreKind::Gcs, StoreKind::Azure]
        .into_iter()
        .find_map(|k| {
            url.strip_prefix(k.scheme())
                .and_then(|r| r.strip_prefix("://"))
                .map(|r| (k, r))
        })
        .ok_or_else(|| {
            format!("{url:?} is not an s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX URL")
        })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("{url:?} names no bucket"));
    }
    Ok((kind, bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

/// The files of `src` and their keys under `prefix`, in catalog order.
fn plan(src: &Path, prefix: &str) -> Result<Vec<Item<ObjectPath>>, IngestError> {
    let mut items = Vec::new();
    for f in walk(src, "an S3 key")? {
        let full = if prefix.is_empty() {
            f.rel
        } else {
            format!("{prefix}/{}", f.rel)
        };
        let key = ObjectPath::parse(&full).map_err(|err| {
            IngestError::Source(format!("{}: cannot be an S3 key: {err}", f.file.display()))
        })?;
        items.push(Item {
            file: f.file,
            key,
            label: f.label,
            size: f.size,
        });
    }
    Ok(items)
}

/// Uploads `opts.src` to `s3://bucket/prefix` (or its GCS or Azure form); `progress(phase, files done,
/// files in all, bytes done)` is called as files finish. See the module docs.
pub fn ingest(
    opts: &IngestOptions,
    progress: impl FnMut(Phase, u64, u64, u64),
) -> Result<IngestReport, IngestError> {
    let items = plan(&opts.src, &opts.prefix)?;
    let store = opts
        .settings
        .build_store()
        .map_err(|e| IngestError::Setup(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("granary-ingest")
        .enable_all()
        .build()
        .map_err(|e| IngestError::Setup(format!("starting the runtime: {e}")))?;
    let bucket = Bucket {
        store,
        settings: Arc::new(opts.settings.clone()),
        prefix: opts.prefix.clone().into(),
    };
    runtime.block_on(drive(
        &bucket,
        items,
        opts.concurrency,
        opts.resume,
        opts.verify,
        progress,
    ))
}

/// The bucket an ingest writes to.
#[derive(Clone)]
struct Bucket {
    store: Arc<dyn ObjectStore>,
    settings: Arc<StoreSettings>,
    prefix: Arc<str>,
}

impl Bucket {
    /// Sizes of the objects under the prefix, by key.
    async fn list_sizes(&self) -> Result<HashMap<String, u64>, IngestError> {
        let prefix = &*self.prefix;
        let folder = ObjectPath::from(prefix);
        let arg = (!prefix.is_empty()).then_some(&folder);
        retry::s3(&self.settings, 0, || async {
            let mut out = HashMap::new();
            let mut stream = self.store.list(arg);
            while let Some(meta) = stream.next().await {
                let meta = meta?;
                out.insert(meta.location.as_ref().to_owned(), meta.size);
            }
            Ok(out)
        })
        .await
        .map_err(|(e, _)| {
            IngestError::Setup(format!(
                "cannot list {}/{prefix}: {}: {e}",
                self.settings.bucket(),
                classify(&e).what
            ))
        })
    }
}

impl Target for Bucket {
    type Key = ObjectPath;

    async fn stored(&self, items: &Items<ObjectPath>) -> Result<Vec<bool>, IngestError> {
        let existing = self.list_sizes().await?;
        Ok(items
            .iter()
            .map(|it| existing.get(it.key.as_ref()) == Some(&it.size))
            .collect())
    }

    fn write(&self, it: Arc<Item<ObjectPath>>, seed: u64) -> impl Step {
        let Bucket {
            store, settings, ..
        } = self.clone();
        async move {
            let payload = PutPayload::from(it.read()?);
            retry::s3(&settings, seed, || {
                store.put_opts(&it.key, payload.clone(), PutOptions::default())
            })
            .await
            .map(|_| ())
            .map_err(|(e, n)| {
                format!(
                    "{} -> {}: {} after {n} attempt(s): {e}",
                    it.file.display(),
                    settings.url_of(it.key.as_ref()),
                    classify(&e).what
                )
            })
        }
    }

    fn verify(&self, it: Arc<Item<ObjectPath>>, seed: u64) -> impl Step {
        let Bucket {
            store, settings, ..
        } = self.clone();
        async move {
            let url = settings.url_of(it.key.as_ref());
            let remote = retry::s3(&settings, seed, || async {
                store
                    .get_opts(&it.key, GetOptions::default())
                    .await?
                    .bytes()
                    .await
            })
            .await
            .map_err(|(e, n)| format!("{url}: {} after {n} attempt(s): {e}", classify(&e).what))?;
            it.compare(&url, &remote, &it.bytes()?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_parse() {
        assert_eq!(
            parse_s3_url("s3://b/p/q/").unwrap(),
            ("b".to_owned(), "p/q".to_owned())
        );
        assert_eq!(
            parse_s3_url("s3://b").unwrap(),
            ("b".to_owned(), String::new())
        );
        assert_eq!(
            parse_s3_url("s3://b/").unwrap(),
            ("b".to_owned(), String::new())
        );
        assert!(parse_s3_url("http://b/p").is_err());
        assert!(parse_s3_url("s3:///p").is_err());
        assert!(parse_s3_url("gs://b/p").is_err());
        assert_eq!(
            parse_store_url("gs://b/p/").unwrap(),
            (StoreKind::Gcs, "b".to_owned(), "p".to_owned())
        );
        assert_eq!(
            parse_store_url("az://c").unwrap(),
            (StoreKind::Azure, "c".to_owned(), String::new())
        );
        assert!(parse_store_url("gcs://b/p").is_err());
        assert!(parse_store_url("az:///p").is_err());
    }

    #[test]
    fn keys_follow_the_catalog() {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, b: &[u8]| {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b).unwrap();
        };
        w("b/2.bin", b"22");
        w("a/1.bin", b"1");
        w("top.bin", b"t");
        w(".hidden/x", b"x");
        let items = plan(d.path(), "ds/v1").unwrap();
        let keys: Vec<_> = items.iter().map(|i| (i.key.to_string(), i.size)).collect();
        assert_eq!(
            keys,
            [
                ("ds/v1/top.bin".to_owned(), 1),
                ("ds/v1/a/1.bin".to_owned(), 1),
                ("ds/v1/b/2.bin".to_owned(), 2)
            ]
        );
        let items = plan(d.path(), "").unwrap();
        assert_eq!(items[0].key.as_ref(), "top.bin");
        let e = ingest(
            &IngestOptions::new(
                d.path().join("missing"),
                granary_agent::source::s3::S3Settings::new("b"),
                "p",
            ),
            |_, _, _, _| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
