//! The rules of each `[[dataset]]`: its name, its store's settings and
//! its shard format.

use super::Problems;
use crate::config::dataset::{
    is_cql_name, parse_cql_host, MAX_CQL_CONNECTIONS, MAX_DATASET_NAME_BYTES, MAX_REMOTE_INFLIGHT,
    MAX_REMOTE_RETRIES,
};
use crate::config::{
    AzureConfig, Config, CqlConfig, DatasetConfig, FsConfig, GcsConfig, S3Config, ShardFormat,
};
use std::collections::HashSet;

impl Config {
    pub(super) fn validate_datasets(&self, p: &mut Problems) {
        if self.datasets.is_empty() {
            p.bad("dataset", "at least one [[dataset]] is required");
        }
        // A dataset's retry table is checked once [prefetch]'s retry
        // settings pass, so that one mistake is not reported once per dataset.
        let prefetch_retry_ok = {
            let mut q = Problems::default();
            self.validate_retry(
                &self.prefetch.retry_settings(&Default::default()),
                "",
                &mut q,
            );
            q.0.is_empty()
        };
        let mut seen = HashSet::new();
        for (i, ds) in self.datasets.iter().enumerate() {
            let field = |name: &str| format!("dataset[{i}].{name}");
            let name = ds.name();
            if name.is_empty() {
                p.bad(&field("name"), "must not be empty");
            } else if name.len() > MAX_DATASET_NAME_BYTES {
                p.bad(
                    &field("name"),
                    format!(
                        "is {} bytes long; at most {MAX_DATASET_NAME_BYTES}",
                        name.len()
                    ),
                );
            } else if name.chars().any(char::is_control) {
                p.bad(
                    &field("name"),
                    format!("{name:?} contains control characters"),
                );
            } else if !seen.insert(name) {
                p.bad(
                    &field("name"),
                    format!("{name:?} is used by an earlier dataset"),
                );
            }
            if prefetch_retry_ok && *ds.retry() != Default::default() {
                self.validate_retry(&self.retry_for(ds), &field("retry."), p);
            }
            if let Some(prep) = ds.prepare() {
                for (key, message) in prep.problems() {
                    p.bad(&field(&format!("prepare.{key}")), message);
                }
            }
            // The kind's own keys, then the key groups it shares.
            match ds {
                DatasetConfig::Fs(fs) => validate_fs(fs, &field, p),
                DatasetConfig::S3(s3) => validate_s3(s3, &field, p),
                DatasetConfig::Gcs(gcs) => validate_gcs(gcs, &field, p),
                DatasetConfig::Azure(az) => validate_azure(az, &field, p),
                DatasetConfig::Cql(cql) => validate_cql(cql, &field, p),
            }
            if let Some((format, label_field, sample_field, wids_index, manifest)) = shard_keys(ds)
            {
                validate_format(
                    format,
                    label_field,
                    sample_field,
                    wids_index,
                    manifest,
                    &field,
                    p,
                );
            }
            if let DatasetConfig::Fs(fs) = ds {
                if fs.direct_io == Some(true) && fs.format != ShardFormat::Files {
                    p.bad(
                        &field("direct_io"),
                        "is for format = \"files\": samples inside shards start at offsets \
                         that are no multiple of a block",
                    );
                }
            }
            if let Some((request_timeout_ms, retries, max_inflight)) = remote_keys(ds) {
                self.validate_remote(request_timeout_ms, retries, max_inflight, &field, p);
            }
        }
    }

