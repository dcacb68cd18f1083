//! Where a snapshot's data lives: one file in the data dir's `snap/`, named
//! by the database, so that taking a snapshot streams the engine to disk and
//! holds no copy of its bytes in memory (issue 19 §4).
//!
//! Where it sits: under [`super::state_machine`], which builds, installs,
//! reads and seeds snapshots through [`Files`]. The `raft_snapshot` table of
//! the database keeps openraft's meta under `"meta"` and, under `"file"`, a
//! [`FileRef`] (the file's name and length); the file is the snapshot's
//! payload in a [`record`] V1 frame (its checksum first).
//!
//! A new snapshot is written to `<name>.tmp`, synced, renamed into place and
//! the directory synced before the database names it (one durable
//! transaction, which also drops the `"data"` key of the layout before it);
//! the file it replaces is removed after. A crash between leaves a file the
//! database does not name, which the next start removes ([`Files::tidy`]).
//! A missing or changed file the database names is a storage error: the node
//! fails closed rather than start from another state.
//!
//! Data dirs written before this layout keep the payload in the table under
//! `"data"`; it is read from there until the next snapshot is written.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use super::db_error::DbError;
use super::record::{self, FRAME_V1};

/// The directory of snapshot files, in the data dir.
pub(crate) const SNAP_DIR: &str = "snap";
const SUFFIX: &str = ".snap";
const TMP_SUFFIX: &str = ".snap.tmp";

/// What the database records of a snapshot file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileRef {
    /// Its name in `snap/` (written by this node, never taken from a peer).
    pub name: String,
    /// Its length, frame included.
    pub bytes: u64,
}

/// The snapshot files of one data dir. Writing a file, naming it in the
/// database and removing the one it replaces happen under one lock
/// ([`Files::lock`]), so that a snapshot built while another is installed
/// never has its file removed under it.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    dir: PathBuf,
    lock: Arc<Mutex<()>>,
}

/// CRC-32 of what passes through, on its way to `inner`.
struct Checksummed<W> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Files {
    /// The snapshot files of the data dir `data_dir`.
    pub fn new(data_dir: &Path) -> Self {
        Self { dir: data_dir.join(SNAP_DIR), lock: Arc::new(Mutex::new(())) }
    }

