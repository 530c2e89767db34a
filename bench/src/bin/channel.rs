//! Cost of the peer channel: bytes/s per core of blocks moved through an established `Conn` pair (seal, open, copies) beside the raw AEAD's (one seal and one open of a record), per suite and protection; and over loopback TCP.
//!
//! The benchmark is `granary_bench::channel` (`bench/src/channel/`); this
//! binary parses its options ([`granary_bench::channel::Options`]).

use std::process::ExitCode;

use clap::Parser;
use granary_bench::channel;

/// bench/run channel [options]
#[derive(Parser, Debug)]
#[command(name = "bench/run channel", about, long_about = None)]
struct Cli {
    #[command(flatten)]
    options: channel::Options,
}

fn main() -> ExitCode {
    match channel::run(&Cli::parse().options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("channel: {e}");
            ExitCode::FAILURE
        }
    }
}
