//! The log's entries in redb's `raft_log` table (`log = "redb"`, see
//! [`super::LogEngine`]): the [`EntryLog`] of [`RedbLog`].
//!
//! Every write is one redb write transaction committed with
//! [`Durability::Immediate`] (fsync before the call returns), run on the
//! blocking pool ([`blocking`]), and carries the latest committed log id
//! ([`super::meta::Committed`]). An append's crash points
//! ([`CrashPoint::LogBeforeFsync`], [`CrashPoint::LogAfterFsync`]) are around
//! its commit.

use std::io;
use std::ops::Bound;

use futures::future::BoxFuture;
use openraft::{Entry, LogId};
use redb::{Durability, ReadableDatabase, ReadableTable};

use super::meta::{put_committed, Meta};
use super::EntryLog;
use crate::raft::db::{blocking, decode_entry, encode, encode_entry, KEY_LAST_PURGED, LOG, META};
use crate::raft::db_error::DbError;
use crate::raft::wal::Done;
use crate::raft::{NodeId, TypeConfig};
use crate::seams::{CrashPoint, Seams};

/// The entries in `raft_log`, in the database of `meta`.
pub(crate) struct RedbLog {
    meta: Meta,
    /// Hooks at the append's crash points (see [`crate::seams`]).
    seams: Seams,
}

impl RedbLog {
    pub(crate) fn new(meta: Meta, seams: Seams) -> Self {
        RedbLog { meta, seams }
    }

    /// Runs `edit` on `raft_log` (and `raft_meta`) in one durable transaction
    /// that also writes the committed log id; `point`, if any, is the crash
    /// point just before the commit.
    async fn write<F>(&self, edit: F, point: Option<CrashPoint>) -> Result<(), DbError>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), DbError> + Send + 'static,
    {
        let db = self.meta.db().clone();
        let committed = self.meta.committed_to_write()?;
        let seams = self.seams.clone();
        blocking(move || {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            edit(&txn)?;
            put_committed(&txn, &committed)?;
            if let Some(point) = point {
                seams.crash_point(point);
            }
            txn.commit()?;
            Ok(())
        })
        .await
    }

    /// The entries with indexes in `lo..hi`, as many from `lo` as fit in
    /// `max_bytes` of stored values (at least one), read in one redb
    /// transaction.
    fn read_now(&self, lo: u64, hi: Option<u64>, max_bytes: usize) -> Result<Vec<Entry<TypeConfig>>, DbError> {
        let txn = self.meta.db().begin_read()?;
        let table = txn.open_table(LOG)?;
        let range = table.range::<u64>((Bound::Included(lo), hi.map_or(Bound::Unbounded, Bound::Excluded)))?;
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        for item in range {
            let (k, v) = item?;
            bytes = bytes.saturating_add(v.value().len());
            if bytes > max_bytes && !out.is_empty() {
                break;
            }
            out.push(decode_entry(k.value(), v.value())?);
        }
        Ok(out)
    }
}

impl EntryLog for RedbLog {
    fn read(
        &self,
        lo: u64,
        hi: Option<u64>,
        max_bytes: usize,
    ) -> BoxFuture<'_, Result<Vec<Entry<TypeConfig>>, DbError>> {
        let read = self.read_now(lo, hi, max_bytes);
        Box::pin(async move { read })
    }

    fn last_log_id(&self) -> Result<Option<LogId<NodeId>>, DbError> {
        let txn = self.meta.db().begin_read()?;
        let log = txn.open_table(LOG)?;
        let id = match log.last()? {
            Some((k, v)) => Some(decode_entry(k.value(), v.value())?.log_id),
            None => None,
        };
        Ok(id)
    }

    fn last_index(&self) -> Result<Option<u64>, DbError> {
        let txn = self.meta.db().begin_read()?;
        let log = txn.open_table(LOG)?;
        let last = log.last()?.map(|(k, _)| k.value());
        Ok(last)
    }

    /// Always: an append returns once committed.
    fn is_durable(&self, _index: u64) -> bool {
        true
    }

    /// All `entries` go into ONE write transaction (one fsync per call);
    /// `done` is called after the commit returned.
    fn append(&self, entries: Vec<Entry<TypeConfig>>, done: Done) -> BoxFuture<'_, Result<(), DbError>> {
        Box::pin(async move {
            let encoded: Result<Vec<_>, DbError> =
                entries.iter().map(|e| Ok((e.log_id.index, encode_entry(e)?))).collect();
            let encoded = match encoded {
                Ok(encoded) => encoded,
                Err(e) => {
                    done(Err(io::Error::other(e.to_string())));
                    return Err(e);
                }
            };
            let insert = move |txn: &redb::WriteTransaction| {
                let mut table = txn.open_table(LOG)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice())?;
                }
                Ok(())
            };
            let res = self.write(insert, Some(CrashPoint::LogBeforeFsync)).await;
            match res {
                Ok(()) => {
                    self.seams.crash_point(CrashPoint::LogAfterFsync);
                    done(Ok(()));
                    Ok(())
                }
                Err(e) => {
                    done(Err(io::Error::other(e.to_string())));
                    Err(e)
                }
            }
        })
    }

    fn truncate(&self, since: u64) -> BoxFuture<'_, Result<(), DbError>> {
        let delete = move |txn: &redb::WriteTransaction| {
            txn.open_table(LOG)?.retain_in::<u64, _>(since.., |_, _| false)?;
            Ok(())
        };
        Box::pin(self.write(delete, None))
    }

    /// Records `upto` as last purged and deletes the entries up to it, in one
    /// transaction.
    fn purge(&self, upto: LogId<NodeId>) -> BoxFuture<'_, Result<(), DbError>> {
        Box::pin(async move {
            let bytes = encode(&upto)?;
            let record_and_delete = move |txn: &redb::WriteTransaction| {
                txn.open_table(META)?.insert(KEY_LAST_PURGED, bytes.as_slice())?;
                txn.open_table(LOG)?.retain_in::<u64, _>(..=upto.index, |_, _| false)?;
                Ok(())
            };
            self.write(record_and_delete, None).await
        })
    }
}
