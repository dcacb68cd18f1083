//! Tests of the redb storage (openraft's conformance suite plus restart cases) and
//! of the gRPC network (a real multi-node group on localhost).

use crate::raft::Member;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock_core::{Command, Engine, Input, LeaseId, Output, Reply, RequestId};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader, RaftSnapshotBuilder, StorageError,
    StoredMembership, Vote,
};
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;

use redb::{ReadableDatabase, ReadableTable};

use super::{codec, db, log_store, record, snapshot_file};
use super::{open_storage, LogStore, Network, NodeId, RaftService, StateMachine, TypeConfig};

pub(super) fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

pub(super) fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry { log_id: log_id(term, index), payload: EntryPayload::Blank }
}

pub(super) fn membership(term: u64, index: u64, voters: &[NodeId]) -> Entry<TypeConfig> {
    let nodes: BTreeMap<NodeId, Member> =
        voters.iter().map(|id| (*id, Member::new(format!("127.0.0.1:{}", 7000 + id)))).collect();
    let set: BTreeSet<NodeId> = voters.iter().copied().collect();
    Entry { log_id: log_id(term, index), payload: EntryPayload::Membership(Membership::new(vec![set], nodes)) }
}

pub(super) fn normal(term: u64, index: u64, input: Input) -> Entry<TypeConfig> {
    Entry { log_id: log_id(term, index), payload: EntryPayload::Normal(input.into()) }
}

pub(super) fn grant(req: u64, ttl_ms: u64) -> Command {
    Command::GrantLease { req: RequestId(req), ttl_ms, id: None }
}

// ---------------------------------------------------------------------------
// openraft's storage conformance suite

struct TempStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for TempStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, sm) = open_storage(dir.path())?;
        Ok((dir, log, sm))
    }
}

/// Runs every test of `openraft::testing::Suite` (log state, append, truncate,
/// purge, vote, membership from log and state machine, initial state, apply,
/// snapshot build and transfer), each on a fresh database in a temp dir. The
/// suite builds its own tokio runtimes, hence a plain `#[test]`.
#[test]
fn openraft_storage_conformance_suite() {
    Suite::test_all(TempStore).expect("openraft storage suite");
}

/// The same store with the log's entries in the segment log.
struct TempSegmentStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for TempSegmentStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, sm) = open_segment(dir.path())?;
        Ok((dir, log, sm))
    }
}

#[allow(clippy::result_large_err)] // openraft's error types are large by design
fn open_segment(dir: &std::path::Path) -> Result<(LogStore, StateMachine), StorageError<NodeId>> {
    log_store::open_engine(dir, &crate::seams::Seams::default(), log_store::LogEngine::Segment)
}

/// openraft's storage suite over the segment log (`log = "segment"`): the
/// same contract as redb's log.
#[test]
fn openraft_storage_conformance_suite_on_the_segment_log() {
    Suite::test_all(TempSegmentStore).expect("openraft storage suite");
}

/// With the segment log, entries, truncation and purge survive a reopen, and
/// the entries are in `wal/`, none in redb's `raft_log`.
#[tokio::test]
async fn the_segment_log_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open_segment(dir.path()).unwrap();
        log.blocking_append((1..=10).map(|i| blank(1, i))).await.unwrap();
        log.truncate(log_id(1, 8)).await.unwrap();
        log.blocking_append([normal(2, 8, Input::Batch { now: 5, cmds: vec![grant(1, 1_000)] })]).await.unwrap();
        log.purge(log_id(1, 3)).await.unwrap();
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
    }
    let (mut log, _sm) = open_segment(dir.path()).unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(2, 8)));
    let ids: Vec<LogId<NodeId>> = log.try_get_log_entries(..).await.unwrap().iter().map(|e| e.log_id).collect();
    assert_eq!(ids, vec![log_id(1, 4), log_id(1, 5), log_id(1, 6), log_id(1, 7), log_id(2, 8)]);
    assert_eq!(log.try_get_log_entries(5..7).await.unwrap().len(), 2);
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new_committed(2, 1)));
    let db = log.db().clone();
    let txn = redb::ReadableDatabase::begin_read(&*db).unwrap();
    let redb_log = txn.open_table(db::LOG).unwrap();
    assert!(redb::ReadableTableMetadata::is_empty(&redb_log).unwrap(), "no entry in redb");
}

/// Segments lost off the end of the log (which no scan can see) are found
/// against the committed index in redb, and so is a missing `wal/`: the node
/// does not start from a shorter log.
#[tokio::test]
async fn a_segment_log_shorter_than_committed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open_segment(dir.path()).unwrap();
        log.blocking_append((1..=4).map(|i| blank(1, i))).await.unwrap();
        log.save_committed(Some(log_id(1, 4))).await.unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap(); // makes `committed` durable
    }
    let wal = dir.path().join(super::wal::WAL_DIR);
    let seg = wal.join(super::wal::segments::segment_name(1));
    std::fs::remove_file(&seg).unwrap();
    let err = open_segment(dir.path()).expect_err("a log shorter than committed").to_string();
    assert!(err.contains("before the committed index 4"), "{err}");
    std::fs::remove_dir(&wal).unwrap();
    let err = open_segment(dir.path()).expect_err("a missing wal/").to_string();
    assert!(err.contains("which is missing"), "{err}");
}

/// A data dir whose log is in segments is refused by the redb engine, with a
/// message naming both engines and the way to a redb data dir (a backup and a
/// restore): never an empty log, which would restart the tokens.
#[tokio::test]
async fn a_segment_data_dir_refuses_the_redb_engine() {
    let seg_dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open_segment(seg_dir.path()).unwrap();
        log.blocking_append([blank(1, 1)]).await.unwrap();
    }
    let err = open_storage(seg_dir.path()).expect_err("the segments must not be ignored").to_string();
    assert!(err.contains("--log-engine segment") && err.contains("--log-engine redb"), "{err}");
    assert!(err.contains("snapshot save") && err.contains("snapshot restore"), "{err}");
    let (mut log, _sm) = open_segment(seg_dir.path()).expect("still opens with its own engine");
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 1)));
}

// ---------------------------------------------------------------------------
// moving a redb log into the segment log (see `log_store::migrate`)

