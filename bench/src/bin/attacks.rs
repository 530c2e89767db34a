//! Attacks on the peer tier by a stranger, a relay, a tap, flooding peers and another uid, against two release granaryd on loopback: what leaks, what breaks, what it costs
//!
//! The benchmark is `granary_bench::attacks` (`bench/src/attacks/`); this
//! binary parses its options ([`granary_bench::attacks::Options`]), or runs
//! the other uid's loader when re-executed as one (`--views-stranger SOCK`).
//! Exit status: 0 every goal met, 1 a goal not met, 2 the run failed.

use std::path::Path;

use clap::Parser;
use granary_bench::attacks;

/// bench/run attacks [options]
#[derive(Parser, Debug)]
#[command(
    name = "bench/run attacks",
    about,
    long_about = None,
    after_help = "Runs as any user; another uid's views are tried only as root (else reported \
                  as not run). Needs granaryd next to this binary (bench/run builds it)."
)]
struct Cli {
    #[command(flatten)]
    options: attacks::Options,
}

fn main() {
    if let Some(pos) = std::env::args().position(|a| a == "--views-stranger") {
        let sock = std::env::args().nth(pos + 1).unwrap_or_default();
        std::process::exit(attacks::views_child(Path::new(&sock)));
    }
    match attacks::run(&Cli::parse().options) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("attacks: {e}");
            std::process::exit(2);
        }
    }
}
