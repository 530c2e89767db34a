//! Which CPU a thread runs on, sampled now and then, and what the samples of
//! two processes say about where they ran relative to each other.
//!
//! The CPU number is field 39 (`processor`) of `/proc/thread-self/stat`, the
//! same value `sched_getcpu(3)` returns. Reading it costs a few microseconds,
//! so benchmarks sample it outside their timed inner loops or rarely.

use std::collections::BTreeMap;
use std::fmt;

/// The CPU the calling thread last ran on, or `None` if `/proc` cannot tell.
pub fn current_cpu() -> Option<u32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // The command name (field 2) is in parentheses and may contain spaces;
    // fields after the last ')' start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(39 - 3)?.parse().ok()
}

/// The number of CPUs this process may run on (what `nproc` prints).
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A histogram of the CPUs one thread was seen on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSamples {
    counts: BTreeMap<u32, u64>,
    last: Option<u32>,
    moves: u64,
}

impl CpuSamples {
    /// Samples the calling thread's CPU now.
    pub fn sample(&mut self) {
        if let Some(cpu) = current_cpu() {
            self.record(cpu);
        }
    }

    /// Records that the thread was seen on `cpu`.
    pub fn record(&mut self, cpu: u32) {
        *self.counts.entry(cpu).or_default() += 1;
        if self.last.is_some_and(|l| l != cpu) {
            self.moves += 1;
        }
        self.last = Some(cpu);
    }

    /// Number of samples.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Times consecutive samples differed (a lower bound on migrations).
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// The CPU seen most often and its share of the samples.
    pub fn dominant(&self) -> Option<(u32, f64)> {
        let total = self.total();
        self.counts
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(cpu, n)| (*cpu, *n as f64 / total as f64))
    }

    /// Compact text form `cpu:count,...;moves`, for the peer line protocol.
    pub fn encode(&self) -> String {
        let hist: Vec<String> = self
            .counts
            .iter()
            .map(|(c, n)| format!("{c}:{n}"))
            .collect();
        format!("{};{}", hist.join(","), self.moves)
    }

    /// Parses [`CpuSamples::encode`]'s output.
    pub fn decode(s: &str) -> Option<CpuSamples> {
        let (hist, moves) = s.split_once(';')?;
        let mut out = CpuSamples {
            moves: moves.parse().ok()?,
            ..CpuSamples::default()
        };
        for pair in hist.split(',').filter(|p| !p.is_empty()) {
            let (c, n) = pair.split_once(':')?;
            out.counts.insert(c.parse().ok()?, n.parse().ok()?);
        }
        Some(out)
    }
}

impl fmt::Display for CpuSamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hist: Vec<String> = self
            .counts
            .iter()
            .map(|(c, n)| format!("cpu{c}×{n}"))
            .collect();
        write!(f, "{}", hist.join(" "))?;
        if self.moves > 0 {
            write!(f, " ({} moves)", self.moves)?;
        }
        Ok(())
    }
}

/// Where two processes ran relative to each other during one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Each stayed on its own CPU (≥ 90 % of samples), and the CPUs differ.
    Distinct {
        /// The first process's CPU.
        a: u32,
        /// The second process's CPU.
        b: u32,
    },
    /// Both mostly ran on the same CPU (time-sharing it).
    Shared {
        /// The common CPU.
        cpu: u32,
    },
    /// At least one moved between CPUs, or there were no samples.
    Mixed,
}

impl Placement {
    /// Classifies two sample sets.
    pub fn of(a: &CpuSamples, b: &CpuSamples) -> Placement {
        match (a.dominant(), b.dominant()) {
            (Some((ca, sa)), Some((cb, sb))) if sa >= 0.9 && sb >= 0.9 => {
                if ca == cb {
                    Placement::Shared { cpu: ca }
                } else {
                    Placement::Distinct { a: ca, b: cb }
                }
            }
            _ => Placement::Mixed,
        }
    }

    /// A short label: `distinct`, `shared` or `mixed`.
    pub fn label(&self) -> &'static str {
        match self {
            Placement::Distinct { .. } => "distinct",
            Placement::Shared { .. } => "shared",
            Placement::Mixed => "mixed",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Distinct { a, b } => write!(f, "distinct cpu{a}/cpu{b}"),
            Placement::Shared { cpu } => write!(f, "shared cpu{cpu}"),
            Placement::Mixed => write!(f, "mixed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_cpu() {
        let cpu = current_cpu().expect("/proc/thread-self/stat");
        assert!((cpu as usize) < 4096);
    }

    #[test]
    fn encode_decode_and_classify() {
        let mut a = CpuSamples::default();
        for c in [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1] {
            a.record(c);
        }
        assert_eq!(a.moves(), 1);
        let back = CpuSamples::decode(&a.encode()).unwrap();
        assert_eq!(back.counts, a.counts);
        assert_eq!(back.moves, 1);
        let mut b = CpuSamples::default();
        b.record(1);
        assert_eq!(Placement::of(&a, &b), Placement::Distinct { a: 0, b: 1 });
        let mut c = CpuSamples::default();
        c.record(0);
        assert_eq!(Placement::of(&a, &c), Placement::Shared { cpu: 0 });
        assert_eq!(Placement::of(&a, &CpuSamples::default()), Placement::Mixed);
        assert_eq!(CpuSamples::decode(";0"), Some(CpuSamples::default()));
    }
}
