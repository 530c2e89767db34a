//! `bench/run channel`. Cost of the peer channel: bytes/s per core of blocks moved through an established `Conn` pair (seal, open, copies) beside the raw AEAD's (one seal and one open of a record), per suite and protection; and over loopback TCP.
//!
//! Everything in the main part runs on one thread and is timed with that
//! thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`), so the figures are bytes
//! per second per core.
//!
//! * **Raw AEAD** (`raw`): one record of 65,519 plaintext bytes (the
//!   channel's largest, `MAX_RECORD_PLAINTEXT`) sealed in place and opened in
//!   place with aws-lc-rs, the channel's key type and nonce encoding: what a
//!   record crossing costs in pure cryptography. Encrypted: `ENCRYPT(k, n,
//!   ad = "", data)`; authenticated: the tag-only form `ENCRYPT(k, n, ad =
//!   data, "")`.
//! * **Channel**: a requester (`Conn::dial`) and an owner (`Conn::accept`)
//!   on one thread, established, moving blocks as the agent's TCP transport
//!   does (`agent/src/peers/net/`): the requester sends a get; the owner
//!   answers with `send_data` and seals the payload 256 KiB at a time into
//!   one reused buffer; the wire bytes are handed to the other side through
//!   `input_buffer`/`input_written` (a copy, standing in for the socket's
//!   read), and the requester lands the payload in the destination extent.
//!   Gets and credit frames cross too. Two call paths: *copying*
//!   (`seal_payload` with a fill closure copying from the source, and
//!   `payload()` copied out: the agent's calls today) and *direct*
//!   (`seal_payload_into` encrypting straight from the source,
//!   `payload_into` opening records straight into the destination). Every
//!   block's bytes are checked before the timed rounds.
//! * **Hand-over** (`handover`): the copies that stand in for the socket
//!   reads alone, the same pieces from the same buffer sizes. A real
//!   transport pays them in the kernel with or without a channel, so the
//!   channel's own cost is `channel − handover` (per byte, paired by round);
//!   the channel's figure with them is printed too.
//!
//! Contenders run in rounds; each round runs every contender for about
//! `--ms` of CPU time, the order rotating from round to round; the figures
//! are medians over rounds. Goal: the channel's own bytes/s per core ≥ 0.8 ×
//! the raw AEAD's, for the suite the agent picks here
//! (`Suite::fastest_here()`) with encrypted records, at every block size,
//! judged on the direct calls (`goal`); the copying calls' verdict is
//! printed beside it (`goal_copying`).
//!
//! After the rounds, unless `--no-tcp`: the same blocks over a loopback TCP
//! connection, owner and requester on two threads, for the picked suite
//! (encrypted with both call paths, authenticated with the direct calls)
//! and plain TCP (no channel: the extent written, read
//! straight into the destination); bytes per CPU second of both threads
//! together. Reported apart, not part of the goal.
//!
//! Layout: [`scenario`] (names, call paths, the blocks' bytes, each side's
//! configuration), `raw` (the raw AEAD), `pair` (the channel on one thread
//! and the hand-over copies), `measure` (the contenders and the rounds),
//! `tcp` (the loopback TCP runs), `report` (the tables, the goals, the
//! result line); `bin/channel.rs` parses the options.

mod measure;
mod pair;
mod raw;
mod report;
pub mod scenario;
mod tcp;

use std::time::Duration;

use granary_peer::channel::{Protection, Suite};

use crate::cli::num;
use crate::report::Goal;
use crate::sys;
use scenario::{parse_pair, suite_name, Api, PROTECTIONS};

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

/// The goal: the channel's own bytes/s per core at least 0.8x the raw
/// AEAD's, direct calls, lowest over the block sizes (`ratio`).
pub const GOAL: Goal = Goal::at_least("goal", 0.8);
/// The same for the copying calls, printed beside it.
pub const GOAL_COPYING: Goal = Goal::at_least("goal_copying", 0.8);

