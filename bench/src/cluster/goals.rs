//! The benchmark issue's goals, each judged from the scenarios' results.

use super::options::{Kind, Opts};
use super::pct;
use super::results::ScenarioResult;
use super::scenario::{layout, predicted_moved};

/// A goal's verdict, with what it was judged on.
pub struct Verdict {
    pub goal: &'static str,
    pub verdict: &'static str,
    pub detail: String,
}

pub fn met(ok: bool) -> &'static str {
    crate::report::verdict(ok)
}

/// The scenario `k`'s result, when it ran.
fn get(rs: &[ScenarioResult], k: Kind) -> Option<&ScenarioResult> {
    rs.iter().find(|r| r.kind == k)
}

/// The largest share of the dataset (`n` samples) that one epoch after
/// epoch 0 read from the store.
fn worst_later_epoch_reads(r: &ScenarioResult, n: f64) -> f64 {
    r.epochs[1..]
        .iter()
        .map(|e| e.total("reads") / n)
        .fold(0.0, f64::max)
}

/// The share of the assigned samples, over every epoch of `r`, kept by
/// another node than the one processing them (the assignment's definition
/// of moved).
fn moved_share(r: &ScenarioResult) -> f64 {
    let (moved, all) = r.epochs.iter().fold((0.0, 0.0), |a, e| {
        (a.0 + e.total("moved"), a.1 + e.total("assigned"))
    });
    moved / all.max(1.0)
}

/// A goal whose scenario did not run.
fn not_run(goal: &'static str, what: &str) -> Verdict {
    Verdict {
        goal,
        verdict: "not run",
        detail: format!("scenario {what} was not run"),
    }
}

/// Goal `goal` judged on scenario `kind`'s result: `judge` says whether it
/// is met and on what; not run without that scenario.
fn judged_on(
    rs: &[ScenarioResult],
    kind: Kind,
    goal: &'static str,
    judge: impl FnOnce(&ScenarioResult) -> (bool, String),
) -> Verdict {
    match get(rs, kind) {
        Some(r) => {
            let (ok, detail) = judge(r);
            Verdict {
                goal,
                verdict: met(ok),
                detail,
            }
        }
        None => not_run(goal, kind.name()),
    }
}

/// Every goal, in the order they are printed.
pub fn goals(o: &Opts, rs: &[ScenarioResult]) -> Vec<Verdict> {
    let mut g = Vec::new();
    for goal in [
        reads_after_epoch0_150,
        reads_after_epoch0_75,
        reads_in_epoch0,
        locality_moves,
        exact_moves,
        same_global_batch,
        over_b0,
        kill_restart,
        relaunch,
        corrupt,
        slow_link,
        channel_cost,
    ] {
        goal(o, rs, &mut g);
    }
    g
}

/// G1: store reads after epoch 0, arenas 150 %.
fn reads_after_epoch0_150(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G1: &str = "store reads after epoch 0 <= 1 % of samples, arenas 150 %";
    g.push(later_reads_at_most(o, rs, Kind::Peers150, G1, 0.01, ""));
}

/// G2: store reads after epoch 0, arenas 75 %.
fn reads_after_epoch0_75(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G2: &str = "store reads after epoch 0 <= uncached share + 2 points, arenas 75 %";
    let note = "; uncached share 25 % (keep areas hold 75 %)";
    g.push(later_reads_at_most(
        o,
        rs,
        Kind::Peers75,
        G2,
        0.25 + 0.02,
        note,
    ));
}

/// Goal `goal` (G1, G2): no epoch after epoch 0 of scenario `kind` read
/// more than `limit` of the dataset from the store; `note` ends the detail.
fn later_reads_at_most(
    o: &Opts,
    rs: &[ScenarioResult],
    kind: Kind,
    goal: &'static str,
    limit: f64,
    note: &str,
) -> Verdict {
    judged_on(rs, kind, goal, |r| {
        let worst = worst_later_epoch_reads(r, o.samples as f64);
        let detail = format!(
            "{}: worst epoch >= 1 read {} of the dataset{note}",
            kind.name(),
            pct(worst)
        );
        (worst <= limit, detail)
    })
}

