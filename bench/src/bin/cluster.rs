//! multi-node cluster: node namespaces and a far store (veth, bridge, tbf, delay proxy), peers on/off, a peer killed, corrupted blocks, a slow link (root)
//!
//! The benchmark is `granary_bench::cluster` (`bench/src/cluster/`); this
//! binary parses its options ([`granary_bench::cluster::Options`]), or runs
//! a role inside a namespace (`--role store|node`, internal).

use std::process::ExitCode;

use clap::Parser;
use granary_bench::cluster::{self, Options, Outcome};

/// bench/run cluster [options] (as root). Defaults in brackets.
#[derive(Parser, Debug)]
#[command(name = "bench/run cluster", about, long_about = None)]
struct Cli {
    #[command(flatten)]
    options: Options,
    /// Remove namespaces and links left by a killed run, then exit.
    #[arg(long)]
    cleanup: bool,
}

/// Prints `said` to stdout (`Ok`) or stderr (`Err`); its exit status.
fn said(r: Result<String, String>) -> ExitCode {
    match r {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--role") {
        let role = args.get(1).cloned().unwrap_or_default();
        // Nothing more on stdout: the role speaks a line protocol there.
        return match cluster::run_role(&role, args.into_iter().skip(2).collect()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => said(Err(format!("cluster {role}: {e}"))),
        };
    }
    let c = Cli::parse();
    if c.cleanup {
        return said(cluster::cleanup());
    }
    if let Err(e) = cluster::check(&c.options) {
        eprintln!("cluster: {e}");
        return ExitCode::from(2);
    }
    match cluster::run(&c.options) {
        Ok(Outcome::Held) => ExitCode::SUCCESS,
        Ok(Outcome::Broken) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cluster: {e}");
            ExitCode::FAILURE
        }
    }
}
