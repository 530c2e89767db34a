//! Warm restart: the arena lives in a named file that outlives `granaryd`,
//! with an index of its samples beside it, so that an agent that crashed,
//! was killed or was restarted finds the samples it held.
//!
//! * **Where.** `/dev/shm/granary-<uid>-<key>.arena` (tmpfs) or, when the
//!   arena is on hugepages, `granary-<uid>-<key>.arena` in the first
//!   hugetlbfs mount this user can write; the index and the journal are
//!   always `/dev/shm/granary-<uid>-<key>.index` and `.journal`. `<key>` is
//!   the first 16 hex digits of the SHA-256 of the socket's absolute path,
//!   so two agents on one host (they cannot share a socket) never share
//!   files. The arena file is mode 0400, owned by the agent's user.
//! * **The index.** Rewritten whole (a temporary file renamed over the
//!   old one, so a reader sees the old or the new one, never a torn one) at
//!   most every [`SNAPSHOT_EVERY`] while the cache changes, and when the
//!   agent stops. It names the arena file, its size and page kind, and per
//!   dataset its name, its fingerprint ([`crate::peers::fingerprint`]) and
//!   every cached sample's index, offset, length and CRC-32C; a CRC-32C of
//!   the whole file closes it.
//! * **The journal.** Between two index writes, the samples that became
//!   ready (or moved to the keep area) are appended at the end of each
//!   engine turn, [`JOURNAL_RECORD`] bytes each with a CRC of their own;
//!   writing the index empties it. A `kill -9` loses at most one turn.
//! * **A new file each start.** The previous agent's file is only read:
//!   the samples the index and the journal list are copied into a new file
//!   of the same name at the same offsets, so that loaders still mapping
//!   the previous one (batches on loan, batches published before the kill)
//!   see their bytes unchanged.
//! * **On start.** A different arena (size, hugepages, file) is a cold
//!   start, logged with the reason, as is a missing or torn index. A
//!   dataset whose fingerprint changed loses its samples (only its own);
//!   every other sample is put back only where its extent is free and its
//!   bytes still have their CRC-32C. Counted in
//!   `granary_warm_restart_samples_total{outcome}`.
//! * **Clean-up.** At start the agent removes the files of its user's
//!   agents whose socket directory no longer exists; an operator removes an
//!   agent's files with `rm /dev/shm/granary-<uid>-<key>.*` (and the arena
//!   file in the hugetlbfs mount) while it is stopped.

use crate::config::Config;
use granary_shm::arena::{Arena, ArenaOptions, ArenaView};
use sha2::{Digest, Sha256};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the index is rewritten while the cache changes; between two
/// rewrites, the samples that became ready are appended to the journal at
/// the end of each engine turn.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);

/// One journal record's bytes.
pub const JOURNAL_RECORD: usize = 40;

/// Where the index lives (and the arena, on normal pages).
pub const SHM_DIR: &str = "/dev/shm";

const MAGIC: &[u8; 8] = b"GRNYWRM1";

/// One cached sample in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Sample index in its dataset.
    pub index: u64,
    /// Arena offset of its first byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// CRC-32C of its bytes.
    pub crc32c: u32,
}

/// A dataset's part of the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetIndex {
    /// The dataset's name.
    pub name: String,
    /// Its fingerprint when the samples were read.
    pub fingerprint: u64,
    /// Its cached samples.
    pub records: Vec<Record>,
}

/// The whole index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// The arena file it describes.
    pub arena_path: PathBuf,
    /// The arena's size.
    pub arena_size: u64,
    /// Whether the arena is on hugepages.
    pub hugepages: bool,
    /// The socket of the agent that wrote it.
    pub socket: PathBuf,
    /// Per dataset.
    pub datasets: Vec<DatasetIndex>,
}

/// A sample that became ready after the index was written, as the journal
/// has it: its dataset by fingerprint (which covers the dataset's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalRecord {
    /// The dataset's fingerprint.
    pub fingerprint: u64,
    /// The sample.
    pub record: Record,
}

