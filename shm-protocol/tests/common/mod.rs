//! Helpers shared by the integration tests.
//!
//! The watchdog, which turns a deadlock into a failure, is
//! `granary_testkit::watchdog`.
#![allow(dead_code)]

/// SplitMix64 (granary-base): the generator and its finaliser, for test data.
#[allow(unused_imports)] // not every suite uses both
pub use granary_base::hash::{mix64 as mix, SplitMix64 as SplitMix};

/// A seed that differs from run to run (time and pid), printed by callers so
/// a failure can be replayed.
pub fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    mix(t ^ (u64::from(std::process::id()) << 32))
}