/// G3: epoch 0 store reads.
fn reads_in_epoch0(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    let n = o.samples as f64;
    const G3: &str = "epoch 0 store reads <= 1.01 x the dataset";
    let firsts: Vec<(Kind, f64)> = rs
        .iter()
        .filter(|r| matches!(r.kind, Kind::Peers150 | Kind::Peers150Off | Kind::Peers75))
        .map(|r| (r.kind, r.epochs[0].total("reads") / n))
        .collect();
    if firsts.is_empty() {
        g.push(not_run(G3, "peers150/peers75"));
    } else {
        g.push(Verdict {
            goal: G3,
            verdict: met(firsts.iter().all(|(_, f)| *f <= 1.01)),
            detail: firsts
                .iter()
                .map(|(k, f)| format!("{}: {f:.4} x", k.name()))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
}

/// G4: samples moved in locality mode against the prediction.
fn locality_moves(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G4: &str = "locality mode: samples moved within 1 point of the assignment's prediction for this layout";
    g.push(judged_on(rs, Kind::Locality, G4, |r| {
        let p = o.nodes as f64;
        let law = 0.40 * ((p - 1.0) / p).sqrt() / f64::from(o.batch).sqrt();
        let got = moved_share(r);
        let every = r.epochs.iter().all(|e| e.locality);
        let uniform: Vec<u32> = (0..o.nodes as u32).collect();
        let predicted = predicted_moved(o.nodes as u32, &layout(o), o.batch);
        let detail = format!(
            "locality: {} of assigned samples moved (every epoch in locality order: {every}); the assignment \
             predicts {} for this layout (node 0 runs {} of the {} ranks but owns 1/{} of the samples: \
             ownership weighs nodes by capacity in 32 GiB steps, so every node here weighs the same), \
             {} with one rank per node; the uniform law 0.40*sqrt((p-1)/p)/sqrt(b) gives {} (p = {}, b = {})",
            pct(got),
            pct(predicted),
            o.ranks(0).len(),
            o.world(),
            o.nodes,
            pct(predicted_moved(o.nodes as u32, &uniform, o.batch)),
            pct(law),
            o.nodes,
            o.batch,
        );
        (every && (got - predicted).abs() <= 0.01, detail)
    }));
}

/// G5: cached samples moved in exact mode.
fn exact_moves(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G5: &str = "exact mode moves ~(p-1)/p of cached samples (taken as within 5 points)";
    g.push(judged_on(rs, Kind::Peers150, G5, |r| {
        let p = o.nodes as f64;
        let want = (p - 1.0) / p;
        let got = moved_share(r);
        let (peer, delivered): (f64, f64) = r.epochs[1..].iter().fold((0.0, 0.0), |a, e| {
            (a.0 + e.total("peer"), a.1 + e.samples() as f64)
        });
        let detail = format!(
            "peers150: {} of assigned samples kept on another node, (p-1)/p = {}; \
             epochs >= 1 fetched {} of delivered samples from peers (the rest was cached locally from earlier fetches)",
            pct(got),
            pct(want),
            pct(peer / delivered.max(1.0))
        );
        ((got - want).abs() <= 0.05, detail)
    }));
}

/// G6: the same global batch per step in both modes.
fn same_global_batch(_o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G6: &str = "locality and exact modes deliver the same global batch per step";
    match (get(rs, Kind::Peers150), get(rs, Kind::Locality)) {
        (Some(x), Some(l)) => {
            let bad = |r: &ScenarioResult| r.epochs.iter().map(|e| e.step_mismatch).sum::<u64>();
            let steps: u64 = l.epochs.iter().map(|e| e.steps).sum();
            g.push(Verdict {
                goal: G6,
                verdict: met(bad(x) == 0 && bad(l) == 0 && steps > 0),
                detail: format!(
                    "global steps whose multiset differs from the planner's: exact {}, locality {} (of {steps})",
                    bad(x),
                    bad(l)
                ),
            });
        }
        _ => g.push(not_run(G6, "peers150 and locality")),
    }
}

/// G7: throughput against b0.
fn over_b0(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G7: &str = "throughput >= 5x b0 when the store is the bottleneck";
    match (get(rs, Kind::B0), get(rs, Kind::Peers150)) {
        (Some(b), Some(p)) => {
            let x = p.rate_from(1) / b.rate_from(1);
            g.push(Verdict {
                goal: G7,
                verdict: met(x >= 5.0),
                detail: format!(
                    "epochs >= 1: peers150 {:.0} samples/s, b0 {:.0} samples/s: {x:.2}x (store link {} Mbit/s, RTT {} ms); whole runs: {:.2}x",
                    p.rate_from(1),
                    b.rate_from(1),
                    o.store_mbit,
                    o.rtt_ms,
                    p.rate_from(0) / b.rate_from(0)
                ),
            });
        }
        _ => g.push(not_run(G7, "b0 and peers150")),
    }
}

/// G8, G9: a peer killed and restarted.
fn kill_restart(_o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G8: &str = "peer kill and restart: zero lost, zero duplicated";
    const G9: &str = "peer kill and restart: no consumer waits longer than the restart time + 2 s";
    match get(rs, Kind::Kill) {
        Some(r) => {
            let (lost, dup, bad, errs) = r.broken();
            g.push(Verdict {
                goal: G8,
                verdict: met(lost == 0 && dup == 0 && bad == 0 && errs == 0),
                detail: format!(
                    "lost {lost}, duplicated {dup}, bad bytes {bad}, errors {errs}; batches replayed after the restart {}",
                    r.epochs.iter().flat_map(|e| &e.nodes).map(|n| n.replayed).sum::<u64>()
                ),
            });
            match r.restart_secs {
                Some(s) => {
                    let worst = r.max_wait_ms(1) / 1e3;
                    g.push(Verdict {
                        goal: G9,
                        verdict: met(worst <= s + 2.0),
                        detail: format!(
                            "longest wait for a batch in epoch 1 {worst:.2} s; restart took {s:.2} s (SIGKILL to socket answering)"
                        ),
                    });
                }
                None => g.push(Verdict {
                    goal: G9,
                    verdict: "not met",
                    detail: "the kill never happened (epoch 1 ended first)".into(),
                }),
            }
        }
        None => {
            g.push(not_run(G8, "kill"));
            g.push(not_run(G9, "kill"));
        }
    }
}

/// G10, G15: node loss with relaunch.
fn relaunch(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    let n = o.samples as f64;
    const G10: &str = "node loss with relaunch: only the lost node's samples change owner";
    const G15: &str = "relaunch: world size N -> N-1 in the middle of an epoch (same global batch): the union of global \
                       steps equals the plan with no duplicates, and store reads after the change <= the lost node's owned share";
    match get(rs, Kind::Relaunch).map(|r| (r, r.relaunch.as_ref())) {
        Some((r, Some(x))) => {
            // The lost node read its owned share (its keep set) from the
            // store in epoch 0; after the change only those samples have
            // new owners, who read them from the store once (a proxy: the
            // agents do not export ownership).
            let after = x.reads_after();
            let (lost, dup, bad, errs) = r.broken();
            let steps: u64 = r.epochs.iter().map(|e| e.step_mismatch).sum();
            let clean = lost + dup + bad == 0 && errs == 0 && steps == 0;
            let later: Vec<String> = x.reads_later.iter().map(|v| format!("{v:.0}")).collect();
            g.push(Verdict {
                goal: G10,
                verdict: met(after <= x.lost_share * 1.05 + 0.01 * n && clean),
                detail: format!(
                    "store reads after the change {after:.0} ({}); the lost node had read {:.0} (its keep set) in epoch 0; \
                     lost {lost}, duplicated {dup}, bad {bad}, errors {errs}, steps differing {steps}",
                    pct(after / n),
                    x.lost_share
                ),
            });
            let union_ok = x.union_extra == 0
                && x.union_missing == 0
                && x.twice == 0
                && x.missing == 0
                && x.wrong_side == 0
                && x.differing == 0;
            g.push(Verdict {
                goal: G15,
                verdict: met(union_ok && clean && after <= x.lost_share),
                detail: format!(
                    "world {} x batch {} -> {} x {} (global batch {}) at global step {} of {} in epoch {}; \
                     steps of epoch {} differing from the planner {}, delivered twice {}, missing {}, on the wrong side {}; \
                     the plan's union: {} extra copies, {} samples missing (the new world pads {}); \
                     the planner's steps for the two worlds differ in {} of {}; \
                     store reads after the change {after:.0} (rest of epoch {} {:.0}, later epochs {}) against the lost node's owned share {:.0} \
                     (its epoch-0 store reads; {:.0} = n/nodes); before the change in epoch {} {:.0}; \
                     lost {lost}, duplicated {dup}, bad {bad}, errors {errs}, steps differing in all epochs {steps}{}",
                    x.world.0,
                    x.batch.0,
                    x.world.1,
                    x.batch.1,
                    u64::from(x.world.1) * u64::from(x.batch.1),
                    x.at,
                    x.steps,
                    x.epoch,
                    x.epoch,
                    x.differing,
                    x.twice,
                    x.missing,
                    x.wrong_side,
                    x.union_extra,
                    x.union_missing,
                    x.padding,
                    x.planner_differing,
                    x.steps,
                    x.epoch,
                    x.reads_rest,
                    if later.is_empty() { "none run".to_owned() } else { later.join(" + ") },
                    x.lost_share,
                    n / o.nodes as f64,
                    x.epoch,
                    x.reads_before,
                    if x.padding > 0 {
                        format!(
                            "; --samples a multiple of {} gives both worlds an epoch without padding",
                            u64::from(x.world.0) * u64::from(x.world.1)
                        )
                    } else {
                        String::new()
                    },
                ),
            });
        }
        _ => {
            g.push(not_run(G10, "relaunch"));
            g.push(not_run(G15, "relaunch"));
        }
    }
}

/// G11: corrupted blocks.
fn corrupt(_o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G11: &str =
        "corruption: changed records rejected by the channel, no bad sample delivered";
    g.push(judged_on(rs, Kind::Corrupt, G11, |r| {
        let rejected: f64 = r.epochs.iter().map(|e| e.total("rejected_record")).sum();
        let crc: f64 = r.epochs.iter().map(|e| e.total("crc")).sum();
        let (_, _, bad, _) = r.broken();
        let detail = format!(
            "{} of {} block records changed on the wire; {rejected:.0} records rejected by the channel \
             (each closes its connection: the records behind it on the same connection are never opened), \
             {crc:.0} block CRC failures, {bad} bad samples delivered",
            r.corrupted, r.proxied_blocks
        );
        (r.corrupted > 0 && rejected >= 1.0 && bad == 0, detail)
    }));
}

/// G12, G13: a slow link.
fn slow_link(o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    let n = o.samples as f64;
    const G12: &str = "slow link: the other nodes' p99 batch wait <= 2x their p99 in peers150";
    const G13: &str = "slow link: epoch 0 store reads <= 1.05 x the dataset";
    match (get(rs, Kind::Slow), get(rs, Kind::Peers150)) {
        (Some(s), Some(p)) => {
            let slow = o.nodes - 1;
            let p99_of = |r: &ScenarioResult, nodes: &[usize]| r.p99_ms_of(nodes);
            let others: Vec<usize> = (0..o.nodes).filter(|&k| k != slow).collect();
            let (a, b) = (p99_of(s, &others), p99_of(p, &others));
            let per_node: Vec<String> = (0..o.nodes)
                .map(|k| {
                    format!(
                        "n{k}{} {:.1} ms",
                        if k == slow { " (slow)" } else { "" },
                        p99_of(s, &[k])
                    )
                })
                .collect();
            let routed: f64 = s.epochs.iter().map(|e| e.total("slow_routed")).sum();
            let hedged: f64 = s.epochs.iter().map(|e| e.total("hedged")).sum();
            g.push(Verdict {
                goal: G12,
                verdict: met(a <= 2.0 * b),
                detail: format!(
                    "p99 of the nodes other than n{slow}: slow {a:.1} ms, peers150 {b:.1} ms; per node in slow: {}; \
                     requests handed to the store because a peer was found slow {routed:.0}, hedged {hedged:.0}",
                    per_node.join(", ")
                ),
            });
            let first = s.epochs[0].total("reads") / n;
            g.push(Verdict {
                goal: G13,
                verdict: met(first <= 1.05),
                detail: format!(
                    "slow: epoch 0 read {first:.4} x the dataset from the store (peers150: {:.4} x)",
                    p.epochs[0].total("reads") / n
                ),
            });
        }
        _ => {
            g.push(not_run(G12, "slow and peers150"));
            g.push(not_run(G13, "slow and peers150"));
        }
    }
}

/// G14: what the channel's encryption costs.
fn channel_cost(_o: &Opts, rs: &[ScenarioResult], g: &mut Vec<Verdict>) {
    const G14: &str = "channel cost: peers150 (encrypted) >= 0.9x the samples/s of peers150off";
    match (get(rs, Kind::Peers150), get(rs, Kind::Peers150Off)) {
        (Some(on), Some(off)) => {
            let x = on.rate_from(0) / off.rate_from(0).max(1e-9);
            g.push(Verdict {
                goal: G14,
                verdict: met(x >= 0.9),
                detail: format!(
                    "whole runs: peers150 {:.0} samples/s, peers150off {:.0} samples/s: {x:.3}x; epochs >= 1: {:.3}x",
                    on.rate_from(0),
                    off.rate_from(0),
                    on.rate_from(1) / off.rate_from(1).max(1e-9)
                ),
            });
        }
        _ => g.push(not_run(G14, "peers150 and peers150off")),
    }
}
