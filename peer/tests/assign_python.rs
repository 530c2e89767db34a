//! The Python reference (`tests/assign_reference.py`) reproduces the
//! locality-aware assignment exactly, and `global_step` cuts the steps the
//! planner's reference (`agent/tests/planner_reference.py`) deals out.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use granary_peer::assign::{assign_step, global_step, Assignment, Layout};

fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// SplitMix64: a small deterministic generator for the random cases.
struct Rng(granary_base::SplitMix64);

impl Rng {
    /// Uniform in `0 .. n` (n ≥ 1; the modulo bias is irrelevant here).
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
}

struct Case {
    nodes: u32,
    node_of_rank: Vec<u32>,
    batch: u32,
    samples: Vec<u64>,
    holders: Vec<Option<u32>>,
}

/// A random step: random nodes, ranks per node (some nodes without ranks),
/// batch size, samples drawn from a small range (so duplicates occur, as
/// padding makes them), and a holder per distinct sample (uniform, skewed
/// towards a few nodes, or none).
fn random_case(rng: &mut Rng) -> Case {
    let nodes = match rng.below(4) {
        0 => 1 + rng.below(2) as u32,
        1 | 2 => 1 + rng.below(8) as u32,
        _ => 1 + rng.below(64) as u32,
    };
    let max_ranks = if nodes > 16 { 2 } else { 5 };
    let mut node_of_rank = Vec::new();
    for v in 0..nodes {
        let ranks = if rng.below(8) == 0 {
            0
        } else {
            rng.below(max_ranks)
        };
        node_of_rank.extend(std::iter::repeat_n(v, ranks as usize));
    }
    if node_of_rank.is_empty() {
        node_of_rank.push(rng.below(u64::from(nodes)) as u32);
    }
    // Ranks are not necessarily contiguous per node: shuffle them.
    for i in (1..node_of_rank.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        node_of_rank.swap(i, j);
    }
    let max_batch = if rng.below(2) == 0 { 4 } else { 24 };
    let batch = 1 + rng.below(max_batch) as u32;
    let n = node_of_rank.len() * batch as usize;
    let domain = 1 + rng.below(2 * n as u64 + 1);
    let none_per_mille = [0, 0, 100, 500, 1000][rng.below(5) as usize];
    let skew = rng.below(3) == 0;
    let mut holder_of = std::collections::HashMap::new();
    let mut samples = Vec::with_capacity(n);
    let mut holders = Vec::with_capacity(n);
    for _ in 0..n {
        let s = rng.below(domain);
        let h = *holder_of.entry(s).or_insert_with(|| {
            if rng.below(1000) < none_per_mille {
                None
            } else if skew {
                Some(rng.below(u64::from(nodes.min(3))) as u32)
            } else {
                Some(rng.below(u64::from(nodes)) as u32)
            }
        });
        samples.push(s);
        holders.push(h);
    }
    Case {
        nodes,
        node_of_rank,
        batch,
        samples,
        holders,
    }
}

fn join<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn write_case(input: &mut String, c: &Case) {
    let holders = join(
        c.holders
            .iter()
            .map(|h| h.map_or_else(|| "-".to_string(), |v| v.to_string())),
    );
    let _ = writeln!(input, "{} {}", c.nodes, c.batch);
    let _ = writeln!(input, "{}", join(&c.node_of_rank));
    let _ = writeln!(input, "{}", join(&c.samples));
    let _ = writeln!(input, "{holders}");
}

/// The reference's output format for one case.
fn write_result(out: &mut String, a: &Assignment, layout: &Layout) {
    for r in 0..layout.world_size() {
        let _ = writeln!(out, "r {}", join(a.rank(r)));
    }
    for v in 0..layout.nodes() {
        let _ = writeln!(out, "n {}", join(a.node(v)));
    }
    let s = a.stats();
    let _ = writeln!(out, "s {} {} {}", s.local, s.uncached, s.moved);
    let transfers = join(
        s.transfers
            .iter()
            .map(|t| format!("{} {} {}", t.from, t.to, t.samples)),
    );
    let _ = writeln!(out, "t {transfers}");
}

