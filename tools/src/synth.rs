//! The synthetic ImageNet-like dataset used by the quickstart, the tests and
//! the benchmarks.
//!
//! `num_files` files in `num_classes` class folders, with log-normal sizes
//! around `mean_size`, and content derived from the file id so that every
//! byte of a sample can be checked from the sample's bytes alone
//! ([`verify_sample`]).
//!
//! # Layout
//!
//! File `i` (`0 ≤ i < num_files`) belongs to class
//! `c = ⌊i × num_classes / num_files⌋`, so every class holds a contiguous run
//! of ids and none is empty. It is stored at `class_CCC/img_IIIIIIII.bin`,
//! with `CCC` and `IIIIIIII` zero-padded to at least 3 and 8 digits (more
//! when the counts need them). Because padding keeps the byte order of the
//! names equal to numeric order, the filesystem catalog of the tree
//! ([`granary_agent::source::Catalog::from_dir`]) gives file `i` sample id `i` and
//! label `c`.
//!
//! # Sizes
//!
//! `size = exp(μ + σ·z)` rounded, with `μ = ln(mean_size) − σ²/2` (so the
//! mean is `mean_size`), `z` a standard normal drawn by Box–Muller from two
//! uniforms of a SplitMix64 stream keyed by `(seed, i)`, clamped to
//! `[1 KiB, 2 MiB]`.
//!
//! # Content (all integers little-endian)
//!
//! | bytes     | field                                                        |
//! |-----------|--------------------------------------------------------------|
//! | `0..8`    | magic `GRNSYNTH`                                             |
//! | `8..16`   | file id, `u64`                                               |
//! | `16..20`  | class, `u32`                                                 |
//! | `20..24`  | total file length including this header, `u32`              |
//! | `24..32`  | header checksum `h`, `u64` (below)                           |
//! | `32..40`  | stream key `k = mix(seed ⊕ mix(i + γ))`, `u64`               |
//! | `40..len` | SplitMix64 outputs from state `mix(k ⊕ h)`, 8 bytes per word; the last word is cut to fit |
//!
//! `mix` is the SplitMix64 finaliser and `γ = 0x9E3779B97F4A7C15`.
//! `h = mix(mix(mix(H ⊕ w0) ⊕ w1) ⊕ w2)` over the three little-endian words
//! `w0..w2` of bytes `0..24` with `H = 0x4752_4E53_594E_5448`. The header
//! checksum covers the header; the stream depends on the key and on the
//! header checksum, so a flipped byte anywhere, or a header paired with
//! another file's body, fails verification.
//!
//! # Idempotence
//!
//! [`generate`] writes every file under a hidden temporary name and renames
//! it into place, then writes the marker file `.granary-synth.json` holding
//! the spec. A later run with the same spec finds the marker and skips; a
//! different spec removes the marker and the generated files the new spec
//! does not produce, and generates again. An interrupted run leaves no
//! marker (so the next run starts over) and no half-written visible file.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// First eight bytes of every synthetic sample.
pub const MAGIC: [u8; 8] = *b"GRNSYNTH";
/// Length of the fixed header.
pub const HEADER_LEN: usize = 32;
/// Smallest generated file.
pub const MIN_FILE_SIZE: u64 = 1024;
/// Largest generated file.
pub const MAX_FILE_SIZE: u64 = 2 << 20;
/// Name of the marker file written in the root after a complete run.
pub const MARKER_NAME: &str = ".granary-synth.json";

/// Default number of files.
pub const DEFAULT_NUM_FILES: u64 = 20_000;
/// Default number of classes.
pub const DEFAULT_NUM_CLASSES: u32 = 100;
/// Default mean file size in bytes (about an ImageNet JPEG).
pub const DEFAULT_MEAN_SIZE: u64 = 110_000;
/// Default log-normal shape.
pub const DEFAULT_SIGMA: f64 = 0.5;

