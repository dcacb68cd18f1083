//! Tests of a snapshot's way from the leader's file to a follower's (issue
//! 38 §3, "no size cliff"): chunks read from the stored file, written to the
//! follower's file as they arrive, checked from there and adopted in place;
//! what is refused changes nothing and leaves no file behind.
//!
//! Where it sits: beside `tests.rs` (whose group-level test of a wiped
//! follower catching up is `a_wiped_follower_catches_up_by_a_chunked_snapshot_while_grants_go_on`),
//! driving [`Receiver`] directly with the chunks openraft's `Chunked` would
//! send, on a follower whose Raft is not part of any group.

use std::path::{Path, PathBuf};

use fencelock_core::{Acquire, Command, Engine, Input, LeaseId, Reply, RequestId};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::InstallSnapshotRequest;
use openraft::storage::RaftStateMachine;
use openraft::{RaftSnapshotBuilder, Snapshot, Vote};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::snapshot_file::SNAP_DIR;
use super::snapshot_rx::{Limits, Receiver, Refused};
use super::tests::{blank, membership, normal, payload, snapshot_files, test_config};
use super::{open_storage, Network, Raft, SharedEngine, StateMachine, TypeConfig};

const HOUR_MS: u64 = 3_600_000;
/// Bytes per chunk: the snapshots here are tens of chunks.
const CHUNK: usize = 8 * 1024;

/// A leader's state machine with `leases` one-hour leases, each holding a
/// lock of its own (entries 1-4), blank entries up to `last`, and a snapshot
/// of it stored.
async fn leader_with(leases: u64, last: u64) -> (TempDir, StateMachine, Snapshot<TypeConfig>) {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut sm) = open_storage(dir.path()).unwrap();
    sm.apply(vec![membership(1, 1, &[1]), normal(1, 2, Input::leader_start(1_000))]).await.unwrap();
    let grants = (0..leases).map(|i| Command::GrantLease { req: RequestId(i + 1), ttl_ms: HOUR_MS, id: None });
    let out = sm.apply(vec![normal(1, 3, Input::Batch { now: 1_100, cmds: grants.collect() })]).await.unwrap();
    let acquires = out[0].replies.iter().map(|reply| {
        let Reply::LeaseGranted { lease: LeaseId(l), .. } = reply else { panic!("grant refused: {reply:?}") };
        Command::Acquire(Acquire::exclusive(RequestId(1), LeaseId(*l), format!("lock/{l}"), 0))
    });
    sm.apply(vec![normal(1, 4, Input::Batch { now: 1_200, cmds: acquires.collect() })]).await.unwrap();
    sm.apply((5..=last).map(|i| blank(1, i))).await.unwrap();
    sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let snap = sm.get_current_snapshot().await.unwrap().expect("stored");
    (dir, sm, snap)
}

/// A follower (node 2, in no group) and its engine.
async fn follower() -> (TempDir, Raft, SharedEngine) {
    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path()).unwrap();
    let engine = sm.engine();
    let raft = Raft::new(2, test_config(), Network::new(2, None), log, sm).await.unwrap();
    (dir, raft, engine)
}

/// The chunks openraft's `Chunked` sends of `snap`, read as it reads them
/// (seek, then read up to a chunk) from the stored snapshot's file.
async fn chunks(snap: &mut Snapshot<TypeConfig>) -> Vec<InstallSnapshotRequest<TypeConfig>> {
    let end = snap.snapshot.seek(std::io::SeekFrom::End(0)).await.unwrap();
    let (mut out, mut offset) = (Vec::new(), 0);
    while offset < end {
        snap.snapshot.seek(std::io::SeekFrom::Start(offset)).await.unwrap();
        let mut data = Vec::with_capacity(CHUNK);
        while data.len() < CHUNK && snap.snapshot.read_buf(&mut data).await.unwrap() > 0 {}
        let done = offset + data.len() as u64 == end;
        let req =
            InstallSnapshotRequest { vote: Vote::new_committed(1, 1), meta: snap.meta.clone(), offset, data, done };
        offset += req.data.len() as u64;
        out.push(req);
    }
    out
}

/// The files of `dir`'s `snap/` ending in `suffix`.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    snapshot_files(dir).into_iter().filter(|p| p.to_string_lossy().ends_with(suffix)).collect()
}

/// The names and bytes of the files of `dir`'s `snap/`.
fn snap_dir(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    snapshot_files(dir).into_iter().map(|p| (p.clone(), std::fs::read(p).unwrap())).collect()
}

