//! Receiving a snapshot from the leader: its chunks are written to a file as
//! they arrive, outside openraft's core, and the whole snapshot is checked
//! from that file before openraft acts on it.
//!
//! Where it sits: behind [`super::RaftService`]'s `InstallSnapshot` RPC. openraft's
//! own `Raft::install_snapshot` hands a complete snapshot straight to its core,
//! which moves its committed index, purges the log the snapshot covers and only
//! then asks the state machine to install it. A snapshot that does not decode at
//! that point is a fatal storage error: the node stops, and since the log it
//! purged is gone it cannot start again. Here a snapshot reaches
//! `Raft::install_full_snapshot` only if [`check`] accepts it:
//! - its chunks come in order: one may be sent again, but one that starts
//!   past what is written is answered as out of order (`SnapshotMismatch`)
//!   and not written, so the file never has a gap;
//! - it fits ([`Limits`], checked before each chunk is written): within the
//!   configured bound, and leaving the data dir's disk its reserve;
//! - it decodes, and its data describes the same point of the log as its meta;
//! - the engine in it passes `Engine::check_consistency`;
//! - if openraft would install it (it goes beyond what this node has applied), it
//!   is of this node's cluster (when both know their cluster id), and its token
//!   counter is not below this node's: a snapshot must never send tokens back.
//!
//! No copy of the snapshot's bytes is in memory (issue 38 §3): the stream is
//! written into the file the state machine gives to receive into
//! ([`super::snapshot_data`]), each chunk flushed before it is answered; the
//! check decodes the engine from that file, on a blocking thread (seconds at
//! a million leases), and hands the decoded engine to the install, which
//! adopts the file as the node's snapshot (renamed, not copied). A refused
//! snapshot is answered with INVALID_ARGUMENT, or RESOURCE_EXHAUSTED when it
//! does not fit on the disk (a leader backs off and sends again), logged and
//! counted in `fencelock_peer_messages_refused_total`; its file is removed,
//! nothing else is changed, nothing is removed.
#![allow(clippy::result_large_err)] // openraft's error types are large by design

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use fencelock_core::Engine;
use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::{LogId, Snapshot, SnapshotSegmentId};
use tokio::sync::Mutex;

use super::snapshot_data::SnapshotData;
use super::snapshot_payload::{decode_received, Decoded, Meta};
use super::state_machine::{read_engine, SharedEngine};
use super::{NodeId, Raft, TypeConfig};

/// The default of [`Limits::max_bytes`]: 1 TiB. The engine of a million
/// leases is about 420 MB of JSON, so this is some 2,500 times that: no real
/// group reaches it.
pub const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 1 << 40;

/// The default of [`Limits::reserve_bytes`]: 256 MiB.
pub const DEFAULT_RESERVE_BYTES: u64 = 256 << 20;

/// What this node accepts of a snapshot stream. Neither stops a valid group
/// from growing: the bound's default is far above any real state, and the
/// disk check refuses only what this node could not store anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest snapshot accepted, in bytes ([`DEFAULT_MAX_SNAPSHOT_BYTES`]
    /// unless set): a stream past it is refused (INVALID_ARGUMENT) before
    /// the chunk that crosses it is written.
    pub max_bytes: u64,
    /// The free space the data dir's filesystem must keep after a chunk is
    /// written ([`DEFAULT_RESERVE_BYTES`] unless set), so that the log and
    /// the database can still be written: a chunk that would leave less is
    /// refused (RESOURCE_EXHAUSTED) before it is written.
    pub reserve_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_bytes: DEFAULT_MAX_SNAPSHOT_BYTES, reserve_bytes: DEFAULT_RESERVE_BYTES }
    }
}

impl Limits {
    /// Whether a stream may reach `end` bytes, of which `written` are on a
    /// disk that has `free` bytes free.
    pub fn admit(&self, id: &str, end: u64, written: u64, free: u64) -> Result<(), Refused> {
        let refused = |why: String| Refused::Invalid { id: id.to_string(), why };
        if end > self.max_bytes {
            return Err(refused(format!("larger than {} bytes, the most this node accepts", self.max_bytes)));
        }
        let more = end.saturating_sub(written);
        if free < more.saturating_add(self.reserve_bytes) {
            let why = format!(
                "its next {more} bytes do not fit: the data dir's disk has {free} bytes free and keeps {} in reserve",
                self.reserve_bytes
            );
            return Err(Refused::NoRoom { id: id.to_string(), why });
        }
        Ok(())
    }
}

