//! How the [`crate::Client`]'s lease and lock operations travel: over one
//! shared `Session` stream per server ([`Transport::Stream`], the default), or
//! as one unary gRPC call each ([`Transport::Unary`]).
//!
//! Where it sits: under [`super::rpc::Rpc::send`], which runs every attempt of
//! an acquire, release, lease grant or keep-alive (the operations of every
//! lock cycle and every held lease) through
//! [`attempt`]; the modules that make those calls (`acquire`, `guard` through
//! `client`, `lease_rpc`) build one message and do not know which transport
//! carries it. The stream is a [`Mux`] (the one place where answers are
//! matched to operations by `op_id`), opened lazily on the connection of the
//! server the client talks to now and shared by every lock and lease of the
//! client, many operations in flight at once. Everything else (revokes,
//! checks, describe, list, watches, set-value and the other rare calls) stays
//! unary.
//!
//! # The unary path's guarantees, kept
//! * **Request ids.** The retry loop of [`super::rpc::Rpc`] is the same for
//!   both transports: each attempt carries the message built for it, with the
//!   request id of the logical request, whether it goes out on the same stream,
//!   on a new one after the old one broke, or as a unary call. The server
//!   answers a retry with the first outcome (exactly-once grants).
//! * **Deadlines.** An attempt's time budget is enforced by the retry loop
//!   around the whole attempt (opening the stream included); an attempt that
//!   runs out is dropped, which for an acquire sends `Cancel` on the stream.
//! * **A broken stream** fails its operations in flight with `UNAVAILABLE`
//!   (retryable); the retry loop moves on as after a failed unary call (to the
//!   next server of a group) and the next attempt opens a new stream. When the
//!   stream is gone, the server has already withdrawn its queued acquires, as
//!   it does for a unary call whose connection dropped.
//! * **Cancel on drop.** A dropped acquire (its caller gave up, or its
//!   deadline passed) sends `Cancel` for its `op_id`: the server withdraws it
//!   from the queue or releases a grant that had not been delivered, as for a
//!   dropped unary call; a grant that reached the client after its caller left
//!   is released by the stream's reader.
//! * **Fail-over and leader hints.** A follower answers every operation of a
//!   stream `UNAVAILABLE` ("not the leader"), naming the leader in the error's
//!   `leader` field when it knows it; the error becomes a status with the
//!   `fencelock-leader` hint that the retry loop follows, exactly as for the
//!   unary transport, and the next attempt opens a stream on the leader. A
//!   server that names no leader (it knows none, or predates the field) is
//!   asked the same message (same request id) once more as a unary call,
//!   whose refusal may carry the hint.
//! * **Leases.** Keep-alives ride the stream but are still rounds of the same
//!   renewal loop ([`crate::lease::renew_loop`]), with the same deadlines; the
//!   lease-event push stream (`WatchLeases`) is unchanged.
//!
//! [`Transport::Unary`] is for simple tools and debugging (every operation is
//! one gRPC call, visible as such to proxies and tracing): set it with
//! [`crate::ClientBuilder::transport`] or the URL's `transport=unary`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock_proto::v1 as pb;
use fencelock_proto::v1::session_request::Op;
use fencelock_proto::v1::session_response::Result as Reply;
use tonic::{Code, Response, Status};

use crate::backend::native::mux::{FramedDial, Mux};
use crate::backend::native::wire::{request, Grpc};
use crate::backend::BoxFuture;
use crate::error::Error;

/// How a [`crate::Client`] sends its acquires, releases and lease calls.
///
/// # Examples
///
/// One gRPC call per operation, to see each of them in a proxy's log:
///
/// ```no_run
/// use fencelock::{Client, Transport};
///
/// # async fn demo() -> Result<(), fencelock::Error> {
/// let client = Client::builder("fencelock://127.0.0.1:7070").transport(Transport::Unary).connect().await?;
/// // The same, from the URL:
/// let client = Client::connect("fencelock://127.0.0.1:7070?transport=unary").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Over one long-lived `Session` stream per server connection, shared by
    /// every lock and lease of the client: one small message per operation,
    /// many in flight. The default.
    #[default]
    Stream,
    /// One unary gRPC call per operation: for simple tools and debugging.
    Unary,
}

