//! A fake fencelock server for the unit tests of the client: in memory, one
//! process, with knobs to inject the failures the client must survive (lost
//! responses, hung keep-alives, leases revoked behind the client's back).
//!
//! It is not the real engine: leases never expire by themselves, waiting is a
//! simple wake-everyone loop (not FIFO), and only acquire requests are
//! de-duplicated. Every handled request is appended to an event log that tests
//! await with [`Mock::wait_for`] instead of sleeping.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock_proto::v1 as pb;
use fencelock_proto::v1::lock_server::{Lock, LockServer};
use fencelock_proto::v1::session_request::Op;
use fencelock_proto::v1::session_response::Result as Reply;
use pb::acquire_response::Outcome;
use tokio::sync::{mpsc, watch, Notify};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
pub(crate) struct Mock {
    inner: Arc<Shared>,
}

#[derive(Default)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Woken whenever a lock is freed.
    freed: Notify,
    events: watch::Sender<Vec<String>>,
    /// The next N acquires are applied, but answered with UNAVAILABLE (a lost
    /// response).
    pub lose_acquire_responses: AtomicU32,
    /// With a lost answer, also release the grant, as the server does for a grant
    /// whose caller went away; a retry then gets the first (now stale) answer.
    pub release_lost_grants: AtomicBool,
    /// Keep-alives hang forever.
    pub stall_keep_alives: AtomicBool,
}

#[derive(Default)]
struct State {
    last_lease: u64,
    /// lease -> ttl_ms
    leases: HashMap<u64, u64>,
    last_token: u64,
    /// lock -> (lease, token)
    locks: HashMap<String, (u64, u64)>,
    /// request id -> first answer
    acquired: HashMap<u64, pb::AcquireResponse>,
}

