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
//! The stream is the framed session protocol where the server speaks it
//! ([`Mux::open_framed`]: a plaintext connection of its own, no HTTP/2; the
//! wire is in [`fencelock_proto::framing`]), else the gRPC `Session` call
//! ([`Mux::open`]). Either way, requests go out through an unbounded channel
//! that feeds the stream; each carries an `op_id`, and one task matches
//! responses to waiting callers, in any order (a queued acquire is answered
//! when the server grants it); framed, that task is the connection's one
//! task, which also writes the requests and pings the server. Many tasks may call one stream at once (`&self`,
//! cheap clones). No retries here: if the stream breaks, every pending and
//! later call fails with `UNAVAILABLE` (a refused token with its own status)
//! and the caller opens a new stream; the server cancels the stream's queued
//! acquires when it ends. Dropping an acquire's call sends a `Cancel` for it,
//! and the server releases a grant that had not reached the client; a grant
//! that reached the reader after its caller left is released by the reader
//! (every grant of a multi-lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fencelock_proto::framing::{self, Kind};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use fencelock_proto::v1 as pb;
use fencelock_proto::v1::session_request::Op;
use fencelock_proto::v1::session_response::Result as Reply;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Status, Streaming};

use crate::backend::native::proto::acquire_all_from_proto;
use crate::backend::native::wire::{new_request_id, Grpc, KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT};
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

/// Where a framed session goes: a plaintext server's `host:port`, the hello's
/// authorization, and how long the connection and the hello may take.
#[derive(Clone)]
pub(crate) struct FramedDial {
    pub addr: String,
    pub authorization: Bytes,
    pub timeout: Duration,
}

impl std::fmt::Debug for FramedDial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("FramedDial").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Mux {
    /// Opens a framed session on a connection of its own: `Ok(None)` when
    /// the server does not speak the protocol (it answered something else,
    /// or closed the connection: an older server, an HTTP/2 proxy), so that
    /// the caller opens the gRPC call instead; `Err` when the server could
    /// not be reached or refused the hello (its status: a refused token is
    /// `UNAUTHENTICATED`, as from the gRPC call).
    pub(crate) async fn open_framed(dial: &FramedDial) -> Result<Option<Mux>, Status> {
        let unreachable = |what: &str| Status::unavailable(format!("{}: {what}", dial.addr));
        let sock = tokio::time::timeout(dial.timeout, TcpStream::connect(&dial.addr))
            .await
            .map_err(|_| unreachable("no connection within the connect timeout"))?
            .map_err(|e| unreachable(&format!("connect: {e}")))?;
        let _ = sock.set_nodelay(true);
        let mut sock = sock;
        let mut hello = BytesMut::from(&framing::PREFACE[..]);
        framing::put(&mut hello, Kind::Hello, &dial.authorization);
        sock.write_all(&hello).await.map_err(|e| unreachable(&format!("hello: {e}")))?;
        let mut inb = BytesMut::with_capacity(READ_CHUNK);
        let answered = tokio::time::timeout(dial.timeout, answer(&mut sock, &mut inb)).await;
        match answered.map_err(|_| unreachable("no answer to the hello within the connect timeout"))? {
            Answer::NotSpoken => Ok(None),
            Answer::Refused(status) => Err(status),
            Answer::Ready => {
                let (tx, rx) = mpsc::unbounded_channel();
                let pending = Arc::new(Mutex::new(Pending { next_op: 1, ..Pending::default() }));
                let conn = Framed { sock, inb, rx, pending: pending.clone(), tx: tx.downgrade() };
                tokio::spawn(conn.run());
                Ok(Some(Mux { inner: Arc::new(Inner { tx, pending }) }))
            }
        }
    }
}

/// Bytes read from the socket at a time, at least.
const READ_CHUNK: usize = 8 * 1024;

/// What a server answered to a framed hello.
enum Answer {
    Ready,
    Refused(Status),
    NotSpoken,
}

/// Reads the server's preface and first frame; what follows them stays in
/// `inb`.
async fn answer(sock: &mut TcpStream, inb: &mut BytesMut) -> Answer {
    let n = framing::PREFACE.len();
    loop {
        let seen = inb.len().min(n);
        if inb[..seen] != framing::PREFACE[..seen] {
            return Answer::NotSpoken;
        }
        if inb.len() > n {
            let mut rest = BytesMut::from(&inb[n..]);
            match framing::next(&mut rest) {
                Ok(Some((Kind::Ready, _))) => {
                    *inb = rest;
                    return Answer::Ready;
                }
                Ok(Some((Kind::Close, body))) => return Answer::Refused(status_of_close(&body)),
                Ok(Some(_)) | Err(_) => return Answer::NotSpoken,
                Ok(None) => {}
            }
        }
        match sock.read_buf(inb).await {
            Ok(0) | Err(_) => return Answer::NotSpoken,
            Ok(_) => {}
        }
    }
}

