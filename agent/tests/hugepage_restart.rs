//! An agent whose arena must be on hugepages (`arena.hugepages =
//! "required"`) is killed (SIGKILL) and restarted while a loader reads, on a
//! hugepage pool that holds one arena but not two. The restarted agent can
//! only start once the loader has let go of the old arena's mapping: the
//! loader (libgranary's resume) unmaps it as soon as it notices the agent is
//! gone, the agent starts, the loader resumes and reads every sample of both
//! epochs once, and when it closes the pool is back where it was.
//!
//! Needs root (it sizes the pool through /proc/sys/vm/nr_hugepages and
//! restores it afterwards); elsewhere it says loudly that it did not run.

mod common;

use common::*;
use granary::Client;
use granary_testkit::{GranarydConfig, GranarydProcess, Log};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
const ARENA_MIB: u64 = 64;

fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/meminfo"))
}

/// Hugepages the pool can give now.
fn available() -> u64 {
    meminfo("HugePages_Free") - meminfo("HugePages_Rsvd")
}

/// Puts the pool's size back when the test ends.
struct PoolGuard(String);

impl Drop for PoolGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, &self.0);
    }
}

/// Sizes the pool so that `pages` are available; `Err` says why not.
fn size_pool(pages: u64) -> Result<PoolGuard, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let old = std::fs::read_to_string(NR_HUGEPAGES).map_err(|e| format!("{NR_HUGEPAGES}: {e}"))?;
    let guard = PoolGuard(old.trim().to_owned());
    let total = meminfo("HugePages_Total");
    let want = total - available() + pages;
    std::fs::write(NR_HUGEPAGES, want.to_string())
        .map_err(|e| format!("writing {want} to {NR_HUGEPAGES}: {e}"))?;
    let got = available();
    if got != pages {
        return Err(format!(
            "asked for {pages} available hugepages, the kernel gave {got}"
        ));
    }
    Ok(guard)
}

/// Starts `granaryd`; `Err` with its log when it exits before its socket
/// answers.
fn start_agent(config: &Path, sock: &Path, log: &Path) -> Result<GranarydProcess, String> {
    let sock = sock.to_owned();
    GranarydProcess::spawn(
        GranarydConfig::run(env!("CARGO_BIN_EXE_granaryd"), config)
            .env("RUST_LOG", "warn")
            .log(Log::File(log.to_owned()))
            .timeout(Duration::from_secs(30))
            .ready_when(move || Client::connect(&sock).is_ok()),
    )
}

#[test]
fn a_restarted_agent_gets_its_hugepages_back_from_a_resuming_loader() {
    let _w = watchdog_fn!(180);
    let page_kib = meminfo("Hugepagesize");
    let arena_pages = ARENA_MIB * 1024 / page_kib;
    // One arena and a half: never two.
    let pool = arena_pages * 3 / 2;
    let _pool = granary_testkit::require_ok!(
        size_pool(pool),
        "no hugepage pool; an agent restart on hugepages was NOT tested"
    );
    let d = AgentDir::new(None, 400, 4_000);
    d.write_config(
        &format!("{ARENA_MIB}MiB"),
        "required",
        "[metrics]\naddress = \"\"",
    );
    let (sock, spec, config) = (&d.sock, &d.spec, &d.config);
    let log: PathBuf = d.dir.path().join("granaryd.log");
    let first = start_agent(config, sock, &log).unwrap_or_else(|e| panic!("first start: {e}"));
    assert!(
        available() < arena_pages,
        "the agent's arena is not on the pool ({} pages still available)",
        available()
    );

    // The loader: two epochs, a pause per batch, no batch held across calls.
    let batches = Arc::new(AtomicU64::new(0));
    let loader = {
        let batches = Arc::clone(&batches);
        resuming_loader(sock, DATASET, spec, (16, 2, 3), move || {
            batches.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(5));
        })
    };
    wait_for(
        "the loader's first batches",
        Duration::from_secs(30),
        || batches.load(Ordering::Relaxed) >= 5,
    );
    drop(first); // SIGKILL
    let killed_at = batches.load(Ordering::Relaxed);

    // Restart as systemd would (Restart=on-failure, RestartSec shortened):
    // until the pool can hold the new arena, granaryd refuses to start.
    let refused = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let second = loop {
        match start_agent(config, sock, &log) {
            Ok(a) => break a,
            Err(e) => {
                refused.lock().expect("lock").push(e);
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "granaryd could not start again within 30 s: {:?}",
                    refused.lock().expect("lock").last()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let restarted_after = t0.elapsed();
    let (seen, resumes) = loader.join().expect("the loader");
    for (epoch, ids) in seen.into_iter().enumerate() {
        let mut ids = ids;
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..spec.num_files).collect::<Vec<_>>(),
            "epoch {epoch}: every sample once"
        );
    }
    assert_eq!(resumes, 1, "the loader resumed once");
    let refusals = refused.lock().expect("lock").clone();
    for r in &refusals {
        assert!(
            r.contains("hugepage"),
            "a start failed for another reason: {r}"
        );
    }
    drop(second);
    wait_for(
        "the pool to be whole again",
        Duration::from_secs(10),
        || available() == pool,
    );
    eprintln!(
        "hugepage restart: {arena_pages} pages an arena, pool {pool}; killed after {killed_at} batches; \
         restarted after {restarted_after:?} ({} refused start(s)); the loader resumed once and read both epochs",
        refusals.len()
    );
}
