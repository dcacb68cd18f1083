//! A dropped acquire call and its retry, end to end: a real server in this process
//! (`start` on a temp dir) and the raw gRPC client.
//!
//! Invariant: a cancel never ends the wait of a caller that is still there. When
//! a queued acquire's call is dropped (its client lost the connection) and the
//! client retries the same (lease, request id) on a new call, the retry owns the
//! wait: the old call's `CancelWait` (sent when its handler is dropped, racing with
//! the retry) must neither end the retry's wait (it would be told `TimedOut` while
//! its acquire stays queued, and the later grant would be held by nobody) nor
//! release the grant the retry is answered with. So once the holder releases, the
//! retry is answered `Acquired`, and the lock's holder is the waiter's lease with
//! the token the retry got.

use std::time::Duration;

use crate::support;
use fencelock_proto::v1::{self as pb, acquire_response::Outcome};

use support::{lease, request_id, start, Client};

/// Locks (one per round) on which the drop and the retry race.
const ROUNDS: u64 = 50;

async fn acquire(c: &mut Client, req: u64, lease_id: u64, lock: &str, wait_ms: u64) -> Option<Outcome> {
    let r = pb::AcquireRequest {
        request_id: req,
        lease_id,
        lock: lock.into(),
        wait_ms,
        lock_delay_ms: 0,
        ..Default::default()
    };
    c.acquire(r).await.expect("acquire").into_inner().outcome
}

async fn describe(c: &mut Client, lock: &str) -> pb::LockInfo {
    let r = c.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await.expect("describe");
    r.into_inner().lock.expect("lock info")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_owns_the_wait_its_dropped_call_left() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let holder = lease(&mut c, 60_000).await;
    let waiter = lease(&mut c, 60_000).await;
    for round in 0..ROUNDS {
        let lock = format!("x{round}");
        let token = match acquire(&mut c, request_id(), holder, &lock, 0).await {
            Some(Outcome::Acquired(a)) => a.token,
            other => panic!("{lock}: the holder's acquire of a free lock: {other:?}"),
        };
        // The waiter queues under request id `req`, then its call is dropped.
        let req = request_id();
        let mut first = c.clone();
        let name = lock.clone();
        let call = tokio::spawn(async move { acquire(&mut first, req, waiter, &name, 30_000).await });
        while describe(&mut c, &lock).await.waiters.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        call.abort();
        // Vary the gap so the old call's cancel lands before, with and after the retry.
        if round % 3 == 1 {
            tokio::task::yield_now().await;
        } else if round % 3 == 2 {
            tokio::time::sleep(Duration::from_micros(200 * (round % 7))).await;
        }
        let mut second = c.clone();
        let name = lock.clone();
        let retry = tokio::spawn(async move { acquire(&mut second, req, waiter, &name, 30_000).await });
        // Let the cancel and the retry be decided before the holder lets go.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let rel = pb::ReleaseRequest { request_id: request_id(), lease_id: holder, lock: lock.clone(), token };
        assert!(c.release(rel).await.expect("release").into_inner().released, "{lock}: the holder releases");
        let got = tokio::time::timeout(Duration::from_secs(5), retry).await.expect("the retry is answered").unwrap();
        let Some(Outcome::Acquired(a)) = got else {
            panic!("{lock} (round {round}): the retry of a dropped call must get the lock, got {got:?}");
        };
        // The grant was not released by the old call's cancel.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let held = describe(&mut c, &lock).await.holder;
        let held = held.map(|h| (h.lease_id, h.token));
        assert_eq!(held, Some((waiter, a.token)), "{lock} (round {round}): the lock is held by the retry's grant");
    }
    running.shutdown().await;
}
