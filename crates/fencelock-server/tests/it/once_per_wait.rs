//! Jobs once per slot over gRPC (issue 18 §4): acquires for a slot that wait
//! while a run holds the lock, one by the unary `Acquire` and one on a
//! `Session` stream, are both answered `slot_done` (the run's token, identity
//! and exit code) once the run completed the slot and released: never
//! granted. The driver wakes them from the engine's `WaitEnded{SlotDone}`.

use std::time::Duration;

use fencelock_proto::v1 as pb;
use pb::{acquire_response::Outcome, session_request::Op, session_response::Result as R};

use crate::support;
use support::{lease, request_id, start, Client};

fn once(lease: u64, wait_ms: u64, identity: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        request_id: request_id(),
        lease_id: lease,
        lock: "nightly".into(),
        wait_ms,
        identity: identity.into(),
        once_per: "2026-11-23".into(),
        ..Default::default()
    }
}

async fn waiters(c: &mut Client) -> usize {
    let info = c.describe_lock(pb::DescribeLockRequest { lock: "nightly".into() }).await.unwrap().into_inner();
    info.lock.map_or(0, |l| l.waiters.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_for_a_slot_done_meanwhile_are_answered_slot_done_unary_and_on_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let (l1, l2, l3) = (lease(&mut c, 60_000).await, lease(&mut c, 60_000).await, lease(&mut c, 60_000).await);
    let ran = c.acquire(once(l1, 0, "host-a:1")).await.unwrap().into_inner();
    let Some(Outcome::Acquired(run)) = ran.outcome else { panic!("{ran:?}") };

    // Two waiters: the unary call, and an acquire on a session stream.
    let mut unary = c.clone();
    let unary = tokio::spawn(async move { unary.acquire(once(l2, 20_000, "host-b:2")).await });
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let op = Op::Acquire(once(l3, 20_000, "host-c:3"));
    tx.send(pb::SessionRequest { op_id: 7, op: Some(op) }).await.unwrap();
    let mut session = c.session(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let queued = async {
        while waiters(&mut c).await < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), queued).await.expect("both queued");

    let complete = pb::CompleteSlotRequest {
        request_id: request_id(),
        lease_id: l1,
        lock: "nightly".into(),
        token: run.token,
        slot: "2026-11-23".into(),
        exit_code: 3,
    };
    c.complete_slot(complete).await.unwrap();
    let release =
        pb::ReleaseRequest { request_id: request_id(), lease_id: l1, lock: "nightly".into(), token: run.token };
    assert!(c.release(release).await.unwrap().into_inner().released);

    let done = pb::SlotDone { token: run.token, identity: "host-a:1".into(), exit_code: 3 };
    let got = tokio::time::timeout(Duration::from_secs(10), unary).await.expect("unary woken").unwrap().unwrap();
    assert_eq!(got.into_inner().outcome, Some(Outcome::SlotDone(done.clone())));
    let msg = tokio::time::timeout(Duration::from_secs(10), session.message()).await.expect("session woken");
    let msg = msg.unwrap().expect("a session response");
    assert_eq!(msg.op_id, 7);
    let want = R::Acquire(pb::AcquireResponse { outcome: Some(Outcome::SlotDone(done)) });
    assert_eq!(msg.result, Some(want));
    // Nobody holds or waits: the waiters were never granted.
    let info = c.describe_lock(pb::DescribeLockRequest { lock: "nightly".into() }).await.unwrap().into_inner();
    assert!(info.lock.as_ref().is_none_or(|l| l.holder.is_none() && l.waiters.is_empty()), "{info:?}");
    drop(tx);
    running.shutdown().await;
}
