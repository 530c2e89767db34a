//! The rounds: every contender (a raw AEAD, the channel at one block size
//! and call path, the hand-over copies) calibrated to about `--ms` of CPU
//! time, then run once per round, the order rotating; CPU time per byte
//! kept per round.

use std::time::{Duration, Instant};

use granary_peer::channel::{Protection, Suite};

use super::pair::{ChannelPair, Handover};
use super::raw::RawAead;
use super::scenario::{prot_name, size_name, suite_name, Api};
use super::{Config, Result};
use crate::sys;

/// CPU time of the calibration run of each contender.
const CALIBRATE: Duration = Duration::from_millis(30);

pub enum Work {
    Raw(RawAead),
    Channel(Box<ChannelPair>),
    Handover(Handover),
}

impl Work {
    pub fn step(&mut self) -> Result<u64> {
        match self {
            Work::Raw(r) => r.step(),
            Work::Channel(c) => c.step(None),
            Work::Handover(h) => Ok(h.step()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Raw,
    Channel(usize, Api),
    Handover(usize),
}

pub struct Contender {
    pub suite: Suite,
    pub protection: Protection,
    pub kind: Kind,
    pub work: Work,
    pub iters: u64,
    /// CPU nanoseconds per payload byte, one per round.
    pub ns_per_byte: Vec<f64>,
    /// CPU time over wall time, one per round.
    pub cpu_share: Vec<f64>,
}

impl Contender {
    pub fn label(&self) -> String {
        let what = match self.kind {
            Kind::Raw => "raw AEAD".to_owned(),
            Kind::Channel(s, api) => format!("channel {} {}", size_name(s), api.name()),
            // The same copies whatever the suite and protection.
            Kind::Handover(s) => return format!("hand-over copies {}", size_name(s)),
        };
        format!(
            "{} {} {what}",
            suite_name(self.suite),
            prot_name(self.protection)
        )
    }

    /// Runs steps until `CALIBRATE` of CPU time went, and sets the
    /// iterations of a round from it.
    pub fn calibrate(&mut self, budget: Duration) -> Result<()> {
        let t = sys::own_cpu();
        let mut n = 0u64;
        while sys::own_cpu() - t < CALIBRATE {
            self.work.step()?;
            n += 1;
        }
        let per = (sys::own_cpu() - t).as_secs_f64() / n as f64;
        self.iters = ((budget.as_secs_f64() / per).ceil() as u64).max(1);
        Ok(())
    }

    pub fn measure(&mut self) -> Result<()> {
        let wall = Instant::now();
        let cpu = sys::own_cpu();
        let mut bytes = 0;
        for _ in 0..self.iters {
            bytes += self.work.step()?;
        }
        let cpu = sys::own_cpu() - cpu;
        let wall = wall.elapsed();
        self.ns_per_byte
            .push(cpu.as_nanos() as f64 / bytes.max(1) as f64);
        self.cpu_share
            .push(cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9));
        Ok(())
    }
}

/// MB/s per core from nanoseconds per byte.
pub fn mb_s(ns_per_byte: f64) -> f64 {
    1e3 / ns_per_byte
}

/// Every contender of the configuration, checked byte for byte and
/// calibrated.
pub fn contenders(o: &Config) -> Result<Vec<Contender>> {
    let mut cs: Vec<Contender> = Vec::new();
    let mut add = |suite, protection, kind, work| {
        cs.push(Contender {
            suite,
            protection,
            kind,
            work,
            iters: 1,
            ns_per_byte: Vec::new(),
            cpu_share: Vec::new(),
        })
    };
    for (i, &(suite, p)) in o.only.iter().enumerate() {
        add(suite, p, Kind::Raw, Work::Raw(RawAead::new(suite, p)?));
        for &size in &o.sizes {
            for (k, &api) in o.apis.iter().enumerate() {
                let mut pair = ChannelPair::new(suite, p, size, o.arena, api)?;
                // The hand-over copies are the same for every suite,
                // protection and call path (the records have the same
                // lengths): measured once per size.
                if i == 0 && k == 0 {
                    add(
                        suite,
                        p,
                        Kind::Handover(size),
                        Work::Handover(Handover::new(&mut pair)?),
                    );
                }
                add(
                    suite,
                    p,
                    Kind::Channel(size, api),
                    Work::Channel(Box::new(pair)),
                );
            }
        }
    }
    for c in &mut cs {
        c.calibrate(o.budget)?;
    }
    Ok(cs)
}

/// Runs `o.rounds` rounds of every contender, the order rotating.
pub fn rounds(o: &Config, cs: &mut [Contender]) -> Result<()> {
    println!(
        "channel: {} contenders, {} rounds of about {} ms CPU each, order rotating; every block checked byte for byte before",
        cs.len(),
        o.rounds,
        o.budget.as_millis()
    );
    let t0 = Instant::now();
    for r in 0..o.rounds {
        let n = cs.len();
        for i in 0..n {
            cs[(r + i) % n].measure()?;
        }
        println!(
            "  round {}/{} done at {:.1} s",
            r + 1,
            o.rounds,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
