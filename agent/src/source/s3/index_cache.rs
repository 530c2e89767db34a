//! The shard-index cache (`cache.shard_index_dir`): the samples each
//! object-store shard's walk found, kept in a local folder, so that an
//! agent that opens the dataset again (a restart, a reload) walks only the
//! shards that changed.
//!
//! A shard's entry is found by a key naming everything its samples depend
//! on: the store (kind, endpoint, region or account), the shard's URL, its
//! size and its **ETag** (a new version of an object has a new ETag), the
//! format, the sample and label fields, and the walks' version
//! ([`crate::source::shards::WALK_VERSION`]). A shard without an ETag is
//! never cached. One file per shard, named by the key's SHA-256: the key
//! itself, the samples (offset, length, label), and a CRC-32C of the whole.
//! A file that is missing, torn, of another key or version, or places a
//! sample outside its shard is ignored (the shard is walked, the file
//! rewritten); the cache can never fail an index. Files are written whole
//! to a temporary name and renamed, the folder is created mode 0700.

use crate::source::shards::ShardSample;
use sha2::{Digest, Sha256};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The files' magic.
const MAGIC: &[u8; 8] = b"GRNSHIX1";
/// Bytes per sample in a file.
const RECORD: usize = 20;

/// The cache folder.
#[derive(Debug, Clone)]
pub struct ShardIndexCache {
    dir: PathBuf,
}

impl ShardIndexCache {
    /// The cache in `dir`, created (mode 0700) when missing.
    pub fn open(dir: &Path) -> io::Result<ShardIndexCache> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(ShardIndexCache {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        let digest = Sha256::digest(key.as_bytes());
        let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.idx"))
    }

    /// The samples kept for `key` (a shard of `size` bytes), if a sound
    /// file holds them.
    pub fn get(&self, key: &str, size: u64) -> Option<Vec<ShardSample>> {
        let data = std::fs::read(self.path(key)).ok()?;
        let (body, crc) = data.split_at_checked(data.len().checked_sub(4)?)?;
        if crc32c::crc32c(body).to_le_bytes() != crc[..] || !body.starts_with(MAGIC) {
            return None;
        }
        let rest = &body[MAGIC.len()..];
        let key_len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        if rest.get(4..4 + key_len)? != key.as_bytes() {
            return None;
        }
        let rest = &rest[4 + key_len..];
        let count = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let records = &rest[8..];
        if records.len() as u64 != count.checked_mul(RECORD as u64)? {
            return None;
        }
        records
            .chunks_exact(RECORD)
            .map(|r| {
                let offset = u64::from_le_bytes(r[..8].try_into().expect("8"));
                let len = u64::from_le_bytes(r[8..16].try_into().expect("8"));
                let label = i32::from_le_bytes(r[16..].try_into().expect("4"));
                offset
                    .checked_add(len)
                    .filter(|&end| end <= size)
                    .map(|_| ShardSample { offset, len, label })
            })
            .collect()
    }

    /// Keeps `samples` for `key`; a failure is logged and otherwise ignored
    /// (the next index walks the shard again).
    pub fn put(&self, key: &str, samples: &[ShardSample]) {
        let mut out = Vec::with_capacity(MAGIC.len() + 16 + key.len() + samples.len() * RECORD);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&(samples.len() as u64).to_le_bytes());
        for s in samples {
            out.extend_from_slice(&s.offset.to_le_bytes());
            out.extend_from_slice(&s.len.to_le_bytes());
            out.extend_from_slice(&s.label.to_le_bytes());
        }
        out.extend_from_slice(&crc32c::crc32c(&out).to_le_bytes());
        let path = self.path(key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::write(&tmp, &out).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(
                "shard index cache: cannot write {}: {e} (the shard will be walked again)",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<ShardSample> {
        (0..50)
            .map(|i| ShardSample {
                offset: i * 1000,
                len: 900 + i,
                label: i as i32 - 7,
            })
            .collect()
    }

    #[test]
    fn kept_samples_come_back_for_their_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ShardIndexCache::open(&dir.path().join("a/b")).unwrap();
        let mode = std::fs::metadata(dir.path().join("a/b")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o700
        );
        assert_eq!(cache.get("k", 1 << 20), None, "nothing kept yet");
        cache.put("k", &samples());
        assert_eq!(cache.get("k", 1 << 20), Some(samples()));
        assert_eq!(cache.get("other", 1 << 20), None);
        assert_eq!(
            cache.get("k", 40_000),
            None,
            "a sample past the shard's size: ignored"
        );
        cache.put("k", &[]);
        assert_eq!(cache.get("k", 1 << 20), Some(Vec::new()), "rewritten");
    }

    #[test]
    fn damaged_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ShardIndexCache::open(dir.path()).unwrap();
        cache.put("k", &samples());
        let path = cache.path("k");
        let good = std::fs::read(&path).unwrap();
        for at in (0..good.len()).step_by(7) {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(cache.get("k", 1 << 20), None, "byte {at} flipped");
        }
        for cut in [0, 3, 12, good.len() - 1] {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert_eq!(cache.get("k", 1 << 20), None, "cut at {cut}");
        }
    }
}