    /// Held while a snapshot is written, named and its predecessor removed.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        // The lock guards no data: a panic while it was held left nothing half-done.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn io(&self, what: &str, path: &Path) -> impl Fn(io::Error) -> DbError + '_ {
        let what = format!("cannot {what} snapshot file {}", path.display());
        move |e| DbError::Other(format!("{what}: {e}"))
    }

    /// Writes a new snapshot file whose payload `write` produces, durably;
    /// what the database should record of it. `index` (the snapshot's last
    /// log index) goes into the name, for operators. Call with the lock held.
    pub fn write(
        &self,
        index: Option<u64>,
        write: impl FnOnce(&mut dyn Write) -> Result<(), DbError>,
    ) -> Result<FileRef, DbError> {
        fs::create_dir_all(&self.dir).map_err(self.io("create the directory of", &self.dir))?;
        let (name, tmp, file) = self.create(index)?;
        let written = self.fill(&tmp, file, write);
        let bytes = match written {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let path = self.path(&name);
        let placed = fs::rename(&tmp, &path).map_err(self.io("rename", &tmp));
        if let Err(e) = placed.and_then(|()| self.sync_dir()) {
            let _ = fs::remove_file(&tmp);
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(FileRef { name, bytes })
    }

    /// A new temporary file, and the name it will have.
    fn create(&self, index: Option<u64>) -> Result<(String, PathBuf, File), DbError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        loop {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let stem = format!("{:020}-{}-{seq}", index.unwrap_or(0), std::process::id());
            let (name, tmp) = (format!("{stem}{SUFFIX}"), self.path(&format!("{stem}{TMP_SUFFIX}")));
            if self.path(&name).exists() {
                continue;
            }
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => return Ok((name, tmp, file)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(self.io("create", &tmp)(e)),
            }
        }
    }

    /// Streams the frame into `file`: a header to fill in, the payload, then
    /// the header with its checksum; synced. Its length.
    fn fill(
        &self,
        tmp: &Path,
        file: File,
        write: impl FnOnce(&mut dyn Write) -> Result<(), DbError>,
    ) -> Result<u64, DbError> {
        let err = self.io("write", tmp);
        let mut out = Checksummed { inner: BufWriter::with_capacity(1 << 20, file), crc: Default::default(), bytes: 0 };
        out.inner.write_all(&[0; record::HEADER]).map_err(&err)?;
        write(&mut out)?;
        let Checksummed { inner, crc, bytes } = out;
        let mut file = inner.into_inner().map_err(|e| err(e.into_error()))?;
        let mut header = [FRAME_V1; record::HEADER];
        header[1..].copy_from_slice(&crc.finalize().to_le_bytes());
        file.seek(SeekFrom::Start(0)).and_then(|_| file.write_all(&header)).map_err(&err)?;
        file.sync_all().map_err(&err)?;
        Ok(bytes + record::HEADER as u64)
    }

    fn sync_dir(&self) -> Result<(), DbError> {
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(self.io("sync the directory of", &self.dir))
    }

    /// The payload of the file `file` names, checked against its length and
    /// its checksum.
    pub fn read(&self, file: &FileRef) -> Result<Vec<u8>, DbError> {
        let path = self.path(&file.name);
        let corrupt = |why: String| DbError::Corrupt { record: path.display().to_string(), why };
        if file.name.contains('/') || !file.name.ends_with(SUFFIX) {
            return Err(corrupt("the database names a file outside the snapshot directory".into()));
        }
        // The length first: a file grown to any size is refused unread.
        let len = match fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(corrupt("the database names this snapshot file, which is missing".into()))
            }
            Err(e) => return Err(self.io("read", &path)(e)),
        };
        if len != file.bytes {
            return Err(corrupt(format!("{len} bytes, where the database recorded {}", file.bytes)));
        }
        let bytes = fs::read(&path).map_err(self.io("read", &path))?;
        if bytes.len() as u64 != file.bytes {
            return Err(corrupt(format!("{} bytes, where the database recorded {}", bytes.len(), file.bytes)));
        }
        if bytes.first() != Some(&FRAME_V1) {
            return Err(corrupt("not a snapshot frame".into()));
        }
        record::open(&|| path.display().to_string(), &bytes)?;
        Ok(record::unseal_own(bytes))
    }

    /// Removes every snapshot file but `keep` (files a crash left before the
    /// database named them, or after it named their successor). Call with the
    /// lock held, or before the node serves.
    pub fn tidy(&self, keep: Option<&str>) -> Result<(), DbError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.io("list", &self.dir)(e)),
        };
        for entry in entries {
            let path = entry.map_err(self.io("list", &self.dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let ours = name.ends_with(SUFFIX) || name.ends_with(TMP_SUFFIX);
            if ours && Some(name) != keep {
                fs::remove_file(&path).map_err(self.io("remove", &path))?;
            }
        }
        Ok(())
    }

    /// Removes the file `file` names (a write the database then refused).
    pub fn remove(&self, file: &FileRef) {
        let _ = fs::remove_file(self.path(&file.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(out: &mut dyn Write) -> Result<(), DbError> {
        out.write_all(br#"{"a":1}"#).map_err(|e| DbError::Other(e.to_string()))
    }

    #[test]
    fn a_written_file_reads_back_its_payload() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let file = files.write(Some(7), payload).unwrap();
        assert!(file.name.starts_with("00000000000000000007-"), "{}", file.name);
        assert_eq!(file.bytes, 7 + record::HEADER as u64);
        assert_eq!(files.read(&file).unwrap(), br#"{"a":1}"#);
    }

    /// Every byte of the file is covered: a flip anywhere is refused.
    #[test]
    fn a_changed_byte_a_missing_file_or_a_wrong_length_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let file = files.write(None, payload).unwrap();
        let path = dir.path().join(SNAP_DIR).join(&file.name);
        let good = fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            fs::write(&path, &bad).unwrap();
            assert!(matches!(files.read(&file), Err(DbError::Corrupt { .. })), "byte {i}");
        }
        fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(matches!(files.read(&file), Err(DbError::Corrupt { .. })));
        // Grown (sparse) to 64 GiB: refused by its length, never read whole.
        fs::write(&path, &good).unwrap();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(64 << 30).unwrap();
        let err = files.read(&file).unwrap_err().to_string();
        assert!(err.contains("68719476736 bytes, where the database recorded"), "{err}");
        fs::remove_file(&path).unwrap();
        let err = files.read(&file).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        let outside = FileRef { name: "../fencelock.redb".into(), bytes: 0 };
        assert!(matches!(files.read(&outside), Err(DbError::Corrupt { .. })));
    }

    #[test]
    fn tidy_keeps_only_the_named_file_and_what_is_not_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let (old, kept) = (files.write(Some(1), payload).unwrap(), files.write(Some(2), payload).unwrap());
        let snap = dir.path().join(SNAP_DIR);
        fs::write(snap.join("00000000000000000003-1-1.snap.tmp"), b"torn").unwrap();
        fs::write(snap.join("notes.txt"), b"an operator's").unwrap();
        files.tidy(Some(&kept.name)).unwrap();
        let mut left: Vec<String> =
            fs::read_dir(&snap).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, [kept.name.clone(), "notes.txt".into()]);
        assert!(files.read(&old).is_err());
    }

    /// A failed write leaves no file behind.
    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let failed = files.write(Some(1), |out| {
            out.write_all(b"{").map_err(|e| DbError::Other(e.to_string()))?;
            Err(DbError::Other("the engine would not serialize".into()))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read_dir(dir.path().join(SNAP_DIR)).unwrap().count(), 0);
    }
}