impl Transport {
    /// The URL query parameter that chooses the transport (`transport=unary`).
    pub(crate) const PARAM: &'static str = "transport";

    /// The transport a URL's `transport=` names (`stream` or `unary`).
    pub(crate) fn from_param(value: &str) -> Result<Transport, Error> {
        match value {
            "stream" => Ok(Transport::Stream),
            "unary" => Ok(Transport::Unary),
            other => Err(Error::InvalidArgument(format!("transport={other}: the transport is stream or unary"))),
        }
    }
}

/// A request that can go either way: as its own unary call, or as one
/// operation of a stream.
pub(crate) trait StreamOp: Clone + Send + 'static {
    type Reply: Send + 'static;
    /// Whether a dropped call sends `Cancel` (an acquire, which may wait).
    const CANCEL: bool = false;
    fn into_op(self) -> Op;
    /// The reply if it answers this kind of request.
    fn from_reply(reply: Reply) -> Option<Self::Reply>;
    fn unary(client: Grpc, req: tonic::Request<Self>) -> BoxFuture<'static, Result<Response<Self::Reply>, Status>>;
}

macro_rules! stream_op {
    ($req:ty, $resp:ty, $variant:ident, $method:ident, $cancel:expr) => {
        impl StreamOp for $req {
            type Reply = $resp;
            const CANCEL: bool = $cancel;
            fn into_op(self) -> Op {
                Op::$variant(self)
            }
            fn from_reply(reply: Reply) -> Option<$resp> {
                match reply {
                    Reply::$variant(r) => Some(r),
                    _ => None,
                }
            }
            fn unary(
                mut client: Grpc,
                req: tonic::Request<Self>,
            ) -> BoxFuture<'static, Result<Response<$resp>, Status>> {
                Box::pin(async move { client.$method(req).await })
            }
        }
    };
}

stream_op!(pb::GrantLeaseRequest, pb::GrantLeaseResponse, GrantLease, grant_lease, false);
stream_op!(pb::KeepAliveRequest, pb::KeepAliveResponse, KeepAlive, keep_alive, false);
stream_op!(pb::AcquireRequest, pb::AcquireResponse, Acquire, acquire, true);
stream_op!(pb::ReleaseRequest, pb::ReleaseResponse, Release, release, false);

/// The stream to one server: opened on first use, opened again after it
/// broke. One per server the client talks to (see [`super::rpc::Servers`]).
#[derive(Debug)]
pub(crate) struct StreamSlot {
    open: Mutex<Option<Mux>>,
    /// Where the framed session goes (a plaintext server), tried first.
    framed: Option<FramedDial>,
    /// Set once the server showed it does not speak the framed protocol:
    /// from then on the slot opens the gRPC call at once.
    grpc_only: AtomicBool,
    /// Held while a stream opens, so that concurrent first calls open one.
    opening: tokio::sync::Mutex<()>,
    /// Streams opened by the whole client (shared by its slots).
    opened: Arc<AtomicU64>,
}

impl StreamSlot {
    pub(crate) fn new(opened: Arc<AtomicU64>, framed: Option<FramedDial>) -> StreamSlot {
        let (open, opening, grpc_only) = (Mutex::new(None), tokio::sync::Mutex::new(()), AtomicBool::new(false));
        StreamSlot { open, framed, grpc_only, opening, opened }
    }

    /// The open stream, else a new one on `client`'s connection.
    async fn get(&self, client: &Grpc) -> Result<Mux, Status> {
        if let Some(mux) = self.live() {
            return Ok(mux);
        }
        let _opening = self.opening.lock().await;
        if let Some(mux) = self.live() {
            return Ok(mux); // another call opened it meanwhile
        }
        let mux = self.open_new(client).await?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = Some(mux.clone());
        Ok(mux)
    }

