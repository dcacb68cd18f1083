//! The replicated state machine: the [`Engine`], fed by committed log entries.
//!
//! The engine lives in memory. It is not written on every apply: it is rebuilt at
//! startup from the latest snapshot plus the committed log after it, which
//! openraft re-applies.
//!
//! Snapshot bytes are the JSON of `SnapshotPayload` (last applied log id, last
//! membership, engine; see `snapshot_payload`), in a file of the data dir's
//! `snap/` (see `snapshot_file`) that the redb database names; storing and
//! reading the node's snapshot is `snapshot_store`. Data dirs of the layout
//! before files hold the bytes in the database instead; a start moves them
//! into a file.
//!
//! The file is the snapshot from end to end, never a copy in memory (issue
//! 38 §3): a start decodes it as it reads it, once; openraft is handed it
//! opened for reading ([`SnapshotData`]) to send to a follower in chunks; a
//! follower receives into a new file of `snap/` and, once
//! `snapshot_rx` has checked it, installs it by adopting that file.
//!
//! Taking a snapshot (openraft's state-machine task asks for a
//! [`SnapshotBuilder`], then builds it on a task of its own): the builder is a
//! copy of the engine, cloned on a blocking thread while applies wait; the
//! copy is streamed to its file on a blocking thread and dropped, so no
//! runtime thread is held for more than the hand-offs and no copy of the
//! bytes is in memory while it is written. The clone shares the engine's
//! chunks and records (fencelock-core's `CowMap` and `Arc`s, copied on their
//! next change): at a million idle leases applies wait 2-4 ms for it, and
//! a build's allocations peak 2 MB above the state (`tests/it/snapshot_scale.rs`;
//! 0.26 s and 1.2 GB, 1.7 GB once a snapshot was stored, when the maps were
//! copied whole and the bytes went into redb). What the engine changes
//! while the copy lives is copied then, once per record and map chunk.
#![allow(clippy::result_large_err)] // openraft's error types are large by design

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LockResult, RwLock, RwLockReadGuard, TryLockError};

use super::db::blocking;
use super::db_error::DbError;
use super::snapshot_data::SnapshotData;
use super::snapshot_file::Files;
use super::snapshot_payload::{Membership, Meta};
use super::snapshot_store::{self as store, Stored};
use super::{NodeId, TypeConfig};
use crate::clock::Clock;
use crate::local_read::GroupTime;
use crate::seams::{Applying, CrashPoint, Seams};
use crate::watching::{self as watch, Hub};
use fencelock_core::{Engine, Output};
use openraft::storage::RaftStateMachine;
use openraft::{
    Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, StorageError,
    StoredMembership,
};
use redb::{Database, ReadableDatabase, ReadableTable};

/// The engine, shared with the server's read path. Only [`StateMachine`]'s apply
/// and snapshot install take the write lock; everyone else must only read.
///
/// If the engine panics while applying an entry, the lock is left poisoned on
/// purpose (the engine may be half-updated): readers then get a `PoisonError` and
/// must not serve from it; openraft gets a storage error and stops the node.
pub type SharedEngine = Arc<RwLock<Engine>>;

/// Reads `engine` from async code: at once if no apply holds it; otherwise
/// waits off the runtime's worker threads ([`off_the_runtime`]), so that a
/// long apply (a leader change at millions of leases) never leaves the Raft
/// core without a thread while requests wait for the engine.
pub(crate) fn read_engine(engine: &RwLock<Engine>) -> LockResult<RwLockReadGuard<'_, Engine>> {
    match engine.try_read() {
        Ok(guard) => Ok(guard),
        Err(TryLockError::Poisoned(p)) => Err(p),
        Err(TryLockError::WouldBlock) => off_the_runtime(|| engine.read()),
    }
}

