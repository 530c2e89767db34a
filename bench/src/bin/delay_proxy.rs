//! `delay_proxy`: a TCP proxy that adds a one-way delay in each direction
//! without breaking pipelining, and can cap bandwidth; see
//! `granary_bench::delay_proxy`.
//!
//! ```text
//! delay_proxy --listen 127.0.0.1:9333 --upstream 127.0.0.1:8333 --delay-ms 50 [--bandwidth-mbps 1000]
//! ```
//!
//! A round trip through the proxy costs `2 × delay-ms` more than without it.
//! It serves until killed.

use granary_bench::delay_proxy::DelayProxy;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str =
    "usage: delay_proxy --listen IP:PORT --upstream IP:PORT --delay-ms D [--bandwidth-mbps B]";

fn value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
}

fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let addr = |name: &str| -> Result<SocketAddr, String> {
        let v = value(args, name).ok_or_else(|| format!("{name} is required\n{USAGE}"))?;
        v.parse().map_err(|e| format!("{name} {v:?}: {e}"))
    };
    let listen = addr("--listen")?;
    let upstream = addr("--upstream")?;
    let delay_ms: f64 = match value(args, "--delay-ms") {
        Some(v) => v
            .parse()
            .ok()
            .filter(|d: &f64| d.is_finite() && *d >= 0.0)
            .ok_or_else(|| format!("--delay-ms {v:?}: expected a number of milliseconds ≥ 0"))?,
        None => return Err(format!("--delay-ms is required\n{USAGE}")),
    };
    let bandwidth = match value(args, "--bandwidth-mbps") {
        Some(v) => Some(
            v.parse()
                .ok()
                .filter(|b: &f64| b.is_finite() && *b > 0.0)
                .ok_or_else(|| format!("--bandwidth-mbps {v:?}: expected a positive number"))?,
        ),
        None => None,
    };
    let proxy = DelayProxy::start(
        listen,
        upstream,
        Duration::from_secs_f64(delay_ms / 1000.0),
        bandwidth,
    )
    .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    println!(
        "delay_proxy: {} -> {upstream}, {delay_ms} ms each way{}",
        proxy.local_addr(),
        bandwidth.map_or(String::new(), |b| format!(", {b} Mbit/s per direction"))
    );
    proxy.run_forever()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("delay_proxy: {e}");
            ExitCode::FAILURE
        }
    }
}
