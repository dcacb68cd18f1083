//! The framed session protocol (`framed.rs`, the wire in
//! `fencelock_proto::framing`) end to end: a real server in this process
//! and a raw TCP client on its gRPC port, which keeps serving gRPC beside it.
//!
//! Invariants: a framed connection is a `Session` stream with the same
//! authentication (of its hello, and of each operation), and everything
//! that breaks the protocol (a wrong preface, a frame too long, of an
//! unknown kind or that does not decode, no hello in time) ends the
//! connection with a `Close` frame that says why, changes nothing, and
//! leaves the server serving everyone else.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use fencelock_proto::framing::{self, Kind, PREFACE};
use fencelock_proto::v1 as pb;
use fencelock_server::Config;
use pb::{acquire_response::Outcome, session_request::Op, session_response::Result as R};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{self, add_token, lease, request_id, start, start_config};

/// A raw framed connection: its socket and what it has read so far.
struct Raw {
    sock: TcpStream,
    buf: BytesMut,
}

impl Raw {
    async fn connect(addr: std::net::SocketAddr) -> Raw {
        Raw { sock: TcpStream::connect(addr).await.unwrap(), buf: BytesMut::new() }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).await.unwrap();
    }

    /// Sends the preface and a hello carrying `authorization`, and returns
    /// the server's first frame, after checking its preface.
    async fn hello(&mut self, authorization: &[u8]) -> (Kind, Bytes) {
        let mut out = BytesMut::from(&PREFACE[..]);
        framing::put(&mut out, Kind::Hello, authorization);
        self.send(&out).await;
        let preface = self.bytes(PREFACE.len()).await;
        assert_eq!(&preface[..], &PREFACE[..], "the server answers with the preface");
        self.frame().await.expect("a frame after the preface")
    }

    async fn bytes(&mut self, n: usize) -> Bytes {
        while self.buf.len() < n {
            assert!(self.fill().await > 0, "the connection ended early");
        }
        self.buf.split_to(n).freeze()
    }

    /// Reads (10 s at most) until a whole frame has arrived; `None` if the
    /// connection ends first.
    async fn frame(&mut self) -> Option<(Kind, Bytes)> {
        loop {
            if let Some(f) = framing::next(&mut self.buf).expect("a well-formed frame from the server") {
                return Some(f);
            }
            if self.fill().await == 0 {
                return None;
            }
        }
    }

    async fn fill(&mut self) -> usize {
        let read = tokio::time::timeout(Duration::from_secs(10), self.sock.read_buf(&mut self.buf));
        read.await.expect("the server answers within 10 s").unwrap_or(0)
    }

    async fn request(&mut self, op_id: u64, op: Op) {
        let mut out = BytesMut::new();
        framing::put_message(&mut out, &pb::SessionRequest { op_id, op: Some(op) });
        self.send(&out).await;
    }

    /// The next reply (pongs skipped).
    async fn reply(&mut self) -> pb::SessionResponse {
        loop {
            match self.frame().await.expect("a reply") {
                (Kind::Message, body) => return pb::SessionResponse::decode(body).unwrap(),
                (Kind::Pong, _) => {}
                other => panic!("a reply expected: {other:?}"),
            }
        }
    }

    /// The `Close` frame that ends the connection, then its end.
    async fn closed(&mut self) -> (tonic::Code, String) {
        let (kind, body) = self.frame().await.expect("a close frame");
        assert_eq!(kind, Kind::Close, "{body:?}");
        assert!(self.frame().await.is_none(), "the connection ends after its close frame");
        let (code, message) = framing::close_of(&body);
        (tonic::Code::from(code), message)
    }
}

fn acquire(lease_id: u64, lock: &str) -> Op {
    Op::Acquire(pb::AcquireRequest { request_id: request_id(), lease_id, lock: lock.into(), ..Default::default() })
}

async fn holder(c: &mut support::Client, lock: &str) -> Option<u64> {
    let info = c.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await.unwrap().into_inner();
    info.lock.and_then(|l| l.holders.first().map(|h| h.lease_id))
}