/// The Raft state machine over the [`Engine`]. Also its own snapshot builder: the
/// builder is a detached copy taken between two applies.
pub struct StateMachine {
    db: Arc<Database>,
    /// Where the snapshots' data is (see [`super::snapshot_file`]).
    files: Files,
    engine: SharedEngine,
    last_applied: Option<LogId<NodeId>>,
    last_membership: Membership,
    /// Hooks at [`CrashPoint::SmBeforeApply`] and before each apply (see
    /// [`crate::seams`]).
    seams: Seams,
    /// With hooks: the index of the first entry that was not in the log when
    /// the storage was opened.
    first_new: Option<u64>,
    /// Where each applied entry's events go (see [`crate::watching`]).
    watch: Arc<Hub>,
    /// Told the engine's `now` against this node's clock as each entry is
    /// applied (see [`crate::local_read`]).
    group_time: Option<(Arc<GroupTime>, Clock)>,
}

impl std::fmt::Debug for StateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachine")
            .field("last_applied", &self.last_applied)
            .field("last_membership", &self.last_membership)
            .finish_non_exhaustive()
    }
}

fn sm_err(verb: ErrorVerb) -> impl Fn(DbError) -> StorageError<NodeId> {
    move |e| e.into_storage(ErrorSubject::StateMachine, verb)
}

fn snap_err(meta: Option<&Meta>, verb: ErrorVerb) -> impl Fn(DbError) -> StorageError<NodeId> {
    let sig = meta.map(|m| m.signature());
    move |e| e.into_storage(ErrorSubject::Snapshot(sig.clone()), verb)
}

/// The index of the first entry that is not in the log yet: one past the last
/// stored entry or the snapshot, whichever is later (0 for an empty store).
fn first_new_index(db: &Database, snapshot: Option<LogId<NodeId>>) -> Result<u64, DbError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(super::db::LOG)?;
    let last_in_log = table.last()?.map(|(k, _)| k.value());
    let last = last_in_log.max(snapshot.map(|l| l.index));
    Ok(last.map_or(0, |i| i.saturating_add(1)))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

impl StateMachine {
    /// Loads the state machine from the persisted snapshot of `db` (or starts empty).
    /// Snapshot files a crash left unnamed in `dir` (the data dir) are removed.
    pub(crate) fn load(db: Arc<Database>, dir: &Path, seams: Seams) -> Result<Self, StorageError<NodeId>> {
        let files = Files::new(dir);
        let stored = store::stored(&*db).map_err(snap_err(None, ErrorVerb::Read))?;
        let named = match &stored {
            Some((_, Stored::File(file))) => Some(file.name.as_str()),
            _ => None,
        };
        files.tidy(named).map_err(snap_err(None, ErrorVerb::Write))?;
        let mut sm = StateMachine {
            db,
            files,
            engine: Arc::new(RwLock::new(Engine::new())),
            last_applied: None,
            last_membership: Membership::default(),
            seams,
            first_new: None,
            watch: Hub::new(watch::hub::DEFAULT_HISTORY, 0),
            group_time: None,
        };
        if let Some((meta, stored)) = stored {
            // Read once, as it is decoded: openraft asks for the snapshot
            // next (`get_current_snapshot`), which only opens its file.
            let payload =
                store::decode_stored(&sm.files, &meta, &stored).map_err(snap_err(Some(&meta), ErrorVerb::Read))?;
            if let Stored::Table(data) = stored {
                store::move_to_file(&sm.db, &sm.files, &meta, &data)
                    .map_err(snap_err(Some(&meta), ErrorVerb::Write))?;
            }
            sm.last_applied = payload.last_applied;
            sm.last_membership = payload.last_membership;
            *sm.engine.write().expect("fresh lock") = payload.engine;
        }
        // The watch history starts after the snapshot: the log after it is
        // applied again, which publishes its events.
        sm.watch = Hub::new(watch::hub::DEFAULT_HISTORY, sm.last_applied.map_or(0, |l| l.index.saturating_add(1)));
        if sm.seams.hooks.is_some() {
            sm.first_new = Some(first_new_index(&sm.db, sm.last_applied).map_err(sm_err(ErrorVerb::Read))?);
        }
        Ok(sm)
    }

    /// The log reaches index `last` (the log store says so when it opens,
    /// whichever engine keeps the entries): entries up to it are a replay,
    /// for [`crate::seams::Applying::first_new`].
    pub(crate) fn log_reaches(&mut self, last: Option<u64>) {
        if let (Some(first_new), Some(last)) = (&mut self.first_new, last) {
            *first_new = (*first_new).max(last.saturating_add(1));
        }
    }

