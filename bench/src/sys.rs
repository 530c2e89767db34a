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
