//! What a run prints: each run as it comes, the medians of every case, the
//! regime the processes ran in, the verdict and the result line.

use super::measure::{Latency, Run, Throughput};
use super::scenario::{Kind, Publish, BASELINE};
use super::{Options, GOAL, NEAR_NS};
use crate::cpu::Placement;
use crate::report::{median, Json};
use crate::sys::cpu_model;

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| {
            s.split_ascii_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "?".to_owned())
}

/// The machine and the throughput runs' settings.
pub fn print_header(o: &Options, nproc: usize) {
    println!("ring: cross-process SPSC ring, 64-byte items (BatchDescriptor)");
    println!(
        "  cpu: {} | nproc {nproc} | load avg {} | pinning: none",
        cpu_model(),
        loadavg()
    );
    println!(
        "  throughput: {} items/run, {} reps, capacity {}, batch k={}, pop_into buffer {}",
        o.items, o.reps, o.capacity, o.batch, o.pop
    );
}

/// Median ns/item (whole runs and 1 Mi-item slices) of one case.
#[derive(Clone, Copy)]
pub struct CaseSummary {
    run: f64,
    slice: f64,
}

/// Where the processes ran: how many throughput runs on distinct CPUs, on
/// one shared CPU, and how far apart the CPUs were.
struct Regime {
    distinct: usize,
    shared: usize,
    runs: usize,
    label: &'static str,
    near: usize,
    distance: &'static str,
}

/// The medians of every case and the result line.
pub struct Summary<'a> {
    pub o: &'a Options,
    pub nproc: usize,
    pub modes: &'a [Publish],
    pub kinds: &'a [Kind],
    pub tp: &'a Throughput,
}

