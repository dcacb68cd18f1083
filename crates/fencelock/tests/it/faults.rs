//! The client under network faults, against the real server. The client talks to
//! the server through a userspace TCP proxy ([`support::proxy`]) that loses
//! answers, black-holes the connection or resets it; the tests watch the server
//! directly (a second client connected without the proxy, and the server's
//! `/metrics`), so what they assert is what the server really did.
//!
//! The proxy's faults hit every connection through it (a client's gRPC channel
//! and its framed session), so each test arranges for the call under test to be
//! the one in flight when the fault hits, and waits on server state, never on a
//! timer.

use crate::support;

use std::time::Duration;

use fencelock::{Backoff, Client, Error, LeaseLost, Outcome};
use support::proxy::{Mode, Proxy};
use support::{acquired, eventually, holder, waiters, within, Server, SECS};
use tokio::time::Instant;

/// A server, a proxy in front of it, a client through the proxy, and an
/// observer connected directly.
async fn setup() -> (Server, Proxy, Client, Client) {
    let server = Server::start().await;
    let proxy = Proxy::start(server.grpc_addr).await;
    let client = Client::connect(proxy.url()).await.unwrap();
    let observer = server.client().await;
    (server, proxy, client, observer)
}

/// Starts `client.lock(name).acquire()` with every answer lost, and returns once
/// the server holds the lock for it and has sent the answer (into the proxy) while
/// the client still waits for it. Returns the pending acquire and the grant the
/// server made, `(lease, token)`.
///
/// The client must already have its lease for the default TTL (so that the acquire
/// is the only call in flight).
async fn acquire_with_the_answer_lost(
    proxy: &Proxy,
    client: &Client,
    observer: &Client,
    name: &str,
) -> (tokio::task::JoinHandle<Result<Outcome, Error>>, (u64, u64)) {
    proxy.set_mode(Mode::DropReplies);
    let dropped = proxy.dropped_bytes();
    let pending = tokio::spawn(client.lock(name).acquire());
    eventually("granted on the server, answer dropped", || async {
        holder(observer, name).await.is_some() && proxy.dropped_bytes() > dropped
    })
    .await;
    assert!(!pending.is_finished(), "the client has not seen the answer");
    (pending, holder(observer, name).await.unwrap())
}

/// INV-6: the answer to an acquire is lost after the server applied it; the
/// client retries over a new connection with the same request id and gets that
/// same grant. No second grant is made.
#[tokio::test]
async fn a_lost_answer_is_retried_with_the_same_request_id_and_grants_once() {
    let (server, proxy, client, observer) = setup().await;
    // The shared lease for the default TTL exists before the fault.
    let warm = acquired(client.lock("warm").acquire().await.unwrap());
    let grants = server.metric("fencelock_grants_total").await;

    let (pending, granted) = acquire_with_the_answer_lost(&proxy, &client, &observer, "a").await;
    assert_eq!(granted.0, warm.lease_id(), "granted on the client's shared lease");
    let connections = proxy.accepted();
    proxy.reset_then_pass();
    let guard = acquired(within("the retried acquire", pending).await.unwrap().unwrap());

    assert_eq!((guard.lease_id(), guard.token().unwrap()), granted, "the retry got the first grant");
    assert_eq!(server.metric("fencelock_grants_total").await, grants + 1, "one grant, not two");
    assert_eq!(server.metric("fencelock_token_counter").await, granted.1, "no token issued after it");
    assert_eq!(holder(&observer, "a").await, Some(granted));
    assert!(proxy.accepted() > connections, "the retry went over a new connection");
    assert!(!guard.is_lost() && !warm.is_lost(), "the lease survived the reset");
    assert_eq!(guard.release().await, Ok(true));
    drop(warm);
    server.stop().await;
}

/// A lost answer again, but the grant is released (with its token, by someone
/// who read it from the server) before the retry arrives: the retry is answered
/// with the first outcome, a grant that is no longer current. The client sees
/// that and asks again with a new request id, so the guard it returns holds the
/// lock now.
#[tokio::test]
async fn a_stale_grant_from_a_retry_is_replaced_by_a_new_request() {
    let (server, proxy, client, observer) = setup().await;
    let warm = acquired(client.lock("warm").acquire().await.unwrap());
    let grants = server.metric("fencelock_grants_total").await;

    let (pending, (lease, stale)) = acquire_with_the_answer_lost(&proxy, &client, &observer, "a").await;
    assert_eq!(observer.release_raw("a", lease, stale).await, Ok(true));
    proxy.reset_then_pass();
    let guard = acquired(within("the retried acquire", pending).await.unwrap().unwrap());

    assert!(guard.token().unwrap() > stale, "a new grant, not the stale one");
    assert_eq!(holder(&observer, "a").await, Some((guard.lease_id(), guard.token().unwrap())));
    assert!(client.check("a", guard.token().unwrap()).await.unwrap().current);
    assert!(!client.check("a", stale).await.unwrap().current);
    assert_eq!(server.metric("fencelock_grants_total").await, grants + 2);
    assert_eq!(guard.release().await, Ok(true));
    drop(warm);
    server.stop().await;
}

