//! Why the training loop waits: each rank's waits in `next_batch` (reported
//! by libgranary in the session's segment header), what the agent saw its
//! sessions stall on, and a verdict per interval.
//!
//! Every [`INTERVAL`] the engine hands this module, per session, what the
//! loader reported since the last interval ([`LoaderReport::since`]) and the
//! stall time the agent measured by cause (its ready ring empty while its
//! next batch was not ready, [`Cause`]). Sessions are summed by (dataset,
//! rank): a rank's DataLoader workers are one rank. The verdict of an
//! interval ([`verdict`]):
//!
//! 1. no batch returned and no stall: `idle`;
//! 2. the rank's sessions spent at least [`DATA_BOUND_WAIT`] of the interval
//!    in `next_batch`, or a `next_batch` is still blocked (stall without a
//!    returned batch): data-bound, named by the cause the agent measured
//!    most stall time for: `store` (reads from the dataset's store in
//!    flight, or waiting for one because the dataset's reads are at
//!    `prefetch.max_inflight_reads`), `peer` (gets from a peer in flight)
//!    or `arena` (the samples were not in the arena and no read had
//!    started with reads to spare: no room, or the window had not reached
//!    them); waits the agent saw no stall for (the
//!    loader's own CRC check, its hand-over) are `loader_cpu`;
//! 3. otherwise the loop is not waiting for data: `loader_cpu` when the
//!    loader's thread was busy (on a CPU or runnable) for at least
//!    [`LOADER_CPU_BUSY`] of the time between its calls, else `compute`.
//!
//! Everything the loader writes is untrusted: a report that winds back is
//! dropped, and a loader can only mislabel its own rank.

use granary_shm::layout::{WAIT_BUCKETS, WAIT_BUCKET_BOUNDS_US};
use granary_shm::segment::LoaderReport;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// How often the engine reads the loaders' reports and gives a verdict.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Intervals the wait quantiles cover.
pub const QUANTILE_WINDOW: usize = 10;

/// Share of an interval spent in `next_batch` from which a rank is
/// data-bound.
pub const DATA_BOUND_WAIT: f64 = 0.05;

/// Share of the loader thread's time busy from which a rank that does not
/// wait for data is loader-CPU-bound.
pub const LOADER_CPU_BUSY: f64 = 0.5;

/// Most (dataset, rank) rows kept; sessions of other ranks are not counted.
pub const MAX_RANKS: usize = 4096;

granary_base::code_enum! {
    /// What a stalled session's next batch was waiting for.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Cause: u8 {
        /// Reads from the store in flight.
        Store = 0 => "store",
        /// Gets from a peer in flight.
        Peer = 1 => "peer",
        /// Not in the arena and not being read.
        Arena = 2 => "arena",
    }
    /// The `cause` label.
    pub fn label;
}

granary_base::code_enum! {
    /// An interval's verdict.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Verdict: u8 {
        /// No batch and no stall.
        Idle = 0 => "idle",
        /// Not waiting for data; the loader's thread mostly idle between batches.
        Compute = 1 => "compute",
        /// The loader's own CPU work between (or inside) its calls.
        LoaderCpu = 2 => "loader_cpu",
        /// Waiting on store reads.
        Store = 3 => "store",
        /// Waiting on peer gets.
        Peer = 4 => "peer",
        /// Waiting on samples not in the arena and not being read.
        Arena = 5 => "arena",
    }
    /// The `verdict` label.
    pub fn label;
}

impl Verdict {
    const fn of(c: Cause) -> Verdict {
        match c {
            Cause::Store => Verdict::Store,
            Cause::Peer => Verdict::Peer,
            Cause::Arena => Verdict::Arena,
        }
    }
}

/// One session's part of the accounting, kept in the session.
#[derive(Debug, Clone, Default)]
pub struct SessionWaits {
    /// The loader's report at the last interval.
    pub last: LoaderReport,
    /// Stall nanoseconds by [`Cause`] since the last interval.
    pub stall_ns: [u64; 3],
}

