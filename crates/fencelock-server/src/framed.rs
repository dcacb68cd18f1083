//! The framed session protocol's server side: a plaintext connection on the
//! gRPC port that begins with [`framing::PREFACE`] carries one `Session`
//! stream without HTTP/2 and gRPC around it (the wire is in
//! [`fencelock_proto::framing`]).
//!
//! Where it sits: beside tonic, on the same listener. The connection limits
//! ([`crate::access::conn_limits`]) admit every connection and tell a framed
//! one by its first byte; it keeps their idle timeout and its place in their
//! counts. The session is the gRPC call's own [`Session`] (opened by
//! [`Sessions::open`]): the same authentication of the hello and of every
//! operation, the same audit, the same limits of operations in flight, the
//! same end when the server stops. What this module adds is the framing:
//! one task per connection reads the frames (as the session asks for them),
//! writes the replies of every operation that ended since the last write in
//! one `write`, and answers pings.
//!
//! Why it exists (issue 38 §1): on HTTP/2, each operation of the native
//! client crosses hyper's task for the stream and the connection's, and its
//! bytes go through HTTP/2's and gRPC's framing on both sides; on two cores
//! that was about a fifth of the node's CPU per lock cycle and more of the
//! client's (`docs/design.md`, "The framed session protocol").
//!
//! Input from anyone: the hello must arrive within the header-read timeout;
//! a frame longer than [`framing::MAX_FRAME`], of an unknown kind, or whose
//! message does not decode ends the connection with a `Close` frame saying
//! so, as does a refused token. Nothing is read while the session is at its
//! limit of operations in flight, so a client that floods is held by TCP.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fencelock_proto::framing::{self, Kind};
use fencelock_proto::v1 as pb;
use futures::{FutureExt, Stream, StreamExt};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};
use tokio::sync::watch;
use tonic::Status;

use crate::access::conn_limits::{Admitted, Stream as Conn};
use crate::grpc::{Session, Sessions};

/// Bytes read from the socket at a time, at least.
const READ_CHUNK: usize = 8 * 1024;

/// Serves the framed connections handed over on `conns` until the server
/// stops (each open session ends then, by itself).
pub(crate) async fn serve(
    mut conns: Admitted,
    sessions: Sessions,
    hello_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let conn = tokio::select! {
            c = conns.recv() => c,
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some((conn, _peer)) = conn else { return };
        tokio::spawn(connection(conn, sessions.clone(), hello_timeout));
    }
}

/// One connection, from its preface to its end. The server's side begins
/// with the preface too, whatever follows it (a `Ready`, or the `Close` of
/// a refused hello), so that a client tells a refusal from a server that
/// does not speak the protocol.
async fn connection(conn: Conn, sessions: Sessions, hello_timeout: Duration) {
    let info = conn.info();
    let (rd, mut wr) = tokio::io::split(conn);
    let mut frames = Frames { rd, buf: BytesMut::with_capacity(READ_CHUNK), shared: Arc::default() };
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    out.extend_from_slice(&framing::PREFACE);
    let authorization = match tokio::time::timeout(hello_timeout, frames.hello()).await {
        Ok(Ok(a)) => a,
        Ok(Err(refused)) => return close(&mut wr, out, &refused).await,
        Err(_) => {
            return close(&mut wr, out, &Status::deadline_exceeded("no hello within the header-read timeout")).await
        }
    };
    let shared = frames.shared.clone();
    let session = match sessions.open(&authorization, &info, Box::pin(frames)) {
        Ok(s) => s,
        Err(refused) => return close(&mut wr, out, &refused).await,
    };
    framing::put(&mut out, Kind::Ready, &[]);
    if wr.write_all(&out).await.is_err() {
        return;
    }
    out.clear();
    replies(session, &shared, &mut wr, out).await;
    let error = shared.lock().unwrap_or_else(|p| p.into_inner()).error.take();
    match error {
        Some(status) => close(&mut wr, BytesMut::new(), &status).await,
        None => {
            let _ = wr.shutdown().await;
        }
    }
}

/// Writes the session's replies, and the pongs its requests' pings ask for,
/// until the session ends or the client stops reading for good.
async fn replies(mut session: Session, shared: &Mutex<Shared>, wr: &mut WriteHalf<Conn>, mut out: BytesMut) {
    loop {
        let next = std::future::poll_fn(|cx| match session.poll_next_unpin(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            // Pings are read with the requests: answer them while no reply is ready.
            Poll::Pending if has_pongs(shared) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        })
        .await;
        let mut ended = matches!(next, Some(None));
        if let Some(Some(reply)) = next {
            put_reply(&mut out, reply);
            // Every reply ready now goes in the same write.
            loop {
                match session.next().now_or_never() {
                    Some(Some(reply)) => put_reply(&mut out, reply),
                    Some(None) => {
                        ended = true;
                        break;
                    }
                    None => break,
                }
            }
        }
        for ping in std::mem::take(&mut shared.lock().unwrap_or_else(|p| p.into_inner()).pongs) {
            framing::put(&mut out, Kind::Pong, &ping);
        }
        if !out.is_empty() && wr.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
        if ended {
            return;
        }
    }
}

