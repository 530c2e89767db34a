//! Ownership: which member of a [`View`] reads a sample from the store and
//! serves it to the others.
//!
//! Integer-only rendezvous (highest random weight) hashing over stable node
//! ids. Every member scores every sample; the highest score owns it. A
//! member's scores do not depend on who else is in the view, so removing a
//! node moves only the samples that node owned, and adding one moves only
//! the samples it now wins. No floating point is used anywhere, so two
//! machines can never disagree in a last bit.
//!
//! # The hash, exactly
//!
//! All arithmetic is on unsigned 64-bit integers, wrapping modulo 2^64;
//! `^` is exclusive or, `>>` a logical shift.
//!
//! ```text
//! mix64(z):                       # the SplitMix64 finaliser
//!     z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
//!     z = (z ^ (z >> 27)) * 0x94d049bb133111eb
//!     return z ^ (z >> 31)
//!
//! weight(capacity) = min(32, max(1, ceil(capacity / 2^35)))   # one per 32 GiB
//!
//! node_key(id, v) = first 8 bytes, read little-endian, of
//!     SHA-256("granary-hrw-v1\0" || utf8(id) || 0x00 || u32_le(v))
//!     for each virtual id v in 0 .. weight(capacity)
//!
//! sample_key(fingerprint, sample) =
//!     mix64(fingerprint ^ mix64(sample ^ 0x9e3779b97f4a7c15))
//!
//! score(node, v, fingerprint, sample) =
//!     mix64(sample_key(fingerprint, sample) ^ node_key(node, v))
//!
//! owner = the member holding the highest score over all its virtual ids;
//!         on equal scores the member whose id is smaller as bytes wins.
//! ```
//!
//! In Python: `def mix64(z): z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) &
//! M; z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M; return z ^ (z >> 31)`
//! with `M = 2**64 - 1`, and `int.from_bytes(hashlib.sha256(...).digest()[:8],
//! "little")` for the node keys. The unit tests pin a few values.
//!
//! Bigger arenas get more virtual ids and so win proportionally more
//! samples: a node of 64 GiB owns about twice what a node of 32 GiB owns.
//! Nodes below 32 GiB all weigh one; the weight caps at 32 (1 TiB). The
//! weight depends on the node's own capacity only, never on the rest of the
//! view, which is what keeps removal local.

use sha2::{Digest, Sha256};

use crate::view::View;

/// Bytes of arena capacity per virtual id.
pub const WEIGHT_GRANULE: u64 = 1 << 35;
/// Most virtual ids one node gets.
pub const MAX_WEIGHT: u32 = 32;
const SAMPLE_SALT: u64 = granary_base::hash::GAMMA;

/// The SplitMix64 finaliser (see the module documentation; defined in
/// granary-base, which the planner uses too).
pub use granary_base::hash::mix64;

/// Number of virtual ids a node of `capacity` bytes gets.
pub fn weight(capacity: u64) -> u32 {
    let w = capacity.div_ceil(WEIGHT_GRANULE).max(1);
    w.min(u64::from(MAX_WEIGHT)) as u32
}

/// The key of virtual id `v` of node `id`.
pub fn node_key(id: &str, v: u32) -> u64 {
    let mut h = Sha256::new();
    h.update(b"granary-hrw-v1\0");
    h.update(id.as_bytes());
    h.update([0u8]);
    h.update(v.to_le_bytes());
    let d = h.finalize();
    let mut k = [0u8; 8];
    k.copy_from_slice(&d[..8]);
    u64::from_le_bytes(k)
}

/// The per-sample key every member's score starts from.
pub fn sample_key(fingerprint: u64, sample: u64) -> u64 {
    mix64(fingerprint ^ mix64(sample ^ SAMPLE_SALT))
}

