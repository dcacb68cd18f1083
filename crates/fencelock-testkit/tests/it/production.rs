//! The production profile of the peer servers (what `fencelock-bench`
//! measures) starts, grants and releases a lock through the client crate's
//! backend, and stops, so the profile cannot rot while the tests run the test
//! profile. Every wait is bounded by [`LIMIT`].

use std::net::TcpStream;
use std::time::Duration;

use fencelock::{Guard, LockOptions, Outcome};
use fencelock_testkit::{EtcdServer, PgServer, Profile, ZkServer};
use tokio::time::Instant;

/// Upper bound of every wait; only reached when a test fails.
const LIMIT: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f).await.unwrap_or_else(|_| panic!("{what}: no answer within {LIMIT:?}"))
}

/// Starts a server on a blocking thread (the testkit polls with sleeps).
async fn start<S: Send + 'static>(f: fn(Profile) -> S) -> S {
    within("start", tokio::task::spawn_blocking(move || f(Profile::Production))).await.unwrap()
}

/// Connects to `url`, takes a lock with `ttl` (no wait) and hands the guard
/// back, with the time just before the acquire was called.
#[allow(clippy::disallowed_methods)] // the test bounds the guard's deadline by the time it asked
async fn acquire(url: &str, ttl: Duration) -> (Guard, Instant) {
    let backend = within("connect", fencelock::connect(url)).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let opts = LockOptions::default().ttl(ttl).wait(Duration::ZERO);
    let asked = Instant::now();
    match within("acquire", backend.acquire("testkit/production", &opts)).await.unwrap() {
        Outcome::Acquired(guard) => (guard, asked),
        other => panic!("{url}: a free lock was not granted: {other:?}"),
    }
}

/// Drops the server (on a blocking thread: it waits for the process) and
/// checks that nothing listens on its port any more.
async fn stop<S: Send + 'static>(server: S, port: u16) {
    within("stop", tokio::task::spawn_blocking(move || drop(server))).await.unwrap();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "port {port} still served after the server was dropped");
}

/// ZooKeeper in production runs `tickTime=2000`, so the server raises a
/// session timeout asked below 2 × tickTime to 4 s: a 1 s TTL comes back as a
/// lease of about 4 s, counted from before the acquire (the test profile,
/// ticking every 100 ms, would keep 1 s; the bound leaves room for a slow machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_zookeeper_grants_with_its_own_session_range() {
    let server = start(ZkServer::start_profile).await;
    assert!(server.describe().contains("tickTime=2000"), "{}", server.describe());
    let (guard, asked) = acquire(&server.url(), Duration::from_secs(1)).await;
    let lease = guard.deadline().saturating_duration_since(asked);
    assert!(lease > Duration::from_secs(2), "a 1 s TTL was not raised to tickTime 2000's 4 s minimum: {lease:?}");
    assert!(within("release", guard.release()).await.unwrap(), "the release found the grant gone");
    let port = server.port();
    stop(server, port).await;
}

/// PostgreSQL in production (256 MB of shared buffers, synchronous commit)
/// grants and releases through the lease-table backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_postgres_grants_and_releases() {
    let server = start(PgServer::start_profile).await;
    assert!(server.describe().contains("shared_buffers=256MB"), "{}", server.describe());
    let (guard, _) = acquire(&server.url(), Duration::from_secs(10)).await;
    assert!(guard.token().is_some(), "the lease table gives a token");
    assert!(within("release", guard.release()).await.unwrap(), "the release found the grant gone");
    let port = server.port();
    stop(server, port).await;
}

/// etcd with its default timers (election 1 s) grants and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_etcd_grants_and_releases() {
    let server = start(EtcdServer::start_profile).await;
    assert!(server.describe().contains("--election-timeout 1000"), "{}", server.describe());
    let (guard, _) = acquire(&server.url(), Duration::from_secs(10)).await;
    assert!(within("release", guard.release()).await.unwrap(), "the release found the grant gone");
    let port = server.port();
    stop(server, port).await;
}
