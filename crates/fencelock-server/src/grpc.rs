//! The tonic glue of the `fencelock.v1.Lock` service: unary RPCs delegate to
//! [`Ops`]; the session stream multiplexes the same operations by `op_id`;
//! `WatchLeases` is `crate::lease_events`'.
//!
//! ## Crossings of a session write (issue 19 §3, issue 38 §1)
//!
//! A session's operations run inside the task hyper runs for the session's
//! HTTP/2 stream (see `Session`): a write on a stream goes from the
//! connection's task (h2 hands the frame over) to the stream's task, which
//! decodes it, checks the caller and runs the operation up to the driver;
//! from there it takes the crossings counted in `driver`'s docs (handler →
//! driver → openraft core → log IO → core → state machine worker → core →
//! driver → handler, the handler being the stream's task), which then hands
//! the reply to the connection's task. Before, each operation was spawned as
//! a task of its own (one crossing more, a task created and joined per
//! operation, and the operation's whole future copied into it); later the
//! session still had a task of its own, which passed each reply to the
//! stream's task through a channel (one crossing more per reply).
//!
//! Measured (release build, 2 cores shared with two other builders, load
//! 5-6, one run each, the two builds interleaved; noisy, the server CPU per
//! cycle is the steadier figure). W3 (`fencelock-bench --engines fencelock
//! --workloads W3 --leases 200000 --renewing 1000 --runs 1 --client-mode
//! per-process`): 200k creates took 4.1-6.8 s with a task per operation,
//! 3.2-3.4 s now; 1M (`--leases 1000000`) 25.1 s then, 17.7 s now. W1 at 64
//! clients on one connection (`--workloads W1 --clients 64 --seconds 5
//! --runs 1 --client-mode shared`): server CPU 27.8-31.6 µs per cycle then,
//! 21.0-21.1 with the session's task.
//!
//! Without the session's task (eight alternated pairs of `fencelock-bench
//! --engines fencelock --workloads W1 --clients C --client-mode per-process
//! --runs 1 --seconds 5`, release builds, nothing else running; see
//! `bench/results/2026-12-01-session-stream`): at one client the median
//! server CPU per cycle was 232 against 259 µs (lower in 5 pairs of 8) and
//! the median acquire p50 0.165 against 0.194 ms; at 64 clients 55.3
//! against 58.2 µs (lower in 6 of 8). Each is inside the ±10 % that single
//! runs spread: a direction, not a claimed gain. In the server's profile at
//! one client, its parked workers went from 20.7 % of the samples to 15.8 %.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use fencelock_proto::v1::{self as pb, lock_server, session_request::Op, session_response::Result as R};
use futures::{
    future::{AbortHandle, AbortRegistration, Abortable},
    stream::{FuturesUnordered, Stream, StreamExt},
};
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::access::auth::{Auth, Refusal, Who};
use crate::access::conn_limits::ConnInfo;
use crate::api::Ops;

/// Largest client request message tonic decodes (unary or one session
/// message); a larger one is refused (`OUT_OF_RANGE`) before it is decoded.
/// The largest legitimate request is an acquire: up to 16 lock names (a
/// multi-lock) of at most 512 bytes, a 4 KiB value and a few strings and
/// integers, under 13 KiB. (The Raft service has its own,
/// larger limit: `raft::network::MAX_MESSAGE_BYTES`.)
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Most HTTP/2 streams (calls in flight) one connection may have open: bounds
/// what one connection can hold, far above what a client needs. A session
/// multiplexes its operations on one stream; a unary acquire that waits holds
/// one stream for its wait, so a client over this many waiting at once on one
/// connection queues the rest until a stream frees.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 4096;

/// The `fencelock.v1.Lock` service.
pub struct LockService {
    ops: Ops,
    auth: Arc<Auth>,
    /// Operations in flight per session stream (see [`SessionLimits`]).
    session_limits: SessionLimits,
    /// Turns true on shutdown: open session streams end, so a graceful shutdown
    /// does not wait for clients to close them.
    stop: watch::Receiver<bool>,
    /// The node's watch hub, for `Watch` (see [`crate::watching`]).
    hub: Option<Arc<crate::watching::Hub>>,
}

impl LockService {
    pub fn new(ops: Ops, auth: Arc<Auth>, stop: watch::Receiver<bool>) -> Self {
        let limits = crate::access::conn_limits::ConnLimits::default();
        Self { ops, auth, stop, hub: None, session_limits: SessionLimits::of(&limits) }
    }

