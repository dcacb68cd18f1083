//! The native fencelock server, in-process, as a conformance target.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use fencelock::backend::{Capabilities, Fencing};
use fencelock::{LockBackend, Outcome};
use fencelock_server::{Bootstrap, Config, Running};
use fencelock_testkit::{free_port, proxy::Proxy};

use crate::suite::{self, local, opts, within, Target, MS, SECS};

pub struct Native {
    _running: fencelock_server::Running,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    /// A client of the node, to see its queues.
    client: fencelock::Client,
}

impl Target for Native {
    async fn start() -> Native {
        let dir = tempfile::tempdir().unwrap();
        let running =
            fencelock_server::start(fencelock_server::Config::for_test(dir.path().join("data"))).await.unwrap();
        let addr = running.grpc_addr;
        // Wait until the node has elected itself (the client retries meanwhile).
        let client = fencelock::Client::connect(format!("http://{addr}")).await.unwrap();
        suite::within("server ready", client.describe("ready")).await.unwrap();
        Native { _running: running, addr, _dir: dir, client }
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

    async fn waiters(&self, lock: &str) -> Option<usize> {
        Some(waiting(&self.client, lock).await)
    }
}

crate::conformance!(Native);

/// How many acquires wait for `lock` on the node of `client`: the waiters
/// its `DescribeLock` shows (the server's queue of the lock, first in line
/// first; holders are apart).
pub async fn waiting(client: &fencelock::Client, lock: &str) -> usize {
    let info = within("describe", client.describe(lock)).await;
    info.unwrap_or_else(|e| panic!("describe {lock:?}: {e}")).waiters.len()
}

/// The reference for the other backends: weighted permits are whole and in
/// order on the fencelock server too (the suite's body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_permits_are_whole_and_in_order() {
    let t = Native::start().await;
    crate::suite::weighted_permits_are_whole_and_in_order(&t).await;
}

/// The native server declares everything; fail-over only for a list of
/// members (see `declares_failover_for_a_group_and_survives_it`), not for
/// the one address of a single node.
#[tokio::test]
async fn declares_its_capabilities() {
    let t = Native::start().await;
    let caps = suite::connect(&t.url()).await.capabilities();
    assert_eq!(
        caps,
        Capabilities::new(Fencing::Global)
            .with_durable_tokens(true)
            .with_fifo(true)
            .with_push_wakeup(true)
            .with_server_ttl(true)
            .with_survives_failover(false)
            .with_lock_delay(true)
            .with_holder_identity(true)
            .with_election(true)
            .with_shared(true)
            .with_semaphores(true)
            .with_hold_at_least(true)
            .with_once_per(true)
            .with_multi_lock(true)
            .with_min_ttl(100 * MS)
    );
    let http = suite::connect(&format!("http://{}", t.addr)).await;
    assert_eq!(http.kind(), "fencelock");
}