/// Fills `dir` through the redb engine: a membership, a leader start and
/// grants at 1..=10, entry 4 rewritten as an older build stored it (JSON),
/// purged up to 3 (so the log starts at 4), committed up to 9, a vote.
async fn fill_redb(dir: &std::path::Path) {
    {
        let (mut log, _sm) = open_storage(dir).unwrap();
        log.blocking_append([membership(1, 1, &[1]), normal(1, 2, Input::leader_start(1_000))]).await.unwrap();
        let grants = (3..=10).map(|i| normal(1, i, Input::Batch { now: 1_000 + i, cmds: vec![grant(i, 60_000)] }));
        log.blocking_append(grants).await.unwrap();
        log.purge(log_id(1, 3)).await.unwrap();
        log.save_committed(Some(log_id(1, 9))).await.unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap(); // makes `committed` durable
    }
    let db = redb::Database::open(dir.join(super::DB_FILE)).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let old = normal(1, 4, Input::Batch { now: 1_004, cmds: vec![grant(4, 60_000)] });
        let mut table = txn.open_table(db::LOG).unwrap();
        table.insert(4, db::encode(&old).unwrap().as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

/// What a start reads back from a log store: the entries, the log state
/// (last purged, last), the vote and the committed log id.
#[derive(Debug, PartialEq)]
struct Stored {
    entries: Vec<Entry<TypeConfig>>,
    purged_and_last: (Option<LogId<NodeId>>, Option<LogId<NodeId>>),
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

async fn stored(log: &mut LogStore) -> Stored {
    let state = log.get_log_state().await.unwrap();
    Stored {
        entries: log.try_get_log_entries(..).await.unwrap(),
        purged_and_last: (state.last_purged_log_id, state.last_log_id),
        vote: log.read_vote().await.unwrap(),
        committed: log.read_committed().await.unwrap(),
    }
}

/// What `dir`'s database records as its log engine, and how many entries
/// its `raft_log` holds.
fn engine_mark_and_redb_entries(dir: &std::path::Path) -> (Option<Vec<u8>>, u64) {
    let db = redb::Database::open(dir.join(super::DB_FILE)).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(db::META).unwrap();
    let mark = meta.get(db::KEY_LOG_ENGINE).unwrap().map(|v| v.value().to_vec());
    let entries = redb::ReadableTableMetadata::len(&txn.open_table(db::LOG).unwrap()).unwrap();
    (mark, entries)
}

/// Runs `steps` of a migration of `dir` on its database, then stops, as a
/// crash would.
fn migrate_partly(dir: &std::path::Path, steps: impl FnOnce(&redb::Database, &std::path::Path)) {
    let db = redb::Database::open(dir.join(super::DB_FILE)).unwrap();
    steps(&db, dir);
}

/// Issue 19 §2: a redb data dir started with the segment engine keeps exactly
/// its log (entries from after the purge point, one of them in an older
/// codec), vote, last purged and committed log ids, now read from `wal/`, with
/// `raft_log` emptied and the engine recorded; `check-data` reports the same
/// data dir as before. A second start is a plain segment start (an entry
/// appended in between is kept, which a second migration from the emptied
/// `raft_log` would lose), and the redb engine is refused from then on.
#[tokio::test]
async fn a_redb_log_moves_into_the_segment_log_on_its_first_segment_start() {
    let dir = tempfile::tempdir().unwrap();
    fill_redb(dir.path()).await;
    let before = stored(&mut open_storage(dir.path()).unwrap().0).await;
    assert_eq!(before.purged_and_last, (Some(log_id(1, 3)), Some(log_id(1, 10))), "the filled store");
    let checked = super::check::check_data(dir.path()).expect("the redb data dir passes");
    {
        let (mut log, _sm) = open_segment(dir.path()).expect("moved into segments");
        assert_eq!(stored(&mut log).await, before);
        log.blocking_append([blank(2, 11)]).await.unwrap();
    }
    assert_eq!(engine_mark_and_redb_entries(dir.path()), (Some(db::encode(&"segment").unwrap()), 0));
    assert_eq!(super::check::check_data(dir.path()).expect("the moved data dir passes").entries, 8);
    let (mut log, _sm) = open_segment(dir.path()).expect("a plain segment start");
    let mut expected = before;
    expected.entries.push(blank(2, 11));
    expected.purged_and_last.1 = Some(log_id(2, 11));
    assert_eq!(stored(&mut log).await, expected);
    drop((log, _sm));
    let mut report = super::check::check_data(dir.path()).unwrap();
    report.entries -= 1;
    report.last_index = Some(10);
    assert_eq!(report, checked, "check-data reads the moved log as it read redb's (plus the blank entry)");
    let err = open_storage(dir.path()).expect_err("no way back into redb").to_string();
    assert!(err.contains("log = \"segment\""), "{err}");
}

/// Crash safety of the migration, a crash after step 1 (the segments are
/// built in `wal.migrating/`, not renamed): redb still holds the log, and the
/// next segment start discards the half-built log and moves the log again: the
/// result is redb's log, nothing lost, nothing twice.
#[tokio::test]
async fn a_migration_stopped_before_the_rename_is_done_again() {
    let dir = tempfile::tempdir().unwrap();
    fill_redb(dir.path()).await;
    let before = stored(&mut open_storage(dir.path()).unwrap().0).await;
    migrate_partly(dir.path(), |db, dir| {
        log_store::migrate::build(db, dir, &crate::seams::Seams::default()).unwrap();
    });
    let building = dir.path().join(log_store::migrate::MIGRATING_DIR);
    assert!(building.join(super::wal::segments::segment_name(4)).is_file(), "the half-built log");
    assert!(!dir.path().join(super::wal::WAL_DIR).exists());
    assert_eq!(engine_mark_and_redb_entries(dir.path()), (None, 7), "redb as it was");
    let (mut log, _sm) = open_segment(dir.path()).expect("moved again");
    assert_eq!(stored(&mut log).await, before);
    assert!(!building.exists(), "the half-built log is gone");
}

/// Crash safety of the migration, a crash after step 2 (`wal/` in place, the
/// database still records no engine): `wal/` is not the log. A redb start
/// reads redb's log (and may change it: here it replaces entries 9 and 10);
/// the next segment start discards the stale `wal/` and moves the log as redb
/// holds it then: no stale entry comes back, none is lost.
#[tokio::test]
async fn a_migration_stopped_before_the_redb_commit_is_done_again() {
    let dir = tempfile::tempdir().unwrap();
    fill_redb(dir.path()).await;
    migrate_partly(dir.path(), |db, dir| {
        let seams = crate::seams::Seams::default();
        log_store::migrate::build(db, dir, &seams).unwrap();
        log_store::migrate::install(dir, &seams).unwrap();
    });
    assert!(dir.path().join(super::wal::WAL_DIR).join(super::wal::segments::segment_name(4)).is_file());
    assert_eq!(engine_mark_and_redb_entries(dir.path()), (None, 7), "redb as it was");
    let changed = {
        let (mut log, _sm) = open_storage(dir.path()).expect("redb still holds the log");
        log.truncate(log_id(1, 9)).await.unwrap();
        log.blocking_append([blank(2, 9)]).await.unwrap();
        stored(&mut log).await
    };
    assert_eq!(changed.purged_and_last.1, Some(log_id(2, 9)));
    let (mut log, _sm) = open_segment(dir.path()).expect("moved again");
    assert_eq!(stored(&mut log).await, changed);
}

/// A record of `raft_log` that fails its check stops a migration as it stops
/// a redb start, naming the record, and leaves the data dir as it was: no
/// segment log is left to be read, no engine recorded, redb's log intact.
#[tokio::test]
async fn a_corrupt_redb_entry_stops_the_migration_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    fill_redb(dir.path()).await;
    {
        let db = redb::Database::open(dir.path().join(super::DB_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(db::LOG).unwrap();
            let mut bytes = redb::ReadableTable::get(&table, 6).unwrap().unwrap().value().to_vec();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x01;
            table.insert(6, bytes.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let err = open_segment(dir.path()).expect_err("a corrupt entry").to_string();
    assert!(err.contains("raft_log[6]"), "{err}");
    assert_unmoved(dir.path());
}

/// Nothing of a migration is left in `dir`: no `wal/`, no `wal.migrating/`,
/// no engine recorded, redb's 7 entries (of [`fill_redb`]) in place.
fn assert_unmoved(dir: &std::path::Path) {
    assert!(!dir.join(super::wal::WAL_DIR).exists(), "no wal/");
    assert!(!dir.join(log_store::migrate::MIGRATING_DIR).exists(), "no wal.migrating/");
    assert_eq!(engine_mark_and_redb_entries(dir), (None, 7), "redb as it was");
}

/// A redb log that ends before its committed index is not moved (a segment
/// start refuses such a log, and the move could not be undone): the start
/// fails saying so, and the data dir is as it was.
#[tokio::test]
async fn a_redb_log_short_of_its_committed_index_is_not_moved() {
    let dir = tempfile::tempdir().unwrap();
    fill_redb(dir.path()).await;
    {
        let db = redb::Database::open(dir.path().join(super::DB_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        let committed = db::encode(&log_id(1, 12)).unwrap();
        txn.open_table(db::META).unwrap().insert(db::KEY_COMMITTED, committed.as_slice()).unwrap();
        txn.commit().unwrap();
    }
    let err = open_segment(dir.path()).expect_err("a log short of committed").to_string();
    assert!(err.contains("ends at index 10, before the committed index 12"), "{err}");
    assert_unmoved(dir.path());
}

/// Segment files whose `fdatasync` fails.
#[derive(Debug)]
struct FailingSync;

#[derive(Debug)]
struct FailingSyncFile(Box<dyn super::wal::LogFile>);

impl super::wal::LogFiles for FailingSync {
    fn open(&self, path: &std::path::Path, create: bool) -> std::io::Result<Box<dyn super::wal::LogFile>> {
        Ok(Box::new(FailingSyncFile(super::wal::RealFiles.open(path, create)?)))
    }
}

impl super::wal::LogFile for FailingSyncFile {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        Err(std::io::Error::other("injected fdatasync failure"))
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&mut self, len: u64) -> std::io::Result<()> {
        self.0.allocate(len)
    }
    fn size(&mut self) -> std::io::Result<u64> {
        self.0.size()
    }
}

/// An IO error while the segments are built (an `fdatasync` that fails) fails
/// the start and leaves the data dir as it was; the next start, on a healthy
/// disk, moves the log.
#[tokio::test]
async fn a_migration_that_cannot_sync_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    fill_redb(dir.path()).await;
    let before = stored(&mut open_storage(dir.path()).unwrap().0).await;
    let seams = crate::seams::Seams { log_files: Some(Arc::new(FailingSync)), ..Default::default() };
    let failed = log_store::open_engine(dir.path(), &seams, log_store::LogEngine::Segment);
    let err = failed.expect_err("a failed fdatasync").to_string();
    assert!(err.contains("injected fdatasync failure"), "{err}");
    assert_unmoved(dir.path());
    let (mut log, _sm) = open_segment(dir.path()).expect("moved on a healthy disk");
    assert_eq!(stored(&mut log).await, before);
}

/// `fencelock check-data` reads a segment data dir's log from `wal/`, with the
/// checks a start makes: a healthy one reports its entries; one with a flipped
/// byte in a record followed by others is refused, naming the segment.
#[tokio::test]
async fn check_data_reads_the_segment_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open_segment(dir.path()).unwrap();
        log.blocking_append([membership(1, 1, &[1]), normal(1, 2, Input::leader_start(1_000))]).await.unwrap();
        for i in 3..=6 {
            log.blocking_append([normal(1, i, Input::Batch { now: 1_000 + i, cmds: vec![grant(i, 5_000)] })])
                .await
                .unwrap();
        }
    }
    let report = super::check::check_data(dir.path()).expect("a healthy segment data dir");
    assert_eq!((report.entries, report.first_index, report.last_index), (6, Some(1), Some(6)));
    assert_eq!(report.stats.leases, 4, "the replayed grants");

    let seg = dir.path().join("wal").join(super::wal::segments::segment_name(1));
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = super::wal::format::HEADER_LEN + 40;
    bytes[at] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    let err = super::check::check_data(dir.path()).expect_err("a flipped byte must be found").to_string();
    assert!(err.contains(&super::wal::segments::segment_name(1)) && err.contains("offset 32"), "{err}");
}

/// `--force-new-cluster` on a refused segment data dir moves its log aside
/// with its database: the new group starts from an empty log, not from the
/// old group's entries.
#[tokio::test]
async fn force_new_cluster_moves_the_segment_log_aside() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::Config::for_test(dir.path().join("data"));
    config.log = log_store::LogEngine::Segment;
    {
        let (mut log, _sm, _id) = crate::open_data_dir(&config).unwrap();
        log.blocking_append((1..=3).map(|i| blank(1, i))).await.unwrap();
    }
    config.node_id = 2; // another node's data dir: refused
    assert!(crate::open_data_dir(&config).is_err(), "node 2 must not open node 1's data dir");
    config.force_new_cluster = true;
    let (mut log, _sm, _id) = crate::open_data_dir(&config).expect("a new group");
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, None, "an empty log");
    let aside = config.data_dir.join("wal.set-aside-1");
    assert!(aside.join(super::wal::segments::segment_name(1)).is_file(), "the old log kept aside");
}

/// A data dir without an identity whose only Raft state is entries in its
/// segment log (no vote, no purge mark, no snapshot in redb) holds a node's
/// data: it is adopted with its entries, not refused as never initialized
/// (the identity's check of Raft state looks in `wal/` too).
#[tokio::test]
async fn a_data_dir_with_entries_only_in_its_segment_log_is_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::Config::for_test(dir.path().join("data"));
    config.log = log_store::LogEngine::Segment;
    {
        let (mut log, _sm) = open_segment(&config.data_dir).unwrap();
        log.blocking_append((1..=3).map(|i| blank(1, i))).await.unwrap();
    }
    assert_eq!(engine_mark_and_redb_entries(&config.data_dir), (Some(db::encode(&"segment").unwrap()), 0));
    let (mut log, _sm, id) = crate::open_data_dir(&config).expect("a node's data, adopted");
    assert_eq!(id.get().node_id, config.node_id);
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 3)), "its entries kept");
}

