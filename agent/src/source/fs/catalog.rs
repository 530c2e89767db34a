//! The filesystem source's catalog: which files make up a dataset, in which
//! order, with which labels.
//!
//! Two layouts are understood.
//!
//! **Directory tree** ([`Catalog::from_dir`], ImageNet / torchvision
//! `ImageFolder` style). Every directory directly under the root is a class;
//! classes get labels `0..k-1` in the byte order of their folder names. Every
//! regular file below a class folder (recursively) is a sample of that class;
//! regular files directly in the root are samples with label `-1`. Names
//! starting with `.` are skipped, symbolic links are followed, and only
//! regular files become samples (FIFOs, sockets and devices are skipped).
//! Samples are ordered by label (root files first), then by path below the
//! class folder, compared component by component in byte order; the sample id
//! is the position in that order, so ids are stable as long as the tree is
//! unchanged.
//!
//! **Manifest** (`Catalog::from_manifest`). One sample per line,
//! `path<TAB>label`, where the label is a 32-bit signed integer and the path is
//! taken up to the last tab. Relative paths are resolved against the
//! manifest's directory. Blank lines and lines whose first non-blank character
//! is `#` are skipped; a trailing `\r` is ignored. The sample id is the
//! position among the sample lines. A path may be listed more than once.
//!
//! Sizes come from file metadata when the catalog is built.

use crate::source::samples::{deref_to_samples, meta_from_fields, EntryMeta, SampleList};
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One sample of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// Stable id: the sample's position in the catalog.
    pub sample_id: u64,
    /// Where the sample's bytes are.
    pub path: PathBuf,
    /// Class label (`-1`: none).
    pub label: i32,
    /// The sample's length in bytes (the file's size, for `format =
    /// "files"`).
    pub size: u64,
    /// Where the sample starts in the file (0 for `format = "files"`; a
    /// sample of a shard is a range of it).
    pub offset: u64,
    /// The file's size when the catalog was built: a read checks the file
    /// still has it.
    pub file_size: u64,
    /// Modification time when the catalog was built (seconds and
    /// nanoseconds since the epoch): a read checks the file still has it.
    pub mtime: (i64, u32),
}

/// A file's modification time from its metadata.
fn mtime_of(meta: &fs::Metadata) -> (i64, u32) {
    (meta.mtime(), u32::try_from(meta.mtime_nsec()).unwrap_or(0))
}

/// The ordered list of a dataset's samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    samples: SampleList<CatalogEntry>,
    class_names: Vec<OsString>,
}

deref_to_samples!(Catalog, CatalogEntry);

impl EntryMeta for CatalogEntry {
    meta_from_fields!();

    /// The modification time the read checks: seconds (i64) and
    /// nanoseconds (u32), little-endian; for a range of a shard, then its
    /// offset and the shard's size (u64, little-endian). The path is left
    /// out, so that agents mounting one dataset at different places still
    /// agree.
    fn version(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.mtime.0.to_le_bytes());
        out.extend_from_slice(&self.mtime.1.to_le_bytes());
        if self.offset != 0 || self.file_size != self.size {
            out.extend_from_slice(&self.offset.to_le_bytes());
            out.extend_from_slice(&self.file_size.to_le_bytes());
        }
    }
}

