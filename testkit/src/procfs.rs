//! What `/proc` says about a process.

/// The field `name` (`VmRSS`, `RssAnon`, … : a size in kB) of
/// `/proc/<pid>/status`, in bytes; `pid` is a process id or `self`.
/// Panics when the process or the field is not there.
pub fn status_bytes(pid: &str, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("/proc/{pid}/status: no {name} in kB"));
    kb * 1024
}