/// Upgrading a redb data dir from before identities whose only Raft state is
/// its log: started on the segment log (the default), its log moves into
/// `wal/` (redb's `raft_log` emptied) and the data dir is adopted with those
/// entries, not refused for lack of state in the database.
#[tokio::test]
async fn an_old_redb_data_dir_without_identity_moves_its_log_and_is_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::Config::for_test(dir.path().join("data"));
    config.log = log_store::LogEngine::Segment;
    {
        let (mut log, _sm) = open_storage(&config.data_dir).unwrap();
        log.blocking_append((1..=3).map(|i| blank(1, i))).await.unwrap();
    }
    {
        let (mut log, _sm, id) = crate::open_data_dir(&config).expect("adopted");
        assert_eq!(id.get().node_id, config.node_id);
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 3)), "its entries kept");
    }
    assert_eq!(engine_mark_and_redb_entries(&config.data_dir), (Some(db::encode(&"segment").unwrap()), 0));
    let wal = config.data_dir.join(super::wal::WAL_DIR);
    assert!(wal.join(super::wal::segments::segment_name(1)).is_file(), "the log moved into wal/");
}

// ---------------------------------------------------------------------------
// restart cases

/// The committed log id is written with the next durable transaction (on
/// redb the next append; on the segment log, whose appends are not redb
/// transactions, the next vote or purge) and at a clean shutdown, not in a
/// transaction of its own: after a clean close the latest value is on disk,
/// on both engines, whether or not a durable transaction followed it.
#[tokio::test]
async fn the_committed_id_is_on_disk_after_a_clean_close() {
    use log_store::LogEngine;
    let seams = crate::seams::Seams::default();
    for engine in [LogEngine::Redb, LogEngine::Segment] {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, _sm) = log_store::open_engine(dir.path(), &seams, engine).unwrap();
            log.blocking_append((1..=4).map(|i| blank(1, i))).await.unwrap();
            log.save_committed(Some(log_id(1, 2))).await.unwrap();
            assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 2)), "{engine:?}: read back in process");
            match engine {
                LogEngine::Redb => log.blocking_append([blank(1, 5)]).await.unwrap(),
                LogEngine::Segment => log.save_vote(&Vote::new_committed(1, 1)).await.unwrap(),
            }
            log.save_committed(Some(log_id(1, 4))).await.unwrap(); // no durable transaction after it
        }
        let (mut log, _sm) = log_store::open_engine(dir.path(), &seams, engine).unwrap();
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 4)), "{engine:?}");
    }
}

/// Issue 38: what one AppendEntries carries (`limited_get_log_entries`) is
/// the entries from its start that fit in `REPLICATION_BYTES` (a single
/// larger entry alone), on both engines and after a reopen (the segment log
/// then knows its old entries' sizes only from the scan); a follower reading
/// piece after piece gets the whole log, in order. Without the bound, one
/// read held all forty-two entries (about seven times the bound).
#[tokio::test]
async fn a_replication_read_carries_at_most_replication_bytes() {
    use log_store::{LogEngine, REPLICATION_BYTES};
    let batch = |i: u64, n: u64| {
        normal(1, i, Input::Batch { now: i, cmds: (0..n).map(|c| grant(i * 10_000 + c, 5_000)).collect() })
    };
    // A lease grant is about 11 bytes in the log: entries of about an eighth
    // of the bound, and one of half as much again as the bound.
    let small = (REPLICATION_BYTES / 8 / 11) as u64;
    let mut entries: Vec<_> = (1..=40).map(|i| batch(i, small)).collect();
    entries.push(batch(41, small * 12)); // larger than the bound by itself
    entries.push(batch(42, 10));
    let size = |e: &Entry<TypeConfig>| codec::encode_entry(e).unwrap().len();
    let (small, large) = (size(&entries[0]), size(&entries[40]));
    assert!(large > REPLICATION_BYTES && small * 4 < REPLICATION_BYTES, "{small} and {large} bytes");
    let seams = crate::seams::Seams::default();
    for engine in [LogEngine::Redb, LogEngine::Segment] {
        let dir = tempfile::tempdir().unwrap();
        for reopened in [false, true] {
            let (mut log, _sm) = log_store::open_engine(dir.path(), &seams, engine).unwrap();
            if !reopened {
                log.blocking_append(entries.clone()).await.unwrap();
            }
            let mut read = Vec::new();
            let mut pieces = Vec::new();
            while read.len() < entries.len() {
                let start = read.len() as u64 + 1;
                let piece = log.limited_get_log_entries(start, entries.len() as u64 + 1).await.unwrap();
                let bytes: usize = piece.iter().map(size).sum();
                assert!(!piece.is_empty(), "{engine:?} reopened {reopened}: a piece from {start}");
                assert!(piece.len() == 1 || bytes <= REPLICATION_BYTES, "{engine:?}: {bytes} bytes from {start}");
                pieces.push(piece.len());
                read.extend(piece);
            }
            assert_eq!(read, entries, "{engine:?} reopened {reopened}: the pieces make the log");
            let batches: usize = entries[..40].iter().map(size).sum();
            assert!(
                pieces.len() >= batches.div_ceil(REPLICATION_BYTES) + 2,
                "{engine:?} reopened {reopened}: {pieces:?}"
            );
            assert_eq!(pieces[pieces.len() - 2..], [1, 1], "{engine:?}: the large entry alone, then the last");
            let ranged = log.limited_get_log_entries(3, 5).await.unwrap();
            assert_eq!(ranged, entries[2..4].to_vec(), "{engine:?}: the range's end bounds a read first");
        }
    }
}

