//! Fuzzes whole loader sessions against the engine
//! (`granary_agent::engine::loader_script`): the fuzzer's bytes are the
//! choices of a loader script (hostile sessions that open with odd batch
//! sizes, hoard, release twice, forge releases, fall silent, close) beside
//! an honest session. The engine never fails a turn, its invariant check
//! holds after every turn, the honest session gets every sample once per
//! epoch byte for byte, and nothing stays pinned at the end: any broken
//! promise panics.
#![no_main]

use granary_agent::engine::loader_script;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    loader_script::from_bytes(data);
});
