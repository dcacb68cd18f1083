//! The data dir's identity: which group and which node a data dir belongs to,
//! in what on-disk format, checked before the node serves anything.
//!
//! Where it sits: [`open`] wraps [`super::log_store::open`] for the server's
//! start-up; [`watch`] runs beside the driver while the node serves.
//!
//! # What is stored
//! One JSON value under the key `"identity"` of the `raft_meta` table:
//! the on-disk format version ([`FORMAT_VERSION`]), this node's id, the id this
//! node proposes for its group, and the group's cluster id once this node has
//! applied it.
//!
//! # Start-up rules
//! - The data dir does not exist: a first start. It is created, the identity is
//!   written, and one log line says so.
//! - It exists but is empty, or has no database, or a zero-byte database, or a
//!   database without an identity and without any Raft state (in the database
//!   or, on the segment log, in `wal/`): refused. That is
//!   what a lost volume, a wiped directory or a start from the wrong working
//!   directory looks like, and starting a new group there silently would hand
//!   out grants that contradict the old group's.
//! - Its node id differs from `--node-id`, or its format is newer than this
//!   binary reads: refused, saying which.
//! - `--force-new-cluster` turns every refusal into a fresh start: a refused
//!   database is moved aside (renamed `fencelock.redb.set-aside-N`, never
//!   deleted) and a new one is created.
//! - A database with Raft state but no identity (written before identities
//!   existed) is adopted: the identity is added, the state is kept. Its log,
//!   in redb then, moves into the segment log on that start if it is on the
//!   segment log; the entries count as Raft state wherever they are.
//! - The identity is checked before the open changes anything: a data dir of
//!   another node, or of a newer format, is refused with its log unmoved.
//!
//! # How every member gets the same cluster id
//! Members of a `--peers` group bootstrap independently with the same voter
//! list, so no node can pick the id alone. Instead the id is part of the
//! replicated state: every node proposes a random id of its own in each
//! `LeaderStart` it writes, and the engine adopts the first one it applies and
//! never changes it ([`fencelock_core::Engine::cluster_id`]). The first leader's
//! first entry therefore fixes the group's id, every member applies the same
//! entry, and snapshots carry it. [`watch`] records the applied id in the
//! member's own identity; a joining node (`--join`) learns it the same way. A
//! group formed by an older version gets the id of its first leader after the
//! upgrade. A node whose recorded id differs from the applied one stops
//! serving (its data dir and its group disagree).
//!
//! # While serving
//! [`watch`] checks every [`WATCH_EVERY`] that the database path still names
//! the file that was opened (same device and inode): a data dir deleted or
//! replaced under a running server is noticed and the node fails closed (its
//! Raft node is shut down, so nothing more is acknowledged) instead of granting
//! from a file that no longer exists on disk.
#![allow(clippy::result_large_err)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock_core::ClusterId;
use redb::{Database, ReadableDatabase, ReadableTableMetadata};
use serde::{Deserialize, Serialize};
use tokio::sync::watch as tokio_watch;

use super::db::{self, DB_FILE, META, SNAPSHOT};
use super::db_error::DbError;
use super::log_store::{Admit, LogStore};
use super::state_machine::{read_engine, SharedEngine, StateMachine};
use super::{Bootstrap, NodeId, Raft};

/// The on-disk format this binary writes and reads. A data dir with a higher
/// number was written by a newer fencelock and is refused; one with a lower
/// number is moved to this one when it is opened (`upgrade`).
///
/// - 1: identities.
/// - 2: a snapshot's data in a file of `snap/` (see
///   `snapshot_file`), which format 1 cannot read.
pub const FORMAT_VERSION: u32 = 2;

const KEY_IDENTITY: &str = "identity";

/// How often [`watch`] looks at the data dir.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Who a data dir belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The on-disk format version it was written in.
    pub format: u32,
    /// The node this data dir belongs to.
    pub node_id: u64,
    /// The id this node proposes if it is its group's first leader.
    pub proposed: ClusterId,
    /// The group's id, once this node has applied the entry that fixed it.
    pub cluster_id: Option<ClusterId>,
}

/// The identity of the running node; shared with [`watch`], which fills in the
/// cluster id once it is applied.
#[derive(Debug, Clone)]
pub struct SharedIdentity(Arc<Mutex<Identity>>);