/// The redb log's crash points are where the chaos suite's failpoints expect
/// them: `log-before-fsync` with the append's transaction not yet committed
/// (its entry invisible to a reader), `log-after-fsync` once it is.
#[tokio::test]
async fn the_redb_logs_crash_points_are_around_its_commit() {
    #[derive(Debug, Default)]
    struct Seen {
        db: std::sync::OnceLock<Arc<redb::Database>>,
        events: std::sync::Mutex<Vec<(&'static str, bool)>>,
    }
    impl crate::seams::Hooks for Seen {
        fn crash_point(&self, point: crate::seams::CrashPoint) {
            let txn = self.db.get().expect("the store is open").begin_read().unwrap();
            let stored = txn.open_table(db::LOG).unwrap().get(5).unwrap().is_some();
            self.events.lock().unwrap().push((point.name(), stored));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Seen::default());
    let seams = crate::seams::Seams { hooks: Some(seen.clone()), ..crate::seams::Seams::default() };
    let (mut log, _sm) = log_store::open_engine(dir.path(), &seams, log_store::LogEngine::Redb).unwrap();
    seen.db.set(log.db().clone()).unwrap();
    log.blocking_append([blank(1, 5)]).await.unwrap();
    assert_eq!(*seen.events.lock().unwrap(), [("log-before-fsync", false), ("log-after-fsync", true)]);
}

#[tokio::test]
async fn log_vote_and_committed_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        blank(1, 1),
        membership(1, 2, &[1]),
        normal(1, 3, Input::leader_start(1_000)),
        normal(1, 4, Input::Batch { now: 1_100, cmds: vec![grant(7, 5_000)] }),
    ];
    {
        let (mut log, _sm) = open_storage(dir.path()).unwrap();
        // Two appends: one of three entries (one transaction), one of one.
        log.blocking_append(entries[..3].to_vec()).await.unwrap();
        log.blocking_append(entries[3..].to_vec()).await.unwrap();
        log.save_committed(Some(log_id(1, 3))).await.unwrap();
        // The vote is written after `committed`: its immediate commit makes both durable.
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
    }
    let (mut log, sm) = open_storage(dir.path()).unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, None);
    assert_eq!(state.last_log_id, Some(log_id(1, 4)));
    assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
    assert_eq!(log.try_get_log_entries(2..4).await.unwrap(), entries[1..3].to_vec());
    assert_eq!(log.try_get_log_entries(4..=4).await.unwrap(), entries[3..].to_vec());
    assert_eq!(log.try_get_log_entries(5..).await.unwrap(), vec![]);
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = log.try_get_log_entries(4..2).await.unwrap();
    assert_eq!(backwards, vec![]);
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new_committed(2, 1)));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 3)));
    // No snapshot yet: the state machine starts empty, openraft re-applies the log.
    let mut sm = sm;
    let (applied, mem) = sm.applied_state().await.unwrap();
    assert_eq!(applied, None);
    assert_eq!(mem, StoredMembership::default());
    assert_eq!(*sm.engine().read().unwrap(), Engine::new());
}

/// Entries written as JSON by earlier versions (a bare value, a frame V1
/// value) stay readable beside the entries new appends write in codec 2
/// (frame V2), and the log state is read from either.
#[tokio::test]
async fn old_json_entries_read_beside_new_coded_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(super::DB_FILE);
    let entries = vec![
        normal(1, 1, Input::leader_start(1_000)),
        membership(1, 2, &[1]),
        normal(1, 3, Input::Batch { now: 1_100, cmds: vec![grant(7, 5_000)] }),
    ];
    drop(open_storage(dir.path()).unwrap());
    {
        let db = redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(db::LOG).unwrap();
            table.insert(1, serde_json::to_vec(&entries[0]).unwrap().as_slice()).unwrap();
            table.insert(2, db::encode(&entries[1]).unwrap().as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    {
        let (mut log, _sm) = open_storage(dir.path()).unwrap();
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 2)));
        log.blocking_append(entries[2..].to_vec()).await.unwrap();
    }
    {
        let (mut log, _sm) = open_storage(dir.path()).unwrap();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 3)));
    }
    let db = redb::Database::open(&file).unwrap();
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(db::LOG).unwrap();
    let heads: Vec<u8> = (1..=3).map(|i| table.get(i).unwrap().unwrap().value()[0]).collect();
    assert_eq!(heads, [b'{', record::FRAME_V1, record::FRAME_V2]);
    assert_eq!(table.get(3).unwrap().unwrap().value()[1], codec::CODEC_PROTO);
}

#[tokio::test]
async fn truncate_and_purge_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open_storage(dir.path()).unwrap();
        log.blocking_append((1..=10).map(|i| blank(1, i))).await.unwrap();
        log.truncate(log_id(1, 8)).await.unwrap();
        log.purge(log_id(1, 3)).await.unwrap();
    }
    let (mut log, _sm) = open_storage(dir.path()).unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(1, 7)));
    let indexes: Vec<u64> = log.try_get_log_entries(..).await.unwrap().iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, vec![4, 5, 6, 7]);
    // Purging everything leaves the last purged id as the last log id.
    log.purge(log_id(1, 7)).await.unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 7)));
    assert_eq!(state.last_log_id, Some(log_id(1, 7)));
}

#[tokio::test]
async fn snapshot_restores_engine_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshot_meta, snapshotted_engine) = {
        let (_log, mut sm) = open_storage(dir.path()).unwrap();
        let outputs: Vec<Output> = sm
            .apply(vec![
                blank(1, 1),
                membership(1, 2, &[1]),
                normal(1, 3, Input::leader_start(1_000)),
                normal(1, 4, Input::Batch { now: 1_100, cmds: vec![grant(7, 5_000), grant(8, 9_000)] }),
            ])
            .await
            .unwrap();
        assert_eq!(outputs.len(), 4);
        assert_eq!(outputs[0], Output::default());
        assert_eq!(outputs[1], Output::default());
        assert_eq!(
            outputs[3].replies,
            vec![
                Reply::LeaseGranted { lease: LeaseId(1), ttl_ms: 5_000 },
                Reply::LeaseGranted { lease: LeaseId(2), ttl_ms: 9_000 },
            ]
        );
        let engine = sm.engine().read().unwrap().clone();
        assert_ne!(engine, Engine::new());

        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 4)));
        assert_eq!(snap.meta.last_membership.log_id(), &Some(log_id(1, 2)));

        // Applied after the snapshot: not in it, so gone after the restart (openraft
        // would re-apply it from the log).
        let out = sm.apply(vec![normal(1, 5, Input::Batch { now: 1_200, cmds: vec![grant(9, 1_000)] })]).await.unwrap();
        assert_eq!(out[0].replies, vec![Reply::LeaseGranted { lease: LeaseId(3), ttl_ms: 1_000 }]);
        assert_ne!(*sm.engine().read().unwrap(), engine);
        (snap.meta, engine)
    };

    let (_log, mut sm) = open_storage(dir.path()).unwrap();
    let (applied, mem) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 4)));
    assert_eq!(mem, snapshot_meta.last_membership);
    assert_eq!(*sm.engine().read().unwrap(), snapshotted_engine);
    let current = sm.get_current_snapshot().await.unwrap().expect("persisted snapshot");
    assert_eq!(current.meta, snapshot_meta);

    // The restored engine continues where the snapshot left off: the next lease is 3.
    let out = sm.apply(vec![normal(1, 5, Input::Batch { now: 1_200, cmds: vec![grant(9, 1_000)] })]).await.unwrap();
    assert_eq!(out[0].replies, vec![Reply::LeaseGranted { lease: LeaseId(3), ttl_ms: 1_000 }]);
}

/// The payload of a snapshot's data, read from its file (the bytes peers send).
pub(super) fn payload(snap: &openraft::Snapshot<TypeConfig>) -> Vec<u8> {
    std::fs::read(snap.snapshot.path()).unwrap()[record::HEADER..].to_vec()
}

/// The engine of a snapshot, decoded from its file.
fn decode(snap: &openraft::Snapshot<TypeConfig>) -> Engine {
    super::snapshot_payload::decode_received(&snap.meta, &payload(snap)[..]).unwrap().payload.engine
}

/// Applies entries 1-3: a one-member group, a leader start and one lease.
async fn one_member_one_lease(sm: &mut StateMachine) {
    sm.apply(vec![
        membership(1, 1, &[1]),
        normal(1, 2, Input::leader_start(1_000)),
        normal(1, 3, Input::Batch { now: 1_100, cmds: vec![grant(7, 5_000)] }),
    ])
    .await
    .unwrap();
}

