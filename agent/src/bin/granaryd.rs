//! `granaryd`: the Granary agent daemon (a thin binary over the library).

use clap::{Parser, Subcommand};
use granary_agent::config::Config;
use granary_agent::logging::{self, LogFormat};
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: granary_agent::Allocator = granary_agent::Allocator;

/// The Granary agent: a per-node cache that streams training samples to
/// data loaders through shared memory.
#[derive(Debug, Parser)]
#[command(name = "granaryd", version = granary_agent::build_version!(), about, propagate_version = true)]
struct Cli {
    /// Log format on standard error: text or json (default: $GRANARY_LOG_FORMAT, else text).
    /// Which events: $RUST_LOG (default info).
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve until SIGTERM or SIGINT.
    Run {
        /// The configuration file (TOML).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Check a configuration file and exit.
    Validate {
        /// The configuration file (TOML).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Print the default configuration, commented.
    PrintDefaultConfig,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut logging_on = false;
    let result = match cli.command {
        Cmd::PrintDefaultConfig => {
            print!("{}", Config::default_toml());
            Ok(())
        }
        Cmd::Validate { config } => granary_agent::startup::load_for_this_machine(&config)
            .map(|c| {
                for w in c.secret_file_warnings(&config) {
                    eprintln!("granaryd: warning: {w}");
                }
                println!("{}: OK ({} dataset(s))", config.display(), c.datasets.len())
            })
            .map_err(|e| e.to_string()),
        Cmd::Run { config } => LogFormat::resolve(cli.log_format)
            .map_err(|e| format!("{}: {e}", logging::FORMAT_ENV))
            .and_then(|format| {
                logging::init(format);
                logging_on = true;
                let cfg = granary_agent::startup::load_for_this_machine(&config)
                    .map_err(|e| e.to_string())?;
                for w in cfg.secret_file_warnings(&config) {
                    tracing::warn!("{w}");
                }
                granary_agent::daemon::run(cfg).map_err(|e| e.to_string())
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if logging_on => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("granaryd: {e}");
            ExitCode::FAILURE
        }
    }
}
