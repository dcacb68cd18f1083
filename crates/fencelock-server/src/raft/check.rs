//! `fencelock check-data DIR`: verifies a data dir offline, as a start would
//! read it, without writing a byte.
//!
//! Where it sits: beside the log store and state machine, reading the same
//! tables through the same record codec (`record`). It checks every
//! record's checksum and decoding, that log keys are contiguous and match
//! their entries' indexes, that the snapshot describes the point its meta
//! names and is a consistent engine state, and then replays the log after the
//! snapshot into the engine (as a start and the next election do) and checks
//! the result. With the segment log (`log = "segment"`), the entries are read
//! from `wal/` through the same checks a start makes ([`super::wal`]).

use std::path::{Path, PathBuf};

use fencelock_core::{Engine, Stats};
use openraft::{Entry, EntryPayload, LogId};
use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable};
use serde::Serialize;

use super::db::{decode, decode_entry, entry_name, meta_name, DB_FILE, KEY_COMMITTED, KEY_LAST_PURGED, LOG, META};
use super::db_error::DbError;
use super::snapshot_store::read_snapshot;
use super::{NodeId, TypeConfig};

/// What a healthy data dir holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataReport {
    pub dir: PathBuf,
    /// Last log index covered by the snapshot, if there is one.
    pub snapshot_index: Option<u64>,
    /// Log entries stored, and the first and last index among them.
    pub entries: u64,
    pub first_index: Option<u64>,
    pub last_index: Option<u64>,
    pub committed_index: Option<u64>,
    /// The state after replaying the stored log onto the snapshot.
    pub stats: Stats,
    #[serde(skip)]
    pub engine: Engine,
}

/// Why a data dir does not pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    #[error("{0}: no such data directory")]
    Missing(PathBuf),
    #[error("{0}: the database file is missing or empty")]
    NoDatabase(PathBuf),
    #[error("{file}: cannot open the database: {source}")]
    Open { file: PathBuf, source: redb::DatabaseError },
    #[error("{dir}: {source}")]
    Corrupt { dir: PathBuf, source: DbError },
    #[error("{file}: the database is corrupt (redb could not read it: {why})")]
    Unreadable { file: PathBuf, why: String },
}

/// Checks the data dir `dir` (see the module docs).
pub fn check_data(dir: &Path) -> Result<DataReport, CheckError> {
    if !dir.is_dir() {
        return Err(CheckError::Missing(dir.to_path_buf()));
    }
    let file = dir.join(DB_FILE);
    if std::fs::metadata(&file).map(|m| m.len() == 0).unwrap_or(true) {
        return Err(CheckError::NoDatabase(file));
    }
    // redb 4.5 meets some corrupt bytes with `unreachable!()` (a table's type
    // byte, for one): a panic here is a corrupt file too, not a crash.
    let checked = std::panic::catch_unwind(|| {
        let corrupt = |source| CheckError::Corrupt { dir: dir.to_path_buf(), source };
        match ReadOnlyDatabase::open(&file) {
            Ok(db) => read_all(&db, dir).map_err(corrupt),
            // Not closed cleanly (a crash, a kill): redb repairs its allocator
            // state at the next open. Check a repaired copy; the data dir
            // itself is never written.
            Err(redb::DatabaseError::RepairAborted) => check_a_repaired_copy(&file, dir),
            Err(source) => Err(CheckError::Open { file: file.clone(), source }),
        }
    });
    checked.unwrap_or_else(|panic| Err(CheckError::Unreadable { file: file.clone(), why: panic_text(panic.as_ref()) }))
}

fn check_a_repaired_copy(file: &Path, dir: &Path) -> Result<DataReport, CheckError> {
    let copy = std::env::temp_dir().join(format!("fencelock-check-{}.redb", std::process::id()));
    let io = |source: std::io::Error| CheckError::Open { file: file.to_path_buf(), source: source.into() };
    std::fs::copy(file, &copy).map_err(io)?;
    let checked = match Database::builder().open(&copy) {
        Ok(db) => read_all(&db, dir).map_err(|source| CheckError::Corrupt { dir: dir.to_path_buf(), source }),
        Err(source) => Err(CheckError::Open { file: file.to_path_buf(), source }),
    };
    let _ = std::fs::remove_file(&copy);
    checked
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".into(),
    }
}