/// An answer for the sender that is not a response (a stale vote, a chunk
/// out of order, a fatal error).
pub type AnswerError = RaftError<NodeId, InstallSnapshotError>;

/// The answer openraft's `install_snapshot` would give, JSON-encoded by the caller.
pub type Answer = Result<InstallSnapshotResponse<NodeId>, AnswerError>;

/// Why a received snapshot is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// It is not one this node may install (see the module docs).
    #[error("snapshot {id} refused: {why}")]
    Invalid { id: String, why: String },
    /// It does not fit on this node's disk.
    #[error("snapshot {id} refused: {why}")]
    NoRoom { id: String, why: String },
    /// This node could not write it, or read it back.
    #[error("snapshot {id} refused: cannot {what} its file")]
    Io {
        id: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The snapshot being received: its id, its file, and how far it is written.
struct Incoming {
    id: String,
    data: Box<SnapshotData>,
    written: u64,
}

/// What a chunk leads to.
enum Chunk {
    /// The snapshot has more chunks to come.
    More,
    /// It was the last: the whole snapshot's data.
    Done(Box<SnapshotData>),
    /// An answer for the sender (out-of-order chunk, fatal error).
    Answer(Box<AnswerError>),
}

/// The snapshot stream being received (at most one at a time, as in openraft).
#[derive(Default)]
pub struct Receiver {
    incoming: Mutex<Option<Incoming>>,
    limits: Limits,
}

impl Receiver {
    /// A receiver that accepts what `limits` admit.
    pub fn new(limits: Limits) -> Self {
        Self { incoming: Mutex::default(), limits }
    }

    /// Takes one chunk, written to the snapshot's file before it returns;
    /// once the last chunk is in, checks the snapshot and only then installs
    /// it. `Ok(Err(_))` is an answer for the sender (stale vote, out-of-order
    /// chunk, fatal error); `Err` is a refusal.
    pub async fn receive(
        &self,
        raft: &Raft,
        engine: &SharedEngine,
        req: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<Answer, Refused> {
        let my_vote = raft.metrics().borrow().vote;
        let vote = req.vote;
        // By term alone: openraft's `Vote` ordering panics (unreachable!) on
        // two committed votes of one term from different nodes, which a peer
        // could send.
        if vote.leader_id().term < my_vote.leader_id().term {
            return Ok(Ok(InstallSnapshotResponse { vote: my_vote }));
        }
        let data = match self.take_chunk(raft, &req).await? {
            Chunk::More => return Ok(Ok(InstallSnapshotResponse { vote: my_vote })),
            Chunk::Answer(answer) => return Ok(Err(*answer)),
            Chunk::Done(data) => data,
        };
        let applied = raft.metrics().borrow().last_applied;
        let snapshot = checked(Snapshot { meta: req.meta, snapshot: data }, applied, engine).await?;
        Ok(raft.install_full_snapshot(vote, snapshot).await.map(Into::into).map_err(RaftError::Fatal))
    }

    /// Writes `req`'s chunk into the snapshot it belongs to. A chunk that
    /// does not fit, or cannot be written, ends the stream (its file is
    /// removed).
    async fn take_chunk(&self, raft: &Raft, req: &InstallSnapshotRequest<TypeConfig>) -> Result<Chunk, Refused> {
        let mut incoming = self.incoming.lock().await;
        let current = match self.begin(&mut incoming, raft, req).await {
            Ok(current) => current,
            Err(answer) => return Ok(Chunk::Answer(Box::new(answer))),
        };
        if let Err(answer) = contiguous(current, req) {
            return Ok(Chunk::Answer(Box::new(answer)));
        }
        if let Err(refused) = self.write(current, req).await {
            *incoming = None;
            return Err(refused);
        }
        match (req.done, incoming.take()) {
            (true, Some(done)) => Ok(Chunk::Done(done.data)),
            (_, current) => {
                *incoming = current;
                Ok(Chunk::More)
            }
        }
    }

    /// The stream `req` belongs to: the current one, or a new one (in a new
    /// file, the current one dropped) if `req` starts another snapshot.
    async fn begin<'a>(
        &self,
        incoming: &'a mut Option<Incoming>,
        raft: &Raft,
        req: &InstallSnapshotRequest<TypeConfig>,
    ) -> Result<&'a mut Incoming, AnswerError> {
        let id = &req.meta.snapshot_id;
        if incoming.as_ref().is_some_and(|i| &i.id == id) {
            return Ok(incoming.as_mut().expect("checked"));
        }
        if req.offset != 0 {
            return Err(mismatch(id, 0, req.offset));
        }
        *incoming = None;
        let data = raft.begin_receiving_snapshot().await.map_err(|e| RaftError::Fatal(fatal(e)))?;
        tracing::info!(snapshot = %req.meta, file = %data.path().display(), "receiving a snapshot");
        Ok(incoming.insert(Incoming { id: id.clone(), data, written: 0 }))
    }

    /// Writes `req`'s chunk into `current`'s file, if [`Limits`] admit it.
    async fn write(&self, current: &mut Incoming, req: &InstallSnapshotRequest<TypeConfig>) -> Result<(), Refused> {
        let id = &current.id;
        let io = |what| move |source| Refused::Io { id: id.clone(), what, source };
        let end = req.offset.saturating_add(req.data.len() as u64);
        let free = free_bytes(current.data.path()).map_err(io("measure the free space for"))?;
        self.limits.admit(id, end, current.written, free)?;
        current.data.write_chunk(req.offset, &req.data).await.map_err(io("write"))?;
        current.written = current.written.max(end);
        Ok(())
    }
}