fn has_pongs(shared: &Mutex<Shared>) -> bool {
    !shared.lock().unwrap_or_else(|p| p.into_inner()).pongs.is_empty()
}

fn put_reply(out: &mut BytesMut, reply: Result<pb::SessionResponse, Status>) {
    // A session yields only replies; an error reply is a message of its own.
    if let Ok(m) = reply {
        framing::put_message(out, &m);
    }
}

/// Writes what `out` holds and a `Close` frame of `status`, and ends the
/// connection.
async fn close(wr: &mut WriteHalf<Conn>, mut out: BytesMut, status: &Status) {
    framing::put_close(&mut out, status.code() as i32, status.message());
    let _ = wr.write_all(&out).await;
    let _ = wr.shutdown().await;
}

/// What the reading side leaves for the writing side (one task has both).
#[derive(Default)]
struct Shared {
    /// Pings read and not yet answered, by payload.
    pongs: Vec<Bytes>,
    /// Why the requests ended, when the client broke the protocol.
    error: Option<Status>,
}

/// The connection's frames, read as the session asks for requests.
struct Frames {
    rd: ReadHalf<Conn>,
    buf: BytesMut,
    shared: Arc<Mutex<Shared>>,
}

impl Frames {
    /// Reads the preface and the hello; returns the hello's authorization.
    async fn hello(&mut self) -> Result<Bytes, Status> {
        while self.buf.len() < framing::PREFACE.len() {
            if self.rd.read_buf(&mut self.buf).await.map_err(|e| Status::unavailable(e.to_string()))? == 0 {
                return Err(Status::unavailable("the connection ended before its hello"));
            }
        }
        if self.buf[..framing::PREFACE.len()] != framing::PREFACE {
            return Err(Status::invalid_argument("not the framed session protocol (a wrong preface)"));
        }
        let _ = self.buf.split_to(framing::PREFACE.len());
        loop {
            match framing::next(&mut self.buf).map_err(|e| Status::invalid_argument(e.to_string()))? {
                Some((Kind::Hello, body)) => return Ok(body),
                Some((kind, _)) => return Err(Status::invalid_argument(format!("a {kind:?} frame before the hello"))),
                None => {}
            }
            if self.rd.read_buf(&mut self.buf).await.map_err(|e| Status::unavailable(e.to_string()))? == 0 {
                return Err(Status::unavailable("the connection ended in its hello"));
            }
        }
    }

    /// Ends the requests for breaking the protocol: the connection's last
    /// frame will say why.
    fn broken(&mut self, status: Status) -> Poll<Option<Result<pb::SessionRequest, Status>>> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner()).error = Some(status.clone());
        Poll::Ready(Some(Err(status)))
    }
}

impl Stream for Frames {
    type Item = Result<pb::SessionRequest, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match framing::next(&mut this.buf) {
                Ok(Some((Kind::Message, body))) => {
                    return match pb::SessionRequest::decode(body) {
                        Ok(m) => Poll::Ready(Some(Ok(m))),
                        Err(e) => this.broken(Status::invalid_argument(format!("a request that does not decode: {e}"))),
                    }
                }
                Ok(Some((Kind::Ping, body))) => {
                    this.shared.lock().unwrap_or_else(|p| p.into_inner()).pongs.push(body);
                    continue;
                }
                Ok(Some((kind, _))) => {
                    return this.broken(Status::invalid_argument(format!("a {kind:?} frame from a client")))
                }
                Err(e) => return this.broken(Status::invalid_argument(e.to_string())),
                Ok(None) => {}
            }
            match poll_read_buf(Pin::new(&mut this.rd), cx, &mut this.buf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(None),
                Poll::Ready(Ok(_)) => {}
                // The connection broke (or idled out): no one to tell.
                Poll::Ready(Err(_)) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Reads what has arrived onto the end of `buf`.
fn poll_read_buf<R: AsyncRead>(
    rd: Pin<&mut R>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    let mut chunk = [0u8; READ_CHUNK];
    let mut read = ReadBuf::new(&mut chunk);
    std::task::ready!(rd.poll_read(cx, &mut read))?;
    buf.extend_from_slice(read.filled());
    Poll::Ready(Ok(read.filled().len()))
}