    /// The rules of the fields remote stores share.
    fn validate_remote(
        &self,
        request_timeout_ms: u64,
        retries: u32,
        max_inflight: Option<u32>,
        field: &dyn Fn(&str) -> String,
        p: &mut Problems,
    ) {
        let client_timeout = self.sessions.client_timeout_ms;
        if request_timeout_ms == 0 {
            p.bad(&field("request_timeout_ms"), "must be at least 1");
        } else if request_timeout_ms >= client_timeout {
            p.bad(
                &field("request_timeout_ms"),
                format!(
                    "{request_timeout_ms} ms must be below sessions.client_timeout_ms = {client_timeout} ms"
                ),
            );
        }
        if retries > MAX_REMOTE_RETRIES {
            p.bad(
                &field("retries"),
                format!("{retries} is above the maximum of {MAX_REMOTE_RETRIES}"),
            );
        }
        if let Some(n) = max_inflight {
            if !(1..=MAX_REMOTE_INFLIGHT).contains(&n) {
                p.bad(
                    &field("max_inflight"),
                    format!("{n} is outside 1..={MAX_REMOTE_INFLIGHT}"),
                );
            }
        }
    }
}

/// A sharded kind's `format`, `label_field`, `sample_field` and
/// `wids_index`, and whether it names a manifest.
type ShardKeys<'a> = (
    ShardFormat,
    &'a Option<String>,
    &'a Option<String>,
    &'a Option<String>,
    bool,
);

/// The [`ShardKeys`] of a sharded kind (`fs`, `s3`).
fn shard_keys(ds: &DatasetConfig) -> Option<ShardKeys<'_>> {
    let manifest = matches!(
        ds,
        DatasetConfig::Fs(FsConfig {
            manifest: Some(_),
            ..
        }) | DatasetConfig::S3(S3Config {
            manifest: Some(_),
            ..
        })
    );
    match ds {
        DatasetConfig::Fs(FsConfig {
            format,
            label_field,
            sample_field,
            wids_index,
            ..
        })
        | DatasetConfig::S3(S3Config {
            format,
            label_field,
            sample_field,
            wids_index,
            ..
        }) => Some((*format, label_field, sample_field, wids_index, manifest)),
        DatasetConfig::Gcs(_) | DatasetConfig::Azure(_) | DatasetConfig::Cql(_) => None,
    }
}

/// A remote kind's `request_timeout_ms`, `retries` and `max_inflight`.
fn remote_keys(ds: &DatasetConfig) -> Option<(u64, u32, Option<u32>)> {
    match ds {
        DatasetConfig::S3(S3Config {
            request_timeout_ms,
            retries,
            max_inflight,
            ..
        })
        | DatasetConfig::Gcs(GcsConfig {
            request_timeout_ms,
            retries,
            max_inflight,
            ..
        })
        | DatasetConfig::Azure(AzureConfig {
            request_timeout_ms,
            retries,
            max_inflight,
            ..
        }) => Some((*request_timeout_ms, *retries, *max_inflight)),
        DatasetConfig::Cql(cql) => {
            Some((cql.request_timeout_ms, cql.retries, Some(cql.max_inflight)))
        }
        DatasetConfig::Fs(_) => None,
    }
}

/// The rules of `format`, `label_field`, `sample_field` and `wids_index`
/// (fs and s3 datasets).
fn validate_format(
    format: ShardFormat,
    label_field: &Option<String>,
    sample_field: &Option<String>,
    wids_index: &Option<String>,
    manifest: bool,
    field: &dyn Fn(&str) -> String,
    p: &mut Problems,
) {
    if format != ShardFormat::Files && manifest {
        p.bad(
            &field("manifest"),
            "a manifest lists samples of format = \"files\"; shards are found under `root` or `prefix`",
        );
    }
    if let Some(l) = label_field {
        if format == ShardFormat::Files {
            p.bad(
                &field("label_field"),
                "is for format = \"webdataset\", \"mds\", \"parquet\" or \"arrow\"",
            );
        } else if l.is_empty() || l.contains('/') || l.chars().any(char::is_control) {
            p.bad(
                &field("label_field"),
                format!(
                    "{l:?} is not a member extension or column name (non-empty, no '/' or control characters)"
                ),
            );
        }
    }
    if let Some(w) = wids_index {
        if format != ShardFormat::Webdataset {
            p.bad(&field("wids_index"), "is for format = \"webdataset\"");
        } else if w.starts_with('/')
            || w.split('/').any(|c| c == "..")
            || w.chars().any(char::is_control)
        {
            p.bad(
                &field("wids_index"),
                format!(
                    "{w:?} is not a file name in the dataset's root or prefix (relative, no '..' \
                     or control characters; \"\" for none)"
                ),
            );
        }
    }
    if let Some(s) = sample_field {
        if !format.has_columns() {
            p.bad(
                &field("sample_field"),
                "is for format = \"mds\", \"parquet\" or \"arrow\"",
            );
        } else if s.is_empty() || s.contains('/') || s.chars().any(char::is_control) {
            p.bad(
                &field("sample_field"),
                format!("{s:?} is not a column name (non-empty, no '/' or control characters)"),
            );
        }
    }
}

