//! The client against a real single-node fencelock server (started in-process on
//! free ports with a temporary data directory).
//!
//! Each test asserts concrete outcomes. Nothing sleeps to assert timing: tests
//! await the future under test, or wait for a server-side condition with
//! [`eventually`], under generous timeouts.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Acquire, Client, LeaseLost, LockGuard, LockOptions, WithLockError};
use fencelock_proto::v1 as pb;
use fencelock_proto::v1::lock_client::LockClient;

const SECS: Duration = Duration::from_secs(1);

struct Server {
    running: Option<fencelock_server::Running>,
    url: String,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let running = fencelock_server::start(fencelock_server::Config::for_test(dir.path())).await.unwrap();
        let url = format!("http://{}", running.grpc_addr);
        // Until the node has elected itself it answers UNAVAILABLE; the client
        // retries that, the raw and session APIs do not. Wait for it here.
        let client = Client::connect(url.clone()).await.unwrap();
        client.describe("ready").await.expect("the server becomes ready");
        Server { running: Some(running), url, _dir: dir }
    }

    async fn client(&self) -> Client {
        Client::connect(self.url.clone()).await.unwrap()
    }

    async fn stop(mut self) {
        self.running.take().unwrap().shutdown().await;
    }
}

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(20 * SECS, f).await.unwrap_or_else(|_| panic!("{what}: not within 20 s"))
}

/// Waits until `cond` holds (checked every 10 ms, up to 20 s). For conditions on
/// server state, not for timing.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    within(what, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

