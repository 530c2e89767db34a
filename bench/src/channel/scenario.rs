//! What is measured and how it is named: the suites and protections, the
//! call paths, the blocks' bytes, each side's configuration, the CPU's
//! flags.

use granary_peer::channel::{Protection, Suite};
use granary_peer::conn::ConnConfig;

use super::Result;

/// Bytes of a payload sealed per `seal_payload` call, as the agent's
/// transport does (`SEAL_CHUNK` in `agent/src/peers/net/conn/write.rs`).
pub const SEAL_CHUNK: u64 = 256 * 1024;
/// Both protections, encrypted first.
pub const PROTECTIONS: [Protection; 2] = [Protection::Encrypted, Protection::Authenticated];

/// `suite/protection`, as `--only` takes it.
pub fn parse_pair(s: &str) -> Result<(Suite, Protection)> {
    let (suite, prot) = s
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("--only: {s}: not suite/protection"))?;
    let suite = Suite::ALL
        .into_iter()
        .find(|x| x.as_str() == suite)
        .ok_or_else(|| format!("--only: unknown suite {suite}"))?;
    let prot = PROTECTIONS
        .into_iter()
        .find(|p| prot_name(*p) == prot)
        .ok_or_else(|| format!("--only: unknown protection {prot}"))?;
    Ok((suite, prot))
}

/// A suite's name (`aes-256-gcm`, ...).
pub fn suite_name(s: Suite) -> &'static str {
    s.as_str()
}

/// A protection's name: `encrypted` or `authenticated`.
pub fn prot_name(p: Protection) -> &'static str {
    match p {
        Protection::Encrypted => "encrypted",
        Protection::Authenticated => "authenticated",
    }
}

/// A block size in words: `110 KiB`, `1 MiB`, `100 B`.
pub fn size_name(size: usize) -> String {
    if size.is_multiple_of(1024 * 1024) {
        format!("{} MiB", size / (1024 * 1024))
    } else if size.is_multiple_of(1024) {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

/// Bytes every block of the run starts from: not all equal, not compressible
/// by accident.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(granary_base::GAMMA) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One side's channel configuration: a benchmark job and secret, `node`
/// as its id, the suite and protection given.
pub fn conn_config(node: &str, suite: Suite, protection: Protection) -> ConnConfig {
    let mut c = ConnConfig::new(
        "bench-channel",
        node,
        [7; 32],
        1,
        b"granary channel benchmark secret, 32+ bytes".to_vec(),
    );
    c.suite = suite;
    c.protection = protection;
    c
}

/// Which calls move a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// The owner seals with `seal_payload`, its fill closure copying from
    /// the source into a cleared `Vec`; the requester copies `payload()`
    /// into the destination (what `agent/src/peers/net/` calls today).
    Copying,
    /// The owner seals with `seal_payload_into`, encrypting straight from
    /// the source into a reused buffer; the requester opens each payload
    /// record straight into the destination with `payload_into`.
    Direct,
}

impl Api {
    /// Both, direct first.
    pub const ALL: [Api; 2] = [Api::Direct, Api::Copying];

    /// Its name in options, tables and JSON keys.
    pub fn name(self) -> &'static str {
        match self {
            Api::Copying => "copying",
            Api::Direct => "direct",
        }
    }

    /// The calls it makes, in words.
    pub fn calls(self) -> &'static str {
        match self {
            Api::Copying => "seal_payload + payload(), as the agent calls today",
            Api::Direct => "seal_payload_into + payload_into",
        }
    }
}

/// The CPU's flags that matter to the AEADs, as `/proc/cpuinfo` lists them.
pub fn cpu_flags() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.split_whitespace().collect())
        .unwrap_or_default();
    let want = [
        "aes",
        "pclmulqdq",
        "vaes",
        "vpclmulqdq",
        "avx2",
        "avx512f",
        "pmull",
    ];
    let have: Vec<&str> = want.into_iter().filter(|w| flags.contains(w)).collect();
    if have.is_empty() {
        "none of aes/pclmulqdq/vaes/avx2/avx512f/pmull".to_owned()
    } else {
        have.join(" ")
    }
}
