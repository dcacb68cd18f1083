//! [`Session`]: many operations multiplexed on one bidirectional `Session` stream.
//!
//! Where it sits: beside the unary path of [`crate::Client`], for high-rate
//! callers (the 64-client benchmark). Requests go out through an unbounded
//! channel that feeds the stream; each carries an `op_id`, and one reader task
//! matches responses to waiting callers by `op_id` (responses come in any order; a
//! queued acquire is answered when the server grants it). Many tasks may call one
//! session at once (`&self`, cheap clones).
//!
//! A session is low-level: no lease watchdog, no guards, no retries. If the stream
//! breaks, every pending and later call fails with [`Error::Unavailable`] and the
//! caller opens a new session; the server cancels the stream's queued acquires
//! when it ends. Each call has a deadline (the client's RPC timeout, plus the wait
//! for an acquire). Dropping an acquire's future (or its deadline passing) sends a
//! `Cancel` for it, and the server releases a grant that had not reached the
//! client; a grant that reached the reader after its caller left is released by
//! the reader. A multi-lock ([`Session::acquire_all`]) is one acquire naming
//! several locks: its cancel withdraws it from every queue or releases every
//! grant of it, and the reader releases each of its grants.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fencelock_proto::v1 as pb;
use fencelock_proto::v1::session_request::Op;
use fencelock_proto::v1::session_response::Result as Reply;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};

use crate::backend::native::acquire::check_multi;
use crate::backend::native::proto::{acquire_all_from_proto, acquire_all_of, acquire_from_proto};
use crate::backend::native::rpc::{new_request_id, Grpc};
use crate::backend::Acquire;
use crate::error::{is_auth_refusal, Error};
use crate::types::{ms, to_ms, Acquired, CheckResult, LockOptions};

/// One `Session` stream. Cheap to clone; the stream closes when the last clone is
/// dropped.
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::UnboundedSender<pb::SessionRequest>,
    pending: Arc<Mutex<Pending>>,
    rpc_timeout: Duration,
    /// The client's identity ([`crate::ClientBuilder::identity`]), sent with
    /// every acquire ("" for none).
    identity: String,
}

/// Callers waiting for an answer, by op_id.
#[derive(Debug, Default)]
struct Pending {
    ops: HashMap<u64, oneshot::Sender<Result<Reply, Error>>>,
    /// The next op_id (ids are unique for the life of the stream).
    next_op: u64,
    /// Set when the stream ended: every later call fails with it.
    closed: Option<Error>,
}

