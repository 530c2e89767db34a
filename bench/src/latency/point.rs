//! One measured point of one loader, and how it is printed.

use std::fmt::Write as _;

use super::cpu::CpuUse;
use super::CONTENDED;
use crate::report::Json;

/// One measured point of one loader.
#[derive(Clone, Debug, Default)]
pub struct Point {
    pub samples_per_s: f64,
    pub mb_per_s: f64,
    /// Samples inside the window, and its length.
    pub samples: u64,
    pub window_s: f64,
    /// From the start (session open / process start) to the steady state
    /// (first batch / every worker busy).
    pub ramp_s: f64,
    pub cpu: CpuUse,
    /// Free-form details for the human-readable lines.
    pub note: String,
    /// Extra JSON fields (`"key":value,...`), without braces.
    pub json_extra: String,
    pub error: Option<String>,
    /// How long the run waited for the machine to be quiet before this
    /// measurement, and whether it was.
    pub quiet_wait_s: f64,
    pub started_quiet: bool,
    /// Every attempt: (samples/s, cores other processes took).
    pub attempts: Vec<(f64, f64)>,
    /// Every repeat's samples/s, when the point is the median of several.
    pub repeats: Vec<f64>,
}

impl Point {
    /// Samples per CPU-second SeaweedFS got: the rate with the store's
    /// share of a contended machine taken out.
    pub fn per_store_core(&self) -> f64 {
        if self.cpu.store > 0.0 {
            self.samples_per_s / self.cpu.store
        } else {
            f64::NAN
        }
    }

    pub fn failed(e: String) -> Point {
        Point {
            samples_per_s: f64::NAN,
            mb_per_s: f64::NAN,
            error: Some(e),
            ..Point::default()
        }
    }

    pub fn json(&self) -> String {
        let num = |v: f64, d: usize| {
            if v.is_finite() {
                format!("{v:.d$}")
            } else {
                "null".to_owned()
            }
        };
        let mut s = format!(
            "{{\"samples_per_s\":{},\"mb_per_s\":{},\"samples\":{},\"window_s\":{},\"ramp_s\":{},\"samples_per_store_core_s\":{},\"contended\":{},\"started_quiet\":{},\"quiet_wait_s\":{},\"cpu\":{}",
            num(self.samples_per_s, 1),
            num(self.mb_per_s, 2),
            self.samples,
            num(self.window_s, 2),
            num(self.ramp_s, 2),
            num(self.per_store_core(), 0),
            self.cpu.rest() > CONTENDED,
            self.started_quiet,
            num(self.quiet_wait_s, 1),
            self.cpu.json()
        );
        if self.attempts.len() > 1 {
            let list: Vec<String> = self
                .attempts
                .iter()
                .map(|(r, c)| format!("[{},{}]", num(*r, 1), num(*c, 2)))
                .collect();
            let _ = write!(
                s,
                ",\"attempts_rate_and_others_cores\":[{}]",
                list.join(",")
            );
        }
        if !self.repeats.is_empty() {
            let list: Vec<String> = self.repeats.iter().map(|r| num(*r, 1)).collect();
            let _ = write!(s, ",\"repeats_samples_per_s\":[{}]", list.join(","));
        }
        let us: Vec<String> = self
            .cpu
            .us_per_sample(self.samples_per_s)
            .iter()
            .map(|(k, v)| format!("\"{k}\":{}", num(*v, 1)))
            .collect();
        let _ = write!(s, ",\"cpu_us_per_sample\":{{{}}}", us.join(","));
        if !self.json_extra.is_empty() {
            s.push(',');
            s.push_str(&self.json_extra);
        }
        if let Some(e) = &self.error {
            let mut j = Json::default();
            j.str("error", e);
            let l = j.line();
            s.push(',');
            s.push_str(&l[1..l.len() - 1]);
        }
        s.push('}');
        s
    }
}

pub fn print_point(who: &str, p: &Point) {
    if let Some(e) = &p.error {
        println!("  {who}: FAILED: {e}");
        return;
    }
    println!(
        "  {who}: {:.1} samples/s ({:.1} MB/s), {} samples in {:.1} s, ramp {:.2} s{}",
        p.samples_per_s,
        p.mb_per_s,
        p.samples,
        p.window_s,
        p.ramp_s,
        if p.note.is_empty() {
            String::new()
        } else {
            format!("; {}", p.note)
        }
    );
    println!(
        "    CPU (cores): {}; {:.0} samples per store CPU-second; {}",
        p.cpu.line(),
        p.per_store_core(),
        if p.started_quiet {
            format!("started on a quiet machine after {:.0} s", p.quiet_wait_s)
        } else {
            format!("the machine was not quiet ({:.0} s waited)", p.quiet_wait_s)
        }
    );
    let us: Vec<String> = p
        .cpu
        .us_per_sample(p.samples_per_s)
        .iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect();
    println!("    CPU µs per delivered sample: {}", us.join(", "));
    if p.cpu.rest() > CONTENDED {
        println!(
            "    contended: other processes took {:.2} cores during this window",
            p.cpu.rest()
        );
    }
}