    /// Keeps `capacity` watch events instead of the default (before the node
    /// starts: the history so far is dropped, and starts where it stood).
    pub(crate) fn with_watch_history(mut self, capacity: usize) -> Self {
        self.watch = Hub::new(capacity, self.watch.next().index);
        self
    }

    /// Tells `time` the engine's `now` against `clock` as each entry is
    /// applied: a follower's estimate of the group's clock for local reads.
    pub(crate) fn with_group_time(mut self, time: Arc<GroupTime>, clock: Clock) -> Self {
        self.group_time = Some((time, clock));
        self
    }

    /// Calls [`crate::seams::Hooks::before_apply`] for the entry at `index`, if
    /// there are hooks.
    fn before_apply(&mut self, index: u64) {
        let (Some(hooks), Some(first_new)) = (&self.seams.hooks, self.first_new) else {
            return;
        };
        if let Ok(mut engine) = self.engine.write() {
            hooks.before_apply(Applying { index, first_new }, &mut engine);
        }
    }

    /// The engine handle for the read path. Reads only: only apply mutates it.
    pub fn engine(&self) -> SharedEngine {
        self.engine.clone()
    }

    /// This node's watch hub: the events of the entries it applies.
    pub fn watch_hub(&self) -> Arc<Hub> {
        self.watch.clone()
    }

    /// Last applied log id (what openraft's `applied_state` reports).
    pub fn last_applied(&self) -> Option<LogId<NodeId>> {
        self.last_applied
    }

    /// Applies one input to the engine under the write lock, and publishes the
    /// entry's watch events before the lock is released: a reader that holds
    /// the read lock sees the engine and the watch history at the same entry
    /// (see `Ops::lock_info_at`). A panic in the engine becomes a storage error
    /// and leaves the lock poisoned (see [`SharedEngine`]).
    fn step_and_publish(
        &self,
        log_id: &LogId<NodeId>,
        input: &fencelock_core::Input,
    ) -> Result<Output, StorageError<NodeId>> {
        let to_err = sm_err(ErrorVerb::Write);
        let mut guard = self
            .engine
            .write()
            .map_err(|_| to_err(DbError::Other("engine lock is poisoned by an earlier failed apply".into())))?;
        let pending = watch::PendingWaits::before(&guard, input);
        match catch_unwind(AssertUnwindSafe(|| guard.step(input))) {
            Ok(out) => {
                self.watch.publish(log_id.index, watch::events::of_entry(log_id.index, input, &out, &pending));
                if let Some((time, clock)) = &self.group_time {
                    time.observe(guard.now(), clock.now());
                }
                Ok(out)
            }
            Err(payload) => {
                let msg = panic_message(payload.as_ref());
                // Poison the lock: drop the guard while unwinding.
                let _ = catch_unwind(AssertUnwindSafe(move || {
                    let _guard = guard;
                    resume_unwind(payload)
                }));
                Err(DbError::Other(format!("engine panicked applying log entry {log_id}: {msg}"))
                    .into_storage(ErrorSubject::Apply(*log_id), ErrorVerb::Write))
            }
        }
    }
}

/// Whether applying `input` takes time in proportion to the whole state: a
/// new leader's first entry re-bases every lease and held lock (0.35 s at 2M
/// leases and 0.63 s at 5M on an idle core of this machine;
/// `tests/it/footprint.rs` in fencelock-core).
fn costs_the_state(input: &fencelock_core::Input) -> bool {
    matches!(input, fencelock_core::Input::LeaderStart { .. })
}

