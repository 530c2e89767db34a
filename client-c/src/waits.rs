//! What the loader tells its agent about waiting: the time each
//! `next_batch` took (a histogram in the segment header) and how busy the
//! calling thread was between calls (on a CPU or waiting for one, from
//! `/proc/thread-self/schedstat`). The agent turns both into per-rank wait
//! quantiles and a verdict on why the training loop waits
//! (docs/operations.md, "Why the GPU waits").
//!
//! Cost: two monotonic clock reads per batch, and one read of the thread's
//! `schedstat` at most every [`BUSY_SAMPLE_EVERY`].

use granary_shm::segment::LoaderSegment;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// How often, at most, the thread's busy time is sampled.
pub(crate) const BUSY_SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// One session's wait clock.
#[derive(Debug)]
pub(crate) struct WaitClock {
    /// Reports are on (`SessionOptions::report_waits`).
    on: bool,
    last: Option<BusySample>,
}

#[derive(Debug, Clone, Copy)]
struct BusySample {
    at: Instant,
    busy_ns: u64,
    thread: ThreadId,
}

impl WaitClock {
    /// A clock that reports (`on`) or does nothing.
    pub(crate) fn new(on: bool) -> WaitClock {
        WaitClock { on, last: None }
    }

    /// At the start of a `next_batch`: samples the thread's busy time when
    /// it is due, and returns the call's start (`None` with reports off).
    pub(crate) fn before(&mut self, segment: &LoaderSegment) -> Option<Instant> {
        if !self.on {
            return None;
        }
        let now = Instant::now();
        let due = self
            .last
            .is_none_or(|l| now.duration_since(l.at) >= BUSY_SAMPLE_EVERY);
        if due {
            self.sample(segment, now);
        }
        Some(now)
    }

    /// At the end of a `next_batch` that returned a batch.
    pub(crate) fn after(&self, segment: &LoaderSegment, started: Option<Instant>) {
        let Some(started) = started else {
            return;
        };
        let ns = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        segment.report_wait(ns);
    }

    fn sample(&mut self, segment: &LoaderSegment, now: Instant) {
        let thread = std::thread::current().id();
        let Some(busy_ns) = thread_busy_ns() else {
            self.last = None;
            return;
        };
        if let Some(l) = self.last.filter(|l| l.thread == thread) {
            let wall = now
                .duration_since(l.at)
                .as_nanos()
                .min(u128::from(u64::MAX)) as u64;
            // A thread's own counters only grow; never more busy than wall.
            let busy = busy_ns.saturating_sub(l.busy_ns).min(wall);
            segment.report_busy(busy, wall);
        }
        self.last = Some(BusySample {
            at: now,
            busy_ns,
            thread,
        });
    }
}

/// Nanoseconds the calling thread has spent on a CPU plus waiting on a run
/// queue: the first two fields of `/proc/thread-self/schedstat`. `None`
/// where the kernel does not offer it.
pub(crate) fn thread_busy_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    parse_schedstat(&text)
}

fn parse_schedstat(text: &str) -> Option<u64> {
    let mut f = text.split_ascii_whitespace().map(str::parse::<u64>);
    let on_cpu = f.next()?.ok()?;
    let runnable = f.next()?.ok()?;
    on_cpu.checked_add(runnable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_is_parsed_and_garbage_is_not() {
        assert_eq!(parse_schedstat("253910040 116703831 71\n"), Some(370613871));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("12"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        assert_eq!(parse_schedstat("18446744073709551615 1 1"), None);
    }

    #[test]
    fn a_spinning_thread_reads_busy_and_a_sleeping_one_does_not() {
        let Some(a) = thread_busy_ns() else {
            eprintln!("SKIPPED: no /proc/thread-self/schedstat on this kernel");
            return;
        };
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(60) {
            std::hint::spin_loop();
        }
        let b = thread_busy_ns().unwrap();
        assert!(b - a >= 50_000_000, "spun 60 ms, busy {} ns", b - a);
        std::thread::sleep(Duration::from_millis(60));
        let c = thread_busy_ns().unwrap();
        assert!(c - b < 30_000_000, "slept 60 ms, busy {} ns", c - b);
    }
}
