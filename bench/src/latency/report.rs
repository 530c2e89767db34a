//! What a sweep prints: each point as it comes, then one store's table,
//! its goals and its keys of the result line.

use super::measure::Sweep;
use super::point::Point;
use super::scenario::{granary_config_line, Setup};
use super::{
    CONTENDED, GOAL_KEEP, GOAL_LIGHT_CONTENDER, GOAL_LIGHT_RTT, GOAL_W8, STORE_BOTTLENECK,
};
use crate::data::Dataset;
use crate::report::{median, Json};
use crate::store::Store;
use crate::sys::cpu_model;

/// Granary's rate at `v[i]`, NaN when missing.
fn rate(v: &[Point], i: usize) -> f64 {
    v.get(i).map_or(f64::NAN, |p| p.samples_per_s)
}

/// The client side's CPU µs per sample at `v[i]`, NaN when missing.
fn client_us(v: &[Point], i: usize) -> f64 {
    v.get(i)
        .map_or(f64::NAN, |p| p.cpu.us_per_sample(p.samples_per_s)[5].1)
}

/// One store's figures at 0 and 100 ms.
struct Figures {
    /// The sweep's 0 ms point, and Granary at 100 ms.
    g0: f64,
    g100: f64,
    /// The 0 ms measurement next to the 100 ms point.
    ref100: f64,
    /// The median of every 0 ms measurement of Granary.
    g0_median: f64,
    /// Granary at 100 ms over `g0_median`, over `ref100`, over `g0`, and
    /// per store CPU-second.
    keep: f64,
    keep_paired: f64,
    keep_unpaired: f64,
    keep_per_core: f64,
    /// Granary at 100 ms over the 8-worker DataLoader.
    speedup: f64,
    /// The best contender at 100 ms, its rate, and Granary over it.
    best_name: String,
    best_rate: f64,
    over_best: f64,
}

impl Figures {
    fn of(sw: &Sweep, plan: &Setup) -> Figures {
        let (rtts, loaders) = (&plan.rtts, &plan.loaders);
        let idx = |ms: u64| rtts.iter().position(|&r| r == ms);
        let g0 = idx(0).map_or(f64::NAN, |i| rate(&sw.granary, i));
        let g100 = idx(100).map_or(f64::NAN, |i| rate(&sw.granary, i));
        let ref100 = idx(100).map_or(f64::NAN, |i| rate(&sw.ref0, i));
        // Granary's 0 ms throughput: the median of every 0 ms measurement of
        // the sweep (the sweep's point and the references next to the
        // others), which a single noisy or drifted measurement does not move.
        let g0_median = if sw.zeros.is_empty() {
            g0
        } else {
            median(&sw.zeros)
        };
        let at100 = |k: usize| idx(100).map_or(f64::NAN, |i| rate(&sw.loaders[k], i));
        let w8_100 = loaders
            .iter()
            .position(|l| l.name == "dataloader_w8")
            .map_or(f64::NAN, at100);
        // The best contender at 100 ms.
        let best = (0..loaders.len())
            .map(|k| (&loaders[k].name, at100(k)))
            .filter(|(_, r)| r.is_finite())
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let (best_name, best_rate) =
            best.map_or(("none".to_owned(), f64::NAN), |(n, r)| (n.clone(), r));
        let core_rate = |v: &[Point], i: Option<usize>| {
            i.and_then(|i| v.get(i))
                .map_or(f64::NAN, Point::per_store_core)
        };
        Figures {
            g0,
            g100,
            ref100,
            g0_median,
            keep: g100 / g0_median,
            keep_paired: g100 / ref100,
            keep_unpaired: g100 / g0,
            keep_per_core: core_rate(&sw.granary, idx(100)) / core_rate(&sw.ref0, idx(100)),
            speedup: g100 / w8_100,
            best_name,
            best_rate,
            over_best: g100 / best_rate,
        }
    }
}

