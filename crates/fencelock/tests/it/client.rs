//! The client against a real single-node fencelock server (started in-process on
//! free ports with a temporary data directory): leases shared by TTL, the loss
//! signal, guards released on drop, waiting acquires pushed by the server,
//! `with_lock`, detached grants and sessions. Network faults (lost answers, hung
//! keep-alives, reset connections) are in `tests/it/faults.rs`.
//!
//! Each test asserts concrete outcomes, checked on the server where it matters
//! (`describe`, `check`, and its `/metrics`). Nothing sleeps to assert timing:
//! tests await the future under test, or wait for a server-side condition with
//! [`eventually`], under generous timeouts.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::{with_lock, Client, Error, Guard, LeaseLost, LockOptions, NotAcquired, Outcome, WithLockError};
use fencelock_proto::v1 as pb;
use fencelock_proto::v1::lock_client::LockClient;
use support::{acquired, eventually, holder, waiters, within, Server, SECS};
use tokio::time::Instant;

#[tokio::test]
async fn acquire_and_release() {
    let server = Server::start().await;
    let client = server.client().await;
    let guard = acquired(client.lock("jobs/a").ttl(5 * SECS).acquire().await.unwrap());
    assert_eq!(guard.name(), "jobs/a");
    assert!(guard.token().unwrap() > 0);
    let info = client.describe("jobs/a").await.unwrap();
    assert_eq!(info.name, "jobs/a");
    let h = info.holder.expect("held");
    assert_eq!((h.lease_id, h.token), (guard.lease_id(), guard.token().unwrap()));
    let check = client.check("jobs/a", guard.token().unwrap()).await.unwrap();
    assert!(check.current);
    assert_eq!(check.current_token, Some(guard.token().unwrap()));
    let other = client.check("jobs/a", guard.token().unwrap() + 1).await.unwrap();
    assert!(!other.current);
    assert_eq!(other.current_token, Some(guard.token().unwrap()));
    let token = guard.token().unwrap();
    assert_eq!(guard.release().await, Ok(true));
    assert_eq!(client.describe("jobs/a").await.unwrap().holder, None);
    let stale = client.check("jobs/a", token).await.unwrap();
    assert!(!stale.current);
    assert_eq!(stale.current_token, None);
    server.stop().await;
}

/// The guard's deadline counts from the send time of the grant (never later than
/// the server's), and releasing the last lock of a lease revokes the lease (after
/// the client's linger time).
#[tokio::test]
#[allow(clippy::disallowed_methods)] // the test brackets the grant's send time by reading the clock
async fn release_frees_the_lock_and_revokes_the_unused_lease() {
    let server = Server::start().await;
    let client = server.client().await;
    let before = Instant::now();
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    let after = Instant::now();
    // The default TTL is 15 s, counted from when the grant was sent.
    assert!(guard.deadline() >= before + 15 * SECS && guard.deadline() <= after + 15 * SECS);
    assert!(!guard.is_lost());
    assert_eq!(server.metric("fencelock_active_leases").await, 1);
    let lease = guard.lease_id();
    assert_eq!(guard.release().await, Ok(true));
    assert_eq!(holder(&client, "a").await, None);
    eventually("lease revoked", || async { server.metric("fencelock_active_leases").await == 0 }).await;
    assert!(!server.lease_is_live(lease).await);
    assert_eq!(server.metric("fencelock_lease_expirations_total").await, 0, "revoked, not expired");
    server.stop().await;
}

/// An acquire → release loop keeps one lease: the lease of the last release
/// lingers, and the next acquire joins it instead of granting a new one.
#[tokio::test]
async fn back_to_back_acquires_reuse_the_lingering_lease() {
    let server = Server::start().await;
    let client = Client::builder(server.url.clone()).lease_linger(3600 * SECS).connect().await.unwrap();
    let first = acquired(client.lock("a").acquire().await.unwrap());
    let lease = first.lease_id();
    assert_eq!(first.release().await, Ok(true));
    for _ in 0..5 {
        let again = acquired(client.lock("a").acquire().await.unwrap());
        assert_eq!(again.lease_id(), lease, "a new lease was granted for a back-to-back acquire");
        assert_eq!(again.release().await, Ok(true));
    }
    assert!(server.lease_is_live(lease).await, "the idle lease lingers");
    assert_eq!(server.metric("fencelock_active_leases").await, 1);
    // The last clone of the client gone, the lingering lease is revoked (not left to expire).
    drop(client);
    eventually("lingering lease revoked", || async { server.metric("fencelock_active_leases").await == 0 }).await;
    assert_eq!(server.metric("fencelock_lease_expirations_total").await, 0, "revoked, not expired");
    server.stop().await;
}

