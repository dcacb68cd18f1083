//! The node's stored snapshot: which one the database names, reading it
//! back, and storing a new one (built here, received from the leader, or
//! restored from a backup) as the current one, durably.
//!
//! Where it sits: under [`super::state_machine`], which calls it from its
//! openraft methods and at a start, and under [`super::check`], which reads
//! the stored snapshot of a data dir that is not running. The `raft_snapshot`
//! table of the database names the snapshot: `"meta"` (JSON of openraft's
//! `SnapshotMeta`) and `"file"` (the [`FileRef`] of its file in `snap/`, see
//! [`super::snapshot_file`]), written in one durable transaction after the
//! file is synced; data dirs of the layout before files hold the payload
//! under `"data"` instead, which a start moves into a file. A snapshot's
//! payload is read and written as a stream ([`super::snapshot_payload`]):
//! never whole in memory.

use std::io::{Seek, SeekFrom, Write};

use fencelock_core::Engine;
use openraft::LogId;
use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use super::db::{decode, encode, SNAPSHOT};
use super::db_error::DbError;
use super::record;
use super::snapshot_data::Parts;
use super::snapshot_file::{FileRef, Files, Opened, Sum};
use super::snapshot_payload::{self, Decoded, Membership, Meta, SnapshotPayload};
use super::NodeId;

/// openraft's meta of the stored snapshot.
const KEY_META: &str = "meta";
/// The [`FileRef`] of the snapshot's data.
const KEY_FILE: &str = "file";
/// The snapshot's data, in the layout before files (read, then dropped).
const KEY_DATA: &str = "data";

fn io_err(e: std::io::Error) -> DbError {
    DbError::Other(format!("cannot read or write a snapshot file: {e}"))
}

/// The name of snapshot key `key`, for errors.
fn snapshot_name(key: &str) -> impl Fn() -> String + '_ {
    move || format!("raft_snapshot[{key:?}]")
}

/// Where the stored snapshot's data is.
pub(super) enum Stored {
    /// In the file the database names.
    File(FileRef),
    /// In the table (its payload), in the layout before files.
    Table(Vec<u8>),
}

/// The persisted snapshot's meta and where its data is, if there is one.
pub(super) fn stored(db: &impl ReadableDatabase) -> Result<Option<(Meta, Stored)>, DbError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(SNAPSHOT)?;
    let meta: Option<Meta> = table.get(KEY_META)?.map(|m| decode(&snapshot_name(KEY_META), m.value())).transpose()?;
    let file: Option<FileRef> =
        table.get(KEY_FILE)?.map(|f| decode(&snapshot_name(KEY_FILE), f.value())).transpose()?;
    let Some(meta) = meta else {
        return match file {
            None => Ok(None),
            Some(_) => Err(DbError::Other("snapshot table holds data without meta".into())),
        };
    };
    if let Some(file) = file {
        return Ok(Some((meta, Stored::File(file))));
    }
    let data = table.get(KEY_DATA)?.map(|d| record::open(&snapshot_name(KEY_DATA), d.value()).map(<[u8]>::to_vec));
    match data.transpose()? {
        Some(data) => Ok(Some((meta, Stored::Table(data)))),
        None => Err(DbError::Other("snapshot table holds meta without data".into())),
    }
}

/// The payload of the stored snapshot of `meta`, decoded as it is read
/// (never whole in memory) and checked against its frame and its meta.
pub(super) fn decode_stored(files: &Files, meta: &Meta, stored: &Stored) -> Result<SnapshotPayload, DbError> {
    let payload = match stored {
        Stored::File(file) => {
            let opened = files.open(file)?;
            let (payload, sum) = snapshot_payload::decode(&opened.file);
            opened.check(sum)?;
            payload?
        }
        Stored::Table(data) => snapshot_payload::decode(&data[..]).0?,
    };
    snapshot_payload::check(meta, &payload)?;
    Ok(payload)
}

