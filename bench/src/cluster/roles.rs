//! The processes the cluster benchmark runs inside the namespaces, started
//! as `cluster --role store|node ...` (internal options, `--name value`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use granary_tools::synth::SynthSpec;

use super::node::{self, NodeArgs};
use super::store::{self, StoreArgs};
use super::Result;
use crate::cli::Args;
use crate::corrupt_proxy::Corrupt;

pub fn spec_of(a: &Args) -> Result<SynthSpec> {
    let mut s = SynthSpec::new(a.string("data-root", ""));
    s.num_files = a.u64("samples", 0)?;
    s.mean_size = a.u64("mean", 0)?;
    s.sigma = a
        .string("sigma", "0")
        .parse()
        .map_err(|_| "--sigma: not a number".to_owned())?;
    s.num_classes = a.u32("classes", 1)?;
    Ok(s)
}

pub fn addr(a: &Args, name: &str) -> Result<SocketAddr> {
    a.string(name, "")
        .parse()
        .map_err(|_| format!("--{name}: not IP:PORT"))
}

/// Runs the internal role `role` (`store` or `node`) with its options.
pub fn run_role(role: &str, rest: Vec<String>) -> Result<()> {
    let a = Args::parse(rest, &[], "an internal role of bench/run cluster")?;
    match role {
        "store" => store::run(StoreArgs {
            spec: spec_of(&a)?,
            prefix: a.string("prefix", "cluster"),
            listen: addr(&a, "listen")?,
            delay: Duration::from_micros(a.u64("delay-us", 0)?),
        }),
        "node" => {
            let ranks = a
                .list("ranks", &[])?
                .into_iter()
                .map(|r| r as u32)
                .collect();
            let proxy = if a.string("proxy-listen", "").is_empty() {
                None
            } else {
                Some((
                    addr(&a, "proxy-listen")?,
                    addr(&a, "proxy-upstream")?,
                    Corrupt::Every {
                        every: a.u64("corrupt-every", 10_000)?,
                        first: a.u64("corrupt-first", 0)?,
                    },
                ))
            };
            node::run(NodeArgs {
                sock: PathBuf::from(a.string("sock", "")),
                metrics: addr(&a, "metrics")?,
                ranks,
                world: a.u32("world", 1)?,
                batch: a.u32("batch", 1)?,
                seed: a.u64("seed", 0)?,
                spec: spec_of(&a)?,
                proxy,
                mark: if a.string("mark-batches", "").is_empty() {
                    None
                } else {
                    Some((a.u32("mark-epoch", 1)?, a.u64("mark-batches", 0)?))
                },
                probe: if a.string("probe", "").is_empty() {
                    None
                } else {
                    Some(addr(&a, "probe")?)
                },
                layout: a
                    .list("layout", &[])?
                    .into_iter()
                    .map(|v| v as u32)
                    .collect(),
                nodes: a.u32("nodes", 0)?,
                view: match a.string("view", "").as_str() {
                    "" => None,
                    p => Some(std::fs::read(p).map_err(|e| format!("--view {p}: {e}"))?),
                },
            })
        }
        _ => Err(format!("unknown role {role:?}")),
    }
}