#[tokio::test]
async fn tokens_increase_across_grants() {
    let server = Server::start().await;
    let client = server.client().await;
    let a = acquired(client.lock("a").acquire().await.unwrap());
    let b = acquired(client.lock("b").acquire().await.unwrap());
    assert!(b.token().unwrap() > a.token().unwrap());
    let ta = a.token().unwrap();
    assert_eq!(a.release().await, Ok(true));
    let a2 = acquired(client.lock("a").acquire().await.unwrap());
    assert!(a2.token().unwrap() > b.token().unwrap() && a2.token().unwrap() > ta);
    server.stop().await;
}

#[tokio::test]
async fn a_held_lock_is_busy_for_another_client_and_for_its_holder() {
    let server = Server::start().await;
    let (c1, c2) = (server.client().await, server.client().await);
    let guard = acquired(c1.lock("a").acquire().await.unwrap());
    for client in [&c2, &c1] {
        // Not reentrant: the holder's own client (same lease) is busy too.
        match client.lock("a").acquire().await.unwrap() {
            Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
                assert_eq!(holder_lease, Some(guard.lease_id()));
                assert_eq!(holder_token, Some(guard.token().unwrap()));
                assert_eq!((reopens_in, waiters), (None, 0));
            }
            other => panic!("expected busy, got {other:?}"),
        }
    }
    let timed_out = c2.lock("a").wait(Duration::from_millis(200)).acquire().await.unwrap();
    assert!(matches!(timed_out, Outcome::TimedOut), "{timed_out:?}");
    assert_eq!(holder(&c2, "a").await, Some((guard.lease_id(), guard.token().unwrap())));
    server.stop().await;
}

/// INV-3: FIFO handoff, pushed by the server (each waiter sends one request).
#[tokio::test]
async fn waiters_are_granted_in_fifo_order_when_the_holder_releases() {
    let server = Server::start().await;
    let (c0, c1, c2) = (server.client().await, server.client().await, server.client().await);
    let holder = acquired(c0.lock("q").acquire().await.unwrap());
    let first = tokio::spawn(c1.lock("q").wait(30 * SECS).acquire());
    eventually("first queued", || async { waiters(&c0, "q").await == 1 }).await;
    let second = tokio::spawn(c2.lock("q").wait(30 * SECS).acquire());
    eventually("second queued", || async { waiters(&c0, "q").await == 2 }).await;

    let t0 = holder.token().unwrap();
    assert_eq!(holder.release().await, Ok(true));
    let g1 = acquired(within("first granted", first).await.unwrap().unwrap());
    assert!(g1.token().unwrap() > t0);
    assert_eq!(waiters(&c0, "q").await, 1, "the second still waits");
    assert!(!second.is_finished());

    let t1 = g1.token().unwrap();
    assert_eq!(g1.release().await, Ok(true));
    let g2 = acquired(within("second granted", second).await.unwrap().unwrap());
    assert!(g2.token().unwrap() > t1);
    server.stop().await;
}

/// A waiting acquire is one request that the server answers with the grant: from
/// the moment it is queued until the grant, the server writes exactly one command
/// (the holder's release), so the client never polled.
#[tokio::test]
async fn a_waiting_acquire_is_granted_when_the_holder_releases_without_polling() {
    let server = Server::start().await;
    let client = server.client().await;
    // A long TTL, so that no keep-alive falls into the window counted below.
    let ttl = 60 * SECS;
    let first = acquired(client.lock("a").ttl(ttl).acquire().await.unwrap());
    let waiter = tokio::spawn(client.lock("a").ttl(ttl).wait(10 * SECS).acquire());
    eventually("queued", || async { waiters(&client, "a").await == 1 }).await;
    let commands = server.metric("fencelock_log_commands_total").await;
    let token = first.token().unwrap();
    assert_eq!(first.release().await, Ok(true));
    let next = acquired(within("grant", waiter).await.unwrap().unwrap());
    assert!(next.token().unwrap() > token);
    assert_eq!(holder(&client, "a").await, Some((next.lease_id(), next.token().unwrap())));
    assert_eq!(server.metric("fencelock_log_commands_total").await, commands + 1, "only the release was written");
    assert_eq!(server.metric("fencelock_grants_after_wait_total").await, 1);
    server.stop().await;
}

