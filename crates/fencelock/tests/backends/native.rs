//! The native fencelock server, in-process, as a conformance target.

use std::net::SocketAddr;

use fencelock::backend::{Capabilities, Fencing};
use fencelock_testkit::proxy::Proxy;

use crate::suite::{self, Target, MS};

pub struct Native {
    _running: fencelock_server::Running,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Target for Native {
    async fn start() -> Native {
        let dir = tempfile::tempdir().unwrap();
        let running = fencelock_server::start(fencelock_server::Config::for_test(dir.path().join("data"))).await.unwrap();
        let addr = running.grpc_addr;
        // Wait until the node has elected itself (the client retries meanwhile).
        let client = fencelock::Client::connect(format!("http://{addr}")).await.unwrap();
        suite::within("server ready", client.describe("ready")).await.unwrap();
        Native { _running: running, addr, _dir: dir }
    }

    fn url(&self) -> String {
        format!("fencelock://{}", self.addr)
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        let proxy = Proxy::start(self.addr).await;
        (format!("fencelock://{}", proxy.addr()), vec![proxy])
    }

    fn short_ttl(&self) -> std::time::Duration {
        500 * MS
    }
}

crate::conformance!(Native);

/// The native server declares everything but fail-over (a single node).
#[tokio::test]
async fn declares_its_capabilities() {
    let t = Native::start().await;
    let caps = suite::connect(&t.url()).await.capabilities();
    assert_eq!(
        caps,
        Capabilities {
            fencing: Fencing::Global,
            durable_tokens: true,
            fifo: true,
            push_wakeup: true,
            server_ttl: true,
            survives_failover: false,
            lock_delay: true,
            min_ttl: 100 * MS,
        }
    );
    let http = suite::connect(&format!("http://{}", t.addr)).await;
    assert_eq!(http.kind(), "fencelock");
}
