//! Shared by the client's integration tests: a real single-node fencelock server
//! started in-process (free ports of 127.0.0.1, a temporary data directory), its
//! Prometheus metrics as an oracle, bounded waits, and the fault [`proxy`].
//!
//! Nothing here sleeps to assert timing: [`within`] bounds a wait so that a
//! failure ends the test instead of hanging it, and [`eventually`] polls a
//! condition on server state.

#![allow(dead_code)] // each test binary uses a different part

#[allow(unused_imports)]
pub use fencelock_testkit::proxy;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use fencelock::{Client, Guard, Outcome};
use fencelock_proto::v1 as pb;
use fencelock_proto::v1::lock_client::LockClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const SECS: Duration = Duration::from_secs(1);

/// Upper bound of every wait in these tests; only reached when a test fails.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);

pub struct Server {
    running: Option<fencelock_server::Running>,
    pub url: String,
    pub grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Server {
    pub async fn start() -> Server {
        Server::start_with(|_| {}).await
    }

    /// A server whose test config `change` adjusts first.
    pub async fn start_with(change: impl FnOnce(&mut fencelock_server::Config)) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut config = fencelock_server::Config::for_test(dir.path().join("data"));
        change(&mut config);
        let running = fencelock_server::start(config).await.unwrap();
        let url = format!("http://{}", running.grpc_addr);
        // Until the node has elected itself it answers UNAVAILABLE; the client
        // retries that, the raw and session APIs do not. Wait for it here.
        let client = Client::connect(url.clone()).await.unwrap();
        client.describe("ready").await.expect("the server becomes ready");
        let (grpc_addr, http_addr) = (running.grpc_addr, running.http_addr);
        Server { running: Some(running), url, grpc_addr, http_addr, dir }
    }

    /// The admin (HTTP) port's address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// A client connected directly (not through a proxy).
    pub async fn client(&self) -> Client {
        Client::connect(self.url.clone()).await.unwrap()
    }

    /// The raw gRPC client, for what the library does not expose.
    pub async fn raw(&self) -> LockClient<tonic::transport::Channel> {
        LockClient::connect(self.url.clone()).await.unwrap()
    }

    /// One sample of the server's `/metrics` (counters and gauges without labels).
    pub async fn metric(&self, name: &str) -> u64 {
        let body = http_get(self.http_addr, "/metrics").await;
        let prefix = format!("{name} ");
        let line = body.lines().find(|l| l.starts_with(&prefix));
        let value = line.unwrap_or_else(|| panic!("no metric {name} in:\n{body}"));
        value[prefix.len()..].trim().parse().unwrap_or_else(|e| panic!("metric {name}: {e}: {value:?}"))
    }

    /// Whether the server still has lease `lease`, asked with a keep-alive (which
    /// renews it if it does).
    pub async fn lease_is_live(&self, lease: u64) -> bool {
        let req = pb::KeepAliveRequest { request_id: fastrand_id(), lease_id: lease };
        match self.raw().await.keep_alive(req).await {
            Ok(_) => true,
            Err(s) if s.code() == tonic::Code::NotFound => false,
            Err(s) => panic!("keep-alive of lease {lease}: {s}"),
        }
    }

    /// Shuts the server down (gracefully) and starts it again on the same data
    /// directory and ports, with the default test config; returns once it
    /// serves again.
    pub async fn restart(&mut self) {
        within("server shutdown", self.running.take().unwrap().shutdown()).await;
        let mut config = fencelock_server::Config::for_test(self.dir.path().join("data"));
        config.grpc_listen = self.grpc_addr;
        config.http_listen = self.http_addr;
        self.running = Some(fencelock_server::start(config).await.unwrap());
        let client = self.client().await;
        within("the restarted server serves", client.describe("ready")).await.expect("the server serves again");
    }

    /// Graceful shutdown (bounded: a failing test must not hang here).
    pub async fn stop(mut self) {
        within("server shutdown", self.running.take().unwrap().shutdown()).await;
    }
}

/// A request id for raw calls made by the tests themselves.
pub fn fastrand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1 << 60);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A plain HTTP/1.1 GET; returns the body.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    within("HTTP GET", async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
        body.to_string()
    })
    .await
}

/// `f`, or a panic naming `what` after [`WAIT_LIMIT`].
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT_LIMIT, f).await.unwrap_or_else(|_| panic!("{what}: not within {WAIT_LIMIT:?}"))
}

/// Waits until `cond` holds (checked every 10 ms, up to [`WAIT_LIMIT`]). For
/// conditions on server state, not for timing.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
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

pub fn acquired(outcome: Outcome) -> Guard {
    match outcome {
        Outcome::Acquired(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

pub async fn waiters(client: &Client, name: &str) -> usize {
    client.describe(name).await.unwrap().waiters.len()
}

/// `(lease, token)` of the holder of `name`, as the server sees it.
pub async fn holder(client: &Client, name: &str) -> Option<(u64, u64)> {
    client.describe(name).await.unwrap().holder.map(|h| (h.lease_id, h.token))
}
