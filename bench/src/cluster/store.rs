//! The store role of the cluster benchmark: one process in the store's
//! namespace running SeaweedFS on the namespace's loopback, the dataset
//! ingested into it once, and the delay proxy in front of it on the
//! namespace's bridge address (the only way in).
//!
//! Prints `ready weed_pid=P objects=N` once everything answers, then serves
//! until stdin closes or says `quit`; SeaweedFS and its directory are
//! removed on the way out.

use crate::delay_proxy::DelayProxy;
use crate::seaweed::{Seaweed, BUCKET};
use granary_tools::ingest::{self, IngestOptions};
use granary_tools::synth::SynthSpec;
use std::io::BufRead;
use std::net::SocketAddr;
use std::time::Duration;

/// What the store role is given.
#[derive(Clone, Debug)]
pub struct StoreArgs {
    /// The dataset on disk, ingested under `prefix`.
    pub spec: SynthSpec,
    /// Key prefix of the dataset in the bucket.
    pub prefix: String,
    /// Where the delay proxy listens (the store's bridge address).
    pub listen: SocketAddr,
    /// One-way delay the proxy adds in each direction.
    pub delay: Duration,
}

/// Runs the store until stdin closes or says `quit`.
pub fn run(a: StoreArgs) -> Result<(), String> {
    let weed = Seaweed::try_start(BUCKET)?;
    let opts = IngestOptions::new(&a.spec.root, weed.settings(), &a.prefix);
    let report = ingest::ingest(&opts, |_, _, _, _| {}).map_err(|e| format!("ingest: {e}"))?;
    if report.files != a.spec.num_files {
        return Err(format!(
            "ingested {} files, the dataset has {}",
            report.files, a.spec.num_files
        ));
    }
    let proxy = DelayProxy::start(a.listen, weed.s3_addr(), a.delay, None)
        .map_err(|e| format!("delay proxy on {}: {e}", a.listen))?;
    println!(
        "ready weed_pid={} objects={} proxy={}",
        weed.pid().unwrap_or(0),
        report.files,
        proxy.local_addr()
    );
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(l) if l.trim() == "quit" => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    drop(proxy);
    drop(weed);
    Ok(())
}
