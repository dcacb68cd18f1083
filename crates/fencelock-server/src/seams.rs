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
use std::path::Path;
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

/// The seams of a node; the default plugs nothing.
#[derive(Debug, Clone, Default)]
pub struct Seams {
    /// How the data dir's database is opened; `None`: redb's file backend.
    pub storage: Option<Arc<dyn StorageBackends>>,
    /// Hooks at crash points and before each apply; `None`: no hooks.
    pub hooks: Option<Arc<dyn Hooks>>,
    /// The file IO of the segment log (`log = "segment"`, see
    /// [`crate::raft::wal::files`]); `None`: real files.
    pub log_files: Option<Arc<dyn crate::raft::wal::LogFiles>>,
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