/// Reads the persisted snapshot, if any: its meta and its payload, checked
/// (see [`decode_stored`]).
pub(crate) fn read_snapshot(
    db: &impl ReadableDatabase,
    files: &Files,
) -> Result<Option<(Meta, SnapshotPayload)>, DbError> {
    let Some((meta, stored)) = stored(db)? else { return Ok(None) };
    let payload = decode_stored(files, &meta, &stored)?;
    Ok(Some((meta, payload)))
}

/// Whether the stored snapshot is past `meta`'s point of the log.
fn stored_is_newer(db: &Database, meta: &Meta) -> Result<bool, DbError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(SNAPSHOT)?;
    let existing = table.get(KEY_META)?;
    let existing: Option<Meta> = existing.map(|m| decode(&snapshot_name(KEY_META), m.value())).transpose()?;
    Ok(existing.is_some_and(|e| e.last_log_id > meta.last_log_id))
}

/// Persists the snapshot `meta` whose file `make` writes as the current
/// one, durably: its file first, then the database names it (see
/// [`super::snapshot_file`]). With `only_if_newer`, an already stored
/// snapshot with a greater last log id is kept and nothing is written (a
/// snapshot built concurrently with an install must not replace the
/// installed, newer one). The file stored, opened for reading, if it was.
fn store_snapshot(
    db: &Database,
    files: &Files,
    meta: &Meta,
    only_if_newer: bool,
    make: impl FnOnce() -> Result<FileRef, DbError>,
) -> Result<Option<Opened>, DbError> {
    let _held = files.lock();
    if only_if_newer && stored_is_newer(db, meta)? {
        return Ok(None);
    }
    let file = make()?;
    // Opened before it is named: a later snapshot may remove it, never the
    // handle.
    let named = files.open(&file).and_then(|opened| name_file(db, meta, &file, |_| Ok(())).map(|()| opened));
    let opened = match named {
        Ok(opened) => opened,
        Err(e) => {
            files.remove(&file);
            return Err(e);
        }
    };
    if let Err(e) = files.remove_replaced(&file.name) {
        // The snapshot is stored; the old file goes at the next start.
        tracing::warn!(error = %e, "cannot remove a replaced snapshot file");
    }
    Ok(Some(opened))
}

/// Names `file` as the data of the snapshot `meta` in one durable
/// transaction, with whatever else `also` writes in it; drops the data of the
/// layout before files.
fn name_file(
    db: &Database,
    meta: &Meta,
    file: &FileRef,
    also: impl FnOnce(&redb::WriteTransaction) -> Result<(), DbError>,
) -> Result<(), DbError> {
    let (meta_bytes, file_bytes) = (encode(meta)?, encode(file)?);
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    also(&txn)?;
    {
        let mut table = txn.open_table(SNAPSHOT)?;
        table.insert(KEY_META, meta_bytes.as_slice())?;
        table.insert(KEY_FILE, file_bytes.as_slice())?;
        table.remove(KEY_DATA)?;
    }
    txn.commit()?;
    Ok(())
}

/// Moves the snapshot `meta` stored in the table (the layout before files)
/// into a file.
pub(super) fn move_to_file(db: &Database, files: &Files, meta: &Meta, data: &[u8]) -> Result<(), DbError> {
    let index = meta.last_log_id.map(|l| l.index);
    store_snapshot(db, files, meta, false, || files.write(index, |out| out.write_all(data).map_err(io_err)))?;
    Ok(())
}