/// A framed session grants a lease and a lock, answers a ping with its
/// payload, and its grant is what a gRPC client on the same port sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framed_session_runs_operations_beside_grpc_on_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    lease(&mut c, 60_000).await; // the node serves
    let mut raw = Raw::connect(running.grpc_addr).await;
    assert_eq!(raw.hello(b"").await.0, Kind::Ready);
    raw.request(1, Op::GrantLease(pb::GrantLeaseRequest { request_id: request_id(), ttl_ms: 60_000 })).await;
    let mut ping = BytesMut::new();
    framing::put(&mut ping, Kind::Ping, b"8 bytes!");
    raw.send(&ping).await;
    let mut pong = None;
    let granted = loop {
        match raw.frame().await.expect("a reply and a pong") {
            (Kind::Pong, body) => pong = Some(body),
            (Kind::Message, body) => break pb::SessionResponse::decode(body).unwrap(),
            other => panic!("{other:?}"),
        }
    };
    let Some(R::GrantLease(g)) = granted.result else { panic!("{granted:?}") };
    assert_eq!(granted.op_id, 1);
    raw.request(2, acquire(g.lease_id, "framed")).await;
    let got = raw.reply().await;
    assert!(
        matches!(&got.result, Some(R::Acquire(pb::AcquireResponse { outcome: Some(Outcome::Acquired(_)) }))),
        "{got:?}"
    );
    assert_eq!(got.op_id, 2);
    if pong.is_none() {
        let mut again = BytesMut::new();
        framing::put(&mut again, Kind::Ping, b"8 bytes!");
        raw.send(&again).await;
        pong = raw.frame().await.map(|(_, b)| b);
    }
    assert_eq!(pong.as_deref(), Some(&b"8 bytes!"[..]), "a pong echoes its ping");
    assert_eq!(holder(&mut c, "framed").await, Some(g.lease_id));
    running.shutdown().await;
}

/// A plaintext node with an auth file: the hello's token is authenticated as
/// a `Session` call's header is (a wrong or missing token is refused with
/// `UNAUTHENTICATED` in a close frame), and each operation is checked against
/// the identity's rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hello_is_authenticated_and_every_operation_authorized() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("[roles.worker]\nrules = [{ prefix = \"jobs/\", verbs = [\"acquire\", \"read\"] }]\n");
    let worker = add_token(&mut text, "worker", "worker");
    std::fs::write(dir.path().join("auth.toml"), text).unwrap();
    let mut config = Config::for_test(dir.path().join("data"));
    config.auth_file = Some(dir.path().join("auth.toml"));
    let (running, _) = start_config(&config).await;
    for refused in [&b""[..], b"Bearer flt_00000000_nottherighttoken", b"Bearer \xff\x00"] {
        let mut raw = Raw::connect(running.grpc_addr).await;
        let (kind, body) = raw.hello(refused).await;
        assert_eq!(kind, Kind::Close, "{refused:?}");
        assert_eq!(tonic::Code::from(framing::close_of(&body).0), tonic::Code::Unauthenticated, "{refused:?}");
        assert!(raw.frame().await.is_none(), "the connection ends");
    }
    let mut raw = Raw::connect(running.grpc_addr).await;
    assert_eq!(raw.hello(format!("Bearer {worker}").as_bytes()).await.0, Kind::Ready);
    raw.request(1, Op::GrantLease(pb::GrantLeaseRequest { request_id: request_id(), ttl_ms: 60_000 })).await;
    let reply = raw.reply().await;
    let Some(R::GrantLease(g)) = reply.result else { panic!("{reply:?}") };
    raw.request(2, acquire(g.lease_id, "elsewhere")).await;
    let denied = raw.reply().await;
    let Some(R::Error(e)) = &denied.result else { panic!("{denied:?}") };
    assert_eq!(tonic::Code::from(e.code), tonic::Code::PermissionDenied, "{e:?}");
    raw.request(3, acquire(g.lease_id, "jobs/nightly")).await;
    let got = raw.reply().await;
    assert!(matches!(&got.result, Some(R::Acquire(_))), "{got:?}");
    running.shutdown().await;
}

