//! The Raft log, the vote and the committed log id: the log entries in the
//! segment log of [`super::wal`] (`log = "segment"`, the default, see
//! [`LogEngine`]) and the rest in redb, or (`log = "redb"`) all
//! of it in one redb database.
//!
//! The layout of `fencelock.redb` and how values are stored in it are in
//! [`super::db`].
//!
//! Every write is one redb write transaction. Appends, truncations, purges and votes
//! commit with [`Durability::Immediate`] (fsync before the call returns). The
//! committed log id is not written on its own: [`LogStore::save_committed`]
//! keeps it in memory, and every one of those durable transactions writes the
//! latest value with what it writes (see [`Committed`]).
//!
//! With the segment log, `raft_log` stays empty: appends, truncations and
//! purges of entries go to [`Wal`] (whose thread does the IO), and `purge`
//! first records the last purged log id in redb, durably, then lets the log
//! delete its segments. Which engine holds a data dir's log is recorded
//! (`log_engine`, absent for redb): a redb data dir opened with the segment
//! engine has its log moved into segments, once ([`migrate`], crash-safe);
//! a segment data dir opened with redb is refused, never served as an empty
//! log.
//!
//! redb is synchronous, so every write transaction runs on tokio's blocking pool
//! ([`super::db::blocking`]) and is awaited: writes stay strictly ordered (openraft
//! awaits each storage call) without stalling the async workers during an fsync.
#![allow(clippy::result_large_err)] // openraft's error types are large by design

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, ErrorSubject, ErrorVerb, LogId, LogState, OptionalSend, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use serde::de::DeserializeOwned;

use super::db::{
    self, blocking, decode, decode_entry, encode, encode_entry, meta_name, DbError, KEY_COMMITTED, KEY_LAST_PURGED,
    KEY_VOTE, LOG, META,
};
use super::state_machine::StateMachine;
use super::wal::{self, Wal};
use super::{NodeId, TypeConfig};
use crate::seams::{CrashPoint, Seams};

mod engine;
pub mod migrate;

use engine::check_engine;
pub use engine::LogEngine;

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
/// whose log is kept by the other engine (see `check_engine` in `engine.rs`).
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
    check_engine(&db, dir, engine, seams).map_err(store_err)?;
    let wal = match engine {
        LogEngine::Redb => None,
        LogEngine::Segment => Some(Arc::new(open_wal(&db, dir, seams).map_err(store_err)?)),
    };
    let db = Arc::new(db);
    let mut sm = StateMachine::load(db.clone(), dir, seams.clone())?;
    if let Some(wal) = &wal {
        sm.log_reaches(wal.last_log_id().map(|l| l.index));
    }
    let committed = Arc::new(LatestCommitted::new(db.clone()));
    Ok((LogStore { wal, db, seams: seams.clone(), committed }, sm))
}

/// Opens the segment log of the data dir `dir`, from its last purged log id.
///
/// The log must reach the committed log id recorded in redb (only durably
/// appended entries get committed, and neither truncate nor purge goes below
/// it): a log that ends before it lost its last segments, which a scan cannot
/// see, and is refused.
fn open_wal(db: &Database, dir: &Path, seams: &Seams) -> Result<Wal, DbError> {
    let read_id = |key: &str| -> Result<Option<LogId<NodeId>>, DbError> {
        let txn = db.begin_read()?;
        let meta = txn.open_table(META)?;
        let value = meta.get(key)?;
        value.map(|v| decode(&meta_name(key), v.value())).transpose()
    };
    let (last_purged, committed) = (read_id(KEY_LAST_PURGED)?, read_id(KEY_COMMITTED)?);
    let wal_dir = dir.join(wal::WAL_DIR);
    let opts = wal::Options { committed: committed.map(|c| c.index), ..wal::Options::default() };
    let wal = Wal::open(&wal_dir, opts, last_purged.map(|l| l.index), seams)?;
    let last = wal.last_log_id().or(last_purged);
    match committed {
        Some(c) if last.is_none_or(|l| l.index < c.index) => Err(DbError::Other(format!(
            "the Raft log in {} ends at index {}, before the committed index {}: log segments are missing; \
             the node cannot start without them",
            wal_dir.display(),
            last.map_or_else(|| "(none)".to_string(), |l| l.index.to_string()),
            c.index
        ))),
        _ => Ok(wal),
    }
}

/// The Raft log store: log entries, vote, committed and last-purged log ids.
///
/// Cheap to clone; clones share the database. openraft serializes all writes.
#[derive(Clone)]
pub struct LogStore {
    /// The segment log, with `log = "segment"`; `None`: the entries are in
    /// redb. (Before `db`: the last clone closes the log before the database.)
    wal: Option<Arc<Wal>>,
    db: Arc<Database>,
    /// Hooks at the append's crash points (see [`crate::seams`]).
    seams: Seams,
    /// The committed log id openraft last saved, shared by the clones.
    committed: Arc<LatestCommitted>,
}