impl Mock {
    /// Starts the fake on 127.0.0.1; returns it and its URL.
    pub async fn start() -> (Mock, String) {
        let mock = Mock::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let service = LockServer::new(mock.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (mock, url)
    }

    pub fn knobs(&self) -> &Shared {
        &self.inner
    }

    /// The events so far, e.g. `"grant 1"`, `"acquire a req=… lease=1"`,
    /// `"revoke 1"`, `"release a 1 3 -> true"`.
    pub fn events(&self) -> Vec<String> {
        self.inner.events.borrow().clone()
    }

    /// Waits (up to 10 s) until an event satisfies `pred`; panics otherwise.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let mut rx = self.inner.events.subscribe();
        let found = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|ev| ev.iter().any(|e| pred(e))));
        if found.await.is_err() {
            panic!("no event {what:?} in {:#?}", self.events());
        }
    }

    /// Revokes a lease directly, as another client would.
    pub fn revoke(&self, lease: u64) {
        self.handle_revoke(lease).expect("a known lease");
    }

    /// The current grant of `lock`.
    pub fn holder(&self, lock: &str) -> Option<(u64, u64)> {
        self.inner.state.lock().unwrap().locks.get(lock).copied()
    }

    fn log(&self, event: String) {
        self.inner.events.send_modify(|ev| ev.push(event));
    }

    fn handle_grant(&self, ttl_ms: u64) -> Result<pb::GrantLeaseResponse, Status> {
        if ttl_ms < 100 {
            return Err(Status::invalid_argument(format!("invalid ttl: {ttl_ms} ms")));
        }
        let lease_id = {
            let mut s = self.inner.state.lock().unwrap();
            s.last_lease += 1;
            let id = s.last_lease;
            s.leases.insert(id, ttl_ms);
            id
        };
        self.log(format!("grant {lease_id}"));
        Ok(pb::GrantLeaseResponse { lease_id, ttl_ms })
    }

    async fn handle_keep_alive(&self, lease_id: u64) -> Result<pb::KeepAliveResponse, Status> {
        if self.inner.stall_keep_alives.load(Ordering::SeqCst) {
            self.log(format!("keep_alive {lease_id} stalled"));
            std::future::pending::<()>().await;
        }
        let ttl_ms = self.inner.state.lock().unwrap().leases.get(&lease_id).copied();
        self.log(format!("keep_alive {lease_id} -> {}", ttl_ms.is_some()));
        match ttl_ms {
            Some(ttl_ms) => Ok(pb::KeepAliveResponse { lease_id, ttl_ms }),
            None => Err(Status::not_found(format!("lease {lease_id} not found"))),
        }
    }

    fn handle_revoke(&self, lease_id: u64) -> Result<pb::RevokeLeaseResponse, Status> {
        let known = {
            let mut s = self.inner.state.lock().unwrap();
            s.locks.retain(|_, (lease, _)| *lease != lease_id);
            s.leases.remove(&lease_id).is_some()
        };
        self.inner.freed.notify_waiters();
        self.log(format!("revoke {lease_id} -> {known}"));
        match known {
            true => Ok(pb::RevokeLeaseResponse {}),
            false => Err(Status::not_found(format!("lease {lease_id} not found"))),
        }
    }

    async fn handle_acquire(&self, r: pb::AcquireRequest) -> Result<pb::AcquireResponse, Status> {
        self.log(format!("acquire {} req={} lease={} wait={}", r.lock, r.request_id, r.lease_id, r.wait_ms));
        let mut dropped = LogOnDrop(Some((self.clone(), format!("acquire {} req={} dropped", r.lock, r.request_id))));
        let result = self.wait_acquire(&r).await;
        dropped.0 = None;
        let lose = |n: u32| n.checked_sub(1);
        let knob = &self.inner.lose_acquire_responses;
        if result.is_ok() && knob.fetch_update(Ordering::SeqCst, Ordering::SeqCst, lose).is_ok() {
            self.log(format!("acquire {} req={} answer lost", r.lock, r.request_id));
            if self.inner.release_lost_grants.load(Ordering::SeqCst) {
                self.inner.state.lock().unwrap().locks.remove(&r.lock);
            }
            return Err(Status::unavailable("response lost"));
        }
        result
    }

    async fn wait_acquire(&self, r: &pb::AcquireRequest) -> Result<pb::AcquireResponse, Status> {
        let until = tokio::time::Instant::now() + Duration::from_millis(r.wait_ms);
        loop {
            let freed = self.inner.freed.notified();
            match self.try_acquire(r)? {
                Some(resp) => return Ok(resp),
                None if r.wait_ms == 0 => return Ok(self.busy(&r.lock)),
                None => {
                    if tokio::time::timeout_at(until, freed).await.is_err() {
                        return Ok(pb::AcquireResponse { outcome: Some(Outcome::TimedOut(pb::TimedOut {})) });
                    }
                }
            }
        }
    }

    /// The grant (new or de-duplicated), or None if the lock is held.
    fn try_acquire(&self, r: &pb::AcquireRequest) -> Result<Option<pb::AcquireResponse>, Status> {
        let mut s = self.inner.state.lock().unwrap();
        if let Some(first) = s.acquired.get(&r.request_id) {
            return Ok(Some(first.clone()));
        }
        if !s.leases.contains_key(&r.lease_id) {
            return Err(Status::not_found(format!("lease {} not found", r.lease_id)));
        }
        if s.locks.contains_key(&r.lock) {
            return Ok(None);
        }
        s.last_token += 1;
        let token = s.last_token;
        s.locks.insert(r.lock.clone(), (r.lease_id, token));
        let grant = pb::Acquired { lock: r.lock.clone(), lease_id: r.lease_id, token, waited_ms: 0 };
        let resp = pb::AcquireResponse { outcome: Some(Outcome::Acquired(grant)) };
        s.acquired.insert(r.request_id, resp.clone());
        drop(s);
        self.log(format!("granted {} lease={} token={token}", r.lock, r.lease_id));
        Ok(Some(resp))
    }

    fn busy(&self, lock: &str) -> pb::AcquireResponse {
        let holder = self.holder(lock).map(|(lease_id, token)| pb::Holder { lease_id, token, ..Default::default() });
        pb::AcquireResponse { outcome: Some(Outcome::Busy(pb::Busy { holder, reopens_in_ms: None, waiters: 0 })) }
    }

    fn handle_release(&self, r: &pb::ReleaseRequest) -> pb::ReleaseResponse {
        let released = {
            let mut s = self.inner.state.lock().unwrap();
            let current = s.locks.get(&r.lock) == Some(&(r.lease_id, r.token));
            if current {
                s.locks.remove(&r.lock);
            }
            current
        };
        self.inner.freed.notify_waiters();
        self.log(format!("release {} {} {} -> {released}", r.lock, r.lease_id, r.token));
        pb::ReleaseResponse { released }
    }

    fn handle_check(&self, r: &pb::CheckRequest) -> pb::CheckResponse {
        let current_token = self.holder(&r.lock).map(|(_, t)| t);
        pb::CheckResponse { current: current_token == Some(r.token), current_token }
    }

    async fn handle_op(&self, op: Op) -> Result<Reply, Status> {
        Ok(match op {
            Op::GrantLease(r) => Reply::GrantLease(self.handle_grant(r.ttl_ms)?),
            Op::KeepAlive(r) => Reply::KeepAlive(self.handle_keep_alive(r.lease_id).await?),
            Op::RevokeLease(r) => Reply::RevokeLease(self.handle_revoke(r.lease_id)?),
            Op::Acquire(r) => Reply::Acquire(self.handle_acquire(r).await?),
            Op::Release(r) => Reply::Release(self.handle_release(&r)),
            Op::Check(r) => Reply::Check(self.handle_check(&r)),
            Op::Cancel(r) => {
                self.log(format!("cancel op {}", r.op_id));
                Reply::Cancel(pb::CancelResponse { released: false })
            }
        })
    }
}