impl SessionWaits {
    /// Adds `ns` of stall for `cause`.
    pub fn stalled(&mut self, cause: Cause, ns: u64) {
        let s = &mut self.stall_ns[cause as usize];
        *s = s.saturating_add(ns);
    }

    /// What happened since the last call, given the loader's report now;
    /// starts the next interval.
    pub fn take(&mut self, now: LoaderReport) -> Interval {
        let loader = now.since(&self.last);
        // A report that wound back starts over from what it says now.
        self.last = now;
        Interval {
            loader: loader.unwrap_or_default(),
            stall_ns: std::mem::take(&mut self.stall_ns),
            sessions: 1,
        }
    }
}

/// What one or more sessions of a rank did in one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Interval {
    /// The loaders' reports over the interval.
    pub loader: LoaderReport,
    /// Stall nanoseconds by [`Cause`], as the agent measured them.
    pub stall_ns: [u64; 3],
    /// Sessions summed.
    pub sessions: u32,
}

impl Interval {
    /// Adds another session's interval.
    pub fn add(&mut self, o: &Interval) {
        let (a, b) = (&mut self.loader, &o.loader);
        a.wait_ns = a.wait_ns.saturating_add(b.wait_ns);
        a.batches = a.batches.saturating_add(b.batches);
        a.busy_ns = a.busy_ns.saturating_add(b.busy_ns);
        a.busy_wall_ns = a.busy_wall_ns.saturating_add(b.busy_wall_ns);
        for (x, y) in a.wait_buckets.iter_mut().zip(&b.wait_buckets) {
            *x = x.saturating_add(*y);
        }
        for (x, y) in self.stall_ns.iter_mut().zip(&o.stall_ns) {
            *x = x.saturating_add(*y);
        }
        self.sessions = self.sessions.saturating_add(o.sessions);
    }

    /// Share of the sessions' time spent in `next_batch` over `wall`.
    pub fn wait_ratio(&self, wall: Duration) -> f64 {
        let total = wall.as_nanos() as f64 * f64::from(self.sessions.max(1));
        (self.loader.wait_ns as f64 / total.max(1.0)).min(1.0)
    }

    /// Share of the loaders' thread time busy, when they reported any.
    pub fn busy_ratio(&self) -> Option<f64> {
        (self.loader.busy_wall_ns > 0)
            .then(|| (self.loader.busy_ns as f64 / self.loader.busy_wall_ns as f64).min(1.0))
    }

    /// The cause with the most stall time, if any.
    pub fn main_cause(&self) -> Option<Cause> {
        let (i, &ns) = self
            .stall_ns
            .iter()
            .enumerate()
            .max_by_key(|&(i, &ns)| (ns, std::cmp::Reverse(i)))?;
        (ns > 0).then_some(Cause::ALL[i])
    }
}

/// The verdict of an interval of length `wall` (module doc).
pub fn verdict(iv: &Interval, wall: Duration) -> Verdict {
    let stalled: u64 = iv.stall_ns.iter().sum();
    if iv.loader.batches == 0 {
        // A call blocked for the whole interval reports nothing until it
        // returns: the agent's stall says what it waits on.
        return match iv.main_cause() {
            Some(c) if stalled as f64 >= 0.5 * wall.as_nanos() as f64 => Verdict::of(c),
            _ => Verdict::Idle,
        };
    }
    if iv.wait_ratio(wall) >= DATA_BOUND_WAIT {
        return iv.main_cause().map_or(Verdict::LoaderCpu, Verdict::of);
    }
    match iv.busy_ratio() {
        Some(b) if b >= LOADER_CPU_BUSY => Verdict::LoaderCpu,
        _ => Verdict::Compute,
    }
}

/// The `q` quantile of waits counted in `buckets`, in seconds, linearly
/// interpolated within its bucket (the last bucket answers its lower
/// bound); `None` without waits.
pub fn quantile(buckets: &[u64; WAIT_BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let lo = if i == 0 {
                0.0
            } else {
                WAIT_BUCKET_BOUNDS_US[i - 1] as f64 / 1e6
            };
            let Some(&hi) = WAIT_BUCKET_BOUNDS_US.get(i) else {
                return Some(lo);
            };
            let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(lo + (hi as f64 / 1e6 - lo) * within);
        }
        below += n;
    }
    None
}