/// Keeps `lease` alive on the server over a connection of its own, every 50 ms,
/// until the server no longer has it (the task then ends): the server keeps a
/// lease that the client behind the proxy cannot reach.
fn keep_alive_directly(server: &Server, lease: u64) -> tokio::task::JoinHandle<()> {
    let server_url = server.url.clone();
    tokio::spawn(async move {
        let mut raw = fencelock_proto::v1::lock_client::LockClient::connect(server_url).await.unwrap();
        loop {
            let req = fencelock_proto::v1::KeepAliveRequest { request_id: support::fastrand_id(), lease_id: lease };
            match raw.keep_alive(req).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(s) if s.code() == tonic::Code::NotFound => return,
                Err(s) => panic!("keep-alive: {s}"),
            }
        }
    })
}

/// INV-6 and the chaos check S4 (exactly-once grants), at the client: a grant
/// whose answer reaches the client after the client lost the lease it was made
/// on is not handed out. It ends with that lease (a revoke), as every grant of a
/// lost lease does, and the acquire starts over on a fresh lease. So the server
/// ends no grant with a release that no caller asked for: every token it issued
/// is held by the returned guard, or was released by its holder, or ended with a
/// revoked lease (or a cancel).
///
/// After the reset, the retried acquire's answer and the lost lease's revoke
/// (sent by its watchdog) race; in either order this must hold.
#[tokio::test]
async fn a_grant_that_arrives_on_a_lost_lease_ends_with_that_lease() {
    let (server, proxy, client, observer) = setup().await;
    let ttl = Duration::from_millis(600);
    let warm = acquired(client.lock("warm").ttl(ttl).acquire().await.unwrap());
    let lease = warm.lease_id();
    let blocker = acquired(observer.lock("a").acquire().await.unwrap());
    let pending = tokio::spawn(client.lock("a").ttl(ttl).wait(30 * SECS).acquire());
    eventually("queued", || async { waiters(&observer, "a").await == 1 }).await;

    // A black hole: the client loses its lease at its deadline, while the
    // server keeps it (kept alive directly) and grants the lock on it.
    proxy.set_mode(Mode::Hold);
    let keeper = keep_alive_directly(&server, lease);
    assert_eq!(within("lost", warm.lost()).await, LeaseLost::Expired);
    assert_eq!(blocker.release().await, Ok(true));
    eventually("granted on the lost lease", || async { holder(&observer, "a").await.map(|h| h.0) == Some(lease) })
        .await;

    proxy.reset_then_pass();
    let guard = acquired(within("the acquire", pending).await.unwrap().unwrap());
    assert_ne!(guard.lease_id(), lease, "held on a fresh lease");
    assert_eq!(holder(&observer, "a").await, Some((guard.lease_id(), guard.token().unwrap())));
    within("the lost lease revoked on the server", keeper).await.unwrap();

    // Grants: "warm" and the one on the lost lease (client), the blocker's
    // (observer), and the guard's.
    assert_eq!(server.metric("fencelock_grants_total").await, 4);
    assert_eq!(server.metric("fencelock_tokens_issued").await, 4);
    assert_eq!(server.metric("fencelock_releases_total").await, 1, "only the blocker released its lock");
    let ended = server.metric("fencelock_releases_revoked_total").await
        + server.metric("fencelock_releases_cancelled_total").await;
    assert_eq!(ended, 2, "\"warm\" and the undelivered grant ended with the lost lease");
    assert_eq!(warm.release().await, Ok(false));
    assert_eq!(guard.release().await, Ok(true));
    server.stop().await;
}