use granary_base::hash::GAMMA;
const HEADER_HASH_INIT: u64 = 0x4752_4E53_594E_5448;
const SIZE_SALT: u64 = 0x5349_5A45_5349_5A45;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// Directory that receives the class folders (created if missing).
    pub root: PathBuf,
    /// Number of files. Default 20,000.
    pub num_files: u64,
    /// Number of class folders, `1..=num_files`. Default 100.
    pub num_classes: u32,
    /// Mean file size in bytes, in `[1 KiB, 2 MiB]`. Default 110,000.
    pub mean_size: u64,
    /// Shape of the log-normal size distribution (σ of the underlying
    /// normal), in `[0, 4]`. Default 0.5.
    pub sigma: f64,
    /// Seed of sizes and content. Default 0.
    pub seed: u64,
}

impl SynthSpec {
    /// The default spec (20,000 files, 100 classes, ~110 KB) rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> SynthSpec {
        SynthSpec {
            root: root.into(),
            num_files: DEFAULT_NUM_FILES,
            num_classes: DEFAULT_NUM_CLASSES,
            mean_size: DEFAULT_MEAN_SIZE,
            sigma: DEFAULT_SIGMA,
            seed: 0,
        }
    }

    /// Checks the ranges documented on the fields.
    pub fn check(&self) -> io::Result<()> {
        let bad = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        if self.num_files == 0 {
            return bad("synthetic dataset: num_files must be at least 1".to_owned());
        }
        if self.num_classes == 0 || u64::from(self.num_classes) > self.num_files {
            return bad(format!(
                "synthetic dataset: num_classes = {} must be in 1..=num_files ({})",
                self.num_classes, self.num_files
            ));
        }
        if !(MIN_FILE_SIZE..=MAX_FILE_SIZE).contains(&self.mean_size) {
            return bad(format!(
                "synthetic dataset: mean_size = {} must be in {MIN_FILE_SIZE}..={MAX_FILE_SIZE}",
                self.mean_size
            ));
        }
        if !(0.0..=4.0).contains(&self.sigma) {
            return bad(format!(
                "synthetic dataset: sigma = {} must be in [0, 4]",
                self.sigma
            ));
        }
        Ok(())
    }

    /// Class of file `id`.
    pub fn class_of(&self, id: u64) -> u32 {
        let n = u128::from(self.num_files.max(1));
        let c = u128::from(id) * u128::from(self.num_classes) / n;
        u32::try_from(c).unwrap_or(u32::MAX)
    }

    /// Size in bytes of file `id`.
    pub fn size_of(&self, id: u64) -> u64 {
        let mut s = SplitMix(mix(self.seed ^ SIZE_SALT) ^ mix(id.wrapping_add(GAMMA)));
        // Uniforms in (0, 1] and [0, 1) from the top 53 bits.
        let u1 = ((s.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let u2 = (s.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let mu = (self.mean_size.max(1) as f64).ln() - self.sigma * self.sigma / 2.0;
        let x = (mu + self.sigma * z).exp().round();
        // `as` saturates (NaN becomes 0); the clamp covers both ends.
        (x as u64).clamp(MIN_FILE_SIZE, MAX_FILE_SIZE)
    }

    /// What [`verify_sample`] must report for file `id`.
    pub fn sample_info(&self, id: u64) -> SampleInfo {
        SampleInfo {
            file_id: id,
            class: self.class_of(id),
            len: self.size_of(id),
        }
    }

    /// Name of the folder of class `c`.
    pub fn class_dir(&self, c: u32) -> String {
        let w = digits(u64::from(self.num_classes.saturating_sub(1))).max(3);
        format!("class_{c:0w$}")
    }

    /// Path of file `id` relative to the root.
    pub fn relative_path(&self, id: u64) -> PathBuf {
        let w = digits(self.num_files.saturating_sub(1)).max(8);
        Path::new(&self.class_dir(self.class_of(id))).join(format!("img_{id:0w$}.bin"))
    }

    /// Path of file `id`.
    pub fn path_of(&self, id: u64) -> PathBuf {
        self.root.join(self.relative_path(id))
    }

    /// Sum of all file sizes.
    pub fn total_bytes(&self) -> u64 {
        (0..self.num_files).map(|i| self.size_of(i)).sum()
    }

    /// Writes the content of file `id` into `buf` (replacing what it held).
    pub fn render(&self, id: u64, buf: &mut Vec<u8>) {
        let len = self.size_of(id);
        let key = mix(self.seed ^ mix(id.wrapping_add(GAMMA)));
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&MAGIC);
        header[8..16].copy_from_slice(&id.to_le_bytes());
        header[16..20].copy_from_slice(&self.class_of(id).to_le_bytes());
        // MAX_FILE_SIZE fits in a u32.
        header[20..24].copy_from_slice(&(len as u32).to_le_bytes());
        let h = header_checksum(&header);
        header[24..32].copy_from_slice(&h.to_le_bytes());
        buf.clear();
        buf.resize(len as usize, 0);
        buf[..HEADER_LEN].copy_from_slice(&header);
        buf[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&key.to_le_bytes());
        fill_stream(mix(key ^ h), &mut buf[HEADER_LEN + 8..]);
    }

    /// The marker text up to (not including) the total byte count.
    fn marker_prefix(&self) -> String {
        format!(
            "{{\"generator\":\"granary-synth\",\"format\":1,\"num_files\":{},\"num_classes\":{},\
             \"mean_size\":{},\"sigma\":{},\"seed\":{},\"total_bytes\":",
            self.num_files, self.num_classes, self.mean_size, self.sigma, self.seed
        )
    }
}

/// What [`generate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Files in the dataset.
    pub files: u64,
    /// Bytes in the dataset.
    pub bytes: u64,
    /// True when a matching marker was found and nothing was written.
    pub skipped: bool,
    /// Time taken.
    pub elapsed: Duration,
}