/// Issue 16: the native backend declared `survives_failover: false` although
/// groups and client fail-over exist. Given the members of a 3-node group it
/// declares fail-over, and has it: the node the client talks to (the one that
/// granted, so the leader) is shut down while a lock is held, and the grant stays held (renewed
/// through the new leader, never reported lost) and exclusive. Given one
/// member alone it declares none: that node down, the client has nowhere to go.
/// Issue 17: both guards report the fail-over (`failed_over`, `failovers`),
/// and a lease end is still pushed after it, by the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declares_failover_for_a_group_and_survives_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = start_group(dir.path()).await;
    let url = format!("fencelock://{}", nodes.iter().map(|n| n.grpc_addr.to_string()).collect::<Vec<_>>().join(","));
    let client = within("connect", fencelock::Client::connect(url.clone())).await.unwrap();
    assert!(client.capabilities().survives_failover, "{url}");
    let one =
        within("connect", fencelock::Client::connect(format!("fencelock://{}", nodes[1].grpc_addr))).await.unwrap();
    assert!(!one.capabilities().survives_failover);
    assert!(suite::connect(&url).await.capabilities().survives_failover, "through fencelock::connect");

    let g = within("grant", client.acquire("failover", &opts(3 * SECS, 10 * SECS))).await.unwrap().acquired().unwrap();
    // A lease whose next keep-alive is 20 s away: only the push stream, reopened
    // on the new leader, can tell it of the fail-over and of its revocation.
    let long = within("grant", client.acquire("pushed", &opts(60 * SECS, std::time::Duration::ZERO)))
        .await
        .unwrap()
        .acquired()
        .unwrap();
    let (g_carried, long_carried) = (g.lease_watch(), long.lease_watch());
    let g_carried = tokio::spawn(async move { g_carried.failed_over().await });
    let long_carried = tokio::spawn(async move { long_carried.failed_over().await });
    // A group that has just formed may still change leaders (a real fail-over
    // the leases survive): count from here.
    let before = g.failovers();
    let serving = client.server();
    let i = nodes.iter().position(|n| serving.ends_with(&n.grpc_addr.to_string())).expect("a node of the group");
    within("shutdown", nodes.remove(i).shutdown()).await;
    let first = g.deadline();
    within("a renewal through the new leader", async {
        while g.deadline() == first {
            assert!(!g.is_lost(), "lost with two of three nodes up");
            tokio::time::sleep(20 * MS).await;
        }
    })
    .await;
    // Issue 17: the guards report that their leases were carried to a new leader.
    assert!(matches!(within("fail-over seen", g_carried).await.unwrap(), Ok(n) if n >= 1));
    assert!(matches!(within("fail-over pushed", long_carried).await.unwrap(), Ok(n) if n >= 1));
    assert!(g.failovers() > before && !long.is_lost());
    // Pushed lease ends survive the leader change: a revoke by someone else
    // reaches the holder as Revoked (a keep-alive would say NotFound, and
    // none is due for 20 s).
    let stranger = within("connect", fencelock::Client::connect(url.clone())).await.unwrap();
    within("revoke", stranger.revoke_lease(long.lease_id())).await.unwrap();
    assert_eq!(within("pushed revoke", long.lost()).await, fencelock::LeaseLost::Revoked);
    let other = suite::connect(&url).await;
    match within("try", other.acquire("failover", &opts(3 * SECS, std::time::Duration::ZERO))).await.unwrap() {
        Outcome::Busy { holder_token, .. } => assert_eq!(holder_token, g.token()),
        other => panic!("a second holder after the fail-over: {other:?}"),
    }
    assert!(within("release", g.release()).await.unwrap());
    let again = within("grant after release", other.acquire("failover", &opts(3 * SECS, 5 * SECS))).await.unwrap();
    assert!(again.acquired().unwrap().release().await.unwrap());
}

/// Issue 19 §1: a follower cannot serve a session stream's operations; the
/// stream transport follows the leader a follower names in its stream error,
/// as unary calls do with the refusal's metadata. The client is given the
/// group with both followers first: following the hint it goes from the first
/// follower straight to the leader (two streams); moving along the list
/// instead would open a third on the second follower. A group that has just
/// formed may still change leaders, which moves the client (and its stream)
/// on for a reason of its own: the run is judged only if the Raft term held
/// throughout, and tried again on a new client otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_follows_the_leader_a_follower_names() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_group(dir.path()).await;
    for _ in 0..5 {
        let term = within("one leader", one_leader(&nodes)).await;
        let (leader, followers) = leader_and_followers(&nodes);
        let url = format!("fencelock://{},{},{leader}", followers[0], followers[1]);
        let client = within("connect", fencelock::Client::connect(url)).await.unwrap();
        assert!(client.server().ends_with(&followers[0]), "connected to the first follower: {}", client.server());
        let g = within("grant", client.lock("led").acquire()).await.unwrap();
        let Outcome::Acquired(g) = g else { panic!("{g:?}") };
        assert!(within("release", g.release()).await.unwrap());
        if max_term(&nodes) != term {
            continue; // the leader changed meanwhile: no verdict
        }
        assert!(client.server().ends_with(&leader), "the client follows the hint to the leader {leader}");
        assert_eq!(client.streams_opened(), 2, "a stream on the first follower, then one on the leader");
        return;
    }
    panic!("the group never kept one leader for a whole run");
}