#[tokio::test]
async fn dropping_a_waiting_acquire_leaves_the_queue() {
    let server = Server::start().await;
    let (c0, c1) = (server.client().await, server.client().await);
    let _holder = acquired(c0.lock("q").acquire().await.unwrap());
    let waiter = tokio::spawn(c1.lock("q").wait(60 * SECS).acquire());
    eventually("queued", || async { waiters(&c0, "q").await == 1 }).await;
    waiter.abort();
    eventually("dequeued", || async { waiters(&c0, "q").await == 0 }).await;
    assert_eq!(server.metric("fencelock_waits_dropped_total").await, 1);
    server.stop().await;
}

#[tokio::test]
async fn guards_with_the_same_ttl_share_one_lease_until_the_last_goes() {
    let server = Server::start().await;
    let client = server.client().await;
    let a = acquired(client.lock("a").ttl(10 * SECS).acquire().await.unwrap());
    let b = acquired(client.lock("b").ttl(10 * SECS).acquire().await.unwrap());
    let c = acquired(client.lock("c").ttl(20 * SECS).acquire().await.unwrap());
    assert_eq!(a.lease_id(), b.lease_id());
    assert_ne!(a.lease_id(), c.lease_id());
    assert_eq!(server.metric("fencelock_active_leases").await, 2);
    let shared = a.lease_id();
    // The lease lives on while b holds it.
    assert_eq!(a.release().await, Ok(true));
    assert!(client.check("b", b.token().unwrap()).await.unwrap().current);
    assert!(!b.is_lost(), "b still holds the shared lease");
    // The last guard gone, the shared lease is revoked; c's stays.
    assert_eq!(b.release().await, Ok(true));
    eventually("shared lease revoked", || async { server.metric("fencelock_active_leases").await == 1 }).await;
    assert!(!server.lease_is_live(shared).await);
    assert!(client.check("c", c.token().unwrap()).await.unwrap().current);
    assert!(!c.is_lost());
    server.stop().await;
}

#[tokio::test]
async fn concurrent_first_acquires_grant_one_lease() {
    let server = Server::start().await;
    let client = server.client().await;
    let tries = (0..8).map(|i| client.lock(format!("l{i}")).acquire());
    let guards: Vec<_> = futures::future::join_all(tries).await.into_iter().map(|r| acquired(r.unwrap())).collect();
    assert!(guards.iter().all(|g| g.lease_id() == guards[0].lease_id()));
    assert_eq!(server.metric("fencelock_active_leases").await, 1);
    assert_eq!(server.metric("fencelock_held_locks").await, 8);
    server.stop().await;
}

/// INV-11: the holder is told when its lease is gone.
#[tokio::test]
async fn lost_fires_when_another_client_revokes_the_lease() {
    let server = Server::start().await;
    let (owner, admin) = (server.client().await, server.client().await);
    let guard = acquired(owner.lock("a").ttl(2 * SECS).acquire().await.unwrap());
    admin.revoke_lease(guard.lease_id()).await.unwrap();
    // Pushed as `Revoked` if the holder's push stream was open by then, else
    // `NotFound` (from the stream opening, or a keep-alive): tests/it/push.rs
    // orders the two.
    let reason = within("lost", guard.lost()).await;
    assert!(matches!(reason, LeaseLost::Revoked | LeaseLost::NotFound), "{reason:?}");
    assert!(guard.is_lost());
    assert_eq!(guard.release().await, Ok(false));
    // The lock is free for others at once (a revoke has no lock-delay).
    let next = acquired(admin.lock("a").acquire().await.unwrap());
    assert!(next.token().unwrap() > 0);
    server.stop().await;
}

#[tokio::test]
async fn revoking_an_own_lease_marks_its_guards_revoked() {
    let server = Server::start().await;
    let client = server.client().await;
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    client.revoke_lease(guard.lease_id()).await.unwrap();
    assert_eq!(within("lost", guard.lost()).await, LeaseLost::Revoked);
    assert_eq!(holder(&client, "a").await, None);
    assert!(matches!(client.revoke_lease(guard.lease_id()).await, Err(Error::LeaseNotFound(_))));
    // A new acquire gets a fresh lease.
    let next = acquired(client.lock("b").acquire().await.unwrap());
    assert_ne!(next.lease_id(), guard.lease_id());
    assert_eq!(guard.release().await, Ok(false));
    server.stop().await;
}

#[tokio::test]
async fn dropping_a_guard_releases_it_in_the_background() {
    let server = Server::start().await;
    let client = server.client().await;
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    let lease = guard.lease_id();
    drop(guard);
    eventually("released", || async { holder(&client, "a").await.is_none() }).await;
    eventually("lease revoked", || async { server.metric("fencelock_active_leases").await == 0 }).await;
    assert!(!server.lease_is_live(lease).await);
    assert_eq!(server.metric("fencelock_releases_total").await, 1, "released, not dropped with the lease");
    server.stop().await;
}

