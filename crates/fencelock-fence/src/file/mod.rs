//! [`FileFence`]: a durable fence for many keys in one directory.
//!
//! The marks live in memory and in an append-only log (`fence.log`, format in
//! [`log`]); a raise is appended and `fdatasync`ed before an admit answers
//! [`Fenced::Admitted`], so an admitted mark survives SIGKILL and power loss.
//! Opening replays the log (dropping a torn last record) and compacts it to
//! one record per key when it has grown to many more records than keys.
//!
//! Admits on one key are serialized by a per-key lock; admits on different
//! keys proceed in parallel, and their appends share `fdatasync` calls (group
//! commit). An admit that leaves the marks as they were (an equal write, a
//! read between the two marks) writes nothing.
//!
//! One process at a time: the directory is locked with `flock` (`LOCK`), and a
//! second [`FileFence::open`] of it fails until the first is dropped.

mod log;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use nix::fcntl::{Flock, FlockArg};

use crate::fence::{check_input, check_key, check_token, judge, Access, Fence, FenceError, Fenced, Marks};
use crate::keylocks::KeyLocks;
use log::{Appender, Replay};

const LOG_FILE: &str = "fence.log";
const LOCK_FILE: &str = "LOCK";

/// A durable, file-backed [`Fence`]. Cheap to clone (shared state).
#[derive(Clone)]
pub struct FileFence {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Serializes admits per key, so check-then-append is atomic per key.
    keys: KeyLocks,
    /// The durable marks; a mark is raised here only after its record is
    /// synced.
    marks: Mutex<HashMap<String, Marks>>,
    log: Appender,
    /// Held for the life of the fence: one process per directory.
    _lock: Flock<File>,
}

impl FileFence {
    /// Open (creating if needed) the fence stored in `dir`.
    ///
    /// Fails with [`FenceError::Corrupt`] if the log is damaged anywhere but
    /// in its last record, and with [`FenceError::Storage`] if another
    /// process (or another `FileFence` in this one) has it open.
    pub async fn open(dir: impl AsRef<Path>) -> Result<Self, FenceError> {
        let dir = dir.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(dir)).await.map_err(FenceError::storage)?
    }

    /// [`FileFence::open`] for synchronous callers.
    pub fn open_blocking(dir: PathBuf) -> Result<Self, FenceError> {
        fs::create_dir_all(&dir)?;
        let lock = lock_dir(&dir)?;
        let path = dir.join(LOG_FILE);
        let replay = read_or_create(&dir, &path)?;
        if needs_compaction(&replay) {
            compact(&dir, &replay.marks)?;
        }
        let file = OpenOptions::new().append(true).open(&path)?;
        let inner = Inner {
            dir,
            keys: KeyLocks::default(),
            marks: Mutex::new(replay.marks),
            log: Appender::new(file)?,
            _lock: lock,
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The directory this fence lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// [`Fence::highest`] for synchronous callers.
    pub fn highest_blocking(&self, key: &str) -> Result<Option<u64>, FenceError> {
        Ok(self.marks_blocking(key)?.map(|m| m.seen))
    }

    /// [`Fence::marks`] for synchronous callers.
    pub fn marks_blocking(&self, key: &str) -> Result<Option<Marks>, FenceError> {
        check_key(key)?;
        if self.inner.log.is_poisoned() {
            return Err(FenceError::Poisoned);
        }
        Ok(self.inner.mark(key))
    }

    /// Set `key`'s marks to `to` (both: [`Marks::single`]), or remove them
    /// (`None`), and return the highest token it had admitted. The log is rewritten durably (one record per key). This is an
    /// operator's deliberate repair (`fencelock storage reset-mark`), the one
    /// way a mark goes down: it consumes the handle and fails if clones of it
    /// are alive, so nothing admits through it meanwhile; open the fence
    /// again to use it.
    pub fn reset_mark(self, key: &str, to: Option<u64>) -> Result<Option<u64>, FenceError> {
        check_key(key)?;
        if let Some(token) = to {
            check_token(token)?;
        }
        let inner = Arc::try_unwrap(self.inner)
            .map_err(|_| FenceError::storage(io::Error::other("the fence has other open handles")))?;
        if inner.log.is_poisoned() {
            return Err(FenceError::Poisoned);
        }
        let mut marks = inner.marks.into_inner().unwrap_or_else(|p| p.into_inner());
        let before = match to {
            Some(token) => marks.insert(key.to_owned(), Marks::single(token)),
            None => marks.remove(key),
        };
        let before = before.map(|m| m.seen);
        compact(&inner.dir, &marks)?;
        Ok(before)
    }
}

#[async_trait]
impl Fence for FileFence {
    async fn admit_as(&self, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError> {
        check_input(key, token)?;
        // Run in its own task: if the caller drops this future midway, the
        // admit still finishes (or fails) as one step under the key's lock.
        let inner = self.inner.clone();
        let key = key.to_owned();
        tokio::spawn(async move { inner.admit(&key, token, access).await }).await.map_err(FenceError::storage)?
    }

    async fn marks(&self, key: &str) -> Result<Option<Marks>, FenceError> {
        self.marks_blocking(key)
    }
}

impl Inner {
    fn mark(&self, key: &str) -> Option<Marks> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied()
    }

    async fn admit(self: &Arc<Self>, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError> {
        if self.log.is_poisoned() {
            return Err(FenceError::Poisoned);
        }
        let _guard = self.keys.lock(key).await;
        let (outcome, raised) = judge(self.mark(key), access, token);
        let Some(raised) = raised else {
            return Ok(outcome); // stale, or the marks are already durable as they are
        };
        let record = log::encode(key, token, access);
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.log.append_durable(&record)).await.map_err(FenceError::storage)??;
        self.marks.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned(), raised);
        Ok(outcome)
    }
}

