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
//! * [`delay_proxy`]: a TCP proxy adding latency in each direction (and an
//!   optional bandwidth cap) without breaking pipelining.
#![warn(missing_docs)]

pub mod baseline;
pub mod cpu;
pub mod delay_proxy;
pub mod peer;
pub mod report;