    /// A new stream: framed where the server speaks it, else the gRPC call.
    async fn open_new(&self, client: &Grpc) -> Result<Mux, Status> {
        if let Some(dial) = self.framed.as_ref().filter(|_| !self.grpc_only.load(Ordering::Relaxed)) {
            match Mux::open_framed(dial).await? {
                Some(mux) => return Ok(mux),
                None => {
                    tracing::debug!(server = %dial.addr, "fencelock: no framed sessions there; using the gRPC call");
                    self.grpc_only.store(true, Ordering::Relaxed);
                }
            }
        }
        Mux::open(client.clone()).await
    }

    fn live(&self) -> Option<Mux> {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).as_ref().filter(|m| !m.is_closed()).cloned()
    }
}

/// What one attempt runs on: the server talked to now, its gRPC client and its
/// stream.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub(crate) grpc: Grpc,
    pub(crate) stream: Arc<StreamSlot>,
}

/// One attempt of `msg` over `transport`, with `left` as its time budget.
pub(crate) async fn attempt<M: StreamOp>(
    transport: Transport,
    conn: Conn,
    msg: M,
    left: Duration,
) -> Result<Response<M::Reply>, Status> {
    match transport {
        Transport::Unary => M::unary(conn.grpc, request(msg, left)).await,
        Transport::Stream => over_stream(conn, msg, left).await,
    }
}

/// One attempt on the stream. A server that answers `UNAVAILABLE` (a follower,
/// a leader stepping down) without naming the leader is asked once more with
/// a unary call of the same message, whose refusal may name it in its
/// metadata (see the module docs).
async fn over_stream<M: StreamOp>(conn: Conn, msg: M, left: Duration) -> Result<Response<M::Reply>, Status> {
    let mux = conn.stream.get(&conn.grpc).await?;
    match mux.call(msg.clone().into_op(), M::CANCEL).await? {
        Reply::Error(e) if Code::from(e.code) == Code::Unavailable && e.leader.is_empty() => {
            M::unary(conn.grpc, request(msg, left)).await
        }
        Reply::Error(e) => Err(status_of(e)),
        reply => M::from_reply(reply)
            .map(Response::new)
            .ok_or_else(|| Status::internal("the session answered with a reply of another kind")),
    }
}

/// A session's error as the status a unary call would have returned, its
/// leader hint in the metadata the retry loop reads.
fn status_of(e: pb::Error) -> Status {
    let mut status = Status::new(Code::from(e.code), e.message);
    match e.leader.parse() {
        Ok(leader) if !e.leader.is_empty() => {
            status.metadata_mut().insert(crate::backend::native::wire::LEADER_HEADER, leader);
        }
        _ => {}
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower's stream error that names the leader becomes a status
    /// whose metadata names it, as a unary refusal's does; one that names
    /// none carries no hint.
    #[test]
    fn a_stream_error_keeps_its_leader_hint() {
        let named =
            status_of(pb::Error { code: 14, message: "not the leader".into(), leader: "127.0.0.1:7071".into() });
        assert_eq!(named.code(), Code::Unavailable);
        let hint = named.metadata().get(crate::backend::native::wire::LEADER_HEADER).map(|v| v.to_str().unwrap());
        assert_eq!(hint, Some("127.0.0.1:7071"));
        let unnamed = status_of(pb::Error { code: 14, message: "no leader".into(), leader: String::new() });
        assert!(unnamed.metadata().get(crate::backend::native::wire::LEADER_HEADER).is_none());
    }

    /// The URL's `transport=` takes the two names, and nothing else.
    #[test]
    fn the_transport_parameter_names_stream_or_unary() {
        assert_eq!(Transport::from_param("stream"), Ok(Transport::Stream));
        assert_eq!(Transport::from_param("unary"), Ok(Transport::Unary));
        assert!(matches!(Transport::from_param("Unary"), Err(Error::InvalidArgument(_))));
        assert_eq!(Transport::default(), Transport::Stream);
    }

    /// A reply of another kind than the request's is not decoded as if it
    /// answered it.
    #[test]
    fn a_reply_of_another_kind_is_not_taken_for_the_answer() {
        let released = Reply::Release(pb::ReleaseResponse { released: true });
        assert!(<pb::KeepAliveRequest as StreamOp>::from_reply(released.clone()).is_none());
        assert_eq!(<pb::ReleaseRequest as StreamOp>::from_reply(released).map(|r| r.released), Some(true));
    }
}
