//! Summary statistics and the JSON object every benchmark prints last.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

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

/// A flat JSON object built key by key, in insertion order.
///
/// Numbers that are not finite are written as `null`.
#[derive(Default)]
pub struct Json {
    body: String,
}

impl Json {
    /// An object whose first key is `"bench": name`.
    pub fn bench(name: &str) -> Json {
        let mut j = Json::default();
        j.str("bench", name);
        j
    }

    fn key(&mut self, key: &str) {
        if !self.body.is_empty() {
            self.body.push(',');
        }
        push_str(&mut self.body, key);
        self.body.push(':');
    }

    /// Adds a number rounded to `decimals` places.
    pub fn num(&mut self, key: &str, value: f64, decimals: usize) -> &mut Json {
        self.key(key);
        if value.is_finite() {
            let _ = write!(self.body, "{value:.decimals$}");
        } else {
            self.body.push_str("null");
        }
        self
    }

    /// Adds an integer.
    pub fn int(&mut self, key: &str, value: u64) -> &mut Json {
        self.key(key);
        let _ = write!(self.body, "{value}");
        self
    }

    /// Adds an array of numbers, each rounded to `decimals` places
    /// (`null` for those that are not finite).
    pub fn nums(&mut self, key: &str, values: &[f64], decimals: usize) -> &mut Json {
        self.key(key);
        self.body.push('[');
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                self.body.push(',');
            }
            if v.is_finite() {
                let _ = write!(self.body, "{v:.decimals$}");
            } else {
                self.body.push_str("null");
            }
        }
        self.body.push(']');
        self
    }

    /// Adds a value that is already JSON text (an object or array built
    /// elsewhere); the caller vouches for its syntax.
    pub fn raw(&mut self, key: &str, json: &str) -> &mut Json {
        self.key(key);
        self.body.push_str(json);
        self
    }

    /// Adds a string.
    pub fn str(&mut self, key: &str, value: &str) -> &mut Json {
        self.key(key);
        push_str(&mut self.body, value);
        self
    }

    /// The object as one line of text.
    pub fn line(&self) -> String {
        format!("{{{}}}", self.body)
    }
}

/// A number field of a flat JSON line (what the Python loaders print):
/// `None` when the key is missing or its value is not a number.
pub fn json_num(line: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let at = line.find(&pat)? + pat.len();
    let rest = line[at..].trim_start();
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
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

fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
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
            .raw("f", "{\"g\":1}");
        assert_eq!(
            j.line(),
            r#"{"bench":"ring","a":1.23,"b":7,"c":"x\"y","d":null,"e":[1.0,null,2.3],"f":{"g":1}}"#
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
    }
}
