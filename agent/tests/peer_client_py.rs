//! `tools/peer_client.py`, a peer client written from docs/peers.md alone
//! (Python over the `cryptography` package), against a real `granaryd`.
//!
//! The agent ("n0", on 127.0.0.2) holds a static view of two members:
//! itself and the client ("py"), with keep sizes such that n0 keeps some of
//! the samples it owns and not others. The client computes the view digest
//! and the dataset fingerprint itself, dials n0, completes the handshake and
//! asks for every sample of the dataset:
//!
//! * the fingerprint it computed from the tree is the one the agent logged;
//! * blocks arrive with a correct block CRC and exactly the file's bytes,
//!   every other sample is a `NotOwner` or `NotKept` miss, each sample
//!   answered once, the same blocks in every run;
//! * with `encryption = "on"` for both suites (AES-256-GCM with vector-get
//!   frames, ChaCha20-Poly1305 with get frames), and with `"off"`;
//! * the same client with another secret, or the other protection, gets
//!   no byte back and its connection is closed; the agent counts it and
//!   goes on serving (a later handshake gets the same blocks, and
//!   `granary_peer_served_total` counts every block sent).
//!
//! The test needs `python3` with `cryptography` (`scripts/setup.sh test`
//! installs it) and fails, saying so, without them.

mod common;
mod common_peers;

use common::watchdog;
use common_peers::{free_port, Agent};
use granary_testkit::agent_toml::{fs_dataset, static_peers, PEER_PREFETCH, TEST_SECRET as SECRET};
use granary_tools::synth::SynthSpec;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const OTHER_SECRET: &str = "0f3b1e5a9d2c4b7e8a6f1d0c3b5a7e9f2d4c6b8a0e1f3d5c7b9a2e4f6d8c0b1a";
const JOB: &str = "py-job";
const DATASET: &str = "data";
const FILES: u64 = 240;
/// n0's keep, in the view: about a third of what it owns (alignment
/// included), so that it both serves and answers `NotKept`.
const KEEP_N0: u64 = 192 * 1024;
const KEEP_PY: u64 = 1 << 20;
const MISS_NOT_OWNER: u64 = 1;
const MISS_NOT_KEPT: u64 = 2;

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/peer_client.py")
}

/// Fails (does not skip) when the client cannot run here.
fn require_python() {
    let out = Command::new("python3")
        .args(["-c", "import cryptography; print(cryptography.__version__)"])
        .output()
        .unwrap_or_else(|e| {
            panic!("this test needs python3 (with the `cryptography` package): {e}; run scripts/setup.sh test")
        });
    assert!(
        out.status.success(),
        "this test needs the Python package `cryptography` (python3 -m pip install cryptography, \
         or scripts/setup.sh test):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Setup {
    _tmp: tempfile::TempDir,
    spec: SynthSpec,
    agent: Agent,
    listen: String,
    py_addr: String,
    out: PathBuf,
}

fn start(encryption: &str) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let spec = granary_testkit::dataset::synth_at(&data, FILES, 4, 3_000);
    let ip = Agent::ip(0);
    let listen = format!("{ip}:{}", free_port(&ip));
    // Never dialled: n0 has no loader, so it asks nobody for anything.
    let py_addr = format!("{}:{}", Agent::ip(1), free_port(&Agent::ip(1)));
    let members = format!(
        "[{{ id = \"n0\", addr = \"{listen}\", keep = \"{KEEP_N0}B\" }}, \
         {{ id = \"py\", addr = \"{py_addr}\", keep = \"{KEEP_PY}B\" }}]"
    );
    let tables = static_peers(JOB, "n0", &listen, SECRET, &members)
        + &format!("encryption = \"{encryption}\"\n")
        + &fs_dataset(DATASET, &data, "");
    let mut agent = Agent::new(tmp.path(), 0, "64MiB", PEER_PREFETCH, &tables);
    agent.start();
    let out = tmp.path().join("blocks");
    Setup {
        _tmp: tmp,
        spec,
        agent,
        listen,
        py_addr,
        out,
    }
}