impl SharedIdentity {
    /// The group's cluster id, once known on this node (`None` before its
    /// first `LeaderStart` is applied here). The check of incoming snapshots
    /// and peer messages against it is the caller's.
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.get().cluster_id
    }

    /// A copy of the whole identity.
    pub fn get(&self) -> Identity {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set_cluster_id(&self, id: ClusterId) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).cluster_id = Some(id);
    }
}

/// Why a data dir was refused, or its identity could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    #[error(
        "data directory {dir} exists but is empty; a node's data is never in an empty directory \
         (a volume not mounted? a directory wiped?). Point --data-dir at the node's data, or start \
         a new group here deliberately with --force-new-cluster"
    )]
    EmptyDir { dir: PathBuf },
    #[error(
        "data directory {dir} has no database {DB_FILE} (but other files); point --data-dir at the \
         node's data, or start a new group here deliberately with --force-new-cluster"
    )]
    NoDatabase { dir: PathBuf },
    #[error(
        "the database {file} is empty (zero bytes): its data is lost; restore the data dir from a \
         backup, or start a new group deliberately with --force-new-cluster (the empty file is \
         moved aside)"
    )]
    ZeroBytes { file: PathBuf },
    #[error(
        "the database {file} has no identity and no Raft state (never initialized, or wiped); \
         start a new group deliberately with --force-new-cluster (the file is moved aside)"
    )]
    NoIdentity { file: PathBuf },
    #[error(
        "data directory {dir} belongs to node {stored} (cluster {cluster}), not to --node-id \
         {flag}: start it with --node-id {stored}, or give node {flag} its own --data-dir \
         (--force-new-cluster moves this database aside and starts node {flag} afresh here)"
    )]
    OtherNode { dir: PathBuf, stored: u64, flag: u64, cluster: String },
    #[error(
        "the database {file} is in on-disk format {found}; this fencelock reads up to format \
         {FORMAT_VERSION}: run a newer fencelock"
    )]
    NewerFormat { file: PathBuf, found: u32 },
    #[error("data directory {dir}: {what}: {source}")]
    Io { dir: PathBuf, what: String, source: std::io::Error },
    /// Reading or writing the identity in the database failed.
    #[error(transparent)]
    Storage(#[from] DbError),
    /// The database could not be opened (locked by another server, unreadable):
    /// the cause openraft's storage error carries, or that error itself.
    #[error("cannot open the database")]
    Open(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What the data dir looks like before it is opened.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// No directory: a first start.
    Nothing,
    /// A directory with a non-empty database file in it.
    Database,
}

/// The node whose data dir [`open`] opens, as much as it needs to know of it.
pub struct Node<'a> {
    /// The data dir.
    pub dir: &'a Path,
    pub id: NodeId,
    /// `--force-new-cluster`: a refused data dir is set aside and a new group
    /// begun in it.
    pub force_new_cluster: bool,
    /// How the node comes into a group (said in the line a first start logs).
    pub bootstrap: &'a Bootstrap,
    /// Opens the storage with the node's seams and log engine
    /// ([`super::log_store::open_admitted`]), asking `admit` before anything
    /// in the data dir is changed.
    pub storage: &'a dyn Fn(Admit<'_>) -> Opened,
}

/// The storage as [`Node::storage`] opens it: the log and the state machine.
pub type Opened = Result<(LogStore, StateMachine), openraft::StorageError<NodeId>>;

/// Opens the data dir of `node` for serving: checks and creates its identity
/// (see the module docs) and opens the storage. Logs one line on a first start.
pub fn open(node: &Node<'_>) -> Result<(LogStore, StateMachine, SharedIdentity), IdentityError> {
    match open_checked(node) {
        Err(refused) if node.force_new_cluster && refused.is_refusal() => {
            let dir = node.dir;
            tracing::warn!("--force-new-cluster: starting a new group in {} ({refused})", dir.display());
            set_aside(dir)?;
            let (log, sm) = open_storage(node)?;
            let identity = first_start(node, &log)?;
            Ok((log, sm, SharedIdentity(Arc::new(Mutex::new(identity)))))
        }
        other => other,
    }
}

/// [`open`] without `--force-new-cluster`. On a refusal the database is closed
/// again before this returns.
fn open_checked(node: &Node<'_>) -> Result<(LogStore, StateMachine, SharedIdentity), IdentityError> {
    let dir = node.dir;
    let found = inspect(dir)?;
    let (log, sm) = open_storage(node)?;
    let identity = match read(log.db()).map_err(storage)? {
        None if found == Found::Nothing => first_start(node, &log)?,
        None if has_raft_state(&log).map_err(storage)? => adopt(node, &log)?,
        None => return Err(IdentityError::NoIdentity { file: dir.join(DB_FILE) }),
        // Checked by `open_storage`, before the open could change anything.
        Some(id) => id,
    };
    Ok((log, sm, SharedIdentity(Arc::new(Mutex::new(identity)))))
}