/// A snapshot holds the state at the moment its builder was taken, whatever is
/// applied before it is built (openraft builds it on another task while applies
/// go on); the stored snapshot is the one built.
#[tokio::test]
async fn a_snapshot_holds_the_state_at_its_builder_and_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut sm) = open_storage(dir.path()).unwrap();
    one_member_one_lease(&mut sm).await;
    let at_builder = sm.engine().read().unwrap().clone();
    let mut builder = sm.get_snapshot_builder().await;
    sm.apply(vec![normal(1, 4, Input::Batch { now: 1_200, cmds: vec![grant(8, 5_000)] })]).await.unwrap();

    let snap = builder.build_snapshot().await.unwrap();
    assert_eq!(snap.meta.last_log_id, Some(log_id(1, 3)));
    let stored = sm.get_current_snapshot().await.unwrap().expect("the snapshot is stored");
    assert_eq!(stored.meta, snap.meta);
    let decoded = decode(&stored);
    assert_eq!(decoded, at_builder, "the state when the builder was taken");
    assert_ne!(decoded, *sm.engine().read().unwrap(), "not the state applied since");
    // A builder builds once: its copy is dropped once serialized.
    assert!(builder.build_snapshot().await.is_err());
}

#[tokio::test]
async fn installed_snapshot_replaces_state_and_survives_reopen() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let (_l, mut leader) = open_storage(leader_dir.path()).unwrap();
    leader
        .apply(vec![
            membership(1, 1, &[1, 2]),
            normal(1, 2, Input::leader_start(50)),
            normal(1, 3, Input::Batch { now: 60, cmds: vec![grant(1, 1_000)] }),
        ])
        .await
        .unwrap();
    leader.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let snap = leader.get_current_snapshot().await.unwrap().expect("stored");
    let leader_engine = leader.engine().read().unwrap().clone();
    {
        let (_f, mut follower) = open_storage(follower_dir.path()).unwrap();
        follower.apply(vec![blank(1, 1)]).await.unwrap();
        let mut rx = follower.begin_receiving_snapshot().await.unwrap();
        rx.write_all(&payload(&snap)).await.unwrap();
        follower.install_snapshot(&snap.meta, rx).await.unwrap();
        assert_eq!(*follower.engine().read().unwrap(), leader_engine);
        assert_eq!(follower.applied_state().await.unwrap().0, Some(log_id(1, 3)));
    }
    let (_f, mut follower) = open_storage(follower_dir.path()).unwrap();
    assert_eq!(*follower.engine().read().unwrap(), leader_engine);
    assert_eq!(follower.applied_state().await.unwrap(), (Some(log_id(1, 3)), snap.meta.last_membership.clone()));

    // Snapshot data that does not match its meta is refused.
    let mut bad_meta = snap.meta.clone();
    bad_meta.last_log_id = Some(log_id(1, 9));
    let stored = snapshot_files(follower_dir.path());
    let mut rx = follower.begin_receiving_snapshot().await.unwrap();
    rx.write_all(&payload(&snap)).await.unwrap();
    assert!(follower.install_snapshot(&bad_meta, rx).await.is_err());
    assert_eq!(follower.applied_state().await.unwrap().0, Some(log_id(1, 3)));
    assert_eq!(snapshot_files(follower_dir.path()), stored, "its file is removed, the stored one kept");
}

#[test]
fn second_open_of_a_data_dir_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let first = open_storage(dir.path()).unwrap();
    let err = open_storage(dir.path()).expect_err("second open must fail while the first is alive");
    let msg = err.to_string();
    eprintln!("second open: {msg}");
    assert!(msg.contains("already in use"), "message: {msg}");
    assert!(!msg.contains("DbError"), "no Rust type names for operators: {msg}");
    assert!(msg.contains("two servers cannot share one data directory"), "message: {msg}");
    assert!(msg.contains(&dir.path().display().to_string()), "message: {msg}");
    drop(first);
    open_storage(dir.path()).expect("reopen after the first handle is closed");
}

#[test]
fn open_creates_missing_directories() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b/c");
    open_storage(&nested).unwrap();
    assert!(nested.join(super::DB_FILE).is_file());
}

// ---------------------------------------------------------------------------
// network: a real group over gRPC on localhost

struct Node {
    raft: super::Raft,
    sm_engine: super::SharedEngine,
    _dir: TempDir,
    server: tokio::task::JoinHandle<()>,
    calls: Arc<Calls>,
}

/// What a node's Raft service was sent, by form.
#[derive(Default)]
struct Calls {
    /// `AppendEntriesV2` and `InstallSnapshotV2` calls (served, or refused as unimplemented).
    framed: std::sync::atomic::AtomicUsize,
    /// `AppendEntriesV2` calls alone.
    framed_appends: std::sync::atomic::AtomicUsize,
    /// `AppendEntriesStream`s opened (served, or refused as unimplemented).
    streams: std::sync::atomic::AtomicUsize,
    /// Appends answered on a stream.
    streamed: std::sync::atomic::AtomicUsize,
    /// `AppendEntries` and `InstallSnapshot` calls in JSON.
    json: std::sync::atomic::AtomicUsize,
    /// `InstallSnapshot` calls, framed or not: the chunks sent.
    snapshot_chunks: std::sync::atomic::AtomicUsize,
}

/// Which calls a peer serves: those of each fencelock version.
#[derive(Clone, Copy, PartialEq)]
enum Peer {
    /// This version: every call.
    Current,
    /// Before the append stream: it answers that UNIMPLEMENTED.
    NoStream,
    /// Before the framed calls: it answers those and the stream UNIMPLEMENTED.
    JsonOnly,
}

/// A node's [`RaftService`], counting the calls by form, serving those of `peer`.
struct Counted {
    svc: RaftService,
    calls: Arc<Calls>,
    peer: Peer,
}

impl Counted {
    fn framed(&self) -> Result<(), tonic::Status> {
        self.calls.framed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.peer {
            Peer::JsonOnly => Err(tonic::Status::unimplemented("an older fencelock")),
            Peer::Current | Peer::NoStream => Ok(()),
        }
    }

    fn json(&self) {
        self.calls.json.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

type Frame = tonic::Request<fencelock_proto::raft::RaftFrame>;
type Payload = tonic::Request<fencelock_proto::raft::RaftPayload>;
type Answer = Result<tonic::Response<fencelock_proto::raft::RaftPayload>, tonic::Status>;

#[tonic::async_trait]
impl fencelock_proto::raft::raft_server::Raft for Counted {
    async fn append_entries(&self, r: Payload) -> Answer {
        self.json();
        self.svc.append_entries(r).await
    }
    async fn vote(&self, r: Payload) -> Answer {
        self.svc.vote(r).await
    }
    async fn install_snapshot(&self, r: Payload) -> Answer {
        self.json();
        self.calls.snapshot_chunks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.svc.install_snapshot(r).await
    }
    async fn change_members(&self, r: Payload) -> Answer {
        self.svc.change_members(r).await
    }
    async fn change_policy(&self, r: Payload) -> Answer {
        self.svc.change_policy(r).await
    }
    async fn append_entries_v2(&self, r: Frame) -> Answer {
        self.framed()?;
        self.calls.framed_appends.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.svc.append_entries_v2(r).await
    }
    async fn install_snapshot_v2(&self, r: Frame) -> Answer {
        self.framed()?;
        self.calls.snapshot_chunks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.svc.install_snapshot_v2(r).await
    }

    type AppendEntriesStreamStream = super::network::AppendAnswers;

    async fn append_entries_stream(
        &self,
        r: tonic::Request<tonic::Streaming<fencelock_proto::raft::RaftFrame>>,
    ) -> Result<tonic::Response<super::network::AppendAnswers>, tonic::Status> {
        use futures::StreamExt as _;
        self.calls.streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.peer != Peer::Current {
            return Err(tonic::Status::unimplemented("an older fencelock"));
        }
        let calls = self.calls.clone();
        let answers = self.svc.append_entries_stream(r).await?.into_inner();
        let counted = answers.inspect(move |a| {
            if a.is_ok() {
                calls.streamed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Ok(tonic::Response::new(Box::pin(counted)))
    }
}

/// A node serving its Raft service over gRPC, as `peer` does.
async fn start_node(id: NodeId, listener: tokio::net::TcpListener, config: Arc<openraft::Config>, peer: Peer) -> Node {
    use fencelock_proto::raft::raft_server::RaftServer;
    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path()).unwrap();
    let sm_engine = sm.engine();
    let raft = super::Raft::new(id, config, Network::new(id, None), log, sm).await.unwrap();
    let calls = Arc::new(Calls::default());
    let svc = RaftService::new(raft.clone(), sm_engine.clone(), Default::default());
    let svc = RaftServer::new(Counted { svc, calls: calls.clone(), peer });
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder().add_service(svc).serve_with_incoming(incoming).await.unwrap();
    });
    Node { raft, sm_engine, _dir: dir, server, calls }
}

pub(super) fn test_config() -> Arc<openraft::Config> {
    let config = openraft::Config {
        cluster_name: "test".into(),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // Small chunks so that a snapshot goes in several install_snapshot RPCs.
        snapshot_max_chunk_size: 64,
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Default::default()
    };
    Arc::new(config.validate().unwrap())
}

/// Two voters elect a leader and replicate over gRPC; the leader compacts its log,
/// then a third node joins as a learner and can only catch up by a (chunked)
/// snapshot install over gRPC. Every node ends with the leader's engine. The
/// appends travel on a stream, the snapshot's chunks in frames: the learner
/// is sent no JSON call and no append call of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_and_install_snapshot_over_grpc() {
    let learner = replicate_and_install(Peer::Current).await;
    let n = |c: &std::sync::atomic::AtomicUsize| c.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n(&learner.streamed) > 0, "the learner was sent appends on a stream");
    assert_eq!(n(&learner.framed_appends), 0, "and no append call");
    assert!(n(&learner.framed) > 0, "the snapshot went in frames");
    assert_eq!(n(&learner.json), 0, "and no JSON call");
}