/// Logs its event if dropped while armed: the client cancelled the call.
struct LogOnDrop(Option<(Mock, String)>);

impl Drop for LogOnDrop {
    fn drop(&mut self) {
        if let Some((mock, event)) = self.0.take() {
            mock.log(event);
        }
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::SessionResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lock for Mock {
    async fn grant_lease(&self, r: Request<pb::GrantLeaseRequest>) -> Result<Response<pb::GrantLeaseResponse>, Status> {
        self.handle_grant(r.into_inner().ttl_ms).map(Response::new)
    }

    async fn keep_alive(&self, r: Request<pb::KeepAliveRequest>) -> Result<Response<pb::KeepAliveResponse>, Status> {
        self.handle_keep_alive(r.into_inner().lease_id).await.map(Response::new)
    }

    async fn revoke_lease(
        &self,
        r: Request<pb::RevokeLeaseRequest>,
    ) -> Result<Response<pb::RevokeLeaseResponse>, Status> {
        self.handle_revoke(r.into_inner().lease_id).map(Response::new)
    }

    async fn acquire(&self, r: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        self.handle_acquire(r.into_inner()).await.map(Response::new)
    }

    async fn release(&self, r: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        Ok(Response::new(self.handle_release(&r.into_inner())))
    }

    async fn check(&self, r: Request<pb::CheckRequest>) -> Result<Response<pb::CheckResponse>, Status> {
        Ok(Response::new(self.handle_check(&r.into_inner())))
    }

    async fn describe_lock(
        &self,
        r: Request<pb::DescribeLockRequest>,
    ) -> Result<Response<pb::DescribeLockResponse>, Status> {
        let name = r.into_inner().lock;
        let holder = self.holder(&name).map(|(lease_id, token)| pb::Holder { lease_id, token, ..Default::default() });
        let lock = pb::LockInfo { name, holder, reopens_in_ms: None, waiters: vec![] };
        Ok(Response::new(pb::DescribeLockResponse { lock: Some(lock) }))
    }

    async fn list_locks(&self, _: Request<pb::ListLocksRequest>) -> Result<Response<pb::ListLocksResponse>, Status> {
        Err(Status::unimplemented("mock"))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        r: Request<tonic::Streaming<pb::SessionRequest>>,
    ) -> Result<Response<SessionStream>, Status> {
        let mut inbound = r.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = inbound.next().await {
                let (me, tx) = (me.clone(), tx.clone());
                tokio::spawn(async move {
                    let Some(op) = req.op else { return };
                    let result = match me.handle_op(op).await {
                        Ok(reply) => reply,
                        Err(s) => Reply::Error(pb::Error { code: s.code() as i32, message: s.message().into() }),
                    };
                    let _ = tx.send(Ok(pb::SessionResponse { op_id: req.op_id, result: Some(result) }));
                });
            }
            me.log("session ended".into());
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}