/// The options as given (`bench/run channel --help`); `None`: the default,
/// or with `--quick` the small run's.
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Rounds of every contender [default: 7; 3 with --quick].
    #[arg(long, value_parser = num::<usize>)]
    pub rounds: Option<usize>,
    /// CPU milliseconds per contender per round [default: 300; 20 with --quick].
    #[arg(long, value_parser = num::<u64>)]
    pub ms: Option<u64>,
    /// Block sizes in bytes, comma-separated [default: 112640,1048576: 110 KiB, 1 MiB].
    #[arg(long, value_delimiter = ',', value_parser = num::<u64>)]
    pub sizes: Option<Vec<u64>>,
    /// Source and destination arenas of N MiB each, the block's extent
    /// moving through them (0: one extent, hot in cache).
    #[arg(long, default_value_t = 0, value_parser = num::<u64>)]
    pub arena_mib: u64,
    /// MiB moved per loopback TCP run [default: 512; 16 with --quick].
    #[arg(long, value_parser = num::<u64>)]
    pub tcp_mib: Option<u64>,
    /// Rounds of the TCP runs [default: 3; 1 with --quick].
    #[arg(long, value_parser = num::<u64>)]
    pub tcp_rounds: Option<u64>,
    /// Requests in flight over TCP.
    #[arg(long, default_value_t = 4, value_parser = num::<u64>)]
    pub depth: u64,
    /// Skip the loopback TCP runs.
    #[arg(long)]
    pub no_tcp: bool,
    /// Wait up to N s for a quiet machine first [default: 10; 0 with --quick].
    #[arg(long, value_parser = num::<u64>)]
    pub quiet_s: Option<u64>,
    /// These suite/protection pairs only, comma-separated (e.g.
    /// aes-256-gcm/encrypted; for profiling: the goal is judged only when
    /// the picked suite's encrypted pair is among them) [default: all].
    #[arg(long, default_value = "")]
    pub only: String,
    /// The channel's call path: direct, copying or both (the goal is judged
    /// on the direct calls).
    #[arg(long, default_value = "both")]
    pub api: String,
    /// A small run (3 rounds of 20 ms, 16 MiB over TCP, no wait).
    #[arg(long)]
    pub quick: bool,
}

/// The options resolved: defaults filled in, names parsed, checked.
#[derive(Clone, Debug)]
pub struct Config {
    /// Rounds of every contender.
    pub rounds: usize,
    /// CPU time per contender per round.
    pub budget: Duration,
    /// Block sizes, bytes.
    pub sizes: Vec<usize>,
    /// Each arena's bytes (0: one extent).
    pub arena: usize,
    /// Bytes per loopback TCP run.
    pub tcp_bytes: u64,
    /// Rounds of the TCP runs.
    pub tcp_rounds: usize,
    /// Requests in flight over TCP.
    pub depth: usize,
    /// Run the loopback TCP runs.
    pub tcp: bool,
    /// Longest wait for a quiet machine.
    pub quiet: Duration,
    /// The suite/protection pairs measured.
    pub only: Vec<(Suite, Protection)>,
    /// The call paths measured.
    pub apis: Vec<Api>,
}