/// The deadline moves with every keep-alive; the lease outlives several TTLs.
#[tokio::test]
async fn a_lease_outlives_several_ttls_while_kept_alive() {
    let server = Server::start().await;
    let client = server.client().await;
    let ttl = SECS;
    let guard = acquired(client.lock("a").ttl(ttl).acquire().await.unwrap());
    let first_deadline = guard.deadline();
    eventually("renewed once", || async { guard.deadline() > first_deadline }).await;
    // Wait (on the client's view, not a timer) until the deadline has moved past
    // three TTLs' worth of renewals.
    eventually("renewed", || async { guard.deadline() > first_deadline + 2 * ttl }).await;
    assert!(!guard.is_lost());
    let watch = guard.lease_watch();
    assert!(!watch.is_lost());
    assert_eq!((watch.lease_id(), watch.ttl()), (guard.lease_id(), ttl));
    assert!(client.check("a", guard.token().unwrap()).await.unwrap().current);
    assert_eq!(server.metric("fencelock_lease_expirations_total").await, 0);
    assert_eq!(guard.release().await, Ok(true));
    server.stop().await;
}

#[tokio::test]
async fn with_lock_runs_the_closure_and_releases() {
    let server = Server::start().await;
    let client = server.client().await;
    let (name, token) =
        with_lock(&client, "a", LockOptions::default(), async |g: &Guard| (g.name().to_string(), g.token().unwrap()))
            .await
            .unwrap();
    assert_eq!(name, "a");
    assert!(token > 0);
    assert_eq!(client.describe("a").await.unwrap().holder, None);
    assert!(!client.check("a", token).await.unwrap().current);
    assert_eq!(server.metric("fencelock_releases_total").await, 1);
    server.stop().await;
}

#[tokio::test]
async fn with_lock_accepts_a_closure_returning_a_future() {
    let server = Server::start().await;
    let client = server.client().await;
    let (token, n) = with_lock(&client, "a", LockOptions::default(), |g: &Guard| {
        let token = g.token().unwrap();
        async move { (token, token + 1) }
    })
    .await
    .unwrap();
    assert_eq!(n, token + 1);
    assert_eq!(client.describe("a").await.unwrap().holder, None);
    server.stop().await;
}

#[tokio::test]
async fn with_lock_does_not_run_the_closure_when_busy() {
    let server = Server::start().await;
    let (client, other) = (server.client().await, server.client().await);
    let holder = acquired(other.lock("a").acquire().await.unwrap());
    let ran = AtomicBool::new(false);
    let got =
        with_lock(&client, "a", LockOptions::default(), async |_: &Guard| ran.store(true, Ordering::SeqCst)).await;
    match got {
        Err(WithLockError::NotAcquired(NotAcquired::Busy { holder_token, .. })) => {
            assert_eq!(holder_token, Some(holder.token().unwrap()))
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst));
    assert!(client.check("a", holder.token().unwrap()).await.unwrap().current);
    server.stop().await;
}

