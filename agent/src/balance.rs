//! `prefetch.balance = "stall"`: how one dataset's free store reads are
//! divided among its sessions in a turn, by how close each session is to
//! stalling (after Lobster, load balance-aware I/O, HPDC 2022).
//!
//! Each session's *time to stall* is its lead, in batches (batches
//! published and not yet taken by the loader, plus the requested share of
//! the batches being prepared: ready, or read and due within a round
//! trip), divided by its consumption rate (batches per second, from the
//! intervals between its releases: [`ReleaseRate`]). The turn's free reads
//! go out as follows ([`grant`]):
//!
//! 1. a floor: every session that wants reads gets up to a quarter of the
//!    free reads divided by the sessions that want them (at least one), so
//!    none starves however far ahead it is;
//! 2. the rest, a batch's worth at a time, to the session whose time to
//!    stall (counting the reads already granted to it this turn) is the
//!    least, ties to the older session.
//!
//! With `"static"` (the agent before this policy) sessions are served in
//! the order they opened, each taking what its window wants.
//!
//! A session whose loader has released nothing yet has no rate: it takes
//! the mean rate of those that have one (every session counts as one batch
//! a second when none has), so a new session with nothing ready comes
//! first and one still filling its window does not jump the queue.

use std::time::{Duration, Instant};

/// The share of a turn's free reads handed out evenly as a floor: one
/// quarter (`1 / FLOOR_DIVISOR`).
pub(crate) const FLOOR_DIVISOR: usize = 4;

/// Weight of a new interval in the mean interval between releases.
const ALPHA: f64 = 0.2;

/// A session's consumption rate, learnt from its releases.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReleaseRate {
    /// When the loader last released a batch.
    last: Option<Instant>,
    /// Moving mean of the interval between releases, in seconds.
    interval_s: Option<f64>,
}

impl ReleaseRate {
    /// `n` batches released at `now`.
    pub(crate) fn record(&mut self, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        if let Some(last) = self.last {
            let per = now.saturating_duration_since(last).as_secs_f64() / n as f64;
            self.interval_s = Some(match self.interval_s {
                Some(m) => m + ALPHA * (per - m),
                None => per,
            });
        }
        self.last = Some(now);
    }

    /// Batches per second at `now`, or `None` before the second release. A
    /// loader silent for longer than its mean interval is taken to have
    /// slowed to one batch per silence.
    pub(crate) fn per_second(&self, now: Instant) -> Option<f64> {
        let mean = self.interval_s?;
        let silent = self
            .last
            .map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
        Some(1.0 / mean.max(silent.as_secs_f64()).max(1e-6))
    }
}

/// What the policy knows of one session in a turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Need {
    /// Batches ahead of the loader: published and not taken, plus the
    /// requested fraction of those being prepared.
    pub lead: f64,
    /// Batches consumed per second, if known.
    pub rate: Option<f64>,
    /// Samples of its window not yet requested: the most reads it can use.
    pub wants: usize,
    /// Samples per batch.
    pub batch: usize,
}

/// A session's time to stall, in seconds, with `extra` reads granted.
fn time_to_stall(n: &Need, rate: f64, extra: usize) -> f64 {
    (n.lead + extra as f64 / n.batch.max(1) as f64) / rate
}

