//! A fencelock group of real `fencelock serve` processes on free ports of
//! 127.0.0.1, each with its data in a temp dir; nodes are killed (SIGKILL),
//! restarted on the same ports and data, added with `--join` and `fencelock
//! cluster add`, and removed with `fencelock cluster remove`.
//!
//! [`Cluster::start`] runs the group as the README's secure setup does: TLS
//! with each node's certificate of `fencelock certs init`, Raft on a peer port
//! of its own (`--peer-listen`, `--peers ID=CLIENT/PEER`), an auth file; the
//! clients over TLS with a token that may take and read locks but not change
//! the group, the admin calls (`cluster`, `/v1/cluster`, `/v1/locks`) with an
//! admin token. [`Cluster::start_in`] (network namespaces) runs plaintext.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::{Client, ClientTls, Guard, LockOptions, Outcome};

use super::secure::Secure;
use super::{bin, free_port, http_get};

/// How a node's empty data dir comes into the group.
#[derive(Debug, Clone)]
enum Boot {
    Peers(String),
    Join,
}

/// One node. Killed (SIGKILL) on drop.
pub struct Node {
    pub id: u64,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The Raft port of its own (secure groups).
    pub peer: Option<SocketAddr>,
    pub data: PathBuf,
    log: PathBuf,
    boot: Boot,
    /// The network namespace the node runs in, if any (partition tests).
    ns: Option<String>,
    /// TLS and the auth file, if the group has them.
    secure: Option<Arc<Secure>>,
    child: Option<Child>,
}

