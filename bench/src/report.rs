//! Summary statistics and the JSON object every benchmark prints last.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Median of `values` (mean of the two middle values for an even count);
/// `NaN` when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `p`-th percentile (0–100, nearest rank) of `sorted`, which must be
/// sorted ascending; `None` when empty.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// How a measured value is held against its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// Met when the value is at least the threshold.
    AtLeast,
    /// Met when the value is at most the threshold.
    AtMost,
}

/// A benchmark's goal, declared once: the JSON key its verdict is printed
/// under, the threshold and the direction. A value that is not a number
/// (a side that did not run) never meets it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Goal {
    /// The JSON key of the verdict (`"met"` or `"NOT met"`).
    pub key: &'static str,
    /// The threshold the value is held against.
    pub threshold: f64,
    /// The direction.
    pub cmp: Cmp,
}

impl Goal {
    /// Met when the value is `>= threshold`.
    pub const fn at_least(key: &'static str, threshold: f64) -> Goal {
        Goal {
            key,
            threshold,
            cmp: Cmp::AtLeast,
        }
    }

    /// Met when the value is `<= threshold`.
    pub const fn at_most(key: &'static str, threshold: f64) -> Goal {
        Goal {
            key,
            threshold,
            cmp: Cmp::AtMost,
        }
    }

    /// Whether `value` meets the goal.
    pub fn met(&self, value: f64) -> bool {
        match self.cmp {
            Cmp::AtLeast => value >= self.threshold,
            Cmp::AtMost => value <= self.threshold,
        }
    }

    /// `"met"`, `"NOT met"`, or `"not measured"` when `value` is not a
    /// number.
    pub fn verdict(&self, value: f64) -> &'static str {
        if value.is_nan() {
            "not measured"
        } else {
            verdict(self.met(value))
        }
    }

    /// The rule as text, e.g. `≥ 0.95`.
    pub fn rule(&self) -> String {
        let op = match self.cmp {
            Cmp::AtLeast => '≥',
            Cmp::AtMost => '≤',
        };
        format!("{op} {}", self.threshold)
    }
}

/// The verdict every benchmark prints: `"met"` or `"NOT met"`.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// A flat JSON object built key by key, in insertion order, and written
/// by `serde_json`.
///
/// Numbers that are not finite are written as `null`.
#[derive(Default)]
pub struct Json {
    fields: Vec<(String, Field)>,
}

/// One value of a [`Json`] object.
enum Field {
    /// Written by `serde_json`.
    Value(Value),
    /// JSON text built elsewhere, written as it is (its keys keep their
    /// order).
    Raw(String),
}

impl Json {
    /// An object whose first key is `"bench": name`.
    pub fn bench(name: &str) -> Json {
        let mut j = Json::default();
        j.str("bench", name);
        j
    }

    fn put(&mut self, key: &str, value: Value) -> &mut Json {
        self.fields.push((key.to_owned(), Field::Value(value)));
        self
    }

    /// Adds a number rounded to `decimals` places.
    pub fn num(&mut self, key: &str, value: f64, decimals: usize) -> &mut Json {
        self.put(key, rounded(value, decimals))
    }

    /// Adds an integer.
    pub fn int(&mut self, key: &str, value: u64) -> &mut Json {
        self.put(key, Value::from(value))
    }

    /// Adds an array of numbers, each rounded to `decimals` places
    /// (`null` for those that are not finite).
    pub fn nums(&mut self, key: &str, values: &[f64], decimals: usize) -> &mut Json {
        let v = values.iter().map(|&x| rounded(x, decimals)).collect();
        self.put(key, Value::Array(v))
    }

    /// Adds a value that is already JSON text (an object or array built
    /// elsewhere), written as it is so that its keys keep their order; text
    /// that does not parse as JSON is added as a string.
    pub fn raw(&mut self, key: &str, json: &str) -> &mut Json {
        if serde_json::from_str::<serde::de::IgnoredAny>(json).is_ok() {
            self.fields
                .push((key.to_owned(), Field::Raw(json.to_owned())));
            self
        } else {
            self.put(key, Value::from(json))
        }
    }

    /// Adds a string.
    pub fn str(&mut self, key: &str, value: &str) -> &mut Json {
        self.put(key, Value::from(value))
    }

    /// Adds a goal's verdict for `value` under the goal's key.
    pub fn goal(&mut self, goal: &Goal, value: f64) -> &mut Json {
        self.str(goal.key, goal.verdict(value))
    }

    /// The object as one line of text: keys and values written by
    /// `serde_json`, in the order they were added; raw values as given.
    pub fn line(&self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k).unwrap_or_default());
            out.push(':');
            match v {
                Field::Value(v) => out.push_str(&v.to_string()),
                Field::Raw(text) => out.push_str(text.trim()),
            }
        }
        out.push('}');
        out
    }
}

