//! Moving a data dir's Raft log out of redb's `raft_log` table into the
//! segment log, once, on the first start with `log = "segment"`.
//!
//! Where it sits: called by `log_store/engine.rs` when the log store opens,
//! with the segment engine, a data dir whose database does not record an
//! engine (its log is redb's: a data dir written with `log = "redb"`, by a
//! build before the segment log, or a new one). It writes segments through
//! [`Segments`], the code the log thread writes with, and reads `raft_log`
//! through `db::decode_entry`, the code the redb engine reads with. The vote, the committed and the last purged log ids stay
//! where they are, in redb's meta table.
//!
//! Steps:
//! 1. [`build`]: every entry of `raft_log`, in index order, is decoded (a
//!    record that fails its check stops the start, naming it, as a redb start
//!    would), checked to follow on from the one before (or the purge point),
//!    and re-encoded with the current codec into fresh segments in
//!    `<data dir>/wal.migrating/`, which are synced; the log must reach the
//!    committed index (as a segment start checks);
//! 2. [`install`]: `wal.migrating/` is renamed to `wal/` and the data dir is
//!    synced;
//! 3. [`switch_engine`]: ONE redb write transaction, committed with
//!    `Durability::Immediate`, empties `raft_log` and records
//!    `log_engine = "segment"`.
//!
//! Which copy of the log is authoritative is decided by the redb commit of
//! step 3 alone: before it, `raft_log` (the database records no engine); after
//! it, `wal/`. There is no moment in which neither is, and a start never reads
//! both: with no engine recorded it reads only `raft_log`. So a crash at any
//! point before the commit leaves the data dir as it was, plus a `wal/` or a
//! `wal.migrating/` that nothing reads: the next start with `log = "segment"`
//! removes both ([`discard_leftovers`]) and migrates again from `raft_log`
//! (which a start with `log = "redb"` may have changed in between: the leftover
//! is never reused). A crash after the commit is a plain segment start.
//!
//! The way back (segments into redb) is not supported: see
//! `check_engine` in `log_store/engine.rs`.

use std::path::Path;

use openraft::LogId;
use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use crate::raft::check::check_entry;
use crate::raft::db::{self, KEY_COMMITTED, KEY_LAST_PURGED, KEY_LOG_ENGINE, LOG, META};
use crate::raft::db_error::DbError;
use crate::raft::wal::segments::{Rec, Segments};
use crate::raft::wal::{files_of, Options, WalError, WAL_DIR};
use crate::raft::NodeId;
use crate::seams::Seams;

/// Name of the segment log being built, inside the data directory.
pub const MIGRATING_DIR: &str = "wal.migrating";

/// Entries written to the segments with one `write` (the log thread's batches
/// are usually far smaller; this bounds the memory of a migration).
const CHUNK: usize = 1024;

/// What a migration moved: how many entries, and the first and last index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Migrated {
    pub entries: u64,
    pub first: Option<u64>,
    pub last: Option<u64>,
}

/// Moves the log of the data dir `dir` (database `db`, which records no log
/// engine) into `dir/wal/` and records the segment engine: the three steps of
/// the module docs, after removing what an unfinished migration left. Logs one
/// line when it moved any entries.
pub fn migrate(db: &Database, dir: &Path, seams: &Seams) -> Result<Migrated, DbError> {
    discard_leftovers(dir, seams)?;
    let moved = match build(db, dir, seams) {
        Ok(moved) => moved,
        Err(e) => {
            // Nothing reads it; the next start would remove it anyway.
            let _ = std::fs::remove_dir_all(dir.join(MIGRATING_DIR));
            return Err(e);
        }
    };
    install(dir, seams)?;
    switch_engine(db)?;
    if moved.entries > 0 {
        tracing::info!(
            entries = moved.entries,
            first_index = moved.first,
            last_index = moved.last,
            "moved the Raft log from redb (raft_log in {}) into the segment log in {}",
            dir.join(db::DB_FILE).display(),
            dir.join(WAL_DIR).display()
        );
    }
    Ok(moved)
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DbError + 'a {
    move |source| DbError::Wal(WalError::Io { what, path: path.to_path_buf(), source })
}