/// The committed log id of this process (see [`Committed`]); when the last
/// clone of the store is dropped (a clean shutdown), the value is written, so
/// a clean restart re-applies everything that was committed.
struct LatestCommitted {
    value: Mutex<Committed>,
    db: Arc<Database>,
}

impl LatestCommitted {
    fn new(db: Arc<Database>) -> Self {
        Self { value: Mutex::new(Committed::Unsaved), db }
    }

    fn get(&self) -> Committed {
        *self.value.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, committed: Option<LogId<NodeId>>) {
        *self.value.lock().unwrap_or_else(PoisonError::into_inner) = Committed::Saved(committed);
    }
}

impl Drop for LatestCommitted {
    fn drop(&mut self) {
        let write = || -> Result<(), DbError> {
            let committed = self.get().to_write()?;
            if committed.is_none() {
                return Ok(());
            }
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            put_committed(&txn, &committed)?;
            txn.commit()?;
            Ok(())
        };
        if let Err(e) = write() {
            tracing::warn!(error = %e, "could not write the committed log id at shutdown; the next start re-applies less of the log");
        }
    }
}

/// The committed log id as this process last saved it, written to redb with the
/// next durable transaction (append, truncate, vote or purge) instead of in a
/// transaction of its own.
///
/// openraft saves the committed id before every apply, on its core task; a redb
/// transaction there (even one without fsync) was a round trip through the
/// blocking pool on every commit. Writing it with the next durable
/// transaction gives the same guarantee as the non-durable commit it replaces,
/// which also only became durable with the next immediate commit: a crash loses
/// at most the latest value, so a restart re-applies less of the log, never more
/// than was committed. The value is kept, not taken, so a transaction that
/// fails leaves it for the next one; a clean shutdown writes it (see
/// [`LatestCommitted`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Committed {
    /// Not saved by this process: redb's value stands.
    #[default]
    Unsaved,
    /// Saved: write this value (`None` removes the key).
    Saved(Option<LogId<NodeId>>),
}

impl Committed {
    /// What a durable transaction writes: `None` to leave the key alone,
    /// `Some(None)` to remove it, `Some(Some(bytes))` to set it.
    fn to_write(self) -> Result<Option<Option<Vec<u8>>>, DbError> {
        match self {
            Committed::Unsaved => Ok(None),
            Committed::Saved(None) => Ok(Some(None)),
            Committed::Saved(Some(id)) => Ok(Some(Some(encode(&id)?))),
        }
    }
}

