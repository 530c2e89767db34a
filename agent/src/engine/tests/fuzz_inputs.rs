//! Every committed input of the `agent/session` cargo-fuzz target (its
//! seeds and regressions) run as the target runs it, on the stable build:
//! CI replays them here instead of building the target with sanitizers
//! (docs/testing.md). A broken promise panics inside the script.

use crate::config::fuzz_tests::committed_fuzz_inputs;
use crate::engine::loader_script;

#[test]
fn the_session_fuzz_targets_committed_inputs_keep_every_promise() {
    let inputs = committed_fuzz_inputs("session");
    assert!(
        inputs.len() >= 100,
        "the session target's seeds and regressions are committed ({} found)",
        inputs.len()
    );
    let (mut opened, mut refused) = (0, 0);
    for (path, bytes) in &inputs {
        let o = std::panic::catch_unwind(|| loader_script::from_bytes(bytes))
            .unwrap_or_else(|_| panic!("{} broke a promise", path.display()));
        opened += o.opened;
        refused += o.refused;
    }
    println!(
        "session fuzz inputs: {} replayed, {opened} hostile sessions opened, {refused} refused",
        inputs.len()
    );
    assert!(opened > 0, "the inputs open hostile sessions");
}