/// Precomputed rendezvous keys of a view: answers [`Owners::owner`] in
/// `O(total virtual ids)` integer operations.
#[derive(Clone, Debug)]
pub struct Owners {
    /// (node key, member index), all virtual ids of all members.
    keys: Vec<(u64, u32)>,
    members: usize,
}

impl Owners {
    /// Keys for every member of `view`.
    pub fn new(view: &View) -> Owners {
        let mut keys = Vec::new();
        for (i, m) in view.members().iter().enumerate() {
            for v in 0..weight(m.capacity) {
                keys.push((node_key(&m.id, v), i as u32));
            }
        }
        Owners {
            keys,
            members: view.len(),
        }
    }

    /// Number of members.
    pub fn members(&self) -> usize {
        self.members
    }

    /// The member index (into [`View::members`]) that owns `sample` of the
    /// dataset with `fingerprint`.
    pub fn owner(&self, fingerprint: u64, sample: u64) -> usize {
        self.owner_of_key(sample_key(fingerprint, sample))
    }

    /// [`Owners::owner`] from a precomputed [`sample_key`].
    pub fn owner_of_key(&self, sk: u64) -> usize {
        let mut best_score = 0u64;
        let mut best = u32::MAX;
        for &(k, m) in &self.keys {
            let s = mix64(sk ^ k);
            // Members are sorted by id, so the smaller index is the smaller
            // id: ties go to it, as documented.
            if best == u32::MAX || s > best_score || (s == best_score && m < best) {
                best_score = s;
                best = m;
            }
        }
        best as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::Member;

    #[test]
    fn hash_values_are_pinned() {
        // Reference values for reimplementations (computed from the
        // definitions in the module documentation).
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
        assert_eq!(sample_key(0, 0), mix64(mix64(SAMPLE_SALT)));
        assert_eq!(node_key("node01", 0), 0x5e38_1d55_d449_16b0);
        assert_ne!(node_key("node01", 0), node_key("node01", 1));
    }

    #[test]
    fn weights_follow_capacity() {
        assert_eq!(weight(0), 1);
        assert_eq!(weight(WEIGHT_GRANULE), 1);
        assert_eq!(weight(WEIGHT_GRANULE + 1), 2);
        assert_eq!(weight(u64::MAX), MAX_WEIGHT);
    }

    fn view(caps: &[u64]) -> View {
        View::new(
            "j",
            0,
            caps.iter()
                .enumerate()
                .map(|(i, &c)| Member::new(format!("n{i:02}"), format!("n{i:02}:1"), c)),
        )
        .unwrap()
    }

    #[test]
    fn ownership_is_balanced_and_weighted() {
        let o = Owners::new(&view(&[1, 1, 1, 1]));
        let mut counts = [0u32; 4];
        for s in 0..40_000 {
            counts[o.owner(7, s)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        let o = Owners::new(&view(&[WEIGHT_GRANULE, 3 * WEIGHT_GRANULE]));
        let mut counts = [0u32; 2];
        for s in 0..40_000 {
            counts[o.owner(7, s)] += 1;
        }
        assert!((9_000..11_000).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn removing_a_node_moves_only_its_samples() {
        let full = view(&[1, 1, 1, 1, 1]);
        let fo = Owners::new(&full);
        let gone = 2;
        let rest = View::new(
            "j",
            1,
            full.members()
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != gone)
                .map(|(_, m)| m.clone()),
        )
        .unwrap();
        let ro = Owners::new(&rest);
        for s in 0..5_000 {
            let before = &full.members()[fo.owner(3, s)].id;
            let after = &rest.members()[ro.owner(3, s)].id;
            if *before != full.members()[gone].id {
                assert_eq!(before, after, "sample {s} moved");
            }
        }
    }

    #[test]
    fn datasets_hash_apart() {
        let o = Owners::new(&view(&[1, 1, 1, 1]));
        let same = (0..1000)
            .filter(|&s| o.owner(1, s) == o.owner(2, s))
            .count();
        assert!((150..350).contains(&same), "{same}");
    }
}
