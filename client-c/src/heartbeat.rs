//! The loader's heartbeat: one background thread per process that bumps
//! the `loader_heartbeat` word of every open session's segment every
//! `heartbeat_interval_ms / 2`, so that an idle but healthy loader still
//! shows the agent it is alive. A stopped (`SIGSTOP`) process stops this
//! thread with all the others, and the agent then sees silence, which is the
//! point. Library calls on a session beat too ([`LoaderSegment::beat`]).
//!
//! Ownership: the thread holds only weak references to the segments, and
//! upgrades one for the instant of a beat, so it never touches a mapping
//! that is gone and never keeps a closed session's segment alive. When no
//! session is left it exits; the next session starts a new one.
//!
//! Fork: a child process does not inherit the thread. The process-wide
//! registry remembers the pid that made it; the first session opened in a
//! child finds another pid and starts a fresh registry and thread (the
//! parent's sessions, inherited as memory, are not beaten by the child). The
//! heartbeat thread never locks the process-wide registry, only its own, so
//! a fork during a beat cannot leave the child a lock it needs.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use granary_shm::segment::LoaderSegment;

/// Sessions whose segments one background thread beats.
#[derive(Debug, Default)]
pub(crate) struct Heartbeats {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    sessions: Vec<Entry>,
    /// A thread is running (it clears this, under the lock, as it exits).
    running: bool,
}

#[derive(Debug)]
struct Entry {
    segment: Weak<LoaderSegment>,
    period: Duration,
}

/// The period of a session beaten every `interval_ms / 2` (at least 1 ms);
/// `None` when the agent asked for no liveness checks.
fn period(interval_ms: u64) -> Option<Duration> {
    (interval_ms > 0).then(|| Duration::from_millis((interval_ms / 2).max(1)))
}

impl Heartbeats {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Beats `segment` from the background thread until the last strong
    /// reference to it is gone. Starts the thread if none is running.
    /// Segments whose heartbeat interval is 0 are not registered.
    pub(crate) fn register(self: &Arc<Self>, segment: &Arc<LoaderSegment>) -> io::Result<()> {
        let Some(period) = period(segment.heartbeat_interval_ms()) else {
            return Ok(());
        };
        let mut state = self.lock();
        state.sessions.push(Entry {
            segment: Arc::downgrade(segment),
            period,
        });
        if state.running {
            // The thread may be asleep for a longer period than this one's.
            self.wake.notify_all();
            return Ok(());
        }
        let me = Arc::clone(self);
        match std::thread::Builder::new()
            .name("granary-heartbeat".into())
            .stack_size(64 * 1024)
            .spawn(move || me.run())
        {
            Ok(_detached) => {
                state.running = true;
                Ok(())
            }
            Err(e) => {
                state.sessions.pop();
                Err(e)
            }
        }
    }

    /// Whether a background thread is running (for tests).
    #[cfg(test)]
    fn running(&self) -> bool {
        self.lock().running
    }

    /// The thread: beat every live segment, sleep the shortest period, exit
    /// when none is left.
    fn run(self: Arc<Self>) {
        let mut state = self.lock();
        loop {
            state.sessions.retain(|e| e.segment.strong_count() > 0);
            let mut sleep = None::<Duration>;
            for e in &state.sessions {
                if let Some(segment) = e.segment.upgrade() {
                    segment.beat();
                    sleep = Some(sleep.map_or(e.period, |s| s.min(e.period)));
                }
            }
            let Some(sleep) = sleep else {
                state.running = false;
                return;
            };
            state = self
                .wake
                .wait_timeout(state, sleep)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The registry of this process (made again in a forked child).
static PROCESS: Mutex<Option<(u32, Arc<Heartbeats>)>> = Mutex::new(None);

/// This process's heartbeat registry.
pub(crate) fn process() -> Arc<Heartbeats> {
    let pid = std::process::id();
    let mut slot = PROCESS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, beats)) = slot.as_ref() {
        if *owner == pid {
            return Arc::clone(beats);
        }
    }
    let fresh = Arc::new(Heartbeats::default());
    if let Some(inherited) = slot.replace((pid, Arc::clone(&fresh))) {
        // Inherited through fork from a process whose heartbeat thread is
        // not here: its lock may have been held at the fork, so it is never
        // touched again, not even to be dropped.
        std::mem::forget(inherited);
    }
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_shm::segment::{AgentSegment, SegmentSpec};
    use std::time::Instant;

    fn pair(interval_ms: u64) -> (AgentSegment, Arc<LoaderSegment>) {
        let agent = AgentSegment::create_heap(SegmentSpec {
            session_id: 1,
            ready_capacity: 4,
            release_capacity: 4,
            arena_size: 4096,
            instance_epoch: 3,
            heartbeat_interval_ms: interval_ms,
        })
        .expect("heap segment");
        let loader = LoaderSegment::attach_region(agent.region().clone(), Some(3)).expect("attach");
        (agent, Arc::new(loader))
    }

    /// Waits up to 5 s for `f`.
    fn eventually(mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    #[test]
    fn periods() {
        assert_eq!(period(0), None);
        assert_eq!(period(1), Some(Duration::from_millis(1)));
        assert_eq!(period(100), Some(Duration::from_millis(50)));
    }

    #[test]
    fn beats_while_registered_then_stops_and_the_thread_exits() {
        let beats = Arc::new(Heartbeats::default());
        let (agent, loader) = pair(20);
        beats.register(&loader).unwrap();
        assert!(beats.running());
        let start = agent.loader_heartbeat();
        assert!(
            eventually(|| agent.loader_heartbeat() >= start + 5),
            "the counter stayed at {}",
            agent.loader_heartbeat()
        );
        drop(loader);
        assert!(eventually(|| !beats.running()), "the thread did not exit");
        let stopped = agent.loader_heartbeat();
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(agent.loader_heartbeat(), stopped);

        // A later session starts a new thread.
        let (agent2, loader2) = pair(20);
        beats.register(&loader2).unwrap();
        assert!(eventually(|| agent2.loader_heartbeat() >= 3));
        drop(loader2);
        assert!(eventually(|| !beats.running()));
    }

    #[test]
    fn a_shorter_interval_wakes_the_thread() {
        let beats = Arc::new(Heartbeats::default());
        let (_slow_agent, slow) = pair(60_000);
        beats.register(&slow).unwrap();
        let (fast_agent, fast) = pair(10);
        beats.register(&fast).unwrap();
        // Without the wake-up the thread would sleep 30 s first.
        assert!(eventually(|| fast_agent.loader_heartbeat() >= 5));
        drop((slow, fast));
    }

    #[test]
    fn zero_interval_registers_nothing() {
        let beats = Arc::new(Heartbeats::default());
        let (agent, loader) = pair(0);
        beats.register(&loader).unwrap();
        assert!(!beats.running());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(agent.loader_heartbeat(), 0);
    }

    #[test]
    fn the_process_registry_is_shared_within_a_process() {
        assert!(Arc::ptr_eq(&process(), &process()));
    }
}
