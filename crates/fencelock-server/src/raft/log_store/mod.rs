//! The Raft log store: openraft's [`RaftLogStorage`] over one `EntryLog`,
//! the engine that keeps the log's entries, chosen by [`LogEngine`] when the
//! store opens (`engine.rs`):
//!
//! - `segment` (the default): `segment_log.rs`, the append-only segment log
//!   of [`super::wal`] in `<data dir>/wal/`, whose thread does the IO with
//!   group commit;
//! - `redb`: `redb_log.rs`, redb's `raft_log` table, one durable transaction
//!   per write.
//!
//! Either way the vote, the committed and the last purged log ids are in
//! redb's meta table (`meta.rs`; the layout is in [`super::db`]). Appends,
//! truncations, purges and votes are durable before the call returns (an
//! append: before its callback). The committed log id is not written on its
//! own: [`LogStore::save_committed`] keeps it in memory, and the next durable
//! redb transaction writes the latest value with what it writes (see
//! `Committed` in `meta.rs`).
//!
//! Which engine holds a data dir's log is recorded (`log_engine`, absent for
//! redb): a redb data dir opened with the segment engine has its log moved into
//! segments, once ([`migrate`], crash-safe); a segment data dir opened with
//! redb is refused, never served as an empty log.
#![allow(clippy::result_large_err)] // openraft's error types are large by design

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, ErrorSubject, ErrorVerb, LogId, LogState, OptionalSend, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use redb::Database;

use super::db::{self, encode, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE};
use super::db_error::DbError;
use super::state_machine::StateMachine;
use super::wal::Done;
use super::{NodeId, TypeConfig};
use crate::seams::Seams;

mod engine;
mod meta;
pub mod migrate;
mod redb_log;
mod segment_log;

pub use engine::LogEngine;
use meta::{Committed, Meta};

/// The most stored bytes of log entries one AppendEntries carries to a
/// follower (and at least one entry). openraft gives each AppendEntries one
/// heartbeat interval (50 ms by default) and, when it runs out, drops the call
/// and sends the same entries again at once. Its own bound is a count (300
/// entries), and an entry holds a batch of commands: under bulk creates 300
/// entries were megabytes, which a follower on a busy machine could not take
/// in within the interval, so the leader read, encoded and sent them again and
/// again, never getting further; elections followed, and with two nodes each
/// leading a term of its own and each call timing out before its answer
/// (which would have told the older leader of the newer term) the group never
/// recovered. 512 KiB ended that up to 1M leases and not at 10M (it wedged
/// 1.7M leases in); at 64 KiB all 10M were created, twice (the catch-up bench,
/// `docs/guide/performance.md`). A follower far behind gets the log in
/// pieces, one after another.
pub const REPLICATION_BYTES: usize = 64 * 1024;

/// Where the log's entries are kept: `RedbLog` (`redb_log.rs`) or
/// `SegmentLog` (`segment_log.rs`). The rest of the store (vote, committed and
/// purged log ids) is the same for both.
///
/// Contract: openraft serializes the writes (each is awaited before the next
/// starts); reads may run beside them and see every write that returned (an
/// append's entries as soon as `append` returned, before they are durable).
/// Every error is fatal to the node (fail closed).
pub(crate) trait EntryLog: Send + Sync + 'static {
    /// The entries with indexes in `lo..hi` (`hi`: `None` for no end; `lo < hi`),
    /// only as many from `lo` as fit in `max_bytes` of stored bytes (at least
    /// one; `usize::MAX` for all).
    fn read(
        &self,
        lo: u64,
        hi: Option<u64>,
        max_bytes: usize,
    ) -> BoxFuture<'_, Result<Vec<Entry<TypeConfig>>, DbError>>;

    /// The log id of the last entry, if any.
    fn last_log_id(&self) -> Result<Option<LogId<NodeId>>, DbError>;

    /// The index of the last entry, if any (without decoding it).
    fn last_index(&self) -> Result<Option<u64>, DbError>;

    /// Whether the entry at `index` is durable (synced, or purged behind a
    /// snapshot): the committed log id is kept only once it is, so that a
    /// persisted committed id never points past the log on disk.
    fn is_durable(&self, index: u64) -> bool;

    /// Appends `entries` (which follow on from the log) and calls `done` once
    /// they are durable, or with the error: always exactly once, also when
    /// this returns an error. The crash points
    /// [`crate::seams::CrashPoint::LogBeforeFsync`] and `LogAfterFsync` fire
    /// around the fsync that makes them durable.
    fn append(&self, entries: Vec<Entry<TypeConfig>>, done: Done) -> BoxFuture<'_, Result<(), DbError>>;

    /// Deletes the entries at `since` and after; durable when it returns.
    fn truncate(&self, since: u64) -> BoxFuture<'_, Result<(), DbError>>;

    /// Records `upto` as the last purged log id and deletes the entries up to
    /// it; the record is durable when it returns.
    fn purge(&self, upto: LogId<NodeId>) -> BoxFuture<'_, Result<(), DbError>>;
}

