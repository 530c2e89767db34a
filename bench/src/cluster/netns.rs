//! Network namespaces for the cluster benchmark: one namespace per node and
//! one for the store, each joined to a bridge of the root namespace by a
//! veth pair whose two ends are rate-limited with `tc qdisc … tbf` (the
//! host end shapes what the namespace receives, the inner end what it
//! sends). Addresses live only inside the namespaces (`10.77.0.0/24`); the
//! bridge has none, so nothing of the root namespace is reachable from
//! them and nothing in them is reachable from it except through `ip netns
//! exec` and path-named Unix sockets.
//!
//! Every name starts with one prefix. [`Net::create`] refuses to start when
//! any of its names already exists (another run, or the leftovers of one
//! that was killed with SIGKILL: remove them with `--cleanup`), and
//! [`teardown`] removes everything it made — processes still running in the
//! namespaces are killed first. [`Net`] calls it on drop, and
//! [`on_interrupt`] on SIGINT, SIGTERM and SIGHUP.
//!
//! Needs root, `ip` and `tc` (iproute2). `tc netem` is not used: latency
//! comes from the delay proxy in front of the store.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The subnet's first three octets.
const SUBNET: [u8; 3] = [10, 77, 0];
/// The host part of the store's address.
const STORE_HOST: u8 = 100;

/// What to build.
#[derive(Clone, Debug)]
pub struct NetSpec {
    /// Prefix of every name (namespaces `PREFIX-n0…`, `PREFIX-store`,
    /// bridge `PREFIX-br`, veths `PREFIX-n0h` / `PREFIX-n0i`); at most 6
    /// characters so veth names fit in 15.
    pub prefix: String,
    /// Node namespaces.
    pub nodes: usize,
    /// Rate of each node's link, each direction, in Mbit/s.
    pub node_mbit: u32,
    /// Rate of the store's link, each direction, in Mbit/s.
    pub store_mbit: u32,
}

/// The namespaces, the bridge and the links of one run; removed on drop.
#[derive(Debug)]
pub struct Net {
    spec: NetSpec,
}

/// Runs `cmd`, turning a failure into an error naming the command and
/// quoting its stderr.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<String, String> {
    run(Command::new("ip").args(args))
}

/// The namespace of node `k`.
pub fn node_ns(prefix: &str, k: usize) -> String {
    format!("{prefix}-n{k}")
}

/// The store's namespace.
pub fn store_ns(prefix: &str) -> String {
    format!("{prefix}-store")
}

/// The address of node `k` (inside its namespace).
pub fn node_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], 10 + k as u8)
}

/// The store's address (inside its namespace).
pub fn store_ip() -> Ipv4Addr {
    Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], STORE_HOST)
}

fn bridge(prefix: &str) -> String {
    format!("{prefix}-br")
}

/// The (host, inner) veth names of namespace suffix `tag` (`n0`, `st`).
fn veths(prefix: &str, tag: &str) -> (String, String) {
    (format!("{prefix}-{tag}h"), format!("{prefix}-{tag}i"))
}

/// Every namespace and link of `prefix` that exists now.
pub fn existing(prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let ns = ip(&["netns", "list"]).unwrap_or_default();
    for line in ns.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(&format!("{prefix}-")) {
            found.push(format!("namespace {name}"));
        }
    }
    let links = ip(&["-o", "link", "show"]).unwrap_or_default();
    for line in links.lines() {
        // "7: NAME@peer: <...>" or "7: NAME: <...>"
        let name = line
            .split(':')
            .nth(1)
            .map(|s| s.trim().split('@').next().unwrap_or_default().to_owned())
            .unwrap_or_default();
        if name.starts_with(&format!("{prefix}-")) {
            found.push(format!("link {name}"));
        }
    }
    found
}

