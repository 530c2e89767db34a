//! A dataset's identity across agents: its fingerprint.
//!
//! SHA-256 over, in order (integers little-endian):
//!
//! ```text
//! "granary-dataset-v2\0"
//! u64 len(name) ‖ name ‖ u64 len(kind) ‖ kind ‖ u64 samples
//! for each sample i: u64 sample_id ‖ u64 size ‖ u32 len(token) ‖ token
//! ```
//!
//! where `kind` is the source's (`"fs"`, `"s3"`, `"gcs"`, `"azure"`,
//! `"cql"`) and `token` the sample's version token
//! (the agent's `SampleSource::version`): what the store read
//! of the sample asks for and checks besides its length — an object's key,
//! offset and ETag; a file's mtime; a row's id and CRC-32C. The first 8
//! bytes of the digest, as a little-endian u64, are the fingerprint. Agents
//! serving the same catalog under the same name agree on it; any difference
//! (another version of one object, file or row) makes them disagree, and
//! their peers answer `UnknownDataset`: peers never exchange samples of
//! different versions (`docs/peers.md`, "Dataset identity").

use sha2::{Digest, Sha256};

/// Bytes gathered before they are handed to the hash: one call per chunk
/// rather than four per sample.
const CHUNK: usize = 64 << 10;

/// The fingerprint of dataset `name` of source kind `kind` and its `n`
/// samples, `sample(i, token)` appending sample `i`'s version token to
/// `token` and returning its `(sample_id, size)` (the module's definition).
pub fn fingerprint(
    name: &str,
    kind: &str,
    n: u64,
    mut sample: impl FnMut(u64, &mut Vec<u8>) -> (u64, u64),
) -> u64 {
    let mut h = Sha256::new();
    let mut buf = Vec::with_capacity(CHUNK + 4096);
    buf.extend_from_slice(b"granary-dataset-v2\0");
    for s in [name, kind] {
        buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
        buf.extend_from_slice(s.as_bytes());
    }
    buf.extend_from_slice(&n.to_le_bytes());
    let mut token = Vec::new();
    for i in 0..n {
        token.clear();
        let (sample_id, size) = sample(i, &mut token);
        buf.extend_from_slice(&sample_id.to_le_bytes());
        buf.extend_from_slice(&size.to_le_bytes());
        buf.extend_from_slice(&(token.len() as u32).to_le_bytes());
        buf.extend_from_slice(&token);
        if buf.len() >= CHUNK {
            h.update(&buf);
            buf.clear();
        }
    }
    h.update(&buf);
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, written out for one sample with `token`.
    fn by_hand(name: &str, kind: &str, id: u64, size: u64, token: &[u8]) -> u64 {
        let mut h = Sha256::new();
        h.update(b"granary-dataset-v2\0");
        for s in [name, kind] {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        h.update(1u64.to_le_bytes());
        h.update(id.to_le_bytes());
        h.update(size.to_le_bytes());
        h.update((token.len() as u32).to_le_bytes());
        h.update(token);
        u64::from_le_bytes(h.finalize()[..8].try_into().unwrap())
    }

    /// A fixed catalog's fingerprint, pinned (the value the agent computed
    /// before the definition moved here): every agent of a job must compute
    /// the same bytes, whichever version it runs.
    #[test]
    fn a_fixed_catalog_has_a_known_fingerprint() {
        let token7: Vec<u8> = (0..40).collect();
        let samples: [(u64, u64, &[u8]); 3] =
            [(0, 110_000, b"token-0"), (1, 3, b""), (7, 1 << 33, &token7)];
        let fp = fingerprint("imagenet-mini", "s3", 3, |i, token| {
            let (id, size, t) = samples[i as usize];
            token.extend_from_slice(t);
            (id, size)
        });
        assert_eq!(fp, 0x383f_f736_fa19_f5d9);
    }

    #[test]
    fn one_sample_matches_the_definition_and_every_field_counts() {
        let one = |name: &str, kind: &str, id: u64, size: u64, token: &'static [u8]| {
            fingerprint(name, kind, 1, |_, t| {
                t.extend_from_slice(token);
                (id, size)
            })
        };
        let base = one("d", "fs", 4, 10, b"abc");
        assert_eq!(base, by_hand("d", "fs", 4, 10, b"abc"));
        for other in [
            one("e", "fs", 4, 10, b"abc"),
            one("d", "s3", 4, 10, b"abc"),
            one("d", "fs", 5, 10, b"abc"),
            one("d", "fs", 4, 11, b"abc"),
            one("d", "fs", 4, 10, b"abd"),
        ] {
            assert_ne!(other, base);
        }
    }

    /// More than one chunk of samples hashes as the definition says (the
    /// buffer is handed to the hash in pieces).
    #[test]
    fn a_catalog_larger_than_a_chunk_hashes_as_one_stream() {
        let n = 5_000u64;
        let token = |i: u64| i.to_le_bytes().repeat(3);
        let fp = fingerprint("big", "cql", n, |i, t| {
            t.extend_from_slice(&token(i));
            (i, 100 + i)
        });
        let mut h = Sha256::new();
        h.update(b"granary-dataset-v2\0");
        for s in ["big", "cql"] {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        h.update(n.to_le_bytes());
        for i in 0..n {
            h.update(i.to_le_bytes());
            h.update((100 + i).to_le_bytes());
            h.update(24u32.to_le_bytes());
            h.update(token(i));
        }
        let want = u64::from_le_bytes(h.finalize()[..8].try_into().unwrap());
        assert_eq!(fp, want);
    }
}
