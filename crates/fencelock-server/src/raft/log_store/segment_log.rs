//! The log's entries in the segment log of [`crate::raft::wal`] (`log =
//! "segment"`, the default, see [`super::LogEngine`]): the [`EntryLog`] of
//! [`SegmentLog`].
//!
//! The writer of [`Wal`] does the IO (and fires the append's crash points,
//! around each batch's `fdatasync`), on the appending thread or the log's. Only the last purged log id is
//! written to redb here: a purge records it durably first, then lets the log
//! delete its segments (a crash in between leaves segments that the next
//! start removes).

use std::path::Path;

use futures::future::BoxFuture;
use openraft::{Entry, LogId};

use super::meta::Meta;
use super::EntryLog;
use crate::raft::db::{encode, KEY_COMMITTED, KEY_LAST_PURGED};
use crate::raft::db_error::DbError;
use crate::raft::wal::{self, Done, Wal};
use crate::raft::{NodeId, TypeConfig};
use crate::seams::Seams;

/// The entries in `<data dir>/wal/`.
pub(crate) struct SegmentLog {
    wal: Wal,
    meta: Meta,
}

impl SegmentLog {
    /// Opens the segment log of the data dir `dir`, from its last purged log id.
    ///
    /// The log must reach the committed log id recorded in redb (only durably
    /// appended entries get committed, and neither truncate nor purge goes below
    /// it): a log that ends before it lost its last segments, which a scan cannot
    /// see, and is refused.
    pub(crate) fn open(meta: Meta, dir: &Path, seams: &Seams) -> Result<SegmentLog, DbError> {
        let last_purged: Option<LogId<NodeId>> = meta.read(KEY_LAST_PURGED)?;
        let committed: Option<LogId<NodeId>> = meta.read(KEY_COMMITTED)?;
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
            _ => Ok(SegmentLog { wal, meta }),
        }
    }
}

impl EntryLog for SegmentLog {
    fn read(
        &self,
        lo: u64,
        hi: Option<u64>,
        max_bytes: usize,
    ) -> BoxFuture<'_, Result<Vec<Entry<TypeConfig>>, DbError>> {
        Box::pin(async move { Ok(self.wal.entries_within(lo, hi, max_bytes).await?) })
    }

    fn last_log_id(&self) -> Result<Option<LogId<NodeId>>, DbError> {
        Ok(self.wal.last_log_id())
    }

    fn last_index(&self) -> Result<Option<u64>, DbError> {
        Ok(self.wal.last_log_id().map(|l| l.index))
    }

    fn is_durable(&self, index: u64) -> bool {
        self.wal.is_durable(index)
    }

    fn append(&self, entries: Vec<Entry<TypeConfig>>, done: Done) -> BoxFuture<'_, Result<(), DbError>> {
        let queued = self.wal.append(entries, done).map_err(DbError::from);
        Box::pin(async move { queued })
    }

    fn truncate(&self, since: u64) -> BoxFuture<'_, Result<(), DbError>> {
        Box::pin(async move { Ok(self.wal.truncate(since).await?) })
    }

    /// Records `upto` as last purged (durably, with the committed log id),
    /// then lets the log drop its segments.
    fn purge(&self, upto: LogId<NodeId>) -> BoxFuture<'_, Result<(), DbError>> {
        Box::pin(async move {
            self.meta.write(KEY_LAST_PURGED, encode(&upto)?).await?;
            Ok(self.wal.purge(upto.index).await?)
        })
    }
}