fn read_all(db: &impl ReadableDatabase, dir: &Path) -> Result<DataReport, DbError> {
    let (snapshot_index, mut engine) = match read_snapshot(db, &super::snapshot_file::Files::new(dir))? {
        Some((meta, payload)) => {
            let engine = payload.engine;
            engine.check_consistency().map_err(|why| corrupt("the snapshot", why))?;
            (meta.last_log_id.map(|l| l.index), engine)
        }
        None => (None, Engine::new()),
    };
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    let read_id = |key: &'static str| -> Result<Option<LogId<NodeId>>, DbError> {
        meta.get(key)?.map(|v| decode(&meta_name(key), v.value())).transpose()
    };
    let committed = read_id(KEY_COMMITTED)?.map(|l| l.index);
    let purged = read_id(KEY_LAST_PURGED)?.map(|l| l.index);
    let stored: Vec<(u64, Entry<TypeConfig>)> = match recorded_engine(&meta)? {
        // The segment log checks its own records, indexes and gaps.
        Some(engine) if engine == "segment" => {
            let wal = super::wal::segments::read(&dir.join(super::wal::WAL_DIR), purged)?;
            wal.into_iter().map(|e| (e.log_id.index, e)).collect()
        }
        _ => {
            let log = txn.open_table(LOG)?;
            let items = log.iter()?.map(|item| {
                let (k, v) = item?;
                Ok((k.value(), decode_entry(k.value(), v.value())?))
            });
            items.collect::<Result<_, DbError>>()?
        }
    };
    let (mut entries, mut first, mut prev) = (0u64, None, None::<u64>);
    for (index, entry) in stored {
        check_entry(index, &entry, prev, purged)?;
        // Every stored entry after the snapshot: a start re-applies the
        // committed ones, and the next leader commits the rest or replaces them
        // (a single node commits them all).
        let replay = snapshot_index.is_none_or(|s| index > s);
        if let (true, EntryPayload::Normal(d)) = (replay, &entry.payload) {
            engine.step(d.input());
        }
        entries += 1;
        first = first.or(Some(index));
        prev = Some(index);
    }
    reaches_committed(prev.or(purged), committed)?;
    engine.check_consistency().map_err(|why| corrupt("the replayed state", why))?;
    let stats = engine.stats();
    let report = DataReport {
        dir: dir.to_path_buf(),
        snapshot_index,
        entries,
        first_index: first,
        last_index: prev,
        committed_index: committed,
        stats,
        engine,
    };
    Ok(report)
}

/// The log, which ends at `last` (its last entry, else the purge point), must
/// reach the committed index, as a start requires: only durably appended
/// entries get committed, so a log that ends before it lost acknowledged
/// entries (a lost segment, or a changed byte in the last batch, which reads
/// as a torn write and is cut).
fn reaches_committed(last: Option<u64>, committed: Option<u64>) -> Result<(), DbError> {
    match committed {
        Some(c) if last.is_none_or(|l| l < c) => Err(corrupt(
            "the Raft log",
            format!(
                "it ends at index {}, before the committed index {c}: acknowledged entries are missing",
                last.map_or_else(|| "(none)".to_string(), |l| l.to_string())
            ),
        )),
        _ => Ok(()),
    }
}

/// The log engine the data dir records (`None`: redb).
fn recorded_engine(meta: &impl ReadableTable<&'static str, &'static [u8]>) -> Result<Option<String>, DbError> {
    let key = super::db::KEY_LOG_ENGINE;
    meta.get(key)?.map(|v| decode(&meta_name(key), v.value())).transpose()
}

/// A log entry sits under its own index, right after the previous one (or the
/// purge point). Also checked by a migration into the segment log
/// ([`super::wal::migrate`]), before it writes the entry.
pub(crate) fn check_entry(
    index: u64,
    entry: &Entry<TypeConfig>,
    prev: Option<u64>,
    purged: Option<u64>,
) -> Result<(), DbError> {
    if entry.log_id.index != index {
        return Err(corrupt(&entry_name(index)(), format!("holds the entry of index {}", entry.log_id.index)));
    }
    let expected = prev.or(purged).map_or(index, |p| p + 1);
    match prev.is_none() && purged.is_none() || index == expected {
        true => Ok(()),
        false => Err(corrupt(&entry_name(index)(), format!("follows index {:?}: the log has a gap", prev.or(purged)))),
    }
}

fn corrupt(record: &str, why: String) -> DbError {
    DbError::Corrupt { record: record.to_string(), why }
}
