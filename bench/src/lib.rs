//! # granary-bench: Granary's benchmarks
//!
//! Every benchmark is one binary under `src/bin/` and runs as
//! `bench/run NAME [args]`. Each prints human-readable lines and, as its last
//! line, one JSON object (see [`report::Json`]). Benchmarks that need a second
//! process re-execute their own binary in a peer role ([`peer`]).
//!
//! Shared pieces:
//! * [`peer`]: spawn the current binary as a peer process that receives a
//!   shared-memory fd as its stdin and talks back over a line protocol.
//! * [`cpu`]: which CPU a thread runs on, sampled, and the resulting regime.
//! * [`baseline`]: a minimal SPSC ring used as a yardstick for granary's ring.
//! * [`report`]: medians, percentiles and the final JSON line.
#![warn(missing_docs)]

pub mod baseline;
pub mod cpu;
pub mod peer;
pub mod report;
