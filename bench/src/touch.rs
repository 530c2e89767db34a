//! Touching every byte: the loop a consumer runs over each sample, and the
//! same loop over a plain buffer as the memory-bandwidth yardstick.
//!
//! [`touch`] XORs the buffer as 64-byte blocks of eight `u64` lanes (the
//! compiler turns it into wide vector loads and XORs), then folds the tail
//! byte by byte. It costs far less than a memory read, so a streaming pass
//! over a buffer larger than the last-level cache is bound by memory
//! bandwidth, not by the loop.

use std::hint::black_box;
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

/// A plain heap buffer read with [`touch`], for the memory baselines.
///
/// The buffer holds a set of "samples" laid out like an arena holding them
/// all (each at an offset aligned to 4 KiB, in index order). It is read
/// either as one stream of the samples' total length from its start (the
/// single-core streaming read) or sample by sample in a shuffled order
/// (what a loader's access pattern costs by itself, with no agent at all).
pub struct MemRead {
    buf: Vec<u8>,
    /// (offset, length) of every sample.
    samples: Vec<(usize, usize)>,
    /// Sum of the samples' lengths.
    bytes: usize,
}

impl MemRead {
    /// A buffer for samples of `sizes` bytes, every page written (faulted
    /// in) now.
    pub fn new(sizes: &[u64]) -> MemRead {
        let mut samples = Vec::with_capacity(sizes.len());
        let mut end = 0usize;
        for &s in sizes {
            let s = s as usize;
            samples.push((end, s));
            end += s.next_multiple_of(4096);
        }
        let mut buf = vec![0u8; end.max(4096)];
        // Distinct content per page, so nothing can be shared or skipped.
        for (i, page) in buf.chunks_mut(4096).enumerate() {
            page.fill((i as u8) | 1);
        }
        let bytes = sizes.iter().sum::<u64>() as usize;
        MemRead {
            buf,
            samples,
            bytes,
        }
    }

    /// Bytes one pass reads (the samples' total length).
    pub fn bytes(&self) -> u64 {
        self.bytes as u64
    }

    /// One streaming pass over the first [`MemRead::bytes`] bytes: its
    /// duration and the XOR.
    pub fn stream_pass(&self) -> (Duration, u64) {
        let t = Instant::now();
        let x = touch(black_box(&self.buf[..self.bytes]));
        (t.elapsed(), black_box(x))
    }

    /// One pass sample by sample in the order `order` (sample indices).
    pub fn sample_pass(&self, order: &[usize]) -> (Duration, u64) {
        let t = Instant::now();
        let mut x = 0u64;
        for &i in order {
            let (o, l) = self.samples[i];
            x = x.wrapping_add(touch(black_box(&self.buf[o..o + l])));
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
}