/// Whether `req`'s chunk starts within what `current` has written: a chunk
/// may be sent again, but one beyond the end would leave a gap in the file
/// (never written, read back as zeros), so it is answered as out of order
/// and the stream stays where it was.
fn contiguous(current: &Incoming, req: &InstallSnapshotRequest<TypeConfig>) -> Result<(), AnswerError> {
    if req.offset > current.written {
        return Err(mismatch(&current.id, current.written, req.offset));
    }
    Ok(())
}

/// The answer to a chunk at `got` where the stream `id` expects `expect`.
fn mismatch(id: &str, expect: u64, got: u64) -> AnswerError {
    let segment = |offset| SnapshotSegmentId { id: id.to_string(), offset };
    let mismatch = SnapshotMismatch { expect: segment(expect), got: segment(got) };
    RaftError::APIError(InstallSnapshotError::SnapshotMismatch(mismatch))
}

/// openraft's error of `begin_receiving_snapshot`: only ever fatal.
fn fatal(e: RaftError<NodeId, openraft::error::Infallible>) -> Fatal<NodeId> {
    match e {
        RaftError::APIError(never) => match never {},
        RaftError::Fatal(fatal) => fatal,
    }
}

/// The bytes free (for this user) on the filesystem of `file`.
fn free_bytes(file: &Path) -> std::io::Result<u64> {
    let dir = file.parent().unwrap_or(file);
    let fs = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok((fs.blocks_available() as u64).saturating_mul(fs.fragment_size() as u64))
}

/// `snapshot`, if [`check`] accepts it, with what it decoded to kept for its
/// install. Checked on a blocking thread: it decodes the whole snapshot
/// (seconds at a million leases), which must not hold a runtime thread.
async fn checked(
    mut snapshot: Snapshot<TypeConfig>,
    applied: Option<LogId<NodeId>>,
    engine: &SharedEngine,
) -> Result<Snapshot<TypeConfig>, Refused> {
    let id = snapshot.meta.snapshot_id.clone();
    let reader = snapshot.snapshot.reader().map_err(|source| Refused::Io { id: id.clone(), what: "read", source })?;
    let (meta, engine) = (snapshot.meta.clone(), engine.clone());
    let verdict = tokio::task::spawn_blocking(move || check_decoded(&meta, reader, applied, &engine)).await;
    match verdict {
        Ok(Ok(decoded)) => {
            snapshot.snapshot.set_decoded(decoded);
            Ok(snapshot)
        }
        Ok(Err(why)) => Err(Refused::Invalid { id, why }),
        Err(join) => Err(Refused::Invalid { id, why: format!("its check failed: {join}") }),
    }
}

