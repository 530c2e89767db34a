//! `granaryd run`: start the metrics endpoint and the engine, tell systemd,
//! and serve until SIGTERM or SIGINT.

use crate::config::Config;
use crate::engine::Engine;
use crate::metrics::{Health, Metrics, MetricsServer};
use crate::notify::Notifier;
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// Runs the agent until a termination signal.
pub fn run(mut cfg: Config) -> io::Result<()> {
    let stop = crate::sys::signals::install_termination_flag();
    let metrics = Arc::new(Metrics::default());
    // `GET /ready` and `GET /live` on the metrics endpoint: ready once the
    // engine serves, neither when it stops turning (`metrics/health.rs`).
    let health = Arc::new(Health::default());
    let _metrics_server = match cfg.metrics.socket_addr() {
        Some(addr) => Some(
            MetricsServer::start_with_health(addr, Arc::clone(&metrics), Some(Arc::clone(&health)))
                .map_err(|e| io::Error::other(format!("metrics.address {addr}: {e}")))?,
        ),
        None => None,
    };
    // With `peers.membership = "dns"`: this agent's address among the
    // records, before the engine starts, then the thread that hands it the
    // views of the records (`peers::dns`).
    crate::peers::dns::settle_node_id(&mut cfg.peers)
        .map_err(|e| io::Error::other(format!("peers: {e}")))?;
    let peers = cfg.peers.clone();
    let mut engine = Engine::new_warm(cfg, Arc::clone(&metrics))?;
    let _resolver = crate::peers::dns::Resolver::start(&peers, engine.socket_path())?;
    let notifier = Notifier::from_env()?;
    let status = format!(
        "serving on {} ({})",
        engine.socket_path().display(),
        if engine.hugepages() {
            "hugepages"
        } else {
            "4 KiB pages"
        }
    );
    tracing::info!("{status}");
    notifier.ready(&status)?;
    let mut last_watchdog = Instant::now();
    let interval = notifier.watchdog_interval();
    health.serving();
    engine.run(stop, |_| {
        health.beat();
        if let Some(iv) = interval {
            if last_watchdog.elapsed() >= iv {
                let _ = notifier.watchdog();
                last_watchdog = Instant::now();
            }
        }
    })?;
    let _ = notifier.stopping();
    tracing::info!("stopped");
    Ok(())
}
