//! What a run prints: each contender's CPU time per byte, the channel's
//! own bytes/s per core against the raw AEAD's per call path, whether the
//! suite picked is the faster one, the goals, and the result line.

use granary_peer::channel::{Protection, Suite};

use super::measure::{mb_s, Contender, Kind};
use super::scenario::{cpu_flags, prot_name, size_name, suite_name, Api};
use super::{Config, Result, GOAL, GOAL_COPYING};
use crate::report::{median, Json};
use crate::sys;

/// One call path at every size: the channel's own MB/s per core, with
/// the hand-over copies, and the ratio to the raw AEAD.
#[derive(Clone)]
pub struct Path {
    /// The channel's own MB/s per core (hand-over copies taken out).
    pub own: Vec<f64>,
    /// With the hand-over copies.
    pub with: Vec<f64>,
    /// The raw AEAD's time per byte over the channel's own.
    pub ratio: Vec<f64>,
}

impl Path {
    /// Not measured, at `sizes` sizes.
    fn nan(sizes: usize) -> Path {
        let nan = vec![f64::NAN; sizes];
        Path {
            own: nan.clone(),
            with: nan.clone(),
            ratio: nan,
        }
    }

    /// The lowest ratio, not a number when a size was not measured.
    pub fn lowest(&self) -> f64 {
        if self.ratio.iter().any(|r| r.is_nan()) {
            f64::NAN
        } else {
            self.ratio.iter().copied().fold(f64::INFINITY, f64::min)
        }
    }
}

/// One suite and protection.
pub struct Row {
    /// The suite.
    pub suite: Suite,
    /// The protection.
    pub protection: Protection,
    /// The raw AEAD's MB/s per core.
    pub raw: f64,
    /// Per call path, in `Api::ALL` order.
    pub paths: Vec<Path>,
}

/// The figures the result line is made of.
pub struct Figures {
    /// Every suite and protection measured.
    pub rows: Vec<Row>,
    /// The picked suite's raw AEAD, encrypted.
    pub goal_raw: f64,
    /// Its channel, direct calls.
    pub direct: Path,
    /// Its channel, copying calls.
    pub copying: Path,
    /// The lowest direct ratio: the goal's value.
    pub ratio: f64,
    /// The lowest copying ratio.
    pub copying_lowest: f64,
    /// The suite whose raw AEAD (encrypted) measured fastest.
    pub fastest: Option<Suite>,
    /// Whether the pick is the fastest, in words.
    pub pick_verdict: &'static str,
}

/// Prints every contender's median CPU time per byte.
fn print_contenders(o: &Config, cs: &[Contender]) {
    println!(
        "\nCPU time per byte, median of {} rounds (MB/s per core, ns per byte; the rounds' range; CPU over wall time):",
        o.rounds
    );
    for c in cs {
        let m = median(&c.ns_per_byte);
        let lo = c.ns_per_byte.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = c.ns_per_byte.iter().copied().fold(0.0, f64::max);
        println!(
            "  {:<56} {:>8.0} MB/s  {:.4} ns/B  ({:.0}–{:.0}; {:.2})",
            c.label(),
            mb_s(m),
            m,
            mb_s(hi),
            mb_s(lo),
            median(&c.cpu_share)
        );
    }
}

