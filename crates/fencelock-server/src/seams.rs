//! What a caller can plug into a node besides its settings: the storage backend
//! of the data dir's database, the file IO of the segment log, and hooks at the points where a crash (or a known
//! bug) is worth testing. The time source is the third seam ([`crate::clock`]),
//! passed to [`crate::serve`].
//!
//! Where it sits: [`Seams`] is a field of [`crate::Config`]; its default plugs
//! nothing, and a node then runs on redb's own file backend with no hooks. The
//! server never fills it from the environment: `fencelock serve` leaves it
//! empty, and only the fault-injection harness (`fencelock-chaos serve`, whose
//! `faults` module documents every fault) plugs its faults in here.

use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencelock_core::Engine;

/// A point in the server where a crash is worth testing. [`Hooks::crash_point`]
/// is called there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrashPoint {
    /// The entries of a log append are in the redb transaction, before its
    /// commit (fsync), or written to the segment log, before its `fdatasync`:
    /// entries never durable, none acknowledged.
    LogBeforeFsync,
    /// The append's commit (or `fdatasync`) returned, before openraft is told:
    /// durable but not acknowledged, outcome unknown.
    LogAfterFsync,
    /// A written batch's output is applied (commands, ticks and `LeaderStart`
    /// alike), before its replies and wake-ups go out: nobody was told.
    ReplyBeforeSend,
    /// Before the state machine applies an entry (the replay at start-up
    /// included): committed but not applied, replayed at restart.
    SmBeforeApply,
}

impl CrashPoint {
    /// Every crash point.
    pub const ALL: [CrashPoint; 4] =
        [CrashPoint::LogBeforeFsync, CrashPoint::LogAfterFsync, CrashPoint::ReplyBeforeSend, CrashPoint::SmBeforeApply];

    /// Its name: `log-before-fsync`, `log-after-fsync`, `reply-before-send`,
    /// `sm-before-apply`.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::LogBeforeFsync => "log-before-fsync",
            CrashPoint::LogAfterFsync => "log-after-fsync",
            CrashPoint::ReplyBeforeSend => "reply-before-send",
            CrashPoint::SmBeforeApply => "sm-before-apply",
        }
    }
}

/// The entry the state machine is about to apply (see [`Hooks::before_apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applying {
    /// Its log index.
    pub index: u64,
    /// The index of the first entry that was not in the log when the storage
    /// was opened (entries before it are a replay).
    pub first_new: u64,
}

/// Calls from inside the server, for a fault-injection harness. Every method
/// does nothing by default. Called synchronously on the path they name (a
/// storage thread, the driver task): they must not block for long.
pub trait Hooks: Send + Sync + Debug {
    /// The server reached `point` (see [`CrashPoint`]).
    fn crash_point(&self, point: CrashPoint) {
        let _ = point;
    }

    /// The state machine is about to apply an entry to `engine`.
    fn before_apply(&self, entry: Applying, engine: &mut Engine) {
        let _ = (entry, engine);
    }
}

/// Opens the data dir's redb database on a storage backend of the caller's
/// choice (`builder.create_with_backend(…)`), e.g. one that can lose what was
/// not fsynced. Contract: it opens (creating if needed, never truncating) the
/// database at `file`, as `builder.create(file)` does.
pub trait StorageBackends: Send + Sync + Debug {
    fn create(&self, builder: &redb::Builder, file: &Path) -> Result<redb::Database, redb::DatabaseError>;
}

// The segment log's files: every read, write, sync, resize and
// preallocation of a segment, and every create, delete and directory sync.
// The default is `raft::wal::RealFiles`; a fault-injection harness plugs one
// that records what was written since the last `sync_data` and drops it at a
// simulated power loss. Defined here, not in the log, so that the seams
// name nothing of the log that uses them.
/// One open segment file.
pub trait LogFile: Send + Debug {
    /// Reads into `buf` from `offset`; how many bytes were read (0 at the end).
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset` (not durable before [`LogFile::sync_data`]).
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes the data written so far (and the file's size) durable: `fdatasync`.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts (or extends with zeros) the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Makes sure bytes `0..len` are allocated; never shrinks the file. Bytes
    /// past the old end read as zeros.
    fn allocate(&mut self, len: u64) -> io::Result<()>;
    /// The file's size in bytes.
    fn size(&mut self) -> io::Result<u64>;
}

/// Opens, lists and removes segment files, and syncs their directory. Only
/// `open` must be given: the others default to the real file system, so a
/// seam overrides just what it changes.
pub trait LogFiles: Send + Sync + Debug {
    /// Opens `path` for reading and writing, creating it (empty) if `create`.
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn LogFile>>;
    /// The files in `dir` (not recursive), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        std::fs::read_dir(dir)?.map(|e| e.map(|e| e.path())).collect()
    }
    /// Removes the file `path`.
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    /// Makes the directory's entries (files created or removed) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// The seams of a node; the default plugs nothing.
#[derive(Debug, Clone, Default)]
pub struct Seams {
    /// How the data dir's database is opened; `None`: redb's file backend.
    pub storage: Option<Arc<dyn StorageBackends>>,
    /// Hooks at crash points and before each apply; `None`: no hooks.
    pub hooks: Option<Arc<dyn Hooks>>,
    /// The file IO of the segment log (`log = "segment"`, see
    /// [`LogFiles`]); `None`: real files.
    pub log_files: Option<Arc<dyn LogFiles>>,
}

impl Seams {
    /// Calls [`Hooks::crash_point`], if there are hooks.
    pub(crate) fn crash_point(&self, point: CrashPoint) {
        if let Some(h) = &self.hooks {
            h.crash_point(point);
        }
    }

    /// Opens the database at `file`: through [`Seams::storage`], else redb's
    /// file backend.
    pub(crate) fn create_db(
        &self,
        builder: &redb::Builder,
        file: &Path,
    ) -> Result<redb::Database, redb::DatabaseError> {
        match &self.storage {
            Some(s) => s.create(builder, file),
            None => builder.create(file),
        }
    }
}