/// The highest Raft term any node of `nodes` knows.
fn max_term(nodes: &[Running]) -> u64 {
    nodes.iter().map(|n| n.raft.metrics().borrow().current_term).max().unwrap_or(0)
}

/// Waits until every node of `nodes` names the same leader in the same term;
/// returns the term.
async fn one_leader(nodes: &[Running]) -> u64 {
    loop {
        let seen: Vec<_> = nodes
            .iter()
            .map(|n| {
                let m = n.raft.metrics().borrow().clone();
                (m.current_term, m.current_leader)
            })
            .collect();
        if seen[0].1.is_some() && seen.iter().all(|s| *s == seen[0]) {
            return seen[0].0;
        }
        tokio::time::sleep(10 * MS).await;
    }
}

/// The leader's gRPC address, and the followers'.
fn leader_and_followers(nodes: &[Running]) -> (String, Vec<String>) {
    let (leaders, followers): (Vec<&Running>, Vec<&Running>) =
        nodes.iter().partition(|n| n.raft.metrics().borrow().state.is_leader());
    assert_eq!(leaders.len(), 1, "one leader");
    (leaders[0].grpc_addr.to_string(), followers.iter().map(|n| n.grpc_addr.to_string()).collect())
}

/// Three in-process nodes on free ports of 127.0.0.1 forming one group, the
/// leader elected.
async fn start_group(dir: &std::path::Path) -> Vec<Running> {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers: BTreeMap<u64, String> = (1..=3).map(|id| (id, local(ports[id as usize - 1]).to_string())).collect();
    let mut nodes = Vec::new();
    for id in 1..=3u64 {
        let mut c = Config::for_test(dir.join(format!("n{id}")));
        c.node_id = id;
        c.grpc_listen = local(ports[id as usize - 1]);
        c.bootstrap = Bootstrap::Peers(peers.clone());
        nodes.push(fencelock_server::start(c).await.unwrap());
    }
    let all = nodes.iter().map(|n| format!("http://{}", n.grpc_addr)).collect::<Vec<_>>().join(",");
    let client = fencelock::Client::connect(all).await.unwrap();
    within("a leader", client.describe("ready")).await.unwrap();
    nodes
}

/// Issue 18: the guards of a multi-lock share one lease; when it is revoked,
/// the multi-guard's `lost()` fires, and every one of its locks is free
/// again (the server ended all of its grants with the lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_is_lost_whole_with_its_lease() {
    let t = <Native as Target>::start().await;
    let b = suite::connect(&t.url()).await;
    let try_ = opts(10 * SECS, std::time::Duration::ZERO);
    let all = within("multi", b.acquire_all(&["x", "y"], &try_)).await.unwrap().acquired().unwrap();
    let lease = all.guards()[0].lease_id();
    assert!(all.guards().iter().all(|g| g.lease_id() == lease), "one lease for every lock");
    let stranger = within("connect", fencelock::Client::connect(format!("http://{}", t.addr))).await.unwrap();
    within("revoke", stranger.revoke_lease(lease)).await.unwrap();
    assert_eq!(within("lost", all.lost()).await, fencelock::LeaseLost::Revoked);
    assert!(all.is_lost());
    for name in ["x", "y"] {
        let got = within(name, stranger.acquire(name, &try_)).await.unwrap();
        assert!(matches!(got, Outcome::Acquired(_)), "{name} is free again: {got:?}");
    }
    assert!(!within("release", all.release()).await.unwrap(), "nothing left to release");
}
