//! A hundred loaders (`GRANARY_SOAK_KILL_ROUNDS` rounds: `scripts/soak.sh`
//! runs a thousand) killed with SIGKILL mid-epoch, one after another, while
//! an honest loader keeps reading: the honest loader gets every sample of
//! its share exactly once per epoch with verified content, and once the
//! agent has noticed every death its arena accounting, sessions and file
//! descriptors are back to where they started.
//!
//! The loaders are child processes running this same test binary in the
//! `kill-child` role (see [`kill_loop_child`]); the engine runs in a thread
//! of the test process, so `/proc/self/fd` is the agent's descriptor table.

mod common;

use common::*;
use granary::{Client, ErrorCode, SessionOptions};
use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_FN: &str = "kill_loop_child";
const ROLE: &str = "kill-child";
/// Printed by a child once it holds batches on loan.
const HOLDING: &str = "GRANARY-CHILD-HOLDING";
/// Rounds when `GRANARY_SOAK_KILL_ROUNDS` does not say.
const DEFAULT_ROUNDS: usize = 100;

/// The number of rounds: `GRANARY_SOAK_KILL_ROUNDS`, else [`DEFAULT_ROUNDS`].
fn rounds() -> usize {
    match std::env::var("GRANARY_SOAK_KILL_ROUNDS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("GRANARY_SOAK_KILL_ROUNDS={v:?} is not a count")),
        Err(_) => DEFAULT_ROUNDS,
    }
}

