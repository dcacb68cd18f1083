//! The node's redb database, `<data dir>/fencelock.redb`: its tables and keys,
//! how values are stored in it, and how it is opened (its errors are
//! [`super::db_error::DbError`]). Shared
//! by the log store ([`super::log_store`]: vote, committed and purged log ids,
//! and the entries with `log = "redb"`), the state machine's snapshot
//! ([`super::state_machine`]), the node's identity ([`super::identity`]) and
//! `fencelock check-data` ([`super::check`]).
//!
//! Layout (log entries are in the binary codec (`codec`), framed with
//! `record::seal_coded`; all other values are JSON, sealed with
//! `record::seal`):
//!
//! | table          | key            | value                                   |
//! |----------------|----------------|-----------------------------------------|
//! | `raft_log`     | log index, u64 | `openraft::Entry<TypeConfig>`           |
//! | `raft_meta`    | `"vote"`       | `Vote<u64>`                             |
//! |                | `"log_engine"` | `"segment"` when the log is in `wal/`    |
//! |                | `"identity"`   | see [`super::identity`]                 |
//! |                | `"committed"`  | `LogId<u64>`                            |
//! |                | `"last_purged"`| `LogId<u64>`                            |
//! | `raft_snapshot`| see [`super::state_machine`]                             |
//!
//! redb is synchronous, so every write transaction of a running node runs on
//! tokio's blocking pool (`blocking`) and is awaited: writes stay strictly
//! ordered (openraft awaits each storage call) without stalling the async
//! workers during an fsync.
#![allow(clippy::result_large_err)] // openraft's error types are large by design

use std::path::Path;

use openraft::Entry;
use redb::{Database, Durability, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::db_error::DbError;
use super::TypeConfig;
use super::{codec, record};
use crate::seams::Seams;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "fencelock.redb";

pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
pub(crate) const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_snapshot");

pub(crate) const KEY_VOTE: &str = "vote";
pub(crate) const KEY_COMMITTED: &str = "committed";
pub(crate) const KEY_LAST_PURGED: &str = "last_purged";
/// Which engine holds the log: absent for redb, `"segment"` for the segment
/// log (see [`super::log_store::LogEngine`]).
pub(crate) const KEY_LOG_ENGINE: &str = "log_engine";

/// redb's page cache. The log is purged behind snapshots, so the live data is small.
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Runs a synchronous redb job on the blocking pool and waits for it.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, DbError>
where
    F: FnOnce() -> Result<T, DbError> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(join) => Err(DbError::Other(format!("storage task failed: {join}"))),
    }
}

/// Decodes the stored value `bytes` of `record` (its name, for errors): its
/// checksum must match ([`record::open`]) and its JSON must decode.
pub(crate) fn decode<T: DeserializeOwned>(record: &dyn Fn() -> String, bytes: &[u8]) -> Result<T, DbError> {
    let payload = record::open(record, bytes)?;
    serde_json::from_slice(payload).map_err(|e| DbError::Corrupt { record: record(), why: e.to_string() })
}

/// `v` as a stored value: JSON sealed with its checksum.
pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, DbError> {
    Ok(record::seal(&serde_json::to_vec(v)?))
}

/// Log entry `entry` as a stored value: in the current codec
/// ([`codec::CODEC_CURRENT`]), sealed with its codec and checksum.
pub(crate) fn encode_entry(entry: &Entry<TypeConfig>) -> Result<Vec<u8>, DbError> {
    Ok(record::seal_coded(codec::CODEC_CURRENT, &codec::encode_entry(entry)?))
}

/// The log entry of index `index` stored as `bytes`: its checksum must match
/// and it must decode in the codec it names.
pub(crate) fn decode_entry(index: u64, bytes: &[u8]) -> Result<Entry<TypeConfig>, DbError> {
    let name = entry_name(index);
    let (c, payload) = record::open_coded(&name, bytes)?;
    Ok(codec::decode_entry(&name, c, payload)?)
}

/// The name of log entry `index`, for errors.
pub(crate) fn entry_name(index: u64) -> impl Fn() -> String {
    move || format!("raft_log[{index}]")
}

/// The name of meta key `key`, for errors.
pub(crate) fn meta_name(key: &str) -> impl Fn() -> String + '_ {
    move || format!("raft_meta[{key:?}]")
}

/// Opens (creating it and the data dir `dir` if needed) `dir/fencelock.redb`
/// through `seams`' storage backend. The error is a plain message naming the
/// directory (it is shown to operators), in particular when another process
/// (or another handle in this process) already has the database open: two
/// servers must never share one data directory.
pub(crate) fn open(dir: &Path, seams: &Seams) -> Result<Database, DbError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| DbError::Other(format!("cannot create data directory {}: {e}", dir.display())))?;
    let file = dir.join(DB_FILE);
    create_new(&file)?;
    seams.create_db(Database::builder().set_cache_size(CACHE_BYTES), &file).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => DbError::Other(format!(
            "data directory {} is already in use: the database {} is locked by another \
                 fencelock server (or another open handle); two servers cannot share one data \
                 directory",
            dir.display(),
            file.display()
        )),
        other => DbError::Other(format!("cannot open database {}: {other}", file.display())),
    })
}

/// Creates the tables once so that read transactions never meet a missing table.
pub(crate) fn create_tables(db: &Database) -> Result<(), DbError> {
    let txn = db.begin_write()?;
    {
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.open_table(SNAPSHOT)?;
    }
    txn.commit()?;
    Ok(())
}

/// Sets (or with `None` removes) meta `key`, durably, on the calling thread.
pub(crate) fn write_meta_now(db: &Database, key: &str, value: Option<Vec<u8>>) -> Result<(), DbError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut table = txn.open_table(META)?;
        match value {
            Some(v) => table.insert(key, v.as_slice())?,
            None => table.remove(key)?,
        };
    }
    txn.commit()?;
    Ok(())
}

/// Creates the database file if it does not exist, under a temporary name that is
/// renamed into place once redb has written and synced its header.
///
/// redb writes a new file's header in two synced steps; a crash between them leaves
/// a file that redb refuses ever after ("magic number mismatch"), although nothing
/// in it was acknowledged. Created aside, such a crash leaves only the temporary
/// file, which the next start deletes and creates again.
fn create_new(file: &Path) -> Result<(), DbError> {
    if file.exists() {
        return Ok(());
    }
    let tmp = file.with_extension("redb.creating");
    let io = |what: &str, e: std::io::Error| DbError::Other(format!("cannot {what} {}: {e}", tmp.display()));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove", e)),
        _ => {}
    }
    drop(
        Database::builder()
            .create(&tmp)
            .map_err(|e| DbError::Other(format!("cannot create {}: {e}", tmp.display())))?,
    );
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| io("sync", e))?;
    std::fs::rename(&tmp, file).map_err(|e| io("rename", e))?;
    if let Some(dir) = file.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("sync the directory of", e))?;
    }
    Ok(())
}
