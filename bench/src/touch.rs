//! Touching every byte: the loop a consumer runs over each sample, and the
//! same loop over a private mapping of the same bytes as the memory
//! yardstick.
//!
//! [`touch`] XORs the buffer as 64-byte blocks of eight `u64` lanes (the
//! compiler turns it into wide vector loads and XORs), then folds the tail
//! byte by byte. It costs far less than a memory read, so a streaming pass
//! over a buffer larger than the last-level cache is bound by memory
//! bandwidth, not by the loop.

use memmap2::{Advice, MmapMut, MmapOptions};
use std::fs::File;
use std::hint::black_box;
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, Instant};

/// XOR of every 8-byte word of `bytes` (native order), with the tail bytes
/// folded in. Reads every byte exactly once.
#[inline(never)]
pub fn touch(bytes: &[u8]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut blocks = bytes.chunks_exact(64);
    for block in &mut blocks {
        for (lane, word) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            *lane ^= u64::from_ne_bytes(w);
        }
    }
    let mut x = lanes.iter().fold(0, |a, &l| a ^ l);
    for &b in blocks.remainder() {
        x = x.rotate_left(8) ^ u64::from(b);
    }
    x
}

/// The dataset's bytes in a private anonymous mapping, read with [`touch`],
/// for the memory baselines.
///
/// The mapping (`MAP_PRIVATE | MAP_ANONYMOUS`, with `MAP_HUGETLB` for 2 MiB
/// pages when asked for and the kernel has them reserved) holds every
/// sample's file bytes laid out like an arena holding them all (each at an
/// offset aligned to 4 KiB, in index order). It is read either as one
/// stream of the samples' total length from its start (the single-core
/// streaming read) or sample by sample in a given order (what a shuffled
/// loader's access pattern costs by itself, with no agent at all).
pub struct MemRead {
    map: MmapMut,
    /// (offset, length) of every sample.
    samples: Vec<(usize, usize)>,
    /// Sum of the samples' lengths.
    bytes: usize,
    huge: bool,
}

/// Bits of a 2 MiB page size, for `MAP_HUGE_2MB`.
const HUGE_2MB_BITS: u8 = 21;

impl MemRead {
    /// A mapping holding the files `files` (path, size; sample `i` is
    /// `files[i]`), every page written now. With `huge` it tries 2 MiB
    /// pages first; otherwise, or when that fails, 4 KiB pages
    /// (transparent huge pages switched off for the mapping).
    pub fn load(files: &[(&Path, u64)], huge: bool) -> io::Result<MemRead> {
        let mut samples = Vec::with_capacity(files.len());
        let mut end = 0usize;
        for &(_, s) in files {
            let s =
                usize::try_from(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            samples.push((end, s));
            end += s.next_multiple_of(4096);
        }
        let len = end.max(4096);
        let huge_map = if huge {
            MmapOptions::new()
                .len(len.next_multiple_of(2 << 20))
                .huge(Some(HUGE_2MB_BITS))
                .populate()
                .map_anon()
                .ok()
        } else {
            None
        };
        let huge = huge_map.is_some();
        let mut map = match huge_map {
            Some(m) => m,
            None => {
                let m = MmapOptions::new().len(len).map_anon()?;
                m.advise(Advice::NoHugePage)?;
                m
            }
        };
        for (&(path, _), &(o, l)) in files.iter().zip(&samples) {
            let mut f = File::open(path)?;
            f.read_exact(&mut map[o..o + l])?;
        }
        // Every page written (the gaps after each sample too).
        for page in map.chunks_mut(4096) {
            page[page.len() - 1] |= 1;
        }
        let bytes = samples.iter().map(|&(_, l)| l).sum();
        Ok(MemRead {
            map,
            samples,
            bytes,
            huge,
        })
    }

    /// Whether the mapping got 2 MiB pages.
    pub fn hugepages(&self) -> bool {
        self.huge
    }

    /// Bytes one pass reads (the samples' total length).
    pub fn bytes(&self) -> u64 {
        self.bytes as u64
    }

    /// One streaming pass over the first [`MemRead::bytes`] bytes: its
    /// duration and the XOR.
    pub fn stream_pass(&self) -> (Duration, u64) {
        let t = Instant::now();
        let x = touch(black_box(&self.map[..self.bytes]));
        (t.elapsed(), black_box(x))
    }

    /// One pass sample by sample in the order `order` (sample indices).
    pub fn sample_pass(&self, order: &[usize]) -> (Duration, u64) {
        let t = Instant::now();
        let mut x = 0u64;
        for &i in order {
            let (o, l) = self.samples[i];
            x = x.wrapping_add(touch(black_box(&self.map[o..o + l])));
        }
        (t.elapsed(), black_box(x))
    }

    /// A fresh shuffled order of the samples (Fisher–Yates driven by a
    /// xorshift64 state; only the order matters here).
    pub fn shuffled_order(&self, rng: &mut u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.samples.len()).collect();
        *rng |= 1;
        for i in (1..order.len()).rev() {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            order.swap(i, (*rng % (i as u64 + 1)) as usize);
        }
        order
    }
}

/// Bytes over time in GB/s (10⁹ bytes per second).
pub fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-12) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_counts() {
        let mut v: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let base = touch(&v);
        for i in [0, 7, 63, 64, 959, 960, 999] {
            v[i] ^= 0x10;
            assert_ne!(touch(&v), base, "byte {i}");
            v[i] ^= 0x10;
        }
        assert_eq!(touch(&[]), 0);
    }

    #[test]
    fn a_loaded_mapping_holds_the_files_bytes() {
        let dir = std::env::temp_dir().join(format!("granary-memread-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..100u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(dir.join("a"), &a).unwrap();
        std::fs::write(dir.join("b"), &b).unwrap();
        let (pa, pb) = (dir.join("a"), dir.join("b"));
        let files = [(pa.as_path(), 5000), (pb.as_path(), 100)];
        let m = MemRead::load(&files, false).unwrap();
        assert!(!m.hugepages());
        assert_eq!(m.bytes(), 5100);
        let want = touch(&b).wrapping_add(touch(&a));
        assert_eq!(m.sample_pass(&[1, 0]).1, want);
        std::fs::write(dir.join("b"), &b[..50]).unwrap();
        assert!(MemRead::load(&files, false).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