/// Runs `f` where it does not hold up one of the runtime's worker threads (on
/// a multi-threaded runtime, `block_in_place`: this thread hands its other
/// tasks over and a new worker takes its place). Each node runs on a few
/// workers; with one inside a long apply and another waiting for the engine's
/// lock (a read of the engine), the Raft core got no thread: a group of 10M
/// leases missed its heartbeats at every leader change, and elected again and
/// again (issue 38, `bench/results/2026-11-29-catchup/10m-attempts/`).
pub(crate) fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Seeds an empty database with a restored group's first state (see
/// [`crate::backup::restore`]): `engine` as the snapshot at `last`, with
/// `membership`, and the log purged and committed up to `last`, in one durable
/// transaction, so the node starts from it as from any snapshot.
pub(crate) fn seed_restored(
    sm: &StateMachine,
    last: LogId<NodeId>,
    membership: Membership,
    engine: &Engine,
) -> Result<(), DbError> {
    store::seed(&sm.db, &sm.files, last, membership, engine)
}

/// openraft's snapshot builder: a detached copy of the engine at one applied
/// entry (made by [`StateMachine::get_snapshot_builder`]), which it
/// serializes, stores and drops on a blocking thread.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    files: Files,
    /// The copy, until it is serialized; why there is none otherwise.
    engine: Result<Engine, &'static str>,
    last_applied: Option<LogId<NodeId>>,
    last_membership: Membership,
}

impl std::fmt::Debug for SnapshotBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotBuilder").field("last_applied", &self.last_applied).finish_non_exhaustive()
    }
}

const POISONED: &str = "engine lock is poisoned by an earlier failed apply";
const BUILT: &str = "this builder's copy of the engine was already serialized";

/// A copy of the engine behind `shared`; taken on a blocking thread by
/// [`StateMachine::get_snapshot_builder`].
fn copy_engine(shared: &SharedEngine) -> Result<Engine, &'static str> {
    shared.read().map(|e| e.clone()).map_err(|_| POISONED)
}

