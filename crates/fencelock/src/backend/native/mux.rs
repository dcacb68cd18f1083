//! [`Mux`]: one bidirectional `Session` stream, many operations multiplexed on
//! it, answers matched back to their callers by `op_id`.
//!
//! Where it sits: the one place where a stream's answers are matched to its
//! operations. Two users sit on it: the public [`super::session::Session`]
//! (typed calls with deadlines) and the client's stream transport
//! ([`super::transport`]), which sends the [`crate::Client`]'s acquires,
//! releases and keep-alives over one shared [`Mux`] per server, under the
//! retries of [`super::rpc::Rpc`].
//!
//! Requests go out through an unbounded channel that feeds the stream; each
//! carries an `op_id`, and one reader task matches responses to waiting
//! callers (responses come in any order; a queued acquire is answered when
//! the server grants it). Many tasks may call one stream at once (`&self`,
//! cheap clones). No retries here: if the stream breaks, every pending and
//! later call fails with `UNAVAILABLE` (a refused token with its own status)
//! and the caller opens a new stream; the server cancels the stream's queued
//! acquires when it ends. Dropping an acquire's call sends a `Cancel` for it,
//! and the server releases a grant that had not reached the client; a grant
//! that reached the reader after its caller left is released by the reader
//! (every grant of a multi-lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use fencelock_proto::v1 as pb;
use fencelock_proto::v1::session_request::Op;
use fencelock_proto::v1::session_response::Result as Reply;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Status, Streaming};

use crate::backend::native::proto::acquire_all_from_proto;
use crate::backend::native::wire::{new_request_id, Grpc};
use crate::backend::Outcome;
use crate::error::is_auth_refusal;

/// One `Session` stream: operations out, answers matched back by `op_id`.
/// Cheap to clone; the stream closes when the last clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Mux {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::UnboundedSender<pb::SessionRequest>,
    pending: Arc<Mutex<Pending>>,
}

/// Callers waiting for an answer, by op_id.
#[derive(Debug, Default)]
struct Pending {
    ops: HashMap<u64, oneshot::Sender<Result<Reply, Status>>>,
    /// The next op_id (ids are unique for the life of the stream).
    next_op: u64,
    /// Set when the stream ended: every later call fails with it.
    closed: Option<Status>,
}

impl Mux {
    /// Opens the stream on `client`'s connection and waits for the server to
    /// accept it (the caller bounds the wait).
    pub(crate) async fn open(mut client: Grpc) -> Result<Mux, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let opened = client.session(UnboundedReceiverStream::new(rx)).await?;
        let pending = Arc::new(Mutex::new(Pending { next_op: 1, ..Pending::default() }));
        tokio::spawn(read(opened.into_inner(), pending.clone(), tx.downgrade()));
        Ok(Mux { inner: Arc::new(Inner { tx, pending }) })
    }

    /// True once the stream has ended; every call then fails.
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.inner.pending).closed.is_some()
    }

    /// Sends `op` and waits for its answer: the server's reply, which may be
    /// its error ([`Reply::Error`]); `Err` only when the stream broke
    /// (`UNAVAILABLE`, or the refusal that ended it). With `cancel`, a call
    /// dropped before its answer sends a `Cancel` for it.
    pub(crate) async fn call(&self, op: Op, cancel: bool) -> Result<Reply, Status> {
        let (tx, rx) = oneshot::channel();
        let op_id = {
            let mut pending = lock(&self.inner.pending);
            if let Some(e) = &pending.closed {
                return Err(e.clone());
            }
            let op_id = pending.op_id();
            pending.ops.insert(op_id, tx);
            op_id
        };
        let mut waiting = Waiting { inner: &self.inner, op_id, cancel, answered: false };
        if self.inner.tx.send(pb::SessionRequest { op_id, op: Some(op) }).is_err() {
            waiting.answered = true;
            return Err(closed());
        }
        let answer = rx.await;
        waiting.answered = true;
        answer.unwrap_or_else(|_| Err(closed()))
    }
}

/// An op waiting for its answer; on drop before the answer, it forgets the op and
/// (for an acquire) cancels it on the server.
struct Waiting<'a> {
    inner: &'a Inner,
    op_id: u64,
    cancel: bool,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut pending = lock(&self.inner.pending);
        // If it is no longer pending, the reader took the answer and, finding us
        // gone, releases a grant itself.
        if pending.ops.remove(&self.op_id).is_some() && self.cancel {
            let cancel_id = pending.op_id();
            let op = Op::Cancel(pb::CancelRequest { op_id: self.op_id });
            let _ = self.inner.tx.send(pb::SessionRequest { op_id: cancel_id, op: Some(op) });
        }
    }
}