impl JournalRecord {
    /// The record's bytes: fingerprint, index, offset, length (u64 each),
    /// CRC-32C of the sample (u32), CRC-32C of the 36 bytes before (u32).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&self.record.index.to_le_bytes());
        out.extend_from_slice(&self.record.offset.to_le_bytes());
        out.extend_from_slice(&self.record.len.to_le_bytes());
        out.extend_from_slice(&self.record.crc32c.to_le_bytes());
        let check = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&check.to_le_bytes());
    }

    /// The records of a journal's bytes, up to the first torn or damaged
    /// one.
    pub fn decode_all(bytes: &[u8]) -> Vec<JournalRecord> {
        let mut out = Vec::new();
        for c in bytes.chunks_exact(JOURNAL_RECORD) {
            let u = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().expect("8 bytes"));
            let w = |i: usize| u32::from_le_bytes(c[i..i + 4].try_into().expect("4 bytes"));
            if crc32c::crc32c(&c[..36]) != w(36) {
                break;
            }
            out.push(JournalRecord {
                fingerprint: u(0),
                record: Record {
                    index: u(8),
                    offset: u(16),
                    len: u(24),
                    crc32c: w(32),
                },
            });
        }
        out
    }
}

/// The files of the agent serving `socket`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// `granary-<uid>-<key>`.
    pub stem: String,
    /// The index, in [`SHM_DIR`].
    pub index: PathBuf,
    /// The journal, in [`SHM_DIR`].
    pub journal: PathBuf,
}

impl Files {
    /// The files of the agent whose socket is `socket` (made absolute).
    pub fn for_socket(socket: &Path) -> Files {
        let abs = std::path::absolute(socket).unwrap_or_else(|_| socket.to_path_buf());
        let digest = Sha256::digest(abs.as_os_str().as_encoded_bytes());
        let key: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        let stem = format!("granary-{}-{key}", nix::unistd::geteuid().as_raw());
        Files {
            index: Path::new(SHM_DIR).join(format!("{stem}.index")),
            journal: Path::new(SHM_DIR).join(format!("{stem}.journal")),
            stem,
        }
    }

    /// The arena file in directory `dir`.
    pub fn arena_in(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.arena", self.stem))
    }

    /// Removes the index and the arena files (in [`SHM_DIR`] and in every
    /// hugetlbfs mount); what is not there is no error.
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.index);
        let _ = std::fs::remove_file(&self.journal);
        let _ = std::fs::remove_file(self.arena_in(Path::new(SHM_DIR)));
        for dir in hugetlbfs_mounts() {
            let _ = std::fs::remove_file(self.arena_in(&dir));
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

impl Index {
    /// The index as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let n: usize = self.datasets.iter().map(|d| d.records.len()).sum();
        let mut out = Vec::with_capacity(128 + n * 28);
        out.extend_from_slice(MAGIC);
        put_bytes(&mut out, self.arena_path.as_os_str().as_encoded_bytes());
        out.extend_from_slice(&self.arena_size.to_le_bytes());
        out.push(u8::from(self.hugepages));
        put_bytes(&mut out, self.socket.as_os_str().as_encoded_bytes());
        out.extend_from_slice(&(self.datasets.len() as u64).to_le_bytes());
        for d in &self.datasets {
            put_bytes(&mut out, d.name.as_bytes());
            out.extend_from_slice(&d.fingerprint.to_le_bytes());
            out.extend_from_slice(&(d.records.len() as u64).to_le_bytes());
            for r in &d.records {
                out.extend_from_slice(&r.index.to_le_bytes());
                out.extend_from_slice(&r.offset.to_le_bytes());
                out.extend_from_slice(&r.len.to_le_bytes());
                out.extend_from_slice(&r.crc32c.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads an index; `None` when it is torn, of another version or
    /// otherwise not one.
    pub fn decode(bytes: &[u8]) -> Option<Index> {
        let (body, tail) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32c::crc32c(body).to_le_bytes() != tail {
            return None;
        }
        let mut r = Reader(body);
        if r.take(8)? != MAGIC {
            return None;
        }
        let arena_path = r.path()?;
        let arena_size = r.u64()?;
        let hugepages = r.take(1)?[0] != 0;
        let socket = r.path()?;
        let count = r.u64()?;
        let mut datasets = Vec::new();
        for _ in 0..count {
            let name = String::from_utf8(r.bytes()?.to_vec()).ok()?;
            let fingerprint = r.u64()?;
            let n = r.u64()?;
            // Each record is 28 bytes: a count beyond the rest is a lie.
            if n > (r.0.len() / 28) as u64 {
                return None;
            }
            let mut records = Vec::with_capacity(n as usize);
            for _ in 0..n {
                records.push(Record {
                    index: r.u64()?,
                    offset: r.u64()?,
                    len: r.u64()?,
                    crc32c: u32::from_le_bytes(r.take(4)?.try_into().ok()?),
                });
            }
            datasets.push(DatasetIndex {
                name,
                fingerprint,
                records,
            });
        }
        r.0.is_empty().then_some(Index {
            arena_path,
            arena_size,
            hugepages,
            socket,
            datasets,
        })
    }

    /// Writes the index to `path` atomically: a temporary file beside it,
    /// renamed over it.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let tmp = path.with_extension("index.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode_0600()
            .open(&tmp)?;
        f.write_all(&self.encode())?;
        drop(f);
        std::fs::rename(&tmp, path)
    }

    /// Reads the index at `path`: `Ok(None)` when there is none, `Err`
    /// with a reason when it cannot be used.
    pub fn read(path: &Path) -> Result<Option<Index>, String> {
        match std::fs::read(path) {
            Ok(b) => Index::decode(&b)
                .map(Some)
                .ok_or_else(|| format!("the index {} is torn or not an index", path.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("the index {} cannot be read: {e}", path.display())),
        }
    }
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
    fn path(&mut self) -> Option<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(self.bytes()?)))
    }
}

/// The hugetlbfs mounts (`/proc/mounts`) this user may create files in.
pub fn hugetlbfs_mounts() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/mounts") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let dir = f.nth(1)?;
            (f.next()? == "hugetlbfs").then(|| PathBuf::from(dir.replace("\\040", " ")))
        })
        .filter(|d| nix::unistd::access(d.as_path(), nix::unistd::AccessFlags::W_OK).is_ok())
        .collect()
}

