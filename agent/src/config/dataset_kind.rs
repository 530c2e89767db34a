//! The macro that declares each dataset kind's configuration struct, with
//! the key groups several kinds share written once.

/// Declares the struct of one dataset kind. Its body lists the kind's own
/// keys, and markers that stand for key groups several kinds share, each
/// written once here: `@common` (`name`, `order`, `[dataset.retry]`,
/// `[dataset.prepare]`: every kind), `@objects` (`prefix`, `manifest`:
/// the object stores), `@remote` (`allow_http`, `request_timeout_ms`,
/// `retries`, `max_inflight`: the object stores) and `@shards` (`format`,
/// `label_field`, `sample_field`). Each kind stays one flat struct that
/// rejects the keys of the others: serde's `deny_unknown_fields` does not
/// work through `#[serde(flatten)]`, so shared sub-structs cannot carry
/// the groups.
macro_rules! dataset_kind {
    ($(#[$($attr:tt)*])* pub struct $name:ident { $($body:tt)* }) => {
        dataset_kind!(@fields [$(#[$($attr)*])* pub struct $name] [] $($body)*);
    };
    (@fields $head:tt [$($out:tt)*] @common $($rest:tt)*) => {
        dataset_kind!(@fields $head [$($out)*
            /// `dataset[i].name`: what loaders ask for; non-empty, unique, at
            /// most 255 bytes, no control characters.
            pub name: String,
            /// `dataset[i].order`: `"strict"` (the default) delivers every
            /// batch exactly as planned; `"relaxed"` lets a ready sample of a
            /// later batch of the same epoch take the place of a late one
            /// while the loader waits, the late one moving back (every sample
            /// still comes exactly once per epoch). See docs/planner.md.
            #[serde(default)]
            pub order: crate::config::DeliveryOrder,
            /// `[dataset.retry]`: this dataset's retry settings.
            #[serde(default)]
            pub retry: crate::config::RetryOverride,
            /// `[dataset.prepare]`: decode and resize every sample (a JPEG)
            /// to one shape in the agent; unset: the stored bytes. See
            /// docs/prepare.md.
            #[serde(default)]
            pub prepare: Option<crate::config::PrepareConfig>,
        ] $($rest)*);
    };
    (@fields $head:tt [$($out:tt)*] @objects $($rest:tt)*) => {
        dataset_kind!(@fields $head [$($out)*
            /// `dataset[i].prefix`: the folder whose objects are the samples
            /// (class folders under it); `""` for the whole bucket or
            /// container. Exactly one of `prefix` and `manifest` must be set.
            #[serde(default)]
            pub prefix: Option<String>,
            /// `dataset[i].manifest`: the key of a manifest object in the
            /// bucket or container, or `file://PATH` for a local file.
            #[serde(default)]
            pub manifest: Option<String>,
        ] $($rest)*);
    };
    (@fields $head:tt [$($out:tt)*] @remote $($rest:tt)*) => {
        dataset_kind!(@fields $head [$($out)*
            /// `dataset[i].allow_http`: accept an `http://` endpoint (for
            /// loopback and test servers). Default false.
            #[serde(default)]
            pub allow_http: bool,
            /// `dataset[i].request_timeout_ms`: one request attempt (a GET,
            /// headers and body) must finish within this. Default 10000.
            #[serde(default = "crate::config::dataset_kind::default_request_timeout_ms")]
            pub request_timeout_ms: u64,
            /// `dataset[i].retries`: retries of a failed sample read
            /// (timeouts, connection errors, HTTP 5xx), with exponential
            /// backoff and jitter: this dataset's `read_retries` unless
            /// `[dataset.retry]` sets one. Default 8, at most 100.
            #[serde(default = "crate::config::dataset_kind::default_remote_retries")]
            pub retries: u32,
            /// `dataset[i].max_inflight`: sample reads in flight at once for
            /// this dataset. Default: `prefetch.max_inflight_reads`; at most
            /// 32768.
            #[serde(default)]
            pub max_inflight: Option<u32>,
        ] $($rest)*);
    };
    (@fields $head:tt [$($out:tt)*] @shards $($rest:tt)*) => {
        dataset_kind!(@fields $head [$($out)*
            /// `dataset[i].format`: how samples lie in the store: `"files"`
            /// (the default: one file or object per sample), `"webdataset"`
            /// (tar shards, one sample per key), `"mds"` (Mosaic MDS shards)
            /// `"parquet"` (Parquet files) or `"arrow"` (Arrow IPC files). See
            /// docs/formats.md.
            #[serde(default)]
            pub format: crate::config::ShardFormat,
            /// `dataset[i].label_field`: the member extension whose data is
            /// the label of a `webdataset` sample (ASCII decimal; default
            /// `"cls"`), or the integer column of an `mds` / `parquet` / `arrow`
            /// sample's label (default `"label"`).
            #[serde(default)]
            pub label_field: Option<String>,
            /// `dataset[i].sample_field`: the column whose value is the
            /// sample (`mds`, `parquet`, `arrow`). Default `"sample"`.
            #[serde(default)]
            pub sample_field: Option<String>,
            /// `dataset[i].wids_index`: the `wids` shard index (the JSON
            /// `widsindex create` writes) in the root or prefix that gives a
            /// `webdataset` dataset its shards and their order. Unset:
            /// `shardindex.json`, used when present; a name: that file,
            /// which must exist; `""`: none, the `.tar` files listed.
            #[serde(default)]
            pub wids_index: Option<String>,
        ] $($rest)*);
    };
    (@fields $head:tt [$($out:tt)*] $(#[$($a:tt)*])* pub $field:ident: $ty:ty, $($rest:tt)*) => {
        dataset_kind!(@fields $head [$($out)* $(#[$($a)*])* pub $field: $ty,] $($rest)*);
    };
    (@fields [$($head:tt)*] [$($out:tt)*]) => {
        #[derive(Clone, PartialEq, Eq, serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        $($head)* {
            $($out)*
        }
    };
}
pub(super) use dataset_kind;

/// `request_timeout_ms`'s default for the remote kinds.
pub(super) fn default_request_timeout_ms() -> u64 {
    10_000
}

/// `retries`' default for the remote kinds.
pub(super) fn default_remote_retries() -> u32 {
    8
}