/// The child role: open a session with parameters drawn from the seed, keep
/// a few batches on loan (never fewer than two once announced), release the
/// older ones, and go on until killed.
#[test]
#[ignore = "child process entry point of the kill loop; not a test on its own"]
fn kill_loop_child() {
    let role = expect_child_role(CHILD_FN);
    assert_eq!(role, ROLE);
    let seed: u64 = std::env::var(SEED_VAR)
        .expect("child: seed")
        .parse()
        .expect("child: numeric seed");
    let mut rng = Rng(seed);
    let client = Client::connect(child_socket()).expect("child: connect");
    let mut o = SessionOptions::new(DATASET);
    o.seed = seed;
    o.batch_size = 4 + rng.below(12) as u32;
    o.world_size = 1 + rng.below(3) as u32;
    o.rank = rng.below(u64::from(o.world_size)) as u32;
    o.epoch_count = 2;
    let mut s = client.open_session(&o).expect("child: open session");
    let hold = 2 + rng.below(4) as usize;
    let mut held = VecDeque::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut announced = false;
    while Instant::now() < deadline {
        let b = match s.next_batch(Some(Duration::from_secs(30))) {
            Ok(b) => b,
            Err(e) if e.code() == ErrorCode::EndOfStream => {
                // Ran through every epoch: keep holding until killed.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => panic!("child: next_batch: {e}"),
        };
        if let Some(first) = b.sample(0) {
            granary_tools::synth::verify_sample(&first.to_vec()).expect("child: sample content");
        }
        held.push_back(b);
        while held.len() > hold {
            let old = held.pop_front().expect("non-empty");
            s.release(old).expect("child: release");
        }
        if !announced && held.len() >= 2 {
            println!("{HOLDING}");
            announced = true;
        }
        std::thread::sleep(Duration::from_millis(rng.below(3)));
    }
    panic!("child: nobody killed me within two minutes");
}

#[test]
fn kill_minus_nine_loop_leaks_nothing() {
    let rounds = rounds();
    let _wd = watchdog("kill_loop", 240 + 2 * rounds as u64);
    let started = Instant::now();
    println!("kill_loop: {rounds} rounds");
    // ~72 MB of samples against a 64 MiB arena: evictions go on and reads
    // are in flight while loaders die.
    let agent = TestAgent::start(AgentOptions {
        files: 3000,
        classes: 30,
        mean_size: 24_000,
        ..AgentOptions::default()
    });
    let idle = agent.wait_idle(Duration::from_secs(10));
    idle.assert_balanced();
    let fds_before = fd_kinds(&open_fds());
    println!("kill_loop: agent descriptors at start: {fds_before:?}");
    assert!(session_memfds().is_empty());

    let stop = Arc::new(AtomicBool::new(false));
    let honest = agent.spawn_honest(
        Honest {
            rank: 1,
            world_size: 2,
            ..Honest::until_stopped(7, 16, Duration::from_millis(1))
        },
        &stop,
    );

    let seed = time_seed();
    println!("kill_loop: seed {seed}");
    let mut rng = Rng(seed);
    let mut killed_holding = 0u64;
    let mut children_killed = 0;
    for i in 0..rounds {
        // Every fifth round a second loader dies alongside the first.
        let count = if i % 5 == 0 { 2 } else { 1 };
        let mut round = Vec::new();
        for _ in 0..count {
            let mut cmd = child_command(CHILD_FN, ROLE, &agent.sock);
            cmd.env(SEED_VAR, rng.next_u64().to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            round.push(cmd.spawn().expect("spawn a loader child"));
        }
        // One round in ten dies at an arbitrary moment (maybe mid-handshake);
        // the others once they hold batches, a few milliseconds later.
        let mut _readers = Vec::new();
        if i % 10 == 3 {
            std::thread::sleep(Duration::from_millis(rng.below(40)));
        } else {
            for (k, child) in round.iter_mut().enumerate() {
                let lines = wait_for_line(child, HOLDING, &format!("loader child {i}.{k}"));
                killed_holding += 1;
                _readers.push(lines);
            }
            std::thread::sleep(Duration::from_millis(rng.below(15)));
        }
        for (k, mut child) in round.into_iter().enumerate() {
            child.kill().expect("SIGKILL the child");
            let st = child.wait().expect("reap the child");
            assert_eq!(
                st.signal(),
                Some(libc::SIGKILL),
                "loader child {i}.{k} did not die of SIGKILL: {st:?}"
            );
            children_killed += 1;
        }
        assert!(agent.alive(), "the agent died at iteration {i}");
        assert!(
            !honest.is_finished(),
            "the honest loader stopped early (iteration {i})"
        );
    }
    let loop_time = started.elapsed();

    stop.store(true, Ordering::Relaxed);
    let epochs = honest.join().expect("honest loader");
    assert!(epochs >= 1, "the honest loader finished no epoch");

    // Every death noticed: each loader killed while holding batches was
    // counted as lost, and every session has ended.
    let m = &agent.metrics;
    wait_for(
        "the agent to notice every death",
        Duration::from_secs(20),
        || m.loaders_lost.get() >= killed_holding && m.sessions_open.get() == 0,
    );
    let after = agent.wait_idle(Duration::from_secs(20));
    after.assert_balanced();
    assert_eq!(after.pinned, 0, "{after:?}");
    assert_eq!(after.in_flight, 0, "{after:?}");
    assert_eq!(m.sessions_open.get(), 0);
    assert_eq!(
        m.violations.get(),
        0,
        "an honest or killed loader counted as a violation"
    );
    assert!(m.sessions_opened.get() > killed_holding);
    assert_fds_back_to(&fds_before);

    // Still serving: a fresh session gets a full, verified epoch.
    let stop_now = AtomicBool::new(true);
    let h = Honest {
        world_size: 3,
        ..Honest::epochs(99, 32, 1)
    };
    assert_eq!(honest_loader(&agent.sock, &agent.spec, h, &stop_now), 1);
    agent.wait_idle(Duration::from_secs(10)).assert_balanced();
    assert_fds_back_to(&fds_before);

    println!(
        "kill_loop: {children_killed} kills in {rounds} rounds ({killed_holding} holding \
         batches) in {loop_time:.1?} ({:.0} kills/s), \
         honest loader verified {epochs} epoch(s), loaders lost {}, total {:.1?}",
        f64::from(children_killed) / loop_time.as_secs_f64(),
        m.loaders_lost.get(),
        started.elapsed()
    );
    agent.stop();
}
