//! Which samples of a synthetic dataset appear, in clear, in some bytes (a
//! tap's capture, what a stranger received): a sample counts when any
//! 64-byte window of it, taken every [`STRIDE`] bytes past its header,
//! occurs anywhere in the bytes.

use granary_tools::synth::SynthSpec;
use std::collections::{BTreeSet, HashMap};

/// Bytes compared.
pub const WINDOW: usize = 64;
/// Distance between two windows of a sample.
pub const STRIDE: usize = 4096;
/// The first window starts past the header (which every sample shares
/// in part).
const FIRST: usize = 64;

/// The windows of every sample, looked up by their first 8 bytes.
pub struct SampleWindows {
    contents: Vec<Vec<u8>>,
    by_prefix: HashMap<u64, Vec<(u32, u32)>>,
}

impl SampleWindows {
    /// Renders every sample of `spec` and indexes its windows.
    pub fn new(spec: &SynthSpec) -> SampleWindows {
        let mut contents = Vec::with_capacity(spec.num_files as usize);
        let mut by_prefix: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
        for id in 0..spec.num_files {
            let mut b = Vec::new();
            spec.render(id, &mut b);
            let mut at = FIRST;
            while at + WINDOW <= b.len() {
                by_prefix
                    .entry(prefix(&b[at..]))
                    .or_default()
                    .push((id as u32, at as u32));
                at += STRIDE;
            }
            contents.push(b);
        }
        SampleWindows {
            contents,
            by_prefix,
        }
    }

    /// Sample `id`'s bytes.
    pub fn content(&self, id: u64) -> &[u8] {
        &self.contents[id as usize]
    }

    /// Samples of which a window occurs in `bytes`.
    pub fn found_in(&self, bytes: &[u8]) -> BTreeSet<u64> {
        let mut found = BTreeSet::new();
        if bytes.len() < WINDOW {
            return found;
        }
        for i in 0..=bytes.len() - WINDOW {
            let Some(hits) = self.by_prefix.get(&prefix(&bytes[i..])) else {
                continue;
            };
            for &(id, at) in hits {
                let at = at as usize;
                if self.contents[id as usize][at..at + WINDOW] == bytes[i..i + WINDOW] {
                    found.insert(u64::from(id));
                }
            }
        }
        found
    }
}

fn prefix(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_anywhere_in_the_bytes_names_its_sample() {
        let mut spec = SynthSpec::new("/nonexistent");
        spec.num_files = 20;
        spec.mean_size = 20_000;
        let w = SampleWindows::new(&spec);
        let mut bytes = vec![7u8; 1000];
        bytes.extend_from_slice(&w.content(3)[FIRST - 5..FIRST + WINDOW + 5]);
        bytes.extend_from_slice(&[1, 2, 3]);
        bytes.extend_from_slice(&w.content(11)[FIRST..FIRST + WINDOW]);
        let found = w.found_in(&bytes);
        assert!(found.contains(&3), "{found:?}");
        assert!(found.contains(&11), "{found:?}");
        assert_eq!(found.len(), 2, "{found:?}");
        // A flipped byte in every window hides the sample.
        let mut flipped = w.content(5).to_vec();
        for b in flipped.iter_mut().skip(FIRST + 10).step_by(STRIDE / 2) {
            *b ^= 1;
        }
        assert!(w.found_in(&flipped).is_empty());
        assert!(w.found_in(&[0u8; 10]).is_empty());
    }
}