/// INV-11: keep-alives that hang (the link to the server is a black hole, while
/// the server itself still has the lease) end in `lost() == Expired` at the
/// client's deadline, not before. The client then revokes the lease, which frees
/// the lock without lock-delay (INV-7: a revoke is clean), as soon as the link
/// comes back.
#[tokio::test]
#[allow(clippy::disallowed_methods)] // the test checks the client's deadline against the time it reads
async fn lost_fires_at_the_deadline_when_keep_alives_hang() {
    let (server, proxy, client, observer) = setup().await;
    let ttl = Duration::from_millis(1500);
    // Lock-delay applies only if the lease expires on the server: a free lock
    // without it proves that the client revoked the lease.
    let guard = acquired(client.lock("a").ttl(ttl).lock_delay(60 * SECS).acquire().await.unwrap());
    let lease = guard.lease_id();
    proxy.set_mode(Mode::Hold);
    let held_at = Instant::now();

    // Someone else keeps the lease alive on the server meanwhile, so only the
    // client's revoke can end it.
    let keeper = keep_alive_directly(&server, lease);

    assert_eq!(within("lost", guard.lost()).await, LeaseLost::Expired);
    let deadline = guard.deadline();
    assert!(Instant::now() >= deadline, "never before the deadline");
    assert!(deadline <= held_at + ttl, "no keep-alive sent into the black hole confirmed the lease");
    assert!(guard.is_lost());
    assert!(!keeper.is_finished(), "the server still had the lease when the client gave up");

    // The link heals: the revoke the client sent meanwhile arrives.
    proxy.set_mode(Mode::Pass);
    within("the lease revoked on the server", keeper).await.unwrap();
    let info = observer.describe("a").await.unwrap();
    assert_eq!(info.holder, None);
    assert_eq!(info.reopens_in, None, "revoked, not expired: no lock-delay");
    assert_eq!(server.metric("fencelock_lease_expirations_total").await, 0);
    assert_eq!(server.metric("fencelock_releases_revoked_total").await, 1);
    assert_eq!(guard.release().await, Ok(false));
    let next = acquired(observer.lock("a").acquire().await.unwrap());
    assert!(next.token().unwrap() > 0);
    server.stop().await;
}

/// A connection reset while an acquire waits in the server's queue: the server
/// drops the wait (its caller went away), the client retries the same request on
/// a new connection and queues again, once; when the holder releases, it gets the
/// lock, with a single grant. The lease's watchdog carries on over the new
/// connection.
#[tokio::test]
async fn a_waiting_acquire_survives_a_connection_reset() {
    let (server, proxy, client, observer) = setup().await;
    let holder_guard = acquired(observer.lock("q").acquire().await.unwrap());
    let pending = tokio::spawn(client.lock("q").wait(30 * SECS).acquire());
    eventually("queued", || async { waiters(&observer, "q").await == 1 }).await;
    let dropped = server.metric("fencelock_waits_dropped_total").await;
    let connections = proxy.accepted();

    proxy.reset_then_pass();
    // The old wait is dropped and the retry is queued in its place.
    eventually("re-queued", || async {
        server.metric("fencelock_waits_dropped_total").await == dropped + 1 && waiters(&observer, "q").await == 1
    })
    .await;
    assert!(proxy.accepted() > connections, "the retry went over a new connection");
    assert!(!pending.is_finished());

    let grants = server.metric("fencelock_grants_total").await;
    assert_eq!(holder_guard.release().await, Ok(true));
    let guard = acquired(within("granted", pending).await.unwrap().unwrap());
    assert_eq!(holder(&observer, "q").await, Some((guard.lease_id(), guard.token().unwrap())));
    assert_eq!(server.metric("fencelock_grants_total").await, grants + 1);
    assert_eq!(waiters(&observer, "q").await, 0);
    assert!(!guard.is_lost());
    assert_eq!(guard.release().await, Ok(true));
    server.stop().await;
}

/// Calls across a dead link end within their deadline with an error that says
/// the outcome is unknown, and heal when the link does. A black hole is a
/// timeout. Connections reset as soon as they open are retried (each attempt
/// reconnects) until the deadline, and then reported as `Unavailable`.
#[tokio::test]
async fn calls_across_a_dead_link_end_with_an_unknown_outcome() {
    let server = Server::start().await;
    let proxy = Proxy::start(server.grpc_addr).await;
    let backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100) };
    let client = Client::builder(proxy.url()).rpc_timeout(Duration::from_millis(500)).backoff(backoff);
    let client = client.connect().await.unwrap();
    assert_eq!(client.describe("a").await.unwrap().holder, None);

    proxy.set_mode(Mode::Hold);
    let got = within("a call into a black hole", client.describe("a")).await;
    assert_eq!(got, Err(Error::Timeout));

    proxy.set_mode(Mode::Reset);
    let connections = proxy.accepted();
    let got = within("a call over reset connections", client.describe("a")).await;
    assert!(matches!(got, Err(Error::Unavailable(_))), "{got:?}");
    assert!(got.unwrap_err().is_transient());
    assert!(proxy.accepted() >= connections + 2, "retried on new connections: {}", proxy.accepted() - connections);

    proxy.set_mode(Mode::Pass);
    assert_eq!(within("after the link heals", client.describe("a")).await.unwrap().holder, None);
    server.stop().await;
}
