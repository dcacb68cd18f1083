//! Lease events pushed to the holder (issue 17), against the real server: the
//! server's `WatchLeases` stream tells a holder that its lease was revoked or
//! expired within a round trip of the decision, instead of at its next
//! keep-alive (about TTL/3 later).
//!
//! No assertion here is a wall-clock bound: each test arranges that only the
//! push can explain what it asserts (a reason no keep-alive gives, a deadline
//! no keep-alive moved), and waits on server state with [`eventually`].

use crate::support;

use fencelock::LeaseLost;
use fencelock_proto::v1::{self as pb, lease_event::Kind};
use support::{acquired, eventually, fastrand_id, within, Server, SECS};
use tonic::Code;

/// The server's gauge of open `WatchLeases` streams.
const STREAMS: &str = "fencelock_lease_event_streams";

fn watch(lease: u64) -> pb::WatchLeasesRequest {
    pb::WatchLeasesRequest { lease_ids: vec![lease] }
}

fn event(lease: u64, kind: Kind) -> Option<pb::LeaseEvent> {
    Some(pb::LeaseEvent { lease_id: lease, kind: Some(kind) })
}

/// Issue 17 (INV-11, sooner): a lease revoked by someone else is pushed to its
/// holder, whose `lost()` fires with `Revoked`. Only the push can explain it: a
/// keep-alive would say `NotFound` (and none is due: with a 60 s TTL the first
/// comes ~20 s after the grant, and the deadline shows none was confirmed).
#[tokio::test]
async fn a_revocation_by_someone_else_is_pushed_to_the_holder() {
    let server = Server::start().await;
    let (holder, admin) = (server.client().await, server.client().await);
    let guard = acquired(holder.lock("a").ttl(60 * SECS).acquire().await.unwrap());
    let granted_deadline = guard.deadline();
    eventually("the holder's push stream is open", || async { server.metric(STREAMS).await == 1 }).await;
    assert!(!guard.in_jeopardy());

    admin.revoke_lease(guard.lease_id()).await.unwrap();
    assert_eq!(within("lost", guard.lost()).await, LeaseLost::Revoked);
    assert_eq!(guard.deadline(), granted_deadline, "no keep-alive confirmed the lease meanwhile");
    within("jeopardy, at once once lost", guard.jeopardy()).await;
    assert!(guard.in_jeopardy());
    // The server ended the stream (its one lease ended); the lock is free.
    eventually("the push stream closed", || async { server.metric(STREAMS).await == 0 }).await;
    assert_eq!(admin.describe("a").await.unwrap().holder, None);
    assert_eq!(guard.release().await, Ok(false));
    server.stop().await;
}

/// The server pushes an expiry: a lease nobody keeps alive ends `expired` at
/// its deadline, then the stream ends OK; watching it again finds it
/// `not_found`, and that stream ends at once.
#[tokio::test]
async fn an_expiry_is_pushed_and_a_gone_lease_is_not_found() {
    let server = Server::start().await;
    let mut raw = server.raw().await;
    let grant = pb::GrantLeaseRequest { request_id: fastrand_id(), ttl_ms: 3000 };
    let lease = raw.grant_lease(grant).await.unwrap().into_inner().lease_id;
    let mut events = raw.watch_leases(watch(lease)).await.unwrap().into_inner();
    let first = within("the first event", events.message()).await.unwrap().unwrap();
    match first.kind {
        Some(Kind::Watching(w)) => assert!(w.ttl_ms == 3000 && w.ttl_left_ms <= 3000, "{w:?}"),
        other => panic!("expected watching, got {other:?}"),
    }
    let ended = within("the expiry", events.message()).await.unwrap();
    assert_eq!(ended, event(lease, Kind::Expired(pb::lease_event::Expired {})));
    assert_eq!(within("the end", events.message()).await.unwrap(), None, "the stream ends with its lease");
    assert_eq!(server.metric("fencelock_lease_expirations_total").await, 1);

    let mut again = raw.watch_leases(watch(lease)).await.unwrap().into_inner();
    let first = within("the first event", again.message()).await.unwrap();
    assert_eq!(first, event(lease, Kind::NotFound(pb::lease_event::NotFound {})));
    assert_eq!(within("the end", again.message()).await.unwrap(), None);
    server.stop().await;
}

/// A watch without a lease id, or with id 0, is refused before anything else.
#[tokio::test]
async fn a_watch_of_no_lease_is_refused() {
    let server = Server::start().await;
    let mut raw = server.raw().await;
    for ids in [vec![], vec![0]] {
        let e = raw.watch_leases(pb::WatchLeasesRequest { lease_ids: ids }).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    server.stop().await;
}

/// A shutdown ends an open stream UNAVAILABLE, so that the client watches
/// again elsewhere and meanwhile relies on its keep-alives.
#[tokio::test]
async fn a_shutdown_ends_the_stream_unavailable() {
    let server = Server::start().await;
    let mut raw = server.raw().await;
    let grant = pb::GrantLeaseRequest { request_id: fastrand_id(), ttl_ms: 60_000 };
    let lease = raw.grant_lease(grant).await.unwrap().into_inner().lease_id;
    let mut events = raw.watch_leases(watch(lease)).await.unwrap().into_inner();
    let first = within("the first event", events.message()).await.unwrap().unwrap();
    assert!(matches!(first.kind, Some(Kind::Watching(_))), "{first:?}");
    let stopping = tokio::spawn(server.stop());
    let e = within("the stream's end", events.message()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    within("the shutdown", stopping).await.unwrap();
}
