//! One measured point ([`Point`]) under the quiet and retry rules, and the
//! RTT sweep against one store ([`sweep`]): every loader at every
//! round-trip time, the repeats' medians kept.

use std::path::Path;
use std::time::Duration;

use super::loaders::{measure_dataloader, measure_granary, measure_train};
use super::point::{print_point, Point};
use super::scenario::{GranaryKnobs, Loader, LoaderKind, Setup};
use super::{Result, CONTENDED};
use crate::data::Dataset;
use crate::delay_proxy::DelayProxy;
use crate::store::Store;
use crate::sys::wait_quiet;

/// Runs one measurement after [`wait_quiet`], recording the wait; a
/// contended one (other processes took more than [`CONTENDED`] cores) is
/// run again, up to `retries` times, and the least contended attempt is
/// kept (every attempt's rate and contention are recorded in it).
pub fn measured(limit: Duration, retries: u32, mut f: impl FnMut() -> Result<Point>) -> Point {
    let mut best: Option<Point> = None;
    let mut attempts: Vec<(f64, f64)> = Vec::new();
    for attempt in 0..=retries {
        let (waited, quiet) = if limit.is_zero() {
            (Duration::ZERO, false)
        } else {
            wait_quiet(limit)
        };
        let mut p = f().unwrap_or_else(Point::failed);
        p.quiet_wait_s = waited.as_secs_f64();
        p.started_quiet = quiet;
        let failed = p.error.is_some();
        attempts.push((p.samples_per_s, p.cpu.rest()));
        let contended = p.cpu.rest() > CONTENDED;
        if contended && attempt < retries && !failed {
            println!(
                "    (contended: other processes took {:.2} cores, {:.0} samples/s; measuring again)",
                p.cpu.rest(),
                p.samples_per_s
            );
        }
        if best
            .as_ref()
            .is_none_or(|b| b.error.is_some() || (!failed && p.cpu.rest() < b.cpu.rest()))
        {
            best = Some(p);
        }
        if !contended || failed {
            break;
        }
    }
    let mut p = best.unwrap_or_else(|| Point::failed("not measured".into()));
    p.attempts = attempts;
    p
}

/// One store's points, one per round-trip time (the median of the
/// repeats).
pub struct Sweep {
    pub granary: Vec<Point>,
    /// Granary at 0 ms next to each point (the point itself at 0 ms).
    pub ref0: Vec<Point>,
    /// Every 0 ms measurement of Granary, repeats included.
    pub zeros: Vec<f64>,
    /// Further max_inflight_reads values, if any.
    pub granary_more: Vec<(u64, Vec<Point>)>,
    pub loaders: Vec<Vec<Point>>,
}

impl Sweep {
    /// Granary's points (named `granary`), then each of `loaders`' by its
    /// name.
    pub fn sides<'a>(
        &'a self,
        loaders: &'a [Loader],
    ) -> impl Iterator<Item = (&'a str, &'a [Point])> {
        let loaders = loaders.iter().zip(&self.loaders);
        std::iter::once(("granary", self.granary.as_slice()))
            .chain(loaders.map(|(l, points)| (l.name.as_str(), points.as_slice())))
    }
}

/// The repeat with the median rate (the lower one of an even count;
/// failed repeats count below every rate), every repeat's rate recorded in
/// it.
pub fn median_point(mut v: Vec<Point>) -> Point {
    let rates: Vec<f64> = v.iter().map(|p| p.samples_per_s).collect();
    v.sort_by(|a, b| {
        let key = |p: &Point| {
            if p.samples_per_s.is_finite() {
                p.samples_per_s
            } else {
                f64::NEG_INFINITY
            }
        };
        key(a).total_cmp(&key(b))
    });
    let n = v.len();
    let mut p = if n == 0 {
        Point::failed("not measured".into())
    } else {
        v.swap_remove((n - 1) / 2)
    };
    if n > 1 {
        p.repeats = rates;
    }
    p
}