/// The quantiles exported per rank.
pub const QUANTILES: [(f64, &str); 3] = [(0.5, "0.5"), (0.95, "0.95"), (0.99, "0.99")];

/// One (dataset, rank) row: sums since the agent started and the recent
/// window.
#[derive(Debug, Clone, Default)]
pub struct RankRow {
    /// Everything since the start (the histogram and counters).
    pub total: Interval,
    /// The last [`QUANTILE_WINDOW`] intervals' wait buckets.
    window: VecDeque<[u64; WAIT_BUCKETS]>,
    /// The last interval's wait share.
    pub wait_ratio: f64,
    /// The last interval's busy share (0 when none was reported).
    pub busy_ratio: f64,
    /// The last interval's verdict.
    pub verdict: Option<Verdict>,
    /// Intervals by verdict.
    pub verdicts: [u64; 6],
}

impl RankRow {
    /// The wait quantiles over the recent window.
    pub fn quantiles(&self) -> [Option<f64>; 3] {
        let mut b = [0u64; WAIT_BUCKETS];
        for w in &self.window {
            for (x, y) in b.iter_mut().zip(w) {
                *x += y;
            }
        }
        QUANTILES.map(|(q, _)| quantile(&b, q))
    }

    fn push(&mut self, iv: &Interval, wall: Duration) {
        self.total.add(iv);
        if self.window.len() == QUANTILE_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(iv.loader.wait_buckets);
        self.wait_ratio = iv.wait_ratio(wall);
        self.busy_ratio = iv.busy_ratio().unwrap_or(0.0);
        let v = verdict(iv, wall);
        self.verdict = Some(v);
        self.verdicts[v as usize] += 1;
    }
}

/// Every rank's row, by (dataset name, rank).
#[derive(Debug, Clone, Default)]
pub struct RankTable {
    rows: BTreeMap<(String, u32), RankRow>,
}

impl RankTable {
    /// Records one interval of length `wall`: each (dataset, rank) with its
    /// sessions' intervals summed. Ranks with no session this interval keep
    /// their sums and last verdict.
    pub fn record(&mut self, intervals: BTreeMap<(String, u32), Interval>, wall: Duration) {
        for (key, iv) in intervals {
            if !self.rows.contains_key(&key) && self.rows.len() >= MAX_RANKS {
                continue;
            }
            self.rows.entry(key).or_default().push(&iv, wall);
        }
    }

