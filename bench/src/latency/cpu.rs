//! Where the CPU goes during a window: counters read at its edges
//! ([`CpuMark`]) and the cores each consumer used between them ([`CpuUse`]).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::light_store;
use crate::store::Store;
use crate::sys::{self, process_cpu, MachineCpu};

/// CPU time counters read at the edges of a window.
#[derive(Clone, Debug, Default)]
pub struct CpuMark {
    pub at: Option<Instant>,
    /// SeaweedFS's process (zero for the light store, whose threads are in
    /// `threads`).
    pub weed: Duration,
    pub store_in_process: bool,
    /// This process, every thread (exited ones included).
    pub own: Duration,
    pub threads: Vec<(String, Duration)>,
    pub machine: MachineCpu,
}

impl CpuMark {
    pub fn take(store: &Store) -> CpuMark {
        CpuMark {
            at: Some(Instant::now()),
            weed: store.weed_pid().map_or(Duration::ZERO, process_cpu),
            store_in_process: store.in_process(),
            own: process_cpu(std::process::id()),
            threads: sys::thread_cpu(),
            machine: MachineCpu::read(),
        }
    }
}

/// Cores used over a window, by consumer.
#[derive(Clone, Debug, Default)]
pub struct CpuUse {
    /// The store: SeaweedFS's process, or the light store's threads in
    /// this process.
    pub store: f64,
    pub store_in_process: bool,
    pub proxy: f64,
    pub engine: f64,
    pub fetcher: f64,
    pub loader: f64,
    /// The Python processes (DataLoader runs).
    pub python: f64,
    /// This process, all threads: the loader, the proxy, and for Granary
    /// the agent's threads.
    pub own: f64,
    /// Whole machine: busy cores (user, system, irq, softirq), the softirq
    /// part of it (the loopback network), and stolen.
    pub busy: f64,
    pub softirq: f64,
    pub steal: f64,
}

impl CpuUse {
    pub fn between(a: &CpuMark, b: &CpuMark) -> CpuUse {
        let secs = match (a.at, b.at) {
            (Some(x), Some(y)) => y.duration_since(x).as_secs_f64().max(1e-9),
            _ => return CpuUse::default(),
        };
        let th = |name: &str| {
            sys::cpu_of(&b.threads, name)
                .saturating_sub(sys::cpu_of(&a.threads, name))
                .as_secs_f64()
                / secs
        };
        let (busy, softirq, steal) = b.machine.since(&a.machine);
        CpuUse {
            store: if b.store_in_process {
                th(light_store::THREAD_NAME)
            } else {
                b.weed.saturating_sub(a.weed).as_secs_f64() / secs
            },
            store_in_process: b.store_in_process,
            own: b.own.saturating_sub(a.own).as_secs_f64() / secs,
            proxy: th("delay-proxy"),
            engine: th("granary-engine"),
            fetcher: th("granary-s3"),
            loader: th("latency"),
            python: 0.0,
            busy,
            softirq,
            steal,
        }
    }

    /// Busy cores not accounted to SeaweedFS, this process or the Python
    /// processes: other processes on the machine, and kernel work done
    /// outside them (softirqs in their own threads).
    pub fn rest(&self) -> f64 {
        let outside = if self.store_in_process {
            0.0
        } else {
            self.store
        };
        (self.busy - outside - self.own - self.python).max(0.0)
    }

    /// CPU microseconds per delivered sample of each consumer at `rate`
    /// samples/s: store, proxy, agent (engine and S3 fetcher), loader
    /// thread, Python processes; and the client side's total (agent and
    /// loader, or the Python processes).
    pub fn us_per_sample(&self, rate: f64) -> [(&'static str, f64); 6] {
        let us = |cores: f64| {
            if rate > 0.0 {
                cores / rate * 1e6
            } else {
                f64::NAN
            }
        };
        [
            ("store", us(self.store)),
            ("proxy", us(self.proxy)),
            ("agent", us(self.engine + self.fetcher)),
            ("loader", us(self.loader)),
            ("python", us(self.python)),
            (
                "client",
                us(self.engine + self.fetcher + self.loader + self.python),
            ),
        ]
    }

    pub fn line(&self) -> String {
        let mut s = format!(
            "{} {:.2}, proxy {:.2}",
            if self.store_in_process {
                "light store"
            } else {
                "weed"
            },
            self.store,
            self.proxy
        );
        if self.engine > 0.0 || self.fetcher > 0.0 {
            let _ = write!(
                s,
                ", engine {:.2}, S3 fetcher {:.2}, loader {:.2}",
                self.engine, self.fetcher, self.loader
            );
        }
        if self.python > 0.0 {
            let _ = write!(s, ", python {:.2}", self.python);
        }
        let _ = write!(
            s,
            "; this process {:.2}; machine busy {:.2} (softirq {:.2}), everything else {:.2}, steal {:.2}",
            self.own,
            self.busy,
            self.softirq,
            self.rest(),
            self.steal
        );
        s
    }

    pub fn json(&self) -> String {
        format!(
            "{{\"store\":{:.3},\"weed\":{:.3},\"proxy\":{:.3},\"engine\":{:.3},\"s3_fetcher\":{:.3},\"loader\":{:.3},\"python\":{:.3},\"bench_process\":{:.3},\"machine_busy\":{:.3},\"softirq\":{:.3},\"rest\":{:.3},\"steal\":{:.3}}}",
            self.store,
            if self.store_in_process {
                0.0
            } else {
                self.store
            },
            self.proxy,
            self.engine,
            self.fetcher,
            self.loader,
            self.python,
            self.own,
            self.busy,
            self.softirq,
            self.rest(),
            self.steal
        )
    }
}