/// The rules of a `kind = "fs"` dataset.
fn validate_fs(ds: &FsConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    match (&ds.root, &ds.manifest) {
        (None, None) => p.bad(
            &field("root"),
            "set either `root` (a directory tree) or `manifest` (a file)",
        ),
        (Some(_), Some(_)) => p.bad(&field("manifest"), "set only one of `root` and `manifest`"),
        (Some(r), None) if r.as_os_str().is_empty() => p.bad(&field("root"), "must not be empty"),
        (None, Some(m)) if m.as_os_str().is_empty() => {
            p.bad(&field("manifest"), "must not be empty")
        }
        _ => {}
    }
}

/// The rules of a `kind = "s3"` dataset.
fn validate_s3(ds: &S3Config, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    validate_bucket(&ds.bucket, "bucket", field, p);
    validate_layout(&ds.prefix, &ds.manifest, "bucket", field, p);
    validate_endpoint(ds.endpoint.as_deref(), ds.allow_http, field, p);
    if ds.access_key_id.is_some() != ds.secret_access_key.is_some() {
        let missing = if ds.access_key_id.is_some() {
            "secret_access_key"
        } else {
            "access_key_id"
        };
        p.bad(
            &field(missing),
            "access_key_id and secret_access_key go together: set both, or neither (then \
             AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are used)",
        );
    }
}

/// The rules of a `kind = "gcs"` dataset.
fn validate_gcs(ds: &GcsConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    validate_bucket(&ds.bucket, "bucket", field, p);
    validate_layout(&ds.prefix, &ds.manifest, "bucket", field, p);
    validate_endpoint(ds.endpoint.as_deref(), ds.allow_http, field, p);
    if ds
        .service_account_file
        .as_ref()
        .is_some_and(|f| f.as_os_str().is_empty())
    {
        p.bad(&field("service_account_file"), "must not be empty");
    }
}

/// The rules of a `kind = "azure"` dataset.
fn validate_azure(ds: &AzureConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    let a = &ds.account;
    if a.is_empty() || !a.bytes().all(|b| b.is_ascii_alphanumeric()) {
        p.bad(
            &field("account"),
            format!("{a:?} is not a storage account name (letters and digits)"),
        );
    }
    validate_bucket(&ds.container, "container", field, p);
    validate_layout(&ds.prefix, &ds.manifest, "container", field, p);
    validate_endpoint(ds.endpoint.as_deref(), ds.allow_http, field, p);
    let signed = ds.access_key.is_some() || ds.sas_token.is_some();
    if ds.access_key.is_some() && ds.sas_token.is_some() {
        p.bad(
            &field("sas_token"),
            "set at most one of `access_key` and `sas_token`",
        );
    } else if signed && ds.anonymous {
        p.bad(
            &field("anonymous"),
            "anonymous requests carry no credentials: leave out `access_key` and `sas_token`",
        );
    }
}

/// A bucket or container name: non-empty, no `/` or spaces.
fn validate_bucket(b: &str, key: &str, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    if b.is_empty() || b.contains('/') || b.chars().any(char::is_whitespace) {
        p.bad(
            &field(key),
            format!("{b:?} is not a {key} name (non-empty, no '/' or spaces)"),
        );
    }
}

