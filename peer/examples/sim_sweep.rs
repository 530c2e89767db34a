//! Runs the deterministic peer simulator at one size and prints what it
//! measured per epoch.
//!
//! usage: cargo run --release -p granary-peer --example sim_sweep -- NODES SAMPLES [SEED] [ARENA_PCT] [BATCH]

use granary_peer::sim::{run, SimConfig};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap_or_else(|_| usage(&a)))
        .collect();
    if args.len() < 2 {
        usage("too few arguments");
    }
    let mut cfg = SimConfig::small(args.get(2).copied().unwrap_or(1));
    cfg.nodes = args[0] as usize;
    cfg.samples = args[1];
    cfg.arena_pct = args.get(3).copied().unwrap_or(125);
    cfg.batch = args.get(4).copied().unwrap_or(32) as usize;
    cfg.step_limit = 60_000_000_000;
    let t = std::time::Instant::now();
    match run(&cfg) {
        Ok(r) => {
            println!(
                "nodes {} samples {} arena {}% batch {} seed {}: {} steps in {:.1} s wall",
                cfg.nodes,
                cfg.samples,
                cfg.arena_pct,
                cfg.batch,
                cfg.seed,
                r.steps,
                t.elapsed().as_secs_f64()
            );
            for e in 0..r.store_reads.len() {
                let n = (r.local_hits[e] + r.peer_hits[e] + r.store_hits[e]) as f64;
                println!(
                    "epoch {e}: store reads {} ({:.4} of samples), from arena {:.3}, from peers {:.3}, from store {:.3}; peer messages {}, peer bytes {}, requests {}",
                    r.store_reads[e],
                    r.store_reads[e] as f64 / n,
                    r.local_hits[e] as f64 / n,
                    r.peer_hits[e] as f64 / n,
                    r.store_hits[e] as f64 / n,
                    r.messages[e],
                    r.peer_bytes[e],
                    r.requests[e],
                );
            }
            println!(
                "run: misses {}, fallbacks {}, hedged {}, CRC failures {}",
                r.misses, r.fallbacks, r.hedged, r.crc_failures
            );
        }
        Err(e) => {
            eprintln!("simulation failed: {e}\nreplay: {cfg:?}");
            std::process::exit(1);
        }
    }
}

fn usage(what: &str) -> ! {
    eprintln!("sim_sweep: {what}\nusage: sim_sweep NODES SAMPLES [SEED] [ARENA_PCT] [BATCH]");
    std::process::exit(2);
}
