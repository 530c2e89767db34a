//! The planner's Python reference (`tests/planner_reference.py`), run as a
//! child process: what it prints for a plan, to hold the agent's order to.
#![allow(dead_code)] // not every suite uses each

use granary_agent::planner::PlanParams;
use granary_testkit::granaryd::run_ok;
use std::path::PathBuf;
use std::process::Command;

/// The reference script.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/planner_reference.py")
}

/// Runs the reference with `args` and returns its lines, each parsed as
/// space-separated integers.
pub fn run(args: &[String]) -> Vec<Vec<u64>> {
    let mut python = Command::new("python3");
    python.arg(script()).args(args);
    let what = format!("planner_reference.py {args:?} (python3 is needed by this test)");
    run_ok(&mut python, &what)
        .lines()
        .map(|line| {
            line.split_ascii_whitespace()
                .map(|x| x.parse().expect("reference prints integers"))
                .collect()
        })
        .collect()
}

/// The arguments that make the reference print the batches of `p`'s rank
/// in `epoch`.
pub fn batch_args(p: &PlanParams, epoch: u32) -> Vec<String> {
    let mut args: Vec<String> = format!(
        "--seed {} --epoch {epoch} --n {} --rank {} --world-size {} --batch-size {}",
        p.seed, p.num_samples, p.rank, p.world_size, p.batch_size
    )
    .split(' ')
    .map(str::to_owned)
    .collect();
    if p.drop_last {
        args.push("--drop-last".to_owned());
    }
    args
}

/// The batches of `p`'s rank in `epoch`, as the reference prints them.
pub fn batches(p: &PlanParams, epoch: u32) -> Vec<Vec<u64>> {
    run(&batch_args(p, epoch))
}