fn acquired(outcome: Acquire) -> LockGuard {
    match outcome {
        Acquire::Acquired(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

async fn waiters(client: &Client, name: &str) -> usize {
    client.describe(name).await.unwrap().waiters.len()
}

#[tokio::test]
async fn acquire_and_release() {
    let server = Server::start().await;
    let client = server.client().await;
    let guard = acquired(client.lock("jobs/a").ttl(5 * SECS).acquire().await.unwrap());
    assert_eq!(guard.name(), "jobs/a");
    assert!(guard.token() > 0);
    let info = client.describe("jobs/a").await.unwrap();
    let holder = info.holder.expect("held");
    assert_eq!((holder.lease_id, holder.token), (guard.lease_id(), guard.token()));
    let check = client.check("jobs/a", guard.token()).await.unwrap();
    assert!(check.current);
    let token = guard.token();
    assert_eq!(guard.release().await, Ok(true));
    assert_eq!(client.describe("jobs/a").await.unwrap().holder, None);
    let stale = client.check("jobs/a", token).await.unwrap();
    assert!(!stale.current);
    assert_eq!(stale.current_token, None);
    server.stop().await;
}

#[tokio::test]
async fn tokens_increase_across_grants() {
    let server = Server::start().await;
    let client = server.client().await;
    let a = acquired(client.lock("a").acquire().await.unwrap());
    let b = acquired(client.lock("b").acquire().await.unwrap());
    assert!(b.token() > a.token());
    let ta = a.token();
    assert_eq!(a.release().await, Ok(true));
    let a2 = acquired(client.lock("a").acquire().await.unwrap());
    assert!(a2.token() > b.token() && a2.token() > ta);
    server.stop().await;
}

#[tokio::test]
async fn a_held_lock_is_busy_for_another_client() {
    let server = Server::start().await;
    let (c1, c2) = (server.client().await, server.client().await);
    let guard = acquired(c1.lock("a").acquire().await.unwrap());
    match c2.lock("a").acquire().await.unwrap() {
        Acquire::Busy { holder_lease, holder_token, reopens_in, waiters } => {
            assert_eq!(holder_lease, Some(guard.lease_id()));
            assert_eq!(holder_token, Some(guard.token()));
            assert_eq!((reopens_in, waiters), (None, 0));
        }
        other => panic!("expected busy, got {other:?}"),
    }
    let timed_out = c2.lock("a").wait(Duration::from_millis(200)).acquire().await.unwrap();
    assert!(matches!(timed_out, Acquire::TimedOut), "{timed_out:?}");
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

    let t0 = holder.token();
    assert_eq!(holder.release().await, Ok(true));
    let g1 = acquired(within("first granted", first).await.unwrap().unwrap());
    assert!(g1.token() > t0);
    assert_eq!(waiters(&c0, "q").await, 1, "the second still waits");
    assert!(!second.is_finished());

    let t1 = g1.token();
    assert_eq!(g1.release().await, Ok(true));
    let g2 = acquired(within("second granted", second).await.unwrap().unwrap());
    assert!(g2.token() > t1);
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
    server.stop().await;
}

#[tokio::test]
async fn guards_with_the_same_ttl_share_one_lease() {
    let server = Server::start().await;
    let client = server.client().await;
    let a = acquired(client.lock("a").ttl(10 * SECS).acquire().await.unwrap());
    let b = acquired(client.lock("b").ttl(10 * SECS).acquire().await.unwrap());
    let c = acquired(client.lock("c").ttl(20 * SECS).acquire().await.unwrap());
    assert_eq!(a.lease_id(), b.lease_id());
    assert_ne!(a.lease_id(), c.lease_id());
    // The lease lives on while b holds it.
    assert_eq!(a.release().await, Ok(true));
    assert!(client.check("b", b.token()).await.unwrap().current);
    assert!(!b.is_lost());
    server.stop().await;
}

/// INV-11: the holder is told when its lease is gone.
#[tokio::test]
async fn lost_fires_when_another_client_revokes_the_lease() {
    let server = Server::start().await;
    let (owner, admin) = (server.client().await, server.client().await);
    let guard = acquired(owner.lock("a").ttl(2 * SECS).acquire().await.unwrap());
    admin.revoke_lease(guard.lease_id()).await.unwrap();
    assert_eq!(within("lost", guard.lost()).await, LeaseLost::NotFound);
    assert!(guard.is_lost());
    assert_eq!(guard.release().await, Ok(false));
    // The lock is free for others at once (a revoke has no lock-delay).
    let next = acquired(admin.lock("a").acquire().await.unwrap());
    assert!(next.token() > 0);
    server.stop().await;
}

#[tokio::test]
async fn a_lease_outlives_several_ttls_while_kept_alive() {
    let server = Server::start().await;
    let client = server.client().await;
    let ttl = SECS;
    let guard = acquired(client.lock("a").ttl(ttl).acquire().await.unwrap());
    let first_deadline = guard.deadline();
    // Wait (on the server's view, not a timer) until the deadline has moved past
    // three TTLs' worth of renewals.
    eventually("renewed", || async { guard.deadline() > first_deadline + 2 * ttl }).await;
    assert!(!guard.is_lost());
    assert!(client.check("a", guard.token()).await.unwrap().current);
    assert_eq!(guard.release().await, Ok(true));
    server.stop().await;
}

#[tokio::test]
async fn with_lock_runs_the_closure_and_releases() {
    let server = Server::start().await;
    let client = server.client().await;
    let token = client.with_lock("a", LockOptions::default(), async |g: &LockGuard| g.token()).await.unwrap();
    assert!(token > 0);
    assert_eq!(client.describe("a").await.unwrap().holder, None);
    server.stop().await;
}

#[tokio::test]
async fn with_lock_cancels_the_closure_when_the_lease_is_lost() {
    let server = Server::start().await;
    let (client, admin) = (server.client().await, server.client().await);
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let flag = dropped.clone();
    let opts = LockOptions { ttl: 2 * SECS, ..LockOptions::default() };
    let work = tokio::spawn(async move {
        client
            .with_lock("a", opts, async move |g: &LockGuard| {
                let _armed = SetOnDrop(flag);
                started_tx.send(g.lease_id()).unwrap();
                std::future::pending::<()>().await
            })
            .await
    });
    let lease = within("closure started", started_rx).await.unwrap();
    admin.revoke_lease(lease).await.unwrap();
    let got = within("with_lock ends", work).await.unwrap();
    assert_eq!(got, Err(WithLockError::LeaseLost(LeaseLost::NotFound)));
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
    let req = pb::AcquireRequest { request_id: 4242, lease_id: lease, lock: "a".into(), wait_ms: 0, lock_delay_ms: 0 };
    let first = raw.acquire(req.clone()).await.unwrap().into_inner();
    let again = raw.acquire(req).await.unwrap().into_inner();
    let token = |r: &pb::AcquireResponse| match &r.outcome {
        Some(pb::acquire_response::Outcome::Acquired(a)) => a.token,
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_eq!(token(&first), token(&again), "the retry gets the first grant");
    // A new request id on the same lease is a new request: the lock is held.
    let other =
        pb::AcquireRequest { request_id: 4243, lease_id: lease, lock: "a".into(), wait_ms: 0, lock_delay_ms: 0 };
    let busy = raw.acquire(other).await.unwrap().into_inner();
    assert!(matches!(busy.outcome, Some(pb::acquire_response::Outcome::Busy(_))), "{busy:?}");
    server.stop().await;
}

#[tokio::test]
async fn detached_grants_stay_until_released_by_token() {
    let server = Server::start().await;
    let (scripts, other) = (server.client().await, server.client().await);
    let grant = match scripts.acquire_detached("deploy", LockOptions::default()).await.unwrap() {
        Acquire::Acquired(a) => a,
        o => panic!("expected a grant, got {o:?}"),
    };
    drop(scripts); // nothing of the grant lives in the client
    assert!(other.check("deploy", grant.token).await.unwrap().current);
    assert!(matches!(other.lock("deploy").acquire().await.unwrap(), Acquire::Busy { .. }));
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

#[tokio::test]
async fn invalid_names_are_invalid_arguments() {
    let server = Server::start().await;
    let client = server.client().await;
    let got = client.lock("").acquire().await;
    assert!(matches!(got, Err(fencelock::Error::InvalidArgument(_))), "{got:?}");
    let got = client.lock("a").ttl(Duration::from_millis(10)).acquire().await;
    assert!(matches!(got, Err(fencelock::Error::InvalidArgument(_))), "{got:?}");
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
        .map(|g| match g.unwrap() {
            Acquire::Acquired(a) => a,
            o => panic!("expected a grant, got {o:?}"),
        })
        .collect();
    assert!(session.check("s0", grants[0].token).await.unwrap().current);
    let busy = session.acquire("s0", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    assert!(matches!(busy, Acquire::Busy { holder_token: Some(t), .. } if t == grants[0].token));

    // A queued acquire on the session is pushed when the holder releases.
    let other = client.session().await.unwrap();
    let lease2 = other.grant_lease(10 * SECS).await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire("s0", lease2, 30 * SECS, Duration::ZERO).await }
    });
    eventually("queued", || async { waiters(&client, "s0").await == 1 }).await;
    for g in &grants {
        assert_eq!(session.release(&g.lock, lease, g.token).await, Ok(true));
    }
    match within("pushed grant", waiter).await.unwrap().unwrap() {
        Acquire::Acquired(a) => assert!(a.token > grants.iter().map(|g| g.token).max().unwrap()),
        o => panic!("expected a grant, got {o:?}"),
    }
    assert!(matches!(session.keep_alive(u64::MAX).await, Err(fencelock::Error::LeaseNotFound(_))));
    session.revoke_lease(lease).await.unwrap();
    // Close both streams first: the server's graceful shutdown waits for open streams.
    drop((session, other));
    server.stop().await;
}

/// INV-8 and INV-10 seen from the client: the lock survives a restart, and the
/// client's retries and reconnects carry its lease across it.
#[tokio::test]
async fn the_client_reconnects_after_a_server_restart_and_keeps_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let running = fencelock_server::start(fencelock_server::Config::for_test(dir.path())).await.unwrap();
    let addr = running.grpc_addr;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let guard = acquired(client.lock("a").ttl(10 * SECS).acquire().await.unwrap());

    running.shutdown().await;
    let mut config = fencelock_server::Config::for_test(dir.path());
    config.grpc_listen = addr;
    let running = fencelock_server::start(config).await.unwrap();

    // The first calls fail (connection refused, then "not the leader") and are
    // retried within the RPC deadline.
    assert!(client.check("a", guard.token()).await.unwrap().current);
    let before = guard.deadline();
    eventually("a keep-alive after the restart", || async { guard.deadline() > before }).await;
    assert!(!guard.is_lost());
    assert_eq!(guard.release().await, Ok(true));
    running.shutdown().await;
}