#[tokio::test]
async fn with_lock_cancels_the_closure_when_the_lease_is_lost() {
    let server = Server::start().await;
    let (client, admin) = (server.client().await, server.client().await);
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let flag = dropped.clone();
    let opts = LockOptions::default().ttl(2 * SECS);
    let work = tokio::spawn(async move {
        with_lock(&client, "a", opts, async move |g: &Guard| {
            let _armed = SetOnDrop(flag);
            started_tx.send(g.lease_id()).unwrap();
            std::future::pending::<()>().await
        })
        .await
    });
    let lease = within("closure started", started_rx).await.unwrap();
    admin.revoke_lease(lease).await.unwrap();
    let got = within("with_lock ends", work).await.unwrap();
    // `Revoked` if pushed on an open stream (see lost_fires_when_another_client_revokes_the_lease).
    assert!(matches!(got, Err(WithLockError::LeaseLost(LeaseLost::Revoked | LeaseLost::NotFound))), "{got:?}");
    assert!(dropped.load(Ordering::SeqCst), "the closure's future was dropped");
    server.stop().await;
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// INV-6: a retry with the same request id gets the first grant, never a second.
#[tokio::test]
async fn a_retried_acquire_with_the_same_request_id_is_granted_once() {
    let server = Server::start().await;
    let mut raw = LockClient::connect(server.url.clone()).await.unwrap();
    let lease =
        raw.grant_lease(pb::GrantLeaseRequest { request_id: 11, ttl_ms: 10_000 }).await.unwrap().into_inner().lease_id;
    let req = pb::AcquireRequest {
        request_id: 4242,
        lease_id: lease,
        lock: "a".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        ..Default::default()
    };
    let first = raw.acquire(req.clone()).await.unwrap().into_inner();
    let again = raw.acquire(req).await.unwrap().into_inner();
    let token = |r: &pb::AcquireResponse| match &r.outcome {
        Some(pb::acquire_response::Outcome::Acquired(a)) => a.token,
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_eq!(token(&first), token(&again), "the retry gets the first grant");
    // A new request id on the same lease is a new request: the lock is held.
    let other = pb::AcquireRequest {
        request_id: 4243,
        lease_id: lease,
        lock: "a".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        ..Default::default()
    };
    let busy = raw.acquire(other).await.unwrap().into_inner();
    assert!(matches!(busy.outcome, Some(pb::acquire_response::Outcome::Busy(_))), "{busy:?}");
    server.stop().await;
}

#[tokio::test]
async fn detached_grants_stay_until_released_by_token() {
    let server = Server::start().await;
    let (scripts, other) = (server.client().await, server.client().await);
    let grant = match scripts.acquire_detached("deploy", LockOptions::default()).await.unwrap() {
        Outcome::Acquired(a) => a,
        o => panic!("expected a grant, got {o:?}"),
    };
    drop(scripts); // nothing of the grant lives in the client
    assert_eq!(holder(&other, "deploy").await, Some((grant.lease_id, grant.token)));
    assert!(other.check("deploy", grant.token).await.unwrap().current);
    // Busy: the fresh lease of the failed attempt is revoked before it returns.
    match other.acquire_detached("deploy", LockOptions::default()).await.unwrap() {
        Outcome::Busy { holder_token, .. } => assert_eq!(holder_token, Some(grant.token)),
        o => panic!("expected busy, got {o:?}"),
    }
    assert_eq!(server.metric("fencelock_active_leases").await, 1, "only the detached grant's lease");
    assert!(matches!(other.lock("deploy").acquire().await.unwrap(), Outcome::Busy { .. }));
    assert_eq!(other.release_raw("deploy", grant.lease_id, grant.token).await, Ok(true));
    assert_eq!(other.release_raw("deploy", grant.lease_id, grant.token).await, Ok(false));
    other.revoke_lease(grant.lease_id).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn list_shows_held_locks_by_prefix() {
    let server = Server::start().await;
    let client = server.client().await;
    let _a = acquired(client.lock("jobs/a").acquire().await.unwrap());
    let _b = acquired(client.lock("jobs/b").acquire().await.unwrap());
    let _c = acquired(client.lock("other").acquire().await.unwrap());
    let names: Vec<String> = client.list("jobs/", 0).await.unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["jobs/a", "jobs/b"]);
    assert_eq!(client.list("", 1).await.unwrap().len(), 1);
    server.stop().await;
}

/// INV-9 seen from the client.
#[tokio::test]
async fn invalid_names_are_invalid_arguments() {
    let server = Server::start().await;
    let client = server.client().await;
    let got = client.lock("").acquire().await;
    assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
    let got = client.lock("a").ttl(Duration::from_millis(10)).acquire().await;
    assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
    assert_eq!(server.metric("fencelock_active_leases").await, 0, "a rejected request changes nothing");
    server.stop().await;
}

#[tokio::test]
async fn session_acquire_and_release() {
    let server = Server::start().await;
    let client = server.client().await;
    let session = within("open", client.session()).await.unwrap();
    let lease = within("grant", session.grant_lease(10 * SECS)).await.unwrap();
    assert_eq!(within("keep-alive", session.keep_alive(lease)).await, Ok(10 * SECS));
    let grants = futures::future::join_all((0..16).map(|i| {
        let s = session.clone();
        async move { s.acquire(&format!("s{i}"), lease, Duration::ZERO, Duration::ZERO).await }
    }))
    .await;
    let grants: Vec<_> = grants
        .into_iter()
        .enumerate()
        .map(|(i, g)| match g.unwrap() {
            Outcome::Acquired(a) => {
                assert_eq!((a.lock.as_str(), a.lease_id), (format!("s{i}").as_str(), lease));
                a
            }
            o => panic!("expected a grant, got {o:?}"),
        })
        .collect();
    let mut tokens: Vec<u64> = grants.iter().map(|g| g.token).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 16, "distinct tokens");
    assert!(session.check("s0", grants[0].token).await.unwrap().current);
    let busy = session.acquire("s0", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    assert!(matches!(busy, Outcome::Busy { holder_token: Some(t), .. } if t == grants[0].token));

    // A queued acquire on the session is pushed when the holder releases.
    let other = client.session().await.unwrap();
    let lease2 = other.grant_lease(10 * SECS).await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire("s0", lease2, 30 * SECS, Duration::ZERO).await }
    });
    eventually("queued", || async { waiters(&client, "s0").await == 1 }).await;
    let releases = futures::future::join_all(grants.iter().map(|g| session.release(&g.lock, lease, g.token))).await;
    assert!(releases.into_iter().all(|r| r == Ok(true)));
    match within("pushed grant", waiter).await.unwrap().unwrap() {
        Outcome::Acquired(a) => assert!(a.token > grants.iter().map(|g| g.token).max().unwrap()),
        o => panic!("expected a grant, got {o:?}"),
    }
    assert!(matches!(session.keep_alive(u64::MAX).await, Err(Error::LeaseNotFound(_))));
    session.revoke_lease(lease).await.unwrap();
    assert!(!session.is_closed());
    // Close both streams first: the server's graceful shutdown waits for open streams.
    drop((session, other));
    server.stop().await;
}