/// `value` rounded to `decimals` places, or `null` when not finite.
fn rounded(value: f64, decimals: usize) -> Value {
    if !value.is_finite() {
        return Value::Null;
    }
    let scale = 10f64.powi(decimals.min(15) as i32);
    let r = (value * scale).round() / scale;
    if decimals == 0 && r.abs() < 9.0e15 {
        // Whole numbers print as integers, as `{:.0}` would.
        return Value::from(r as i64);
    }
    serde_json::Number::from_f64(if r.is_finite() { r } else { value })
        .map_or(Value::Null, Value::Number)
}

/// A number field of a JSON line: the key at the top level, else the first
/// one found in a nested object (depth first, in key order); `None` when the
/// line is not JSON, the key is missing or its value is not a number.
pub fn json_num(line: &str, key: &str) -> Option<f64> {
    find_num(&serde_json::from_str::<Value>(line).ok()?, key)
}

fn find_num(v: &Value, key: &str) -> Option<f64> {
    let obj = v.as_object()?;
    if let Some(x) = obj.get(key) {
        return x.as_f64();
    }
    obj.values().find_map(|x| find_num(x, key))
}

/// Draws a plot with a Python `script` run as `python script - out`, the
/// benchmark's result line on its stdin.
pub fn draw(python: &str, script: &Path, line: &str, out: &Path) -> Result<(), String> {
    draw_with(python, script, line, out, &[])
}

/// [`draw`] with more arguments after the output path.
pub fn draw_with(
    python: &str,
    script: &Path,
    line: &str,
    out: &Path,
    more: &[&str],
) -> Result<(), String> {
    let mut child = Command::new(python)
        .arg(script)
        .arg("-")
        .arg(out)
        .args(more)
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{python} {}: {e}", script.display()))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(line.as_bytes())
        .map_err(|e| e.to_string())?;
    let status = child.wait().map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} exited with {status}", script.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn json_line() {
        let mut j = Json::bench("ring");
        j.num("a", 1.23456, 2)
            .int("b", 7)
            .str("c", "x\"y")
            .num("d", f64::NAN, 1)
            .nums("e", &[1.0, f64::INFINITY, 2.26], 1)
            .num("h", 99.6, 0)
            .raw("f", "{\"g\":1}");
        assert_eq!(
            j.line(),
            r#"{"bench":"ring","a":1.23,"b":7,"c":"x\"y","d":null,"e":[1.0,null,2.3],"h":100,"f":{"g":1}}"#
        );
    }
    #[test]
    fn goals_say_met_or_not() {
        let g = Goal::at_least("goal", 0.95);
        assert!(g.met(0.95) && !g.met(0.9499) && !g.met(f64::NAN));
        assert_eq!((g.verdict(1.0), g.verdict(0.5)), ("met", "NOT met"));
        assert_eq!(g.verdict(f64::NAN), "not measured");
        let m = Goal::at_most("goal_idle", 0.02);
        assert!(m.met(0.02) && !m.met(0.021) && !m.met(f64::NAN));
        assert_eq!(
            (g.rule(), m.rule()),
            ("≥ 0.95".to_owned(), "≤ 0.02".to_owned())
        );
        let mut j = Json::bench("x");
        j.goal(&g, 0.96).goal(&m, 0.5);
        assert_eq!(
            j.line(),
            r#"{"bench":"x","goal":"met","goal_idle":"NOT met"}"#
        );
    }

    #[test]
    fn numbers_are_read_from_a_json_line() {
        let line = r#"{"workers": 8, "samples_per_s": 74.5, "ramp_s": 1e-3, "torch": "2.1"}"#;
        assert_eq!(json_num(line, "workers"), Some(8.0));
        assert_eq!(json_num(line, "samples_per_s"), Some(74.5));
        assert_eq!(json_num(line, "ramp_s"), Some(0.001));
        assert_eq!(json_num(line, "missing"), None);
        assert_eq!(json_num(line, "torch"), None);
        let nested = r#"{"a": 1, "tcp": {"b_per_core": 2.5}, "c": [3]}"#;
        assert_eq!(json_num(nested, "b_per_core"), Some(2.5));
        // Raw objects keep their keys' order.
        let mut j = Json::default();
        j.raw("o", r#"{"z":1,"a":2}"#).raw("bad", "{nope");
        assert_eq!(j.line(), r#"{"o":{"z":1,"a":2},"bad":"{nope"}"#);
        assert_eq!(json_num(nested, "c"), None);
        assert_eq!(json_num("not json", "a"), None);
    }
}
