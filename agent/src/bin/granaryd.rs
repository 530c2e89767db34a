//! `granaryd`: the Granary agent daemon (a thin binary over the library).

use granary_agent::config::Config;
use std::process::ExitCode;

const USAGE: &str = "usage: granaryd run --config FILE
       granaryd validate --config FILE
       granaryd print-default-config";

fn config_arg(args: &[String]) -> Result<&str, String> {
    match args {
        [flag, path] if flag == "--config" || flag == "-c" => Ok(path),
        _ => Err(format!("expected --config FILE\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("print-default-config") => {
            print!("{}", Config::default_toml());
            Ok(())
        }
        Some("validate") => config_arg(&args[1..]).and_then(|p| {
            Config::load(p)
                .map(|c| println!("{p}: OK ({} dataset(s))", c.datasets.len()))
                .map_err(|e| e.to_string())
        }),
        Some("run") => config_arg(&args[1..]).and_then(|p| {
            let cfg = Config::load(p).map_err(|e| e.to_string())?;
            granary_agent::daemon::run(cfg).map_err(|e| e.to_string())
        }),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("granaryd: {e}");
            ExitCode::FAILURE
        }
    }
}
