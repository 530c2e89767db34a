//! `granaryd run`: start the metrics endpoint and the engine, tell systemd,
//! and serve until SIGTERM or SIGINT.

use crate::config::Config;
use crate::engine::Engine;
use crate::metrics::{Metrics, MetricsServer};
use crate::notify::Notifier;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; `signal` has no other preconditions.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    // SAFETY: ignoring SIGPIPE has no preconditions; a loader that hangs up
    // mid-send must give EPIPE, not kill the agent.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Runs the agent until a termination signal.
pub fn run(cfg: Config) -> io::Result<()> {
    install_signal_handlers();
    let metrics = Arc::new(Metrics::default());
    let _metrics_server = match cfg.metrics.socket_addr() {
        Some(addr) => Some(
            MetricsServer::start(addr, Arc::clone(&metrics))
                .map_err(|e| io::Error::other(format!("metrics.address {addr}: {e}")))?,
        ),
        None => None,
    };
    let mut engine = Engine::new(cfg, Arc::clone(&metrics))?;
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
    engine.run(&STOP, |_| {
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