/// Whether the snapshot of `meta` whose data `data` holds (read to its end)
/// may be installed on a node that has applied up to `applied`, with the
/// state in `engine`. See the module docs.
pub fn check(
    meta: &Meta,
    data: impl Read,
    applied: Option<LogId<NodeId>>,
    engine: &SharedEngine,
) -> Result<(), String> {
    check_decoded(meta, data, applied, engine).map(drop)
}

/// [`check`], and what the data decoded to.
fn check_decoded(
    meta: &Meta,
    data: impl Read,
    applied: Option<LogId<NodeId>>,
    engine: &SharedEngine,
) -> Result<Decoded, String> {
    let decoded = decode_received(meta, data).map_err(|e| e.to_string())?;
    check_engine(meta, &decoded.payload.engine, applied, engine)?;
    Ok(decoded)
}

/// The checks of the engine `received` of the snapshot of `meta`.
fn check_engine(
    meta: &Meta,
    received: &Engine,
    applied: Option<LogId<NodeId>>,
    engine: &SharedEngine,
) -> Result<(), String> {
    received.check_consistency()?;
    if meta.last_log_id <= applied {
        // openraft ignores a snapshot it has already applied past.
        return Ok(());
    }
    let local = read_engine(engine).map_err(|_| "this node's engine lock is poisoned".to_string())?;
    if let (Some(theirs), Some(ours)) = (received.cluster_id(), local.cluster_id()) {
        if theirs != ours {
            return Err(format!("it is of cluster {theirs}, this node is of cluster {ours}"));
        }
    }
    let (theirs, ours) = (received.stats().token_counter, local.stats().token_counter);
    if theirs < ours {
        return Err(format!(
            "its token counter ({theirs}) is below this node's ({ours}): installing it would send tokens backwards"
        ));
    }
    Ok(())
}

/// Shared by clones of the service.
pub type SharedReceiver = Arc<Receiver>;

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Issue 38 §3: no size cliff. A stream of any size a disk can hold is
    /// admitted, far beyond the 1 GiB that was refused before.
    #[test]
    fn a_stream_far_beyond_a_gib_is_admitted_while_the_disk_has_room() {
        let limits = Limits::default();
        let (end, written) = (64 << 30, (64 << 30) - MIB);
        assert!(limits.admit("s", end, written, 10 << 30).is_ok());
    }

    /// A chunk that would leave the disk less than its reserve is refused
    /// before it is written, as no room (RESOURCE_EXHAUSTED).
    #[test]
    fn a_chunk_that_would_eat_the_reserve_is_refused_as_no_room() {
        let limits = Limits { max_bytes: u64::MAX, reserve_bytes: 100 * MIB };
        assert!(limits.admit("s", 10 * MIB, 9 * MIB, 101 * MIB).is_ok());
        let err = limits.admit("s", 10 * MIB, 9 * MIB, 100 * MIB).unwrap_err();
        assert!(matches!(err, Refused::NoRoom { .. }), "{err}");
        assert!(err.to_string().contains("keeps 104857600 in reserve"), "{err}");
    }

    /// The configured bound refuses a stream that passes it (INVALID_ARGUMENT).
    #[test]
    fn a_stream_past_the_bound_is_refused_as_invalid() {
        let limits = Limits { max_bytes: 10 * MIB, reserve_bytes: 0 };
        assert!(limits.admit("s", 10 * MIB, 0, u64::MAX).is_ok());
        let err = limits.admit("s", 10 * MIB + 1, 10 * MIB, u64::MAX).unwrap_err();
        assert!(matches!(err, Refused::Invalid { .. }), "{err}");
    }

    /// A chunk sent again (a retry) needs no more room than it already has.
    #[test]
    fn a_chunk_sent_again_needs_no_more_room() {
        let limits = Limits { max_bytes: u64::MAX, reserve_bytes: MIB };
        assert!(limits.admit("s", 5 * MIB, 5 * MIB, MIB).is_ok());
    }
}
