//! A real node with its Raft log in the segment log (`log = "segment"`, see
//! `fencelock_server::raft::wal`): it grants, snapshots and purges its log
//! behind the snapshot, starts again from its data dir, and goes on.
//!
//! - INV-2 tokens strictly increase across all grants, never reused (restarts
//!   included): the log read back at start-up is the log that was written.
//! - A data dir keeps its log engine: started with the other one, it is
//!   refused, never served from an empty log.

use fencelock_proto::v1::{self as pb, acquire_response::Outcome};
use fencelock_server::LogEngine;

use crate::support;
use support::{error_chain, lease, on_log, request_id, start_config, try_start_config, Client};

/// The token of a grant of the free lock `lock`.
async fn token(c: &mut Client, lease_id: u64, lock: &str) -> u64 {
    let req =
        pb::AcquireRequest { request_id: request_id(), lease_id, lock: lock.into(), wait_ms: 0, ..Default::default() };
    match c.acquire(req).await.map(|r| r.into_inner().outcome) {
        Ok(Some(Outcome::Acquired(a))) => a.token,
        other => panic!("acquire of the free lock {lock}: {other:?}"),
    }
}

async fn holder_token(c: &mut Client, lock: &str) -> Option<u64> {
    let info = c.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await.expect("describe").into_inner();
    info.lock.and_then(|l| l.holder).map(|h| h.token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv2_a_node_on_the_segment_log_restarts_and_tokens_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = on_log(dir.path(), LogEngine::Segment);
    let (running, mut c) = start_config(&cfg).await;
    let l = lease(&mut c, 600_000).await;

    // Grant until the log has been purged behind a snapshot (past the 1000
    // entries openraft keeps), so that the restart reads a purged log.
    let mut last = 0;
    let mut i = 0;
    while running.raft.metrics().borrow().purged.is_none() {
        assert!(i < 20_000, "no purge after {i} grants");
        let t = token(&mut c, l, &format!("lock-{i}")).await;
        assert!(t > last, "INV-2: {t} after {last}");
        last = t;
        i += 1;
    }
    let purged = running.raft.metrics().borrow().purged.expect("purged");
    running.shutdown().await;
    assert!(dir.path().join("data/wal").read_dir().unwrap().count() > 0, "the log is in wal/");

    // Started with the other engine, the data dir is refused.
    let refused = try_start_config(&on_log(dir.path(), LogEngine::Redb)).await;
    let err = error_chain(&refused.err().expect("the redb engine must refuse a segment data dir"));
    assert!(err.contains("log = \"segment\""), "{err}");

    let (running, mut c) = start_config(&cfg).await;
    let l2 = lease(&mut c, 600_000).await; // once the node serves again
    assert_eq!(holder_token(&mut c, &format!("lock-{}", i - 1)).await, Some(last), "the last grant survived");
    assert_eq!(holder_token(&mut c, "lock-0").await.map(|t| t > 0), Some(true), "the first grant survived");
    let next = token(&mut c, l2, "after-restart").await;
    assert!(next > last, "INV-2 across the restart: {next} after {last}");
    let metrics = running.raft.metrics().borrow().clone();
    assert!(metrics.purged >= Some(purged), "the purge point is kept: {:?}", metrics.purged);
    running.shutdown().await;
}

/// Benchmark, not a test (ignored; timings are printed, not asserted): a real
/// node, 32 clients each granting 100 locks one after the other, on redb's log
/// and on the segment log; grants per second and the raft log's last index.
/// `cargo test -p fencelock-server segment_log:: -- --ignored --nocapture`.
/// Asserts only that every grant got a new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
#[allow(clippy::disallowed_methods)] // a benchmark reads the wall clock
async fn bench_grants_redb_against_segment() {
    const CLIENTS: u64 = 32;
    const EACH: u64 = 100;
    let base = std::env::var_os("FENCELOCK_BENCH_DIR").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    for log in [LogEngine::Redb, LogEngine::Segment, LogEngine::Redb, LogEngine::Segment] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        let mut cfg = on_log(dir.path(), log);
        cfg.snapshot_every = 20_000;
        let (running, mut c) = start_config(&cfg).await;
        let l = lease(&mut c, 600_000).await;
        let t = std::time::Instant::now();
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|k| {
                let mut c = c.clone();
                tokio::spawn(async move {
                    let mut tokens = Vec::new();
                    for i in 0..EACH {
                        tokens.push(token(&mut c, l, &format!("c{k}-{i}")).await);
                    }
                    tokens
                })
            })
            .collect();
        let mut tokens = Vec::new();
        for t in tasks {
            tokens.extend(t.await.unwrap());
        }
        let secs = t.elapsed().as_secs_f64();
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len() as u64, CLIENTS * EACH, "INV-2: every grant a new token");
        let last = running.raft.metrics().borrow().last_log_index;
        println!(
            "{log:<8} {} grants by {CLIENTS} clients in {secs:.2} s: {:>6.0} grants/s, log at index {last:?}",
            CLIENTS * EACH,
            (CLIENTS * EACH) as f64 / secs
        );
        running.shutdown().await;
    }
}