/// The bytes the tmpfs of `path` can still give an arena file at `path`:
/// its free space plus what an existing file there already holds. `None`
/// when it cannot be told.
fn shm_room(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let st = nix::sys::statvfs::statvfs(path.parent()?).ok()?;
    let free = st.blocks_available().checked_mul(st.fragment_size())?;
    let held = std::fs::symlink_metadata(path).map_or(0, |m| m.blocks() * 512);
    Some(free.saturating_add(held))
}

/// The arena the agent serves from, and the warm-restart state that goes
/// with it (`None`: a sealed memfd, cold on every start).
pub struct Opened {
    /// The arena.
    pub arena: Arena,
    /// The files and what the index said, when the arena is persistent.
    pub warm: Option<Warm>,
}

/// A persistent arena's files and the index found at start.
pub struct Warm {
    /// The agent's files.
    pub files: Files,
    /// The arena file in use.
    pub arena_path: PathBuf,
    /// The socket (written into the index).
    pub socket: PathBuf,
    /// The datasets' samples found in the index, still to be checked and
    /// put back (each when its dataset is ready).
    pub pending: Vec<DatasetIndex>,
    /// The samples found in the journal, likewise.
    pub pending_journal: Vec<JournalRecord>,
}

/// Removes the files of this user's agents whose socket directory is gone
/// (test runs, retired agents), except `keep`'s.
pub fn collect_stale(keep: &Files) {
    let prefix = format!("granary-{}-", nix::unistd::geteuid().as_raw());
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name
            .strip_suffix(".index")
            .filter(|s| s.starts_with(&prefix))
        else {
            continue;
        };
        if stem == keep.stem {
            continue;
        }
        let Ok(Some(idx)) = Index::read(&e.path()) else {
            continue;
        };
        let gone = idx.socket.parent().is_some_and(|p| !p.exists());
        if gone {
            let files = Files {
                stem: stem.to_string(),
                index: e.path(),
                journal: Path::new(SHM_DIR).join(format!("{stem}.journal")),
            };
            tracing::info!(
                index = %files.index.display(),
                "removing a warm-restart arena whose agent's socket directory {} is gone",
                idx.socket.parent().map(|p| p.display().to_string()).unwrap_or_default()
            );
            let _ = std::fs::remove_file(&idx.arena_path);
            files.remove();
        }
    }
}