/// Identity of a verified synthetic sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SampleInfo {
    /// The file id from the header.
    pub file_id: u64,
    /// The class from the header.
    pub class: u32,
    /// The sample length in bytes.
    pub len: u64,
}

/// Why bytes are not a valid synthetic sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyError {
    /// Shorter than the header plus the stream key.
    TooShort {
        /// Bytes given.
        len: usize,
    },
    /// The first eight bytes are not `GRNSYNTH`.
    BadMagic,
    /// The header checksum does not match bytes `0..24`.
    HeaderChecksum {
        /// Checksum computed from the header fields.
        expected: u64,
        /// Checksum stored in the header.
        found: u64,
    },
    /// The header's length field disagrees with the number of bytes.
    Length {
        /// Length in the header.
        header: u64,
        /// Bytes given.
        actual: usize,
    },
    /// A content byte differs from what the header and key determine.
    Content {
        /// Offset of the first differing byte.
        offset: usize,
    },
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::TooShort { len } => write!(
                f,
                "sample too short: {len} bytes, a synthetic sample has at least {}",
                HEADER_LEN + 8
            ),
            VerifyError::BadMagic => f.write_str("bad magic: not a synthetic Granary sample"),
            VerifyError::HeaderChecksum { expected, found } => write!(
                f,
                "header checksum mismatch: computed {expected:#018x}, stored {found:#018x}"
            ),
            VerifyError::Length { header, actual } => write!(
                f,
                "length mismatch: header says {header} bytes, sample has {actual}"
            ),
            VerifyError::Content { offset } => write!(f, "content mismatch at byte {offset}"),
        }
    }
}

impl std::error::Error for VerifyError {}

/// Checks that `bytes` are exactly one synthetic sample: header, checksum,
/// length and every content byte. Returns the sample's identity, which the
/// caller compares with what it asked for ([`SynthSpec::sample_info`]).
pub fn verify_sample(bytes: &[u8]) -> Result<SampleInfo, VerifyError> {
    if bytes.len() < HEADER_LEN + 8 {
        return Err(VerifyError::TooShort { len: bytes.len() });
    }
    if bytes[..8] != MAGIC {
        return Err(VerifyError::BadMagic);
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let header: &[u8; HEADER_LEN] = bytes[..HEADER_LEN]
        .try_into()
        .map_err(|_| VerifyError::TooShort { len: bytes.len() })?;
    let expected = header_checksum(header);
    let found = word(24);
    if expected != found {
        return Err(VerifyError::HeaderChecksum { expected, found });
    }
    let file_id = word(8);
    let class = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    let len = u64::from(u32::from_le_bytes([
        bytes[20], bytes[21], bytes[22], bytes[23],
    ]));
    if len != bytes.len() as u64 {
        return Err(VerifyError::Length {
            header: len,
            actual: bytes.len(),
        });
    }
    let key = word(HEADER_LEN);
    let body = &bytes[HEADER_LEN + 8..];
    let mut s = SplitMix(mix(key ^ found));
    let mut chunks = body.chunks_exact(8);
    let mut bad_word = None;
    for (i, c) in chunks.by_ref().enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        if u64::from_le_bytes(w) != s.next_u64() {
            bad_word = Some(i);
            break;
        }
    }
    let base = HEADER_LEN + 8;
    if let Some(i) = bad_word {
        let mut expect = SplitMix(mix(key ^ found));
        for _ in 0..i {
            expect.next_u64();
        }
        let want = expect.next_u64().to_le_bytes();
        let got = &body[i * 8..i * 8 + 8];
        let j = got.iter().zip(want).position(|(a, b)| *a != b).unwrap_or(0);
        return Err(VerifyError::Content {
            offset: base + i * 8 + j,
        });
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let want = s.next_u64().to_le_bytes();
        if let Some(j) = rest.iter().zip(want).position(|(a, b)| *a != b) {
            return Err(VerifyError::Content {
                offset: base + body.len() - rest.len() + j,
            });
        }
    }
    Ok(SampleInfo {
        file_id,
        class,
        len,
    })
}

