//! The driver session a [`CqlSettings`] describes, and the read statement.
//!
//! * Contact points: the configured hosts; the driver reads `system.local`
//!   and `system.peers` through them and connects to every node it learns.
//! * Load balancing: the driver's default policy, token-aware. A prepared
//!   statement whose bound values include the whole partition key (ours:
//!   `WHERE id = ?`) is sent to a replica of that partition — the driver
//!   hashes the bound key with the table's partitioner (Murmur3) and looks
//!   the token up in the ring it read from the cluster — and on ScyllaDB to
//!   the shard owning it.
//! * Schema metadata: only what token awareness needs (the keyspace's
//!   replication, the tables' partitioners), only for the dataset's
//!   keyspace.
//! * Retries: the driver's own are off (its fall-through policy); the
//!   fetcher and the catalog make one attempt per request (`super::once`).
//! * Reads at `LOCAL_ONE`: the data is written once and read many times.

use super::{CqlError, CqlSettings, Pool};
use crate::config::parse_cql_host;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::client::PoolSize;
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::policies::retry::FallthroughRetryPolicy;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

/// Longest time to open one connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a session as described in the [module documentation](self).
pub async fn connect(settings: &CqlSettings) -> Result<Session, CqlError> {
    settings.check()?;
    let mut hosts = Vec::with_capacity(settings.hosts.len());
    for h in &settings.hosts {
        let (host, port) =
            parse_cql_host(h).map_err(|e| CqlError::Settings(format!("hosts: {e}")))?;
        hosts.push(if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        });
    }
    let profile = ExecutionProfile::builder()
        .consistency(Consistency::LocalOne)
        .request_timeout(Some(settings.request_timeout))
        .retry_policy(Arc::new(FallthroughRetryPolicy::new()))
        .load_balancing_policy(DefaultPolicy::builder().token_aware(true).build())
        .build();
    let pool = match settings.pool {
        Pool::PerHost(n) => PoolSize::PerHost(nonzero(n)),
        Pool::PerShard(n) => PoolSize::PerShard(nonzero(n)),
    };
    let mut b = SessionBuilder::new()
        .known_nodes(&hosts)
        .pool_size(pool)
        .connection_timeout(settings.request_timeout.min(CONNECT_TIMEOUT))
        .default_execution_profile_handle(profile.into_handle())
        .keyspaces_to_fetch([settings.keyspace.clone()])
        .fetch_schema_metadata(true)
        .fetch_full_schema_metadata(false)
        .metadata_request_clientside_timeout(settings.request_timeout);
    if let (Some(user), Some(password)) = (&settings.username, &settings.password) {
        b = b.user(user, password);
    }
    if settings.tls {
        b = b.tls_context(Some(tls_config(settings)?));
    }
    b.build().await.map_err(|e| {
        let text = e.to_string();
        let hint = if text.contains("uthenticat") {
            " — check the username and password (password, or GRANARY_CQL_PASSWORD)"
        } else if settings.tls && (text.contains("certificate") || text.contains("TLS")) {
            " — check tls_ca_file and that the nodes' certificates name their IP addresses"
        } else {
            ""
        };
        CqlError::Connect {
            hosts: settings.hosts.clone(),
            message: format!("{text}{hint}"),
        }
    })
}

fn nonzero(n: u32) -> NonZeroUsize {
    NonZeroUsize::new(n as usize).unwrap_or(NonZeroUsize::MIN)
}

/// The rustls client configuration of `settings`: the authorities of
/// `tls_ca_file`, else the system's; the aws-lc-rs provider.
pub(crate) fn tls_config(settings: &CqlSettings) -> Result<Arc<rustls::ClientConfig>, CqlError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bad = |m: String| CqlError::Settings(m);
    let mut roots = rustls::RootCertStore::empty();
    match &settings.tls_ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| bad(format!("tls_ca_file {}: {e}", path.display())))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    bad(format!(
                        "tls_ca_file {}: not a PEM certificate file: {e}",
                        path.display()
                    ))
                })?;
                roots.add(cert).map_err(|e| {
                    bad(format!(
                        "tls_ca_file {}: unusable certificate: {e}",
                        path.display()
                    ))
                })?;
            }
            if roots.is_empty() {
                return Err(bad(format!(
                    "tls_ca_file {}: holds no certificate",
                    path.display()
                )));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(bad(
                    "tls = true but no system certificate authority was found; set tls_ca_file"
                        .to_owned(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Prepares `SELECT data FROM ks.data WHERE id = ?` (once per fetcher; the
/// driver re-prepares it on a node that has forgotten it) with the driver's
/// retries off and reads at `LOCAL_ONE`.
pub(crate) async fn prepare_read(
    session: &Session,
    settings: &CqlSettings,
) -> Result<PreparedStatement, CqlError> {
    let cql = format!("SELECT data FROM {} WHERE id = ?", settings.data_ref());
    let mut statement = super::once(|| async { Ok(session.prepare(cql.as_str()).await?) })
        .await
        .map_err(|e| CqlError::request(format!("prepare {cql:?}"), e))?;
    statement.set_consistency(Consistency::LocalOne);
    statement.set_retry_policy(Some(Arc::new(FallthroughRetryPolicy::new())));
    Ok(statement)
}
