//! The operations of one `Session` stream, end to end: a real server in this
//! process (`start` on a temp dir) and the raw gRPC client.
//!
//! Invariants (`grpc.rs`'s `Session`): the operations of a stream run
//! concurrently, so an acquire queued behind a holder does not hold up the
//! operations sent after it on the same stream; `Cancel` withdraws a queued
//! acquire from the lock's queue; a stream that ends withdraws the acquires it
//! still had queued; a stream has at most `session_acquires_in_flight`
//! acquires in flight, one more is refused at once while the stream's other
//! operations go on.

use std::time::Duration;

use fencelock_proto::v1 as pb;
use pb::{acquire_response::Outcome, session_request::Op, session_response::Result as R};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::support;
use support::{lease, request_id, start, start_config, Client};

const LOCK: &str = "session-ops";

fn acquire(lease: u64, wait_ms: u64) -> Op {
    Op::Acquire(pb::AcquireRequest {
        request_id: request_id(),
        lease_id: lease,
        lock: LOCK.into(),
        wait_ms,
        ..Default::default()
    })
}

async fn waiters(c: &mut Client) -> usize {
    let info = c.describe_lock(pb::DescribeLockRequest { lock: LOCK.into() }).await.unwrap().into_inner();
    info.lock.map_or(0, |l| l.waiters.len())
}

/// Waits (at most 10 s) until the lock has `n` waiters.
async fn until_waiters(c: &mut Client, n: usize) {
    let reached = async {
        while waiters(c).await != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reached).await.unwrap_or_else(|_| panic!("never {n} waiters"));
}

/// A stream whose requests are sent on the returned sender.
async fn open(c: &mut Client) -> (mpsc::Sender<pb::SessionRequest>, Streaming<pb::SessionResponse>) {
    let (tx, rx) = mpsc::channel(16);
    let responses = c.session(ReceiverStream::new(rx)).await.unwrap().into_inner();
    (tx, responses)
}