fn lock_dir(dir: &Path) -> Result<Flock<File>, FenceError> {
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(LOCK_FILE))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        let msg = format!("fence directory {} is in use by another FileFence ({errno})", dir.display());
        FenceError::storage(io::Error::new(io::ErrorKind::WouldBlock, msg))
    })
}

/// Replay the log, truncating a torn tail; create an empty log if none.
fn read_or_create(dir: &Path, path: &Path) -> Result<Replay, FenceError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            write_durably(dir, path, log::MAGIC)?;
            log::MAGIC.to_vec()
        }
        Err(e) => return Err(e.into()),
    };
    let replay = log::replay(&bytes)?;
    if replay.good_len < bytes.len() {
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(replay.good_len as u64)?;
        file.sync_all()?;
    }
    Ok(replay)
}

fn needs_compaction(replay: &Replay) -> bool {
    replay.records > 2 * replay.marks.len() + 1024
}

/// Rewrite the log with one write record per key (if it had a write) and
/// one read record (if a read raised `seen` above it).
fn compact(dir: &Path, marks: &HashMap<String, Marks>) -> Result<(), FenceError> {
    let mut keys: Vec<_> = marks.iter().collect();
    keys.sort_by_key(|(key, _)| *key);
    let mut bytes = log::MAGIC.to_vec();
    for (key, m) in keys {
        if m.write > 0 {
            bytes.extend(log::encode(key, m.write, Access::Write));
        }
        if m.seen > m.write {
            bytes.extend(log::encode(key, m.seen, Access::Read));
        }
    }
    write_durably(dir, &dir.join(LOG_FILE), &bytes)?;
    tracing::info!(keys = marks.len(), "fence log compacted");
    Ok(())
}

/// Write `bytes` to `path` atomically and durably: a temporary file, fsync,
/// rename over `path`, fsync the directory.
pub(crate) fn write_durably(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn compaction_keeps_both_marks_of_every_key() {
        let dir = tempfile::tempdir().unwrap();
        {
            let fence = FileFence::open(dir.path()).await.unwrap();
            for token in 1..=1100 {
                assert!(fence.admit("hot", token).await.unwrap().is_admitted());
            }
            assert!(fence.admit("cold", 42).await.unwrap().is_admitted());
            assert!(fence.admit_read("hot", 1200).await.unwrap().is_admitted());
        }
        let before = fs::metadata(dir.path().join(LOG_FILE)).unwrap().len();
        let fence = FileFence::open(dir.path()).await.unwrap();
        let after = fs::metadata(dir.path().join(LOG_FILE)).unwrap().len();
        assert!(after < before, "log not compacted: {before} -> {after}");
        assert_eq!(fence.marks("hot").await.unwrap(), Some(Marks { write: 1100, seen: 1200 }));
        assert_eq!(fence.marks("cold").await.unwrap(), Some(Marks::single(42)));
        let record = |key, access| log::encode(key, 1, access).len();
        let expected = 8 + record("hot", Access::Write) + record("hot", Access::Read) + record("cold", Access::Write);
        assert_eq!(after as usize, expected);
    }

    /// Issue 14: an operator lowers or removes a poisoned mark; it stays so
    /// across a reopen, and other keys keep theirs.
    #[tokio::test]
    async fn reset_mark_lowers_or_removes_a_mark_durably() {
        let dir = tempfile::tempdir().unwrap();
        let fence = FileFence::open(dir.path()).await.unwrap();
        assert!(fence.admit("poisoned", crate::MAX_TOKEN).await.unwrap().is_admitted());
        assert!(fence.admit("other", 7).await.unwrap().is_admitted());
        assert_eq!(fence.reset_mark("poisoned", Some(5)).unwrap(), Some(crate::MAX_TOKEN));
        let fence = FileFence::open(dir.path()).await.unwrap();
        assert_eq!(fence.highest("poisoned").await.unwrap(), Some(5));
        assert_eq!(fence.highest("other").await.unwrap(), Some(7));
        assert!(fence.admit("poisoned", 6).await.unwrap().is_admitted());
        assert_eq!(fence.reset_mark("other", None).unwrap(), Some(7));
        let fence = FileFence::open(dir.path()).await.unwrap();
        assert_eq!(fence.highest("other").await.unwrap(), None);
        assert_eq!(fence.highest("poisoned").await.unwrap(), Some(6));
        let clone = fence.clone();
        assert!(matches!(fence.reset_mark("other", None), Err(FenceError::Storage(_))), "another handle is alive");
        drop(clone);
    }

    #[tokio::test]
    async fn a_second_open_of_one_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let first = FileFence::open(dir.path()).await.unwrap();
        assert!(matches!(FileFence::open(dir.path()).await, Err(FenceError::Storage(_))));
        drop(first);
        assert!(FileFence::open(dir.path()).await.is_ok());
    }
}
