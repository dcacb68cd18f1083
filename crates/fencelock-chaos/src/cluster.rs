//! fencelock as a 3-node Raft group (backend `fencelock3`) and the nemesis of
//! its scenarios: L1 leader kills, L2 leader isolation, L3 one node cut off
//! (the leader or a follower: a minority of one, a majority of two).
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

use anyhow::{bail, Context};
use fencelock_testkit::proxy::{Mode, Proxy};
use serde_json::json;

use crate::http;
use crate::nemesis::{evidence, fault, pause_between_faults};
use crate::procs::{cluster_node, free_addr, ServerProc};
use crate::run::Ctx;
use crate::secure::Secure;
use crate::targets::Target;

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

fn cluster(ctx: &mut Ctx) -> anyhow::Result<&mut Cluster> {
    match &mut ctx.target {
        Target::Cluster(c) => Ok(c),
        _ => bail!("{} needs the fencelock3 backend", ctx.spec.scenario),
    }
}

/// L1: every 1–3 s the leader is SIGKILLed; once another node leads (the
/// time it took is the evidence), it is started again on its data.
pub async fn l1_leader_kills(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 1000, 3000).await;
        let c = cluster(ctx)?;
        let Some(i) = c.leader().await else { continue };
        let id = c.nodes[i].id;
        let pid = c.nodes[i].server.kill();
        fault(ctx, "start", &format!("node{id}"), json!({ "leader": id, "pid": pid }));
        evidence(ctx, "leader-killed", 1, &format!("node{id}"), json!({ "pid": pid }));
        let c = cluster(ctx)?;
        let elected = c.wait_leader(Some(id), Duration::from_secs(10)).await;
        let restarted = c.nodes[i].server.start().await;
        if let Some((new, took)) = elected {
            let new_id = cluster(ctx)?.nodes[new].id;
            evidence(ctx, "new-leader", 1, &format!("node{new_id}"), json!({ "ms": took.as_millis() as u64 }));
        }
        restarted?;
        fault(ctx, "end", &format!("node{id}"), serde_json::Value::Null);
    }
    Ok(())
}

/// L2: the leader is cut off from both peers (its links held) for 1–3 s
/// beyond the election of a new leader, then healed; the held bytes flow on.
pub async fn l2_leader_isolation(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 1000, 3000).await;
        let c = cluster(ctx)?;
        let Some(i) = c.leader().await else { continue };
        let id = c.nodes[i].id;
        isolate(ctx, id, "leader").await?;
    }
    Ok(())
}

/// L3: one node, drawn at random (the leader or a follower), is cut off from
/// the other two for 1–3 s beyond any election it causes, then healed.
pub async fn l3_partitions(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 1000, 3000).await;
        let id = ctx.rng.u64(1..=NODES);
        let c = cluster(ctx)?;
        let role = match c.leader().await.map(|i| c.nodes[i].id) {
            Some(l) if l == id => "leader",
            _ => "follower",
        };
        isolate(ctx, id, role).await?;
    }
    Ok(())
}

async fn isolate(ctx: &mut Ctx, id: u64, role: &str) -> anyhow::Result<()> {
    let keep = Duration::from_millis(ctx.rng.u64(1000..=3000));
    let target = format!("node{id}");
    cluster(ctx)?.set_links(id, Mode::Hold);
    fault(ctx, "start", &target, json!({ "isolated": id, "role": role, "ms": keep.as_millis() as u64 }));
    evidence(ctx, "isolated", 1, &target, json!({ "role": role }));
    if role == "leader" {
        if let Some((new, took)) = cluster(ctx)?.wait_leader(Some(id), Duration::from_secs(10)).await {
            let new_id = cluster(ctx)?.nodes[new].id;
            evidence(ctx, "new-leader", 1, &format!("node{new_id}"), json!({ "ms": took.as_millis() as u64 }));
        }
    }
    tokio::time::sleep(keep).await;
    cluster(ctx)?.set_links(id, Mode::Pass);
    fault(ctx, "end", &target, serde_json::Value::Null);
    Ok(())
}