/// Why a catalog could not be built.
#[derive(Debug)]
pub enum CatalogError {
    /// A file or directory could not be opened, listed or examined.
    Io {
        /// The path concerned.
        path: PathBuf,
        /// What was being done ("read directory", "read manifest", …).
        action: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// The dataset root is not a directory.
    NotADirectory {
        /// The configured root.
        path: PathBuf,
    },
    /// A symbolic link in the tree points nowhere.
    BrokenLink {
        /// The link.
        path: PathBuf,
    },
    /// A symbolic link leads back to a directory that contains it.
    LinkLoop {
        /// The link.
        path: PathBuf,
    },
    /// A manifest line could not be used.
    Manifest {
        /// The manifest file.
        manifest: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// The dataset holds no sample.
    Empty {
        /// The root or manifest.
        path: PathBuf,
    },
    /// More classes than labels fit in an `i32`.
    TooManyClasses {
        /// The dataset root.
        path: PathBuf,
    },
    /// A shard could not be indexed (`format = "webdataset"`, `"mds"`,
    /// `"parquet"`, `"arrow"`).
    Shard(crate::source::shards::WalkError),
    /// A dataset configuration names neither a root nor a manifest.
    NoLocation {
        /// The dataset's name.
        dataset: String,
    },
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogError::Io {
                path,
                action,
                source,
            } => {
                write!(f, "cannot {action} {}: {source}", path.display())
            }
            CatalogError::NotADirectory { path } => {
                write!(f, "dataset root {} is not a directory", path.display())
            }
            CatalogError::BrokenLink { path } => {
                write!(f, "{}: symbolic link to nothing", path.display())
            }
            CatalogError::LinkLoop { path } => write!(
                f,
                "{}: symbolic link leads back into a directory that contains it",
                path.display()
            ),
            CatalogError::Manifest {
                manifest,
                line,
                reason,
            } => {
                write!(f, "{}:{line}: {reason}", manifest.display())
            }
            CatalogError::Empty { path } => write!(f, "no sample found in {}", path.display()),
            CatalogError::TooManyClasses { path } => {
                write!(
                    f,
                    "{}: more class folders than 32-bit labels",
                    path.display()
                )
            }
            CatalogError::Shard(e) => write!(f, "{e}"),
            CatalogError::NoLocation { dataset } => write!(
                f,
                "dataset {dataset:?} sets neither `root` nor `manifest` (exactly one is required)"
            ),
        }
    }
}

impl std::error::Error for CatalogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CatalogError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(io::Error) -> CatalogError + 'a {
    move |source| CatalogError::Io {
        path: path.to_path_buf(),
        action,
        source,
    }
}

/// What a directory entry turned out to be, after following links.
enum Kind {
    /// A regular file: its size and modification time.
    File(u64, (i64, u32)),
    Dir(fs::Metadata),
    Other,
}

/// The entries of `dir` sorted by name bytes, hidden names skipped, links
/// followed.
fn sorted_entries(dir: &Path) -> Result<Vec<(OsString, PathBuf, Kind)>, CatalogError> {
    let rd = fs::read_dir(dir).map_err(io_err(dir, "read directory"))?;
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(io_err(dir, "read directory"))?;
        let name = ent.file_name();
        if name.as_bytes().first() == Some(&b'.') {
            continue;
        }
        let path = ent.path();
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Vanished since listed, or a dangling link.
                match fs::symlink_metadata(&path) {
                    Ok(l) if l.file_type().is_symlink() => {
                        return Err(CatalogError::BrokenLink { path })
                    }
                    Ok(_) => return Err(io_err(&path, "examine")(e)),
                    Err(_) => continue,
                }
            }
            Err(e) => return Err(io_err(&path, "examine")(e)),
        };
        let kind = if meta.is_file() {
            Kind::File(meta.len(), mtime_of(&meta))
        } else if meta.is_dir() {
            Kind::Dir(meta)
        } else {
            Kind::Other
        };
        out.push((name, path, kind));
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// Appends every regular file below `dir` (depth first, sorted) to `out`.
/// `ancestors` holds the (device, inode) of the directories being walked.
fn walk(
    dir: &Path,
    label: i32,
    ancestors: &mut HashSet<(u64, u64)>,
    out: &mut Vec<CatalogEntry>,
) -> Result<(), CatalogError> {
    for (_, path, kind) in sorted_entries(dir)? {
        match kind {
            Kind::File(size, mtime) => out.push(CatalogEntry {
                sample_id: out.len() as u64,
                path,
                label,
                size,
                offset: 0,
                file_size: size,
                mtime,
            }),
            Kind::Dir(meta) => {
                let key = (meta.dev(), meta.ino());
                if !ancestors.insert(key) {
                    return Err(CatalogError::LinkLoop { path });
                }
                walk(&path, label, ancestors, out)?;
                ancestors.remove(&key);
            }
            Kind::Other => {}
        }
    }
    Ok(())
}