/// Opens the arena of the agent configured by `cfg`: a persistent file
/// (tmpfs, or hugetlbfs when the arena is on hugepages and a mount is
/// writable) with the index found beside it, or, when hugepages are wanted
/// and no hugetlbfs mount can hold them, the sealed hugepage memfd of
/// before (cold on every start, logged).
pub fn open_arena(cfg: &Config, opts: &ArenaOptions) -> io::Result<Opened> {
    use crate::config::HugePages;
    let files = Files::for_socket(&cfg.socket.path);
    collect_stale(&files);
    let size = opts.size;
    let mut chosen: Option<(Arena, PathBuf, Option<ArenaView>)> = None;
    let mut why_cold: Option<String> = None;
    if cfg.arena.hugepages != HugePages::Off {
        let hp = granary_shm::arena::hugepage_size().unwrap_or(2 << 20);
        let huge_size = size.next_multiple_of(hp.max(1));
        let free = granary_shm::arena::hugepages_free().map(|f| f * hp);
        let enough = free.is_some_and(|f| f >= huge_size);
        // The previous agent's file in the mount holds pages the new one
        // can have if need be (it is then a cold start, not a stuck one).
        let held = |dir: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(files.arena_in(dir)).map_or(0, |m| m.blocks() * 512)
        };
        match hugetlbfs_mounts().into_iter().next() {
            Some(dir) if free.is_some_and(|f| f + held(&dir) >= huge_size) => {
                let path = files.arena_in(&dir);
                let o = ArenaOptions {
                    size: huge_size,
                    ..opts.clone()
                };
                match Arena::persistent(&path, &o, true) {
                    Ok((a, previous)) => chosen = Some((a, path, previous)),
                    Err(e) => tracing::warn!(
                        "a hugepage arena file {} could not be set up: {e}",
                        path.display()
                    ),
                }
            }
            Some(_) => {}
            None if enough || cfg.arena.hugepages == HugePages::Required => {
                why_cold = Some(
                    "hugepages are free but no hugetlbfs mount is writable: the arena is a hugepage memfd, and a restart will be cold".into(),
                );
            }
            None => {}
        }
        if chosen.is_none() && (why_cold.is_some() || cfg.arena.hugepages == HugePages::Required) {
            // An earlier arena file of this agent would only hold memory
            // (or the hugepages this arena needs).
            files.remove();
            let arena = Arena::create(opts).map_err(|e| io::Error::other(format!("arena: {e}")))?;
            if let Some(w) = why_cold {
                tracing::warn!("{w}");
            }
            return Ok(Opened { arena, warm: None });
        }
    }
    let (arena, arena_path, previous) = match chosen {
        Some(c) => c,
        None => {
            let path = files.arena_in(Path::new(SHM_DIR));
            let o = ArenaOptions {
                size: size.next_multiple_of(granary_shm::arena::ARENA_ALIGN),
                ..opts.clone()
            };
            // A tmpfs that cannot hold the arena would end the agent with
            // SIGBUS when it fills up: then the arena is a memfd, as before
            // warm restarts, and restarts are cold.
            if let Some(room) = shm_room(&path) {
                if room < o.size {
                    tracing::warn!(
                        "{SHM_DIR} has room for {room} bytes, the arena needs {}: the arena is a memfd, and a restart will be cold (make {SHM_DIR} larger to keep it)",
                        o.size
                    );
                    files.remove();
                    let arena =
                        Arena::create(opts).map_err(|e| io::Error::other(format!("arena: {e}")))?;
                    return Ok(Opened { arena, warm: None });
                }
            }
            let (a, previous) = Arena::persistent(&path, &o, false)
                .map_err(|e| io::Error::other(format!("arena file {}: {e}", path.display())))?;
            (a, path, previous)
        }
    };
    // Any arena file of this agent elsewhere (the page kind changed) is
    // stale.
    for other in std::iter::once(PathBuf::from(SHM_DIR)).chain(hugetlbfs_mounts()) {
        let p = files.arena_in(&other);
        if p != arena_path {
            let _ = std::fs::remove_file(p);
        }
    }
    let mut journal = Vec::new();
    let pending = match Index::read(&files.index) {
        Ok(Some(idx)) => {
            let cold = if idx.arena_path != arena_path {
                Some(format!(
                    "the arena moved from {} to {} (the page kind changed)",
                    idx.arena_path.display(),
                    arena_path.display()
                ))
            } else if idx.arena_size != arena.size() || idx.hugepages != arena.is_hugepage() {
                Some(format!(
                    "the arena changed from {} bytes{} to {} bytes{}",
                    idx.arena_size,
                    if idx.hugepages { " on hugepages" } else { "" },
                    arena.size(),
                    if arena.is_hugepage() {
                        " on hugepages"
                    } else {
                        ""
                    }
                ))
            } else if previous.is_none() {
                Some(
                    "the arena file is new (none was there, or it had another size or owner)"
                        .to_string(),
                )
            } else {
                None
            };
            match cold {
                Some(why) => {
                    tracing::warn!("warm restart: cold start, {why}");
                    Vec::new()
                }
                None => {
                    journal = std::fs::read(&files.journal)
                        .map(|b| JournalRecord::decode_all(&b))
                        .unwrap_or_default();
                    let n: usize =
                        idx.datasets.iter().map(|d| d.records.len()).sum::<usize>() + journal.len();
                    tracing::info!(
                        arena = %arena_path.display(),
                        index = %files.index.display(),
                        samples = n,
                        "warm restart: found an index and a journal of {n} samples; each is checked when its dataset is ready"
                    );
                    idx.datasets
                }
            }
        }
        Ok(None) => {
            if previous.is_some() {
                tracing::warn!(
                    "warm restart: cold start, the arena file {} has no index beside it ({} is missing)",
                    arena_path.display(),
                    files.index.display()
                );
            } else {
                tracing::info!(
                    arena = %arena_path.display(),
                    index = %files.index.display(),
                    "warm restart: no earlier arena, a cold start; this arena outlives the agent for the next start"
                );
            }
            Vec::new()
        }
        Err(why) => {
            tracing::warn!("warm restart: cold start, {why}");
            Vec::new()
        }
    };
    // The samples move to the new file at the same offsets; the previous
    // one goes when the last loader still mapping it lets go (its batches
    // on loan and those published before the agent died stay as they were).
    if let Some(prev) = previous {
        let t0 = std::time::Instant::now();
        let mut bytes = 0u64;
        let records = pending
            .iter()
            .flat_map(|d| d.records.iter())
            .chain(journal.iter().map(|j| &j.record));
        for r in records {
            if let Ok(len) = usize::try_from(r.len) {
                if arena.copy_from(&prev, r.offset, len).is_ok() {
                    bytes += r.len;
                }
            }
        }
        if bytes > 0 {
            tracing::info!(
                bytes,
                ms = t0.elapsed().as_millis() as u64,
                "warm restart: the samples copied from the previous arena file"
            );
        }
    }
    Ok(Opened {
        arena,
        warm: Some(Warm {
            files,
            arena_path,
            socket: std::path::absolute(&cfg.socket.path).unwrap_or(cfg.socket.path.clone()),
            pending,
            pending_journal: journal,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Index {
        Index {
            arena_path: "/dev/shm/granary-1-00.arena".into(),
            arena_size: 64 << 20,
            hugepages: false,
            socket: "/run/granary/granary.sock".into(),
            datasets: vec![
                DatasetIndex {
                    name: "a".into(),
                    fingerprint: 7,
                    records: vec![
                        Record {
                            index: 3,
                            offset: 4096,
                            len: 100,
                            crc32c: 9,
                        },
                        Record {
                            index: 5,
                            offset: 8192,
                            len: 4096,
                            crc32c: 10,
                        },
                    ],
                },
                DatasetIndex {
                    name: "b".into(),
                    fingerprint: 8,
                    records: vec![],
                },
            ],
        }
    }

    #[test]
    fn the_index_reads_back_and_a_torn_one_is_refused() {
        let idx = sample();
        let b = idx.encode();
        assert_eq!(Index::decode(&b), Some(idx));
        for cut in [0, 1, 8, b.len() / 2, b.len() - 1] {
            assert_eq!(Index::decode(&b[..cut]), None, "cut at {cut}");
        }
        let mut flipped = b.clone();
        flipped[20] ^= 1;
        assert_eq!(Index::decode(&flipped), None);
    }

    #[test]
    fn the_index_is_written_atomically_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.index");
        assert_eq!(Index::read(&p), Ok(None));
        sample().write(&p).unwrap();
        assert_eq!(Index::read(&p), Ok(Some(sample())));
        std::fs::write(&p, b"torn").unwrap();
        assert!(Index::read(&p).unwrap_err().contains("torn"));
    }

    #[test]
    fn the_journal_reads_back_up_to_a_torn_record() {
        let mut b = Vec::new();
        for i in 0..3 {
            JournalRecord {
                fingerprint: 9,
                record: Record {
                    index: i,
                    offset: 4096 * i,
                    len: 10,
                    crc32c: 7,
                },
            }
            .encode(&mut b);
        }
        assert_eq!(b.len(), 3 * JOURNAL_RECORD);
        assert_eq!(JournalRecord::decode_all(&b).len(), 3);
        assert_eq!(JournalRecord::decode_all(&b[..b.len() - 1]).len(), 2);
        b[JOURNAL_RECORD + 3] ^= 1;
        assert_eq!(JournalRecord::decode_all(&b).len(), 1);
    }

    #[test]
    fn two_sockets_never_share_files() {
        let a = Files::for_socket(Path::new("/run/a/granary.sock"));
        let b = Files::for_socket(Path::new("/run/b/granary.sock"));
        assert_ne!(a, b);
        assert_eq!(a, Files::for_socket(Path::new("/run/a/granary.sock")));
        assert!(a.index.starts_with(SHM_DIR));
        assert!(a.stem.starts_with("granary-"));
    }
}