/// Removes `dir/wal.migrating/` and `dir/wal/`, left by a migration that did
/// not commit. Call only while the database records no engine: then neither is
/// read by anything.
pub fn discard_leftovers(dir: &Path, seams: &Seams) -> Result<(), DbError> {
    let mut removed = false;
    for name in [MIGRATING_DIR, WAL_DIR] {
        let path = dir.join(name);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::warn!(dir = %path.display(), "removing a segment log the database does not use (left by a start with --log-engine segment that did not finish)");
                removed = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("cannot remove", &path)(e)),
        }
    }
    if removed {
        files_of(seams).sync_dir(dir).map_err(io_err("cannot sync", dir))?;
    }
    Ok(())
}

/// Step 1: writes every entry of `raft_log` into fresh segments in
/// `dir/wal.migrating/` (which must not exist) and syncs them. Reads nothing
/// but `db`, writes nothing but that directory.
pub fn build(db: &Database, dir: &Path, seams: &Seams) -> Result<Migrated, DbError> {
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    let (purged, committed) = (index_of(&meta, KEY_LAST_PURGED)?, index_of(&meta, KEY_COMMITTED)?);
    let to = dir.join(MIGRATING_DIR);
    let (mut segs, stale) = Segments::open(&to, files_of(seams), Options::default().segment_bytes, purged, None)?;
    if !stale.entries.is_empty() {
        return Err(DbError::Other(format!("{} was not empty", to.display())));
    }
    let mut moved = Migrated::default();
    let mut chunk = Vec::with_capacity(CHUNK);
    for item in txn.open_table(LOG)?.iter()? {
        let (k, v) = item?;
        let mut entry = db::decode_entry(k.value(), v.value())?;
        check_entry(k.value(), &entry, moved.last, purged)?;
        chunk.push(Rec::encode(&mut entry)?);
        moved = Migrated { entries: moved.entries + 1, first: moved.first.or(Some(k.value())), last: Some(k.value()) };
        if chunk.len() == CHUNK {
            segs.write(&std::mem::take(&mut chunk))?;
        }
    }
    segs.write(&chunk)?;
    segs.sync()?;
    check_reaches(committed, moved.last.or(purged))?;
    Ok(moved)
}

/// The index of the log id stored in meta `key`, if any.
fn index_of(meta: &impl ReadableTable<&'static str, &'static [u8]>, key: &str) -> Result<Option<u64>, DbError> {
    let id: Option<LogId<NodeId>> = meta.get(key)?.map(|v| db::decode(&db::meta_name(key), v.value())).transpose()?;
    Ok(id.map(|l| l.index))
}

/// A log that ends at `last` must reach the committed index: the check a
/// segment start makes (`SegmentLog::open`), made before the move, which
/// could not be undone once it failed.
fn check_reaches(committed: Option<u64>, last: Option<u64>) -> Result<(), DbError> {
    match committed {
        Some(c) if last.is_none_or(|l| l < c) => Err(DbError::Other(format!(
            "the Raft log in redb (raft_log) ends at index {}, before the committed index {c}: it was not moved \
             into the segment log; run fencelock check-data on the data dir",
            last.map_or_else(|| "(none)".to_string(), |l| l.to_string()),
        ))),
        _ => Ok(()),
    }
}

/// Step 2: renames `dir/wal.migrating/` (built and synced) to `dir/wal/`
/// (which must not exist) and syncs `dir`.
pub fn install(dir: &Path, seams: &Seams) -> Result<(), DbError> {
    let (from, to) = (dir.join(MIGRATING_DIR), dir.join(WAL_DIR));
    std::fs::rename(&from, &to).map_err(io_err("cannot rename to wal/", &from))?;
    files_of(seams).sync_dir(dir).map_err(io_err("cannot sync", dir))
}

/// Step 3: in one durable redb transaction, empties `raft_log` and records
/// the segment engine. From its commit on, `wal/` holds the log.
pub fn switch_engine(db: &Database) -> Result<(), DbError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut log = txn.open_table(LOG)?;
        log.retain(|_, _| false)?;
        let mut meta = txn.open_table(META)?;
        meta.insert(KEY_LOG_ENGINE, db::encode(&"segment")?.as_slice())?;
    }
    txn.commit()?;
    Ok(())
}