/// A `Close` frame's status.
fn status_of_close(body: &[u8]) -> Status {
    let (code, message) = framing::close_of(body);
    Status::new(tonic::Code::from(code), message)
}

/// A framed session's connection: one task writes the requests, reads and
/// delivers the answers, and pings the server.
struct Framed {
    sock: TcpStream,
    inb: BytesMut,
    rx: mpsc::UnboundedReceiver<pb::SessionRequest>,
    pending: Arc<Mutex<Pending>>,
    tx: mpsc::WeakUnboundedSender<pb::SessionRequest>,
}

impl Framed {
    /// Runs until the connection ends or the last [`Mux`] clone is dropped,
    /// then fails every pending and later call, as [`read`] does.
    async fn run(mut self) {
        let end = self.serve().await;
        tracing::debug!(error = %end, "fencelock: framed session closed");
        fail_all(&self.pending, end);
    }

    async fn serve(&mut self) -> Status {
        let (mut rd, mut wr) = self.sock.split();
        let mut out = BytesMut::with_capacity(READ_CHUNK);
        let mut pings = tokio::time::interval(KEEP_ALIVE_INTERVAL);
        pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Ticks in a row in which nothing arrived, though each sent a ping.
        let mut silent = 0u32;
        let mut heard = true;
        loop {
            if let Err(end) = deliver_frames(&mut self.inb, &self.pending, &self.tx) {
                return end;
            }
            tokio::select! {
                biased;
                r = rd.read_buf(&mut self.inb) => match r {
                    Ok(0) => return Status::unavailable("session stream ended"),
                    Ok(_) => heard = true,
                    Err(e) => return Status::unavailable(format!("session stream failed: {e}")),
                },
                m = self.rx.recv() => {
                    let Some(m) = m else { return Status::unavailable("session stream closed") };
                    framing::put_message(&mut out, &m);
                    while let Ok(m) = self.rx.try_recv() {
                        framing::put_message(&mut out, &m);
                    }
                    if let Err(e) = wr.write_all(&out).await {
                        return Status::unavailable(format!("session stream failed: {e}"));
                    }
                    out.clear();
                }
                _ = pings.tick() => {
                    silent = if heard { 0 } else { silent + 1 };
                    heard = false;
                    if KEEP_ALIVE_INTERVAL * silent > KEEP_ALIVE_TIMEOUT {
                        return Status::unavailable("session stream failed: the server answered no ping");
                    }
                    framing::put(&mut out, Kind::Ping, &[0; 8]);
                    if let Err(e) = wr.write_all(&out).await {
                        return Status::unavailable(format!("session stream failed: {e}"));
                    }
                    out.clear();
                }
            }
        }
    }
}

/// Delivers every whole frame in `inb`; `Err` ends the connection.
fn deliver_frames(
    inb: &mut BytesMut,
    pending: &Mutex<Pending>,
    tx: &mpsc::WeakUnboundedSender<pb::SessionRequest>,
) -> Result<(), Status> {
    loop {
        match framing::next(inb) {
            Ok(None) => return Ok(()),
            Ok(Some((Kind::Message, body))) => match pb::SessionResponse::decode(body) {
                Ok(resp) => deliver(resp, pending, tx),
                Err(e) => return Err(Status::internal(format!("a session reply that does not decode: {e}"))),
            },
            Ok(Some((Kind::Pong, _))) => {}
            Ok(Some((Kind::Close, body))) => return Err(close_status(&body)),
            Ok(Some((kind, _))) => return Err(Status::internal(format!("a {kind:?} frame from the server"))),
            Err(e) => return Err(Status::internal(format!("session stream broken: {e}"))),
        }
    }
}

/// The status a server's `Close` ends the stream with: a refused token as
/// such, anything else as a broken stream (its operations may be retried).
fn close_status(body: &[u8]) -> Status {
    let status = status_of_close(body);
    if is_auth_refusal(&status) {
        status
    } else {
        Status::unavailable(format!("session stream failed: {}", status.message()))
    }
}

/// Ends the stream: `end` for every pending and later call.
fn fail_all(pending: &Mutex<Pending>, end: Status) {
    let waiters: Vec<_> = {
        let mut p = lock(pending);
        p.closed = Some(end.clone());
        p.ops.drain().map(|(_, w)| w).collect()
    };
    for w in waiters {
        let _ = w.send(Err(end.clone()));
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
    fail_all(&pending, end);
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