/// The reader task: delivers answers until the stream ends, then fails every
/// pending and later call.
async fn read(
    mut inbound: Streaming<pb::SessionResponse>,
    pending: Arc<Mutex<Pending>>,
    tx: mpsc::WeakUnboundedSender<pb::SessionRequest>,
) {
    let end = loop {
        match inbound.message().await {
            Ok(Some(resp)) => deliver(resp, &pending, &tx),
            Ok(None) => break Status::unavailable("session stream ended"),
            // A refused token is said as such, not as a broken stream.
            Err(status) if is_auth_refusal(&status) => break status,
            // Anything else broke the stream: the outcome of its operations
            // is unknown, so they may be retried (with their request ids).
            Err(status) => break Status::unavailable(format!("session stream failed: {}", status.message())),
        }
    };
    tracing::debug!(error = %end, "fencelock: session closed");
    let waiters: Vec<_> = {
        let mut p = lock(&pending);
        p.closed = Some(end.clone());
        p.ops.drain().map(|(_, w)| w).collect()
    };
    for w in waiters {
        let _ = w.send(Err(end.clone()));
    }
}

/// Hands one answer to its caller. A grant whose caller has gone is released
/// (every grant of a multi-lock).
fn deliver(resp: pb::SessionResponse, pending: &Mutex<Pending>, tx: &mpsc::WeakUnboundedSender<pb::SessionRequest>) {
    let Some(waiter) = lock(pending).ops.remove(&resp.op_id) else {
        return; // an abandoned op (cancelled on the server) or a cancel's answer
    };
    let answer = resp.result.ok_or_else(|| Status::internal("SessionResponse without a result"));
    if let Err(Ok(Reply::Acquire(resp))) = waiter.send(answer) {
        if let (Ok(Outcome::Acquired(grants)), Some(tx)) = (acquire_all_from_proto(resp), tx.upgrade()) {
            for a in grants {
                let op_id = lock(pending).op_id();
                let op = Op::Release(release_request(a.lock, a.lease_id, a.token));
                let _ = tx.send(pb::SessionRequest { op_id, op: Some(op) });
            }
        }
    }
}

impl Pending {
    /// A fresh op_id. Answers to ops nobody waits for (cancels, background
    /// releases) find no entry and are dropped.
    fn op_id(&mut self) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        id
    }
}

/// A release of one grant, with a fresh request id.
pub(crate) fn release_request(lock: String, lease_id: u64, token: u64) -> pb::ReleaseRequest {
    pb::ReleaseRequest { request_id: new_request_id(), lease_id, lock, token }
}

fn closed() -> Status {
    Status::unavailable("session stream closed")
}

fn lock(pending: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant whose caller left before the reader delivered it is released
    /// by the reader: every grant of a multi-lock, not only a single one
    /// (INV-18: a multi-lock abandoned after its grant leaves no hold).
    #[test]
    fn a_multi_grant_nobody_waits_for_is_released_lock_by_lock() {
        let (tx, mut sent) = mpsc::unbounded_channel();
        let pending = Mutex::new(Pending { next_op: 2, ..Pending::default() });
        let (caller, gone) = oneshot::channel();
        drop(gone);
        lock(&pending).ops.insert(1, caller);
        let grant = |lock: &str, token| pb::Acquired { lock: lock.into(), lease_id: 7, token, waited_ms: 3 };
        let all = pb::AcquiredAll { grants: vec![grant("a", 10), grant("b", 11)] };
        let outcome = Some(pb::acquire_response::Outcome::AcquiredAll(all));
        let resp = pb::SessionResponse { op_id: 1, result: Some(Reply::Acquire(pb::AcquireResponse { outcome })) };
        deliver(resp, &pending, &tx.downgrade());
        let mut released = Vec::new();
        while let Ok(pb::SessionRequest { op: Some(Op::Release(r)), .. }) = sent.try_recv() {
            released.push((r.lock, r.lease_id, r.token));
        }
        assert_eq!(released, vec![("a".to_string(), 7, 10), ("b".to_string(), 7, 11)]);
    }
}
