//! Peer messages are input (issue 14, part 1): a snapshot that does not decode,
//! or that would send the token counter back, is refused with an error before
//! openraft sees it. The node keeps serving, keeps every lock and token, and
//! starts again from its data dir afterwards.
//!
//! - INV-2 tokens strictly increase across all grants, never reused (restarts
//!   and anything a peer sends included).
//! - INV-9 an invalid input is rejected with an error and changes nothing.
//!
//! Before the fix, the malformed snapshot stopped the node at once and it could
//! never start again (its log was purged before the snapshot was decoded), and
//! the well-formed one replaced the state: every lock gone, the next token 1.

use fencelock_proto::raft::{raft_client::RaftClient, RaftPayload};
use fencelock_proto::v1::{self as pb, acquire_response::Outcome};
use openraft::raft::InstallSnapshotRequest;
use openraft::{LogId, SnapshotMeta, Vote};
use serde_json::json;
use tonic::Code;

use crate::support;
use support::{lease, request_id, start, Client};

/// The token of a grant of the free lock `lock`.
async fn token(c: &mut Client, lease_id: u64, lock: &str) -> u64 {
    let req = pb::AcquireRequest {
        request_id: request_id(),
        lease_id,
        lock: lock.into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        ..Default::default()
    };
    match c.acquire(req).await.map(|r| r.into_inner().outcome) {
        Ok(Some(Outcome::Acquired(a))) => a.token,
        other => panic!("acquire of the free lock {lock}: {other:?}"),
    }
}

async fn holder_token(c: &mut Client, lock: &str) -> Option<u64> {
    let info = c.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await.expect("describe").into_inner();
    info.lock.and_then(|l| l.holder).map(|h| h.token)
}

/// An `InstallSnapshot` in one chunk, from a leader of a later term, for a point
/// of the log far beyond this node's: openraft would install it.
fn snapshot_request(running: &fencelock_server::Running, data: Vec<u8>) -> RaftPayload {
    let membership = running.raft.metrics().borrow().membership_config.as_ref().clone();
    let last = LogId::new(openraft::CommittedLeaderId::new(100, 2), 1_000_000);
    let meta = SnapshotMeta { last_log_id: Some(last), last_membership: membership, snapshot_id: "forged".into() };
    let req = InstallSnapshotRequest::<fencelock_server::raft::TypeConfig> {
        vote: Vote::new_committed(100, 2),
        meta,
        offset: 0,
        data,
        done: true,
    };
    RaftPayload { json: serde_json::to_vec(&req).unwrap() }
}

/// The data of a well-formed snapshot of `meta`'s point holding an empty engine.
fn empty_state(running: &fencelock_server::Running) -> Vec<u8> {
    let membership = running.raft.metrics().borrow().membership_config.as_ref().clone();
    let last = LogId::new(openraft::CommittedLeaderId::new(100, 2), 1_000_000);
    let payload =
        json!({ "last_applied": last, "last_membership": membership, "engine": fencelock_core::Engine::new() });
    serde_json::to_vec(&payload).unwrap()
}

async fn send(running: &fencelock_server::Running, payload: RaftPayload) -> tonic::Status {
    let mut peer = RaftClient::connect(format!("http://{}", running.grpc_addr)).await.unwrap();
    peer.install_snapshot(payload).await.expect_err("the snapshot must be refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv9_a_snapshot_that_does_not_decode_is_refused_and_the_node_survives() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let l = lease(&mut c, 60_000).await;
    let held = token(&mut c, l, "held").await;

    let status = send(&running, snapshot_request(&running, b"{ not a snapshot".to_vec())).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("snapshot forged refused"), "{}", status.message());

    // Still serving, with its state.
    let next = token(&mut c, l, "after").await;
    assert!(next > held, "INV-2: {next} after {held}");
    assert_eq!(holder_token(&mut c, "held").await, Some(held));
    let metrics = running.raft.metrics().borrow().clone();
    assert!(metrics.running_state.is_ok(), "the node stopped: {:?}", metrics.running_state);

    // And it starts again from its data dir, with its locks and tokens.
    running.shutdown().await;
    let (_running, mut c) = start(dir.path()).await;
    let l2 = lease(&mut c, 60_000).await;
    assert_eq!(holder_token(&mut c, "held").await, Some(held));
    let later = token(&mut c, l2, "later").await;
    assert!(later > next, "INV-2 across the restart: {later} after {next}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv2_a_snapshot_with_a_lower_token_counter_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let l = lease(&mut c, 60_000).await;
    let mut last = 0;
    for i in 0..5 {
        last = token(&mut c, l, &format!("lock-{i}")).await;
    }

    let status = send(&running, snapshot_request(&running, empty_state(&running))).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("would send tokens backwards"), "{}", status.message());

    assert_eq!(holder_token(&mut c, "lock-4").await, Some(last), "the locks are still held");
    let next = token(&mut c, l, "after").await;
    assert!(next > last, "INV-2: {next} after {last}");
    running.shutdown().await;
    let (_running, mut c) = start(dir.path()).await;
    let l2 = lease(&mut c, 60_000).await;
    assert!(token(&mut c, l2, "later").await > next, "INV-2 across the restart");
}