/// Opens (creating if needed) `dir/fencelock.redb` and returns the log store and the
/// state machine over it, the log's entries in redb (`LogEngine::Redb`; the server
/// opens with its configured engine, see [`open_engine`]). The state machine starts
/// from the persisted snapshot, if any; openraft re-applies the committed log after it.
///
/// Fails with a message naming the directory when another process (or another
/// handle in this process) already has the database open: two servers must never
/// share one data directory.
///
/// A database redb cannot read at all (it meets some corrupt bytes with a
/// panic) is reported as corrupt, naming `fencelock check-data`.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachine), StorageError<NodeId>> {
    open_with(dir, &Seams::default())
}

/// [`open`] through `seams`: its storage backend opens the database, its hooks
/// are called at the log's and the state machine's crash points.
pub fn open_with(dir: &Path, seams: &Seams) -> Result<(LogStore, StateMachine), StorageError<NodeId>> {
    open_engine(dir, seams, LogEngine::Redb)
}

/// [`open_with`] with the log's entries kept by `engine`. Refuses a data dir
/// whose log is kept by the other engine (see [`LogEngine`]).
pub fn open_engine(
    dir: &Path,
    seams: &Seams,
    engine: LogEngine,
) -> Result<(LogStore, StateMachine), StorageError<NodeId>> {
    open_admitted(dir, seams, engine, &|_| Ok(()))
}

/// Whether a data dir's database may be changed by opening it (its log moved
/// into segments): `Err` with the reason to refuse it, which the open returns.
pub type Admit<'a> = &'a dyn Fn(&Database) -> Result<(), String>;

/// [`open_engine`], asking `admit` before anything in the data dir is changed
/// (the node's identity is checked there: a data dir of another node is
/// refused before its log is moved, not after).
pub fn open_admitted(
    dir: &Path,
    seams: &Seams,
    engine: LogEngine,
    admit: Admit<'_>,
) -> Result<(LogStore, StateMachine), StorageError<NodeId>> {
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open_unguarded(dir, seams, engine, admit)));
    opened.unwrap_or_else(|_| {
        let why = format!(
            "the database in {} is corrupt (redb could not read it); run fencelock check-data on it",
            dir.display()
        );
        Err(StorageIOError::new(ErrorSubject::Store, ErrorVerb::Read, AnyError::error(why)).into())
    })
}

fn open_unguarded(
    dir: &Path,
    seams: &Seams,
    engine: LogEngine,
    admit: Admit<'_>,
) -> Result<(LogStore, StateMachine), StorageError<NodeId>> {
    // A plain message (no Rust type name in it): it is shown to operators.
    let store_err = |e: DbError| -> StorageError<NodeId> {
        StorageIOError::new(ErrorSubject::Store, ErrorVerb::Read, AnyError::error(e)).into()
    };
    let db = db::open(dir, seams).map_err(store_err)?;
    db::create_tables(&db).map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Write))?;
    admit(&db).map_err(|why| store_err(DbError::Other(why)))?;
    let meta = Meta::new(Arc::new(db));
    let entries = engine.open(&meta, dir, seams).map_err(store_err)?;
    let mut sm = StateMachine::load(meta.db().clone(), dir, seams.clone())?;
    sm.log_reaches(entries.last_index().map_err(store_err)?);
    Ok((LogStore { entries, meta }, sm))
}