impl IdentityError {
    /// A refusal of the data dir's contents (which `--force-new-cluster`
    /// overrides), rather than a failure to read or write it (which nothing
    /// overrides: a database in use by another server among them).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, IdentityError::Io { .. } | IdentityError::Storage(_) | IdentityError::Open(_))
    }
}

/// Opens the storage, checking a recorded identity before the open may change
/// anything (move a redb log into segments): a data dir of another node, or of
/// a newer format, is refused untouched.
fn open_storage(node: &Node<'_>) -> Result<(LogStore, StateMachine), IdentityError> {
    let refused = std::cell::RefCell::new(None);
    let admit = |db: &redb::Database| match read(db)
        .map_err(storage)
        .and_then(|id| id.map_or(Ok(()), |id| check(node, &id).and_then(|()| upgrade(node, db, id))))
    {
        Ok(()) => Ok(()),
        Err(e) => {
            let why = e.to_string();
            *refused.borrow_mut() = Some(e);
            Err(why)
        }
    };
    let opened = (node.storage)(&admit);
    opened.map_err(|e| refused.take().unwrap_or_else(|| IdentityError::Open(cause_of(e))))
}

/// The cause inside openraft's storage error, whose own text repeats it
/// ("when Read Store: <cause>"), else that error itself.
fn cause_of(e: openraft::StorageError<NodeId>) -> Box<dyn std::error::Error + Send + Sync> {
    let inner = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<openraft::AnyError>()).cloned();
    match inner {
        Some(cause) => Box::new(cause),
        None => Box::new(e),
    }
}

/// What `dir` holds, or why it is refused.
fn inspect(dir: &Path) -> Result<Found, IdentityError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| IdentityError::Io { dir: dir.to_path_buf(), what, source }
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Nothing),
        Err(e) => return Err(io("cannot read it")(e)),
        Ok(_) => {}
    }
    let file = dir.join(DB_FILE);
    match std::fs::metadata(&file) {
        Ok(m) if m.len() == 0 => Err(IdentityError::ZeroBytes { file }),
        Ok(_) => Ok(Found::Database),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let empty = std::fs::read_dir(dir).map_err(io("cannot list it"))?.next().is_none();
            let dir = dir.to_path_buf();
            Err(if empty { IdentityError::EmptyDir { dir } } else { IdentityError::NoDatabase { dir } })
        }
        Err(e) => Err(io("cannot read its database")(e)),
    }
}

/// Renames the database (if any) to the first free `fencelock.redb.set-aside-N`.
fn set_aside(dir: &Path) -> Result<(), IdentityError> {
    let file = dir.join(DB_FILE);
    if !file.exists() {
        return Ok(());
    }
    let io =
        |source| IdentityError::Io { dir: dir.to_path_buf(), what: "cannot move the database aside".into(), source };
    let aside = (1..).map(|n| dir.join(format!("{DB_FILE}.set-aside-{n}"))).find(|p| !p.exists());
    let aside = aside.expect("an unbounded range has a free name");
    std::fs::rename(&file, &aside).map_err(io)?;
    tracing::warn!("moved the refused database {} to {}", file.display(), aside.display());
    // Its segment log (log = "segment") goes with it, beside it: a new group
    // must not start from the old group's entries.
    let wal = dir.join(super::wal::WAL_DIR);
    if wal.exists() {
        let suffix = aside.extension().and_then(|e| e.to_str()).unwrap_or("set-aside");
        let wal_aside = dir.join(format!("{}.{suffix}", super::wal::WAL_DIR));
        let io =
            |source| IdentityError::Io { dir: dir.to_path_buf(), what: "cannot move the log aside".into(), source };
        std::fs::rename(&wal, &wal_aside).map_err(io)?;
        tracing::warn!("moved the refused segment log {} to {}", wal.display(), wal_aside.display());
    }
    Ok(())
}