/// A group mixing versions: a learner from before the append stream answers
/// it UNIMPLEMENTED, and the leader then sends it an append call per
/// message; it catches up by snapshot and log, to the leader's engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_stream_is_sent_a_call_per_append() {
    let learner = replicate_and_install(Peer::NoStream).await;
    let n = |c: &std::sync::atomic::AtomicUsize| c.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n(&learner.streams) > 0, "a stream was tried first");
    assert_eq!(n(&learner.streamed), 0);
    assert!(n(&learner.framed_appends) > 0, "then append calls");
    assert_eq!(n(&learner.json), 0, "in frames");
}

/// A group mixing versions: a learner from before the framed calls answers
/// them UNIMPLEMENTED, and the leader then sends it the JSON calls; it
/// catches up by snapshot and log, to the leader's engine, all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_frames_is_sent_json() {
    let learner = replicate_and_install(Peer::JsonOnly).await;
    assert!(learner.framed.load(std::sync::atomic::Ordering::Relaxed) > 0, "a frame was tried first");
    assert!(learner.json.load(std::sync::atomic::Ordering::Relaxed) > 0, "then JSON calls");
}

/// The body of the tests above; node 3 (the learner) serves what `learner`
/// serves. Returns the learner's calls.
async fn replicate_and_install(learner: Peer) -> Arc<Calls> {
    let config = test_config();
    let mut listeners = Vec::new();
    let mut addrs = BTreeMap::new();
    for id in 1..=3u64 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.insert(id, Member::new(l.local_addr().unwrap().to_string()));
        listeners.push((id, l));
    }
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        nodes.insert(id, start_node(id, l, config.clone(), if id == 3 { learner } else { Peer::Current }).await);
    }
    let timeout = Some(Duration::from_secs(10));

    let n1 = &nodes[&1];
    let voters: BTreeMap<NodeId, Member> = [(1, addrs[&1].clone()), (2, addrs[&2].clone())].into();
    n1.raft.initialize(voters).await.unwrap();
    let leader = n1
        .raft
        .wait(timeout)
        .metrics(|m| m.current_leader.is_some(), "a leader")
        .await
        .unwrap()
        .current_leader
        .unwrap();
    let lraft = nodes[&leader].raft.clone();

    let w = lraft.client_write(Input::leader_start(10).into()).await.unwrap();
    assert_eq!(w.data, Output { next_deadline: None, ..Output::default() });
    let w = lraft
        .client_write(Input::Batch { now: 20, cmds: vec![grant(1, 60_000), grant(2, 60_000)] }.into())
        .await
        .unwrap();
    assert_eq!(
        w.data.replies,
        vec![
            Reply::LeaseGranted { lease: LeaseId(1), ttl_ms: 60_000 },
            Reply::LeaseGranted { lease: LeaseId(2), ttl_ms: 60_000 },
        ]
    );
    let last = w.log_id.index;
    for id in [1, 2] {
        nodes[&id].raft.wait(timeout).applied_index_at_least(Some(last), "voter applied").await.unwrap();
    }
    let leader_engine = nodes[&leader].sm_engine.read().unwrap().clone();
    for id in [1, 2] {
        assert_eq!(*nodes[&id].sm_engine.read().unwrap(), leader_engine, "node {id}");
    }

    // Compact the leader's log behind a snapshot.
    lraft.trigger().snapshot().await.unwrap();
    lraft.wait(timeout).snapshot(w.log_id, "snapshot built").await.unwrap();
    lraft.trigger().purge_log(last).await.unwrap();
    lraft.wait(timeout).purged(Some(w.log_id), "log purged").await.unwrap();

    // Node 3 can only be brought up to date by a snapshot.
    lraft.add_learner(3, addrs[&3].clone(), true).await.unwrap();
    nodes[&3].raft.wait(timeout).applied_index_at_least(Some(last), "learner applied").await.unwrap();
    let m3 = nodes[&3].raft.metrics().borrow().clone();
    assert_eq!(m3.snapshot, Some(w.log_id), "the learner got the leader's snapshot");
    assert_eq!(*nodes[&3].sm_engine.read().unwrap(), leader_engine);

    let learner = nodes[&3].calls.clone();
    for (_, n) in nodes {
        n.raft.shutdown().await.unwrap();
        n.server.abort();
    }
    learner
}

/// A group of three for [`a_wiped_follower_catches_up_by_a_chunked_snapshot_while_grants_go_on`]:
/// elections slow enough for a busy machine, chunks of 512 bytes.
fn chunking_config() -> Arc<openraft::Config> {
    let config = openraft::Config {
        cluster_name: "test".into(),
        heartbeat_interval: 200,
        election_timeout_min: 1_500,
        election_timeout_max: 3_000,
        snapshot_max_chunk_size: 512,
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Default::default()
    };
    Arc::new(config.validate().unwrap())
}

/// Grants a lease and takes a lock with it, one entry each, until `stop`;
/// counts the locks taken in `taken`.
async fn grant_until(raft: super::Raft, stop: Arc<std::sync::atomic::AtomicBool>, taken: Arc<AtomicU64>) {
    use fencelock_core::Acquire;
    let mut i = 1_000;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let granted = raft.client_write(Input::Batch { now: i, cmds: vec![grant(i, 60_000)] }.into()).await.unwrap();
        let Reply::LeaseGranted { lease, .. } = granted.data.replies[0] else { panic!("{:?}", granted.data) };
        let acquire = Command::Acquire(Acquire::exclusive(RequestId(i), lease, format!("g/{i}"), 0));
        let taken_now = raft.client_write(Input::Batch { now: i, cmds: vec![acquire] }.into()).await.unwrap();
        assert!(matches!(taken_now.data.replies[0], Reply::Acquired(_)), "{:?}", taken_now.data);
        taken.fetch_add(1, Ordering::Relaxed);
    }
}

