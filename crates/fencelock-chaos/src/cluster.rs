//! fencelock as a 3-node Raft group (backend `fencelock3`): its nodes, their
//! proxies, and the questions the nemesis of its scenarios asks (who leads,
//! cut a node's links). The nemesis itself is in `cluster_faults`.
//!
//! Every node's Raft traffic to each peer goes through a TCP proxy of its own
//! (`FENCELOCK_PEER_ROUTES`, which `fencelock-chaos serve` turns into the
//! server's `peer_routes`), so one direction between
//! two nodes can be cut: isolating a node holds every proxy to and from it (a
//! black hole whose bytes flow on, late, when it heals). Clients talk to the
//! nodes directly, with all three addresses: the old leader stays reachable
//! to them, as in a partial partition, and must grant nothing meanwhile.
//!
//! Under `--tls` ([`Secure`]) every node serves TLS with its own node
//! certificate and the run's auth file, and speaks Raft on a peer port of its
//! own (`--peer-listen`, listed in `--peers` as `ID=CLIENT/PEER`): the proxies
//! then carry the peers' mutually authenticated TLS, byte for byte. The
//! harness's admin calls (`/v1/cluster` for readiness, `/healthz`) go over
//! TLS with the admin token; clients use the worker token.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use fencelock_testkit::proxy::{Mode, Proxy};

use crate::http;
use crate::procs::{cluster_node, free_addr, ServerProc};
use crate::secure::Secure;

/// Nodes of the group.
pub const NODES: u64 = 3;

/// One node: its process and its addresses.
pub struct Node {
    pub id: u64,
    pub server: ServerProc,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

/// A running group with a proxy per direction between every two nodes.
pub struct Cluster {
    pub nodes: Vec<Node>,
    /// `(from, to)` → the proxy carrying `from`'s Raft traffic to `to`.
    links: BTreeMap<(u64, u64), Proxy>,
}

impl Cluster {
    /// Starts the nodes (each with `env` and the extra `serve` arguments
    /// `serve_args`; with `secure`, TLS, the auth file and a peer port each),
    /// waits until one leads and serves.
    pub async fn start(
        dir: &Path,
        env: Vec<(String, String)>,
        serve_args: &[String],
        secure: Option<&Secure>,
    ) -> anyhow::Result<Cluster> {
        let peer_port = || secure.map(|_| free_addr());
        let addrs: Vec<(u64, SocketAddr, SocketAddr, Option<SocketAddr>)> =
            (1..=NODES).map(|id| (id, free_addr(), free_addr(), peer_port())).collect();
        let entry = |g: &SocketAddr, p: &Option<SocketAddr>| p.map_or_else(|| g.to_string(), |p| format!("{g}/{p}"));
        let peers = addrs.iter().map(|(id, g, _, p)| format!("{id}={}", entry(g, p))).collect::<Vec<_>>().join(",");
        let mut links = BTreeMap::new();
        for (from, _, _, _) in &addrs {
            for (to, grpc, _, peer) in &addrs {
                if from != to {
                    links.insert((*from, *to), Proxy::start(peer.unwrap_or(*grpc)).await);
                }
            }
        }
        let mut nodes = Vec::new();
        for (id, grpc, http, peer) in addrs {
            let routes: Vec<String> =
                links.iter().filter(|((f, _), _)| *f == id).map(|((_, t), p)| format!("{t}={}", p.addr())).collect();
            let data = dir.join(format!("node{id}-data"));
            let mut server = cluster_node(&data, id, &peers, grpc, http, dir.join(format!("node{id}.log")));
            server.args.extend_from_slice(serve_args);
            if let (Some(s), Some(peer)) = (secure, peer) {
                server.args.extend(s.serve_args(&dir.join(format!("node{id}{}", crate::secure::AUDIT_SUFFIX))));
                server.args.extend(["--peer-listen".into(), peer.to_string()]);
                s.register_admin(http)?;
            }
            server.env.extend(env.iter().cloned());
            server.env.insert("FENCELOCK_PEER_ROUTES".into(), routes.join(","));
            nodes.push(Node { id, server, grpc, http });
        }
        for n in &mut nodes {
            n.server.start().await?;
        }
        let c = Cluster { nodes, links };
        c.wait_leader(None, Duration::from_secs(30)).await.context("the group elected no leader")?;
        Ok(c)
    }

    /// Every node's client address.
    pub fn grpc(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.grpc).collect()
    }

    /// Every node, as a plaintext backend URL: `fencelock://a,b,c`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.grpc().iter().map(SocketAddr::to_string).collect();
        format!("fencelock://{}", hosts.join(","))
    }

    /// The index of the node that leads and serves (`/healthz` 200), if any.
    pub async fn leader(&self) -> Option<usize> {
        for (i, n) in self.nodes.iter().enumerate() {
            if serves(n.http).await {
                return Some(i);
            }
        }
        None
    }

    /// Waits up to `within` for a serving leader other than node `not`.
    pub async fn wait_leader(&self, not: Option<u64>, within: Duration) -> Option<(usize, Duration)> {
        let start = tokio::time::Instant::now();
        while start.elapsed() < within {
            for (i, n) in self.nodes.iter().enumerate() {
                if Some(n.id) != not && serves(n.http).await {
                    return Some((i, start.elapsed()));
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    /// Every link to and from node `id` to `mode`.
    pub fn set_links(&self, id: u64, mode: Mode) {
        for ((from, to), p) in &self.links {
            if *from == id || *to == id {
                p.set_mode(mode);
            }
        }
    }

    /// Every link open, every node running.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        for p in self.links.values() {
            p.set_mode(Mode::Pass);
        }
        for n in &mut self.nodes {
            if n.server.exited().is_some() || n.server.pid().is_none() {
                n.server.start().await?;
            }
        }
        Ok(())
    }
}

async fn serves(http_addr: SocketAddr) -> bool {
    let r = http::request(http_addr, "GET", "/healthz", &[], b"", Duration::from_millis(500)).await;
    r.is_ok_and(|r| r.status == 200)
}
