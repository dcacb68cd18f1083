//! Where a snapshot's data lives: one file in the data dir's `snap/`, named
//! by the database, so that taking, sending, receiving and installing a
//! snapshot stream it to and from disk and hold no copy of its bytes in
//! memory (issue 19 §4, issue 38 §3).
//!
//! Where it sits: under [`super::state_machine`], which builds, installs,
//! reads and seeds snapshots through [`Files`], and under
//! [`super::snapshot_data`], openraft's handle on one of these files. The
//! `raft_snapshot` table of the database keeps openraft's meta under
//! `"meta"` and, under `"file"`, a [`FileRef`] (the file's name and length);
//! the file is the snapshot's payload in a [`record`] V1 frame (its checksum
//! first).
//!
//! A new snapshot is written to `<name>.tmp`, synced, renamed into place and
//! the directory synced before the database names it (one durable
//! transaction, which also drops the `"data"` key of the layout before it);
//! the file it replaces is removed after. A snapshot received from the
//! leader is written chunk by chunk into an `incoming-….snap.incoming` file
//! whose header is left blank ([`Files::begin_incoming`]); once it is
//! checked, its header is written and it is adopted the same way
//! ([`Files::adopt`]): renamed, never copied. A crash between leaves a file
//! the database does not name, which the next start removes
//! ([`Files::tidy`]). A missing or changed file the database names is a
//! storage error: the node fails closed rather than start from another
//! state.
//!
//! Data dirs written before this layout keep the payload in the table under
//! `"data"`; a start moves it into a file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
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
/// A snapshot being received from the leader (see [`Files::begin_incoming`]).
const INCOMING_SUFFIX: &str = ".snap.incoming";

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

/// The checksum (CRC-32, as the frame's) and length of a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sum {
    pub crc: u32,
    pub bytes: u64,
}

/// A reader that sums what passes through it, on its way from `inner`.
pub(crate) struct Summing<R> {
    inner: R,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<R> Summing<R> {
    pub fn new(inner: R) -> Self {
        Self { inner, crc: Default::default(), bytes: 0 }
    }

    /// The sum of what was read so far.
    pub fn sum(&self) -> Sum {
        Sum { crc: self.crc.clone().finalize(), bytes: self.bytes }
    }
}

impl<R: Read> Read for Summing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// A snapshot file opened for reading: its name and length checked, its
/// frame's header read; positioned at its payload.
#[derive(Debug)]
pub(crate) struct Opened {
    pub path: PathBuf,
    pub file: File,
    /// What the header and the length say the payload is.
    pub expected: Sum,
}

impl Opened {
    /// Whether the payload read, `read`, is the one the frame recorded.
    pub fn check(&self, read: Sum) -> Result<(), DbError> {
        if read == self.expected {
            return Ok(());
        }
        let (stored, computed) = (self.expected.crc, read.crc);
        let why = match read.bytes == self.expected.bytes {
            true => format!("checksum mismatch (stored {stored:08x}, computed {computed:08x})"),
            false => format!("{} payload bytes read, where the frame holds {}", read.bytes, self.expected.bytes),
        };
        Err(DbError::Corrupt { record: self.path.display().to_string(), why })
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

    /// Opens the file `file` names, checked against its name, its length and
    /// its frame's tag; its payload is checked against the frame's checksum
    /// as it is read ([`Opened::check`]).
    pub fn open(&self, file: &FileRef) -> Result<Opened, DbError> {
        let path = self.path(&file.name);
        let corrupt = |why: String| DbError::Corrupt { record: path.display().to_string(), why };
        if file.name.contains('/') || !file.name.ends_with(SUFFIX) {
            return Err(corrupt("the database names a file outside the snapshot directory".into()));
        }
        let mut opened = match File::open(&path) {
            Ok(opened) => opened,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(corrupt("the database names this snapshot file, which is missing".into()))
            }
            Err(e) => return Err(self.io("open", &path)(e)),
        };
        // The length first: a file grown to any size is refused unread.
        let len = opened.metadata().map_err(self.io("read", &path))?.len();
        if len != file.bytes || len < record::HEADER as u64 {
            return Err(corrupt(format!("{len} bytes, where the database recorded {}", file.bytes)));
        }
        let mut header = [0; record::HEADER];
        opened.read_exact(&mut header).map_err(self.io("read", &path))?;
        if header[0] != FRAME_V1 {
            return Err(corrupt("not a snapshot frame".into()));
        }
        let crc = u32::from_le_bytes([header[1], header[2], header[3], header[4]]);
        let expected = Sum { crc, bytes: len - record::HEADER as u64 };
        Ok(Opened { path, file: opened, expected })
    }