/// One store's table: samples/s, client CPU µs per sample and the store's
/// cores, for every loader at every round-trip time.
fn print_table(store: &Store, sw: &Sweep, plan: &Setup) {
    println!(
        "\n{}: samples/s (client CPU µs per sample; the store's cores)",
        store.name()
    );
    println!(
        "| RTT ms | granary | {} |",
        sw.granary_more
            .iter()
            .map(|(n, _)| format!("granary, {n} in flight"))
            .chain(plan.loaders.iter().map(|l| l.name.clone()))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for (i, rtt) in plan.rtts.iter().enumerate() {
        let cols: Vec<String> = sw
            .granary_more
            .iter()
            .map(|(_, l)| l)
            .chain(sw.loaders.iter())
            .map(|l| {
                format!(
                    "{:.0} ({:.0} µs; {:.2})",
                    rate(l, i),
                    client_us(l, i),
                    l.get(i).map_or(f64::NAN, |p| p.cpu.store)
                )
            })
            .collect();
        println!(
            "| {rtt} | {:.0} ({:.0} µs; {:.2}) | {} |",
            rate(&sw.granary, i),
            client_us(&sw.granary, i),
            sw.granary.get(i).map_or(f64::NAN, |p| p.cpu.store),
            cols.join(" | ")
        );
    }
}

/// The store's cores at 0 ms for every client, and whether it stayed below
/// [`STORE_BOTTLENECK`] for all of them (`None` without a 0 ms point).
fn store_at_0(store: &Store, sw: &Sweep, plan: &Setup) -> Option<&'static str> {
    let i = plan.rtts.iter().position(|&r| r == 0)?;
    let mut line = Vec::new();
    let mut worst = 0.0f64;
    for (name, v) in sw.sides(&plan.loaders) {
        if let Some(p) = v.get(i).filter(|p| p.error.is_none()) {
            line.push(format!(
                "{name} {:.2} cores ({:.0} µs per sample)",
                p.cpu.store,
                p.cpu.us_per_sample(p.samples_per_s)[0].1
            ));
            worst = worst.max(p.cpu.store);
        }
    }
    let verdict = if line.is_empty() {
        "not measured"
    } else if worst < STORE_BOTTLENECK {
        "yes"
    } else {
        "no"
    };
    println!(
        "{} at 0 ms: {}; {}",
        store.name(),
        line.join(", "),
        match verdict {
            "yes" => format!(
                "below {STORE_BOTTLENECK} core for every client: the store is not the bottleneck"
            ),
            "no" => format!("{worst:.2} cores for one client: the store may be what limits it"),
            _ => "not measured".to_owned(),
        }
    );
    Some(verdict)
}

/// Prints one store's table and goals and adds its keys to the last line:
/// SeaweedFS's under the names they always had, the light store's with a
/// `light_` prefix.
pub fn summarize(store: &Store, sw: &Sweep, plan: &Setup, j: &mut Json) {
    print_table(store, sw, plan);
    let f = Figures::of(sw, plan);
    println!(
        "{}: granary at 100 ms {:.0} samples/s = {:.3} × its 0 ms rate (median of {} measurements at 0 ms: {:.0} samples/s); {:.2} × the best contender at 100 ms ({}, {:.0} samples/s); {:.1} × the 8-worker DataLoader",
        store.name(),
        f.g100,
        f.keep,
        sw.zeros.len(),
        f.g0_median,
        f.over_best,
        f.best_name,
        f.best_rate,
        f.speedup
    );
    println!(
        "  against the 0 ms measurement next to it ({:.0} samples/s): {:.3}; against the sweep's 0 ms point ({:.0} samples/s): {:.3}; per store CPU-second: {:.3}",
        f.ref100, f.keep_paired, f.g0, f.keep_unpaired, f.keep_per_core
    );
    let at0_verdict = store_at_0(store, sw, plan);
    series_fields(j, store, sw, plan, at0_verdict);
    let pre = store.key();
    j.num(&format!("{pre}granary_0ms_median"), f.g0_median, 1)
        .num(&format!("{pre}granary_100_over_0"), f.keep, 3)
        .num(&format!("{pre}granary_100_over_0_paired"), f.keep_paired, 3)
        .num(
            &format!("{pre}granary_100_over_0_unpaired"),
            f.keep_unpaired,
            3,
        )
        .num(
            &format!("{pre}granary_100_over_0_per_store_core"),
            f.keep_per_core,
            3,
        )
        .num(&format!("{pre}granary_over_w8_at_100"), f.speedup, 2)
        .str(&format!("{pre}best_contender_at_100"), &f.best_name)
        .num(
            &format!("{pre}granary_over_best_contender_at_100"),
            f.over_best,
            2,
        );
    goals(j, store, &f);
    warn_contended(sw, plan);
    detail_fields(j, store, sw, plan);
}

