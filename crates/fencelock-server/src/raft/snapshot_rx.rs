//! Receiving a snapshot from the leader: chunks are assembled here, outside
//! openraft's core, and the whole snapshot is checked before openraft acts on it.
//!
//! Where it sits: behind [`super::RaftService`]'s `InstallSnapshot` RPC. openraft's
//! own `Raft::install_snapshot` hands a complete snapshot straight to its core,
//! which moves its committed index, purges the log the snapshot covers and only
//! then asks the state machine to install it. A snapshot that does not decode at
//! that point is a fatal storage error: the node stops, and since the log it
//! purged is gone it cannot start again. Here a snapshot reaches
//! `Raft::install_full_snapshot` only if [`check`] accepts it:
//! - it is at most [`MAX_SNAPSHOT_BYTES`] (checked chunk by chunk);
//! - it decodes, and its data describes the same point of the log as its meta;
//! - the engine in it passes `Engine::check_consistency`;
//! - if openraft would install it (it goes beyond what this node has applied), it
//!   is of this node's cluster (when both know their cluster id), and its token
//!   counter is not below this node's: a snapshot must never send tokens back.
//!
//! The check decodes the whole snapshot, on a blocking thread (seconds at a
//! million leases). A refused snapshot is answered with INVALID_ARGUMENT (a leader backs off and
//! sends again), logged and counted in `fencelock_peer_messages_refused_total`;
//! nothing is changed, nothing is removed.
#![allow(clippy::result_large_err)] // openraft's error types are large by design

use std::sync::Arc;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::network::snapshot_transport::{Chunked, SnapshotTransport, Streaming};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::{LogId, Snapshot};
use tokio::sync::Mutex;

use super::state_machine::{decode_received, SharedEngine};
use super::{NodeId, Raft, TypeConfig};

/// Largest snapshot this node accepts from a peer. The engine of a million
/// leases is a few hundred MiB of JSON; a larger stream is refused before it is
/// buffered.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// The answer openraft's `install_snapshot` would give, JSON-encoded by the caller.
pub type Answer = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// Why a received snapshot is refused.
#[derive(Debug, thiserror::Error)]
#[error("snapshot {id} refused: {why}")]
pub struct Refused {
    id: String,
    why: String,
}

/// The snapshot stream being received (at most one at a time, as in openraft).
#[derive(Default)]
pub struct Receiver {
    streaming: Mutex<Option<Streaming<TypeConfig>>>,
}

impl Receiver {
    /// Takes one chunk; once the last chunk is in, checks the snapshot and only
    /// then installs it. `Ok(Err(_))` is an answer for the sender (stale vote,
    /// out-of-order chunk, fatal error); `Err` is a refusal.
    pub async fn receive(
        &self,
        raft: &Raft,
        engine: &SharedEngine,
        req: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<Answer, Refused> {
        let refused = |why: String| Refused { id: req.meta.snapshot_id.clone(), why };
        let end = req.offset.saturating_add(req.data.len() as u64);
        if end > MAX_SNAPSHOT_BYTES {
            return Err(refused(format!("larger than {MAX_SNAPSHOT_BYTES} bytes")));
        }
        let my_vote = raft.metrics().borrow().vote;
        let vote = req.vote;
        // By term alone: openraft's `Vote` ordering panics (unreachable!) on
        // two committed votes of one term from different nodes, which a peer
        // could send.
        if vote.leader_id().term < my_vote.leader_id().term {
            return Ok(Ok(InstallSnapshotResponse { vote: my_vote }));
        }
        let finished = {
            let mut streaming = self.streaming.lock().await;
            match Chunked::receive_snapshot(&mut *streaming, raft, req).await {
                Ok(finished) => finished,
                Err(e) => return Ok(Err(e)),
            }
        };
        let Some(snapshot) = finished else {
            return Ok(Ok(InstallSnapshotResponse { vote: my_vote }));
        };
        let applied = raft.metrics().borrow().last_applied;
        let snapshot = checked(snapshot, applied, engine).await?;
        Ok(raft.install_full_snapshot(vote, snapshot).await.map(Into::into).map_err(RaftError::Fatal))
    }
}

/// `snapshot`, if [`check`] accepts it, checked on a blocking thread: it
/// decodes the whole snapshot (seconds at a million leases), which must not
/// hold a runtime thread.
async fn checked(
    snapshot: Snapshot<TypeConfig>,
    applied: Option<LogId<NodeId>>,
    engine: &SharedEngine,
) -> Result<Snapshot<TypeConfig>, Refused> {
    let id = snapshot.meta.snapshot_id.clone();
    let engine = engine.clone();
    let verdict = tokio::task::spawn_blocking(move || check(&snapshot, applied, &engine).map(|()| snapshot)).await;
    match verdict {
        Ok(Ok(snapshot)) => Ok(snapshot),
        Ok(Err(why)) => Err(Refused { id, why }),
        Err(join) => Err(Refused { id, why: format!("its check failed: {join}") }),
    }
}

/// Whether `snapshot` may be installed on a node that has applied up to
/// `applied`, with the state in `engine`. See the module docs.
pub fn check(
    snapshot: &Snapshot<TypeConfig>,
    applied: Option<LogId<NodeId>>,
    engine: &SharedEngine,
) -> Result<(), String> {
    let received = decode_received(&snapshot.meta, snapshot.snapshot.get_ref()).map_err(|e| e.to_string())?;
    received.check_consistency()?;
    if snapshot.meta.last_log_id <= applied {
        // openraft ignores a snapshot it has already applied past.
        return Ok(());
    }
    let local = engine.read().map_err(|_| "this node's engine lock is poisoned".to_string())?;
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