/// Sends `reqs` to `rx` in order; the answer to the last.
async fn send(
    rx: &Receiver,
    raft: &Raft,
    engine: &SharedEngine,
    reqs: Vec<InstallSnapshotRequest<TypeConfig>>,
) -> Result<super::snapshot_rx::Answer, Refused> {
    let mut last = None;
    for req in reqs {
        last = Some(rx.receive(raft, engine, req).await);
        if matches!(last, Some(Err(_))) {
            break;
        }
    }
    last.expect("a chunk")
}

/// Issue 38 §3: the receiver never holds a snapshot whole in memory. Each
/// chunk is in the follower's file, at its offset, when its RPC is
/// answered (the file grows by exactly the chunk); the last one installs
/// the snapshot by adopting that same file, which is then byte for byte
/// the leader's: header, checksum and payload. The follower's state is the
/// leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_received_chunk_by_chunk_into_a_file_that_is_adopted() {
    let (leader_dir, leader, mut snap) = leader_with(2_000, 4).await;
    let (dir, raft, engine) = follower().await;
    let rx = Receiver::default();
    let reqs = chunks(&mut snap).await;
    assert!(reqs.len() >= 20, "a snapshot of many chunks: {}", reqs.len());
    let last = reqs.len() - 1;
    for (i, req) in reqs.into_iter().enumerate() {
        let end = req.offset + req.data.len() as u64;
        let answer = rx.receive(&raft, &engine, req).await.expect("accepted");
        assert!(answer.is_ok(), "chunk {i}: {answer:?}");
        if i == last {
            break;
        }
        let incoming = files_ending(dir.path(), ".snap.incoming");
        assert_eq!(incoming.len(), 1, "one file receives the stream: {incoming:?}");
        let len = std::fs::metadata(&incoming[0]).unwrap().len();
        assert_eq!(len, super::record::HEADER as u64 + end, "chunk {i} is on disk when it is answered");
        assert!(files_ending(dir.path(), ".snap").is_empty(), "nothing installed before the last chunk");
    }
    let installed = files_ending(dir.path(), ".snap");
    assert_eq!(snapshot_files(dir.path()), installed, "the received file was adopted, nothing else is left");
    let theirs = files_ending(leader_dir.path(), ".snap");
    assert_eq!(std::fs::read(&installed[0]).unwrap(), std::fs::read(&theirs[0]).unwrap());
    assert_eq!(*engine.read().unwrap(), *leader.engine().read().unwrap());
    let at = snap.meta.last_log_id.expect("a point of the log");
    raft.wait(Some(std::time::Duration::from_secs(10))).snapshot(at, "the snapshot").await.unwrap();
    raft.shutdown().await.unwrap();
}

/// A snapshot that is cut short, or whose bytes were changed on the way, is
/// refused (INV-9): the follower's engine, applied index and snapshot files
/// are what they were, and the file it was received into is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_or_corrupt_snapshot_is_refused_and_changes_nothing() {
    let (_small_dir, _small, mut small) = leader_with(10, 4).await;
    // Beyond what the follower will have applied: openraft would install it.
    let (_leader_dir, _leader, mut snap) = leader_with(1_000, 9).await;
    let (dir, raft, engine) = follower().await;
    let rx = Receiver::default();
    let installed = send(&rx, &raft, &engine, chunks(&mut small).await).await.expect("the first is accepted");
    assert!(installed.is_ok(), "{installed:?}");
    // The install is answered before openraft's metrics show it.
    let at = small.meta.last_log_id.expect("a point of the log");
    raft.wait(Some(std::time::Duration::from_secs(10))).snapshot(at, "the first snapshot").await.unwrap();
    let (before, applied, files) =
        (engine.read().unwrap().clone(), raft.metrics().borrow().last_applied, snap_dir(dir.path()));

    let mut cut = chunks(&mut snap).await;
    cut.last_mut().unwrap().data.truncate(10);
    let mut zeroed = chunks(&mut snap).await;
    zeroed[1].data.fill(0);
    for (what, mut reqs) in [("cut", cut), ("zeroed", zeroed)] {
        for req in reqs.iter_mut() {
            req.meta.snapshot_id = what.to_string();
        }
        let refused = send(&rx, &raft, &engine, reqs).await.expect_err("refused");
        assert!(matches!(refused, Refused::Invalid { .. }), "{what}: {refused}");
        assert_eq!(*engine.read().unwrap(), before, "{what}: the state is unchanged");
        assert_eq!(raft.metrics().borrow().last_applied, applied, "{what}");
        assert_eq!(snap_dir(dir.path()), files, "{what}: the files are unchanged, no received file is left");
    }
    assert_ne!(before, Engine::new());
    raft.shutdown().await.unwrap();
}