fn run_python(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new("python3")
        .args(args)
        .current_dir(tests_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run python3 (needed by this test): {e}"));
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let input = stdin.to_string();
    let writer = std::thread::spawn(move || pipe.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("python3 runs");
    writer
        .join()
        .expect("writer thread")
        .expect("input written");
    assert!(
        output.status.success(),
        "python3 {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("output is UTF-8")
}

#[test]
fn assignments_match_reference() {
    let mut rng = Rng(granary_base::SplitMix64(0x6772_616E_6172_7933));
    let mut input = String::new();
    let mut expected = String::new();
    let mut cases = 0;
    let mut moved_cases = 0;
    let mut multi_transfer_cases = 0;
    while cases < 3000 {
        let c = random_case(&mut rng);
        let layout = Layout::new(c.nodes, c.node_of_rank.clone()).expect("valid layout");
        let a = assign_step(&c.samples, &c.holders, &layout, c.batch).expect("valid step");
        moved_cases += usize::from(a.stats().moved > 0);
        multi_transfer_cases += usize::from(a.stats().transfers.len() > 1);
        write_case(&mut input, &c);
        write_result(&mut expected, &a, &layout);
        cases += 1;
    }
    // The random cases exercise the balancing, not only the easy paths.
    assert!(moved_cases > 1000, "only {moved_cases} cases moved samples");
    assert!(
        multi_transfer_cases > 300,
        "only {multi_transfer_cases} cases made several transfers"
    );
    let got = run_python(&["assign_reference.py", "--stdin"], &input);
    let (exp_lines, got_lines): (Vec<_>, Vec<_>) =
        (expected.lines().collect(), got.lines().collect());
    assert_eq!(exp_lines.len(), got_lines.len(), "line counts differ");
    for (i, (e, g)) in exp_lines.iter().zip(&got_lines).enumerate() {
        assert_eq!(e, g, "line {i} differs");
    }
}

/// Prints, for each planner parameter set, the epoch permutation and then
/// every rank's batches (`rank batch-index samples...`).
const PLANNER_SCRIPT: &str = r#"
import sys
sys.path.insert(0, "../../agent/tests")
from planner_reference import epoch_permutation, plan_batches
for line in sys.stdin:
    seed, epoch, n, ws, bs, dl = map(int, line.split())
    print(" ".join(map(str, epoch_permutation(seed, epoch, n))))
    for r in range(ws):
        bl = plan_batches(seed=seed, epoch=epoch, n=n, rank=r, world_size=ws,
                          batch_size=bs, drop_last=bool(dl))
        print(len(bl))
        for b in bl:
            print(" ".join(map(str, b)))
"#;

#[test]
fn global_steps_match_planner_reference() {
    let params: [(u64, u32, u64, u32, u32, bool); 12] = [
        (42, 0, 10, 2, 3, false),
        (42, 0, 10, 4, 2, false),
        (42, 0, 10, 4, 2, true),
        (7, 3, 1001, 7, 10, false),
        (7, 3, 1001, 7, 10, true),
        (1, 0, 3, 8, 1, false),
        (1, 0, 3, 8, 1, true),
        (1, 0, 1, 5, 2, false),
        (9, 1, 50, 2, 1000, false),
        (9, 1, 50, 2, 1000, true),
        (u64::MAX, u32::MAX, 777, 3, 5, false),
        (5, 2, 5000, 16, 32, false),
    ];
    let input: String = params
        .iter()
        .map(|&(seed, epoch, n, ws, bs, dl)| {
            format!("{seed} {epoch} {n} {ws} {bs} {}\n", u8::from(dl))
        })
        .collect();
    let output = run_python(&["-c", PLANNER_SCRIPT], &input);
    let mut lines = output.lines();
    let mut ints = |what: &str| -> Vec<u64> {
        lines
            .next()
            .unwrap_or_else(|| panic!("reference output ends before {what}"))
            .split_ascii_whitespace()
            .map(|x| x.parse().expect("integers"))
            .collect()
    };
    for &(seed, epoch, n, ws, bs, dl) in &params {
        let perm = ints("permutation");
        assert_eq!(perm.len() as u64, n);
        let mut batches_of_rank = Vec::new();
        for _ in 0..ws {
            let count = ints("a batch count")[0];
            batches_of_rank.push((0..count).map(|_| ints("a batch")).collect::<Vec<_>>());
        }
        let steps = batches_of_rank[0].len() as u64;
        for step in 0..steps {
            let g = global_step(&perm, ws, bs, dl, step)
                .expect("valid parameters")
                .unwrap_or_else(|| panic!("step {step} missing for seed {seed} epoch {epoch}"));
            assert_eq!(
                g.samples.len() as u64,
                u64::from(ws) * u64::from(g.batch_size)
            );
            for (r, batches) in batches_of_rank.iter().enumerate() {
                let ours: Vec<u64> = g
                    .samples
                    .iter()
                    .skip(r)
                    .step_by(ws as usize)
                    .copied()
                    .collect();
                assert_eq!(
                    ours, batches[step as usize],
                    "rank {r} step {step} differs for {seed} {epoch} {n} {ws} {bs} {dl}"
                );
            }
        }
        assert_eq!(global_step(&perm, ws, bs, dl, steps).expect("valid"), None);
    }
}