/// Whatever breaks the protocol ends its connection with a close frame
/// saying why, before anything is applied; the node serves the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_frame_ends_its_connection_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let mine = lease(&mut c, 60_000).await;
    let header = |len: u32, kind: u8| {
        let mut b = BytesMut::new();
        b.put_u32(len);
        b.put_u8(kind);
        b
    };
    let mut undecodable = header(4, Kind::Message as u8);
    undecodable.put_slice(&[0xff, 0xff, 0xff, 0xff]);
    let cases: [(&str, BytesMut, &str); 4] = [
        ("too long", header(framing::MAX_FRAME as u32 + 1, Kind::Message as u8), "a frame of"),
        ("unknown kind", header(3, 42), "unknown kind 42"),
        ("a server's kind", header(1, Kind::Ready as u8), "Ready frame from a client"),
        ("undecodable", undecodable, "does not decode"),
    ];
    for (what, frame, says) in cases {
        let mut raw = Raw::connect(running.grpc_addr).await;
        assert_eq!(raw.hello(b"").await.0, Kind::Ready, "{what}");
        raw.send(&frame).await;
        let (code, message) = raw.closed().await;
        assert_eq!(code, tonic::Code::InvalidArgument, "{what}: {message}");
        assert!(message.contains(says), "{what}: {message}");
    }
    let mut wrong = Raw::connect(running.grpc_addr).await;
    wrong.send(b"FLKSESS9").await;
    assert_eq!(&wrong.bytes(PREFACE.len()).await[..], &PREFACE[..]);
    let (code, message) = wrong.closed().await;
    assert!(code == tonic::Code::InvalidArgument && message.contains("preface"), "{code:?} {message}");
    // Nothing was applied, and the node still serves.
    assert_eq!(holder(&mut c, "anything").await, None);
    let mut raw = Raw::connect(running.grpc_addr).await;
    assert_eq!(raw.hello(b"").await.0, Kind::Ready);
    raw.request(1, acquire(mine, "after")).await;
    assert!(matches!(raw.reply().await.result, Some(R::Acquire(_))));
    running.shutdown().await;
}

/// A connection that begins as a framed one and then says nothing is closed
/// once the header-read timeout has passed without a hello.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_hello_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::for_test(dir.path().join("data"));
    config.connections.header_read_timeout = Duration::from_millis(300);
    let (running, _) = start_config(&config).await;
    let mut raw = Raw::connect(running.grpc_addr).await;
    raw.send(b"FLK").await;
    assert_eq!(&raw.bytes(PREFACE.len()).await[..], &PREFACE[..]);
    let (code, message) = raw.closed().await;
    assert_eq!(code, tonic::Code::DeadlineExceeded, "{message}");
    running.shutdown().await;
}

/// A shutdown ends a framed session whose client keeps it open, as it ends a
/// gRPC one (`session_ops::a_shutdown_ends_a_stream_its_client_keeps_open`),
/// with the acquire it had queued: the shutdown returns, and the connection
/// ends after at most an `UNAVAILABLE` for that acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_framed_session() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let (holder_lease, waiter) = (lease(&mut c, 60_000).await, lease(&mut c, 60_000).await);
    let held = c
        .acquire(pb::AcquireRequest {
            request_id: request_id(),
            lease_id: holder_lease,
            lock: "q".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(held.outcome, Some(Outcome::Acquired(_))), "{held:?}");
    let mut raw = Raw::connect(running.grpc_addr).await;
    assert_eq!(raw.hello(b"").await.0, Kind::Ready);
    let wait = pb::AcquireRequest {
        request_id: request_id(),
        lease_id: waiter,
        lock: "q".into(),
        wait_ms: 60_000,
        ..Default::default()
    };
    raw.request(1, Op::Acquire(wait)).await;
    for _ in 0..500 {
        let info = c.describe_lock(pb::DescribeLockRequest { lock: "q".into() }).await.unwrap().into_inner();
        if info.lock.is_some_and(|l| l.waiters.len() == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped = tokio::time::timeout(Duration::from_secs(30), running.shutdown()).await;
    assert!(stopped.is_ok(), "the shutdown waited for a framed session");
    while let Some((kind, body)) = raw.frame().await {
        assert_eq!(kind, Kind::Message, "{body:?}");
        let reply = pb::SessionResponse::decode(body).unwrap();
        let Some(R::Error(e)) = &reply.result else { panic!("a reply after the shutdown: {reply:?}") };
        assert!(reply.op_id == 1 && e.code == tonic::Code::Unavailable as i32, "{reply:?}");
    }
}