impl Summary<'_> {
    /// The medians of one case over the runs `keep` selects.
    fn case_where(&self, publish: Publish, kind: Kind, keep: &dyn Fn(&Run) -> bool) -> CaseSummary {
        let v: Vec<&Run> = self
            .tp
            .runs
            .get(&(publish.k(), kind.name()))
            .map_or_else(Vec::new, |v| v.iter().filter(|r| keep(r)).collect());
        let med = |f: fn(&Run) -> f64| median(&v.iter().map(|r| f(r)).collect::<Vec<_>>());
        CaseSummary {
            run: med(|r| r.ns_per_item),
            slice: med(|r| r.slice_ns_per_item),
        }
    }

    fn case(&self, publish: Publish, kind: Kind) -> CaseSummary {
        self.case_where(publish, kind, &|_| true)
    }

    /// Batched: granary's and the baseline ring's ns/item and their ratio
    /// over the repetitions whose probe said near (or far).
    fn batched_ratio_where(&self, near: bool) -> (f64, f64, f64) {
        let keep = move |r: &Run| r.near == near;
        let batched = Publish::Batched(self.o.batch);
        let g = self.case_where(batched, Kind::Granary, &keep);
        let b = self.case_where(batched, BASELINE, &keep);
        (g.run, b.run, b.run / g.run)
    }

    /// Prints every case's medians against granary's, and the batched ratio
    /// over near and far repetitions.
    pub fn print_cases(&self) {
        println!(
            "  median over {} reps, ns/item (whole run | median 1 Mi-item slice):",
            self.o.reps
        );
        for &publish in self.modes {
            let g = self.case(publish, Kind::Granary);
            for &kind in self.kinds {
                let c = self.case(publish, kind);
                println!(
                    "    {:<13} {:<28} {:>8.2} | {:>6.2}   ns ÷ granary ns {:.3} | {:.3}",
                    publish.label(),
                    kind.name(),
                    c.run,
                    c.slice,
                    c.run / g.run,
                    c.slice / g.slice
                );
            }
        }
        for near in [true, false] {
            let (g, b, ratio) = self.batched_ratio_where(near);
            if ratio.is_finite() {
                println!(
                    "    batched, {} reps only: granary {g:.2}, baseline {b:.2} ns/item, ratio {ratio:.3}",
                    if near { "near" } else { "far" }
                );
            }
        }
    }

    fn regime(&self) -> Regime {
        let placements: Vec<Placement> = self
            .tp
            .runs
            .values()
            .flatten()
            .map(|r| r.placement)
            .collect();
        let distinct = placements
            .iter()
            .filter(|p| matches!(p, Placement::Distinct { .. }))
            .count();
        let shared = placements
            .iter()
            .filter(|p| matches!(p, Placement::Shared { .. }))
            .count();
        // A run whose processes moved once is not a different regime: the
        // label needs 90 % of the runs.
        let label = if distinct * 10 >= placements.len() * 9 {
            "distinct"
        } else if shared * 10 >= placements.len() * 9 {
            "shared"
        } else {
            "mixed"
        };
        let probes = &self.tp.probes;
        let near = probes.iter().filter(|&&p| p < NEAR_NS).count();
        let distance = if near == probes.len() {
            "near"
        } else if near == 0 {
            "far"
        } else {
            "mixed"
        };
        Regime {
            distinct,
            shared,
            runs: placements.len(),
            label,
            near,
            distance,
        }
    }

    /// Prints the regime and the verdict; returns the result line.
    pub fn print(&self, latency: Option<&Latency>) -> Json {
        let (o, probes) = (self.o, &self.tp.probes);
        let rg = self.regime();
        println!(
            "  regime: nproc {}; throughput runs on distinct CPUs {}/{n}, on one shared CPU {}/{n} ({}); CPU distance {} (near in {}/{} reps, probe p50 {}); load avg now {}",
            self.nproc,
            rg.distinct,
            rg.shared,
            rg.label,
            rg.distance,
            rg.near,
            probes.len(),
            probes.iter().map(|p| format!("{p:.0}")).collect::<Vec<_>>().join("/"),
            loadavg(),
            n = rg.runs,
        );
        let batched = Publish::Batched(o.batch);
        let batch_g = self.case(batched, Kind::Granary);
        let batch_b = self.case(batched, BASELINE);
        let batch_m = self.case(batched, Kind::MinRing);
        let item_g = self.case(Publish::PerItem, Kind::Granary);
        let item_m = self.case(Publish::PerItem, Kind::MinRing);
        if (batch_b.run / batch_g.run).is_finite() {
            println!(
                "  granary batched: {:.1}% of the baseline ring's throughput (whole runs), {:.1}% (slice medians)",
                100.0 * batch_b.run / batch_g.run,
                100.0 * batch_b.slice / batch_g.slice,
            );
        }
        let ratio_min = batch_m.run / batch_g.run;
        println!(
            "  result: granary batched {:.2} ns/item, minimal ring with cached peer indices {:.2} ns/item: ratio_min_ring {ratio_min:.3} ({:.3} on slice medians; per item {:.3}) (goal {}: {})",
            batch_g.run,
            batch_m.run,
            batch_m.slice / batch_g.slice,
            item_m.run / item_g.run,
            GOAL.rule(),
            GOAL.verdict(ratio_min),
        );
        if rg.label != "distinct" {
            println!(
                "  WARNING: regime {}: in some runs both processes shared one CPU, where spinning rings measure the scheduler, not the ring; rerun on an idle machine",
                rg.label
            );
        }
        let mut j = Json::bench("ring");
        self.throughput_fields(&mut j, latency, ratio_min);
        self.regime_fields(&mut j, &rg, latency);
        j
    }

    /// The throughput and latency figures of the result line, in its order.
    fn throughput_fields(&self, j: &mut Json, latency: Option<&Latency>, ratio_min: f64) {
        let batched = Publish::Batched(self.o.batch);
        let batch_g = self.case(batched, Kind::Granary);
        let batch_b = self.case(batched, BASELINE);
        let batch_m = self.case(batched, Kind::MinRing);
        let item_g = self.case(Publish::PerItem, Kind::Granary);
        let item_b = self.case(Publish::PerItem, BASELINE);
        let item_m = self.case(Publish::PerItem, Kind::MinRing);
        let lat = |f: &dyn Fn(&Latency) -> f64| latency.map_or(f64::NAN, f);
        j.num("granary_ns_per_item", batch_g.run, 3)
            .num("baseline_ns_per_item", batch_b.run, 3)
            .num("ratio", batch_b.run / batch_g.run, 3)
            .num("spin_handoff_ns_p50", lat(&|l| l.spin.p(50.0)), 0)
            .num("parked_handoff_us_p50", lat(&|l| l.parked.p(50.0) / 1e3), 2)
            .num("min_ring_ns_per_item", batch_m.run, 3)
            .num("ratio_min_ring", ratio_min, 3)
            .goal(&GOAL, ratio_min)
            .num("min_ring_slice_ns_per_item", batch_m.slice, 3)
            .num("slice_ratio_min_ring", batch_m.slice / batch_g.slice, 3)
            .num("min_ring_per_item_ns_per_item", item_m.run, 3)
            .num("per_item_ratio_min_ring", item_m.run / item_g.run, 3)
            .num("granary_slice_ns_per_item", batch_g.slice, 3)
            .num("baseline_slice_ns_per_item", batch_b.slice, 3)
            .num("slice_ratio", batch_b.slice / batch_g.slice, 3)
            .num("granary_per_item_ns_per_item", item_g.run, 3)
            .num("baseline_per_item_ns_per_item", item_b.run, 3)
            .num("per_item_ratio", item_b.run / item_g.run, 3)
            .num("spin_handoff_ns_p99", lat(&|l| l.spin.p(99.0)), 0)
            .num(
                "baseline_spin_handoff_ns_p50",
                lat(&|l| l.base_spin.p(50.0)),
                0,
            )
            .num(
                "baseline_spin_handoff_ns_p99",
                lat(&|l| l.base_spin.p(99.0)),
                0,
            )
            .num("parked_handoff_us_p99", lat(&|l| l.parked.p(99.0) / 1e3), 2);
    }

    /// The settings, the regime and the attribution figures of the result
    /// line.
    fn regime_fields(&self, j: &mut Json, rg: &Regime, latency: Option<&Latency>) {
        let o = self.o;
        j.int("batch", o.batch)
            .int("items", o.items)
            .int("reps", o.reps as u64)
            .int("nproc", self.nproc as u64)
            .str("regime", rg.label)
            .str("distance", rg.distance)
            .int("near_reps", rg.near as u64)
            .num("probe_ns_p50_median", median(&self.tp.probes), 0)
            .num("ratio_near", self.batched_ratio_where(true).2, 3)
            .num("ratio_far", self.batched_ratio_where(false).2, 3)
            .int("runs_distinct_cpus", rg.distinct as u64)
            .int("runs", rg.runs as u64)
            .num(
                "parked_distinct_cpu_pct",
                latency.map_or(f64::NAN, |l| l.parked.distinct_pct()),
                1,
            );
        if o.attribution {
            for &publish in self.modes {
                for &kind in self.kinds.iter().skip(3) {
                    let key = format!(
                        "{}_{}_ns_per_item",
                        kind.name(),
                        if publish.k() == 1 {
                            "per_item"
                        } else {
                            "batched"
                        }
                    );
                    j.num(&key.replace('+', "_"), self.case(publish, kind).run, 3);
                }
            }
        }
    }
}