    /// A new file to receive a snapshot into: its header blank (filled in
    /// by [`Files::adopt`]), positioned after it.
    pub fn begin_incoming(&self) -> Result<(PathBuf, File), DbError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(&self.dir).map_err(self.io("create the directory of", &self.dir))?;
        loop {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let path = self.path(&format!("incoming-{}-{seq}{INCOMING_SUFFIX}", std::process::id()));
            let mut file = match OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(self.io("create", &path)(e)),
            };
            if let Err(e) = file.write_all(&[0; record::HEADER]) {
                let _ = fs::remove_file(&path);
                return Err(self.io("write", &path)(e));
            }
            return Ok((path, file));
        }
    }

    /// Whether `path` is a file of [`Files::begin_incoming`] of this
    /// directory.
    pub fn is_incoming(&self, path: &Path) -> bool {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        path.parent() == Some(self.dir.as_path()) && name.ends_with(INCOMING_SUFFIX)
    }

    /// Makes the received file `incoming` (open as `file`), whose payload
    /// is `sum`, a snapshot file, durably: its header written, synced,
    /// renamed into place and the directory synced. What the database
    /// should record of it; on an error `incoming` is removed. Call with the
    /// lock held.
    pub fn adopt(&self, incoming: &Path, file: File, index: Option<u64>, sum: Sum) -> Result<FileRef, DbError> {
        let adopted = self.seal(incoming, &file, sum).and_then(|()| self.place(incoming, index));
        if adopted.is_err() {
            let _ = fs::remove_file(incoming);
        }
        adopted.map(|name| FileRef { name, bytes: sum.bytes + record::HEADER as u64 })
    }

    /// Writes the header of the payload `sum` into `file` and syncs it.
    fn seal(&self, path: &Path, file: &File, sum: Sum) -> Result<(), DbError> {
        let err = self.io("write", path);
        let len = file.metadata().map_err(&err)?.len();
        if len != sum.bytes + record::HEADER as u64 {
            return Err(DbError::Other(format!(
                "received snapshot file {} has {len} bytes, where its payload was {} read",
                path.display(),
                sum.bytes
            )));
        }
        let mut header = [FRAME_V1; record::HEADER];
        header[1..].copy_from_slice(&sum.crc.to_le_bytes());
        file.write_all_at(&header, 0).map_err(&err)?;
        file.sync_all().map_err(&err)
    }

    /// Renames `from` to a new name of a snapshot at `index`, durably; the name.
    fn place(&self, from: &Path, index: Option<u64>) -> Result<String, DbError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = loop {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let name = format!("{:020}-{}-r{seq}{SUFFIX}", index.unwrap_or(0), std::process::id());
            if !self.path(&name).exists() {
                break name;
            }
        };
        let path = self.path(&name);
        fs::rename(from, &path).map_err(self.io("rename", from))?;
        if let Err(e) = self.sync_dir() {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(name)
    }

    /// Removes every snapshot file but `keep` (files a crash left before the
    /// database named them, or after it named their successor, and snapshots
    /// a crash cut while they were received). Call before the node serves.
    pub fn tidy(&self, keep: Option<&str>) -> Result<(), DbError> {
        self.remove_but(keep, &[SUFFIX, TMP_SUFFIX, INCOMING_SUFFIX])
    }

    /// Removes the snapshot files `keep` replaced, and what a crash left of
    /// snapshots written here, but not the snapshot being received (it is
    /// written without the lock). Call with the lock held.
    pub fn remove_replaced(&self, keep: &str) -> Result<(), DbError> {
        self.remove_but(Some(keep), &[SUFFIX, TMP_SUFFIX])
    }

    /// Removes the files of `dir` whose names end in one of `suffixes`, but `keep`.
    fn remove_but(&self, keep: Option<&str>, suffixes: &[&str]) -> Result<(), DbError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.io("list", &self.dir)(e)),
        };
        for entry in entries {
            let path = entry.map_err(self.io("list", &self.dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let ours = suffixes.iter().any(|s| name.ends_with(s));
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

    /// The payload of the file `file` names, read as a start reads it: opened,
    /// then checked against its frame as it is read.
    fn read(files: &Files, file: &FileRef) -> Result<Vec<u8>, DbError> {
        let opened = files.open(file)?;
        let mut reader = Summing::new(&opened.file);
        let mut payload = Vec::new();
        reader.read_to_end(&mut payload).map_err(|e| DbError::Other(e.to_string()))?;
        opened.check(reader.sum())?;
        Ok(payload)
    }

    #[test]
    fn a_written_file_reads_back_its_payload() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let file = files.write(Some(7), payload).unwrap();
        assert!(file.name.starts_with("00000000000000000007-"), "{}", file.name);
        assert_eq!(file.bytes, 7 + record::HEADER as u64);
        assert_eq!(read(&files, &file).unwrap(), br#"{"a":1}"#);
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
            assert!(matches!(read(&files, &file), Err(DbError::Corrupt { .. })), "byte {i}");
        }
        fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(matches!(read(&files, &file), Err(DbError::Corrupt { .. })));
        // Grown (sparse) to 64 GiB: refused by its length, never read whole.
        fs::write(&path, &good).unwrap();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(64 << 30).unwrap();
        let err = read(&files, &file).unwrap_err().to_string();
        assert!(err.contains("68719476736 bytes, where the database recorded"), "{err}");
        fs::remove_file(&path).unwrap();
        let err = read(&files, &file).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        let outside = FileRef { name: "../fencelock.redb".into(), bytes: 0 };
        assert!(matches!(read(&files, &outside), Err(DbError::Corrupt { .. })));
    }

    #[test]
    fn tidy_keeps_only_the_named_file_and_what_is_not_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let (old, kept) = (files.write(Some(1), payload).unwrap(), files.write(Some(2), payload).unwrap());
        let snap = dir.path().join(SNAP_DIR);
        fs::write(snap.join("00000000000000000003-1-1.snap.tmp"), b"torn").unwrap();
        fs::write(snap.join("incoming-1-1.snap.incoming"), b"cut while received").unwrap();
        fs::write(snap.join("notes.txt"), b"an operator's").unwrap();
        files.tidy(Some(&kept.name)).unwrap();
        let mut left: Vec<String> =
            fs::read_dir(&snap).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, [kept.name.clone(), "notes.txt".into()]);
        assert!(read(&files, &old).is_err());
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

    /// A received file is adopted by rename: the file the database will name
    /// is the one written, its header filled in, and it reads back as its
    /// payload; no incoming file is left.
    #[test]
    fn a_received_file_is_adopted_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let (path, mut file) = files.begin_incoming().unwrap();
        assert!(files.is_incoming(&path));
        file.write_all(br#"{"a":1}"#).unwrap();
        let sum = {
            let mut r = Summing::new(&br#"{"a":1}"#[..]);
            io::copy(&mut r, &mut io::sink()).unwrap();
            r.sum()
        };
        let inode = std::os::unix::fs::MetadataExt::ino(&file.metadata().unwrap());
        let adopted = files.adopt(&path, file, Some(9), sum).unwrap();
        assert!(adopted.name.starts_with("00000000000000000009-"), "{}", adopted.name);
        let placed = dir.path().join(SNAP_DIR).join(&adopted.name);
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&fs::metadata(&placed).unwrap()), inode, "renamed, not copied");
        assert_eq!(read(&files, &adopted).unwrap(), br#"{"a":1}"#);
        assert!(!path.exists());
    }

    /// A received file whose length is not its payload's is not adopted,
    /// and is removed.
    #[test]
    fn a_received_file_of_another_length_is_not_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let (path, mut file) = files.begin_incoming().unwrap();
        file.write_all(b"{}").unwrap();
        assert!(files.adopt(&path, file, Some(1), Sum { crc: 0, bytes: 3 }).is_err());
        assert_eq!(fs::read_dir(dir.path().join(SNAP_DIR)).unwrap().count(), 0);
    }

    /// Removing what a snapshot replaced leaves the snapshot being received.
    #[test]
    fn removing_the_replaced_files_keeps_the_one_being_received() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let (old, kept) = (files.write(Some(1), payload).unwrap(), files.write(Some(2), payload).unwrap());
        let (incoming, _file) = files.begin_incoming().unwrap();
        files.remove_replaced(&kept.name).unwrap();
        assert!(read(&files, &old).is_err());
        assert!(read(&files, &kept).is_ok());
        assert!(incoming.exists());
    }
}
