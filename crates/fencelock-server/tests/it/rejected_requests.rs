//! A rejected request costs no disk (issue 14, part 2): every client request is
//! validated before it becomes a log entry, so an invalid one is answered
//! INVALID_ARGUMENT and writes nothing.
//!
//! - INV-9 an invalid input is rejected with an error and changes nothing (here:
//!   not even the log).
//!
//! Before the fix each of these requests was written to the log and rejected
//! only when applied: 400 acquires with a 3.9 MB name grew the database by 4 GB.

use fencelock_proto::v1 as pb;
use tonic::Code;

use crate::support;
use support::{last_log_index, lease, request_id, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv9_invalid_requests_write_no_log_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let l = lease(&mut c, 60_000).await;
    let before = last_log_index(&running).await;

    let long_name = "n".repeat(600);
    for round in 0..20 {
        let acquire = |lock: &str, wait_ms| pb::AcquireRequest {
            request_id: request_id(),
            lease_id: l,
            lock: lock.into(),
            wait_ms,
            lock_delay_ms: 0,
            ..Default::default()
        };
        let statuses = [
            c.acquire(acquire(&long_name, 0)).await.unwrap_err(),
            c.acquire(acquire("", 0)).await.unwrap_err(),
            c.acquire(acquire("ok", 10 * 3_600_000)).await.unwrap_err(),
            c.grant_lease(pb::GrantLeaseRequest { request_id: request_id(), ttl_ms: 1 }).await.unwrap_err(),
            c.keep_alive(pb::KeepAliveRequest { request_id: 0, lease_id: l }).await.unwrap_err(),
            c.release(pb::ReleaseRequest { request_id: request_id(), lease_id: l, lock: "ok".into(), token: 0 })
                .await
                .unwrap_err(),
        ];
        for s in statuses {
            assert_eq!(s.code(), Code::InvalidArgument, "round {round}: {s:?}");
        }
    }
    assert_eq!(last_log_index(&running).await, before, "a rejected request must not become a log entry");

    // A valid request still does.
    let ok = pb::AcquireRequest {
        request_id: request_id(),
        lease_id: l,
        lock: "ok".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        ..Default::default()
    };
    c.acquire(ok).await.expect("a valid acquire");
    assert!(last_log_index(&running).await > before);
}
