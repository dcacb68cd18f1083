//! Redlock over three Redis servers without persistence as a conformance
//! target, and the tests of what only Redlock does: a majority of nodes is
//! enough to grant and renew (a minority may be down), fewer is a
//! `Error::Backend` (a failure of the service, not contention), and there is
//! no fencing token to require.

use std::net::SocketAddr;
use std::time::Duration;

use fencelock::backend::{self, Capabilities, Fencing};
use fencelock::{Error, Outcome};
use fencelock_testkit::proxy::{Mode, Proxy};
use fencelock_testkit::RedisServer;

use crate::suite::{self, opts, within, Target, MS, SECS};

/// Three independent Redis servers.
pub struct Redlock {
    servers: Vec<RedisServer>,
}

impl Target for Redlock {
    async fn start() -> Redlock {
        Redlock { servers: start_servers(3).await }
    }

    fn url(&self) -> String {
        url_of(self.servers.iter().map(addr))
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        let mut proxies = Vec::new();
        for server in &self.servers {
            proxies.push(Proxy::start(addr(server)).await);
        }
        (url_of(proxies.iter().map(Proxy::addr)), proxies)
    }

    fn short_ttl(&self) -> Duration {
        500 * MS
    }
}

crate::conformance!(Redlock);

async fn start_servers(n: usize) -> Vec<RedisServer> {
    let mut servers = Vec::new();
    for _ in 0..n {
        servers.push(tokio::task::spawn_blocking(RedisServer::start_volatile).await.unwrap());
    }
    servers
}

fn addr(server: &RedisServer) -> SocketAddr {
    crate::suite::local(server.port())
}

fn url_of(addrs: impl Iterator<Item = SocketAddr>) -> String {
    format!("redlock://{}", addrs.map(|a| a.to_string()).collect::<Vec<_>>().join(","))
}

/// The declaration: no token, no queue, no push wake-ups, expiry on the nodes,
/// survives the loss of a minority of nodes, no lock-delay.
#[tokio::test]
async fn declares_its_capabilities() {
    let t = Redlock::start().await;
    let b = suite::connect(&t.url()).await;
    assert_eq!(b.kind(), "redlock");
    assert_eq!(
        b.capabilities(),
        Capabilities::new(Fencing::None)
            .with_durable_tokens(false)
            .with_fifo(false)
            .with_push_wakeup(false)
            .with_server_ttl(true)
            .with_survives_failover(true)
            .with_lock_delay(false)
            .with_min_ttl(100 * MS)
    );
}

/// Fencing cannot be had from Redlock: `require_fencing` is refused before
/// anything is sent, and a grant carries no token.
#[tokio::test]
async fn require_fencing_is_refused() {
    let t = Redlock::start().await;
    let b = suite::connect(&t.url()).await;
    let fenced = opts(10 * SECS, Duration::ZERO).require_fencing(true);
    let got = b.acquire("fenced", &fenced).await;
    assert!(matches!(&got, Err(Error::Unsupported(m)) if m.contains("redlock")), "{got:?}");
    let g = b.acquire("fenced", &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    assert_eq!(g.token(), None);
    assert!(matches!(g.fencing_token(), Err(Error::Unsupported(_))));
    assert!(g.release().await.unwrap());
}

/// Survives the loss of a minority (the declared `survives_failover`): with
/// one of three nodes killed, locks are granted, renewed (the deadline moves
/// on) and released, and still exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_of_three_still_grants_and_renews() {
    let mut servers = start_servers(3).await;
    let url = url_of(servers.iter().map(addr));
    let (a, b) = (suite::connect(&url).await, suite::connect(&url).await);
    drop(servers.pop()); // SIGKILL
    let g = within("grant", a.acquire("minority", &opts(300 * MS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    match within("try", b.acquire("minority", &opts(10 * SECS, Duration::ZERO))).await.unwrap() {
        Outcome::Busy { holder_token: None, .. } => {}
        other => panic!("a second holder with one node down: {other:?}"),
    }
    let first = g.deadline();
    within("a renewal", async {
        while g.deadline() == first {
            assert!(!g.is_lost(), "lost with a majority up");
            tokio::time::sleep(10 * MS).await;
        }
    })
    .await;
    assert!(g.release().await.unwrap());
    let again = within("grant after release", b.acquire("minority", &opts(10 * SECS, Duration::ZERO))).await;
    assert!(again.unwrap().acquired().unwrap().release().await.unwrap());
}

/// Fewer than a majority is a failure, not contention: with two of three
/// nodes cut off, a try fails with `Error::Backend` naming the majority
/// needed, and so does a wait once it is over (not `TimedOut`); once the
/// nodes are back, locks are granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_down_of_three_is_an_error() {
    let t = Redlock::start().await;
    let (url, proxies) = t.via_proxies().await;
    let b = suite::connect(&url).await;
    for p in &proxies[1..] {
        p.set_mode(Mode::Reset);
    }
    for wait in [Duration::ZERO, 300 * MS] {
        let got = within("acquire", b.acquire("majority", &opts(10 * SECS, wait))).await;
        assert!(
            matches!(&got, Err(Error::Backend { message, .. }) if message.contains("majority")),
            "wait {wait:?}: {got:?}"
        );
    }
    for p in &proxies {
        p.set_mode(Mode::Pass);
    }
    let g = within("grant once the nodes are back", b.acquire("majority", &opts(10 * SECS, 10 * SECS))).await;
    assert!(g.unwrap().acquired().unwrap().release().await.unwrap());
}

/// Connecting needs a majority of the nodes (and each node named once); a
/// minority may be down at connect and is reached later.
#[tokio::test]
async fn connect_needs_a_majority_of_distinct_nodes() {
    let servers = start_servers(2).await;
    let closed = || SocketAddr::from(([127, 0, 0, 1], fencelock_testkit::free_port()));
    let one_down = url_of([addr(&servers[0]), addr(&servers[1]), closed()].into_iter());
    let b = suite::connect(&one_down).await;
    let g = within("grant", b.acquire("c", &opts(10 * SECS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    assert!(g.release().await.unwrap());
    let two_down = url_of([addr(&servers[0]), closed(), closed()].into_iter());
    let got = within("connect", backend::connect(&two_down)).await;
    assert!(matches!(&got, Err(Error::Connect { message: m, .. }) if m.contains("majority")), "{got:?}");
    let twice = url_of([addr(&servers[0]), addr(&servers[0]), addr(&servers[1])].into_iter());
    let got = within("connect", backend::connect(&twice)).await;
    assert!(matches!(&got, Err(Error::InvalidArgument(m)) if m.contains("twice")), "{got:?}");
}
