//! [`Session`]: the public face of one `Session` stream, with typed calls.
//!
//! Where it sits: over [`super::mux`] (the stream itself, which matches
//! answers to operations by `op_id`), for callers that manage their own leases
//! (the 64-client benchmark); [`crate::Client::session`] opens one. The
//! client's own locks share a stream of their own through
//! [`super::transport`]. A session is low-level: no lease watchdog, no
//! guards, no retries. If the stream breaks, every pending and later call
//! fails with [`Error::Unavailable`] and the caller opens a new session; the
//! server cancels the stream's queued acquires when it ends. Each call has a
//! deadline (the client's RPC timeout, plus the wait for an acquire); dropping
//! an acquire's future (or its deadline passing) cancels it on the server (see
//! [`super::mux`]). A multi-lock ([`Session::acquire_all`]) is one acquire
//! naming several locks.

use std::sync::Arc;
use std::time::Duration;

use fencelock_proto::v1 as pb;
use fencelock_proto::v1::session_request::Op;
use fencelock_proto::v1::session_response::Result as Reply;
use tonic::{Code, Status};

use crate::backend::native::acquire::check_multi;
use crate::backend::native::mux::{release_request, Mux};
use crate::backend::native::proto::{acquire_all_of, acquire_from_proto};
use crate::backend::native::wire::{new_request_id, Grpc};
use crate::backend::Outcome;
use crate::error::Error;
use crate::types::{ms, to_ms, CheckResult, Grant, LockOptions};

/// One `Session` stream with typed calls, each with a deadline (the client's
/// RPC timeout, plus the wait for an acquire). Cheap to clone; the stream
/// closes when the last clone is dropped. If the stream breaks, every pending
/// and later call fails with [`Error::Unavailable`]: open a new session.
///
/// # Examples
///
/// A session keeps nothing alive by itself: the caller grants the lease, renews
/// it well within its TTL, and releases what it took.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let session = client.session().await?;
/// let lease = session.grant_lease(Duration::from_secs(10)).await?;
/// let outcome = session.acquire("shard/7", lease, Duration::ZERO, Duration::ZERO).await?;
/// if let Outcome::Acquired(grant) = outcome {
///     session.keep_alive(lease).await?; // again within 10 s, or the lease and the lock end
///     // ... write to shard 7 with grant.token ...
///     session.release("shard/7", lease, grant.token).await?;
/// }
/// session.revoke_lease(lease).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Session {
    mux: Mux,
    rpc_timeout: Duration,
    /// The client's identity ([`crate::ClientBuilder::identity`]), sent with
    /// every acquire ("" for none).
    identity: Arc<str>,
}

impl Session {
    /// Opens the stream (the answer to its headers is awaited for `rpc_timeout`);
    /// its acquires carry `identity`.
    pub(crate) async fn open(client: Grpc, rpc_timeout: Duration, identity: String) -> Result<Session, Error> {
        let mux = tokio::time::timeout(rpc_timeout, Mux::open(client))
            .await
            .map_err(|_| Error::Timeout)?
            .map_err(|s| Error::from_status(&s))?;
        Ok(Session { mux, rpc_timeout, identity: identity.into() })
    }

    /// Grants a lease of `ttl`; returns its id. Nothing keeps it alive: call
    /// [`keep_alive`](Self::keep_alive) well within the TTL.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<u64, Error> {
        let op = Op::GrantLease(pb::GrantLeaseRequest { request_id: new_request_id(), ttl_ms: to_ms(ttl) });
        match self.call(op, self.rpc_timeout, false).await? {
            Reply::GrantLease(r) => Ok(r.lease_id),
            other => Err(mismatch("grant_lease", &other)),
        }
    }

    /// Renews a lease; returns its TTL, which now runs from when the server
    /// handled the request (count your own deadline from before the call).
    pub async fn keep_alive(&self, lease_id: u64) -> Result<Duration, Error> {
        let op = Op::KeepAlive(pb::KeepAliveRequest { request_id: new_request_id(), lease_id });
        match self.call(op, self.rpc_timeout, false).await? {
            Reply::KeepAlive(r) => Ok(ms(r.ttl_ms)),
            other => Err(mismatch("keep_alive", &other)),
        }
    }

    /// Ends a lease now, releasing its locks.
    pub async fn revoke_lease(&self, lease_id: u64) -> Result<(), Error> {
        let op = Op::RevokeLease(pb::RevokeLeaseRequest { request_id: new_request_id(), lease_id });
        match self.call(op, self.rpc_timeout, false).await? {
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
    ) -> Result<Outcome<Grant>, Error> {
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
    ) -> Result<Outcome<Vec<Grant>>, Error> {
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
            identity: self.identity.to_string(),
            also: locks[1..].iter().map(|l| l.to_string()).collect(),
            ..Default::default()
        });
        self.call(op, wait + self.rpc_timeout, true).await
    }

    /// Releases `(lock, lease_id, token)` if it is the current grant.
    pub async fn release(&self, lock: &str, lease_id: u64, token: u64) -> Result<bool, Error> {
        let op = Op::Release(release_request(lock.to_string(), lease_id, token));
        match self.call(op, self.rpc_timeout, false).await? {
            Reply::Release(r) => Ok(r.released),
            other => Err(mismatch("release", &other)),
        }
    }

    /// Is `token` the current live grant of `lock`?
    pub async fn check(&self, lock: &str, token: u64) -> Result<CheckResult, Error> {
        let op = Op::Check(pb::CheckRequest { lock: lock.to_string(), token });
        match self.call(op, self.rpc_timeout, false).await? {
            Reply::Check(r) => Ok(r.into()),
            other => Err(mismatch("check", &other)),
        }
    }

    /// True once the stream has ended; every call then fails.
    pub fn is_closed(&self) -> bool {
        self.mux.is_closed()
    }

    /// Sends `op` and waits up to `timeout` for its answer. With `cancel`, a call
    /// abandoned before its answer sends a `Cancel` for it.
    async fn call(&self, op: Op, timeout: Duration, cancel: bool) -> Result<Reply, Error> {
        match tokio::time::timeout(timeout, self.mux.call(op, cancel)).await {
            Err(_elapsed) => Err(Error::Timeout),
            Ok(Ok(Reply::Error(e))) => Err(Error::from_status(&Status::new(Code::from(e.code), e.message))),
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(status)) => Err(Error::from_status(&status)),
        }
    }
}

fn mismatch(op: &str, reply: &Reply) -> Error {
    Error::Protocol(format!("{op} answered with {reply:?}"))
}