/// Divides `budget` free reads among sessions (in the order they opened);
/// returns each session's grant and the order of the grants after the
/// floor, as (session, reads) pairs. The grants sum to at most `budget`
/// and no session gets more than it wants.
pub(crate) fn grant(budget: usize, needs: &[Need]) -> (Vec<usize>, Vec<(usize, usize)>) {
    let mut grants = vec![0usize; needs.len()];
    let mut order = Vec::new();
    let wanting = needs.iter().filter(|n| n.wants > 0).count();
    if wanting == 0 || budget == 0 {
        return (grants, order);
    }
    let known: Vec<f64> = needs
        .iter()
        .filter_map(|n| n.rate.filter(|r| r.is_finite() && *r > 0.0))
        .collect();
    let fallback = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let rates: Vec<f64> = needs
        .iter()
        .map(|n| {
            n.rate
                .filter(|r| r.is_finite() && *r > 0.0)
                .unwrap_or(fallback)
        })
        .collect();
    let mut left = budget;
    let floor = (budget / FLOOR_DIVISOR / wanting).max(1);
    for (g, n) in grants.iter_mut().zip(needs) {
        let take = floor.min(n.wants).min(left);
        *g = take;
        left -= take;
    }
    while left > 0 {
        let next = needs
            .iter()
            .enumerate()
            .filter(|(i, n)| grants[*i] < n.wants)
            .map(|(i, n)| (i, time_to_stall(n, rates[i], grants[i])))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let Some((i, _)) = next else { break };
        let take = needs[i]
            .batch
            .max(1)
            .min(needs[i].wants - grants[i])
            .min(left);
        grants[i] += take;
        left -= take;
        match order.last_mut() {
            Some((j, n)) if *j == i => *n += take,
            _ => order.push((i, take)),
        }
    }
    (grants, order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(lead: f64, rate: Option<f64>, wants: usize) -> Need {
        Need {
            lead,
            rate,
            wants,
            batch: 10,
        }
    }

    #[test]
    fn the_session_nearest_a_stall_gets_the_reads_first() {
        // Same lead, twice the rate: the fast session stalls first.
        let (g, order) = grant(
            50,
            &[need(2.0, Some(10.0), 100), need(2.0, Some(20.0), 100)],
        );
        // Floor: 50 / 4 / 2 = 6 each (0.26 s and 0.13 s to stall); of the
        // remaining 38 the fast one gets 30, until its time to stall (5.6
        // batches at 20/s) passes the slow one's; the slow one the last 8.
        assert_eq!(order, [(1, 30), (0, 8)]);
        assert_eq!(g, [6 + 8, 6 + 30]);
    }

    #[test]
    fn occupancy_orders_sessions_of_equal_rate() {
        // Equal rates: the one with less ready goes first.
        let needs = [
            need(8.0, Some(10.0), 100),
            need(0.0, Some(10.0), 100),
            need(3.2, Some(10.0), 100),
        ];
        let (g, order) = grant(64, &needs);
        // Floor: 64 / 4 / 3 = 5 each. The empty one is brought past the
        // third (3.7 batches) before the third gets more; the one 8
        // batches ahead gets its floor only.
        assert_eq!(order, [(1, 40), (2, 9)]);
        assert_eq!(g, [5, 45, 14]);
    }

    #[test]
    fn a_session_far_ahead_keeps_its_floor() {
        let (g, order) = grant(
            100,
            &[need(50.0, Some(1.0), 1000), need(0.0, Some(1.0), 1000)],
        );
        assert_eq!(g, [12, 88]);
        assert!(order.iter().all(|(i, _)| *i == 1));
    }

    #[test]
    fn grants_never_exceed_what_a_session_wants_or_the_budget() {
        let (g, _) = grant(100, &[need(0.0, Some(5.0), 3), need(1.0, Some(5.0), 40)]);
        assert_eq!(g, [3, 40]);
        let (g, _) = grant(7, &[need(0.0, None, 100), need(0.0, None, 100)]);
        assert_eq!(g.iter().sum::<usize>(), 7);
        assert_eq!(g, [1 + 5, 1], "a tie: the older session");
        let (g, order) = grant(0, &[need(0.0, None, 100)]);
        assert!(g == [0] && order.is_empty());
        let (g, _) = grant(50, &[need(0.0, None, 0), need(0.0, None, 0)]);
        assert_eq!(g, [0, 0]);
    }

    #[test]
    fn a_session_without_a_rate_takes_the_mean_rate() {
        // The new session (no rate yet) counts at 15/s, the mean; with the
        // same lead it comes after the 20/s one and before the 10/s one.
        let needs = [
            need(1.0, Some(10.0), 100),
            need(1.0, None, 100),
            need(1.0, Some(20.0), 100),
        ];
        let (_, order) = grant(36, &needs);
        let firsts: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
        assert_eq!(&firsts[..2], &[2, 1], "{order:?}");
    }

    #[test]
    fn the_release_rate_follows_the_loader() {
        let t0 = Instant::now();
        let mut r = ReleaseRate::default();
        assert_eq!(r.per_second(t0), None);
        r.record(1, t0);
        assert_eq!(r.per_second(t0), None, "one release: no interval yet");
        for k in 1..=20 {
            r.record(1, t0 + Duration::from_millis(100 * k));
        }
        let at = t0 + Duration::from_millis(2000);
        let rate = r.per_second(at).unwrap();
        assert!((rate - 10.0).abs() < 0.01, "{rate}");
        // Two batches at once count as two intervals of half the time.
        r.record(2, at + Duration::from_millis(100));
        let rate = r.per_second(at + Duration::from_millis(100)).unwrap();
        assert!(rate > 10.0, "{rate}");
        // A loader silent for a second has slowed to at most 1/s.
        let rate = r.per_second(at + Duration::from_millis(1100)).unwrap();
        assert!(rate <= 1.0 + 1e-9, "{rate}");
    }
}