/// A chunk that starts past what the stream has written is answered as out
/// of order and not written: the file never has a gap (read back as zeros).
/// The stream stays where it was, so the chunk it expects still completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_past_the_end_written_is_answered_out_of_order_and_not_written() {
    let (leader_dir, leader, mut snap) = leader_with(200, 4).await;
    let (dir, raft, engine) = follower().await;
    let rx = Receiver::default();
    let mut reqs = chunks(&mut snap).await;
    assert!(reqs.len() >= 3, "{}", reqs.len());
    let (first, skipped) = (reqs.remove(0), reqs[1].clone());
    let expect = first.data.len() as u64;
    assert!(rx.receive(&raft, &engine, first).await.expect("accepted").is_ok());
    let on_disk = || std::fs::metadata(&files_ending(dir.path(), ".snap.incoming")[0]).unwrap().len();
    let before = on_disk();

    let answer = rx.receive(&raft, &engine, skipped.clone()).await.expect("answered, not refused");
    let Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m))) = answer else {
        panic!("out of order: {answer:?}")
    };
    assert_eq!((m.expect.offset, m.got.offset), (expect, skipped.offset));
    assert_eq!(on_disk(), before, "nothing of the chunk is written");

    let last = send(&rx, &raft, &engine, reqs).await.expect("the stream goes on from where it was");
    assert!(last.is_ok(), "{last:?}");
    let theirs = files_ending(leader_dir.path(), ".snap");
    assert_eq!(std::fs::read(&files_ending(dir.path(), ".snap")[0]).unwrap(), std::fs::read(&theirs[0]).unwrap());
    assert_eq!(*engine.read().unwrap(), *leader.engine().read().unwrap());
    raft.shutdown().await.unwrap();
}

/// Issue 38 §3: a follower refuses a stream that would fill its disk before
/// it writes the chunk (RESOURCE_EXHAUSTED), and one past the configured
/// bound as it crosses it; either way the stream's file is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_does_not_fit_is_refused_before_it_is_written() {
    let (_leader_dir, _leader, mut snap) = leader_with(200, 4).await;
    let (dir, raft, engine) = follower().await;

    let no_room = Receiver::new(Limits { reserve_bytes: u64::MAX / 2, ..Limits::default() });
    let refused = send(&no_room, &raft, &engine, chunks(&mut snap).await).await.expect_err("no room");
    assert!(matches!(refused, Refused::NoRoom { .. }), "{refused}");
    assert!(snapshot_files(dir.path()).is_empty(), "{:?}", snapshot_files(dir.path()));

    let bound = Receiver::new(Limits { max_bytes: 2 * CHUNK as u64, ..Limits::default() });
    let reqs = chunks(&mut snap).await;
    assert!(reqs.len() > 2);
    let refused = send(&bound, &raft, &engine, reqs).await.expect_err("past the bound");
    assert!(matches!(refused, Refused::Invalid { .. }), "{refused}");
    assert!(refused.to_string().contains("the most this node accepts"), "{refused}");
    assert!(snapshot_files(dir.path()).is_empty(), "{:?}", snapshot_files(dir.path()));
    assert_eq!(*engine.read().unwrap(), Engine::new());
    raft.shutdown().await.unwrap();
}

/// A crash while a snapshot is received leaves its file in `snap/`: the next
/// start removes it and keeps the stored snapshot.
#[tokio::test]
async fn a_start_after_a_crash_mid_receive_removes_the_received_file() {
    let (dir, mut sm, snap) = leader_with(100, 4).await;
    let engine = sm.engine().read().unwrap().clone();
    let stored = snap_dir(dir.path());
    let mut data = sm.begin_receiving_snapshot().await.unwrap();
    let bytes = payload(&snap);
    data.write_chunk(0, &bytes[..bytes.len() / 2]).await.unwrap();
    assert_eq!(files_ending(dir.path(), ".snap.incoming").len(), 1);
    // The crash: nothing runs that would remove it.
    std::mem::forget(data);
    drop((sm, snap));

    let (_log, sm) = open_storage(dir.path()).unwrap();
    assert_eq!(snap_dir(dir.path()), stored, "the received file is gone, the stored one kept");
    assert_eq!(*sm.engine().read().unwrap(), engine);
    assert!(dir.path().join(SNAP_DIR).is_dir());
}