/// Each suite and protection's row from the contenders.
fn rows(o: &Config, cs: &[Contender]) -> Result<Vec<Row>> {
    let find = |suite: Suite, p: Protection, kind: Kind| {
        cs.iter().find(|c| {
            c.kind == kind
                && (matches!(kind, Kind::Handover(_)) || (c.suite == suite && c.protection == p))
        })
    };
    let med = |c: &Contender| median(&c.ns_per_byte);
    let mut rows = Vec::new();
    for &(suite, p) in &o.only {
        let raw = med(find(suite, p, Kind::Raw).ok_or("no raw contender")?);
        let mut row = Row {
            suite,
            protection: p,
            raw: mb_s(raw),
            paths: Vec::new(),
        };
        for api in Api::ALL {
            if !o.apis.contains(&api) {
                row.paths.push(Path::nan(o.sizes.len()));
                continue;
            }
            let mut path = Path {
                own: Vec::new(),
                with: Vec::new(),
                ratio: Vec::new(),
            };
            for &size in &o.sizes {
                let ch = find(suite, p, Kind::Channel(size, api)).ok_or("no channel contender")?;
                let ho = find(suite, p, Kind::Handover(size)).ok_or("no hand-over contender")?;
                // Paired by round: the channel's own time per byte.
                let own: Vec<f64> = ch
                    .ns_per_byte
                    .iter()
                    .zip(&ho.ns_per_byte)
                    .map(|(c, h)| c - h)
                    .collect();
                let own = median(&own);
                path.own.push(mb_s(own));
                path.with.push(mb_s(med(ch)));
                path.ratio.push(raw / own);
            }
            row.paths.push(path);
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Prints one table per call path: the channel's own MB/s per core
/// against the raw AEAD's.
fn print_paths(o: &Config, rows: &[Row], picked: Suite) {
    for (k, api) in Api::ALL.into_iter().enumerate() {
        if !o.apis.contains(&api) {
            continue;
        }
        println!(
            "\nThe channel's own MB/s per core (hand-over copies taken out), {} calls ({}), against the raw AEAD's:",
            api.name(),
            api.calls()
        );
        let mut head = format!("  {:<18} {:<14} {:>9}", "suite", "protection", "raw AEAD");
        for &s in &o.sizes {
            head.push_str(&format!(
                " {:>16} {:>6} {:>15}",
                format!("channel {}", size_name(s)),
                "ratio",
                "with hand-over"
            ));
        }
        println!("{head}");
        for r in rows {
            let path = &r.paths[k];
            let mut line = format!(
                "  {:<18} {:<14} {:>9.0}",
                suite_name(r.suite),
                prot_name(r.protection),
                r.raw
            );
            for i in 0..o.sizes.len() {
                line.push_str(&format!(
                    " {:>16.0} {:>6.3} {:>15.0}",
                    path.own[i], path.ratio[i], path.with[i]
                ));
            }
            if r.suite == picked && r.protection == Protection::Encrypted && api == Api::Direct {
                line.push_str("   <- goal");
            }
            println!("{line}");
        }
    }
}

/// The fastest suite measured (encrypted raw AEAD) and whether `picked`
/// is it, in words; printed.
fn pick(rows: &[Row], picked: Suite) -> (Option<Suite>, &'static str) {
    let raw_of = |s: Suite| {
        rows.iter()
            .find(|r| r.suite == s && r.protection == Protection::Encrypted)
            .map_or(f64::NAN, |r| r.raw)
    };
    let measured: Vec<Suite> = Suite::ALL
        .into_iter()
        .filter(|s| !raw_of(*s).is_nan())
        .collect();
    let fastest = measured
        .iter()
        .copied()
        .max_by(|a, b| raw_of(*a).total_cmp(&raw_of(*b)));
    let pick_verdict = match fastest {
        _ if measured.len() < 2 => "not compared (one suite measured)",
        Some(f) if f == picked => "yes",
        _ => "NO",
    };
    println!(
        "\nSuite::fastest_here() picks {}; the faster raw AEAD (encrypted) measured here: {} ({}): the pick is the faster one: {pick_verdict}",
        suite_name(picked),
        fastest.map_or("?", suite_name),
        measured
            .iter()
            .map(|s| format!("{} {:.0} MB/s", suite_name(*s), raw_of(*s)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    (fastest, pick_verdict)
}

/// Prints the figures of the rounds and the goals' verdicts; returns them.
pub fn figures(o: &Config, cs: &[Contender], picked: Suite) -> Result<Figures> {
    print_contenders(o, cs);
    let rows = rows(o, cs)?;
    print_paths(o, &rows, picked);
    let (fastest, pick_verdict) = pick(&rows, picked);
    let goal_row = rows
        .iter()
        .find(|r| r.suite == picked && r.protection == Protection::Encrypted);
    let goal_raw = goal_row.map_or(f64::NAN, |r| r.raw);
    let path_of = |api: Api| {
        let k = Api::ALL.iter().position(|a| *a == api).unwrap_or(0);
        goal_row.map_or(Path::nan(o.sizes.len()), |r| r.paths[k].clone())
    };
    let direct = path_of(Api::Direct);
    let copying = path_of(Api::Copying);
    let ratio = direct.lowest();
    let copying_lowest = copying.lowest();
    let show = |p: &Path| {
        p.own
            .iter()
            .zip(&p.ratio)
            .zip(&o.sizes)
            .map(|((v, r), s)| format!("{v:.0} MB/s ({}, ratio {r:.3})", size_name(*s)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "result: {} encrypted, raw AEAD {goal_raw:.0} MB/s per core; channel, direct calls: {}: lowest ratio {ratio:.3} (goal ≥ {}: {}); copying calls (the agent's today): {}: lowest {copying_lowest:.3} ({})",
        suite_name(picked),
        show(&direct),
        GOAL.threshold,
        GOAL.verdict(ratio),
        show(&copying),
        GOAL_COPYING.verdict(copying_lowest),
    );
    Ok(Figures {
        rows,
        goal_raw,
        direct,
        copying,
        ratio,
        copying_lowest,
        fastest,
        pick_verdict,
    })
}

/// The result line.
pub fn line(
    o: &Config,
    picked: Suite,
    f: &Figures,
    tcp: &Json,
    regime_before: &str,
    regime_after: &str,
) -> Json {
    let mut all = Json::default();
    for r in &f.rows {
        let mut j = Json::default();
        j.num("raw_mb_s", r.raw, 0);
        for (api, p) in Api::ALL.iter().zip(&r.paths) {
            let n = api.name();
            j.nums(&format!("{n}_mb_s"), &p.own, 0)
                .nums(&format!("{n}_with_handover_mb_s"), &p.with, 0)
                .nums(&format!("{n}_ratio"), &p.ratio, 3);
        }
        all.raw(
            &format!("{}/{}", suite_name(r.suite), prot_name(r.protection)),
            &j.line(),
        );
    }
    let sizes: Vec<f64> = o.sizes.iter().map(|&s| s as f64).collect();
    let mut j = Json::bench("channel");
    j.str("suite", suite_name(picked))
        .num("raw_mb_s", f.goal_raw, 0)
        .nums("channel_mb_s", &f.direct.own, 0)
        .num("ratio", f.ratio, 3)
        .goal(&GOAL, f.ratio)
        .nums("ratios", &f.direct.ratio, 3)
        .nums("copying_mb_s", &f.copying.own, 0)
        .nums("copying_ratios", &f.copying.ratio, 3)
        .goal(&GOAL_COPYING, f.copying_lowest)
        .nums("sizes", &sizes, 0)
        .str("fastest_measured", f.fastest.map_or("?", suite_name))
        .str("pick_is_fastest", f.pick_verdict)
        .raw("all", &all.line())
        .raw("tcp", &tcp.line())
        .int("rounds", o.rounds as u64)
        .int("ms_per_round", o.budget.as_millis() as u64)
        .int("arena_bytes", o.arena as u64)
        .str("cpu", &sys::cpu_model())
        .str("cpu_flags", &cpu_flags())
        .str("regime_before", regime_before)
        .str("regime_after", regime_after);
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_as_low_as_its_lowest_ratio_and_unmeasured_when_a_size_is() {
        let p = Path {
            own: vec![1.0, 2.0],
            with: vec![1.0, 2.0],
            ratio: vec![0.9, 0.7],
        };
        assert_eq!(p.lowest(), 0.7);
        assert!(Path::nan(2).lowest().is_nan());
        assert_eq!(GOAL.verdict(p.lowest()), "NOT met");
        assert_eq!(GOAL.verdict(0.8), "met");
    }
}
