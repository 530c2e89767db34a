//! Cost of the peer channel: bytes/s per core of blocks moved through an established `Conn` pair (seal, open, copies) beside the raw AEAD's (one seal and one open of a record), per suite and protection; and over loopback TCP.
//!
//! The benchmark is `granary_bench::channel` (`bench/src/channel/`); this
//! binary parses its options ([`granary_bench::channel::Options`]).

use std::process::ExitCode;

use granary_bench::{channel, cli};

fn main() -> ExitCode {
    cli::bench_main("bench/run channel", channel::run)
}
