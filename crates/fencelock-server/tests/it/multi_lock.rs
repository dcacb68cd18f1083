//! Atomic multi-locks over gRPC (issue 18, part 3): an acquire naming several
//! locks (`also`) is granted all of them from one log entry, one token per
//! lock in the order named, or none; a waiting one is woken once, with every
//! grant; an invalid one is refused before anything is written.
//!
//! - INV-18 never a partial multi-lock.
//! - INV-9 an invalid request is rejected and writes nothing.

use std::time::Duration;

use fencelock_proto::v1 as pb;
use pb::acquire_response::Outcome;
use tonic::Code;

use crate::support;
use support::{last_log_index, lease, request_id, start, Client};

fn acquire(lease: u64, locks: &[&str], wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        request_id: request_id(),
        lease_id: lease,
        lock: locks[0].into(),
        also: locks[1..].iter().map(|l| l.to_string()).collect(),
        wait_ms,
        ..Default::default()
    }
}

/// The (lock, token) of each grant of an `acquired_all` answer.
fn grants(r: pb::AcquireResponse) -> Vec<(String, u64)> {
    match r.outcome {
        Some(Outcome::AcquiredAll(all)) => all.grants.into_iter().map(|g| (g.lock, g.token)).collect(),
        other => panic!("expected acquired_all, got {other:?}"),
    }
}

/// How many waiters `lock` has.
async fn waiters(c: &mut Client, lock: &str) -> usize {
    let info = c.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await.unwrap().into_inner();
    info.lock.map_or(0, |l| l.waiters.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv18_a_multi_lock_is_granted_whole_from_one_entry_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let (l1, l2) = (lease(&mut c, 60_000).await, lease(&mut c, 60_000).await);

    // INV-9: refused before it is proposed.
    let before = last_log_index(&running).await;
    for bad in [acquire(l1, &["x", "y", "x"], 0), pb::AcquireRequest { permits: 2, ..acquire(l1, &["x", "y"], 0) }] {
        assert_eq!(c.acquire(bad).await.unwrap_err().code(), Code::InvalidArgument);
    }
    assert_eq!(last_log_index(&running).await, before, "a rejected multi-lock writes nothing");

    // All free: every lock, in the order named, consecutive tokens, one entry.
    let got = grants(c.acquire(acquire(l1, &["c", "a", "b"], 0)).await.unwrap().into_inner());
    assert_eq!(got.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(), ["c", "a", "b"]);
    assert_eq!((got[1].1, got[2].1), (got[0].1 + 1, got[0].1 + 2));
    assert_eq!(last_log_index(&running).await, before.map(|i| i + 1), "one log entry");

    // One lock held by someone else: a try takes nothing.
    let r = c.acquire(acquire(l2, &["d", "a"], 0)).await.unwrap().into_inner();
    assert!(matches!(r.outcome, Some(Outcome::Busy(_))), "{r:?}");
    assert_eq!(waiters(&mut c, "d").await, 0);
    let info = c.describe_lock(pb::DescribeLockRequest { lock: "d".into() }).await.unwrap().into_inner();
    assert!(info.lock.is_none_or(|l| l.holder.is_none()), "INV-18: d was not taken alone");
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv18_a_waiting_multi_lock_is_queued_on_every_lock_and_woken_once_with_every_grant() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let (l1, l2) = (lease(&mut c, 60_000).await, lease(&mut c, 60_000).await);
    let held = c.acquire(acquire(l2, &["b"], 0)).await.unwrap().into_inner();
    let Some(Outcome::Acquired(b)) = held.outcome else { panic!("{held:?}") };

    let mut waiter = c.clone();
    let task = tokio::spawn(async move { waiter.acquire(acquire(l1, &["a", "b"], 20_000)).await });
    let queued = async {
        while waiters(&mut c, "a").await == 0 || waiters(&mut c, "b").await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), queued).await.expect("queued on both locks");
    let info = c.describe_lock(pb::DescribeLockRequest { lock: "a".into() }).await.unwrap().into_inner();
    assert!(info.lock.unwrap().holder.is_none(), "INV-18: free a is not taken while b is held");

    let release = pb::ReleaseRequest { request_id: request_id(), lease_id: l2, lock: "b".into(), token: b.token };
    assert!(c.release(release).await.unwrap().into_inner().released);
    let r = tokio::time::timeout(Duration::from_secs(10), task).await.expect("woken").unwrap().unwrap();
    let got = grants(r.into_inner());
    assert_eq!(got.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(got[1].1, got[0].1 + 1);
    assert!(got[0].1 > b.token, "INV-2");
    running.shutdown().await;
}