impl Catalog {
    /// Catalogs a directory tree of class folders (see the module docs for
    /// the exact rules).
    pub fn from_dir(root: impl AsRef<Path>) -> Result<Catalog, CatalogError> {
        let root = root.as_ref();
        let meta = fs::metadata(root).map_err(io_err(root, "open dataset root"))?;
        if !meta.is_dir() {
            return Err(CatalogError::NotADirectory {
                path: root.to_path_buf(),
            });
        }
        let top = sorted_entries(root)?;
        let mut entries = Vec::new();
        for (_, path, kind) in &top {
            if let Kind::File(size, mtime) = kind {
                entries.push(CatalogEntry {
                    sample_id: entries.len() as u64,
                    path: path.clone(),
                    label: -1,
                    size: *size,
                    offset: 0,
                    file_size: *size,
                    mtime: *mtime,
                });
            }
        }
        let mut class_names = Vec::new();
        let mut ancestors = HashSet::new();
        ancestors.insert((meta.dev(), meta.ino()));
        for (name, path, kind) in top {
            if let Kind::Dir(m) = kind {
                let label =
                    i32::try_from(class_names.len()).map_err(|_| CatalogError::TooManyClasses {
                        path: root.to_path_buf(),
                    })?;
                let key = (m.dev(), m.ino());
                if !ancestors.insert(key) {
                    return Err(CatalogError::LinkLoop { path });
                }
                walk(&path, label, &mut ancestors, &mut entries)?;
                ancestors.remove(&key);
                class_names.push(name);
            }
        }
        Self::finish(entries, class_names, root)
    }