    /// Session streams bounded by `limits`' session fields.
    pub fn with_limits(mut self, limits: &crate::access::conn_limits::ConnLimits) -> Self {
        self.session_limits = SessionLimits::of(limits);
        self
    }

    /// Serves `Watch` from `hub` (without, `Watch` is unimplemented).
    pub fn with_watch(self, hub: Arc<crate::watching::Hub>) -> Self {
        Self { hub: Some(hub), ..self }
    }

    /// Who sent `r` (its `authorization` metadata, or its connection's client
    /// certificate).
    fn who<T>(&self, r: &Request<T>) -> Result<Who, Status> {
        Credentials::of(r).authenticate(&self.auth, &self.ops)
    }
}

/// What a call presented to authenticate: kept by a session stream, which
/// authenticates each of its operations with them against the auth file as
/// it is then, as a unary call is (a token removed from the file, or an
/// identity whose rules changed, takes effect on open streams too). Taking
/// them copies no bytes (the header value and the CN are shared).
#[derive(Clone)]
struct Credentials {
    token: Option<tonic::metadata::AsciiMetadataValue>,
    cn: Option<Arc<str>>,
    remote: Option<std::net::SocketAddr>,
}

impl Credentials {
    fn of<T>(r: &Request<T>) -> Credentials {
        let token = r.metadata().get("authorization").cloned();
        let info = r.extensions().get::<ConnInfo>();
        let cn = info.and_then(|c| c.client_cn.clone());
        let remote = info.and_then(|c| c.remote);
        Credentials { token, cn, remote }
    }

    fn authenticate(&self, auth: &Auth, ops: &Ops) -> Result<Who, Status> {
        self.who(auth).map_err(|e| ops.unauthenticated(self.remote, e))
    }

    /// Who these credentials name now (no audit line for a refusal).
    fn who(&self, auth: &Auth) -> Result<Who, Refusal> {
        let token = self.token.as_ref().map(|v| v.to_str().unwrap_or("\u{fffd}"));
        auth.authenticate(token, self.cn.as_deref()).map(|w| w.at(self.remote))
    }

    /// A watch's [`crate::watching::serve::Caller`]: these credentials,
    /// authenticated again at each call.
    fn caller(self, auth: Arc<Auth>) -> crate::watching::serve::Caller {
        Box::new(move || self.who(&auth))
    }
}

#[tonic::async_trait]
impl lock_server::Lock for LockService {
    async fn grant_lease(&self, r: Request<pb::GrantLeaseRequest>) -> Result<Response<pb::GrantLeaseResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.grant_lease(&who, r.into_inner()).await.map(Response::new)
    }

    async fn keep_alive(&self, r: Request<pb::KeepAliveRequest>) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.keep_alive(&who, r.into_inner()).await.map(Response::new)
    }

    async fn revoke_lease(
        &self,
        r: Request<pb::RevokeLeaseRequest>,
    ) -> Result<Response<pb::RevokeLeaseResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.revoke_lease(&who, r.into_inner()).await.map(Response::new)
    }

    async fn acquire(&self, r: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.acquire(&who, r.into_inner()).await.map(Response::new)
    }

    async fn release(&self, r: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.release(&who, r.into_inner()).await.map(Response::new)
    }

    async fn set_value(&self, r: Request<pb::SetValueRequest>) -> Result<Response<pb::SetValueResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.set_value(&who, r.into_inner()).await.map(Response::new)
    }

    async fn complete_slot(
        &self,
        r: Request<pb::CompleteSlotRequest>,
    ) -> Result<Response<pb::CompleteSlotResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.complete_slot(&who, r.into_inner()).await.map(Response::new)
    }

    async fn resize(&self, r: Request<pb::ResizeRequest>) -> Result<Response<pb::ResizeResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.resize(&who, r.into_inner()).await.map(Response::new)
    }

    async fn downgrade(&self, r: Request<pb::DowngradeRequest>) -> Result<Response<pb::DowngradeResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.downgrade(&who, r.into_inner()).await.map(Response::new)
    }

    async fn check(&self, r: Request<pb::CheckRequest>) -> Result<Response<pb::CheckResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.check(&who, r.into_inner()).await.map(Response::new)
    }

    async fn report_refusal(
        &self,
        r: Request<pb::ReportRefusalRequest>,
    ) -> Result<Response<pb::ReportRefusalResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.report_refusal(&who, r.into_inner()).await.map(Response::new)
    }

    async fn describe_lock(
        &self,
        r: Request<pb::DescribeLockRequest>,
    ) -> Result<Response<pb::DescribeLockResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.describe_lock(&who, r.into_inner()).await.map(Response::new)
    }

    async fn list_locks(&self, r: Request<pb::ListLocksRequest>) -> Result<Response<pb::ListLocksResponse>, Status> {
        let who = self.who(&r)?;
        self.ops.list_locks(&who, r.into_inner()).await.map(Response::new)
    }

    type SessionStream = Session;

    async fn session(
        &self,
        r: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let credentials = Credentials::of(&r);
        credentials.authenticate(&self.auth, &self.ops)?;
        let caller = (self.auth.clone(), credentials);
        Ok(Response::new(Session::new(
            self.ops.clone(),
            caller,
            Box::pin(r.into_inner()),
            self.stop.clone(),
            self.session_limits,
        )))
    }

    type WatchLeasesStream = ReceiverStream<Result<pb::LeaseEvent, Status>>;

    async fn watch_leases(
        &self,
        r: Request<pb::WatchLeasesRequest>,
    ) -> Result<Response<Self::WatchLeasesStream>, Status> {
        let credentials = Credentials::of(&r);
        let who = credentials.authenticate(&self.auth, &self.ops)?;
        let watch = self.ops.watch_leases(&who, r.into_inner()).await?;
        let caller = credentials.caller(self.auth.clone());
        Ok(Response::new(ReceiverStream::new(watch.spawn(self.ops.clone(), self.stop.clone(), caller))))
    }

    type WatchStream = crate::watching::serve::PbStream;

    async fn watch(&self, r: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let credentials = Credentials::of(&r);
        let who = credentials.authenticate(&self.auth, &self.ops)?;
        let caller = credentials.caller(self.auth.clone());
        let hub = self.hub.as_ref().ok_or_else(|| Status::unimplemented("this server does not serve watches"))?;
        let r = r.into_inner();
        let selector = crate::watching::serve::Selector::new(r.prefix, r.name);
        self.ops.allow(&who, |w| selector.required(w))?;
        crate::watching::serve::grpc(hub, caller, selector, r.from, self.stop.clone()).map(Response::new)
    }
}