impl Options {
    /// The options resolved and checked.
    pub fn config(&self) -> Result<Config> {
        let quick = self.quick;
        let pick = |v: Option<u64>, normal: u64, small: u64| {
            v.unwrap_or(if quick { small } else { normal })
        };
        let o = Config {
            rounds: self.rounds.unwrap_or(if quick { 3 } else { 7 }),
            budget: Duration::from_millis(pick(self.ms, 300, 20)),
            sizes: self
                .sizes
                .clone()
                .unwrap_or_else(|| vec![110 * 1024, 1024 * 1024])
                .into_iter()
                .map(|s| s as usize)
                .collect(),
            arena: self.arena_mib as usize * 1024 * 1024,
            tcp_bytes: pick(self.tcp_mib, 512, 16) * 1024 * 1024,
            tcp_rounds: pick(self.tcp_rounds, 3, 1) as usize,
            depth: self.depth as usize,
            tcp: !self.no_tcp,
            quiet: Duration::from_secs(pick(self.quiet_s, 10, 0)),
            only: match self.only.as_str() {
                "" => Suite::ALL
                    .into_iter()
                    .flat_map(|s| PROTECTIONS.map(|p| (s, p)))
                    .collect(),
                list => list
                    .split(',')
                    .map(parse_pair)
                    .collect::<Result<Vec<_>>>()?,
            },
            apis: match self.api.as_str() {
                "both" => Api::ALL.to_vec(),
                "direct" => vec![Api::Direct],
                "copying" => vec![Api::Copying],
                x => return Err(format!("--api: {x}: not direct, copying or both").into()),
            },
        };
        if o.rounds == 0 || o.sizes.is_empty() || o.sizes.contains(&0) || o.depth == 0 {
            return Err("--rounds, --sizes and --depth must be positive".into());
        }
        if o.sizes.iter().any(|&s| s > 1 << 30) {
            return Err("block sizes above 1 GiB are not frames of the protocol".into());
        }
        Ok(o)
    }
}

/// Runs the benchmark; prints the result line last.
pub fn run(options: &Options) -> Result<()> {
    let o = &options.config()?;
    let picked = Suite::fastest_here();
    println!(
        "channel: CPU {} ({}); Suite::fastest_here() = {}",
        sys::cpu_model(),
        scenario::cpu_flags(),
        suite_name(picked)
    );
    if !o.quiet.is_zero() {
        let (waited, quiet) = sys::wait_quiet(o.quiet);
        println!(
            "channel: {} after {:.0} s",
            if quiet {
                "machine quiet (under 0.2 busy cores for 2 s)"
            } else {
                "machine NOT quiet, measuring anyway (thread CPU time)"
            },
            waited.as_secs_f64()
        );
    }
    let regime_before = sys::regime();
    println!("channel: before: {regime_before}");
    let mut cs = measure::contenders(o)?;
    measure::rounds(o, &mut cs)?;
    let figures = report::figures(o, &cs, picked)?;
    let tcp = match o.tcp {
        true => tcp::runs(o, picked)?,
        false => crate::report::Json::default(),
    };
    let regime_after = sys::regime();
    println!("channel: after: {regime_after}");
    let line = report::line(o, picked, &figures, &tcp, &regime_before, &regime_after);
    println!("{}", line.line());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Result<Config> {
        let args = std::iter::once("channel").chain(args.iter().copied());
        crate::cli::parse_args::<Options>("bench/run channel", args)?.config()
    }

    #[test]
    fn quick_shrinks_the_defaults_and_given_values_win() {
        let c = config(&["--quick"]).unwrap();
        assert_eq!((c.rounds, c.budget.as_millis(), c.tcp_rounds), (3, 20, 1));
        assert_eq!((c.tcp_bytes, c.quiet), (16 << 20, Duration::ZERO));
        assert_eq!(c.sizes, [112_640, 1_048_576]);
        assert_eq!(c.only.len(), 4);
        assert_eq!(c.apis, Api::ALL);
        let c = config(&["--quick", "--rounds", "5", "--sizes", "4_096, 8192"]).unwrap();
        assert_eq!((c.rounds, c.sizes.clone()), (5, vec![4096, 8192]));
        let c = config(&["--only", "aes-256-gcm/encrypted", "--api", "direct"]).unwrap();
        assert_eq!(c.only, [(Suite::Aes256Gcm, Protection::Encrypted)]);
        assert_eq!(
            (c.apis, c.rounds, c.tcp_bytes),
            (vec![Api::Direct], 7, 512 << 20)
        );
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(config(&["--api", "both!"]).is_err());
        assert!(config(&["--only", "aes/encrypted"]).is_err());
        assert!(config(&["--sizes", "0"]).is_err());
        assert!(config(&["--sizes", "2147483648"]).is_err());
        assert!(config(&["--depth", "0"]).is_err());
        assert!(config(&["--no-tcp", "--bogus", "1"]).is_err());
    }
}
