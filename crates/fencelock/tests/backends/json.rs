//! The fencelock server's HTTP/JSON API (`fencelock+json://`), in-process, as
//! a conformance target: the recipe of `docs/http-api.md` judged by the same
//! suite as every other backend. And what only it does: a release ends the
//! lease made for the grant; a node over TLS with a token is reached as
//! `fencelock+json+tls://…?ca=…&token=…`.

use std::net::SocketAddr;

use fencelock::backend::{Capabilities, Fencing};
use fencelock::Error;
use fencelock_testkit::proxy::Proxy;

use crate::suite::{self, opts, Target, MS, SECS};

pub struct Json {
    _running: fencelock_server::Running,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    /// A gRPC client of the same node, to see its queues.
    client: fencelock::Client,
}

impl Target for Json {
    async fn start() -> Json {
        let dir = tempfile::tempdir().unwrap();
        let running =
            fencelock_server::start(fencelock_server::Config::for_test(dir.path().join("data"))).await.unwrap();
        let client = fencelock::Client::connect(format!("http://{}", running.grpc_addr)).await.unwrap();
        suite::within("server ready", client.describe("ready")).await.unwrap();
        Json { addr: running.http_addr, _running: running, _dir: dir, client }
    }

    fn url(&self) -> String {
        format!("fencelock+json://{}", self.addr)
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        let proxy = Proxy::start(self.addr).await;
        (format!("fencelock+json://{}", proxy.addr()), vec![proxy])
    }

    fn short_ttl(&self) -> std::time::Duration {
        500 * MS
    }

    /// The node's own queue, as its gRPC `DescribeLock` shows it (the HTTP
    /// API's acquires wait in the same queue).
    async fn waiters(&self, lock: &str) -> Option<usize> {
        Some(crate::native::waiting(&self.client, lock).await)
    }
}

crate::conformance!(Json);

/// What the HTTP API gives through this backend: the server's guarantees on
/// one host, without elections or multi-locks.
#[tokio::test]
async fn declares_its_capabilities() {
    let t = Json::start().await;
    let caps = suite::connect(&t.url()).await.capabilities();
    assert_eq!(
        caps,
        Capabilities::new(Fencing::Global)
            .with_durable_tokens(true)
            .with_fifo(true)
            .with_push_wakeup(true)
            .with_server_ttl(true)
            .with_lock_delay(true)
            .with_holder_identity(true)
            .with_shared(true)
            .with_semaphores(true)
            .with_hold_at_least(true)
            .with_once_per(true)
            .with_min_ttl(100 * MS)
    );
}

/// A release ends the lease the acquire made for the grant: the lock is free
/// and the lease is gone (no lease lingers per acquire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_ends_the_grant_s_lease() {
    let t = Json::start().await;
    let b = suite::connect(&t.url()).await;
    let g = b.acquire("ends", &opts(10 * SECS, std::time::Duration::ZERO)).await.unwrap().acquired().unwrap();
    let lease = g.lease_id();
    assert!(g.release().await.unwrap());
    let http = fencelock_http::Client::new(t.addr);
    let r = http.send(fencelock_http::Request::get(&format!("/v1/leases/{lease}"))).await.unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    let again = b.acquire("ends", &opts(10 * SECS, std::time::Duration::ZERO)).await.unwrap();
    assert!(again.acquired().is_ok());
}

/// A URL with two hosts is refused before anything is sent.
#[tokio::test]
async fn one_host_only() {
    let err = fencelock::connect("fencelock+json://127.0.0.1:1,127.0.0.1:2").await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}