/// Whether the identity fits the flags.
fn check(node: &Node<'_>, id: &Identity) -> Result<(), IdentityError> {
    if id.format > FORMAT_VERSION {
        return Err(IdentityError::NewerFormat { file: node.dir.join(DB_FILE), found: id.format });
    }
    if id.node_id != node.id {
        let cluster = id.cluster_id.map_or_else(|| "not known yet".to_string(), |c| c.to_string());
        let (dir, stored, flag) = (node.dir.to_path_buf(), id.node_id, node.id);
        return Err(IdentityError::OtherNode { dir, stored, flag, cluster });
    }
    Ok(())
}

/// Records this binary's format in a data dir of an older one, which may from
/// here on hold what the older one cannot read: started again, that one
/// refuses it as newer instead of failing on what it finds.
fn upgrade(node: &Node<'_>, db: &Database, id: Identity) -> Result<(), IdentityError> {
    if id.format >= FORMAT_VERSION {
        return Ok(());
    }
    let from = id.format;
    write(db, &Identity { format: FORMAT_VERSION, ..id }).map_err(storage)?;
    tracing::info!(
        "data dir {}: on-disk format {from} -> {FORMAT_VERSION}; fencelock versions that read only format {from} \
         now refuse it",
        node.dir.display()
    );
    Ok(())
}

/// Writes a new identity and says so on one line.
fn first_start(node: &Node<'_>, log: &LogStore) -> Result<Identity, IdentityError> {
    let id = new_identity(node)?;
    write(log.db(), &id).map_err(storage)?;
    let (dir, number) = (node.dir.display(), node.id);
    match node.bootstrap {
        Bootstrap::Single => {
            tracing::info!("new data dir {dir}: node {number} forms a new group, cluster id {}", id.proposed)
        }
        Bootstrap::Peers(p) => tracing::info!(
            "new data dir {dir}: node {number} forms a new group with nodes {:?}; it proposes cluster id {} \
             (the group's first leader's proposal becomes the cluster id)",
            p.keys().collect::<Vec<_>>(),
            id.proposed
        ),
        Bootstrap::Join => {
            tracing::info!(
                "new data dir {dir}: node {number} waits to be added to a group and will take its cluster id"
            )
        }
    }
    Ok(id)
}

/// A database written before identities existed: keep its state, add one.
fn adopt(node: &Node<'_>, log: &LogStore) -> Result<Identity, IdentityError> {
    let id = new_identity(node)?;
    write(log.db(), &id).map_err(storage)?;
    tracing::warn!(
        "the database in {} has no identity (written by an older fencelock): recorded it as node {}'s, format {}",
        node.dir.display(),
        node.id,
        FORMAT_VERSION
    );
    Ok(id)
}

fn new_identity(node: &Node<'_>) -> Result<Identity, IdentityError> {
    let proposed = random_cluster_id().map_err(|source| IdentityError::Io {
        dir: node.dir.to_path_buf(),
        what: "cannot read /dev/urandom for a cluster id".into(),
        source,
    })?;
    Ok(Identity { format: FORMAT_VERSION, node_id: node.id, proposed, cluster_id: None })
}

/// 128 random bits from the operating system.
fn random_cluster_id() -> std::io::Result<ClusterId> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(ClusterId(u128::from_le_bytes(bytes)))
}

fn storage(e: DbError) -> IdentityError {
    IdentityError::Storage(e)
}

fn read(db: &Database) -> Result<Option<Identity>, DbError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(META)?;
    let value = table.get(KEY_IDENTITY)?;
    Ok(value.map(|v| serde_json::from_slice(v.value())).transpose()?)
}

/// Writes `id`, durably (fsync before it returns).
fn write(db: &Database, id: &Identity) -> Result<(), DbError> {
    let bytes = serde_json::to_vec(id)?;
    let txn = db.begin_write()?;
    txn.open_table(META)?.insert(KEY_IDENTITY, bytes.as_slice())?;
    txn.commit()?;
    Ok(())
}

/// Whether the data dir holds anything of a Raft node: a vote, a log entry (in
/// the database, or in the segment log's `wal/`), a purge mark or a snapshot
/// (the mark of the log engine is not).
fn has_raft_state(log: &LogStore) -> Result<bool, DbError> {
    if log.has_entries()? {
        return Ok(true);
    }
    let txn = log.db().begin_read()?;
    let meta = txn.open_table(META)?;
    let engine_mark = usize::from(meta.get(db::KEY_LOG_ENGINE)?.is_some());
    let meta_empty = meta.len()? as usize == engine_mark;
    let snapshot_empty = txn.open_table(SNAPSHOT)?.is_empty()?;
    Ok(!(meta_empty && snapshot_empty))
}

