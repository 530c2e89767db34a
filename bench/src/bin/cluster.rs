//! multi-node cluster: node namespaces and a far store (veth, bridge, tbf, delay proxy), peers on/off, a peer killed, corrupted blocks, a slow link (root)
//!
//! The benchmark is `granary_bench::cluster` (`bench/src/cluster/`); this
//! binary parses its options, or runs a role inside a namespace
//! (`--role store|node`, internal).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use granary_bench::cli::num;
use granary_bench::cluster::{self, Options, Outcome};

/// bench/run cluster [options] (as root). Defaults in brackets.
#[derive(Parser, Debug)]
#[command(name = "bench/run cluster", about, long_about = None)]
struct Cli {
    /// Samples in the dataset [4096; the size is 16384].
    #[arg(long, value_parser = num::<u64>)]
    samples: Option<u64>,
    /// Mean sample size in KiB [64].
    #[arg(long, value_parser = num::<u64>)]
    mean_kib: Option<u64>,
    /// Log-normal sigma of the sizes [0: all the same size; the variant: --mean-kib 107 --sigma 0.5].
    #[arg(long)]
    sigma: Option<f64>,
    /// Epochs per scenario [3].
    #[arg(long, value_parser = num::<u32>)]
    epochs: Option<u32>,
    /// Batch size per rank [32; in relaunch each rank's after the loss, before it B x (nodes - 1) / nodes: B must be divisible by --nodes].
    #[arg(long, value_parser = num::<u32>)]
    batch: Option<u32>,
    /// Node namespaces [4; node 0 runs two ranks].
    #[arg(long, value_parser = num::<u64>)]
    nodes: Option<u64>,
    /// Each node's link, each way, Mbit/s [1000].
    #[arg(long, value_parser = num::<u32>)]
    node_mbit: Option<u32>,
    /// The store's link, each way, Mbit/s [200].
    #[arg(long, value_parser = num::<u32>)]
    store_mbit: Option<u32>,
    /// Round trip added by the delay proxy in front of the store, ms [50].
    #[arg(long, value_parser = num::<u64>)]
    rtt_ms: Option<u64>,
    /// The slowed node's link in `slow`, Mbit/s [10].
    #[arg(long, value_parser = num::<u32>)]
    slow_mbit: Option<u32>,
    /// peers.hedge_after_ms of every agent [2000, the agent's].
    #[arg(long, value_parser = num::<u64>)]
    hedge_ms: Option<u64>,
    /// peers.owner_grace_ms of every agent [10000, the agent's; 0: a dropped owner's samples are read from the store at once].
    #[arg(long, value_parser = num::<u64>)]
    owner_grace_ms: Option<u64>,
    /// peers.keep_percent of every agent [50].
    #[arg(long, value_parser = num::<u64>)]
    keep_percent: Option<u64>,
    /// Arena of each agent in b0, MiB [64, the smallest allowed].
    #[arg(long, value_parser = num::<u64>)]
    b0_arena_mib: Option<u64>,
    /// One peer block in K corrupted in `corrupt` [10000].
    #[arg(long, value_parser = num::<u64>)]
    corrupt_every: Option<u64>,
    /// Time between the kill and the restart in `kill`, ms [1000].
    #[arg(long, value_parser = num::<u64>)]
    restart_ms: Option<u64>,
    /// Run `relaunch` in the locality-aware assignment.
    #[arg(long)]
    relaunch_locality: bool,
    /// Comma-separated, from b0,peers150,peers150off,peers75,locality,kill,relaunch,corrupt,slow [all].
    #[arg(long)]
    scenarios: Option<String>,
    /// Logs, timeline.csv and the plot [bench/.data/cluster].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where the plot goes [OUT/cluster.png; `-` for none].
    #[arg(long)]
    plot: Option<String>,
    /// Two nodes, 2048 samples, peers150 and locality; exit 1 if an invariant fails.
    #[arg(long)]
    smoke: bool,
    /// Remove namespaces and links left by a killed run, then exit.
    #[arg(long)]
    cleanup: bool,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--role") {
        let role = args.get(1).cloned().unwrap_or_default();
        return match cluster::run_role(&role, args.into_iter().skip(2).collect()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cluster {role}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let c = Cli::parse();
    if c.cleanup {
        return match cluster::cleanup() {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    let o = Options {
        samples: c.samples,
        mean_kib: c.mean_kib,
        sigma: c.sigma,
        epochs: c.epochs,
        batch: c.batch,
        nodes: c.nodes,
        node_mbit: c.node_mbit,
        store_mbit: c.store_mbit,
        rtt_ms: c.rtt_ms,
        slow_mbit: c.slow_mbit,
        hedge_ms: c.hedge_ms,
        owner_grace_ms: c.owner_grace_ms,
        keep_percent: c.keep_percent,
        b0_arena_mib: c.b0_arena_mib,
        corrupt_every: c.corrupt_every,
        restart_ms: c.restart_ms,
        relaunch_locality: c.relaunch_locality,
        scenarios: c.scenarios,
        out: c.out,
        plot: c.plot,
        smoke: c.smoke,
    };
    if let Err(e) = cluster::check(&o) {
        eprintln!("cluster: {e}");
        return ExitCode::from(2);
    }
    match cluster::run(&o) {
        Ok(Outcome::Held) => ExitCode::SUCCESS,
        Ok(Outcome::Broken) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cluster: {e}");
            ExitCode::FAILURE
        }
    }
}