/// Exactly one of `prefix` and `manifest`, the manifest not empty.
fn validate_layout(
    prefix: &Option<String>,
    manifest: &Option<String>,
    what: &str,
    field: &dyn Fn(&str) -> String,
    p: &mut Problems,
) {
    match (prefix, manifest) {
        (None, None) => p.bad(
            &field("prefix"),
            format!(
                "set either `prefix` (a folder of the {what}; \"\" for all of it) or `manifest`"
            ),
        ),
        (Some(_), Some(_)) => p.bad(
            &field("manifest"),
            "set only one of `prefix` and `manifest`",
        ),
        (None, Some(m)) if m.is_empty() || m == "file://" => {
            p.bad(&field("manifest"), "must not be empty")
        }
        _ => {}
    }
}

/// An `http://` or `https://` URL; plain HTTP only with `allow_http`.
fn validate_endpoint(
    endpoint: Option<&str>,
    allow_http: bool,
    field: &dyn Fn(&str) -> String,
    p: &mut Problems,
) {
    let Some(e) = endpoint else {
        return;
    };
    if let Some(rest) = e.strip_prefix("http://") {
        if rest.is_empty() {
            p.bad(&field("endpoint"), format!("{e:?} names no host"));
        } else if !allow_http {
            p.bad(
                &field("allow_http"),
                format!(
                    "endpoint {e} is plain HTTP; set allow_http = true to use it (meant for loopback and test servers)"
                ),
            );
        }
    } else if e.strip_prefix("https://").is_none_or(str::is_empty) {
        p.bad(
            &field("endpoint"),
            format!("{e:?} is not an http:// or https:// URL"),
        );
    }
}

/// The rules of a `kind = "cql"` dataset.
fn validate_cql(ds: &CqlConfig, field: &dyn Fn(&str) -> String, p: &mut Problems) {
    if ds.hosts.is_empty() {
        p.bad(
            &field("hosts"),
            "required for kind = \"cql\": contact points such as [\"10.0.0.1:9042\"]",
        );
    }
    for (j, h) in ds.hosts.iter().enumerate() {
        if let Err(e) = parse_cql_host(h) {
            p.bad(&field(&format!("hosts[{j}]")), e);
        }
    }
    let name_rule = "is not a CQL name Granary accepts (1 to 48 lowercase letters, digits or \
                     '_', starting with a letter)";
    for (key, value) in [
        ("keyspace", &ds.keyspace),
        ("data_table", &ds.data_table),
        ("metadata_table", &ds.metadata_table),
    ] {
        if !is_cql_name(value) {
            p.bad(&field(key), format!("{value:?} {name_rule}"));
        }
    }
    if ds.data_table == ds.metadata_table {
        p.bad(
            &field("metadata_table"),
            format!(
                "{:?} is also the data table; the two tables must differ",
                ds.metadata_table
            ),
        );
    }
    match (&ds.username, &ds.password) {
        (Some(u), _) if u.is_empty() => p.bad(&field("username"), "must not be empty"),
        (None, Some(_)) => p.bad(
            &field("username"),
            "a password is set without a username; set both (or the username and \
             GRANARY_CQL_PASSWORD in the environment)",
        ),
        _ => {}
    }
    if let Some(f) = &ds.tls_ca_file {
        if f.as_os_str().is_empty() {
            p.bad(&field("tls_ca_file"), "must not be empty");
        } else if !ds.tls {
            p.bad(
                &field("tls"),
                "tls_ca_file is set but TLS is off; set tls = true",
            );
        }
    }
    if ds.connections_per_host.is_some() && ds.connections_per_shard.is_some() {
        p.bad(
            &field("connections_per_shard"),
            "set only one of connections_per_host and connections_per_shard",
        );
    }
    for (key, value) in [
        ("connections_per_host", ds.connections_per_host),
        ("connections_per_shard", ds.connections_per_shard),
    ] {
        if let Some(n) = value {
            if !(1..=MAX_CQL_CONNECTIONS).contains(&n) {
                p.bad(
                    &field(key),
                    format!("{n} is outside 1..={MAX_CQL_CONNECTIONS}"),
                );
            }
        }
    }
}