/// INV-9 for the framed calls (`AppendEntriesV2`, its stream, `InstallSnapshotV2`): a
/// head that is not JSON, a head that carries entries of its own, an entry
/// that does not decode, each is refused before Raft sees it; a framed
/// snapshot goes through the same checks as a JSON one (INV-2: one that
/// would send tokens back is refused). The node keeps serving with its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv9_malformed_raft_frames_are_refused_and_a_framed_snapshot_is_checked_as_a_json_one() {
    use fencelock_proto::raft::RaftFrame;
    use openraft::raft::AppendEntriesRequest;
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let l = lease(&mut c, 60_000).await;
    let held = token(&mut c, l, "held").await;
    let mut peer = RaftClient::connect(format!("http://{}", running.grpc_addr)).await.unwrap();

    let head = |entries| {
        let req = AppendEntriesRequest::<fencelock_server::raft::TypeConfig> {
            vote: Vote::new_committed(100, 2),
            prev_log_id: None,
            leader_commit: None,
            entries,
        };
        serde_json::to_vec(&req).unwrap()
    };
    let blank = openraft::Entry::<fencelock_server::raft::TypeConfig> {
        log_id: LogId::new(openraft::CommittedLeaderId::new(100, 2), 1),
        payload: openraft::EntryPayload::Blank,
    };
    let cases = [
        (RaftFrame { head: b"{ not json".to_vec(), ..Default::default() }, "malformed raft frame head"),
        (RaftFrame { head: head(vec![blank]), ..Default::default() }, "entries belong in the frame"),
        (RaftFrame { head: head(vec![]), entries: vec![vec![0xff, 0x01, 0x02]], data: vec![] }, "entry 0 of a peer"),
    ];
    for (frame, needle) in cases.clone() {
        let status = peer.append_entries_v2(frame).await.expect_err("a malformed frame must be refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(needle), "{needle:?}: {}", status.message());
    }
    // The same frames on the append stream: each is refused, and ends its stream.
    for (frame, needle) in cases {
        let mut answers = peer.append_entries_stream(tokio_stream::iter([frame])).await.unwrap().into_inner();
        let status = answers.message().await.expect_err("a malformed frame must be refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(needle), "{needle:?}: {}", status.message());
    }

    let json = snapshot_request(&running, empty_state(&running)).json;
    let mut forged: openraft::raft::InstallSnapshotRequest<fencelock_server::raft::TypeConfig> =
        serde_json::from_slice(&json).unwrap();
    let data = std::mem::take(&mut forged.data);
    let frame = RaftFrame { head: serde_json::to_vec(&forged).unwrap(), entries: vec![], data };
    let status = peer.install_snapshot_v2(frame).await.expect_err("the snapshot must be refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("would send tokens backwards"), "{}", status.message());

    assert_eq!(holder_token(&mut c, "held").await, Some(held), "the lock is still held");
    let next = token(&mut c, l, "after").await;
    assert!(next > held, "INV-2: {next} after {held}");
    let metrics = running.raft.metrics().borrow().clone();
    assert!(metrics.running_state.is_ok(), "the node stopped: {:?}", metrics.running_state);
    running.shutdown().await;
}
