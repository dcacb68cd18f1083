//! One byte of corruption anywhere in a real data dir is either detected or
//! provably harmless (issue 14, part 4): the data dir of a server that granted
//! and released locks is copied, one byte of the copy is changed, and
//! `check_data` (which reads it as a start would, and replays the log) must
//! refuse it, or produce exactly the state of the original.
//!
//! Before records carried checksums, changing `3600000` to `9600000` inside one
//! log entry started cleanly with 0 of 30 locks and the next token 1.
//!
//! The same holds for the segment log's files (`wal/`): a changed byte in a
//! record before the last batch is corruption; in the last batch it reads as
//! a torn write, which a start cuts, and then the log ends before the
//! committed index, which a start (and `check_data`) refuses.
//!
//! - INV-2 tokens never go backwards (a corrupted counter is never served).
//! - INV-10 what was acknowledged is not silently lost.

use std::path::Path;

use fencelock_proto::v1::{self as pb, acquire_response::Outcome};
use fencelock_server::raft::check::{check_data, DataReport};
use fencelock_server::raft::DB_FILE;

use crate::support;
use support::{lease, request_id, start_config};

/// A data dir with leases, held and released locks, and a stopped server,
/// whose Raft log is in `log`: in redb, the flips go through the one database
/// file; on the segment log, through the segment files of `wal/`.
async fn real_data_dir(dir: &Path, log: fencelock_server::LogEngine) {
    real_data_dir_with(dir, log, false).await
}

/// [`real_data_dir`], with a snapshot of it all taken before the server stops
/// if `snapshot`.
async fn real_data_dir_with(dir: &Path, log: fencelock_server::LogEngine, snapshot: bool) {
    let mut config = fencelock_server::Config::for_test(dir.join("data"));
    config.log = log;
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
    if snapshot {
        let last = support::last_log_index(&running).await.expect("entries");
        running.raft.trigger().snapshot().await.unwrap();
        let wait = running.raft.wait(Some(std::time::Duration::from_secs(30)));
        wait.metrics(|m| m.snapshot.is_some_and(|s| s.index >= last), "the snapshot is stored").await.unwrap();
    }
    running.shutdown().await;
}

/// `check_data` of the stopped server's data dir `dir` (the database may be
/// held for a moment after an in-process shutdown), which must pass.
async fn baseline(dir: &Path) -> DataReport {
    loop {
        match check_data(dir) {
            Ok(r) => break r,
            Err(e) if e.to_string().contains("already") => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(e) => panic!("the original data dir must pass: {e}"),
        }
    }
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
    real_data_dir(&tmp.path().join("original"), fencelock_server::LogEngine::Redb).await;
    // The test support keeps a server's data in `data/` under the dir it is given.
    let original = tmp.path().join("original").join("data");
    let baseline = baseline(&original).await;
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

/// The segment log's records, byte by byte: each single flip in the records
/// of a real `wal/` segment (and a spread over its zero tail) is refused by
/// `check_data` or yields exactly the original state, never fewer entries.
/// Before `check_data` compared the log's end with the committed index, a flip
/// in the last batch passed as a log one batch shorter: the server's last
/// acknowledged grants, silently gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_single_byte_flip_in_the_segment_log_is_detected_or_harmless() {
    let tmp = tempfile::tempdir().unwrap();
    real_data_dir(&tmp.path().join("original"), fencelock_server::LogEngine::Segment).await;
    let original = tmp.path().join("original").join("data");
    let baseline = baseline(&original).await;
    assert_eq!((baseline.stats.leases, baseline.stats.held_locks), (1, 20), "{baseline:?}");
    let copy = tmp.path().join("copy");
    std::fs::create_dir_all(copy.join("wal")).unwrap();
    std::fs::copy(original.join(DB_FILE), copy.join(DB_FILE)).unwrap();
    let segments: Vec<_> = std::fs::read_dir(original.join("wal")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let name = segments[0].file_name().unwrap().to_owned();
    let mut bytes = std::fs::read(&segments[0]).unwrap();
    // The preallocated zeros after the records, but for 4 KiB, are left out of
    // the copy: every check then reads kilobytes, not the whole segment.
    let records_end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    bytes.truncate(records_end.next_multiple_of(8) + 4096);
    std::fs::write(copy.join("wal").join(&name), &bytes).unwrap();
    let shortened = check_data(&copy).expect("the shortened copy passes");
    assert_eq!((&shortened.engine, shortened.entries), (&baseline.engine, baseline.entries));
    let step = records_end.div_ceil(6000).max(1);
    let at: Vec<usize> = (0..records_end).step_by(step).chain((records_end..bytes.len()).step_by(61)).collect();
    let (mut detected, mut harmless) = (0, 0);
    for &i in &at {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0x04;
        std::fs::write(copy.join("wal").join(&name), &flipped).unwrap();
        match check_data(&copy) {
            Err(_) => detected += 1,
            Ok(r) if r.engine == baseline.engine && r.entries == baseline.entries => harmless += 1,
            Ok(r) => panic!(
                "a flip at byte {i} of the segment was served as a different state: {} entries, {:?} instead of {}, {:?}",
                r.entries, r.stats, baseline.entries, baseline.stats
            ),
        }
    }
    println!("{} offsets of {records_end} record bytes: {detected} detected, {harmless} harmless", at.len());
    assert!(detected > 0, "no flip was detected: the check cannot fail");
}

/// The snapshot's file (`snap/`), byte by byte: every single flip is refused
/// by `check_data` (the frame's checksum covers each byte, and the database
/// records the file's length), and so is a missing file: the state a start
/// would serve is never another one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_single_byte_flip_in_the_snapshot_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    real_data_dir_with(&tmp.path().join("original"), fencelock_server::LogEngine::Segment, true).await;
    let original = tmp.path().join("original").join("data");
    let baseline = baseline(&original).await;
    assert_eq!((baseline.stats.leases, baseline.stats.held_locks), (1, 20), "{baseline:?}");
    let copy = tmp.path().join("copy");
    for sub in ["wal", "snap"] {
        std::fs::create_dir_all(copy.join(sub)).unwrap();
        for file in std::fs::read_dir(original.join(sub)).unwrap() {
            let file = file.unwrap().path();
            std::fs::copy(&file, copy.join(sub).join(file.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(original.join(DB_FILE), copy.join(DB_FILE)).unwrap();
    let snaps: Vec<_> = std::fs::read_dir(copy.join("snap")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let bytes = std::fs::read(&snaps[0]).unwrap();
    let at: Vec<usize> = (0..bytes.len()).step_by(bytes.len().div_ceil(10_000).max(1)).collect();
    for &i in &at {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0x04;
        std::fs::write(&snaps[0], &flipped).unwrap();
        assert!(check_data(&copy).is_err(), "a flip at byte {i} of {} was not refused", bytes.len());
    }
    std::fs::write(&snaps[0], &bytes).unwrap();
    let whole = check_data(&copy).expect("the unflipped copy passes");
    assert_eq!((&whole.engine, whole.entries), (&baseline.engine, baseline.entries));
    std::fs::remove_file(&snaps[0]).unwrap();
    let missing = check_data(&copy).expect_err("a missing snapshot file is refused").to_string();
    assert!(missing.contains("missing"), "{missing}");
    println!("{} flips of {} bytes, all refused", at.len(), bytes.len());
}