impl Setup {
    /// Runs the client for every sample; its exit code and JSON report.
    fn client(&self, secret: &str, suite: &str, encryption: &str, single: bool) -> (i32, Value) {
        let _ = std::fs::remove_dir_all(&self.out);
        std::fs::create_dir_all(&self.out).unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg(client_script())
            .args(["--agent", &self.listen])
            .args(["--secret", secret])
            .args(["--job", JOB, "--epoch", "0"])
            .args(["--member", &format!("n0,{},{KEEP_N0}", self.listen)])
            .args(["--member", &format!("py,{},{KEEP_PY}", self.py_addr)])
            .args(["--node-id", "py", "--peer-id", "n0"])
            .args(["--suite", suite, "--encryption", encryption])
            .arg("--fs-root")
            .arg(&self.spec.root)
            .args(["--dataset", DATASET, "--all", "--timeout-s", "30"])
            .arg("--out-dir")
            .arg(&self.out);
        if single {
            cmd.arg("--single");
        }
        let out = cmd.output().expect("run python3 tools/peer_client.py");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "peer_client.py printed no report ({e}); status {}\nstdout:\n{stdout}\nstderr:\n{}\nagent log:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                self.agent.log()
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }

    /// The fingerprint the agent logged for the dataset's directory.
    fn logged_fingerprint(&self) -> u64 {
        let log = self.agent.log();
        let line = log
            .lines()
            .find(|l| l.contains("peer directory computed"))
            .unwrap_or_else(|| panic!("no directory computed:\n{log}"));
        let hex = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("fingerprint="))
            .expect("fingerprint= in the directory line");
        u64::from_str_radix(hex, 16).unwrap()
    }

    /// Checks a completed run against the files; the samples served.
    fn check_blocks(&self, what: &str, code: i32, r: &Value) -> BTreeSet<u64> {
        assert_eq!(code, 0, "{what}: the client failed: {r}");
        assert_eq!(r["handshake"], true, "{what}: {r}");
        let hello = &r["peer_hello"];
        assert_eq!(hello["node_id"], "n0", "{what}: {hello}");
        assert_eq!(hello["job_id"], JOB, "{what}: {hello}");
        assert_eq!(hello["version"], 4, "{what}: {hello}");
        assert_eq!(
            hello["view_digest"], r["view_digest"],
            "{what}: the listener's view digest is the one the client computed from the docs"
        );
        assert_eq!(
            r["fingerprint"].as_u64(),
            Some(self.logged_fingerprint()),
            "{what}: the fingerprint computed from docs/peers.md is the agent's"
        );
        let results = r["results"].as_array().expect("results");
        assert_eq!(results.len() as u64, FILES, "{what}: one answer per sample");
        let mut served = BTreeSet::new();
        let (mut not_owner, mut not_kept) = (0, 0);
        for (i, x) in results.iter().enumerate() {
            let sample = x["sample"].as_u64().unwrap();
            assert_eq!(sample, i as u64, "{what}: answers in the order asked");
            match x["outcome"].as_str() {
                Some("data") => {
                    assert_eq!(
                        x["crc_ok"], true,
                        "{what}: block CRC of sample {sample}: {x}"
                    );
                    let want = std::fs::read(self.spec.path_of(sample)).unwrap();
                    let got = std::fs::read(self.out.join(format!("{sample}.bin"))).unwrap();
                    assert_eq!(x["length"].as_u64(), Some(want.len() as u64), "{what}: {x}");
                    assert!(
                        got == want,
                        "{what}: sample {sample}'s bytes differ from its file"
                    );
                    served.insert(sample);
                }
                Some("miss") => match x["reason"].as_u64() {
                    Some(MISS_NOT_OWNER) => not_owner += 1,
                    Some(MISS_NOT_KEPT) => not_kept += 1,
                    _ => panic!("{what}: sample {sample}: a miss n0 has no reason to give: {x}"),
                },
                _ => panic!("{what}: sample {sample}: {x}"),
            }
        }
        assert_eq!(r["blocks"].as_u64(), Some(served.len() as u64), "{what}");
        assert_eq!(r["crc_failures"], 0, "{what}");
        assert!(!served.is_empty(), "{what}: no block arrived: {r}");
        assert!(not_owner > 0, "{what}: py owns none of the samples: {r}");
        assert!(not_kept > 0, "{what}: n0 keeps all it owns: {r}");
        eprintln!(
            "{what}: {} blocks, {not_owner} not owner, {not_kept} not kept",
            served.len()
        );
        served
    }

    /// A client the listener must refuse: nothing comes back, the
    /// connection is closed.
    fn check_refused(&self, what: &str, secret: &str, encryption: &str) {
        let (code, r) = self.client(secret, "aes-256-gcm", encryption, false);
        assert_eq!(code, 2, "{what}: {r}");
        assert_eq!(r["handshake"], false, "{what}: {r}");
        assert_eq!(r["bytes_received"], 0, "{what}: the listener answered: {r}");
        assert_eq!(r["closed"], true, "{what}: {r}");
        let blocks = std::fs::read_dir(&self.out).unwrap().count();
        assert_eq!(blocks, 0, "{what}: blocks written");
    }
}