/// How much one session stream may have in flight (from
/// [`crate::access::conn_limits::ConnLimits`]): operations in all, and acquires.
#[derive(Debug, Clone, Copy)]
struct SessionLimits {
    ops: usize,
    acquires: usize,
}

impl SessionLimits {
    fn of(limits: &crate::access::conn_limits::ConnLimits) -> Self {
        // Acquires below the total: waiting ones never stop the stream being read.
        let ops = limits.session_ops_in_flight.max(2);
        Self { ops, acquires: limits.session_acquires_in_flight.clamp(1, ops - 1) }
    }
}

/// One operation of a session, from its start to its reply: yields its
/// `op_id` and reply, or `None` if it was aborted (a cancelled acquire).
type Running = Pin<Box<dyn Future<Output = Option<(u64, R)>> + Send>>;

/// One session stream, as the stream of its replies: hyper's task for the
/// HTTP/2 stream polls it, and each poll reads the requests that have arrived,
/// starts them, and polls the operations that were woken, yielding each reply
/// as its operation ends. The operations run concurrently (a
/// [`FuturesUnordered`], which polls only the operations that were woken), so
/// a queued acquire does not hold up the others, and starting one costs one
/// allocation, not a task spawn (issue 19 §3: spawning a task per operation
/// copied its whole future into the task and woke it through the scheduler,
/// the largest server cost of W3 after the engine). Each operation is one
/// boxed future whose captures are small (the operation's future is built
/// inside it, at its first poll), so it is not copied from wrapper to wrapper.
///
/// The session has no task of its own (issue 38 §1): it ran in one and handed
/// each reply through a channel to hyper's task for the stream, one wake-up
/// more for every reply. Hyper polls it only while the stream has room for a
/// reply under HTTP/2's flow control, and at its limit of operations in
/// flight it reads no more requests: a client that stops reading holds up
/// its own stream, and nothing piles up in the node.
///
/// The session ends (its stream with it) when the client's requests end or
/// fail, or when the server stops: it stops reading, yields the replies of
/// the operations that have ended, and drops the others, which cancels their
/// queued acquires (see `DriverHandle::acquire`); so does dropping it, when
/// the client resets the stream or the connection goes.
pub struct Session {
    /// Shared by the session's operations: one reference count per operation
    /// where a clone of [`Ops`] is one per handle it holds.
    ops: Arc<Ops>,
    /// Checks each operation's caller (see [`Credentials`]).
    auth: Arc<Auth>,
    credentials: Credentials,
    inbound: Inbound,
    /// Ready once the server stops.
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Set when the requests ended or failed, or the server stopped.
    ending: bool,
    running: FuturesUnordered<Running>,
    /// Acquires in flight by op_id: (request id, lease, first lock), for
    /// `Cancel`. A multi-acquire is cancelled by its first lock: the engine's
    /// `CancelWait` withdraws it from every queue (or releases all its grants).
    acquires: HashMap<u64, (u64, u64, String, AbortHandle)>,
    limits: SessionLimits,
}