/// One store's series, one value per round-trip time: every loader's rate,
/// the client's CPU per sample and the store's cores.
fn series_fields(j: &mut Json, store: &Store, sw: &Sweep, plan: &Setup, at0_verdict: Option<&str>) {
    let (pre, loaders) = (store.key(), &plan.loaders);
    let store_cores = |v: &[Point]| -> Vec<f64> { v.iter().map(|p| p.cpu.store).collect() };
    let rates = |v: &[Point]| -> Vec<f64> { v.iter().map(|p| p.samples_per_s).collect() };
    let cus = |v: &[Point]| -> Vec<f64> { (0..v.len()).map(|i| client_us(v, i)).collect() };
    j.nums(&format!("{pre}granary"), &rates(&sw.granary), 1);
    if let Some(v) = at0_verdict {
        j.str(&format!("{pre}store_not_bottleneck_at_0ms"), v);
    }
    for (n, points) in &sw.granary_more {
        j.nums(&format!("{pre}granary_inflight_{n}"), &rates(points), 1);
    }
    for (k, l) in loaders.iter().enumerate() {
        j.nums(&format!("{pre}{}", l.name), &rates(&sw.loaders[k]), 1);
    }
    j.nums(&format!("{pre}granary_ref0"), &rates(&sw.ref0), 1);
    for (side, points) in sw.sides(loaders) {
        j.nums(
            &format!("{pre}{side}_client_us_per_sample"),
            &cus(points),
            1,
        );
    }
    for (side, points) in sw.sides(loaders) {
        j.nums(&format!("{pre}store_cores_{side}"), &store_cores(points), 3);
    }
}

/// The store's goals: printed, and their verdicts in the result line.
fn goals(j: &mut Json, store: &Store, f: &Figures) {
    match store {
        Store::Weed(_) => {
            // The goals this benchmark has always printed for SeaweedFS;
            // issue 14 asks only for the store's CPU share there.
            println!(
                "SeaweedFS goals (as before): ≥ 0.9 × its 0 ms rate: {}; ≥ 20 × the 8-worker DataLoader: {}",
                GOAL_KEEP.verdict(f.keep),
                GOAL_W8.verdict(f.speedup)
            );
            j.goal(&GOAL_KEEP, f.keep).goal(&GOAL_W8, f.speedup);
        }
        Store::Light(_) => {
            println!(
                "GOAL light store, granary at 100 ms ≥ 0.9 × granary at 0 ms: {:.3}: {}",
                f.keep,
                GOAL_LIGHT_RTT.verdict(f.keep)
            );
            println!(
                "GOAL light store, granary at 100 ms ≥ 2 × the best contender at 100 ms ({}): {:.2}: {}",
                f.best_name,
                f.over_best,
                GOAL_LIGHT_CONTENDER.verdict(f.over_best)
            );
            j.goal(&GOAL_LIGHT_RTT, f.keep)
                .goal(&GOAL_LIGHT_CONTENDER, f.over_best);
        }
    }
}

/// Warns about the Granary windows where other processes took more than
/// [`CONTENDED`] cores.
fn warn_contended(sw: &Sweep, plan: &Setup) {
    let contended: Vec<String> = plan
        .rtts
        .iter()
        .enumerate()
        .filter_map(|(i, rtt)| {
            let p = sw.granary.get(i)?;
            (p.cpu.rest() > CONTENDED).then(|| format!("{rtt} ms ({:.2} cores)", p.cpu.rest()))
        })
        .collect();
    if !contended.is_empty() {
        println!(
            "WARNING: other processes took more than {CONTENDED} cores during the Granary windows at {}: those rates are lower than this machine can do",
            contended.join(", ")
        );
    }
}

/// Every point's details (`*_detail` arrays) and the store's description.
fn detail_fields(j: &mut Json, store: &Store, sw: &Sweep, plan: &Setup) {
    let pre = store.key();
    let details = |v: &[Point]| {
        format!(
            "[{}]",
            v.iter().map(Point::json).collect::<Vec<_>>().join(",")
        )
    };
    j.raw(&format!("{pre}granary_detail"), &details(&sw.granary));
    for (n, points) in &sw.granary_more {
        j.raw(
            &format!("{pre}granary_inflight_{n}_detail"),
            &details(points),
        );
    }
    for (k, l) in plan.loaders.iter().enumerate() {
        j.raw(&format!("{pre}{}_detail", l.name), &details(&sw.loaders[k]));
    }
    j.str(&format!("{pre}store"), store.describe());
}

/// The run's settings and machine in the result line.
pub fn run_fields(j: &mut Json, setup: &Setup, ds: &Dataset, ingest_s: f64) {
    let win = setup.win;
    j.int("files", ds.len())
        .int("dataset_bytes", ds.bytes)
        .num(
            "mean_sample_bytes",
            ds.bytes as f64 / ds.len().max(1) as f64,
            0,
        )
        .int("batch", u64::from(setup.knobs.batch))
        .num("warmup_s", win.warmup.as_secs_f64(), 1)
        .num("window_s", win.window.as_secs_f64(), 1)
        .int("repeat", u64::from(setup.repeat))
        .int("retries", u64::from(setup.retries))
        .str("granary_config", &granary_config_line(&setup.knobs))
        .str("stores", &setup.stores.join(","))
        .num("ingest_s", ingest_s, 1)
        .int("cpus", crate::cpu::online_cpus() as u64)
        .str("cpu_model", &cpu_model());
}