/// Waits until `f` holds of `counter`, checking every few milliseconds (a
/// wait for progress, not a measure of time: the bound only ends a hung test).
async fn until(counter: &AtomicU64, f: impl Fn(u64) -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while !f(counter.load(Ordering::Relaxed)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    waited.await.expect("no progress");
}

/// Issue 38 §3 (no size cliff): a follower whose data dir is wiped is
/// removed from the group and added again with an empty one while grants
/// go on. The leader has purged its log behind a snapshot, so the follower
/// can only catch up by it, sent in many chunks, then by the log after it.
/// It ends with the leader's state and token counter (INV-2: what it grants
/// as leader later starts above every token granted before), and its
/// snapshot is the file it received, adopted: no other file is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_follower_catches_up_by_a_chunked_snapshot_while_grants_go_on() {
    let config = chunking_config();
    let timeout = Some(Duration::from_secs(30));
    let mut addrs = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.insert(id, Member::new(l.local_addr().unwrap().to_string()));
        nodes.insert(id, start_node(id, l, config.clone(), Peer::Current).await);
    }
    nodes[&1].raft.initialize(addrs.clone()).await.unwrap();
    let leader = nodes[&1].raft.wait(timeout).metrics(|m| m.current_leader.is_some(), "a leader").await.unwrap();
    let leader = leader.current_leader.unwrap();
    let lraft = nodes[&leader].raft.clone();
    lraft.client_write(Input::leader_start(10).into()).await.unwrap();
    let grants: Vec<Command> = (1..=300).map(|r| grant(r, 60_000)).collect();
    lraft.client_write(Input::Batch { now: 20, cmds: grants }.into()).await.unwrap();

    // Wipe a follower: out of the group, stopped, its data dir gone.
    let victim = *addrs.keys().find(|id| **id != leader).unwrap();
    let others: BTreeSet<NodeId> = addrs.keys().copied().filter(|id| *id != victim).collect();
    lraft.change_membership(others, false).await.unwrap();
    let wiped = nodes.remove(&victim).unwrap();
    wiped.raft.shutdown().await.unwrap();
    wiped.server.abort();
    drop(wiped);

    let (stop, taken) = (Arc::new(std::sync::atomic::AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let granting = tokio::spawn(grant_until(lraft.clone(), stop.clone(), taken.clone()));
    until(&taken, |n| n >= 5).await;
    let compacted = lraft.metrics().borrow().last_applied.unwrap();
    lraft.trigger().snapshot().await.unwrap();
    lraft.wait(timeout).metrics(|m| m.snapshot >= Some(compacted), "a snapshot").await.unwrap();
    let snapshot = lraft.metrics().borrow().snapshot.unwrap();
    lraft.trigger().purge_log(snapshot.index).await.unwrap();
    lraft.wait(timeout).metrics(|m| m.purged >= Some(snapshot), "the log purged").await.unwrap();

    // Back, empty: a snapshot is the only way in.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let member = Member::new(l.local_addr().unwrap().to_string());
    nodes.insert(victim, start_node(victim, l, config.clone(), Peer::Current).await);
    let before = taken.load(Ordering::Relaxed);
    lraft.add_learner(victim, member, true).await.unwrap();
    lraft.change_membership(addrs.keys().copied().collect::<BTreeSet<_>>(), false).await.unwrap();
    until(&taken, |n| n >= before + 5).await;
    stop.store(true, Ordering::Relaxed);
    granting.await.unwrap();

    let last = lraft.metrics().borrow().last_applied.map(|l| l.index);
    for (id, node) in &nodes {
        node.raft.wait(timeout).applied_index_at_least(last, "caught up").await.unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    let leader_engine = nodes[&leader].sm_engine.read().unwrap().clone();
    let back = &nodes[&victim];
    let engine = back.sm_engine.read().unwrap().clone();
    assert_eq!(engine.stats().token_counter, leader_engine.stats().token_counter, "INV-2");
    assert_eq!(engine, leader_engine);
    let m = back.raft.metrics().borrow().clone();
    let installed = m.snapshot.expect("it installed a snapshot");
    assert!(installed >= snapshot && m.last_applied > Some(installed), "then the log after it: {m:?}");
    let chunks = back.calls.snapshot_chunks.load(Ordering::Relaxed);
    assert!(chunks >= 20, "in many chunks: {chunks}");
    let files = snapshot_files(back._dir.path());
    assert!(files.len() == 1 && files[0].extension().is_some_and(|e| e == "snap"), "{files:?}");
    for (_, n) in nodes {
        n.raft.shutdown().await.unwrap();
        n.server.abort();
    }
}

/// A peer that does not listen is `Unreachable` (openraft backs off), not a
/// remote error.
#[tokio::test]
async fn unreachable_peer_maps_to_unreachable() {
    use openraft::error::RPCError;
    use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
    use openraft::raft::VoteRequest;

    // A port that was just free: bind, read the port, close.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut net = Network::new(1, None);
    let mut conn = net.new_client(2, &Member::new(addr.to_string())).await;
    let req = VoteRequest::new(Vote::new(1, 1), None);
    let err = conn.vote(req, RPCOption::new(Duration::from_secs(2))).await.unwrap_err();
    assert!(matches!(err, RPCError::Unreachable(_)), "got {err:?}");

    let mut bad = net.new_client(3, &Member::new("not a host:port".to_string())).await;
    let req = VoteRequest::new(Vote::new(1, 1), None);
    let err = bad.vote(req, RPCOption::new(Duration::from_secs(2))).await.unwrap_err();
    assert!(matches!(err, RPCError::Unreachable(_)), "got {err:?}");
}

/// The server answers malformed JSON with INVALID_ARGUMENT.
#[tokio::test]
async fn malformed_payload_is_invalid_argument() {
    use fencelock_proto::raft::raft_server::Raft as _;
    use fencelock_proto::raft::RaftPayload;

    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path()).unwrap();
    let engine = sm.engine();
    let raft = super::Raft::new(1, test_config(), Network::new(1, None), log, sm).await.unwrap();
    let svc = RaftService::new(raft.clone(), engine, Default::default());
    let status = svc.vote(tonic::Request::new(RaftPayload { json: b"{not json".to_vec() })).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // A well-formed vote gets openraft's answer, JSON-encoded.
    let req = openraft::raft::VoteRequest::<NodeId>::new(Vote::new(5, 2), None);
    let resp = svc.vote(tonic::Request::new(RaftPayload { json: serde_json::to_vec(&req).unwrap() })).await.unwrap();
    let answer: Result<openraft::raft::VoteResponse<NodeId>, openraft::error::RaftError<NodeId>> =
        serde_json::from_slice(&resp.into_inner().json).unwrap();
    let answer = answer.unwrap();
    assert!(answer.vote_granted);
    assert_eq!(answer.vote, Vote::new(5, 2));
    raft.shutdown().await.unwrap();
}

/// Issue 38 §3: a snapshot stream that would fill the follower's disk is
/// refused before its chunk is written, with RESOURCE_EXHAUSTED (the leader
/// backs off and sends again), and leaves no file.
#[tokio::test]
async fn a_snapshot_that_does_not_fit_on_the_disk_is_resource_exhausted() {
    use fencelock_proto::raft::raft_server::Raft as _;
    use fencelock_proto::raft::RaftPayload;

    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path()).unwrap();
    let engine = sm.engine();
    let raft = super::Raft::new(2, test_config(), Network::new(2, None), log, sm).await.unwrap();
    let full = super::snapshot_rx::Limits { reserve_bytes: u64::MAX / 2, ..Default::default() };
    let svc = RaftService::new(raft.clone(), engine, Default::default()).with_snapshot_limits(full);
    let req = openraft::raft::InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(1, 1),
        meta: openraft::SnapshotMeta {
            last_log_id: Some(log_id(1, 3)),
            snapshot_id: "big".into(),
            ..Default::default()
        },
        offset: 0,
        data: b"{}".to_vec(),
        done: false,
    };
    let json = serde_json::to_vec(&req).unwrap();
    let status = svc.install_snapshot(tonic::Request::new(RaftPayload { json })).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("do not fit"), "{}", status.message());
    assert!(snapshot_files(dir.path()).is_empty(), "{:?}", snapshot_files(dir.path()));
    raft.shutdown().await.unwrap();
}

/// A message meant for another node id (two members given one address) is
/// refused with a reason, before Raft sees it (INV-9); one for this node passes.
#[tokio::test]
async fn a_message_for_another_node_is_refused() {
    use fencelock_proto::raft::raft_server::Raft as _;
    use fencelock_proto::raft::RaftPayload;

    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path()).unwrap();
    let engine = sm.engine();
    let raft = super::Raft::new(2, test_config(), Network::new(2, None), log, sm).await.unwrap();
    let svc = RaftService::new(raft.clone(), engine, Default::default());
    let vote = |to: u64| {
        let req = openraft::raft::VoteRequest::<NodeId>::new(Vote::new(5, 1), None);
        let mut r = tonic::Request::new(RaftPayload { json: serde_json::to_vec(&req).unwrap() });
        r.metadata_mut().insert(super::network::TARGET_HEADER, to.into());
        r
    };
    let status = svc.vote(vote(3)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("this is node 2, not node 3"), "{}", status.message());
    assert!(svc.vote(vote(2)).await.is_ok());
    raft.shutdown().await.unwrap();
}