/// Dropping a queued session acquire sends a `Cancel` on the open stream: the
/// request leaves the queue while the stream stays open.
#[tokio::test]
async fn dropping_a_session_acquire_sends_a_cancel() {
    let server = Server::start().await;
    let client = server.client().await;
    let holder_session = client.session().await.unwrap();
    let lease = holder_session.grant_lease(10 * SECS).await.unwrap();
    let first = holder_session.acquire("a", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    let Outcome::Acquired(first) = first else { panic!("expected a grant, got {first:?}") };

    let session = client.session().await.unwrap();
    let lease2 = session.grant_lease(10 * SECS).await.unwrap();
    let s = session.clone();
    let waiter = tokio::spawn(async move { s.acquire("a", lease2, 30 * SECS, Duration::ZERO).await });
    eventually("queued", || async { waiters(&client, "a").await == 1 }).await;
    waiter.abort();
    eventually("cancelled", || async { waiters(&client, "a").await == 0 }).await;
    assert!(!session.is_closed(), "the stream stays open");
    assert_eq!(server.metric("fencelock_waits_dropped_total").await, 1);
    // Nothing was granted to the cancelled request; the lock is still the holder's.
    assert_eq!(holder(&client, "a").await, Some((lease, first.token)));
    assert_eq!(server.metric("fencelock_grants_total").await, 1);
    // The session still works after the cancel.
    assert_eq!(session.release("a", lease, first.token).await, Ok(true));
    drop((session, holder_session));
    server.stop().await;
}

/// INV-18 on a session: a multi-lock is granted whole, one token per lock in
/// the order named, consecutive (one grant); bad name lists are refused
/// before anything is sent.
#[tokio::test]
async fn session_acquire_all_grants_every_lock_with_consecutive_tokens() {
    let server = Server::start().await;
    let client = server.client().await;
    let session = client.session().await.unwrap();
    let lease = session.grant_lease(10 * SECS).await.unwrap();
    let names = ["m/c", "m/a", "m/b"];
    let got = within("multi", session.acquire_all(&names, lease, Duration::ZERO, Duration::ZERO)).await.unwrap();
    let Outcome::Acquired(grants) = got else { panic!("expected the grants, got {got:?}") };
    let locks: Vec<&str> = grants.iter().map(|g| g.lock.as_str()).collect();
    assert_eq!(locks, names);
    let first = grants[0].token;
    let tokens: Vec<u64> = grants.iter().map(|g| g.token).collect();
    assert_eq!(tokens, vec![first, first + 1, first + 2]);
    for g in &grants {
        assert_eq!(g.lease_id, lease);
        assert_eq!(holder(&client, &g.lock).await, Some((lease, g.token)));
    }
    let busy = session.acquire_all(&["m/x", "m/a"], lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    assert!(matches!(busy, Outcome::Busy { .. }), "{busy:?}");
    assert_eq!(holder(&client, "m/x").await, None, "no partial hold");
    for bad in [&["m/a"][..], &["m/a", "m/a"][..]] {
        let got = session.acquire_all(bad, lease, Duration::ZERO, Duration::ZERO).await;
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "{bad:?}: {got:?}");
    }
    drop(session);
    server.stop().await;
}

/// INV-18 on a session: a waiting multi-lock queues on every lock at once,
/// holds none of them while one is taken, and is granted all of them when
/// the holder of that one releases it.
#[tokio::test]
async fn session_acquire_all_waits_for_the_holder_of_one_of_its_locks() {
    let server = Server::start().await;
    let client = server.client().await;
    let holder_session = client.session().await.unwrap();
    let lease = holder_session.grant_lease(10 * SECS).await.unwrap();
    let held = holder_session.acquire("w/b", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    let Outcome::Acquired(held) = held else { panic!("expected a grant, got {held:?}") };

    let session = client.session().await.unwrap();
    let lease2 = session.grant_lease(10 * SECS).await.unwrap();
    let s = session.clone();
    let waiter = tokio::spawn(async move { s.acquire_all(&["w/a", "w/b"], lease2, 30 * SECS, Duration::ZERO).await });
    eventually("queued on both", || async { waiters(&client, "w/a").await == 1 && waiters(&client, "w/b").await == 1 })
        .await;
    assert_eq!(holder(&client, "w/a").await, None, "no partial hold while waiting");
    assert_eq!(holder_session.release("w/b", lease, held.token).await, Ok(true));
    let got = within("the pushed grants", waiter).await.unwrap().unwrap();
    let Outcome::Acquired(grants) = got else { panic!("expected the grants, got {got:?}") };
    let got: Vec<(&str, u64)> = grants.iter().map(|g| (g.lock.as_str(), g.lease_id)).collect();
    assert_eq!(got, vec![("w/a", lease2), ("w/b", lease2)]);
    assert!(grants[0].token > held.token && grants[1].token == grants[0].token + 1, "{grants:?}");
    assert_eq!(holder(&client, "w/b").await, Some((lease2, grants[1].token)));
    drop((session, holder_session));
    server.stop().await;
}

/// INV-18 on a session: dropping a waiting multi-lock withdraws it from
/// every queue, and when the lock it waited for frees, it is granted
/// nothing: no hold on any of its locks.
#[tokio::test]
async fn dropping_a_waiting_session_acquire_all_leaves_no_hold() {
    let server = Server::start().await;
    let client = server.client().await;
    let holder_session = client.session().await.unwrap();
    let lease = holder_session.grant_lease(10 * SECS).await.unwrap();
    let held = holder_session.acquire("d/b", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    let Outcome::Acquired(held) = held else { panic!("expected a grant, got {held:?}") };

    let session = client.session().await.unwrap();
    let lease2 = session.grant_lease(10 * SECS).await.unwrap();
    let s = session.clone();
    let waiter = tokio::spawn(async move { s.acquire_all(&["d/a", "d/b"], lease2, 30 * SECS, Duration::ZERO).await });
    eventually("queued on both", || async { waiters(&client, "d/a").await == 1 && waiters(&client, "d/b").await == 1 })
        .await;
    waiter.abort();
    eventually("withdrawn from both", || async {
        waiters(&client, "d/a").await == 0 && waiters(&client, "d/b").await == 0
    })
    .await;
    assert!(!session.is_closed(), "the stream stays open");
    assert_eq!(holder_session.release("d/b", lease, held.token).await, Ok(true));
    assert_eq!((holder(&client, "d/a").await, holder(&client, "d/b").await), (None, None));
    assert_eq!(server.metric("fencelock_grants_total").await, 1, "only the holder's grant");
    drop((session, holder_session));
    server.stop().await;
}

/// INV-8 and INV-10 seen from the client: the lock survives a restart, and the
/// client's retries and reconnects carry its lease across it.
#[tokio::test]
async fn the_client_reconnects_after_a_server_restart_and_keeps_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let running = fencelock_server::start(fencelock_server::Config::for_test(dir.path().join("data"))).await.unwrap();
    let addr = running.grpc_addr;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let guard = acquired(client.lock("a").ttl(10 * SECS).acquire().await.unwrap());

    running.shutdown().await;
    let mut config = fencelock_server::Config::for_test(dir.path().join("data"));
    config.grpc_listen = addr;
    let running = fencelock_server::start(config).await.unwrap();

    // The first calls fail (connection refused, then "not the leader") and are
    // retried within the RPC deadline.
    assert!(client.check("a", guard.token().unwrap()).await.unwrap().current);
    let before = guard.deadline();
    eventually("a keep-alive after the restart", || async { guard.deadline() > before }).await;
    assert!(!guard.is_lost());
    assert_eq!(guard.release().await, Ok(true));
    running.shutdown().await;
}

/// Issue 17: `describe` and `list` report the holder's identity (the client's,
/// from `ClientBuilder::identity`) and value, and each waiter's identity (its
/// request's own); a granted waiter becomes the holder with its own identity;
/// a `Session`'s acquire carries the client's identity.
#[tokio::test]
async fn describe_and_list_show_holder_identity_and_value_and_waiter_identities() {
    let server = Server::start().await;
    let c1 = Client::builder(server.url.clone()).identity("host-a:1").connect().await.unwrap();
    let lock = c1.lock("elect").ttl(5 * SECS).value(&b"10.0.0.1:7000"[..]);
    let held = acquired(lock.acquire().await.unwrap());
    let c2 = server.client().await;
    let queued = tokio::spawn(c2.lock("elect").wait(30 * SECS).identity("host-b:2").acquire());
    eventually("queued", || async { waiters(&c1, "elect").await == 1 }).await;

    let info = c1.describe("elect").await.unwrap();
    let h = info.holder.as_ref().expect("held");
    assert_eq!((h.token, h.identity.as_deref()), (held.token().unwrap(), Some("host-a:1")));
    assert_eq!(h.value, b"10.0.0.1:7000");
    let waiting: Vec<_> = info.waiters.iter().map(|w| w.identity.as_deref()).collect();
    assert_eq!(waiting, vec![Some("host-b:2")]);
    let listed = c1.list("", 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    let h = listed[0].holder.as_ref().expect("held");
    assert_eq!((h.identity.as_deref(), h.value.as_slice()), (Some("host-a:1"), &b"10.0.0.1:7000"[..]));
    assert_eq!(listed[0].waiters[0].identity.as_deref(), Some("host-b:2"));

    held.release().await.unwrap();
    let second = acquired(within("the waiter's grant", queued).await.unwrap().unwrap());
    let h = c1.describe("elect").await.unwrap().holder.expect("held by the waiter");
    assert_eq!((h.token, h.identity.as_deref(), h.value.len()), (second.token().unwrap(), Some("host-b:2"), 0));

    // A session's acquires carry the client's identity too.
    let session = c1.session().await.unwrap();
    let lease = session.grant_lease(5 * SECS).await.unwrap();
    let got = session.acquire("by-session", lease, std::time::Duration::ZERO, std::time::Duration::ZERO).await;
    assert!(matches!(got, Ok(fencelock::Outcome::Acquired(_))), "{got:?}");
    let h = c1.describe("by-session").await.unwrap().holder.expect("held by the session");
    assert_eq!((h.lease_id, h.identity.as_deref()), (lease, Some("host-a:1")));
}

/// Issue 17: an identity or value over its limit is refused with
/// `InvalidArgument` naming the limit, by the client before any request and by
/// the server before any log write (`fencelock_log_entries_total` unchanged).
#[tokio::test]
async fn an_oversized_value_or_bad_identity_is_refused_before_any_write() {
    let server = Server::start().await;
    let client = server.client().await;
    let mut raw = server.raw().await;
    let lease = pb::GrantLeaseRequest { request_id: 77, ttl_ms: 3_600_000 };
    let lease = raw.grant_lease(lease).await.unwrap().into_inner().lease_id;
    let entries = server.metric("fencelock_log_entries_total").await;

    let err = client.lock("x").value(vec![0u8; 4097]).acquire().await.unwrap_err();
    let Error::InvalidArgument(why) = err else { panic!("expected InvalidArgument, got {err:?}") };
    assert_eq!(why, "invalid value: 4097 bytes (must be at most 4096 bytes)");
    let err = client.lock("x").identity("a\u{1b}[2Jb").acquire().await.unwrap_err();
    let Error::InvalidArgument(why) = err else { panic!("expected InvalidArgument, got {err:?}") };
    assert_eq!(why, "invalid identity: must not contain control characters");
    let err = Client::builder(server.url.clone()).identity("h".repeat(257)).connect().await.unwrap_err();
    let Error::InvalidArgument(why) = err else { panic!("expected InvalidArgument, got {err:?}") };
    assert_eq!(why, "invalid identity: 257 bytes (must be at most 256 bytes of UTF-8)");

    let req = pb::AcquireRequest {
        request_id: 78,
        lease_id: lease,
        lock: "x".into(),
        value: vec![1; 4097],
        ..Default::default()
    };
    let status = raw.acquire(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "invalid value: 4097 bytes (must be at most 4096 bytes)");
    let req = pb::AcquireRequest {
        request_id: 79,
        lease_id: lease,
        lock: "x".into(),
        identity: "é".repeat(129),
        ..Default::default()
    };
    let status = raw.acquire(req).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::InvalidArgument, "invalid identity: 258 bytes (must be at most 256 bytes of UTF-8)")
    );
    assert_eq!(server.metric("fencelock_log_entries_total").await, entries, "a refused acquire was written");
}