/// Device and inode of a path.
fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// What [`watch`] needs of the running node.
pub struct Watched {
    pub dir: PathBuf,
    pub identity: SharedIdentity,
    pub log: LogStore,
    pub engine: SharedEngine,
    pub raft: Raft,
}

/// Watches the data dir while the node serves (see the module docs). On a
/// failure it logs why, shuts the Raft node down (nothing more is
/// acknowledged) and sends the reason on `failed`. Ends then, or when `stop`
/// turns true.
pub async fn watch(w: Watched, failed: tokio_watch::Sender<Option<String>>, mut stop: tokio_watch::Receiver<bool>) {
    let file = w.dir.join(DB_FILE);
    let opened = match file_id(&file) {
        Ok(id) => id,
        Err(e) => return fail(&w, &failed, format!("cannot stat the database {}: {e}", file.display())).await,
    };
    let mut tick = tokio::time::interval(WATCH_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if let Err(why) = check_once(&w, &file, opened).await {
            return fail(&w, &failed, why).await;
        }
    }
}

/// One look: the file is still the one opened; the applied cluster id is recorded.
async fn check_once(w: &Watched, file: &Path, opened: (u64, u64)) -> Result<(), String> {
    match file_id(file) {
        Ok(now) if now == opened => {}
        Ok(_) => return Err(format!("the database {} was replaced while the server ran", file.display())),
        Err(e) => {
            return Err(format!(
                "the database {} is gone while the server ran (data dir deleted or moved?): {e}",
                file.display()
            ))
        }
    }
    let applied = read_engine(&w.engine).unwrap_or_else(PoisonError::into_inner).cluster_id();
    match (w.identity.cluster_id(), applied) {
        // Recording is bookkeeping (the id is in the replicated state): a
        // failed write (a full disk) is logged and tried again at the next
        // look; it does not stop the node.
        (None, Some(id)) => {
            if let Err(why) = record_cluster_id(w, id).await {
                tracing::warn!(%why, "will try again");
            }
            Ok(())
        }
        (Some(mine), Some(group)) if mine != group => {
            Err(format!("this data dir belongs to cluster {mine}, but the applied state is of cluster {group}"))
        }
        _ => Ok(()),
    }
}

async fn record_cluster_id(w: &Watched, id: ClusterId) -> Result<(), String> {
    let mut identity = w.identity.get();
    identity.cluster_id = Some(id);
    let db = w.log.db().clone();
    let written = db::blocking(move || write(&db, &identity)).await;
    written.map_err(|e| format!("cannot record the cluster id {id}: {e}"))?;
    w.identity.set_cluster_id(id);
    tracing::info!("node {} is a member of cluster {id}", w.identity.get().node_id);
    Ok(())
}

async fn fail(w: &Watched, failed: &tokio_watch::Sender<Option<String>>, why: String) {
    tracing::error!("stopping: {why}; nothing more is acknowledged from this data dir");
    let _ = w.raft.shutdown().await;
    let _ = failed.send(Some(why));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn set_format(config: &Config, format: u32) {
        let (log, _sm, identity) = crate::open_data_dir(config).expect("opens");
        let id = Identity { format, ..identity.get() };
        write(log.db(), &id).unwrap();
    }

    fn format_of(config: &Config) -> u32 {
        let (log, _sm, _) = crate::open_data_dir(config).expect("opens");
        read(log.db()).unwrap().expect("an identity").format
    }

    /// A data dir of an older format is recorded in this binary's when it
    /// opens, so that the older binary refuses it afterwards.
    #[test]
    fn a_data_dir_of_an_older_format_is_moved_to_this_one() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::for_test(dir.path().join("data"));
        assert_eq!(format_of(&config), FORMAT_VERSION);
        set_format(&config, 1);
        assert_eq!(format_of(&config), FORMAT_VERSION);
    }

    /// A data dir of a newer format is refused, and left as it is.
    #[test]
    fn a_data_dir_of_a_newer_format_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::for_test(dir.path().join("data"));
        set_format(&config, FORMAT_VERSION + 1);
        let Err(err) = crate::open_data_dir(&config) else { panic!("a newer format is refused") };
        assert!(matches!(err, IdentityError::NewerFormat { found, .. } if found == FORMAT_VERSION + 1), "{err}");
        let db = Database::open(config.data_dir.join(DB_FILE)).unwrap();
        assert_eq!(read(&db).unwrap().expect("an identity").format, FORMAT_VERSION + 1);
    }
}