impl Session {
    /// Opens the stream (the answer to its headers is awaited for `rpc_timeout`);
    /// its acquires carry `identity`.
    pub(crate) async fn open(mut client: Grpc, rpc_timeout: Duration, identity: String) -> Result<Session, Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        let opened = tokio::time::timeout(rpc_timeout, client.session(UnboundedReceiverStream::new(rx)))
            .await
            .map_err(|_| Error::Timeout)?
            .map_err(|s| Error::from_status(&s))?;
        let pending = Arc::new(Mutex::new(Pending { next_op: 1, ..Pending::default() }));
        tokio::spawn(read(opened.into_inner(), pending.clone(), tx.downgrade()));
        Ok(Session { inner: Arc::new(Inner { tx, pending, rpc_timeout, identity }) })
    }

    /// Grants a lease of `ttl`; returns its id. Nothing keeps it alive: call
    /// [`keep_alive`](Self::keep_alive) well within the TTL.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<u64, Error> {
        let op = Op::GrantLease(pb::GrantLeaseRequest { request_id: new_request_id(), ttl_ms: to_ms(ttl) });
        match self.call(op, self.inner.rpc_timeout, false).await? {
            Reply::GrantLease(r) => Ok(r.lease_id),
            other => Err(mismatch("grant_lease", &other)),
        }
    }

    /// Renews a lease; returns its TTL, which now runs from when the server
    /// handled the request (count your own deadline from before the call).
    pub async fn keep_alive(&self, lease_id: u64) -> Result<Duration, Error> {
        let op = Op::KeepAlive(pb::KeepAliveRequest { request_id: new_request_id(), lease_id });
        match self.call(op, self.inner.rpc_timeout, false).await? {
            Reply::KeepAlive(r) => Ok(ms(r.ttl_ms)),
            other => Err(mismatch("keep_alive", &other)),
        }
    }

    /// Ends a lease now, releasing its locks.
    pub async fn revoke_lease(&self, lease_id: u64) -> Result<(), Error> {
        let op = Op::RevokeLease(pb::RevokeLeaseRequest { request_id: new_request_id(), lease_id });
        match self.call(op, self.inner.rpc_timeout, false).await? {
            Reply::RevokeLease(_) => Ok(()),
            other => Err(mismatch("revoke_lease", &other)),
        }
    }

    /// Takes `lock` for `lease_id`, waiting in the FIFO queue up to `wait` (zero:
    /// try once). The answer is pushed by the server when granted. Dropping the
    /// future cancels the request on the server.
    pub async fn acquire(
        &self,
        lock: &str,
        lease_id: u64,
        wait: Duration,
        lock_delay: Duration,
    ) -> Result<Acquire<Acquired>, Error> {
        match self.call_acquire(&[lock], lease_id, wait, lock_delay).await? {
            Reply::Acquire(r) => acquire_from_proto(r),
            other => Err(mismatch("acquire", &other)),
        }
    }

    /// Takes every lock of `locks` for `lease_id` at once, exclusively, as
    /// [`acquire`](Self::acquire) takes one: the server grants all of them in
    /// one log entry or none, and a waiting request queues on every lock at
    /// once. The grants come one per lock, in the order named. 2 to 16
    /// distinct names ([`Error::InvalidArgument`] otherwise, before anything
    /// is sent). Dropping the future withdraws the request from every queue
    /// (or releases every grant of it) on the server.
    pub async fn acquire_all(
        &self,
        locks: &[&str],
        lease_id: u64,
        wait: Duration,
        lock_delay: Duration,
    ) -> Result<Acquire<Vec<Acquired>>, Error> {
        check_multi(locks, &LockOptions::default())?;
        match self.call_acquire(locks, lease_id, wait, lock_delay).await? {
            Reply::Acquire(r) => acquire_all_of(r, locks),
            other => Err(mismatch("acquire_all", &other)),
        }
    }

    /// One exclusive acquire of `locks` (the first, then its `also`), waiting
    /// up to `wait`, cancelled if abandoned.
    async fn call_acquire(
        &self,
        locks: &[&str],
        lease_id: u64,
        wait: Duration,
        lock_delay: Duration,
    ) -> Result<Reply, Error> {
        let op = Op::Acquire(pb::AcquireRequest {
            request_id: new_request_id(),
            lease_id,
            lock: locks[0].to_string(),
            wait_ms: to_ms(wait),
            lock_delay_ms: to_ms(lock_delay),
            identity: self.inner.identity.clone(),
            also: locks[1..].iter().map(|l| l.to_string()).collect(),
            ..Default::default()
        });
        self.call(op, wait + self.inner.rpc_timeout, true).await
    }

    /// Releases `(lock, lease_id, token)` if it is the current grant.
    pub async fn release(&self, lock: &str, lease_id: u64, token: u64) -> Result<bool, Error> {
        let op = Op::Release(release_request(lock.to_string(), lease_id, token));
        match self.call(op, self.inner.rpc_timeout, false).await? {
            Reply::Release(r) => Ok(r.released),
            other => Err(mismatch("release", &other)),
        }
    }

    /// Is `token` the current live grant of `lock`?
    pub async fn check(&self, lock: &str, token: u64) -> Result<CheckResult, Error> {
        let op = Op::Check(pb::CheckRequest { lock: lock.to_string(), token });
        match self.call(op, self.inner.rpc_timeout, false).await? {
            Reply::Check(r) => Ok(r.into()),
            other => Err(mismatch("check", &other)),
        }
    }

    /// True once the stream has ended; every call then fails.
    pub fn is_closed(&self) -> bool {
        lock(&self.inner.pending).closed.is_some()
    }

    /// Sends `op` and waits up to `timeout` for its answer. With `cancel`, a call
    /// abandoned before its answer sends a `Cancel` for it.
    async fn call(&self, op: Op, timeout: Duration, cancel: bool) -> Result<Reply, Error> {
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
        let answer = tokio::time::timeout(timeout, rx).await.map_err(|_| Error::Timeout)?;
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
            Ok(None) => break Error::Unavailable("session stream ended".into()),
            // A refused token is said as such, not as a broken stream.
            Err(status) if is_auth_refusal(&status) => break Error::from_status(&status),
            Err(status) => break Error::Unavailable(format!("session stream failed: {}", status.message())),
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
    let answer = match resp.result {
        Some(Reply::Error(e)) => Err(Error::from_status(&Status::new(Code::from(e.code), e.message))),
        Some(reply) => Ok(reply),
        None => Err(Error::Protocol("SessionResponse without a result".into())),
    };
    if let Err(Ok(Reply::Acquire(resp))) = waiter.send(answer) {
        if let (Ok(Acquire::Acquired(grants)), Some(tx)) = (acquire_all_from_proto(resp), tx.upgrade()) {
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

fn release_request(lock: String, lease_id: u64, token: u64) -> pb::ReleaseRequest {
    pb::ReleaseRequest { request_id: new_request_id(), lease_id, lock, token }
}

fn closed() -> Error {
    Error::Unavailable("session stream closed".into())
}

fn mismatch(op: &str, reply: &Reply) -> Error {
    Error::Protocol(format!("{op} answered with {reply:?}"))
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