async fn next(responses: &mut Streaming<pb::SessionResponse>) -> pb::SessionResponse {
    let msg = tokio::time::timeout(Duration::from_secs(10), responses.message()).await.expect("a response in time");
    msg.unwrap().expect("the stream is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquire_holds_up_nothing_else_and_cancel_or_the_stream_end_withdraws_it() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let (holder, waiter) = (lease(&mut c, 60_000).await, lease(&mut c, 60_000).await);
    let held = c
        .acquire(pb::AcquireRequest {
            request_id: request_id(),
            lease_id: holder,
            lock: LOCK.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(held.outcome, Some(Outcome::Acquired(_))), "{held:?}");

    // Op 1 queues behind the holder; op 2, sent after it, is answered meanwhile.
    let (tx, mut responses) = open(&mut c).await;
    tx.send(pb::SessionRequest { op_id: 1, op: Some(acquire(waiter, 60_000)) }).await.unwrap();
    until_waiters(&mut c, 1).await;
    let keep = pb::KeepAliveRequest { request_id: request_id(), lease_id: waiter };
    tx.send(pb::SessionRequest { op_id: 2, op: Some(Op::KeepAlive(keep)) }).await.unwrap();
    let kept = next(&mut responses).await;
    assert_eq!(kept.op_id, 2, "{kept:?}");
    assert!(matches!(kept.result, Some(R::KeepAlive(_))), "{kept:?}");

    // Cancel withdraws op 1 (nothing was granted, so nothing is released).
    tx.send(pb::SessionRequest { op_id: 3, op: Some(Op::Cancel(pb::CancelRequest { op_id: 1 })) }).await.unwrap();
    let cancelled = next(&mut responses).await;
    assert_eq!(cancelled.op_id, 3, "{cancelled:?}");
    assert_eq!(cancelled.result, Some(R::Cancel(pb::CancelResponse { released: false })));
    until_waiters(&mut c, 0).await;

    // Queued again on a second stream, which then ends: the wait goes with it.
    let (tx2, responses2) = open(&mut c).await;
    tx2.send(pb::SessionRequest { op_id: 1, op: Some(acquire(waiter, 60_000)) }).await.unwrap();
    until_waiters(&mut c, 1).await;
    drop((tx2, responses2));
    until_waiters(&mut c, 0).await;

    drop(tx);
    running.shutdown().await;
}

/// Bounded: with `session_acquires_in_flight` 2, a third acquire on the
/// stream is answered at once with `RESOURCE_EXHAUSTED` (it is not queued),
/// a keep-alive on the same stream is still answered, and once a queued
/// acquire is cancelled the stream takes an acquire again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_has_at_most_its_limit_of_acquires_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fencelock_server::Config::for_test(dir.path().join("data"));
    config.connections.session_acquires_in_flight = 2;
    config.connections.session_ops_in_flight = 4;
    let (running, mut c) = start_config(&config).await;
    let holder = lease(&mut c, 60_000).await;
    let first =
        pb::AcquireRequest { request_id: request_id(), lease_id: holder, lock: LOCK.into(), ..Default::default() };
    let held = c.acquire(first).await.unwrap().into_inner();
    assert!(matches!(held.outcome, Some(Outcome::Acquired(_))), "{held:?}");
    let (a, b, d) = (lease(&mut c, 60_000).await, lease(&mut c, 60_000).await, lease(&mut c, 60_000).await);

    let (tx, mut responses) = open(&mut c).await;
    tx.send(pb::SessionRequest { op_id: 1, op: Some(acquire(a, 60_000)) }).await.unwrap();
    tx.send(pb::SessionRequest { op_id: 2, op: Some(acquire(b, 60_000)) }).await.unwrap();
    until_waiters(&mut c, 2).await;
    tx.send(pb::SessionRequest { op_id: 3, op: Some(acquire(d, 60_000)) }).await.unwrap();
    let refused = next(&mut responses).await;
    assert_eq!(refused.op_id, 3, "{refused:?}");
    let Some(R::Error(e)) = &refused.result else { panic!("{refused:?}") };
    assert_eq!(e.code, tonic::Code::ResourceExhausted as i32, "{e:?}");
    assert!(e.message.contains("2 acquires in flight"), "{e:?}");
    assert_eq!(waiters(&mut c).await, 2, "the refused acquire was not queued");

    let keep = pb::KeepAliveRequest { request_id: request_id(), lease_id: d };
    tx.send(pb::SessionRequest { op_id: 4, op: Some(Op::KeepAlive(keep)) }).await.unwrap();
    let kept = next(&mut responses).await;
    assert!(kept.op_id == 4 && matches!(kept.result, Some(R::KeepAlive(_))), "{kept:?}");
    tx.send(pb::SessionRequest { op_id: 5, op: Some(Op::Cancel(pb::CancelRequest { op_id: 1 })) }).await.unwrap();
    let cancelled = next(&mut responses).await;
    assert_eq!(cancelled.op_id, 5, "{cancelled:?}");
    until_waiters(&mut c, 1).await;
    tx.send(pb::SessionRequest { op_id: 6, op: Some(acquire(d, 60_000)) }).await.unwrap();
    until_waiters(&mut c, 2).await;

    drop(tx);
    running.shutdown().await;
}

/// A shutdown ends a stream whose client keeps it open (`grpc.rs`'s
/// `Session` ends when the server stops), with the acquire it had queued: the
/// shutdown returns, and the client sees its stream end, after at most an
/// `UNAVAILABLE` for that acquire. A session that kept running would hold
/// tonic's graceful shutdown open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_stream_its_client_keeps_open() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let (holder, waiter) = (lease(&mut c, 60_000).await, lease(&mut c, 60_000).await);
    let first =
        pb::AcquireRequest { request_id: request_id(), lease_id: holder, lock: LOCK.into(), ..Default::default() };
    let held = c.acquire(first).await.unwrap().into_inner();
    assert!(matches!(held.outcome, Some(Outcome::Acquired(_))), "{held:?}");
    let (tx, mut responses) = open(&mut c).await;
    tx.send(pb::SessionRequest { op_id: 1, op: Some(acquire(waiter, 60_000)) }).await.unwrap();
    until_waiters(&mut c, 1).await;

    let stopped = tokio::time::timeout(Duration::from_secs(30), running.shutdown()).await;
    assert!(stopped.is_ok(), "the shutdown waited for a stream its client keeps open");
    // The queued acquire may be told the node stops (a reply it can retry
    // elsewhere), and then the stream ends.
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), responses.message()).await.expect("the stream ends");
        let Ok(Some(reply)) = msg else { break };
        let Some(R::Error(e)) = &reply.result else { panic!("a reply after the shutdown: {reply:?}") };
        assert!(reply.op_id == 1 && e.code == tonic::Code::Unavailable as i32, "{reply:?}");
    }
    drop(tx);
}