/// The append stream's input: a stream addressed to another node is refused
/// as it opens (INV-9); on an open one, a well-formed frame gets openraft's
/// answer, and one that does not decode gets INVALID_ARGUMENT, is counted as
/// refused, and ends the stream (the sender opens another).
#[tokio::test]
async fn the_append_stream_refuses_what_does_not_decode_and_ends() {
    use fencelock_proto::raft::{raft_client::RaftClient, RaftFrame};

    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path()).unwrap();
    let engine = sm.engine();
    let raft = super::Raft::new(2, test_config(), Network::new(2, None), log, sm).await.unwrap();
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let svc = RaftService::new(raft.clone(), engine, metrics.clone()).into_server();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tokio::spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming(incoming));
    let mut client = RaftClient::connect(format!("http://{addr}")).await.unwrap();
    let open = |to: u64| {
        let (tx, rx) = tokio::sync::mpsc::channel::<RaftFrame>(4);
        let mut r = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        r.metadata_mut().insert(super::network::TARGET_HEADER, to.into());
        (tx, r)
    };

    let (_tx, to_another) = open(3);
    let status = client.append_entries_stream(to_another).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("this is node 2, not node 3"), "{}", status.message());

    let (tx, to_this) = open(2);
    let mut answers = client.append_entries_stream(to_this).await.unwrap().into_inner();
    let head = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        leader_commit: None,
        entries: Vec::new(),
    };
    let frame = RaftFrame { head: serde_json::to_vec(&head).unwrap(), entries: Vec::new(), data: Vec::new() };
    tx.send(frame.clone()).await.unwrap();
    let answer = answers.message().await.unwrap().expect("an answer");
    let answer: Result<openraft::raft::AppendEntriesResponse<NodeId>, openraft::error::RaftError<NodeId>> =
        serde_json::from_slice(&answer.json).unwrap();
    assert!(answer.unwrap().is_success());
    assert_eq!(metrics.peer_messages_refused.load(Ordering::Relaxed), 0);

    tx.send(RaftFrame { head: b"{not json".to_vec(), ..frame.clone() }).await.unwrap();
    let status = answers.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("malformed raft frame head"), "{}", status.message());
    assert_eq!(metrics.peer_messages_refused.load(Ordering::Relaxed), 1);
    assert!(answers.message().await.unwrap_or(None).is_none(), "the stream ended");

    server.abort();
    raft.shutdown().await.unwrap();
}

/// A node's shutdown ends the append streams open to it: a graceful
/// shutdown waits for every open stream, and the leader never closes its own
/// (the container test's follower once waited out its 30 s for this).
#[tokio::test]
async fn a_shutdown_ends_the_open_append_streams() {
    use fencelock_proto::raft::{raft_client::RaftClient, RaftFrame};

    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path()).unwrap();
    let engine = sm.engine();
    let raft = super::Raft::new(2, test_config(), Network::new(2, None), log, sm).await.unwrap();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let svc = RaftService::new(raft.clone(), engine, Default::default()).with_stop(stop_rx.clone()).into_server();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let mut stopping = stop_rx.clone();
    let server = tokio::spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming_shutdown(
        incoming,
        async move {
            let _ = stopping.wait_for(|s| *s).await;
        },
    ));
    let mut client = RaftClient::connect(format!("http://{addr}")).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<RaftFrame>(4);
    let mut answers =
        client.append_entries_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let head = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        leader_commit: None,
        entries: Vec::new(),
    };
    tx.send(RaftFrame { head: serde_json::to_vec(&head).unwrap(), ..Default::default() }).await.unwrap();
    assert!(answers.message().await.unwrap().is_some(), "the stream is open and answers");

    stop.send(true).unwrap();
    let served = tokio::time::timeout(Duration::from_secs(20), server).await;
    assert!(
        served.is_ok(),
        "the server did not finish its shutdown with a stream open (tx still held: {})",
        !tx.is_closed()
    );
    assert!(!matches!(answers.message().await, Ok(Some(_))), "the stream ended");
    raft.shutdown().await.unwrap();
}

/// A crash while the database was being created leaves only the temporary file
/// (redb refuses a file whose header was cut between its two syncs): the next
/// start deletes it and creates the database again, and boots.
#[test]
fn a_half_created_database_is_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("fencelock.redb.creating");
    std::fs::write(&tmp, vec![0u8; 4096]).unwrap();
    let (_log, _sm) = super::open_storage(dir.path()).unwrap();
    assert!(dir.path().join("fencelock.redb").exists());
    assert!(!tmp.exists());
}

/// The snapshot files in `dir`'s `snap/`, sorted.
pub(super) fn snapshot_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join(snapshot_file::SNAP_DIR))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// Data dirs written before snapshot files keep the snapshot's data in the
/// table under `"data"`: a start reads it from there and moves it into a
/// file, and the next snapshot replaces that file; the key is gone.
#[tokio::test]
async fn a_snapshot_in_the_table_is_read_and_the_next_one_goes_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let engine = {
        let (log, mut sm) = open_storage(dir.path()).unwrap();
        one_member_one_lease(&mut sm).await;
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let snap = sm.get_current_snapshot().await.unwrap().expect("stored");
        // Rewritten to the layout before files.
        let txn = log.db().begin_write().unwrap();
        {
            let mut table = txn.open_table(db::SNAPSHOT).unwrap();
            table.insert("data", record::seal(&payload(&snap)).as_slice()).unwrap();
            table.remove("file").unwrap();
        }
        txn.commit().unwrap();
        std::fs::remove_dir_all(dir.path().join(snapshot_file::SNAP_DIR)).unwrap();
        let engine = sm.engine().read().unwrap().clone();
        engine
    };
    let (log, mut sm) = open_storage(dir.path()).unwrap();
    assert_eq!(*sm.engine().read().unwrap(), engine);
    assert_eq!(snapshot_files(dir.path()).len(), 1, "the start moved the snapshot into a file");
    sm.apply(vec![normal(1, 4, Input::Batch { now: 1_200, cmds: vec![grant(8, 5_000)] })]).await.unwrap();
    sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let keys: Vec<String> = {
        let txn = log.db().begin_read().unwrap();
        let table = txn.open_table(db::SNAPSHOT).unwrap();
        table.iter().unwrap().map(|kv| kv.unwrap().0.value().to_string()).collect()
    };
    assert_eq!(keys, ["file", "meta"]);
    assert_eq!(snapshot_files(dir.path()).len(), 1);
}

/// A snapshot file the database does not name (a crash left it, before or
/// after the database named another) is removed at the next start; a named
/// file that is missing stops the start (INV-10: a node never starts from
/// another state than the one it acknowledged).
#[tokio::test]
async fn an_unnamed_snapshot_file_is_removed_and_a_missing_named_one_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_log, mut sm) = open_storage(dir.path()).unwrap();
        sm.apply(vec![membership(1, 1, &[1]), normal(1, 2, Input::leader_start(1_000))]).await.unwrap();
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        sm.apply(vec![normal(1, 3, Input::Batch { now: 1_100, cmds: vec![grant(7, 5_000)] })]).await.unwrap();
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    }
    let named = snapshot_files(dir.path());
    assert_eq!(named.len(), 1, "the replaced file is gone: {named:?}");
    let snap = dir.path().join(snapshot_file::SNAP_DIR);
    std::fs::write(snap.join("00000000000000000009-1-1.snap.tmp"), b"torn").unwrap();
    std::fs::write(snap.join("00000000000000000009-1-2.snap"), b"never named").unwrap();
    drop(open_storage(dir.path()).unwrap());
    assert_eq!(snapshot_files(dir.path()), named);

    std::fs::remove_file(&named[0]).unwrap();
    let Err(err) = open_storage(dir.path()) else { panic!("a start without its snapshot is refused") };
    assert!(format!("{err:?}").contains("missing"), "{err:?}");
}

/// Rule (local reads, `local_read.rs`): applying an entry tells the group's
/// clock the engine's `now` against this node's clock then, so a follower
/// estimates the group's time with no task of its own; nothing applied,
/// no estimate.
#[tokio::test]
async fn applying_an_entry_tells_the_group_clock_its_now() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, sm) = open_storage(dir.path()).unwrap();
    let local = Arc::new(crate::clock::SetClock::default());
    let time = Arc::new(crate::local_read::GroupTime::default());
    let mut sm = sm.with_group_time(time.clone(), crate::clock::Clock::with_source(local.clone()));
    local.set(300);
    sm.apply(vec![membership(1, 1, &[1])]).await.unwrap();
    assert_eq!(time.at(300), None, "a membership entry moves no engine clock");
    sm.apply(vec![normal(1, 2, Input::leader_start(1_000))]).await.unwrap();
    assert_eq!(time.at(300), Some(1_000));
    assert_eq!(time.at(340), Some(1_040), "moved on by this node's clock");
    local.set(450);
    sm.apply(vec![normal(1, 3, Input::Batch { now: 1_100, cmds: vec![grant(7, 5_000)] })]).await.unwrap();
    assert_eq!(time.at(450), Some(1_100));
    assert_eq!(time.at(500), Some(1_150));
}
