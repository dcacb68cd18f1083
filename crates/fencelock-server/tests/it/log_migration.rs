//! A real node whose data dir was written with its Raft log in redb (`log =
//! "redb"`), started again with `log = "segment"`: its log moves into the
//! segment log on that start (`fencelock_server::raft::log_store::migrate`), and it
//! goes on from where it stopped.
//!
//! - INV-2 tokens strictly increase across all grants, never reused, across
//!   the start that moves the log: the moved log is the log that was written.
//! - A held lock stays held by its lease across that start, under its token.
//! - The moved data dir passes `fencelock check-data`, and the redb engine
//!   refuses it from then on (the move is one way).

use std::path::Path;

use fencelock_proto::v1::{self as pb, acquire_response::Outcome};
use fencelock_server::LogEngine;

use crate::support;
use support::{error_chain, lease, on_log, request_id, start_config, try_start_config, Client};

/// What an acquire of `lock` by `lease_id` without waiting got.
async fn try_acquire(c: &mut Client, lease_id: u64, lock: &str) -> Option<Outcome> {
    let req =
        pb::AcquireRequest { request_id: request_id(), lease_id, lock: lock.into(), wait_ms: 0, ..Default::default() };
    c.acquire(req).await.expect("acquire").into_inner().outcome
}

/// The token of a grant of the free lock `lock`.
async fn token(c: &mut Client, lease_id: u64, lock: &str) -> u64 {
    match try_acquire(c, lease_id, lock).await {
        Some(Outcome::Acquired(a)) => a.token,
        other => panic!("acquire of the free lock {lock}: {other:?}"),
    }
}

/// The lease and token holding `lock`, if any.
async fn holder(c: &mut Client, lock: &str) -> Option<(u64, u64)> {
    let info = c.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await.expect("describe").into_inner();
    info.lock.and_then(|l| l.holder).map(|h| (h.lease_id, h.token))
}

/// Segment files in `dir`.
fn segments(dir: &Path) -> usize {
    let listed = std::fs::read_dir(dir).map(|d| d.filter_map(Result::ok).collect::<Vec<_>>()).unwrap_or_default();
    listed.iter().filter(|e| e.path().extension().is_some_and(|x| x == "seg")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv2_a_redb_node_restarted_on_the_segment_log_keeps_its_locks_and_tokens() {
    const GRANTS: usize = 150; // past `snapshot_every`: the moved log starts after a snapshot
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (running, mut c) = start_config(&on_log(dir.path(), LogEngine::Redb)).await;
    let held_by = lease(&mut c, 600_000).await;
    let mut tokens = Vec::new();
    for i in 0..GRANTS {
        let t = token(&mut c, held_by, &format!("lock-{i}")).await;
        assert!(tokens.last().is_none_or(|last| t > *last), "INV-2: {t} after {tokens:?}");
        tokens.push(t);
    }
    let last_index = running.raft.metrics().borrow().last_log_index;
    running.shutdown().await;
    assert_eq!(segments(&data.join("wal")), 0, "the log is in redb");

    let (running, mut c) = start_config(&on_log(dir.path(), LogEngine::Segment)).await;
    let other = lease(&mut c, 600_000).await; // once the node serves again
    for i in [0, GRANTS / 2, GRANTS - 1] {
        let lock = format!("lock-{i}");
        assert_eq!(holder(&mut c, &lock).await, Some((held_by, tokens[i])), "{lock} is still held");
        assert!(matches!(try_acquire(&mut c, other, &lock).await, Some(Outcome::Busy(_))), "{lock} is not free");
    }
    let next = token(&mut c, other, "after-the-move").await;
    assert!(next > tokens[GRANTS - 1], "INV-2 across the move: {next} after {}", tokens[GRANTS - 1]);
    assert!(running.raft.metrics().borrow().last_log_index > last_index, "the log goes on after the moved one");
    running.shutdown().await;
    assert!(segments(&data.join("wal")) > 0, "the log is in wal/");

    // (The refused start waits until the node just stopped lets go of the
    // data dir, and closes it again: then check-data can open it.)
    let refused = try_start_config(&on_log(dir.path(), LogEngine::Redb)).await;
    let err = error_chain(&refused.err().expect("the redb engine must refuse the moved data dir"));
    assert!(err.contains("log = \"segment\"") && err.contains("snapshot restore"), "{err}");
    let report = fencelock_server::raft::check::check_data(&data).expect("check-data passes on the moved data dir");
    assert!(report.last_index > last_index, "check-data reads the moved log: {report:?}");
}
