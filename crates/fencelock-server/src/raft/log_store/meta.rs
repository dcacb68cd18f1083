//! What the log store keeps in redb's meta table whichever engine holds the
//! entries: the vote, the last purged log id and the committed log id, which
//! is not written on its own but rides along with the next durable
//! transaction ([`Committed`]).
//!
//! Where it sits: [`super::LogStore`] reads and writes the vote and the
//! committed log id through [`Meta`]; both engines hold a clone, to write the
//! committed log id with their own transactions ([`super::redb_log`]) or the
//! last purged log id before they drop entries ([`super::segment_log`]).

use std::sync::{Arc, Mutex, PoisonError};

use openraft::LogId;
use redb::{Database, Durability, ReadableDatabase};
use serde::de::DeserializeOwned;

use crate::raft::db::{blocking, decode, encode, meta_name, KEY_COMMITTED, META};
use crate::raft::db_error::DbError;
use crate::raft::NodeId;

/// The database and the committed log id of this process. Cheap to clone;
/// clones share both.
#[derive(Clone)]
pub(crate) struct Meta {
    db: Arc<Database>,
    committed: Arc<LatestCommitted>,
}

impl Meta {
    pub(crate) fn new(db: Arc<Database>) -> Self {
        Meta { committed: Arc::new(LatestCommitted::new(db.clone())), db }
    }

    pub(crate) fn db(&self) -> &Arc<Database> {
        &self.db
    }

    /// The value of meta `key`, if set.
    pub(crate) fn read<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, DbError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        match table.get(key)? {
            Some(v) => Ok(Some(decode(&meta_name(key), v.value())?)),
            None => Ok(None),
        }
    }

    /// The committed log id as this process last saved it.
    pub(crate) fn committed(&self) -> Committed {
        self.committed.get()
    }

    /// Keeps `committed` for the next durable transaction.
    pub(crate) fn save_committed(&self, committed: Option<LogId<NodeId>>) {
        self.committed.set(committed);
    }

    /// What the next durable transaction writes of the committed log id.
    pub(crate) fn committed_to_write(&self) -> Result<CommittedWrite, DbError> {
        self.committed.get().to_write()
    }

    /// Writes one meta key, and the committed log id, in one durable transaction.
    pub(crate) async fn write(&self, key: &'static str, value: Vec<u8>) -> Result<(), DbError> {
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
pub(crate) enum Committed {
    /// Not saved by this process: redb's value stands.
    #[default]
    Unsaved,
    /// Saved: write this value (`None` removes the key).
    Saved(Option<LogId<NodeId>>),
}

/// What a durable transaction writes of the committed log id: `None` to leave
/// the key alone, `Some(None)` to remove it, `Some(Some(bytes))` to set it.
pub(crate) type CommittedWrite = Option<Option<Vec<u8>>>;

impl Committed {
    /// What a durable transaction writes (see [`CommittedWrite`]).
    fn to_write(self) -> Result<CommittedWrite, DbError> {
        match self {
            Committed::Unsaved => Ok(None),
            Committed::Saved(None) => Ok(Some(None)),
            Committed::Saved(Some(id)) => Ok(Some(Some(encode(&id)?))),
        }
    }
}

/// Writes `committed` (see [`CommittedWrite`]) into the meta table of a
/// write transaction.
pub(crate) fn put_committed(txn: &redb::WriteTransaction, committed: &CommittedWrite) -> Result<(), DbError> {
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