#[test]
fn python_client_from_the_docs_gets_blocks_with_encryption_on_in_both_suites() {
    let _w = watchdog("peer_client_py on", 300);
    require_python();
    let s = start("on");
    let aes = s.client(SECRET, "aes-256-gcm", "on", false);
    let served = s.check_blocks("AES-256-GCM, vector-get", aes.0, &aes.1);
    let chacha = s.client(SECRET, "chacha20-poly1305", "on", true);
    let again = s.check_blocks("ChaCha20-Poly1305, get", chacha.0, &chacha.1);
    assert_eq!(served, again, "the same blocks in both runs");

    s.check_refused("another secret", OTHER_SECRET, "on");
    s.check_refused(
        "authenticated-only records asked of an encrypting agent",
        SECRET,
        "off",
    );
    assert!(s.agent.metric("granary_peer_rejected_total", "handshake") >= 1.0);
    assert!(s.agent.metric("granary_peer_rejected_total", "protection") >= 1.0);

    // Still serving.
    let last = s.client(SECRET, "aes-256-gcm", "on", false);
    let third = s.check_blocks("after the refusals", last.0, &last.1);
    assert_eq!(served, third);
    assert_eq!(
        s.agent.metric("granary_peer_served_total", ""),
        3.0 * served.len() as f64,
        "every block sent counted once"
    );
}

#[test]
fn python_client_from_the_docs_gets_blocks_with_encryption_off() {
    let _w = watchdog("peer_client_py off", 300);
    require_python();
    let s = start("off");
    let (code, r) = s.client(SECRET, "aes-256-gcm", "off", false);
    let served = s.check_blocks("authenticated only, AES-256-GCM", code, &r);
    let (code, r) = s.client(SECRET, "chacha20-poly1305", "off", true);
    assert_eq!(
        served,
        s.check_blocks("authenticated only, ChaCha20-Poly1305", code, &r)
    );

    s.check_refused("another secret", OTHER_SECRET, "off");
    s.check_refused(
        "encrypted records asked of an authenticating agent",
        SECRET,
        "on",
    );
    assert!(s.agent.metric("granary_peer_rejected_total", "handshake") >= 1.0);
    assert!(s.agent.metric("granary_peer_rejected_total", "protection") >= 1.0);
    assert_eq!(
        s.agent.metric("granary_peer_served_total", ""),
        2.0 * served.len() as f64
    );
    let (code, r) = s.client(SECRET, "aes-256-gcm", "off", false);
    assert_eq!(served, s.check_blocks("after the refusals", code, &r));
}