/// A session's requests: the gRPC call's, or a framed connection's
/// ([`crate::framed`]).
pub(crate) type Inbound = Pin<Box<dyn Stream<Item = Result<pb::SessionRequest, Status>> + Send>>;

/// What opens a session outside a gRPC call: the framed protocol's
/// connections ([`crate::framed`]) get theirs here, with the checks and
/// limits of the `Session` call.
#[derive(Clone)]
pub(crate) struct Sessions {
    ops: Ops,
    auth: Arc<Auth>,
    stop: watch::Receiver<bool>,
    limits: SessionLimits,
}

impl LockService {
    /// Opens sessions as this service's `Session` call does.
    pub(crate) fn sessions(&self) -> Sessions {
        Sessions {
            ops: self.ops.clone(),
            auth: self.auth.clone(),
            stop: self.stop.clone(),
            limits: self.session_limits,
        }
    }
}

impl Sessions {
    /// A session for the connection `info` whose hello carried
    /// `authorization` (the header value a gRPC call would), authenticated
    /// as the `Session` call is: a refusal is audited and returned.
    pub(crate) fn open(&self, authorization: &[u8], info: &ConnInfo, inbound: Inbound) -> Result<Session, Status> {
        let token = match authorization {
            [] => None,
            bytes => Some(
                tonic::metadata::AsciiMetadataValue::try_from(bytes)
                    .map_err(|_| Status::unauthenticated("the hello's authorization is not a valid header value"))?,
            ),
        };
        let credentials = Credentials { token, cn: info.client_cn.clone(), remote: info.remote };
        credentials.authenticate(&self.auth, &self.ops)?;
        let caller = (self.auth.clone(), credentials);
        Ok(Session::new(self.ops.clone(), caller, inbound, self.stop.clone(), self.limits))
    }
}

/// What a session operation does: the API operation, or a reply known at once.
enum Work {
    Op(Who, Op),
    /// `Cancel` of an acquire in flight: its `CancelWait`.
    CancelWait(Who, (u64, u64, String)),
    Now(Result<R, Status>),
}

