//! One byte of corruption anywhere in a real data dir is either detected or
//! provably harmless (issue 14, part 4): the data dir of a server that granted
//! and released locks is copied, one byte of the copy is changed, and
//! `check_data` (which reads it as a start would, and replays the log) must
//! refuse it, or produce exactly the state of the original.
//!
//! Before records carried checksums, changing `3600000` to `9600000` inside one
//! log entry started cleanly with 0 of 30 locks and the next token 1.
//!
//! - INV-2 tokens never go backwards (a corrupted counter is never served).
//! - INV-10 what was acknowledged is not silently lost.

use std::path::Path;

use fencelock_proto::v1::{self as pb, acquire_response::Outcome};
use fencelock_server::raft::check::check_data;
use fencelock_server::raft::DB_FILE;

mod support;
use support::{lease, request_id, start_config};

/// A data dir with leases, held and released locks, and a stopped server,
/// whose Raft log is in redb (`log = "redb"`): the flips go through the one
/// database file. (On the segment log a changed byte in the last record reads
/// as a torn write and is cut, as redb rolls back a torn last commit: see the
/// segment log's own tests in `raft/wal/`.)
async fn real_data_dir(dir: &Path) {
    let mut config = fencelock_server::Config::for_test(dir.join("data"));
    config.log = fencelock_server::LogEngine::Redb;
    let (running, mut c) = start_config(&config).await;
    let l = lease(&mut c, 3_600_000).await;
    for i in 0..30 {
        let req = pb::AcquireRequest {
            request_id: request_id(),
            lease_id: l,
            lock: format!("lock-{i}"),
            wait_ms: 0,
            lock_delay_ms: 0,
            ..Default::default()
        };
        let Some(Outcome::Acquired(a)) = c.acquire(req).await.unwrap().into_inner().outcome else { panic!("acquire") };
        if i % 3 == 0 {
            let rel = pb::ReleaseRequest { request_id: request_id(), lease_id: l, lock: a.lock, token: a.token };
            c.release(rel).await.unwrap();
        }
    }
    running.shutdown().await;
}

/// The offsets to flip: a spread over the whole file, and every byte of the
/// stretches around where the records' text is.
fn offsets(file: &[u8]) -> Vec<usize> {
    let mut at: Vec<usize> = (0..file.len()).step_by((file.len() / 600).max(1)).collect();
    let needle = b"lock-1";
    let hits = file.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i);
    for hit in hits.take(12) {
        at.extend(hit.saturating_sub(48)..(hit + 48).min(file.len()));
    }
    at.sort_unstable();
    at.dedup();
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_single_byte_flip_is_detected_or_harmless() {
    let tmp = tempfile::tempdir().unwrap();
    real_data_dir(&tmp.path().join("original")).await;
    // The test support keeps a server's data in `data/` under the dir it is given.
    let original = tmp.path().join("original").join("data");
    // The database may be held for a moment after an in-process shutdown.
    let baseline = loop {
        match check_data(&original) {
            Ok(r) => break r,
            Err(e) if e.to_string().contains("already") => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(e) => panic!("the original data dir must pass: {e}"),
        }
    };
    assert_eq!((baseline.stats.leases, baseline.stats.held_locks), (1, 20), "{baseline:?}");
    let bytes = std::fs::read(original.join(DB_FILE)).unwrap();
    let copy = tmp.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    let (mut detected, mut harmless) = (0, 0);
    let at = offsets(&bytes);
    assert!(at.len() > 1000, "only {} offsets", at.len());
    for &i in &at {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0x04;
        std::fs::write(copy.join(DB_FILE), &flipped).unwrap();
        match check_data(&copy) {
            Err(_) => detected += 1,
            Ok(r) if r.engine == baseline.engine && r.entries == baseline.entries => harmless += 1,
            Ok(r) => panic!(
                "a flip at byte {i} was served as a different state: {:?} instead of {:?}",
                r.stats, baseline.stats
            ),
        }
    }
    println!("{} offsets of {} bytes: {detected} detected, {harmless} harmless", at.len(), bytes.len());
    assert!(detected > 0, "no flip was detected: the check cannot fail");
}