    /// The rows, by (dataset, rank).
    pub fn rows(&self) -> impl Iterator<Item = (&(String, u32), &RankRow)> {
        self.rows.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALL: Duration = Duration::from_secs(1);

    fn iv(batches: u64, wait_ms: u64, busy: Option<(u64, u64)>, stall_ms: [u64; 3]) -> Interval {
        let mut loader = LoaderReport {
            wait_ns: wait_ms * 1_000_000,
            batches,
            ..LoaderReport::default()
        };
        if let Some(each) = loader.wait_ns.checked_div(batches) {
            loader.wait_buckets[granary_shm::layout::wait_bucket(each)] = batches;
        }
        if let Some((b, w)) = busy {
            (loader.busy_ns, loader.busy_wall_ns) = (b * 1_000_000, w * 1_000_000);
        }
        Interval {
            loader,
            stall_ns: stall_ms.map(|m| m * 1_000_000),
            sessions: 1,
        }
    }

    #[test]
    fn each_cause_gets_its_verdict() {
        // Waiting 40 % of the time on store reads.
        assert_eq!(
            verdict(&iv(10, 400, None, [380, 0, 10]), WALL),
            Verdict::Store
        );
        assert_eq!(
            verdict(&iv(10, 400, None, [5, 380, 0]), WALL),
            Verdict::Peer
        );
        assert_eq!(
            verdict(&iv(10, 400, None, [0, 0, 390]), WALL),
            Verdict::Arena
        );
        // Waits the agent saw no stall for: the loader's own work.
        assert_eq!(
            verdict(&iv(10, 400, None, [0, 0, 0]), WALL),
            Verdict::LoaderCpu
        );
        // No waiting: busy thread, or an idle one (a GPU step).
        assert_eq!(
            verdict(&iv(10, 5, Some((900, 1000)), [0; 3]), WALL),
            Verdict::LoaderCpu
        );
        assert_eq!(
            verdict(&iv(10, 5, Some((50, 1000)), [0; 3]), WALL),
            Verdict::Compute
        );
        assert_eq!(verdict(&iv(10, 5, None, [0; 3]), WALL), Verdict::Compute);
        // A call blocked all interval long; and nothing at all.
        assert_eq!(verdict(&iv(0, 0, None, [990, 0, 0]), WALL), Verdict::Store);
        assert_eq!(verdict(&iv(0, 0, None, [0, 0, 0]), WALL), Verdict::Idle);
        assert_eq!(verdict(&iv(0, 0, None, [100, 0, 0]), WALL), Verdict::Idle);
    }

    #[test]
    fn workers_of_a_rank_share_the_interval() {
        // Two workers, each waiting 30 ms of the second: 3 %, not data-bound.
        let mut a = iv(5, 30, Some((100, 1000)), [0; 3]);
        a.add(&iv(5, 30, Some((100, 1000)), [0; 3]));
        assert_eq!(a.sessions, 2);
        assert!((a.wait_ratio(WALL) - 0.03).abs() < 1e-9);
        assert_eq!(verdict(&a, WALL), Verdict::Compute);
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let mut b = [0u64; WAIT_BUCKETS];
        assert_eq!(quantile(&b, 0.5), None);
        b[0] = 50; // up to 100 µs
        b[6] = 50; // 50..100 ms
        let p50 = quantile(&b, 0.5).unwrap();
        assert!((p50 - 100e-6).abs() < 1e-9, "{p50}");
        let p99 = quantile(&b, 0.99).unwrap();
        assert!((p99 - 0.099).abs() < 1e-9, "{p99}");
        b[WAIT_BUCKETS - 1] = 1000;
        assert_eq!(quantile(&b, 0.99), Some(2.5));
    }

    #[test]
    fn a_report_that_winds_back_counts_nothing() {
        let mut s = SessionWaits::default();
        let r = LoaderReport {
            wait_ns: 10,
            batches: 1,
            wait_buckets: [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..LoaderReport::default()
        };
        s.stalled(Cause::Arena, 7);
        let first = s.take(r);
        assert_eq!((first.loader.batches, first.stall_ns), (1, [0, 0, 7]));
        let back = s.take(LoaderReport::default());
        assert_eq!(back.loader, LoaderReport::default());
        // And it goes on from there.
        let next = s.take(r);
        assert_eq!(next.loader.batches, 1);
    }

    #[test]
    fn the_table_keeps_sums_verdict_counts_and_a_window() {
        let mut t = RankTable::default();
        for _ in 0..(QUANTILE_WINDOW + 5) {
            let mut m = BTreeMap::new();
            m.insert(("d".to_string(), 0), iv(10, 400, None, [380, 0, 0]));
            t.record(m, WALL);
        }
        let (_, row) = t.rows().next().unwrap();
        assert_eq!(row.verdict, Some(Verdict::Store));
        assert_eq!(
            row.verdicts[Verdict::Store as usize],
            QUANTILE_WINDOW as u64 + 5
        );
        assert_eq!(row.total.loader.batches, 10 * (QUANTILE_WINDOW as u64 + 5));
        assert_eq!(row.window.len(), QUANTILE_WINDOW);
        // 40 ms waits: between 25 and 50 ms.
        let [p50, _, _] = row.quantiles();
        assert!((0.025..=0.05).contains(&p50.unwrap()));
    }
}
