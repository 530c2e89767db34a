//! The scenarios and the options a run is given.

use std::path::PathBuf;

use granary_tools::synth::SynthSpec;

use super::Result;
use crate::cli::num;
use crate::data::data_root;

/// One scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    B0,
    Peers150,
    Peers75,
    Kill,
    Corrupt,
    Slow,
    Locality,
    Relaunch,
    /// `peers150` with `peers.encryption = "off"`: what the channel's
    /// encryption costs.
    Peers150Off,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::B0,
        Kind::Peers150,
        Kind::Peers150Off,
        Kind::Peers75,
        Kind::Locality,
        Kind::Kill,
        Kind::Relaunch,
        Kind::Corrupt,
        Kind::Slow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::B0 => "b0",
            Kind::Peers150 => "peers150",
            Kind::Peers75 => "peers75",
            Kind::Kill => "kill",
            Kind::Corrupt => "corrupt",
            Kind::Slow => "slow",
            Kind::Locality => "locality",
            Kind::Relaunch => "relaunch",
            Kind::Peers150Off => "peers150off",
        }
    }

    pub fn parse(s: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown scenario {s:?} (one of {ALL_SCENARIOS})"))
    }

    /// Percent of the dataset the keep areas hold together (0: no peers).
    pub fn keep_pct(self) -> u64 {
        match self {
            Kind::B0 => 0,
            Kind::Peers75 => 75,
            _ => 150,
        }
    }
}

pub struct Opts {
    pub samples: u64,
    pub mean: u64,
    pub sigma: f64,
    pub epochs: u32,
    pub batch: u32,
    pub nodes: usize,
    pub node_mbit: u32,
    pub store_mbit: u32,
    pub rtt_ms: u64,
    pub slow_mbit: u32,
    pub hedge_ms: u64,
    pub owner_grace_ms: u64,
    pub keep_percent: u64,
    pub b0_arena_mib: u64,
    pub corrupt_every: u64,
    pub restart_ms: u64,
    /// `relaunch` in the locality-aware assignment.
    pub relaunch_locality: bool,
    pub scenarios: Vec<Kind>,
    pub out: PathBuf,
    pub plot: Option<PathBuf>,
    pub smoke: bool,
}

/// The options as given (`bench/run cluster --help`); `None`: the default,
/// in brackets (some differ with `--smoke`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Options {
    /// Samples in the dataset [4096; 2048 with --smoke; the size is 16384].
    #[arg(long, value_parser = num::<u64>)]
    pub samples: Option<u64>,
    /// Mean sample size in KiB [64].
    #[arg(long, value_parser = num::<u64>)]
    pub mean_kib: Option<u64>,
    /// Log-normal sigma of the sizes [0: all the same size; the variant: --mean-kib 107 --sigma 0.5].
    #[arg(long)]
    pub sigma: Option<f64>,
    /// Epochs per scenario [3].
    #[arg(long, value_parser = num::<u32>)]
    pub epochs: Option<u32>,
    /// Batch size per rank [32; in relaunch each rank's after the loss, before it B x (nodes - 1) / nodes: B must be divisible by --nodes, and --samples a multiple of nodes x (nodes - 1) gives epochs without padding].
    #[arg(long, value_parser = num::<u32>)]
    pub batch: Option<u32>,
    /// Node namespaces [4; 2 with --smoke; node 0 runs two ranks].
    #[arg(long, value_parser = num::<u64>)]
    pub nodes: Option<u64>,
    /// Each node's link, each way, Mbit/s [1000].
    #[arg(long, value_parser = num::<u32>)]
    pub node_mbit: Option<u32>,
    /// The store's link, each way, Mbit/s [200].
    #[arg(long, value_parser = num::<u32>)]
    pub store_mbit: Option<u32>,
    /// Round trip added by the delay proxy in front of the store, ms [50].
    #[arg(long, value_parser = num::<u64>)]
    pub rtt_ms: Option<u64>,
    /// The slowed node's link in `slow`, Mbit/s [10].
    #[arg(long, value_parser = num::<u32>)]
    pub slow_mbit: Option<u32>,
    /// peers.hedge_after_ms of every agent [2000, the agent's].
    #[arg(long, value_parser = num::<u64>)]
    pub hedge_ms: Option<u64>,
    /// peers.owner_grace_ms of every agent [10000, the agent's; 0: a dropped owner's samples are read from the store at once].
    #[arg(long, value_parser = num::<u64>)]
    pub owner_grace_ms: Option<u64>,
    /// peers.keep_percent of every agent [50].
    #[arg(long, value_parser = num::<u64>)]
    pub keep_percent: Option<u64>,
    /// Arena of each agent in b0, MiB [64, the smallest allowed].
    #[arg(long, value_parser = num::<u64>)]
    pub b0_arena_mib: Option<u64>,
    /// One peer block in K corrupted in `corrupt` [10000].
    #[arg(long, value_parser = num::<u64>)]
    pub corrupt_every: Option<u64>,
    /// Time between the kill and the restart in `kill`, ms [1000].
    #[arg(long, value_parser = num::<u64>)]
    pub restart_ms: Option<u64>,
    /// Run `relaunch` in the locality-aware assignment: the job agrees before each epoch, and again after the change with the new view, world size and layout.
    #[arg(long)]
    pub relaunch_locality: bool,
    /// Comma-separated, from b0,peers150,peers150off,peers75,locality,kill,relaunch,corrupt,slow [all].
    #[arg(long)]
    pub scenarios: Option<String>,
    /// Logs, timeline.csv and the plot [bench/.data/cluster].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the plot goes [OUT/cluster.png; `-` for none].
    #[arg(long)]
    pub plot: Option<String>,
    /// Two nodes, 2048 samples, peers150 and locality; exit 1 if an invariant fails.
    #[arg(long)]
    pub smoke: bool,
}

