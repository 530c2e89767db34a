//! The machine around a benchmark: dropping the page cache, who we run as,
//! and how busy the CPUs were.

use std::io::Write as _;
use std::process::Command;

/// Whether the process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // `id -u` rather than a libc call: no unsafe code for one number.
    Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .is_some_and(|s| s.trim() == "0")
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches`: writes dirty pages back, then
/// drops clean page-cache pages, dentries and inodes. Needs root.
pub fn drop_caches() -> Result<(), String> {
    let _ = Command::new("sync").status();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .map_err(|e| format!("cannot open /proc/sys/vm/drop_caches: {e}"))?;
    f.write_all(b"3\n")
        .map_err(|e| format!("cannot write /proc/sys/vm/drop_caches: {e}"))
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Extra 2 MiB huge pages reserved in `/proc/sys/vm/nr_hugepages` for the
/// life of this value; the old count is written back when it is dropped.
#[derive(Debug)]
pub struct HugepageReservation {
    old: u64,
    /// The count the kernel reports after the request (it may reserve fewer
    /// than asked when memory is fragmented).
    pub now: u64,
}

impl HugepageReservation {
    /// Raises `nr_hugepages` by `extra` pages. Needs root.
    pub fn reserve(extra: u64) -> Result<HugepageReservation, String> {
        let old = read_nr_hugepages()?;
        std::fs::write(NR_HUGEPAGES, format!("{}\n", old + extra))
            .map_err(|e| format!("cannot write {NR_HUGEPAGES}: {e}"))?;
        let now = read_nr_hugepages()?;
        Ok(HugepageReservation { old, now })
    }

    /// The count before the reservation.
    pub fn old(&self) -> u64 {
        self.old
    }
}

impl Drop for HugepageReservation {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(NR_HUGEPAGES, format!("{}\n", self.old)) {
            eprintln!(
                "WARNING: cannot restore {NR_HUGEPAGES} to {}: {e}",
                self.old
            );
        }
    }
}

fn read_nr_hugepages() -> Result<u64, String> {
    std::fs::read_to_string(NR_HUGEPAGES)
        .map_err(|e| format!("cannot read {NR_HUGEPAGES}: {e}"))?
        .trim()
        .parse()
        .map_err(|e| format!("{NR_HUGEPAGES}: {e}"))
}

/// The 1-minute load average, if `/proc/loadavg` can be read.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Processes other than this one that used noticeable CPU time recently,
/// as `ps` reports them (command names only), for the record.
pub fn busy_neighbours() -> Vec<String> {
    let me = std::process::id().to_string();
    let Ok(out) = Command::new("ps")
        .args(["-eo", "pid=,pcpu=,comm=", "--sort=-pcpu"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (pid, cpu, comm) = (f.next()?, f.next()?, f.next()?);
            let cpu: f64 = cpu.parse().ok()?;
            (pid != me && cpu >= 5.0).then(|| format!("{comm}({cpu:.0}%)"))
        })
        .take(6)
        .collect()
}

/// One line about the CPU regime: online CPUs, load average, busy neighbours.
pub fn regime() -> String {
    let cpus = crate::cpu::online_cpus();
    let load = load_average().map_or("?".to_owned(), |l| format!("{l:.2}"));
    let others = busy_neighbours();
    format!(
        "{cpus} CPUs online, load average {load}, other busy processes: {}",
        if others.is_empty() {
            "none".to_owned()
        } else {
            others.join(" ")
        }
    )
}

/// CPU time consumed so far by each thread of this process, by thread name
/// (`/proc/self/task/*/comm` and the first field of `schedstat`, in ns).
pub fn thread_cpu() -> Vec<(String, std::time::Duration)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in dir.flatten() {
        let p = t.path();
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        if let Some(ns) = ns {
            out.push((name.trim().to_owned(), std::time::Duration::from_nanos(ns)));
        }
    }
    out
}

/// CPU time of the threads named `name` (0 if none).
pub fn cpu_of(snapshot: &[(String, std::time::Duration)], name: &str) -> std::time::Duration {
    snapshot
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, d)| *d)
        .sum()
}

/// The calling thread's name as `/proc` shows it (`comm`).
pub fn thread_name() -> String {
    std::fs::read_to_string("/proc/thread-self/comm")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// CPU time consumed by the calling thread, exact to the nanosecond
/// (`CLOCK_THREAD_CPUTIME_ID`; `/proc`'s figure for a running thread lags
/// by up to a scheduler tick).
pub fn own_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes one timespec through the pointer,
    // which points at a live, exclusively borrowed local.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// The aggregate line of `/proc/stat`, in clock ticks: what the whole
/// machine did, read at two moments and compared with [`MachineCpu::since`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineCpu {
    busy: u64,
    softirq: u64,
    steal: u64,
    total: u64,
}

impl MachineCpu {
    /// The counters now (zeros when `/proc/stat` cannot be read).
    pub fn read() -> MachineCpu {
        let Ok(s) = std::fs::read_to_string("/proc/stat") else {
            return MachineCpu::default();
        };
        let Some(line) = s.lines().next() else {
            return MachineCpu::default();
        };
        let v: Vec<u64> = line
            .split_ascii_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal guest guest_nice
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        MachineCpu {
            busy: get(0) + get(1) + get(2) + get(5) + get(6),
            softirq: get(6),
            steal: get(7),
            total: (0..8).map(get).sum(),
        }
    }

    /// (busy, softirq, stolen) cores since `earlier`.
    pub fn since(&self, earlier: &MachineCpu) -> (f64, f64, f64) {
        let total = self.total.saturating_sub(earlier.total) as f64;
        if total == 0.0 {
            return (0.0, 0.0, 0.0);
        }
        let cpus = crate::cpu::online_cpus() as f64;
        let share = |a: u64, b: u64| a.saturating_sub(b) as f64 / total * cpus;
        (
            share(self.busy, earlier.busy),
            share(self.softirq, earlier.softirq),
            share(self.steal, earlier.steal),
        )
    }
}

/// Waits until the machine has been quiet (under 0.2 busy cores) for 2 s,
/// at most `limit`; returns how long it waited and whether it got there.
pub fn wait_quiet(limit: std::time::Duration) -> (std::time::Duration, bool) {
    let t = std::time::Instant::now();
    loop {
        let a = MachineCpu::read();
        std::thread::sleep(std::time::Duration::from_secs(2));
        let (busy, _, _) = MachineCpu::read().since(&a);
        if busy < 0.2 {
            return (t.elapsed(), true);
        }
        if t.elapsed() >= limit {
            return (t.elapsed(), false);
        }
    }
}

/// CPU time (user + system) of process `pid`, all its threads.
pub fn process_cpu(pid: u32) -> std::time::Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return std::time::Duration::ZERO;
    };
    let Some(end) = stat.rfind(')') else {
        return std::time::Duration::ZERO;
    };
    let f: Vec<&str> = stat[end + 1..].split_ascii_whitespace().collect();
    // Fields 14 and 15 (utime, stime); f[0] is field 3.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
        .sum();
    let hz = clock_ticks_per_s();
    std::time::Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz)
}

/// The CPU's model name from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The pid, the parent's pid and the CPU time in clock ticks (user +
/// system, all threads) of one `/proc/PID/stat` text.
pub fn parse_stat(stat: &str) -> Option<(u32, u32, u64)> {
    let pid = stat.split_ascii_whitespace().next()?.parse().ok()?;
    // The command name (field 2) is in parentheses and may hold anything.
    let f: Vec<&str> = stat[stat.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .collect();
    // f[0] is field 3 (state), f[1] field 4 (ppid), f[11], f[12] fields 14
    // and 15 (utime, stime), f[13], f[14] fields 16 and 17 (cutime, cstime:
    // the children it has waited for, such as a worker's finished `curl`,
    // whose CPU would otherwise vanish from a tree's sum when they exit).
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let reaped: u64 = [13, 14]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<i64>().ok())
        .map(|t| t.max(0) as u64)
        .sum();
    Some((pid, ppid, ticks + reaped))
}

/// CPU time (user + system) of process `root` and of every descendant alive
/// now (a DataLoader's workers, their threads included), and of the
/// descendants that exited and were waited for by a process of the tree.
pub fn tree_cpu(root: u32) -> std::time::Duration {
    let mut procs: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if !e
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
            {
                continue;
            }
            if let Some(p) = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
            {
                procs.push(p);
            }
        }
    }
    std::time::Duration::from_nanos(
        subtree_ticks(&procs, root).saturating_mul(1_000_000_000) / clock_ticks_per_s(),
    )
}

/// Ticks of `root` and its descendants among `procs` (pid, ppid, ticks).
pub fn subtree_ticks(procs: &[(u32, u32, u64)], root: u32) -> u64 {
    let mut inside = vec![root];
    let mut total = 0;
    let mut i = 0;
    while i < inside.len() {
        let pid = inside[i];
        for &(p, pp, t) in procs {
            if p == pid {
                total += t;
            }
            if pp == pid && p != pid && !inside.contains(&p) {
                inside.push(p);
            }
        }
        i += 1;
    }
    total
}

fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse() {
        let line =
            "4242 (pt worker (2)) S 4200 4242 1 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 3 0 1 1 1";
        assert_eq!(parse_stat(line), Some((4242, 4200, 175)));
        let waited =
            "4242 (pt worker (2)) S 4200 4242 1 0 -1 4194560 100 0 0 0 150 25 30 12 20 0 3 0 1 1 1";
        assert_eq!(parse_stat(waited), Some((4242, 4200, 217)));
        assert_eq!(parse_stat("12 (x) S"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn subtrees_sum_descendants_only() {
        let procs = [
            (1, 0, 5),
            (10, 1, 100),
            (11, 10, 7),
            (12, 10, 3),
            (20, 1, 1000),
        ];
        assert_eq!(subtree_ticks(&procs, 10), 110);
        assert_eq!(subtree_ticks(&procs, 11), 7);
        assert_eq!(subtree_ticks(&procs, 99), 0);
        assert_eq!(subtree_ticks(&procs, 1), 1115);
    }
}