/// What the data of a snapshot to install decodes to: what the receiver
/// decoded when it checked it, or else decoded from its file (checked
/// against the frame's sum if it is a stored snapshot's).
pub(super) fn decode_parts(meta: &Meta, parts: &mut Parts) -> Result<Decoded, DbError> {
    let decoded = match parts.decoded.take() {
        Some(decoded) => decoded,
        None => {
            let mut file = &parts.file;
            file.seek(SeekFrom::Start(record::HEADER as u64)).map_err(io_err)?;
            let (payload, sum) = snapshot_payload::decode(file);
            if parts.expected.is_some_and(|expected| expected != sum) {
                let why = "its payload does not match its frame's checksum".to_string();
                return Err(DbError::Corrupt { record: parts.path.display().to_string(), why });
            }
            Decoded { payload: payload?, sum }
        }
    };
    snapshot_payload::check(meta, &decoded.payload)?;
    Ok(decoded)
}

/// Stores the snapshot `meta` whose data is in `parts` (its payload `sum`)
/// as the current one: a file received here is adopted (renamed into
/// place); any other (openraft's storage suite hands a follower the
/// leader's own) is copied, streamed.
pub(super) fn keep_file(db: &Database, files: &Files, meta: &Meta, parts: Parts, sum: Sum) -> Result<(), DbError> {
    let index = meta.last_log_id.map(|l| l.index);
    let Parts { path, file, temp, .. } = parts;
    if files.is_incoming(&path) && temp.keep().is_some() {
        store_snapshot(db, files, meta, false, || files.adopt(&path, file, index, sum))?;
        return Ok(());
    }
    let mut source = &file;
    source.seek(SeekFrom::Start(record::HEADER as u64)).map_err(io_err)?;
    let copy = |out: &mut dyn Write| std::io::copy(&mut source, out).map(drop).map_err(io_err);
    store_snapshot(db, files, meta, false, || files.write(index, copy))?;
    Ok(())
}

/// Streams `engine` at `meta` into a new snapshot file and names it as the
/// current snapshot, unless a newer one is stored; the file, opened for
/// reading, if it was stored. No copy of the data is in memory.
pub(super) fn serialize_and_store(
    db: &Database,
    files: &Files,
    meta: &Meta,
    engine: Engine,
) -> Result<Option<Opened>, DbError> {
    let index = meta.last_log_id.map(|l| l.index);
    store_snapshot(db, files, meta, true, || files.write(index, |out| snapshot_payload::write(meta, &engine, out)))
}

/// Seeds the empty database `db` with a restored group's first state: see
/// [`super::state_machine::seed_restored`].
pub(super) fn seed(
    db: &Database,
    files: &Files,
    last: LogId<NodeId>,
    membership: Membership,
    engine: &Engine,
) -> Result<(), DbError> {
    use super::db::{KEY_COMMITTED, KEY_LAST_PURGED, LOG, META};
    let meta =
        Meta { last_log_id: Some(last), last_membership: membership, snapshot_id: format!("restored-{}", last.index) };
    let last_bytes = encode(&last)?;
    let empty = |log: Option<u64>, snapshot: bool| match log.is_some() || snapshot {
        true => Err(DbError::Other("the database is not empty".into())),
        false => Ok(()),
    };
    {
        // Refused before the snapshot file is written (and again in the
        // transaction that names it).
        let txn = db.begin_read()?;
        let log = txn.open_table(LOG)?.last()?.map(|(k, _)| k.value());
        empty(log, txn.open_table(SNAPSHOT)?.get(KEY_META)?.is_some())?;
    }
    let _held = files.lock();
    let file = files.write(Some(last.index), |out| snapshot_payload::write(&meta, engine, out))?;
    let named = name_file(db, &meta, &file, |txn| {
        let log = txn.open_table(LOG)?.last()?.map(|(k, _)| k.value());
        empty(log, txn.open_table(SNAPSHOT)?.get(KEY_META)?.is_some())?;
        let mut raft_meta = txn.open_table(META)?;
        raft_meta.insert(KEY_LAST_PURGED, last_bytes.as_slice())?;
        raft_meta.insert(KEY_COMMITTED, last_bytes.as_slice())?;
        Ok(())
    });
    if named.is_err() {
        files.remove(&file);
    }
    named
}
