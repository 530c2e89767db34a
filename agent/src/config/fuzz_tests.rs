//! The configuration parser against hostile input: thousands of mutations
//! of the default file (lines deleted, duplicated, swapped; values replaced
//! by out-of-range numbers, wrong types, odd strings; tables added) and
//! random token soup. It never panics, and every refusal is a message
//! saying what is wrong. A new seed each run, printed so a failure can be
//! replayed (`GRANARY_CONFIG_FUZZ_SEED`); `GRANARY_CONFIG_FUZZ_CASES` sets
//! the count (`scripts/soak.sh` runs more).

use super::Config;
use granary_base::hash::{mix64, GAMMA};

/// Cases per test when `GRANARY_CONFIG_FUZZ_CASES` does not say.
const DEFAULT_CASES: u64 = 3000;

/// Values a mutation writes after a `=`.
const VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "7",
    "4294967296",
    "18446744073709551615",
    "99999999999999999999999",
    "1e309",
    "-0.0",
    "nan",
    "inf",
    "\"\"",
    "\"64TiB\"",
    "\"3MiB\"",
    "\"-5MiB\"",
    "\"1.5GiB\"",
    "\"0x10\"",
    "\"\\u0000\"",
    "\"é\"",
    "true",
    "[]",
    "{}",
    "[1, \"a\"]",
    "[4294967296]",
    "{ a = 1 }",
    "\"/\"",
    "\"../../x\"",
    "\"auto\"",
    "\"tcp\"",
    "\"rdma\"",
    "\"required\"",
    "\"off\"",
    "\"s3\"",
    "\"cql\"",
    "1979-05-27T07:32:00Z",
    "0o777",
];

