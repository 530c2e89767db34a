//! The goals, the checks each attack adds to them, and the verdicts and
//! result line at the end.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Goal {
    /// A stranger, a relay or a tap reads 0 samples in clear and causes 0
    /// wrong samples.
    Clear,
    /// Floods: memory, loaders served, a legitimate peer within 5 s.
    Floods,
    /// Another uid's views are refused.
    Views,
    /// No loader times out.
    Timeouts,
}

pub(super) const GOALS: [(Goal, &str, &str); 4] = [
    (
        Goal::Clear,
        "clear",
        "a stranger, a relay or a tap reads 0 samples in clear and causes 0 wrong samples",
    ),
    (
        Goal::Floods,
        "floods",
        "floods leave the agent's memory <= 128 MiB above its baseline; its loaders keep being \
         served, and a legitimate peer gets blocks within 5 s",
    ),
    (Goal::Views, "views", "another uid's views are refused"),
    (Goal::Timeouts, "timeouts", "no loader times out"),
];

pub(super) struct Check {
    pub(super) goal: Goal,
    pub(super) ok: bool,
    pub(super) what: String,
}

#[derive(Default)]
pub(super) struct Report {
    pub(super) checks: Vec<Check>,
    pub(super) not_run: Vec<(Goal, String)>,
    pub(super) json: Vec<(String, String)>,
}

impl Report {
    pub(super) fn check(&mut self, goal: Goal, ok: bool, what: String) {
        println!("    [{}] {what}", if ok { "ok" } else { "NOT MET" });
        self.checks.push(Check { goal, ok, what });
    }

    pub(super) fn section(&mut self, key: &str, j: &Json) {
        self.json.push((key.to_owned(), j.line()));
    }
}

pub(super) fn finish(
    ctx: &Ctx,
    r: &mut Report,
    regime: &str,
    started: Instant,
    error: Option<String>,
) -> bool {
    println!("\n== loaders over the whole run");
    let mut samples = 0;
    let mut wrong = 0;
    let mut timeouts = 0;
    let mut errors = Vec::new();
    let mut longest = Duration::ZERO;
    for l in &ctx.retired {
        let st = &l.stats;
        samples += st.samples.load(Ordering::Relaxed);
        wrong += st.wrong.load(Ordering::Relaxed);
        timeouts += st.timeouts.load(Ordering::Relaxed);
        if let Ok(e) = st.errors.lock() {
            errors.extend(e.iter().map(|(_, w)| format!("{}: {w}", l.name)));
        }
        if let Ok(b) = st.batches.lock() {
            longest = longest.max(b.iter().map(|x| x.1).max().unwrap_or_default());
        }
    }
    println!(
        "  {} loaders: {samples} samples with every byte checked, {wrong} wrong, {timeouts} \
         timeouts, {} errors, longest wait for a batch {:.2} s",
        ctx.retired.len(),
        errors.len(),
        longest.as_secs_f64()
    );
    for e in errors.iter().take(5) {
        println!("    {e}");
    }
    r.check(
        Goal::Clear,
        wrong == 0 && samples > 0,
        format!("the loaders received {wrong} wrong samples of {samples}"),
    );
    r.check(
        Goal::Timeouts,
        timeouts == 0 && errors.is_empty() && samples > 0,
        format!(
            "no loader timed out or failed: {timeouts} timeouts, {} errors{}",
            errors.len(),
            errors
                .first()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        ),
    );
    if let Some(e) = &error {
        for (g, _, _) in GOALS {
            r.checks.push(Check {
                goal: g,
                ok: false,
                what: format!("the run stopped before the end: {e}"),
            });
        }
    }
    println!("\n== goals");
    let mut goals = Json::default();
    let mut all_met = true;
    for (g, key, text) in GOALS {
        let checks: Vec<&Check> = r.checks.iter().filter(|c| c.goal == g).collect();
        let not_run = r.not_run.iter().find(|(x, _)| *x == g);
        let failed: Vec<&str> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.what.as_str())
            .collect();
        let verdict = if !failed.is_empty() {
            "not met"
        } else if let Some((_, why)) = not_run {
            println!("  {text}: NOT RUN ({why})");
            goals.raw(
                key,
                &Json::default()
                    .str("verdict", "not run")
                    .str("why", why)
                    .line(),
            );
            continue;
        } else if checks.is_empty() {
            "not met"
        } else {
            "met"
        };
        all_met &= verdict == "met";
        println!(
            "  {text}: {}",
            if verdict == "met" { "met" } else { "NOT MET" }
        );
        for f in &failed {
            println!("    because: {f}");
        }
        let mut why = String::new();
        for f in &failed {
            if !why.is_empty() {
                why.push_str("; ");
            }
            let _ = write!(why, "{f}");
        }
        goals.raw(
            key,
            &Json::default()
                .str("verdict", verdict)
                .str("why", &why)
                .line(),
        );
    }
    let mut j = Json::bench(if ctx.opts.smoke {
        "attacks-smoke"
    } else {
        "attacks"
    });
    j.raw("goals", &goals.line())
        .int("samples", ctx.spec.num_files)
        .int("loaders_per_agent", u64::from(ctx.opts.loaders))
        .int("flood_connections", ctx.opts.flood)
        .int("flood_ips", u64::from(ctx.opts.flood_ips));
    for (k, v) in &r.json {
        j.raw(k, v);
    }
    j.raw(
        "loaders",
        &Json::default()
            .int("samples", samples)
            .int("wrong", wrong)
            .int("timeouts", timeouts)
            .int("errors", errors.len() as u64)
            .num("longest_wait_s", longest.as_secs_f64(), 2)
            .line(),
    )
    .str("error", error.as_deref().unwrap_or(""))
    .num("seconds", started.elapsed().as_secs_f64(), 0)
    .str("regime", regime);
    println!("{}", j.line());
    all_met && error.is_none()
}
