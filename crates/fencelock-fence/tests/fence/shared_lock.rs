//! The fence with a real read-write lock (issue 18): tokens from a native
//! fencelock server, started in this process, presented to a fence by the
//! fence's rule (`Marks::admit`). Readers of a shared lock are granted
//! concurrently and present their tokens in any order; a writer queued
//! behind them is granted a token above theirs. The conformance body runs
//! against every fence.

use std::time::Duration;

use fencelock::{Client, Guard, Outcome};
use fencelock_fence::{Access, Fence, Fenced, Stale};

const LOCK: &str = "report";
/// Bounds each acquire (the test's time bound: nothing here waits longer).
const WAIT: Duration = Duration::from_secs(20);

/// A fencelock server of its own and a client of it.
pub struct LockService {
    pub client: Client,
    server: fencelock_server::Running,
    _dir: tempfile::TempDir,
}

impl LockService {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server =
            fencelock_server::start(fencelock_server::Config::for_test(dir.path().join("data"))).await.unwrap();
        let client = Client::connect(format!("http://{}", server.grpc_addr)).await.unwrap();
        LockService { client, server, _dir: dir }
    }

    pub async fn stop(self) {
        drop(self.client);
        self.server.shutdown().await;
    }
}

async fn acquire(client: &Client, shared: bool) -> Guard {
    let request = client.lock(LOCK).ttl(Duration::from_secs(30)).wait(WAIT);
    match if shared { request.shared() } else { request }.acquire().await.unwrap() {
        Outcome::Acquired(guard) => guard,
        other => panic!("expected a grant, got {other:?}"),
    }
}

async fn until_a_writer_waits(client: &Client) {
    while client.describe(LOCK).await.unwrap().waiters.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn token(guard: &Guard) -> u64 {
    guard.token().expect("a native grant has a token")
}

/// Two readers read (newer token first); a writer queued behind them is
/// granted when they release and writes; then the older reader's read with
/// its old token is refused by the read rule ("stale read"), the younger
/// reader's write with its token by the write rule, and a reader granted
/// after the writer reads.
pub async fn readers_then_a_queued_writer(fence: &dyn Fence, client: &Client, p: &str) {
    let k = format!("{p}:report.csv");
    let (r1, r2) = (acquire(client, true).await, acquire(client, true).await);
    let (t1, t2) = (token(&r1), token(&r2));
    assert!(fence.admit_read(&k, t2).await.unwrap().is_admitted(), "reader {t2} reads");
    assert!(fence.admit_read(&k, t1).await.unwrap().is_admitted(), "reader {t1} reads after reader {t2}");
    let writer = {
        let client = client.clone();
        tokio::spawn(async move { acquire(&client, false).await })
    };
    tokio::time::timeout(WAIT, until_a_writer_waits(client)).await.expect("the writer queues");
    assert!(r1.release().await.unwrap() && r2.release().await.unwrap());
    let w = tokio::time::timeout(WAIT, writer).await.expect("the writer is granted").unwrap();
    let tw = token(&w);
    assert!(tw > t1.max(t2), "a writer's token is above every reader's granted before it");
    assert!(fence.admit(&k, tw).await.unwrap().is_admitted(), "writer {tw} writes");
    let refused = Fenced::Stale(Stale { access: Access::Read, highest: tw, got: t1 });
    assert_eq!(fence.admit_read(&k, t1).await.unwrap(), refused, "the stale reader's read");
    let refused = Fenced::Stale(Stale { access: Access::Write, highest: tw, got: t2 });
    assert_eq!(fence.admit(&k, t2).await.unwrap(), refused, "the stale reader's write");
    assert!(w.downgrade().await.unwrap(), "the writer becomes a reader");
    assert!(fence.admit_read(&k, tw).await.unwrap().is_admitted(), "and reads its own write with its token");
    let r3 = acquire(client, true).await;
    let t3 = token(&r3);
    assert!(t3 > tw);
    assert!(fence.admit_read(&k, t3).await.unwrap().is_admitted(), "a reader granted after the writer reads");
    assert!(w.release().await.unwrap() && r3.release().await.unwrap());
}
