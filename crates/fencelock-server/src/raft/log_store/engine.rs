//! Which engine keeps the log's entries ([`LogEngine`], a setting of the
//! node), and the one place that turns it into an [`EntryLog`]: refusing a
//! data dir whose log the engine cannot read, moving a redb log into
//! segments once ([`super::migrate`]).

use std::io;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase};

use super::meta::Meta;
use super::redb_log::RedbLog;
use super::segment_log::SegmentLog;
use super::{migrate, EntryLog};
use crate::raft::db::{decode, meta_name, write_meta_now, KEY_LOG_ENGINE, META};
use crate::raft::db_error::DbError;
use crate::raft::wal;
use crate::seams::Seams;

/// Where the Raft log's entries are kept. The vote, the committed and purged
/// log ids, the snapshot and the state machine are in redb either way. The
/// default is here alone (`#[default]`; [`crate::config::Config::new`] takes
/// it); `fencelock serve --help` and docs/guide/operating.md say it too, and a test of the
/// CLI checks they agree.
///
/// A data dir whose log is in redb (written with `Redb`, or by a build from
/// before the segment log) has it moved into segments on its first start with
/// `Segment`, the default, once and one way (see [`super::migrate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogEngine {
    /// In the redb database, one write transaction per append. A data dir
    /// whose log is in segments is refused by it.
    Redb,
    /// In an append-only segment log under `<data dir>/wal/`, one `fdatasync`
    /// per batch of appends (see [`crate::raft::wal`]); the default.
    #[default]
    Segment,
}

impl LogEngine {
    /// Its name in settings: `redb` or `segment`.
    pub fn name(self) -> &'static str {
        match self {
            LogEngine::Redb => "redb",
            LogEngine::Segment => "segment",
        }
    }

    /// The entries of the data dir `dir` (database `meta.db()`) kept by this
    /// engine, after [`check_engine`] let it through (or moved the log).
    pub(crate) fn open(self, meta: &Meta, dir: &Path, seams: &Seams) -> Result<Arc<dyn EntryLog>, DbError> {
        check_engine(meta.db(), dir, self, seams)?;
        Ok(match self {
            LogEngine::Redb => Arc::new(RedbLog::new(meta.clone(), seams.clone())),
            LogEngine::Segment => Arc::new(SegmentLog::open(meta.clone(), dir, seams)?),
        })
    }
}

impl std::str::FromStr for LogEngine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "redb" => Ok(LogEngine::Redb),
            "segment" => Ok(LogEngine::Segment),
            other => Err(format!("unknown log engine {other:?}: expected \"redb\" or \"segment\"")),
        }
    }
}

impl std::fmt::Display for LogEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Refuses to open `db` (of the data dir `dir`) with `engine` when its log is
/// kept by an engine it cannot be moved from; moves it when it can.
///
/// - `segment` on a database that records no engine (its log, if any, is in
///   `raft_log`: written with `redb`, by an older build, or new): the log is
///   moved into `wal/` and the segment engine recorded ([`migrate`]).
/// - `redb` on a data dir recorded as `segment` whose `wal/` holds segment
///   files: refused (redb's log is empty: serving it would restart the log,
///   and with it the tokens; there is no migration back). Without segment
///   files, the mark is removed.
pub(crate) fn check_engine(db: &Database, dir: &Path, engine: LogEngine, seams: &Seams) -> Result<(), DbError> {
    let recorded: Option<String> = {
        let txn = db.begin_read()?;
        let meta = txn.open_table(META)?;
        let value = meta.get(KEY_LOG_ENGINE)?;
        value.map(|v| decode(&meta_name(KEY_LOG_ENGINE), v.value())).transpose()?
    };
    let wal_dir = dir.join(wal::WAL_DIR);
    match (engine, recorded.as_deref()) {
        (LogEngine::Segment, Some("segment")) if !wal_dir.is_dir() => Err(DbError::Other(format!(
            "the data dir {} keeps its Raft log in {}, which is missing: the node cannot start without its log",
            dir.display(),
            wal_dir.display()
        ))),
        (LogEngine::Segment, Some("segment")) => Ok(()),
        (LogEngine::Segment, None) => migrate::migrate(db, dir, seams).map(drop),
        (LogEngine::Redb, None) => Ok(()),
        (LogEngine::Redb, Some("segment")) if has_segments(&wal_dir)? => Err(DbError::Other(format!(
            "the data dir {} keeps its Raft log in segments ({}; log = \"segment\"): start it with \
             --log-engine segment. A log moves from redb into segments, never back: for a data dir \
             whose log is in redb (--log-engine redb), back this group up (fencelock snapshot save) and \
             restore it into a new data dir (fencelock snapshot restore), which starts a new group of \
             one without its leases and locks",
            dir.display(),
            wal_dir.display()
        ))),
        (LogEngine::Redb, Some("segment")) => write_meta_now(db, KEY_LOG_ENGINE, None),
        (_, Some(other)) => {
            Err(DbError::Corrupt { record: meta_name(KEY_LOG_ENGINE)(), why: format!("unknown log engine {other:?}") })
        }
    }
}

/// Whether `wal_dir` holds any segment file.
fn has_segments(wal_dir: &Path) -> Result<bool, DbError> {
    match std::fs::read_dir(wal_dir) {
        Ok(dir) => Ok(dir.filter_map(Result::ok).any(|e| e.path().extension().is_some_and(|x| x == "seg"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(DbError::Other(format!("cannot list {}: {e}", wal_dir.display()))),
    }
}