/// Generates the dataset described by `spec`, or does nothing when a marker
/// for the same spec is already there (see the module docs).
///
/// `progress(files_done, bytes_done)` is called after every file (and once
/// with the totals when skipping); pair it with
/// [`crate::progress::ProgressBar::update`].
pub fn generate(spec: &SynthSpec, mut progress: impl FnMut(u64, u64)) -> io::Result<Summary> {
    let start = Instant::now();
    spec.check()?;
    let root = &spec.root;
    let marker = root.join(MARKER_NAME);
    let prefix = spec.marker_prefix();
    match fs::read_to_string(&marker) {
        Ok(text) => {
            let total = text
                .trim()
                .strip_prefix(prefix.as_str())
                .and_then(|t| t.strip_suffix('}'))
                .and_then(|t| t.parse::<u64>().ok());
            if let Some(bytes) = total {
                progress(spec.num_files, bytes);
                return Ok(Summary {
                    files: spec.num_files,
                    bytes,
                    skipped: true,
                    elapsed: start.elapsed(),
                });
            }
            fs::remove_file(&marker).map_err(with_path(&marker))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(with_path(&marker)(e)),
    }

    fs::create_dir_all(root).map_err(with_path(root))?;
    remove_stale(spec)?;
    for c in 0..spec.num_classes {
        let dir = root.join(spec.class_dir(c));
        fs::create_dir_all(&dir).map_err(with_path(&dir))?;
    }

    let bytes = write_files(spec, &mut progress)?;
    write_atomically(&marker, format!("{prefix}{bytes}}}\n").as_bytes())?;
    Ok(Summary {
        files: spec.num_files,
        bytes,
        skipped: false,
        elapsed: start.elapsed(),
    })
}

/// Renders and writes every file on a few worker threads (file writes, not
/// rendering, are the bottleneck; parallel writes keep the page cache busy).
/// Returns the bytes written; stops at the first error.
fn write_files(spec: &SynthSpec, progress: &mut impl FnMut(u64, u64)) -> io::Result<u64> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<io::Result<u64>>();
    std::thread::scope(|s| {
        for _ in 0..workers {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            s.spawn(move || {
                let mut buf = Vec::with_capacity(MAX_FILE_SIZE as usize);
                while !stop.load(Ordering::Relaxed) {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= spec.num_files {
                        break;
                    }
                    spec.render(id, &mut buf);
                    let r = write_atomically(&spec.path_of(id), &buf).map(|()| buf.len() as u64);
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let (mut done, mut bytes) = (0u64, 0u64);
        let mut first_err = None;
        for r in rx {
            match r {
                Ok(len) => {
                    done += 1;
                    bytes += len;
                    progress(done, bytes);
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(bytes),
        }
    })
}

/// Removes what an earlier run with another spec left behind: generated
/// files the new spec does not produce, temporary files, and class folders
/// the new spec does not use once they are empty. Nothing else is touched.
fn remove_stale(spec: &SynthSpec) -> io::Result<()> {
    let root = &spec.root;
    for ent in fs::read_dir(root).map_err(with_path(root))? {
        let ent = ent.map_err(with_path(root))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(c) = numbered(name, "class_", "") else {
            continue;
        };
        if !ent.file_type().map_err(with_path(&ent.path()))?.is_dir() {
            continue;
        }
        let dir = ent.path();
        for f in fs::read_dir(&dir).map_err(with_path(&dir))? {
            let f = f.map_err(with_path(&dir))?;
            let fname = f.file_name();
            let Some(fname) = fname.to_str() else {
                continue;
            };
            let stale = if fname.starts_with(".img_") && fname.ends_with(".tmp") {
                true
            } else if let Some(id) = numbered(fname, "img_", ".bin") {
                id >= spec.num_files || spec.relative_path(id) != Path::new(name).join(fname)
            } else {
                false
            };
            if stale {
                let p = f.path();
                fs::remove_file(&p).map_err(with_path(&p))?;
            }
        }
        let used = c < u64::from(spec.num_classes)
            && u32::try_from(c).is_ok_and(|c| spec.class_dir(c) == name);
        if !used {
            // Only succeeds when empty; a folder with foreign files stays.
            let _ = fs::remove_dir(&dir);
        }
    }
    Ok(())
}

/// The number in `{prefix}{digits}{suffix}`.
fn numbered(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The modification time of every file made here, in seconds since the
/// epoch (2026-01-01T00:00:00Z):
/// the same dataset made on two nodes is the same down to its mtimes, so
/// their agents agree on its fingerprint (which covers mtimes,
/// `docs/peers.md`).
pub const SYNTH_MTIME_SECS: u64 = 1_767_225_600;

/// Writes `bytes` to a hidden temporary file next to `path` with the mtime
/// [`SYNTH_MTIME_SECS`], then renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut f = fs::File::create(&tmp).map_err(with_path(&tmp))?;
    f.write_all(bytes).map_err(with_path(&tmp))?;
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(SYNTH_MTIME_SECS);
    f.set_modified(mtime).map_err(with_path(&tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(with_path(path))
}

fn with_path(path: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// The SplitMix64 finaliser and generator (granary-base).
use granary_base::hash::{mix64 as mix, SplitMix64 as SplitMix};

fn header_checksum(header: &[u8; HEADER_LEN]) -> u64 {
    let mut h = HEADER_HASH_INIT;
    for c in header[..24].chunks_exact(8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = mix(h ^ u64::from_le_bytes(w));
    }
    h
}

fn fill_stream(state: u64, out: &mut [u8]) {
    let mut s = SplitMix(state);
    let mut chunks = out.chunks_exact_mut(8);
    for c in chunks.by_ref() {
        c.copy_from_slice(&s.next_u64().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let w = s.next_u64().to_le_bytes();
        rest.copy_from_slice(&w[..rest.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_agent::source::Catalog;

    fn small(root: &Path, n: u64, classes: u32) -> SynthSpec {
        SynthSpec {
            num_files: n,
            num_classes: classes,
            mean_size: 8_000,
            seed: 7,
            ..SynthSpec::new(root)
        }
    }

    #[test]
    fn sizes_are_lognormal_around_the_mean() {
        let spec = SynthSpec::new("/nonexistent");
        let n = 2000;
        let sizes: Vec<u64> = (0..n).map(|i| spec.size_of(i)).collect();
        let mean = sizes.iter().sum::<u64>() as f64 / n as f64;
        assert!(
            (mean - 110_000.0).abs() < 11_000.0,
            "mean {mean} is not within 10% of 110000"
        );
        assert!(sizes
            .iter()
            .all(|s| (MIN_FILE_SIZE..=MAX_FILE_SIZE).contains(s)));
        // Spread: the log of sizes has roughly the requested σ.
        let logs: Vec<f64> = sizes.iter().map(|&s| (s as f64).ln()).collect();
        let m = logs.iter().sum::<f64>() / n as f64;
        let sd = (logs.iter().map(|l| (l - m) * (l - m)).sum::<f64>() / n as f64).sqrt();
        assert!((sd - 0.5).abs() < 0.05, "log-sd {sd}");
        // Deterministic, and seed-dependent.
        assert_eq!(spec.size_of(17), spec.size_of(17));
        let other = SynthSpec {
            seed: 1,
            ..spec.clone()
        };
        assert!((0..50).any(|i| other.size_of(i) != spec.size_of(i)));
        // σ = 0 gives exactly the mean.
        let flat = SynthSpec { sigma: 0.0, ..spec };
        assert!((0..20).all(|i| flat.size_of(i) == 110_000));
    }

    #[test]
    fn classes_and_paths() {
        let spec = SynthSpec::new("/r");
        assert_eq!(spec.class_of(0), 0);
        assert_eq!(spec.class_of(199), 0);
        assert_eq!(spec.class_of(200), 1);
        assert_eq!(spec.class_of(19_999), 99);
        assert_eq!(
            spec.path_of(12_345),
            Path::new("/r/class_061/img_00012345.bin")
        );
        let wide = SynthSpec {
            num_files: 200_000_000,
            num_classes: 5000,
            ..SynthSpec::new("/r")
        };
        assert_eq!(
            wide.relative_path(5),
            Path::new("class_0000/img_000000005.bin")
        );
        // Uneven division still fills every class.
        let odd = SynthSpec {
            num_files: 10,
            num_classes: 7,
            ..SynthSpec::new("/r")
        };
        let mut seen: Vec<u32> = (0..10).map(|i| odd.class_of(i)).collect();
        seen.dedup();
        assert_eq!(seen, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn rendered_samples_verify_and_corruption_is_caught() {
        let spec = SynthSpec {
            seed: 3,
            ..SynthSpec::new("/r")
        };
        let mut buf = Vec::new();
        for id in [0u64, 1, 2, 999, 19_999] {
            spec.render(id, &mut buf);
            assert_eq!(verify_sample(&buf), Ok(spec.sample_info(id)));
        }
        spec.render(5, &mut buf);
        let good = buf.clone();
        for pos in [
            0,
            9,
            17,
            21,
            25,
            33,
            40,
            47,
            48,
            good.len() / 2,
            good.len() - 1,
        ] {
            let mut bad = good.clone();
            bad[pos] ^= 0x10;
            assert!(verify_sample(&bad).is_err(), "flip at {pos} not caught");
        }
        let mut bad = good.clone();
        bad[good.len() - 3] ^= 1;
        assert_eq!(
            verify_sample(&bad),
            Err(VerifyError::Content {
                offset: good.len() - 3
            })
        );
        let mut bad = good.clone();
        bad[1000] ^= 1;
        assert_eq!(
            verify_sample(&bad),
            Err(VerifyError::Content { offset: 1000 })
        );
        assert_eq!(
            verify_sample(&good[..10]),
            Err(VerifyError::TooShort { len: 10 })
        );
        assert!(matches!(
            verify_sample(&good[..good.len() - 1]),
            Err(VerifyError::Length { .. })
        ));
        // A header paired with another file's body of the same length fails.
        let mut other = Vec::new();
        let twin = (6..10_000).find(|&i| spec.size_of(i) == good.len() as u64);
        if let Some(t) = twin {
            spec.render(t, &mut other);
            let mut mixed = good[..HEADER_LEN].to_vec();
            mixed.extend_from_slice(&other[HEADER_LEN..]);
            assert!(verify_sample(&mixed).is_err());
        }
        let mut wrong = good.clone();
        wrong[..8].copy_from_slice(b"NOTSYNTH");
        assert_eq!(verify_sample(&wrong), Err(VerifyError::BadMagic));
    }

    #[test]
    fn generate_verify_skip_regenerate() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("synth");
        let spec = small(&root, 300, 7);
        let mut calls = 0u64;
        let mut last = (0, 0);
        let s = generate(&spec, |f, b| {
            calls += 1;
            last = (f, b);
        })
        .unwrap();
        assert!(!s.skipped);
        assert_eq!(s.files, 300);
        assert_eq!(s.bytes, spec.total_bytes());
        assert_eq!(calls, 300);
        assert_eq!(last, (300, s.bytes));

        // Every file verifies, and the catalog's labels are the classes.
        let cat = Catalog::from_dir(&root).unwrap();
        assert_eq!(cat.len(), 300);
        assert_eq!(cat.class_names().len(), 7);
        assert_eq!(cat.total_bytes(), s.bytes);
        for e in cat.entries() {
            let bytes = cat.read_sample(e.sample_id).unwrap();
            let info = verify_sample(&bytes).unwrap();
            assert_eq!(info, spec.sample_info(e.sample_id));
            assert_eq!(i64::from(info.class), i64::from(e.label));
            assert_eq!(info.len, e.size);
        }

        // Same spec: skipped, nothing rewritten.
        let before = fs::metadata(spec.path_of(0)).unwrap().modified().unwrap();
        let s2 = generate(&spec, |_, _| {}).unwrap();
        assert!(s2.skipped);
        assert_eq!(s2.bytes, s.bytes);
        assert_eq!(
            fs::metadata(spec.path_of(0)).unwrap().modified().unwrap(),
            before
        );

        // Other spec: regenerated, stale files and classes gone.
        let smaller = SynthSpec {
            seed: 8,
            ..small(&root, 120, 4)
        };
        let s3 = generate(&smaller, |_, _| {}).unwrap();
        assert!(!s3.skipped);
        let cat = Catalog::from_dir(&root).unwrap();
        assert_eq!(cat.len(), 120);
        assert_eq!(cat.class_names().len(), 4);
        for e in cat.entries() {
            let info = verify_sample(&cat.read_sample(e.sample_id).unwrap()).unwrap();
            assert_eq!(info, smaller.sample_info(e.sample_id));
        }
        assert!(generate(&smaller, |_, _| {}).unwrap().skipped);
    }

    #[test]
    fn interrupted_run_is_redone() {
        let d = tempfile::tempdir().unwrap();
        let spec = small(d.path(), 20, 2);
        generate(&spec, |_, _| {}).unwrap();
        // Simulate an interruption: no marker, a leftover temp file, a
        // truncated file.
        fs::remove_file(d.path().join(MARKER_NAME)).unwrap();
        let tmp = spec.path_of(3).with_file_name(".img_00000003.bin.tmp");
        fs::write(&tmp, b"partial").unwrap();
        fs::write(spec.path_of(4), b"trunc").unwrap();
        // A foreign file is left alone.
        fs::write(d.path().join("class_000/README"), b"keep").unwrap();
        let s = generate(&spec, |_, _| {}).unwrap();
        assert!(!s.skipped);
        assert!(!tmp.exists());
        assert!(d.path().join("class_000/README").exists());
        assert!(verify_sample(&fs::read(spec.path_of(4)).unwrap()).is_ok());
        // A corrupt marker regenerates too.
        fs::write(d.path().join(MARKER_NAME), b"{garbage").unwrap();
        assert!(!generate(&spec, |_, _| {}).unwrap().skipped);
        assert!(generate(&spec, |_, _| {}).unwrap().skipped);
    }

    #[test]
    fn bad_specs_are_rejected() {
        let d = tempfile::tempdir().unwrap();
        let base = small(d.path(), 10, 2);
        for spec in [
            SynthSpec {
                num_files: 0,
                ..base.clone()
            },
            SynthSpec {
                num_classes: 0,
                ..base.clone()
            },
            SynthSpec {
                num_classes: 11,
                ..base.clone()
            },
            SynthSpec {
                mean_size: 10,
                ..base.clone()
            },
            SynthSpec {
                sigma: f64::NAN,
                ..base.clone()
            },
            SynthSpec {
                sigma: -1.0,
                ..base.clone()
            },
        ] {
            let e = generate(&spec, |_, _| {}).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
        assert!(fs::read_dir(d.path()).unwrap().next().is_none());
    }

    #[test]
    fn fill_rate_is_high() {
        // Release builds fill well above 1 GB/s; the bound leaves room for
        // slow, shared CI machines.
        let spec = SynthSpec::new("/r");
        let mut buf = Vec::new();
        let t = Instant::now();
        let mut bytes = 0u64;
        let mut id = 0;
        while bytes < 200_000_000 {
            spec.render(id, &mut buf);
            bytes += buf.len() as u64;
            id += 1;
        }
        let rate = bytes as f64 / t.elapsed().as_secs_f64();
        if !cfg!(debug_assertions) {
            assert!(rate > 200e6, "render rate {:.0} MB/s", rate / 1e6);
        }
    }
}
