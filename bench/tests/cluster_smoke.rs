//! The cluster benchmark's smoke variant as a test: two node namespaces and
//! a store namespace, 2,048 samples, three epochs with peers, asserting only
//! the invariants — every consumer received exactly its plan at every step
//! (nothing lost, nothing duplicated, every byte verified) and the store
//! was read at most 1.01 times the dataset in epoch 0 and at most 1 % of it
//! in each later epoch.
//!
//! It needs root (network namespaces, `tc`), so it is `#[ignore]`d and
//! `scripts/test.sh` runs it in its "tests that need root" step; run by
//! hand: `cargo nextest run --release -p granary-bench --test cluster_smoke
//! --run-ignored only` (as root, after `cargo build --release -p
//! granary-agent --bin granaryd`).

use granary_bench::smoke::{result_line, run_bounded};
use std::process::Command;
use std::time::Duration;

#[test]
#[ignore = "needs root for network namespaces and tc; scripts/test.sh runs it when it runs as root"]
fn two_nodes_lose_nothing_and_read_the_store_once() {
    // SAFETY: geteuid has no preconditions and only returns a number.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "two_nodes_lose_nothing_and_read_the_store_once needs root (network namespaces, tc)"
    );
    let out_dir =
        std::env::temp_dir().join(format!("granary-cluster-smoke-{}", std::process::id()));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cluster"));
    cmd.args(["--smoke", "--out"]).arg(&out_dir);
    let (status, stdout) = run_bounded(cmd, Duration::from_secs(600));
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(
        status.success(),
        "the smoke run failed ({status}):\n{stdout}"
    );
    let last = result_line(&stdout, "cluster-smoke");
    assert!(last.contains("\"invariants\":\"hold\""), "{last}");
    assert!(
        last.contains("\"lost\":0,\"duplicated\":0,\"bad_bytes\":0,\"errors\":0"),
        "{last}"
    );
}
