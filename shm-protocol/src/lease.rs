//! The agent's private record of every batch lent to a loader.
//!
//! A batch descriptor carries `seq` and an unguessable `token`; the loader
//! returns both in its release. The agent resolves the release through this
//! table, which lives in its own memory: a release that names a batch never
//! lent, one already returned, or a wrong token is a [`Violation`], and the
//! payload (e.g. the extents to unpin) comes from the table, never from
//! shared memory. When a loader dies, [`LeaseTable::drain`] gives back every
//! payload still on loan.

use crate::error::Violation;
use crate::layout::ReleaseDescriptor;
use std::collections::HashMap;

/// Lent batches of one session, keyed by sequence number.
#[derive(Debug)]
pub struct LeaseTable<P> {
    leases: HashMap<u64, (u64, P)>,
    key: u64,
}

/// One SplitMix64 step from `z`.
fn mix(z: u64) -> u64 {
    granary_base::SplitMix64(z).next_u64()
}

impl<P> LeaseTable<P> {
    /// An empty table; `key` should be random per session (tokens derive from it).
    pub fn new(key: u64) -> LeaseTable<P> {
        LeaseTable {
            leases: HashMap::new(),
            key,
        }
    }

    /// Records that batch `seq` is lent with `payload`; returns its token.
    /// Lending the same `seq` twice replaces nothing and returns `None`.
    pub fn lend(&mut self, seq: u64, payload: P) -> Option<u64> {
        if self.leases.contains_key(&seq) {
            return None;
        }
        let token = mix(seq ^ self.key) | 1;
        self.leases.insert(seq, (token, payload));
        Some(token)
    }

    /// Resolves a release read from shared memory. On success the lease is
    /// gone and its payload is returned.
    pub fn reclaim(&mut self, rel: &ReleaseDescriptor) -> Result<P, Violation> {
        match self.leases.get(&rel.seq) {
            Some((token, _)) if *token == rel.token => Ok(self
                .leases
                .remove(&rel.seq)
                .map(|(_, p)| p)
                .expect("present")),
            _ => Err(Violation::UnknownLease {
                seq: rel.seq,
                token: rel.token,
            }),
        }
    }

    /// Number of batches on loan.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// True when nothing is on loan.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Every batch on loan: its sequence number and payload, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &P)> + '_ {
        self.leases.iter().map(|(&seq, (_, p))| (seq, p))
    }

    /// Takes back every lease (the loader died or was fenced).
    pub fn drain(&mut self) -> impl Iterator<Item = (u64, P)> + '_ {
        self.leases.drain().map(|(seq, (_, p))| (seq, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lend_reclaim_and_reject() {
        let mut t = LeaseTable::new(0xabc);
        let tok = t.lend(5, "five").unwrap();
        assert!(t.lend(5, "again").is_none());
        assert_eq!(t.len(), 1);
        assert!(t
            .reclaim(&ReleaseDescriptor {
                seq: 5,
                token: tok ^ 2
            })
            .is_err());
        assert!(t
            .reclaim(&ReleaseDescriptor { seq: 6, token: tok })
            .is_err());
        assert_eq!(
            t.reclaim(&ReleaseDescriptor { seq: 5, token: tok }),
            Ok("five")
        );
        assert!(t
            .reclaim(&ReleaseDescriptor { seq: 5, token: tok })
            .is_err());
        assert!(t.is_empty());
        t.lend(1, "a");
        t.lend(2, "b");
        let mut back: Vec<_> = t.drain().collect();
        back.sort();
        assert_eq!(back, vec![(1, "a"), (2, "b")]);
    }
}