/// One round of Granary at one round-trip time: the point, its 0 ms
/// reference (first when `odd`) and the further in-flight settings.
fn granary_round(
    w: &Where<'_>,
    rtt: u64,
    odd: bool,
    g: &mut Vec<Point>,
    r0: &mut Vec<Point>,
    more: &mut [Vec<Point>],
) {
    let Where {
        store,
        proxy,
        ds,
        plan,
    } = *w;
    let (quiet, retries, win) = (plan.quiet, plan.retries, plan.win);
    // The 0 ms reference goes first at every other point, so
    // that a drift in the machine's load does not always favour
    // one side.
    let paired = plan.pair && rtt != 0;
    let reference = |r0: &mut Vec<Point>| {
        proxy.set_delay(Duration::ZERO);
        let p = measured(quiet, retries, || {
            measure_granary(store, proxy, ds, &plan.knobs, win)
        });
        print_point("granary at 0 ms (reference for this point)", &p);
        r0.push(p);
        proxy.set_delay(delay(rtt));
    };
    let ref_first = paired && odd;
    if ref_first {
        reference(r0);
    }
    let p = measured(quiet, retries, || {
        measure_granary(store, proxy, ds, &plan.knobs, win)
    });
    print_point("granary", &p);
    if paired && !ref_first {
        reference(r0);
    } else if !paired && rtt == 0 {
        r0.push(p.clone());
    }
    g.push(p);
    for (k, n) in plan.inflights[1..].iter().enumerate() {
        let kn = GranaryKnobs {
            inflight: u32::try_from(*n).unwrap_or(u32::MAX),
            ..plan.knobs.clone()
        };
        let p = measured(quiet, retries, || {
            measure_granary(store, proxy, ds, &kn, win)
        });
        print_point(&format!("granary, max_inflight_reads {n}"), &p);
        more[k].push(p);
    }
}

/// Where a sweep runs: the store, its proxy, the dataset and the plan.
#[derive(Clone, Copy)]
struct Where<'a> {
    store: &'a Store,
    proxy: &'a DelayProxy,
    ds: &'a Dataset,
    plan: &'a Setup,
}

/// The proxy's delay each way for a round-trip time in ms.
fn delay(rtt: u64) -> Duration {
    Duration::from_micros(rtt * 1000 / 2)
}

/// The RTT sweep against one store, through a delay proxy of its own:
/// at each round-trip time, `repeat` rounds of Granary (and its 0 ms
/// reference), then each DataLoader, in that order (A B C A B C …), every
/// measurement under the same quiet and retry rules.
pub fn sweep(store: &Store, ds: &Dataset, keys: &Path, plan: &Setup) -> Result<Sweep> {
    let proxy = DelayProxy::loopback(store.addr(), Duration::ZERO)
        .map_err(|e| format!("delay proxy: {e}"))?;
    println!("delay proxy: {} -> {}", proxy.local_addr(), store.addr());
    let (quiet, retries, win) = (plan.quiet, plan.retries, plan.win);
    let mut sw = Sweep {
        granary: Vec::new(),
        ref0: Vec::new(),
        zeros: Vec::new(),
        granary_more: plan.inflights[1..]
            .iter()
            .map(|&n| (n, Vec::new()))
            .collect(),
        loaders: vec![Vec::new(); plan.loaders.len()],
    };
    let at = Where {
        store,
        proxy: &proxy,
        ds,
        plan,
    };
    for (i, &rtt) in plan.rtts.iter().enumerate() {
        proxy.set_delay(delay(rtt));
        println!(
            "--- {}: RTT {rtt} ms (proxy delay {} ms each way)",
            store.name(),
            rtt as f64 / 2.0
        );
        let mut g = Vec::new();
        let mut r0 = Vec::new();
        let mut more: Vec<Vec<Point>> = vec![Vec::new(); sw.granary_more.len()];
        let mut dl: Vec<Vec<Point>> = vec![Vec::new(); plan.loaders.len()];
        for round in 0..plan.repeat {
            if plan.repeat > 1 {
                println!("  round {} of {}", round + 1, plan.repeat);
            }
            if plan.do_granary {
                let odd = !(i + round as usize).is_multiple_of(2);
                granary_round(&at, rtt, odd, &mut g, &mut r0, &mut more);
            }
            if plan.do_loader {
                for (k, l) in plan.loaders.iter().enumerate() {
                    let p = measured(quiet, retries, || match &l.how {
                        LoaderKind::DataLoader(w) => measure_dataloader(
                            &plan.python,
                            store,
                            &proxy,
                            keys,
                            *w,
                            plan.knobs.batch,
                            win,
                        ),
                        LoaderKind::Train(args) => measure_train(
                            &plan.python,
                            store,
                            &proxy,
                            keys,
                            args,
                            plan.knobs.batch,
                            win,
                        ),
                    });
                    print_point(&l.name, &p);
                    dl[k].push(p);
                }
            }
        }
        if plan.do_granary {
            sw.zeros
                .extend(r0.iter().map(|p| p.samples_per_s).filter(|r| r.is_finite()));
            sw.granary.push(median_point(g));
            sw.ref0.push(median_point(r0));
            for (k, m) in more.into_iter().enumerate() {
                sw.granary_more[k].1.push(median_point(m));
            }
        }
        if plan.do_loader {
            for (k, d) in dl.into_iter().enumerate() {
                sw.loaders[k].push(median_point(d));
            }
        }
    }
    Ok(sw)
}