    /// Catalogs the samples listed in a manifest file (see the module docs
    /// for the format).
    pub(crate) fn from_manifest(manifest: impl AsRef<Path>) -> Result<Catalog, CatalogError> {
        let manifest = manifest.as_ref();
        let text = fs::read(manifest).map_err(io_err(manifest, "read manifest"))?;
        let base = manifest.parent().unwrap_or(Path::new(""));
        let bad = |line: usize, reason: String| CatalogError::Manifest {
            manifest: manifest.to_path_buf(),
            line,
            reason,
        };
        let mut entries = Vec::new();
        for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
            let line_no = i + 1;
            let line = raw.strip_suffix(b"\r").unwrap_or(raw);
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() || trimmed[0] == b'#' {
                continue;
            }
            let Some(tab) = line.iter().rposition(|&b| b == b'\t') else {
                return Err(bad(
                    line_no,
                    format!(
                        "expected `path<TAB>label`, found no tab in {:?}",
                        String::from_utf8_lossy(line)
                    ),
                ));
            };
            let (p, l) = (&line[..tab], &line[tab + 1..]);
            let label = std::str::from_utf8(l)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
                .ok_or_else(|| {
                    bad(
                        line_no,
                        format!(
                            "label {:?} is not a 32-bit integer",
                            String::from_utf8_lossy(l)
                        ),
                    )
                })?;
            if p.is_empty() {
                return Err(bad(line_no, "empty path before the tab".to_owned()));
            }
            let rel = Path::new(OsStr::from_bytes(p));
            let path = if rel.is_absolute() {
                rel.to_path_buf()
            } else {
                base.join(rel)
            };
            let meta = fs::metadata(&path)
                .map_err(|e| bad(line_no, format!("{}: {e}", path.display())))?;
            if !meta.is_file() {
                return Err(bad(
                    line_no,
                    format!("{}: not a regular file", path.display()),
                ));
            }
            entries.push(CatalogEntry {
                sample_id: entries.len() as u64,
                path,
                label,
                size: meta.len(),
                offset: 0,
                file_size: meta.len(),
                mtime: mtime_of(&meta),
            });
        }
        Self::finish(entries, Vec::new(), manifest)
    }

    pub(crate) fn finish(
        entries: Vec<CatalogEntry>,
        class_names: Vec<OsString>,
        origin: &Path,
    ) -> Result<Catalog, CatalogError> {
        if entries.is_empty() {
            return Err(CatalogError::Empty {
                path: origin.to_path_buf(),
            });
        }
        Ok(Catalog {
            samples: SampleList::new(entries),
            class_names,
        })
    }

    /// Class folder names, indexed by label (directory trees only; empty for
    /// a manifest).
    pub fn class_names(&self) -> &[OsString] {
        &self.class_names
    }

    /// Reads a sample's bytes with plain blocking I/O (for tests and
    /// verification; the agent's fetcher does its own reads). Fails when the
    /// id is out of range, the file cannot be read, or its size differs from
    /// the catalog's; every error message names the file.
    pub fn read_sample(&self, sample_id: u64) -> io::Result<Vec<u8>> {
        let entry = self.get(sample_id).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "sample id {sample_id} is out of range (catalog has {} samples)",
                    self.len()
                ),
            )
        })?;
        let named =
            |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", entry.path.display()));
        let bytes = if entry.offset == 0 && entry.file_size == entry.size {
            fs::read(&entry.path).map_err(named)?
        } else {
            use std::os::unix::fs::FileExt;
            let f = fs::File::open(&entry.path).map_err(named)?;
            let mut buf = vec![0; usize::try_from(entry.size).map_err(io::Error::other)?];
            f.read_exact_at(&mut buf, entry.offset).map_err(named)?;
            buf
        };
        if bytes.len() as u64 != entry.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: size changed since the catalog was built (expected {} bytes, read {})",
                    entry.path.display(),
                    entry.size,
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write(path: &Path, bytes: &[u8]) {
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).unwrap();
        }
        fs::write(path, bytes).unwrap();
    }

    fn rel(c: &Catalog, root: &Path) -> Vec<(String, i32, u64)> {
        c.entries()
            .iter()
            .map(|e| {
                (
                    e.path
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                    e.label,
                    e.size,
                )
            })
            .collect()
    }

    #[test]
    fn directory_tree_labels_order_and_ids() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(&r.join("dog/b.jpg"), b"12");
        write(&r.join("dog/a.jpg"), b"1");
        write(&r.join("cat/z.jpg"), b"123");
        write(&r.join("cat/sub/y.jpg"), b"1234");
        write(&r.join("cat/sub.jpg"), b"12345");
        write(&r.join("Zebra/q.jpg"), b"");
        write(&r.join("loose.jpg"), b"xx");
        write(&r.join(".hidden/x.jpg"), b"x");
        write(&r.join("cat/.DS_Store"), b"x");
        fs::create_dir(r.join("empty")).unwrap();
        let c = Catalog::from_dir(r).unwrap();
        assert_eq!(
            rel(&c, r),
            [
                ("loose.jpg".to_owned(), -1, 2),
                ("Zebra/q.jpg".to_owned(), 0, 0),
                ("cat/sub/y.jpg".to_owned(), 1, 4),
                ("cat/sub.jpg".to_owned(), 1, 5),
                ("cat/z.jpg".to_owned(), 1, 3),
                ("dog/a.jpg".to_owned(), 2, 1),
                ("dog/b.jpg".to_owned(), 2, 2),
            ]
        );
        for (i, e) in c.entries().iter().enumerate() {
            assert_eq!(e.sample_id, i as u64);
        }
        let names: Vec<_> = c
            .class_names()
            .iter()
            .map(|n| n.to_str().unwrap())
            .collect();
        assert_eq!(names, ["Zebra", "cat", "dog", "empty"]);
        assert_eq!(c.total_bytes(), 17);
        assert_eq!(c.max_size(), 5);
        assert_eq!(c.read_sample(3).unwrap(), b"12345");
        // Rebuilding an unchanged tree gives the same catalog.
        assert_eq!(Catalog::from_dir(r).unwrap(), c);
    }

    #[test]
    fn symlinks_are_followed_and_broken_ones_reported() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        let elsewhere = d.path().join("elsewhere");
        write(&elsewhere.join("f.bin"), b"abc");
        write(&data.join("a/real.bin"), b"r");
        symlink(&elsewhere, data.join("b")).unwrap();
        symlink(elsewhere.join("f.bin"), data.join("a/link.bin")).unwrap();
        let c = Catalog::from_dir(&data).unwrap();
        assert_eq!(
            rel(&c, &data),
            [
                ("a/link.bin".to_owned(), 0, 3),
                ("a/real.bin".to_owned(), 0, 1),
                ("b/f.bin".to_owned(), 1, 3),
            ]
        );
        symlink(d.path().join("nowhere"), data.join("a/dangling.bin")).unwrap();
        let e = Catalog::from_dir(&data).unwrap_err();
        assert!(matches!(e, CatalogError::BrokenLink { .. }), "{e}");
        assert!(e.to_string().contains("dangling.bin"), "{e}");
    }

    #[test]
    fn link_loops_are_reported() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("c/x.bin"), b"x");
        symlink(d.path().join("c"), d.path().join("c/again")).unwrap();
        let e = Catalog::from_dir(d.path()).unwrap_err();
        assert!(matches!(e, CatalogError::LinkLoop { .. }), "{e}");
        assert!(e.to_string().contains("again"), "{e}");
    }

    #[test]
    fn directory_errors_name_the_path() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("missing");
        let e = Catalog::from_dir(&missing).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        write(&d.path().join("file"), b"x");
        let e = Catalog::from_dir(d.path().join("file")).unwrap_err();
        assert!(matches!(e, CatalogError::NotADirectory { .. }), "{e}");
        fs::create_dir(d.path().join("void")).unwrap();
        fs::create_dir(d.path().join("void/class")).unwrap();
        let e = Catalog::from_dir(d.path().join("void")).unwrap_err();
        assert!(matches!(e, CatalogError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("void"), "{e}");
    }

    #[test]
    fn manifest_entries_labels_and_paths() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(&r.join("imgs/a.bin"), b"aaaa");
        write(&r.join("imgs/b c.bin"), b"bb");
        let abs = r.join("abs.bin");
        write(&abs, b"z");
        let m = r.join("train.tsv");
        let text = format!(
            "# comment\n\nimgs/a.bin\t3\r\n  # indented comment\nimgs/b c.bin\t-1\n{}\t 7 \nimgs/a.bin\t3\n",
            abs.display()
        );
        write(&m, text.as_bytes());
        let c = Catalog::from_manifest(&m).unwrap();
        assert_eq!(
            rel(&c, r),
            [
                ("imgs/a.bin".to_owned(), 3, 4),
                ("imgs/b c.bin".to_owned(), -1, 2),
                ("abs.bin".to_owned(), 7, 1),
                ("imgs/a.bin".to_owned(), 3, 4),
            ]
        );
        assert!(c.class_names().is_empty());
        assert_eq!(c.get(2).unwrap().sample_id, 2);
        assert_eq!(c.read_sample(1).unwrap(), b"bb");
    }

    #[test]
    fn manifest_errors_have_line_numbers() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(&r.join("a.bin"), b"a");
        let m = r.join("m.tsv");
        let err = |text: &str| {
            write(&m, text.as_bytes());
            Catalog::from_manifest(&m).unwrap_err().to_string()
        };
        let e = err("a.bin\t1\nno-tab-here\n");
        assert!(e.contains("m.tsv:2:") && e.contains("no tab"), "{e}");
        let e = err("# c\na.bin\tcat\n");
        assert!(e.contains("m.tsv:2:") && e.contains("\"cat\""), "{e}");
        let e = err("a.bin\t99999999999\n");
        assert!(e.contains(":1:") && e.contains("32-bit"), "{e}");
        let e = err("\t1\n");
        assert!(e.contains(":1:") && e.contains("empty path"), "{e}");
        let e = err("a.bin\t1\n\nmissing.bin\t2\n");
        assert!(e.contains(":3:") && e.contains("missing.bin"), "{e}");
        fs::create_dir(r.join("dir")).unwrap();
        let e = err("dir\t2\n");
        assert!(e.contains("not a regular file"), "{e}");
        let e = err("# nothing\n");
        assert!(e.contains("no sample"), "{e}");
        let e = Catalog::from_manifest(r.join("absent.tsv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent.tsv"), "{e}");
    }

    #[test]
    fn read_sample_reports_out_of_range_vanished_and_resized() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("c/a.bin"), b"abc");
        write(&d.path().join("c/b.bin"), b"def");
        let c = Catalog::from_dir(d.path()).unwrap();
        assert_eq!(
            c.read_sample(9).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        fs::remove_file(d.path().join("c/a.bin")).unwrap();
        let e = c.read_sample(0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("a.bin"), "{e}");
        fs::write(d.path().join("c/b.bin"), b"longer").unwrap();
        let e = c.read_sample(1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("b.bin"), "{e}");
    }

    #[test]
    fn open_catalog_follows_the_config() {
        use crate::config::Config;
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("k/a.bin"), b"a");
        let cfg = Config::from_toml_str(&format!(
            "[[dataset]]\nname = \"t\"\nroot = \"{}\"\n",
            d.path().display()
        ))
        .unwrap();
        let c = crate::source::open_catalog(&cfg.datasets[0]).unwrap();
        assert_eq!(c.len(), 1);
    }
}
