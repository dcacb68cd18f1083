//! Behaviour of the client against the in-memory fake server ([`crate::mock`]):
//! leases shared by TTL, the loss signal, retries with one request id, guards
//! released on drop, `with_lock`, detached grants and sessions. The same
//! scenarios against the real server live in `tests/client.rs`.
//!
//! No test sleeps to assert timing: each awaits an event of the fake, or the
//! future under test, under a generous timeout.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::mock::Mock;
use crate::{Acquire, Client, Error, LeaseLost, LockGuard, LockOptions, NotAcquired, WithLockError};

const SECS: Duration = Duration::from_secs(1);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(10 * SECS, f).await.unwrap_or_else(|_| panic!("{what}: not within 10 s"))
}

async fn setup() -> (Mock, Client) {
    let (mock, url) = Mock::start().await;
    let client = Client::connect(url).await.expect("connect");
    (mock, client)
}

fn acquired(outcome: Acquire) -> LockGuard {
    match outcome {
        Acquire::Acquired(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn count(mock: &Mock, pred: impl Fn(&str) -> bool) -> usize {
    mock.events().iter().filter(|e| pred(e)).count()
}

#[tokio::test]
async fn acquire_then_release_frees_the_lock_and_revokes_the_lease() {
    let (mock, client) = setup().await;
    let before = Instant::now();
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    assert_eq!(guard.name(), "a");
    assert_eq!(mock.holder("a"), Some((guard.lease_id(), guard.token())));
    assert!(guard.deadline() >= before + 15 * SECS && guard.deadline() <= Instant::now() + 15 * SECS);
    assert!(!guard.is_lost());
    let lease = guard.lease_id();
    assert_eq!(guard.release().await, Ok(true));
    assert_eq!(mock.holder("a"), None);
    mock.wait_for("lease revoked", |e| e == format!("revoke {lease} -> true")).await;
}

#[tokio::test]
async fn a_held_lock_is_busy_with_its_holder() {
    let (_mock, client) = setup().await;
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    match client.lock("a").acquire().await.unwrap() {
        Acquire::Busy { holder_lease, holder_token, reopens_in, waiters } => {
            assert_eq!(holder_lease, Some(guard.lease_id()));
            assert_eq!(holder_token, Some(guard.token()));
            assert_eq!((reopens_in, waiters), (None, 0));
        }
        other => panic!("expected busy, got {other:?}"),
    }
}

#[tokio::test]
async fn guards_with_one_ttl_share_one_lease_until_the_last_goes() {
    let (mock, client) = setup().await;
    let a = acquired(client.lock("a").ttl(15 * SECS).acquire().await.unwrap());
    let b = acquired(client.lock("b").ttl(15 * SECS).acquire().await.unwrap());
    let c = acquired(client.lock("c").ttl(20 * SECS).acquire().await.unwrap());
    assert_eq!(a.lease_id(), b.lease_id());
    assert_ne!(a.lease_id(), c.lease_id());
    assert_eq!(count(&mock, |e| e.starts_with("grant ")), 2);
    let shared = a.lease_id();
    assert_eq!(a.release().await, Ok(true));
    assert!(!b.is_lost(), "b still holds the shared lease");
    assert_eq!(b.release().await, Ok(true));
    mock.wait_for("shared lease revoked", |e| e == format!("revoke {shared} -> true")).await;
    assert_eq!(count(&mock, |e| e.starts_with("revoke ")), 1, "c's lease stays");
    drop(c);
}

#[tokio::test]
async fn concurrent_first_acquires_grant_one_lease() {
    let (mock, client) = setup().await;
    let tries = (0..8).map(|i| client.lock(format!("l{i}")).acquire());
    let guards: Vec<_> = futures::future::join_all(tries).await.into_iter().map(|r| acquired(r.unwrap())).collect();
    assert!(guards.iter().all(|g| g.lease_id() == guards[0].lease_id()));
    assert_eq!(count(&mock, |e| e.starts_with("grant ")), 1);
}

#[tokio::test]
async fn a_lost_answer_is_retried_with_the_same_request_id_and_grants_once() {
    let (mock, client) = setup().await;
    mock.knobs().lose_acquire_responses.store(1, Ordering::SeqCst);
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    let attempts: Vec<String> = mock
        .events()
        .iter()
        .filter(|e| e.starts_with("acquire a req=") && e.contains("lease="))
        .map(|e| e.split_whitespace().nth(2).unwrap().to_string())
        .collect();
    assert_eq!(attempts.len(), 2, "{:?}", mock.events());
    assert_eq!(attempts[0], attempts[1], "the retry reuses the request id");
    assert_eq!(count(&mock, |e| e.starts_with("granted a")), 1);
    assert_eq!(mock.holder("a"), Some((guard.lease_id(), guard.token())));
}

#[tokio::test]
async fn lost_fires_when_the_lease_is_revoked_behind_the_guards_back() {
    let (mock, client) = setup().await;
    let guard = acquired(client.lock("a").ttl(2 * SECS).acquire().await.unwrap());
    mock.revoke(guard.lease_id());
    assert_eq!(within("lost", guard.lost()).await, LeaseLost::NotFound);
    assert!(guard.is_lost());
    assert_eq!(guard.release().await, Ok(false));
}

#[tokio::test]
async fn a_stale_grant_from_a_retry_is_replaced_by_a_new_request() {
    let (mock, client) = setup().await;
    mock.knobs().lose_acquire_responses.store(1, Ordering::SeqCst);
    mock.knobs().release_lost_grants.store(true, Ordering::SeqCst);
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    assert_eq!(mock.holder("a"), Some((guard.lease_id(), guard.token())), "the guard holds the current grant");
    let requests: Vec<String> = mock
        .events()
        .iter()
        .filter(|e| e.starts_with("acquire a req=") && e.contains("lease="))
        .map(|e| e.split_whitespace().nth(2).unwrap().to_string())
        .collect();
    assert_eq!(requests.len(), 3, "{:?}", mock.events());
    assert_eq!(requests[0], requests[1], "the retry reuses the id");
    assert_ne!(requests[1], requests[2], "after the stale grant, a new request");
    assert_eq!(count(&mock, |e| e.starts_with("granted a")), 2);
}

/// INV-11: a lease that can no longer be confirmed is reported lost at its deadline.
#[tokio::test]
async fn lost_fires_at_the_deadline_when_keep_alives_hang() {
    let (mock, client) = setup().await;
    mock.knobs().stall_keep_alives.store(true, Ordering::SeqCst);
    let ttl = Duration::from_millis(300);
    let guard = acquired(client.lock("a").ttl(ttl).acquire().await.unwrap());
    let deadline = guard.deadline();
    assert_eq!(within("lost", guard.lost()).await, LeaseLost::Expired);
    assert!(Instant::now() >= deadline, "never before the deadline");
    assert_eq!(guard.deadline(), deadline, "no keep-alive confirmed it");
    // The lease can no longer be proven: the client revokes it for others.
    let lease = guard.lease_id();
    mock.wait_for("lease revoked", |e| e == format!("revoke {lease} -> true")).await;
    assert_eq!(guard.release().await, Ok(false));
}

#[tokio::test]
async fn keep_alives_move_the_deadline() {
    let (mock, client) = setup().await;
    let guard = acquired(client.lock("a").ttl(SECS).acquire().await.unwrap());
    let first = guard.deadline();
    let lease = guard.lease_id();
    mock.wait_for("a keep-alive", |e| e == format!("keep_alive {lease} -> true")).await;
    // The confirmation is published right after the server's answer arrives.
    within("deadline moves", async {
        while guard.deadline() == first {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(guard.deadline() > first);
    let watch = guard.lease_watch();
    assert!(!watch.is_lost());
    assert_eq!((watch.lease_id(), watch.ttl()), (lease, SECS));
}

#[tokio::test]
async fn revoking_an_own_lease_marks_its_guards_revoked() {
    let (_mock, client) = setup().await;
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    client.revoke_lease(guard.lease_id()).await.unwrap();
    assert_eq!(within("lost", guard.lost()).await, LeaseLost::Revoked);
    assert!(matches!(client.revoke_lease(guard.lease_id()).await, Err(Error::LeaseNotFound(_))));
    // A new acquire gets a fresh lease.
    let next = acquired(client.lock("b").acquire().await.unwrap());
    assert_ne!(next.lease_id(), guard.lease_id());
}

#[tokio::test]
async fn dropping_a_guard_releases_it_in_the_background() {
    let (mock, client) = setup().await;
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    let (lease, token) = (guard.lease_id(), guard.token());
    drop(guard);
    mock.wait_for("release", |e| e == format!("release a {lease} {token} -> true")).await;
    mock.wait_for("revoke", |e| e == format!("revoke {lease} -> true")).await;
}

#[tokio::test]
async fn a_waiting_acquire_is_granted_when_the_holder_releases_without_polling() {
    let (mock, client) = setup().await;
    let holder = acquired(client.lock("a").acquire().await.unwrap());
    let waiter = tokio::spawn(client.lock("a").wait(10 * SECS).acquire());
    mock.wait_for("queued", |e| e.starts_with("acquire a") && e.ends_with("wait=10000")).await;
    let token = holder.token();
    assert_eq!(holder.release().await, Ok(true));
    let next = acquired(within("grant", waiter).await.unwrap().unwrap());
    assert!(next.token() > token);
    let waits = count(&mock, |e| e.starts_with("acquire a") && !e.ends_with("wait=0") && !e.contains("dropped"));
    assert_eq!(waits, 1, "one request, no polling: {:?}", mock.events());
}

#[tokio::test]
async fn dropping_a_waiting_acquire_cancels_it_on_the_server() {
    let (mock, client) = setup().await;
    let _holder = acquired(client.lock("a").acquire().await.unwrap());
    let waiter = tokio::spawn(client.lock("a").wait(30 * SECS).acquire());
    mock.wait_for("queued", |e| e.starts_with("acquire a") && e.ends_with("wait=30000")).await;
    waiter.abort();
    mock.wait_for("cancelled", |e| e.starts_with("acquire a") && e.ends_with("dropped")).await;
}

#[tokio::test]
async fn a_wait_that_runs_out_is_timed_out() {
    let (_mock, client) = setup().await;
    let _holder = acquired(client.lock("a").acquire().await.unwrap());
    let outcome = client.lock("a").wait(Duration::from_millis(200)).acquire().await.unwrap();
    assert!(matches!(outcome, Acquire::TimedOut), "{outcome:?}");
}

#[tokio::test]
async fn with_lock_returns_the_value_and_releases() {
    let (mock, client) = setup().await;
    let token = client
        .with_lock("a", LockOptions::default(), async |g: &LockGuard| {
            assert_eq!(g.name(), "a");
            g.token()
        })
        .await
        .unwrap();
    assert!(token > 0);
    assert_eq!(mock.holder("a"), None);
    assert_eq!(count(&mock, |e| e.starts_with("release a") && e.ends_with("-> true")), 1);
}

#[tokio::test]
async fn with_lock_accepts_a_closure_returning_a_future() {
    let (_mock, client) = setup().await;
    let n = client
        .with_lock("a", LockOptions::default(), |g: &LockGuard| {
            let token = g.token();
            async move { token + 1 }
        })
        .await
        .unwrap();
    assert!(n > 1);
}

#[tokio::test]
async fn with_lock_does_not_run_the_closure_when_busy() {
    let (_mock, client) = setup().await;
    let holder = acquired(client.lock("a").acquire().await.unwrap());
    let ran = AtomicBool::new(false);
    let got =
        client.with_lock("a", LockOptions::default(), async |_: &LockGuard| ran.store(true, Ordering::SeqCst)).await;
    match got {
        Err(WithLockError::NotAcquired(NotAcquired::Busy { holder_token, .. })) => {
            assert_eq!(holder_token, Some(holder.token()))
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test]
async fn with_lock_cancels_the_closure_when_the_lease_is_lost() {
    let (mock, client) = setup().await;
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let opts = LockOptions { ttl: 2 * SECS, ..LockOptions::default() };
    let flag = dropped.clone();
    let work = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .with_lock("a", opts, async move |g: &LockGuard| {
                    let _armed = SetOnDrop(flag);
                    started_tx.send(g.lease_id()).unwrap();
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    let lease = within("closure started", started_rx).await.unwrap();
    mock.revoke(lease);
    let got = within("with_lock ends", work).await.unwrap();
    assert_eq!(got, Err(WithLockError::LeaseLost(LeaseLost::NotFound)));
    assert!(dropped.load(Ordering::SeqCst), "the closure's future was dropped");
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Compiles only if `with_lock` (with a closure borrowing the guard) and
/// `acquire` can run on a multi-threaded runtime.
#[allow(dead_code)]
fn futures_are_send(client: Client) {
    fn is_send<T: Send + 'static>(_: T) {}
    let c = client.clone();
    is_send(async move { c.with_lock("a", LockOptions::default(), async |g: &LockGuard| g.token()).await });
    is_send(client.lock("a").acquire());
}

#[tokio::test]
async fn detached_grants_outlive_the_call_and_release_raw_frees_them() {
    let (mock, client) = setup().await;
    let a = match client.acquire_detached("a", LockOptions::default()).await.unwrap() {
        Acquire::Acquired(a) => a,
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_eq!(mock.holder("a"), Some((a.lease_id, a.token)));
    // Busy: the fresh lease of the failed attempt is revoked before returning.
    match client.acquire_detached("a", LockOptions::default()).await.unwrap() {
        Acquire::Busy { holder_token, .. } => assert_eq!(holder_token, Some(a.token)),
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(count(&mock, |e| e.starts_with("revoke ") && e.ends_with("-> true")), 1);
    assert_eq!(client.release_raw("a", a.lease_id, a.token).await, Ok(true));
    assert_eq!(client.release_raw("a", a.lease_id, a.token).await, Ok(false));
}

#[tokio::test]
async fn check_and_describe_report_the_holder() {
    let (_mock, client) = setup().await;
    let guard = acquired(client.lock("a").acquire().await.unwrap());
    let check = client.check("a", guard.token()).await.unwrap();
    assert!(check.current);
    assert_eq!(check.current_token, Some(guard.token()));
    assert!(!client.check("a", guard.token() + 1).await.unwrap().current);
    let info = client.describe("a").await.unwrap();
    assert_eq!(info.name, "a");
    assert_eq!(info.holder.map(|h| (h.lease_id, h.token)), Some((guard.lease_id(), guard.token())));
    assert!(matches!(client.list("", 0).await, Err(Error::Server(_))));
}

#[tokio::test]
async fn invalid_ttl_is_an_invalid_argument() {
    let (_mock, client) = setup().await;
    let got = client.lock("a").ttl(Duration::from_millis(10)).acquire().await;
    assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
}

#[tokio::test]
async fn connecting_to_a_closed_port_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let got = Client::builder(format!("http://{addr}")).connect_timeout(SECS).connect().await;
    assert!(matches!(got, Err(Error::Connect(_))), "{got:?}");
}

#[tokio::test]
async fn session_multiplexes_concurrent_operations() {
    let (_mock, client) = setup().await;
    let session = client.session().await.unwrap();
    let lease = session.grant_lease(10 * SECS).await.unwrap();
    assert_eq!(session.keep_alive(lease).await, Ok(10 * SECS));
    let names: Vec<String> = (0..32).map(|i| format!("s{i}")).collect();
    let grants =
        futures::future::join_all(names.iter().map(|n| session.acquire(n, lease, Duration::ZERO, Duration::ZERO)))
            .await;
    let mut tokens = Vec::new();
    for (name, g) in names.iter().zip(grants) {
        match g.unwrap() {
            Acquire::Acquired(a) => {
                assert_eq!((&a.lock, a.lease_id), (name, lease));
                tokens.push(a.token);
            }
            other => panic!("expected a grant, got {other:?}"),
        }
    }
    let mut distinct = tokens.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 32, "distinct tokens");
    let busy = session.acquire("s0", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    assert!(matches!(busy, Acquire::Busy { holder_token: Some(t), .. } if t == tokens[0]));
    let check = session.check("s1", tokens[1]).await.unwrap();
    assert!(check.current);
    let releases = names.iter().zip(&tokens).map(|(n, t)| session.release(n, lease, *t));
    let releases = futures::future::join_all(releases).await;
    assert!(releases.into_iter().all(|r| r == Ok(true)));
    assert!(matches!(session.keep_alive(lease + 100).await, Err(Error::LeaseNotFound(_))));
    session.revoke_lease(lease).await.unwrap();
    assert!(!session.is_closed());
}

#[tokio::test]
async fn a_session_acquire_waits_for_the_pushed_grant() {
    let (mock, client) = setup().await;
    let session = client.session().await.unwrap();
    let lease = session.grant_lease(10 * SECS).await.unwrap();
    let first = session.acquire("a", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    let Acquire::Acquired(first) = first else { panic!("expected a grant") };
    let s2 = session.clone();
    let waiter = tokio::spawn(async move { s2.acquire("a", lease, 10 * SECS, Duration::ZERO).await });
    mock.wait_for("queued", |e| e.starts_with("acquire a") && e.ends_with("wait=10000")).await;
    assert_eq!(session.release("a", lease, first.token).await, Ok(true));
    match within("grant", waiter).await.unwrap().unwrap() {
        Acquire::Acquired(a) => assert!(a.token > first.token),
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test]
async fn dropping_a_session_acquire_sends_a_cancel() {
    let (mock, client) = setup().await;
    let session = client.session().await.unwrap();
    let lease = session.grant_lease(10 * SECS).await.unwrap();
    let _first = session.acquire("a", lease, Duration::ZERO, Duration::ZERO).await.unwrap();
    let s2 = session.clone();
    let waiter = tokio::spawn(async move { s2.acquire("a", lease, 30 * SECS, Duration::ZERO).await });
    mock.wait_for("queued", |e| e.starts_with("acquire a") && e.ends_with("wait=30000")).await;
    waiter.abort();
    mock.wait_for("cancel", |e| e.starts_with("cancel op ")).await;
    drop(session);
    mock.wait_for("stream closed", |e| e == "session ended").await;
}
