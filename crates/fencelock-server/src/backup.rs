//! Backups: a consistent copy of a running node's state (`GET /v1/snapshot` on
//! the admin port, `fencelock snapshot save`), and a new data dir built from one
//! (`fencelock snapshot restore`).
//!
//! Where it sits: beside the Raft storage. A backup is the engine as of one
//! linearizable read on the leader, in a versioned JSON document ([`Backup`]).
//! A restore never brings the old holders back: between the backup and the
//! restore the old group may have granted and released locks and issued more
//! tokens, so the restored group starts with no leases and no locks, and with
//! its token counter above every token that could have been issued: the
//! backup's counter plus `token_gap`, or `--min-token` taken from the fences'
//! highest marks, whichever is higher (etcd's restore sent revisions backwards
//! until it grew `--bump-revision`, etcd#16028). The restored node is a group of
//! one; grow it with `fencelock cluster add`.

use crate::raft::Member;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use fencelock_core::Engine;
use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};
use serde::{Deserialize, Serialize};

/// What a backup file says it is.
pub const FORMAT: &str = "fencelock-backup";
/// The backup format this binary writes and reads.
pub const VERSION: u32 = 1;
/// Default number of tokens a restore skips past the backup's counter: far
/// more than a group issues between a backup and its restore (2^32, about 50
/// days at a million grants a second).
pub const DEFAULT_TOKEN_GAP: u64 = 1 << 32;

/// A backup document.
#[derive(Debug, Serialize, Deserialize)]
pub struct Backup {
    pub format: String,
    pub version: u32,
    /// The node that took it, and its last applied log index then.
    pub node_id: u64,
    pub last_applied_index: Option<u64>,
    /// The last token issued before the backup (the engine's counter).
    pub last_token: u64,
    pub engine: Engine,
}

/// Why a backup could not be taken, read or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    #[error("not a fencelock backup: {0}")]
    Format(String),
    #[error("backup format version {found} is not one this binary reads (it reads version {VERSION}); use the fencelock release that wrote it")]
    Version { found: u32 },
    #[error("the backup's state is inconsistent: {0}")]
    Inconsistent(String),
    #[error("{dir}: {why}")]
    Target { dir: String, why: String },
    /// The restored state could not be written to the data dir.
    #[error("cannot write the restored state to {dir}")]
    Storage {
        dir: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Backup {
    /// A backup of `engine` (read under its lock, so consistent) on node `node_id`.
    pub fn of(engine: &Engine, node_id: u64, last_applied_index: Option<u64>) -> Backup {
        let last_token = engine.stats().token_counter;
        Backup {
            format: FORMAT.into(),
            version: VERSION,
            node_id,
            last_applied_index,
            last_token,
            engine: engine.clone(),
        }
    }

    /// Decodes and checks a backup file: its format, version and consistency.
    pub fn decode(bytes: &[u8]) -> Result<Backup, BackupError> {
        #[derive(Deserialize)]
        struct Head {
            format: String,
            version: u32,
        }
        let head: Head = serde_json::from_slice(bytes).map_err(|e| BackupError::Format(e.to_string()))?;
        if head.format != FORMAT {
            return Err(BackupError::Format(format!("its format is {:?}", head.format)));
        }
        if head.version != VERSION {
            return Err(BackupError::Version { found: head.version });
        }
        let backup: Backup = serde_json::from_slice(bytes).map_err(|e| BackupError::Format(e.to_string()))?;
        backup.engine.check_consistency().map_err(BackupError::Inconsistent)?;
        Ok(backup)
    }
}

/// How to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The restored node's id and gRPC address (the group of one it forms).
    pub node_id: u64,
    pub addr: String,
    /// The first token the restored group may issue is at least this (e.g. one
    /// above the highest mark any fence has seen).
    pub min_token: Option<u64>,
    /// Tokens skipped past the backup's counter.
    pub token_gap: u64,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restored {
    /// The first token the restored group will issue.
    pub next_token: u64,
    /// Leases and held locks of the backup that were dropped.
    pub dropped_leases: u64,
    pub dropped_locks: u64,
}

/// Builds a new data dir `dir` (absent or empty) holding `backup`'s state as a
/// group of one (see the module docs for what is kept and what is dropped).
pub fn restore(backup: &Backup, dir: &Path, opts: &RestoreOptions) -> Result<Restored, BackupError> {
    check_target(dir)?;
    let floor = backup.last_token.saturating_add(1).saturating_add(opts.token_gap).max(opts.min_token.unwrap_or(0));
    let engine = backup.engine.restored(floor);
    let last = LogId::new(CommittedLeaderId::new(1, opts.node_id), 1);
    let voters = vec![BTreeSet::from([opts.node_id])];
    let nodes = BTreeMap::from([(opts.node_id, Member::new(&opts.addr))]);
    let membership = StoredMembership::new(Some(last), Membership::new(voters, nodes));
    let storage = |source: Box<dyn std::error::Error + Send + Sync>| BackupError::Storage {
        dir: dir.display().to_string(),
        source,
    };
    let (_log, sm) = crate::raft::open_storage(dir).map_err(|e| storage(Box::new(e)))?;
    crate::raft::state_machine::seed_restored(&sm, last, membership, &engine).map_err(|e| storage(Box::new(e)))?;
    let stats = backup.engine.stats();
    Ok(Restored { next_token: engine.next_token(), dropped_leases: stats.leases, dropped_locks: stats.held_locks })
}

/// A restore writes only into a new or empty directory.
fn check_target(dir: &Path) -> Result<(), BackupError> {
    let target = |why: String| BackupError::Target { dir: dir.display().to_string(), why };
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(target(e.to_string())),
        Ok(false) => Err(target("is not empty: a restore writes only into a new or empty directory".into())),
        Ok(true) => Ok(()),
    }
}