impl Session {
    fn new(
        ops: Ops,
        (auth, credentials): (Arc<Auth>, Credentials),
        inbound: Inbound,
        mut stop: watch::Receiver<bool>,
        limits: SessionLimits,
    ) -> Self {
        let ops = Arc::new(ops);
        let stop = Box::pin(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        let (running, acquires) = (FuturesUnordered::new(), HashMap::new());
        Self { ops, auth, credentials, inbound, stop, ending: false, running, acquires, limits }
    }

    /// Who sends the stream's next operation, as the auth file says now.
    fn who(&self) -> Result<Who, Status> {
        self.credentials.authenticate(&self.auth, &self.ops)
    }

    /// The next reply of an operation that ended; reads and starts the
    /// requests that arrived meanwhile, while under the limit. `None` once
    /// the session has ended.
    fn poll_reply(&mut self, cx: &mut Context<'_>) -> Poll<Option<pb::SessionResponse>> {
        if !self.ending && self.stop.as_mut().poll(cx).is_ready() {
            self.ending = true;
        }
        loop {
            if let Poll::Ready(Some(done)) = self.running.poll_next_unpin(cx) {
                let Some((op_id, result)) = done else { continue };
                self.acquires.remove(&op_id);
                return Poll::Ready(Some(pb::SessionResponse { op_id, result: Some(result) }));
            }
            if self.ending {
                // Dropping the unfinished operations cancels their queued acquires.
                self.running = FuturesUnordered::new();
                return Poll::Ready(None);
            }
            // At the limit the stream is not read until an operation ends.
            if self.running.len() >= self.limits.ops {
                return Poll::Pending;
            }
            match self.inbound.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(m))) => self.start(m),
                Poll::Ready(Some(Err(_)) | None) => self.ending = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn start(&mut self, m: pb::SessionRequest) {
        let op_id = m.op_id;
        let Some(op) = m.op else {
            let err = Status::invalid_argument("session request without an operation");
            return self.push(op_id, Work::Now(Err(err)), None);
        };
        if let Op::Cancel(c) = op {
            return self.cancel(op_id, c.op_id);
        }
        let who = match self.who() {
            Ok(who) => who,
            Err(refused) => return self.push(op_id, Work::Now(Err(refused)), None),
        };
        let abort = match &op {
            Op::Acquire(_) if self.acquires.len() >= self.limits.acquires => {
                let why = format!(
                    "this session stream has {} acquires in flight, the most it may have; \
                     wait for one to end or use another connection",
                    self.limits.acquires
                );
                return self.push(op_id, Work::Now(Err(Status::resource_exhausted(why))), None);
            }
            Op::Acquire(a) => {
                let (abort, registration) = AbortHandle::new_pair();
                self.acquires.insert(op_id, (a.request_id, a.lease_id, a.lock.clone(), abort));
                Some(registration)
            }
            _ => None,
        };
        self.push(op_id, Work::Op(who, op), abort);
    }

    /// Withdraws the acquire `target`: its operation is aborted (dropped),
    /// which cancels its wait in the driver whoever asks; the `CancelWait` sent
    /// here besides (it answers whether a grant was released) needs the
    /// caller's credentials.
    fn cancel(&mut self, op_id: u64, target: u64) {
        let Some((req, lease, lock, abort)) = self.acquires.remove(&target) else {
            return self.push(op_id, Work::Now(Ok(R::Cancel(pb::CancelResponse { released: false }))), None);
        };
        abort.abort();
        let work = match self.who() {
            Ok(who) => Work::CancelWait(who, (req, lease, lock)),
            Err(refused) => Work::Now(Err(refused)),
        };
        self.push(op_id, work, None);
    }

    /// Runs `work` among the session's operations; its result is the reply to
    /// `op_id`, unless `abort` fires first (then nothing is sent).
    fn push(&mut self, op_id: u64, work: Work, abort: Option<AbortRegistration>) {
        let ops = self.ops.clone();
        self.running.push(Box::pin(async move {
            let result = match abort {
                Some(registration) => Abortable::new(work.run(&ops), registration).await.ok()?,
                None => work.run(&ops).await,
            };
            Some((op_id, result.unwrap_or_else(|s| R::Error(session_error(&s)))))
        }));
    }
}

impl Stream for Session {
    type Item = Result<pb::SessionResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_reply(cx).map(|reply| reply.map(Ok))
    }
}

/// A failed operation's status as a session reply: what a unary call would
/// return, its leader hint included.
fn session_error(s: &Status) -> pb::Error {
    let leader = s.metadata().get(crate::api::LEADER_METADATA).and_then(|v| v.to_str().ok()).unwrap_or_default();
    pb::Error { code: s.code() as i32, message: s.message().to_string(), leader: leader.to_string() }
}

impl Work {
    async fn run(self, ops: &Ops) -> Result<R, Status> {
        match self {
            Work::Op(who, op) => run_op(ops, &who, op).await,
            Work::CancelWait(who, (req, lease, lock)) => ops.cancel_wait(&who, req, lease, lock).await.map(R::Cancel),
            Work::Now(result) => result,
        }
    }
}

async fn run_op(ops: &Ops, who: &Who, op: Op) -> Result<R, Status> {
    Ok(match op {
        Op::GrantLease(r) => R::GrantLease(ops.grant_lease(who, r).await?),
        Op::KeepAlive(r) => R::KeepAlive(ops.keep_alive(who, r).await?),
        Op::RevokeLease(r) => R::RevokeLease(ops.revoke_lease(who, r).await?),
        Op::Acquire(r) => R::Acquire(ops.acquire(who, r).await?),
        Op::Release(r) => R::Release(ops.release(who, r).await?),
        Op::Check(r) => R::Check(ops.check(who, r).await?),
        Op::Cancel(_) => return Err(Status::internal("cancel is handled by the session")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverError;

    /// A session's error names the leader as a unary refusal's metadata does.
    #[test]
    fn a_session_error_carries_the_leader_hint() {
        let refused = crate::api::driver_status(DriverError::NotLeader { leader: Some("127.0.0.1:7071".into()) });
        let e = session_error(&refused);
        assert_eq!((e.code, e.leader.as_str()), (tonic::Code::Unavailable as i32, "127.0.0.1:7071"));
        let unknown = session_error(&crate::api::driver_status(DriverError::NotLeader { leader: None }));
        assert_eq!(unknown.leader, "");
    }
}