impl Node {
    /// Starts the process, with the flags it was formed with.
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log");
        let mut cmd = match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin()]);
                c
            }
            None => Command::new(bin()),
        };
        cmd.args(["serve", "--node-id", &self.id.to_string(), "--data-dir"])
            .arg(&self.data)
            .args(["--listen", &self.grpc.to_string(), "--http", &self.http.to_string()])
            .env("FENCELOCK_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log);
        if self.ns.is_some() {
            // A bridge of namespaces this test made: a network of its own,
            // where plaintext on a non-loopback address is meant.
            cmd.arg("--insecure");
        }
        match &self.boot {
            Boot::Peers(p) => cmd.args(["--peers", p]),
            Boot::Join => cmd.arg("--join"),
        };
        if let Some(s) = &self.secure {
            cmd.args(s.serve_args(self.id));
        }
        if let Some(p) = self.peer {
            cmd.args(["--peer-listen", &p.to_string()]);
        }
        self.child = Some(cmd.spawn().expect("spawn fencelock serve"));
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        super::kill_child(&mut self.child);
    }

    /// Start again on the same ports and data, with the flags it was first
    /// started with (`--peers ID=CLIENT/PEER` included, as operators do).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn is_running(&mut self) -> bool {
        super::child_running(&mut self.child)
    }

    /// `GET path` on the admin port: over TLS with the admin token if the
    /// group is secure.
    /// Whether the admin endpoint answers `/v1/cluster` (with any status: a
    /// node waiting to join is not healthy) within `bound`.
    fn answers_within(&self, bound: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < bound {
            if self.admin_get("/v1/cluster").is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn admin_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        match &self.secure {
            Some(s) => s.admin_get(self.http, path),
            None => http_get(self.http, path),
        }
    }

    /// `method path` with a JSON `body` on the admin port (as the admin when
    /// the group is secure): (status, body).
    pub fn admin_request(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, String)> {
        let json = [("Content-Type", "application/json".to_string())];
        match &self.secure {
            Some(s) => s.admin_request(self.http, method, path, body),
            None => super::http_request(self.http, method, path, &json, body),
        }
    }

    /// Whether this node leads and serves (`/healthz` 200).
    pub fn serves(&self) -> bool {
        matches!(self.admin_get("/healthz"), Ok((200, _)))
    }

    /// `GET /v1/cluster` as JSON, if the node answers.
    pub fn status(&self) -> Option<serde_json::Value> {
        match self.admin_get("/v1/cluster") {
            Ok((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    /// This node alone, as a client's `--server`.
    pub fn server_url(&self) -> String {
        match self.secure {
            Some(_) => format!("fencelock+tls://{}", self.grpc),
            None => format!("fencelock://{}", self.grpc),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What [`Cluster::kill_leader`] did: node indexes, the time a new leader
/// took, and the instant just before the kill.
pub struct LeaderKill {
    pub old: usize,
    pub new: usize,
    pub took: Duration,
    pub at: tokio::time::Instant,
}

/// A group of nodes with ids 1..=n (more can be added).
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
    /// TLS and the auth file, if the group has them.
    pub secure: Option<Arc<Secure>>,
}

/// Node certificates made for a secure group: its first nodes and the two
/// added by the membership test.
const CERTIFIED_NODES: u64 = 5;

impl Cluster {
    /// Starts `n` nodes with `--peers`, TLS, a peer port each and the auth
    /// file, and waits until one leads and serves.
    pub fn start(n: u64) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let secure = Arc::new(Secure::create(dir.path(), CERTIFIED_NODES.max(n)));
        let addrs: Vec<(u64, SocketAddr, SocketAddr, SocketAddr)> =
            (1..=n).map(|id| (id, local(), local(), local())).collect();
        let peers = addrs.iter().map(|(id, g, _, p)| format!("{id}={g}/{p}")).collect::<Vec<_>>().join(",");
        let mut nodes = Vec::new();
        for (id, grpc, http, peer) in addrs {
            let mut node = new_node(&dir, id, grpc, http, Boot::Peers(peers.clone()));
            (node.peer, node.secure) = (Some(peer), Some(secure.clone()));
            nodes.push(node);
        }
        for node in &mut nodes {
            node.spawn();
        }
        let c = Cluster { dir, nodes, secure: Some(secure) };
        c.wait_leader(None, Duration::from_secs(20)).unwrap_or_else(|| c.fail("no leader"));
        c.wait_formed(Duration::from_secs(20));
        c
    }

    /// Waits until every node names the same leader, which serves, and has
    /// applied an entry: the group's first membership is committed everywhere.
    /// A workaround: until a follower has learnt that commit, it answers a
    /// membership change with 400 "already undergoing a configuration change"
    /// instead of handing it to the leader (openraft checks that before
    /// leadership). The same leader on every node: a node that starts late can
    /// stand for election while the first leader's appends to it back off,
    /// and unseat it (seen in CI), so one node serving is not yet a group.
    fn wait_formed(&self, within: Duration) {
        let start = Instant::now();
        let formed = || {
            let statuses: Option<Vec<_>> = self.nodes.iter().map(Node::status).collect();
            let Some(statuses) = statuses else { return false };
            let leader = statuses[0]["leader"].as_u64();
            let agreed = statuses.iter().all(|s| s["leader"].as_u64() == leader && s["last_applied"].is_u64());
            agreed && self.nodes.iter().any(|n| Some(n.id) == leader && n.serves())
        };
        while !formed() {
            if start.elapsed() > within {
                self.fail("the group did not form on every node");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `n` nodes with `--peers` on 127.0.0.1, plaintext and without
    /// authentication (the loopback is this machine's own), and waits until
    /// one leads and the group formed on every node.
    pub fn start_plain(n: u64) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let addrs: Vec<(u64, SocketAddr, SocketAddr)> = (1..=n).map(|id| (id, local(), local())).collect();
        let peers = addrs.iter().map(|(id, g, _)| format!("{id}={g}")).collect::<Vec<_>>().join(",");
        let mut nodes: Vec<Node> =
            addrs.into_iter().map(|(id, g, h)| new_node(&dir, id, g, h, Boot::Peers(peers.clone()))).collect();
        for node in &mut nodes {
            node.spawn();
        }
        let c = Cluster { dir, nodes, secure: None };
        c.wait_leader(None, Duration::from_secs(20)).unwrap_or_else(|| c.fail("no leader"));
        c.wait_formed(Duration::from_secs(20));
        c
    }

    /// Starts one node per namespace of `net` (node `i` in namespace `i`, on
    /// its address, ports 7070 and 7071) and waits until one leads and serves.
    /// Plaintext with `--insecure`: the bridge is a network of the test's own,
    /// and what it tests (a minority grants nothing) does not depend on TLS.
    pub fn start_in(net: &super::netns::Net) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |i: usize, port: u16| SocketAddr::new(net.addr(i).parse().expect("ip"), port);
        let peers = (1..=net.nodes).map(|i| format!("{i}={}", at(i, 7070))).collect::<Vec<_>>().join(",");
        let mut nodes = Vec::new();
        for i in 1..=net.nodes {
            let mut node = new_node(&dir, i as u64, at(i, 7070), at(i, 7071), Boot::Peers(peers.clone()));
            node.ns = Some(net.ns(i));
            nodes.push(node);
        }
        for node in &mut nodes {
            node.spawn();
        }
        let c = Cluster { dir, nodes, secure: None };
        c.wait_leader(None, Duration::from_secs(20)).unwrap_or_else(|| c.fail("no leader"));
        c
    }

    /// The client URL: every node, comma-separated.
    pub fn urls(&self) -> String {
        let scheme = if self.secure.is_some() { "https" } else { "http" };
        self.nodes.iter().map(|n| format!("{scheme}://{}", n.grpc)).collect::<Vec<_>>().join(",")
    }

    /// The admin addresses, comma-separated (for `fencelock cluster --admin`).
    pub fn admins(&self) -> String {
        self.nodes.iter().map(|n| n.http.to_string()).collect::<Vec<_>>().join(",")
    }

    /// The index of the node that leads and serves now, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| n.serves())
    }

    /// The index of the serving leader, or a failure that says `when`.
    pub fn must_lead(&self, when: &str) -> usize {
        self.leader().unwrap_or_else(|| self.fail(&format!("no leader {when}")))
    }

    /// SIGKILLs the leader and waits (up to 10 s) until another node leads.
    pub fn kill_leader(&mut self) -> LeaderKill {
        let old = self.must_lead("before the kill");
        let old_id = self.nodes[old].id;
        let at = tokio::time::Instant::now();
        self.nodes[old].kill();
        let (new, took) = self
            .wait_leader(Some(old_id), Duration::from_secs(10))
            .unwrap_or_else(|| self.fail("no new leader after the kill"));
        LeaderKill { old, new, took, at }
    }

    /// Waits up to `within` for a serving leader other than node id `not`;
    /// returns its index and how long it took.
    pub fn wait_leader(&self, not: Option<u64>, within: Duration) -> Option<(usize, Duration)> {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Some(i) = self.nodes.iter().position(|n| Some(n.id) != not && n.serves()) {
                return Some((i, start.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Starts node `id` with `--join` on free ports (and a peer port, in a
    /// secure group) and adds it with `fencelock cluster add` through the
    /// admin endpoints; returns its index.
    pub fn add(&mut self, id: u64) -> usize {
        let mut node = new_node(&self.dir, id, local(), local(), Boot::Join);
        node.secure = self.secure.clone();
        node.peer = self.secure.as_ref().map(|_| local());
        node.spawn();
        // As an operator does: the node is up before it is added. (A group
        // commits the change without it, and on the segment log fast enough
        // to come back before the new process listens.)
        if !node.answers_within(Duration::from_secs(20)) {
            panic!("node {id} never answered on its admin port:\n{}", node.log_text());
        }
        let mut args = vec!["add".to_string(), id.to_string(), node.grpc.to_string()];
        if let Some(p) = node.peer {
            args.extend(["--peer-addr".into(), p.to_string()]);
        }
        self.nodes.push(node);
        let out = self.cluster_cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "cluster add {id}: {}\n{}", super::stderr(&out), self.logs());
        self.nodes.len() - 1
    }

    /// `fencelock cluster ARGS… --admin <every node>` (over TLS with the admin
    /// token, in a secure group).
    pub fn cluster_cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin());
        cmd.arg("cluster").args(args).args(["--admin", &self.admins()]).env_remove("FENCELOCK_AUTH_TOKEN");
        if let Some(s) = &self.secure {
            cmd.args(["--tls-ca", s.ca().to_str().unwrap()]).env("FENCELOCK_AUTH_TOKEN", &s.admin_token);
        }
        cmd.output().expect("run fencelock cluster")
    }

    /// `fencelock ARGS…` as a client: over TLS with the client token, in a
    /// secure group.
    pub fn client_cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin());
        cmd.args(args).env_remove("FENCELOCK_AUTH_TOKEN").env_remove("FENCELOCK_SERVER");
        if let Some(s) = &self.secure {
            cmd.args(["--tls-ca", s.ca().to_str().unwrap()]).env("FENCELOCK_AUTH_TOKEN", &s.client_token);
        }
        cmd.output().expect("run fencelock")
    }

    /// The voter ids in the status of the node at `i`.
    pub fn voters(&self, i: usize) -> Vec<u64> {
        let s = self.nodes[i].status().unwrap_or_else(|| self.fail("no status"));
        s["members"]
            .as_array()
            .expect("members")
            .iter()
            .filter(|m| m["voter"] == true)
            .map(|m| m["id"].as_u64().unwrap())
            .collect()
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {} ---\n{}", n.id, tail(&n.log_text(), 40)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn fail(&self, why: &str) -> ! {
        panic!("{why}\n{}", self.logs())
    }
}

/// Default timeouts: heartbeat 50 ms, election 150–300 ms. A liveness bound
/// for a new leader after the old one dies: the group elects one, and not
/// only after the tests' generous waits. How fast (the 2 s; a few
/// hundred ms on a quiet machine) is a measurement, not a test's: the
/// fault-injection report's heal column for leader kills (L1 in
/// `docs/safety.md`). A loaded CI machine once took 3.4 s for one of twenty
/// elections here.
pub const NEW_LEADER_WITHIN: Duration = Duration::from_secs(6);

/// A client of every node (over TLS with the client token, in a secure group).
pub async fn client(c: &Cluster) -> Client {
    let mut b = Client::builder(c.urls()).rpc_timeout(Duration::from_secs(5));
    if let Some(s) = &c.secure {
        b = b.tls(ClientTls::from_files(&s.ca(), None, None).expect("the CA")).token(s.client_token.clone());
    }
    b.connect().await.expect("connect to the group")
}

/// TTL of the lock held through the faults. Its lease must outlive each
/// leaderless window: keep-alives go every TTL/3, so a window up to 2/3 of it
/// (4 s) is survived. With 3 s, debug-built nodes starved of CPU (the whole
/// suite on 2 cores) sometimes took over 2 s to elect a leader, and the lease
/// was rightly lost (1 run in 10–20 of twenty_leader_changes_in_a_row).
pub const HELD_TTL: Duration = Duration::from_secs(6);

pub async fn hold(client: &Client, name: &str) -> Guard {
    let opts = LockOptions::default().ttl(HELD_TTL);
    match client.lock(name).options(opts).acquire().await.expect("acquire") {
        Outcome::Acquired(g) => g,
        other => panic!("{name}: {other:?}"),
    }
}

/// INV-11: the holder is not told of a loss while its lease lives.
pub async fn assert_not_lost(held: &Guard) {
    if held.is_lost() {
        panic!("INV-11: the held lease was reported lost: {:?}", held.lost().await);
    }
}

/// The token of `name`'s holder as node `i` sees it.
pub fn holder_token(c: &Cluster, i: usize, name: &str) -> Option<u64> {
    let (code, body) = c.nodes[i].admin_get(&format!("/v1/locks/{name}")).ok()?;
    if code != 200 {
        return None;
    }
    super::id(&serde_json::from_str::<serde_json::Value>(&body).ok()?["holder"]["token"])
}

/// One acquire → release of `name`; the token, or `None` if the group could
/// not be reached in time (a fail-over in progress).
pub async fn cycle(client: &Client, name: &str) -> Option<u64> {
    let opts = LockOptions::default().ttl(Duration::from_secs(2)).wait(Duration::from_secs(3));
    match client.lock(name).options(opts).acquire().await {
        Ok(Outcome::Acquired(g)) => {
            let t = g.token().unwrap();
            let _ = g.release().await;
            Some(t)
        }
        _ => None,
    }
}

pub fn assert_increasing(tokens: &[u64]) {
    for w in tokens.windows(2) {
        assert!(w[0] < w[1], "INV-2: token {} after {}: {tokens:?}", w[1], w[0]);
    }
}

fn new_node(dir: &tempfile::TempDir, id: u64, grpc: SocketAddr, http: SocketAddr, boot: Boot) -> Node {
    let data = dir.path().join(format!("n{id}"));
    let log = dir.path().join(format!("n{id}.log"));
    Node { id, grpc, http, peer: None, data, log, boot, ns: None, secure: None, child: None }
}

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