/// Lines a mutation inserts.
const LINES: &[&str] = &[
    "[arena]",
    "[[dataset]]",
    "[dataset]",
    "[[arena]]",
    "[peers]",
    "[sessions]",
    "[prefetch]",
    "[metrics]",
    "[socket]",
    "[cache]",
    "[dataset.retry]",
    "[unknown]",
    "name = \"d\"",
    "kind = \"s3\"",
    "kind = \"cql\"",
    "kind = \"fs\"",
    "root = \"/tmp\"",
    "bucket = \"b\"",
    "manifest = \"m.tsv\"",
    "members = [\"a:1\", \"a:1\"]",
    "secret_file = \"/nonexistent\"",
    "x = 1",
    "=",
    "[",
    "\"",
    "a.b.c = 1",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix64(self.0)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

fn seed_and_cases() -> (u64, u64) {
    let seed = env_u64("GRANARY_CONFIG_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let cases = env_u64("GRANARY_CONFIG_FUZZ_CASES").unwrap_or(DEFAULT_CASES);
    (seed, cases)
}

/// The default file (with its example dataset): the input to mutate.
fn base() -> Vec<String> {
    Config::default_toml().lines().map(str::to_owned).collect()
}

fn mutate(rng: &mut Rng, lines: &mut Vec<String>) {
    let n = lines.len();
    let i = rng.below(n);
    match rng.below(7) {
        0 if n > 1 => {
            lines.remove(i);
        }
        1 => {
            let l = lines[i].clone();
            lines.insert(rng.below(n + 1), l);
        }
        2 => {
            let j = rng.below(n);
            lines.swap(i, j);
        }
        3 => lines.insert(rng.below(n + 1), rng.pick(LINES).to_owned()),
        4 => {
            // Cut a line at a random byte boundary.
            let l = &lines[i];
            let cut = (0..=l.len())
                .filter(|&k| l.is_char_boundary(k))
                .nth(rng.below(l.len() + 1))
                .unwrap_or(0);
            lines[i] = l[..cut].to_owned();
        }
        _ => {
            // Replace a value; pick another line when this one has none.
            let value = rng.pick(VALUES);
            let at = (0..n)
                .map(|k| (i + k) % n)
                .find(|&k| lines[k].contains(" = "));
            if let Some(k) = at {
                let key = lines[k].split(" = ").next().unwrap_or("").to_owned();
                lines[k] = format!("{key} = {value}");
            }
        }
    }
}

/// Parses `text`; fails the test on a panic or an empty refusal. Returns
/// whether it was accepted.
fn parse_or_refuse(text: &str, seed: u64, case: u64) -> bool {
    let result = std::panic::catch_unwind(|| Config::from_toml_str(text));
    let Ok(result) = result else {
        panic!("the parser panicked (GRANARY_CONFIG_FUZZ_SEED={seed}, case {case}) on:\n{text}");
    };
    match result {
        Ok(_) => true,
        Err(e) => {
            let msg = e.to_string();
            assert!(
                !msg.trim().is_empty() && msg.len() < 64 * 1024,
                "an empty or runaway refusal ({} bytes; seed {seed}, case {case}) of:\n{text}",
                msg.len()
            );
            false
        }
    }
}

#[test]
fn mutated_configurations_parse_or_are_refused_with_a_message() {
    let (seed, cases) = seed_and_cases();
    println!("config fuzz: GRANARY_CONFIG_FUZZ_SEED={seed}, {cases} cases");
    let base = base();
    assert!(
        parse_or_refuse(&base.join("\n"), seed, 0),
        "the unmutated base must parse"
    );
    let mut rng = Rng(seed);
    let mut accepted = 0;
    for case in 1..=cases {
        let mut lines = base.clone();
        for _ in 0..=rng.below(4) {
            mutate(&mut rng, &mut lines);
        }
        if parse_or_refuse(&lines.join("\n"), seed, case) {
            accepted += 1;
        }
    }
    println!("config fuzz: {accepted} of {cases} mutated files accepted, the rest refused");
    assert!(
        accepted < cases,
        "no mutation was refused: the mutations do not reach the checks"
    );
}

#[test]
fn token_soup_is_refused_with_a_message() {
    let (seed, cases) = seed_and_cases();
    println!("config soup: GRANARY_CONFIG_FUZZ_SEED={seed}, {cases} cases");
    let mut rng = Rng(seed ^ 0x5eed);
    const BITS: &[&str] = &[
        "[", "]", "[[", "]]", "=", "\"", "'", "\n", " ", "#", ".", ",", "{", "}", "a", "size",
        "arena", "dataset", "1", "-", "é", "\u{0}", "\\", "\"\"\"", "0x", "true",
    ];
    for case in 1..=cases {
        let text: String = (0..rng.below(200)).map(|_| rng.pick(BITS)).collect();
        parse_or_refuse(&text, seed, case);
    }
}

/// The files of `agent/fuzz/{seeds,regressions}/NAME` (the cargo-fuzz
/// targets' committed inputs), for the replays on the stable build.
pub(crate) fn committed_fuzz_inputs(name: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(dir) = std::fs::read_dir(root.join(kind).join(name)) else {
            continue;
        };
        for entry in dir.flatten() {
            let path = entry.path();
            if path.is_file() && path.extension().is_none_or(|e| e != "md") {
                let bytes = std::fs::read(&path).expect("a committed fuzz input reads");
                inputs.push((path, bytes));
            }
        }
    }
    inputs.sort();
    inputs
}

/// Every committed input of the `agent/config` cargo-fuzz target (its
/// seeds and regressions) through the target's own check, on the stable
/// build: CI replays them here instead of building the target with
/// sanitizers (docs/testing.md).
#[test]
fn the_config_fuzz_targets_committed_inputs_parse_or_are_refused() {
    let inputs = committed_fuzz_inputs("config");
    assert!(
        inputs.len() >= 100,
        "the config target's seeds and regressions are committed ({} found)",
        inputs.len()
    );
    let mut accepted = 0;
    for (case, (_, bytes)) in inputs.iter().enumerate() {
        let Ok(text) = std::str::from_utf8(bytes) else {
            continue;
        };
        if parse_or_refuse(text, 0, case as u64) {
            accepted += 1;
        }
    }
    println!(
        "config fuzz inputs: {} replayed, {accepted} accepted",
        inputs.len()
    );
}