/// Kills every process in namespace `ns` (SIGKILL), then waits (up to 5 s)
/// for them to be gone.
fn kill_inside(ns: &str) {
    for _ in 0..50 {
        let pids = ip(&["netns", "pids", ns]).unwrap_or_default();
        let pids: Vec<i32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        let mut kill = Command::new("kill");
        kill.arg("-KILL").args(pids.iter().map(i32::to_string));
        let _ = run(&mut kill);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Removes every namespace (killing what runs in it) and link of `prefix`.
/// Idempotent; errors are ignored (there is nothing better to do on the way
/// out), and what could not be removed is returned.
pub fn teardown(prefix: &str) -> Vec<String> {
    let ns = ip(&["netns", "list"]).unwrap_or_default();
    for line in ns.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(&format!("{prefix}-")) {
            kill_inside(name);
            let _ = ip(&["netns", "del", name]);
        }
    }
    // Deleting a namespace deletes the veth ends inside it, and with them
    // their host ends; the bridge and any half-made pair remain.
    for left in existing(prefix) {
        if let Some(link) = left.strip_prefix("link ") {
            let _ = ip(&["link", "del", link]);
        }
    }
    existing(prefix)
}

/// `tc qdisc replace … root tbf` on `dev` (in namespace `ns`, or the root
/// one): `mbit` Mbit/s, a burst of 20 ms at that rate (at least 64 KiB, so
/// a segmentation-offloaded packet always fits), 100 ms of queue.
fn shape(ns: Option<&str>, dev: &str, mbit: u32) -> Result<(), String> {
    let burst = (u64::from(mbit) * 1_000_000 / 8 / 50).max(64 * 1024);
    let rate = format!("{mbit}mbit");
    let burst = format!("{burst}b");
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    args.extend([
        "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst", &burst, "latency",
        "100ms",
    ]);
    run(Command::new("tc").args(&args)).map(|_| ())
}

impl Net {
    /// Builds the namespaces, the bridge and the shaped links; refuses when
    /// any name of the prefix exists. Half-built state is removed on error.
    pub fn create(spec: NetSpec) -> Result<Net, String> {
        if spec.prefix.is_empty() || spec.prefix.len() > 6 {
            return Err(format!(
                "namespace prefix {:?} must be 1 to 6 characters",
                spec.prefix
            ));
        }
        if spec.nodes == 0 || spec.nodes > 64 {
            return Err(format!("{} nodes: must be 1 to 64", spec.nodes));
        }
        let there = existing(&spec.prefix);
        if !there.is_empty() {
            return Err(format!(
                "refusing to start: {} already exist{} ({}); another run is using them, or one \
                 was killed before it could clean up (remove them with `--cleanup`)",
                there.len(),
                if there.len() == 1 { "s" } else { "" },
                there.join(", ")
            ));
        }
        let net = Net { spec };
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> Result<(), String> {
        let p = &self.spec.prefix;
        let br = bridge(p);
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&["link", "set", &br, "up"])?;
        let mut ends: Vec<(String, String, Ipv4Addr, u32)> = (0..self.spec.nodes)
            .map(|k| {
                (
                    node_ns(p, k),
                    format!("n{k}"),
                    node_ip(k),
                    self.spec.node_mbit,
                )
            })
            .collect();
        ends.push((store_ns(p), "st".into(), store_ip(), self.spec.store_mbit));
        for (ns, tag, addr, mbit) in &ends {
            let (host, inner) = veths(p, tag);
            ip(&["netns", "add", ns])?;
            ip(&[
                "link", "add", &host, "type", "veth", "peer", "name", &inner, "netns", ns,
            ])?;
            ip(&["link", "set", &host, "master", &br, "up"])?;
            ip(&["-n", ns, "link", "set", &inner, "name", "eth0"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            shape(None, &host, *mbit)?;
            shape(Some(ns), "eth0", *mbit)?;
        }
        Ok(())
    }

    /// The prefix of every name.
    pub fn prefix(&self) -> &str {
        &self.spec.prefix
    }

    /// Sets node `k`'s link to `mbit` Mbit/s in both directions.
    pub fn set_node_rate(&self, k: usize, mbit: u32) -> Result<(), String> {
        let p = &self.spec.prefix;
        let (host, _) = veths(p, &format!("n{k}"));
        shape(None, &host, mbit)?;
        shape(Some(&node_ns(p, k)), "eth0", mbit)
    }

    /// A command that runs `program` inside namespace `ns`
    /// (`ip netns exec`, which execs it: the child's pid is the program's).
    pub fn exec(ns: &str, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let left = teardown(&self.spec.prefix);
        if !left.is_empty() {
            eprintln!("cluster: could not remove {}", left.join(", "));
        }
    }
}

/// What [`on_interrupt`] removes: a prefix and a directory.
static CLEANUP: Mutex<Option<(String, PathBuf)>> = Mutex::new(None);

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (call it before
/// any other thread starts, so every thread inherits the mask; children
/// get a clean mask from `Command`) and starts a thread that waits for one
/// of them, then removes the namespaces of `prefix` and the directory
/// `dir` and exits with status 130.
pub fn on_interrupt(prefix: &str, dir: &Path) -> Result<(), String> {
    *CLEANUP.lock().unwrap_or_else(|p| p.into_inner()) = Some((prefix.to_owned(), dir.into()));
    // SAFETY: sigset_t is plain data, for which all zeroes is a valid
    // value; sigemptyset initialises it right below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live local the call only writes.
    unsafe { libc::sigemptyset(&mut set) };
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `set` is an initialised set and `s` a valid signal number.
        unsafe { libc::sigaddset(&mut set, s) };
    }
    // SAFETY: `set` is an initialised signal set; the old mask is not asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(format!(
            "blocking signals: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    std::thread::Builder::new()
        .name("cluster-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is an initialised signal set blocked in every
            // thread; sigwait writes one int through a pointer to a live local.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc != 0 {
                return;
            }
            eprintln!("\ncluster: signal {sig}: removing the namespaces and exiting");
            let what = CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some((prefix, dir)) = what {
                let left = teardown(&prefix);
                if !left.is_empty() {
                    eprintln!("cluster: could not remove {}", left.join(", "));
                }
                let _ = std::fs::remove_dir_all(dir);
            }
            std::process::exit(130);
        })
        .map_err(|e| format!("signal thread: {e}"))?;
    Ok(())
}
