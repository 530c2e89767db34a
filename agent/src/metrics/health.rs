//! What the metrics endpoint says to `GET /ready` and `GET /live`, for
//! probes that cannot speak to the loaders' socket (Kubernetes,
//! `docs/kubernetes.md`):
//!
//! * **ready** once `granaryd run` has built its engine (socket bound,
//!   warm restart and a configured view's directories done) and while the
//!   engine keeps turning: a turn within [`STALE`];
//! * **live** until the engine, once started, has not turned for
//!   [`STALE`]: a hung engine thread, which the metrics thread alone would
//!   never show. Before the engine starts (a DNS membership waiting for
//!   its own record, a warm restart copying its arena) the agent is live.
//!
//! `granaryd run` marks the start and beats from the engine's per-turn
//! callback (at most every 100 ms); the endpoint only reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the engine may go without a turn before the agent is neither
/// ready nor live.
pub const STALE: Duration = Duration::from_secs(15);

/// The engine's liveness, shared with the metrics endpoint.
#[derive(Debug)]
pub struct Health {
    origin: Instant,
    serving: AtomicBool,
    /// Milliseconds from `origin` to the last beat.
    beat_ms: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            origin: Instant::now(),
            serving: AtomicBool::new(false),
            beat_ms: AtomicU64::new(0),
        }
    }
}

impl Health {
    /// The engine serves from now on.
    pub fn serving(&self) {
        self.beat();
        self.serving.store(true, Ordering::Release);
    }

    /// The engine turned.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    fn beat_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.origin).as_millis();
        self.beat_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// The time since the engine's last turn, while it serves.
    fn silent_for(&self, now: Instant) -> Option<Duration> {
        if !self.serving.load(Ordering::Acquire) {
            return None;
        }
        let beat = self.origin + Duration::from_millis(self.beat_ms.load(Ordering::Acquire));
        Some(now.saturating_duration_since(beat))
    }

    /// `Ok` when ready, else why not.
    pub fn ready(&self, now: Instant) -> Result<(), String> {
        match self.silent_for(now) {
            None => Err("the agent is starting (its socket is not served yet)".into()),
            Some(d) if d >= STALE => Err(stale(d)),
            Some(_) => Ok(()),
        }
    }

    /// `Ok` when live, else why not.
    pub fn live(&self, now: Instant) -> Result<(), String> {
        match self.silent_for(now) {
            Some(d) if d >= STALE => Err(stale(d)),
            _ => Ok(()),
        }
    }
}

fn stale(d: Duration) -> String {
    format!("the engine has not turned for {} s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_serving_and_neither_ready_nor_live_when_the_engine_stops_turning() {
        let h = Health::default();
        let t0 = Instant::now();
        // Starting: live, not ready.
        assert!(h.live(t0).is_ok());
        assert!(h.ready(t0).unwrap_err().contains("starting"));
        h.serving();
        let t1 = Instant::now();
        assert!(h.ready(t1).is_ok() && h.live(t1).is_ok());
        // No turn for STALE: neither, with the time said.
        let later = t1 + STALE + Duration::from_secs(1);
        let e = h.live(later).unwrap_err();
        assert!(e.contains("has not turned for 1"), "{e}");
        assert!(h.ready(later).is_err());
        // A turn: both again.
        h.beat_at(later);
        assert!(h.ready(later).is_ok() && h.live(later).is_ok());
    }
}