/// Writes `committed` (see [`Committed::to_write`]) into the meta table of a
/// write transaction.
fn put_committed(txn: &redb::WriteTransaction, committed: &Option<Option<Vec<u8>>>) -> Result<(), DbError> {
    let mut table = txn.open_table(META)?;
    match committed {
        None => {}
        Some(Some(bytes)) => {
            table.insert(KEY_COMMITTED, bytes.as_slice())?;
        }
        Some(None) => {
            table.remove(KEY_COMMITTED)?;
        }
    }
    Ok(())
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

impl LogStore {
    /// The database (for the data dir's identity, [`super::identity`]).
    pub(crate) fn db(&self) -> &Arc<Database> {
        &self.db
    }

    /// Whether the segment log holds an entry (`false` with the redb engine,
    /// whose entries are in the database).
    pub(crate) fn has_segment_entries(&self) -> bool {
        self.wal.as_ref().is_some_and(|wal| wal.last_log_id().is_some())
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, DbError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        match table.get(key)? {
            Some(v) => Ok(Some(decode(&meta_name(key), v.value())?)),
            None => Ok(None),
        }
    }

    /// What the next durable transaction writes of the committed log id.
    fn committed_to_write(&self) -> Result<Option<Option<Vec<u8>>>, DbError> {
        self.committed.get().to_write()
    }

    /// Writes one meta key, and the committed log id, in one durable transaction.
    async fn write_meta(&self, key: &'static str, value: Vec<u8>) -> Result<(), DbError> {
        let db = self.db.clone();
        let committed = self.committed_to_write()?;
        blocking(move || {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            {
                let mut table = txn.open_table(META)?;
                table.insert(key, value.as_slice())?;
            }
            put_committed(&txn, &committed)?;
            txn.commit()?;
            Ok(())
        })
        .await
    }

    fn read_entries(&self, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry<TypeConfig>>, DbError> {
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
        if let Some(wal) = &self.wal {
            return Ok(wal.entries(lo, hi_exclusive));
        }
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LOG)?;
        let range =
            table.range::<u64>((Bound::Included(lo), hi_exclusive.map_or(Bound::Unbounded, Bound::Excluded)))?;
        let mut out = Vec::new();
        for item in range {
            let (k, v) = item?;
            out.push(decode_entry(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn log_state(&self) -> Result<LogState<TypeConfig>, DbError> {
        let txn = self.db.begin_read()?;
        let last_purged: Option<LogId<NodeId>> = {
            let meta = txn.open_table(META)?;
            let id = match meta.get(KEY_LAST_PURGED)? {
                Some(v) => Some(decode(&meta_name(KEY_LAST_PURGED), v.value())?),
                None => None,
            };
            id
        };
        let last_in_log: Option<LogId<NodeId>> = if let Some(wal) = &self.wal {
            wal.last_log_id()
        } else {
            let log = txn.open_table(LOG)?;
            let id = match log.last()? {
                Some((k, v)) => Some(decode_entry(k.value(), v.value())?.log_id),
                None => None,
            };
            id
        };
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last_in_log.or(last_purged) })
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        self.read_entries(range.start_bound().cloned(), range.end_bound().cloned())
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
        self.write_meta(KEY_VOTE, bytes).await.map_err(to_err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.read_meta(KEY_VOTE).map_err(|e| e.into_storage(ErrorSubject::Vote, ErrorVerb::Read))
    }

    /// Kept in memory and written with the next durable transaction (see
    /// [`Committed`]). With the segment log, an id is kept only once the entry
    /// it names is durable in the log: a follower may hear of a commit before
    /// its own fsync, and the committed id on disk must never point past the
    /// log on disk (a later call records it).
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        if let (Some(wal), Some(c)) = (&self.wal, &committed) {
            if !wal.is_durable(c.index) {
                return Ok(());
            }
        }
        self.committed.set(committed);
        Ok(())
    }

    /// The value saved by this process, else redb's.
    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        if let Committed::Saved(id) = self.committed.get() {
            return Ok(id);
        }
        self.read_meta(KEY_COMMITTED).map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Read))
    }

    /// All `entries` go into ONE write transaction committed with
    /// `Durability::Immediate` (one fsync per call); `callback` is called after the
    /// commit returned, so the entries are on disk when openraft hears of it.
    /// ([`CrashPoint::LogBeforeFsync`] and [`CrashPoint::LogAfterFsync`] are around the commit.)
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let to_err = |e: DbError| e.into_storage(ErrorSubject::Logs, ErrorVerb::Write);
        if let Some(wal) = &self.wal {
            let done: wal::Done = Box::new(move |res| callback.log_io_completed(res));
            return wal.append(entries.into_iter().collect(), done).map_err(|e| to_err(e.into()));
        }
        let mut encoded: Vec<(u64, Vec<u8>)> = Vec::new();
        for entry in entries {
            match encode_entry(&entry) {
                Ok(bytes) => encoded.push((entry.log_id.index, bytes)),
                Err(e) => {
                    callback.log_io_completed(Err(io::Error::other(e.to_string())));
                    return Err(to_err(e));
                }
            }
        }
        let db = self.db.clone();
        let seams = self.seams.clone();
        let committed = self.committed_to_write().map_err(to_err)?;
        let res = blocking(move || {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            {
                let mut table = txn.open_table(LOG)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice())?;
                }
            }
            put_committed(&txn, &committed)?;
            seams.crash_point(CrashPoint::LogBeforeFsync);
            txn.commit()?;
            Ok(())
        })
        .await;
        match res {
            Ok(()) => {
                self.seams.crash_point(CrashPoint::LogAfterFsync);
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(to_err(e))
            }
        }
    }

    /// Deletes the entries at `log_id.index` and after, in one durable transaction.
    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        if let Some(wal) = &self.wal {
            let res = wal.truncate(log_id.index).await;
            return res.map_err(|e| DbError::from(e).into_storage(ErrorSubject::Log(log_id), ErrorVerb::Delete));
        }
        let db = self.db.clone();
        let since = log_id.index;
        let to_err = |e: DbError| e.into_storage(ErrorSubject::Log(log_id), ErrorVerb::Delete);
        let committed = self.committed_to_write().map_err(to_err)?;
        blocking(move || {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            {
                let mut table = txn.open_table(LOG)?;
                table.retain_in::<u64, _>(since.., |_, _| false)?;
            }
            put_committed(&txn, &committed)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(to_err)
    }

    /// Records `log_id` as last purged and deletes the entries up to it, in one
    /// durable transaction. With the segment log: records it durably, then the
    /// log drops its segments (a crash in between leaves segments that the next
    /// start removes).
    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let to_err = |e: DbError| e.into_storage(ErrorSubject::Log(log_id), ErrorVerb::Delete);
        let bytes = encode(&log_id).map_err(to_err)?;
        if let Some(wal) = self.wal.clone() {
            self.write_meta(KEY_LAST_PURGED, bytes).await.map_err(to_err)?;
            return wal.purge(log_id.index).await.map_err(|e| to_err(e.into()));
        }
        let db = self.db.clone();
        let upto = log_id.index;
        let committed = self.committed_to_write().map_err(to_err)?;
        blocking(move || {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            {
                let mut meta = txn.open_table(META)?;
                meta.insert(KEY_LAST_PURGED, bytes.as_slice())?;
                let mut table = txn.open_table(LOG)?;
                table.retain_in::<u64, _>(..=upto, |_, _| false)?;
            }
            put_committed(&txn, &committed)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(to_err)
    }
}