/// Every scenario, in the order they run by default.
pub const ALL_SCENARIOS: &str =
    "b0,peers150,peers150off,peers75,locality,kill,relaunch,corrupt,slow";

impl Opts {
    /// Checks the options and fills in the defaults.
    pub fn parse(a: &Options) -> Result<Opts> {
        let smoke = a.smoke;
        let out = a.out.clone().unwrap_or_else(|| data_root().join("cluster"));
        let plot = match a.plot.as_deref().unwrap_or("") {
            "-" => None,
            "" if smoke => None,
            "" => Some(out.join("cluster.png")),
            p => Some(PathBuf::from(p)),
        };
        let scenarios = if smoke {
            vec![Kind::Peers150, Kind::Locality]
        } else {
            a.scenarios
                .as_deref()
                .unwrap_or(ALL_SCENARIOS)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(Kind::parse)
                .collect::<Result<Vec<_>>>()?
        };
        let o = Opts {
            samples: a.samples.unwrap_or(if smoke { 2048 } else { 4096 }),
            mean: a.mean_kib.unwrap_or(64) * 1024,
            sigma: a.sigma.unwrap_or(0.0),
            epochs: a.epochs.unwrap_or(3),
            batch: a.batch.unwrap_or(32),
            nodes: a.nodes.unwrap_or(if smoke { 2 } else { 4 }) as usize,
            node_mbit: a.node_mbit.unwrap_or(1000),
            store_mbit: a.store_mbit.unwrap_or(200),
            rtt_ms: a.rtt_ms.unwrap_or(50),
            slow_mbit: a.slow_mbit.unwrap_or(10),
            hedge_ms: a.hedge_ms.unwrap_or(2000),
            owner_grace_ms: a.owner_grace_ms.unwrap_or(10_000),
            keep_percent: a.keep_percent.unwrap_or(50),
            b0_arena_mib: a.b0_arena_mib.unwrap_or(64),
            corrupt_every: a.corrupt_every.unwrap_or(10_000),
            restart_ms: a.restart_ms.unwrap_or(1000),
            relaunch_locality: a.relaunch_locality,
            scenarios,
            out,
            plot,
            smoke,
        };
        if o.nodes < 2 || o.nodes > 16 {
            return Err("--nodes must be 2 to 16".into());
        }
        if o.epochs < 2 {
            return Err("--epochs must be at least 2".into());
        }
        if o.samples == 0 || o.batch == 0 || o.corrupt_every == 0 {
            return Err("--samples, --batch and --corrupt-every must be positive".into());
        }
        if !(1..=90).contains(&o.keep_percent) {
            return Err("--keep-percent must be 1 to 90".into());
        }
        if o.scenarios.contains(&Kind::Relaunch) && !o.global_batch().is_multiple_of(o.nodes as u64)
        {
            return Err(format!(
                "relaunch keeps the global batch --batch x (nodes - 1) = {} over {} ranks before the loss: \
                 give a --batch divisible by --nodes",
                o.global_batch(),
                o.nodes
            ));
        }
        Ok(o)
    }

    /// Ranks of node `k` in scenario `kind`: one per node in `relaunch`
    /// (world size = nodes), else [`Opts::ranks`].
    pub fn ranks_in(&self, kind: Kind, k: usize) -> Vec<u32> {
        if kind == Kind::Relaunch {
            vec![k as u32]
        } else {
            self.ranks(k)
        }
    }

    /// Ranks in the job at the start of scenario `kind`.
    pub fn world_in(&self, kind: Kind) -> u32 {
        if kind == Kind::Relaunch {
            self.nodes as u32
        } else {
            self.world()
        }
    }

    /// `relaunch`'s global batch: `--batch` per rank once the last node is
    /// lost, over `nodes - 1` ranks.
    pub fn global_batch(&self) -> u64 {
        u64::from(self.batch) * (self.nodes as u64 - 1)
    }

    /// Every rank's batch at the start of scenario `kind`: in `relaunch`
    /// the global batch over all the nodes.
    pub fn batch_in(&self, kind: Kind) -> u32 {
        if kind == Kind::Relaunch {
            (self.global_batch() / self.nodes as u64) as u32
        } else {
            self.batch
        }
    }

    /// Ranks of node `k`: node 0 runs two.
    pub fn ranks(&self, k: usize) -> Vec<u32> {
        if k == 0 {
            vec![0, 1]
        } else {
            vec![k as u32 + 1]
        }
    }

    pub fn world(&self) -> u32 {
        self.nodes as u32 + 1
    }

    pub fn spec(&self) -> SynthSpec {
        let root = data_root().join(format!(
            "cluster-{}x{}-s{}",
            self.samples, self.mean, self.sigma
        ));
        let mut s = SynthSpec::new(root);
        s.num_files = self.samples;
        s.mean_size = self.mean;
        s.sigma = self.sigma;
        s.num_classes = 100.min(self.samples as u32);
        s
    }
}
