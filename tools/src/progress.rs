//! A small text progress bar for long operations (dataset generation,
//! ingest).
//!
//! On a terminal it redraws one line in place, at most ten times a second:
//!
//! ```text
//! generating [############............] 12034/20000 60% 85 MB/s ETA 3s
//! ```
//!
//! When the output is not a terminal (a log file, CI) it prints the same line
//! as a plain line every five seconds instead, plus a final line.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

/// Width of the bar between the brackets, in characters.
const BAR_WIDTH: usize = 24;
/// Shortest time between two redraws on a terminal.
const TTY_INTERVAL: Duration = Duration::from_millis(100);
/// Time between two plain lines when the output is not a terminal.
const PLAIN_INTERVAL: Duration = Duration::from_secs(5);

/// A progress bar over `total` items that also reports a byte rate.
pub struct ProgressBar {
    label: String,
    total: u64,
    start: Instant,
    last_draw: Option<Instant>,
    tty: bool,
    out: Box<dyn Write + Send>,
    finished: bool,
}

impl ProgressBar {
    /// A bar drawn on standard error, in place when it is a terminal and as
    /// periodic plain lines otherwise. `label` may be empty.
    pub fn new(label: &str, total: u64) -> ProgressBar {
        let tty = io::stderr().is_terminal();
        Self::to_writer(label, total, Box::new(io::stderr()), tty)
    }

    /// A bar drawn on `out`; `tty` selects in-place redrawing.
    pub fn to_writer(
        label: &str,
        total: u64,
        out: Box<dyn Write + Send>,
        tty: bool,
    ) -> ProgressBar {
        ProgressBar {
            label: label.to_owned(),
            total,
            start: Instant::now(),
            last_draw: None,
            tty,
            out,
            finished: false,
        }
    }

    /// Reports `done` items and `bytes` bytes so far; redraws when due.
    pub fn update(&mut self, done: u64, bytes: u64) {
        let now = Instant::now();
        let due = match (self.tty, self.last_draw) {
            (true, None) => true,
            (true, Some(t)) => now.duration_since(t) >= TTY_INTERVAL,
            (false, last) => now.duration_since(last.unwrap_or(self.start)) >= PLAIN_INTERVAL,
        };
        if due {
            self.last_draw = Some(now);
            let line = self.line(done, bytes, now.duration_since(self.start), false);
            self.emit(&line, false);
        }
    }

    /// Draws the final state and ends the line. Later calls do nothing.
    pub fn finish(&mut self, done: u64, bytes: u64) {
        if self.finished {
            return;
        }
        self.finished = true;
        let line = self.line(done, bytes, self.start.elapsed(), true);
        self.emit(&line, true);
    }

    fn line(&self, done: u64, bytes: u64, elapsed: Duration, finished: bool) -> String {
        let body = render(done, self.total, bytes, elapsed, finished);
        if self.label.is_empty() {
            body
        } else {
            format!("{} {body}", self.label)
        }
    }

    fn emit(&mut self, line: &str, last: bool) {
        // Progress output is best effort: a closed stderr must not fail the work.
        let _ = if self.tty {
            write!(self.out, "\r{line}\x1b[K{}", if last { "\n" } else { "" })
        } else {
            writeln!(self.out, "{line}")
        };
        let _ = self.out.flush();
    }
}

impl Drop for ProgressBar {
    fn drop(&mut self) {
        if self.tty && self.last_draw.is_some() && !self.finished {
            let _ = writeln!(self.out);
            let _ = self.out.flush();
        }
    }
}

/// Renders one progress line without a label:
/// `[#####.......] 12034/20000 60% 85 MB/s ETA 3s`, or with `finished`,
/// `… 100% 85 MB/s in 26s`.
pub fn render(done: u64, total: u64, bytes: u64, elapsed: Duration, finished: bool) -> String {
    let frac = if total == 0 {
        1.0
    } else {
        (done.min(total) as f64) / (total as f64)
    };
    let filled = ((frac * BAR_WIDTH as f64) as usize).min(BAR_WIDTH);
    let bar = format!("{}{}", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled));
    let pct = (frac * 100.0).floor() as u64;
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 {
        format_rate(bytes as f64 / secs)
    } else {
        "-- MB/s".to_owned()
    };
    let tail = if finished {
        format!("in {}", format_duration(secs))
    } else if done == 0 || secs <= 0.0 {
        "ETA --".to_owned()
    } else {
        let left = total.saturating_sub(done) as f64 * secs / done as f64;
        format!("ETA {}", format_duration(left))
    };
    format!("[{bar}] {done}/{total} {pct}% {rate} {tail}")
}

fn format_rate(bytes_per_s: f64) -> String {
    let mb = bytes_per_s / 1e6;
    if mb >= 10_000.0 {
        format!("{:.1} GB/s", mb / 1000.0)
    } else if mb >= 10.0 {
        format!("{mb:.0} MB/s")
    } else {
        format!("{mb:.1} MB/s")
    }
}

/// `3s`, `1m05s`, `2h03m`.
fn format_duration(secs: f64) -> String {
    let s = if secs.is_finite() {
        secs.round().max(0.0) as u64
    } else {
        0
    };
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn renders_bar_rate_and_eta() {
        let line = render(
            12_034,
            20_000,
            85_000_000 * 4,
            Duration::from_secs(4),
            false,
        );
        assert_eq!(
            line,
            "[##############..........] 12034/20000 60% 85 MB/s ETA 3s"
        );
        let line = render(20_000, 20_000, 2_200_000_000, Duration::from_secs(26), true);
        assert_eq!(
            line,
            "[########################] 20000/20000 100% 85 MB/s in 26s"
        );
        let line = render(0, 10, 0, Duration::ZERO, false);
        assert_eq!(line, "[........................] 0/10 0% -- MB/s ETA --");
        assert!(render(5, 0, 0, Duration::from_secs(1), false).contains("100%"));
        assert!(render(99, 10, 0, Duration::from_secs(1), false).contains("100%"));
    }

    #[test]
    fn durations_and_rates() {
        assert_eq!(format_duration(3.4), "3s");
        assert_eq!(format_duration(65.0), "1m05s");
        assert_eq!(format_duration(7380.0), "2h03m");
        assert_eq!(format_duration(f64::INFINITY), "0s");
        assert_eq!(format_rate(2.5e6), "2.5 MB/s");
        assert_eq!(format_rate(3.2e10), "32.0 GB/s");
    }

    #[test]
    fn tty_redraws_in_place_and_throttles() {
        let sink = Sink::default();
        let mut bar = ProgressBar::to_writer("gen", 1000, Box::new(sink.clone()), true);
        for i in 0..1000 {
            bar.update(i, i * 100);
        }
        bar.finish(1000, 100_000);
        bar.finish(1000, 100_000);
        let text = sink.text();
        let draws = text.matches('\r').count();
        assert!((2..=10).contains(&draws), "{draws} redraws: {text:?}");
        assert!(text.starts_with("\rgen ["), "{text:?}");
        assert!(text.ends_with("\x1b[K\n"), "{text:?}");
        assert_eq!(text.matches('\n').count(), 1);
        assert!(text.contains("1000/1000 100%"), "{text:?}");
    }

    #[test]
    fn plain_output_prints_lines() {
        let sink = Sink::default();
        let mut bar = ProgressBar::to_writer("", 10, Box::new(sink.clone()), false);
        for i in 0..10 {
            bar.update(i, i);
        }
        bar.finish(10, 10);
        let text = sink.text();
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(
            text.starts_with("[########################] 10/10 100%"),
            "{text:?}"
        );
    }
}