/// The Raft log store: log entries, vote, committed and last-purged log ids.
///
/// Cheap to clone; clones share the database. openraft serializes all writes.
#[derive(Clone)]
pub struct LogStore {
    /// Where the entries are kept. (Before `meta`: the last clone closes the
    /// log before the committed log id is written at shutdown.)
    entries: Arc<dyn EntryLog>,
    meta: Meta,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

impl LogStore {
    /// The database (for the data dir's identity, [`super::identity`]).
    pub(crate) fn db(&self) -> &Arc<Database> {
        self.meta.db()
    }

    /// Whether the log holds an entry.
    pub(crate) fn has_entries(&self) -> Result<bool, DbError> {
        Ok(self.entries.last_index()?.is_some())
    }

    async fn read_entries(&self, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry<TypeConfig>>, DbError> {
        // redb (like BTreeMap) must not be given a range whose start is after its end.
        let lo = match start {
            Bound::Included(s) => s,
            Bound::Excluded(s) => match s.checked_add(1) {
                Some(s) => s,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let hi_exclusive = match end {
            Bound::Included(e) => e.checked_add(1),
            Bound::Excluded(e) => Some(e),
            Bound::Unbounded => None,
        };
        if let Some(hi) = hi_exclusive {
            if hi <= lo {
                return Ok(Vec::new());
            }
        }
        self.entries.read(lo, hi_exclusive, usize::MAX).await
    }

    fn log_state(&self) -> Result<LogState<TypeConfig>, DbError> {
        let last_purged: Option<LogId<NodeId>> = self.meta.read(KEY_LAST_PURGED)?;
        let last_in_log = self.entries.last_log_id()?;
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last_in_log.or(last_purged) })
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        self.read_entries(range.start_bound().cloned(), range.end_bound().cloned())
            .await
            .map_err(|e| e.into_storage(ErrorSubject::Logs, ErrorVerb::Read))
    }

    /// What one AppendEntries carries to a follower: the entries from
    /// `start`, as many as fit in [`REPLICATION_BYTES`] (at least one).
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        if end <= start {
            return Ok(Vec::new());
        }
        self.entries
            .read(start, Some(end), REPLICATION_BYTES)
            .await
            .map_err(|e| e.into_storage(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        self.log_state().map_err(|e| e.into_storage(ErrorSubject::Logs, ErrorVerb::Read))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable (fsync'd) before returning.
    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let to_err = |e: DbError| e.into_storage(ErrorSubject::Vote, ErrorVerb::Write);
        let bytes = encode(vote).map_err(to_err)?;
        self.meta.write(KEY_VOTE, bytes).await.map_err(to_err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.meta.read(KEY_VOTE).map_err(|e| e.into_storage(ErrorSubject::Vote, ErrorVerb::Read))
    }

    /// Kept in memory and written with the next durable transaction (see
    /// `Committed` in `meta.rs`), once the entry it names is durable in the
    /// log (`EntryLog::is_durable`): a follower may hear of a commit before its
    /// own fsync, and the committed id on disk must never point past the log
    /// on disk (a later call records it).
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        if committed.is_some_and(|c| !self.entries.is_durable(c.index)) {
            return Ok(());
        }
        self.meta.save_committed(committed);
        Ok(())
    }

    /// The value saved by this process, else redb's.
    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        if let Committed::Saved(id) = self.meta.committed() {
            return Ok(id);
        }
        self.meta.read(KEY_COMMITTED).map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Read))
    }

    /// `callback` is called once the entries are durable, so they are on disk
    /// when openraft hears of it (see `EntryLog::append`).
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let done: Done = Box::new(move |res| callback.log_io_completed(res));
        let appended = self.entries.append(entries.into_iter().collect(), done).await;
        appended.map_err(|e| e.into_storage(ErrorSubject::Logs, ErrorVerb::Write))
    }

    /// Deletes the entries at `log_id.index` and after, durably.
    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let truncated = self.entries.truncate(log_id.index).await;
        truncated.map_err(|e| e.into_storage(ErrorSubject::Log(log_id), ErrorVerb::Delete))
    }

    /// Records `log_id` as last purged, durably, and deletes the entries up to it.
    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let purged = self.entries.purge(log_id).await;
        purged.map_err(|e| e.into_storage(ErrorSubject::Log(log_id), ErrorVerb::Delete))
    }
}
