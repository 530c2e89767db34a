//! A small command-line parser for `--name value` options and `--flag`
//! switches, shared by the end-to-end benchmarks, and the `main` of the
//! benchmark binaries whose options are one clap struct.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Display;
use std::process::ExitCode;

/// Parsed options.
pub struct Args {
    values: HashMap<String, String>,
    flags: Vec<String>,
}

impl Args {
    /// Parses `args`: names in `switches` take no value, every other
    /// `--name` takes the next argument. `--help` prints `usage` and exits.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        switches: &[&str],
        usage: &str,
    ) -> Result<Args, String> {
        let mut values = HashMap::new();
        let mut flags = Vec::new();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            if a == "--help" || a == "-h" {
                println!("{usage}");
                std::process::exit(0);
            }
            let Some(name) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument {a:?}\n{usage}"));
            };
            if switches.contains(&name) {
                flags.push(name.to_owned());
            } else {
                let v = it
                    .next()
                    .ok_or_else(|| format!("--{name} needs a value\n{usage}"))?;
                values.insert(name.to_owned(), v);
            }
        }
        Ok(Args { values, flags })
    }

    /// Whether `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    /// `--name N` as an integer (underscores allowed), or `default`.
    pub fn u64(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(v) => v
                .replace('_', "")
                .parse()
                .map_err(|_| format!("--{name}: not a number: {v}")),
        }
    }

    /// `--name N` as a `u32`, or `default`.
    pub fn u32(&self, name: &str, default: u32) -> Result<u32, String> {
        let v = self.u64(name, u64::from(default))?;
        u32::try_from(v).map_err(|_| format!("--{name}: {v} is too large"))
    }

    /// `--name TEXT`, or `default`.
    pub fn string(&self, name: &str, default: &str) -> String {
        self.values
            .get(name)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }

    /// `--name A,B,C` as integers, or `default`.
    pub fn list(&self, name: &str, default: &[u64]) -> Result<Vec<u64>, String> {
        match self.values.get(name) {
            None => Ok(default.to_vec()),
            Some(v) => v
                .split(',')
                .map(|x| {
                    x.trim()
                        .replace('_', "")
                        .parse()
                        .map_err(|_| format!("--{name}: not a number: {x}"))
                })
                .collect(),
        }
    }
}

/// A clap value parser: an integer, underscores allowed (`20_000`), as
/// [`Args::u64`] reads it.
pub fn num<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.trim()
        .replace('_', "")
        .parse()
        .map_err(|_| format!("not a number (or too large): {v}"))
}

/// Parses `args` (the program's name first) as the options `O` of the
/// benchmark command `name` (`bench/run NAME`).
pub fn parse_args<O: clap::Args>(
    name: &'static str,
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<O, clap::Error> {
    // About after the options: their struct's doc comment would replace it.
    let mut command = O::augment_args(clap::Command::new(name))
        .about(env!("CARGO_PKG_DESCRIPTION"))
        .long_about(None);
    let matches = command.try_get_matches_from_mut(args)?;
    O::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// The whole `main` of a benchmark binary whose options are one clap
/// [`clap::Args`] struct `O`: parses them as the command `name`
/// (`bench/run NAME`), runs `run` and reports its error on stderr as
/// `NAME: error` with a failing exit status.
pub fn bench_main<O: clap::Args, E: Display>(
    name: &'static str,
    run: impl FnOnce(&O) -> Result<(), E>,
) -> ExitCode {
    let options = parse_args(name, std::env::args_os()).unwrap_or_else(|e| e.exit());
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let short = name.strip_prefix("bench/run ").unwrap_or(name);
            eprintln!("{short}: {e}");
            ExitCode::FAILURE
        }
    }
}
