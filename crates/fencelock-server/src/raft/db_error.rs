//! [`DbError`], any failure inside a storage operation of the Raft group: in
//! the database ([`super::db`]), the record framing (`record.rs`), the log
//! entry codec (`codec.rs`), the segment log ([`super::wal`]) or the snapshot
//! files. In a file of its own so that the framing and the codec, which the
//! database's value encoding is built on, can return it without importing
//! the database (an import circle before).

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageError, StorageIOError};

use super::NodeId;

/// Any failure inside a storage operation. Converted to openraft's [`StorageError`]
/// (with the subject and verb of the operation) at the trait boundary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Other(String),
    /// A stored record failed its check (see `record`).
    #[error("corrupt record {record}: {why}")]
    Corrupt { record: String, why: String },
    /// The segment log failed (see [`super::wal`]).
    #[error("{0}")]
    Wal(#[from] super::wal::WalError),
}

macro_rules! redb_into_db_error {
    ($($t:ty),*) => {$(
        impl From<$t> for DbError {
            fn from(e: $t) -> Self {
                DbError::Redb(e.into())
            }
        }
    )*};
}
redb_into_db_error!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError,
    redb::DatabaseError
);

impl From<super::codec::CodecError> for DbError {
    fn from(e: super::codec::CodecError) -> Self {
        match e {
            super::codec::CodecError::Json(e) => DbError::Json(e),
            super::codec::CodecError::Corrupt { record, why } => DbError::Corrupt { record, why },
        }
    }
}

impl DbError {
    pub(crate) fn into_storage(self, subject: ErrorSubject<NodeId>, verb: ErrorVerb) -> StorageError<NodeId> {
        StorageIOError::new(subject, verb, AnyError::new(&self)).into()
    }
}