impl SnapshotBuilder {
    /// The meta of the snapshot of this builder's copy, with a fresh id.
    fn meta(&self) -> Meta {
        // Unique within this process; two snapshots with the same last log id hold
        // the same state, so a clash across restarts is harmless.
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match &self.last_applied {
            Some(l) => format!("{}-{}-{}-{seq}", l.leader_id.term, l.leader_id.node_id, l.index),
            None => format!("none-{seq}"),
        };
        Meta { last_log_id: self.last_applied, last_membership: self.last_membership.clone(), snapshot_id }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    /// Serializes the copy and persists it durably as the current snapshot
    /// (unless a newer one is already stored), on a blocking thread: a
    /// snapshot of a million leases takes seconds, which would stall every
    /// task of a runtime with one worker thread.
    ///
    /// Returns its meta and its file, opened, not read: openraft 0.9.25
    /// (pinned) keeps only the meta of a snapshot it had built
    /// (`core/sm/worker.rs`: `Response::BuildSnapshot(snap.meta)`;
    /// `storage/helper.rs` likewise) and sends followers what
    /// `get_current_snapshot` returns. Reading the file back for it cost, at
    /// 1M leases, 416 MB read, checksummed and dropped per snapshot: about
    /// 1 s of W3's 9.4 s to create a million leases. If a newer snapshot was
    /// stored meanwhile, this one was not written: its data is then an
    /// empty file, removed when dropped.
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let meta = self.meta();
        let engine = std::mem::replace(&mut self.engine, Err(BUILT));
        let (db, files, m) = (self.db.clone(), self.files.clone(), meta.clone());
        let written = blocking(move || {
            store::serialize_and_store(&db, &files, &m, engine.map_err(|e| DbError::Other(e.into()))?)
        })
        .await
        .map_err(snap_err(Some(&meta), ErrorVerb::Write))?;
        let data = match written {
            Some(opened) => SnapshotData::stored(opened),
            None => {
                tracing::info!(%meta, "built snapshot is older than the stored one; kept the stored one");
                let (path, file) = self.files.begin_incoming().map_err(snap_err(Some(&meta), ErrorVerb::Write))?;
                SnapshotData::incoming(path, file)
            }
        };
        Ok(Snapshot { meta, snapshot: Box::new(data) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        Ok((self.last_applied, self.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Output>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut outputs = Vec::new();
        for entry in entries {
            self.seams.crash_point(CrashPoint::SmBeforeApply);
            self.before_apply(entry.log_id.index);
            let out = match &entry.payload {
                EntryPayload::Blank => Output::default(),
                EntryPayload::Normal(d) if costs_the_state(d.input()) => {
                    off_the_runtime(|| self.step_and_publish(&entry.log_id, d.input()))?
                }
                EntryPayload::Normal(d) => self.step_and_publish(&entry.log_id, d.input())?,
                EntryPayload::Membership(m) => {
                    self.last_membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    Output::default()
                }
            };
            self.last_applied = Some(entry.log_id);
            if !matches!(entry.payload, EntryPayload::Normal(_)) {
                self.watch.publish(entry.log_id.index, Vec::new());
            }
            outputs.push(out);
        }
        Ok(outputs)
    }

    /// A detached copy of the current state (cloned engine), taken between
    /// applies: applies wait for it (they run on this task), but the copy is
    /// made on a blocking thread, so the runtime's threads do not (replies,
    /// reads, heartbeats go on). A poisoned engine cannot be snapshotted: the
    /// builder then has no copy, and `build_snapshot` fails instead of saving it.
    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let shared = self.engine.clone();
        let engine = tokio::task::spawn_blocking(move || copy_engine(&shared))
            .await
            .unwrap_or(Err("the engine's copy panicked"));
        SnapshotBuilder {
            db: self.db.clone(),
            files: self.files.clone(),
            engine,
            last_applied: self.last_applied,
            last_membership: self.last_membership.clone(),
        }
    }

    /// A new file of `snap/` to receive a snapshot into (see
    /// [`super::snapshot_rx`]); removed if it is dropped before it is
    /// installed.
    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError<NodeId>> {
        let (path, file) = self.files.begin_incoming().map_err(snap_err(None, ErrorVerb::Write))?;
        Ok(Box::new(SnapshotData::incoming(path, file)))
    }

    /// Installs the snapshot in `snapshot` durably as the current one (a
    /// received file is adopted, not copied), then replaces the engine and
    /// the applied state with it. The engine is the one the receiver decoded
    /// when it checked the snapshot, or else decoded from the file here.
    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<SnapshotData>) -> Result<(), StorageError<NodeId>> {
        let mut parts = snapshot.into_parts().await;
        let m = meta.clone();
        // Decoded and stored on blocking threads: at a million leases each
        // takes seconds, which would stall every task of a one-thread runtime.
        let (decoded, parts) = blocking(move || Ok((store::decode_parts(&m, &mut parts)?, parts)))
            .await
            .map_err(snap_err(Some(meta), ErrorVerb::Read))?;
        let (db, files, m, sum) = (self.db.clone(), self.files.clone(), meta.clone(), decoded.sum);
        blocking(move || store::keep_file(&db, &files, &m, parts, sum))
            .await
            .map_err(snap_err(Some(meta), ErrorVerb::Write))?;
        let payload = decoded.payload;
        let replaced = {
            let mut engine = self.engine.write().map_err(|_| {
                sm_err(ErrorVerb::Write)(DbError::Other("engine lock is poisoned by an earlier failed apply".into()))
            })?;
            std::mem::replace(&mut *engine, payload.engine)
        };
        // Freeing a large engine's allocations takes a while too.
        tokio::task::spawn_blocking(move || drop(replaced));
        self.last_applied = payload.last_applied;
        self.last_membership = payload.last_membership;
        self.watch.reset(self.last_applied.map_or(0, |l| l.index));
        Ok(())
    }

    /// The stored snapshot, its file opened for reading (not read: it is
    /// checked against its checksum as it is sent, see [`SnapshotData`]).
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let Some((meta, stored)) = store::stored(&*self.db).map_err(snap_err(None, ErrorVerb::Read))? else {
            return Ok(None);
        };
        let opened = match stored {
            Stored::File(file) => self.files.open(&file),
            Stored::Table(_) => Err(DbError::Other("the snapshot is in the table: a start moves it to a file".into())),
        };
        let opened = opened.map_err(snap_err(Some(&meta), ErrorVerb::Read))?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(SnapshotData::stored(opened)) }))
    }
}
