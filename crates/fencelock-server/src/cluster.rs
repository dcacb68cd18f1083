//! Membership of the Raft group: who is in it, and adding or removing a node.
//!
//! Where it sits: called by the HTTP admin endpoint (`admin`:
//! `GET /v1/cluster`, `POST /v1/cluster/members`, `DELETE
//! /v1/cluster/members/{id}`) and by the peer service
//! ([`crate::raft::RaftService`]'s `ChangeMembers`), through which a follower
//! hands a change to the leader. Only the leader changes membership; a
//! follower's admin endpoint forwards the change once, to the leader it knows.
//!
//! Adding a node first makes it a learner and waits until it has caught up
//! with the log (so the group never counts on a voter that cannot vote yet),
//! then makes it a voter. Removing a node takes it out of the voters, then out
//! of the group; the leader may remove itself, and steps down once the new
//! membership is committed. Each step is one joint-consensus change of
//! openraft, durable before it is acknowledged.

use crate::access::tls::ServerTls;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};

use crate::raft::Member as Node;
use serde::{Deserialize, Serialize};

use crate::raft::{NodeId, Raft};

/// How long adding a node may wait for it to catch up before giving up.
pub(crate) const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// A change of membership, as the admin endpoint and the peer service take it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Change {
    /// Add node `id`, reachable by clients at `addr` (its gRPC port) and by
    /// peers at `peer_addr` (its `--peer-listen` port), or at `addr` too.
    Add {
        id: NodeId,
        addr: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer_addr: Option<String>,
    },
    /// Remove node `id` from the group.
    Remove { id: NodeId },
}

/// One member, as [`Status`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    /// Its gRPC address.
    pub addr: String,
    /// Its peer (Raft) address, when it has a port of its own for peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_addr: Option<String>,
    /// Voter (counts for the quorum) or learner (only receives the log).
    pub voter: bool,
    /// The last log index known to be replicated to it. Only the leader
    /// knows it (openraft's `RaftMetrics::replication` is `Some` on the leader
    /// alone): `None` in a follower's or learner's view, and in the leader's
    /// for a member that has not answered since this leader was elected.
    pub matched: Option<u64>,
}

/// What this node knows of the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub node_id: NodeId,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub state: String,
    pub leader: Option<NodeId>,
    /// The leader's gRPC address, if known.
    pub leader_addr: Option<String>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub last_applied: Option<u64>,
    pub members: Vec<Member>,
}

/// Why a membership change was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ClusterError {
    /// This node is not the leader; `leader` is the leader's `(id, gRPC address)`
    /// if known.
    #[error("not the leader{}", leader.as_ref().map(|(id, a)| format!("; the leader is node {id} at {a}")).unwrap_or_default())]
    NotLeader { leader: Option<(NodeId, String)> },
    /// The change makes no sense (unknown node, bad address, last voter).
    #[error("{0}")]
    Invalid(String),
    /// Raft could not make the change (no quorum, timed out, shutting down).
    #[error("membership change failed: {0}")]
    Failed(String),
}

/// The group as this node sees it now.
pub(crate) fn status(raft: &Raft) -> Status {
    let m = raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, node)| Member {
            id: *id,
            addr: node.addr.clone(),
            peer_addr: node.peer_addr.clone(),
            voter: voters.contains(id),
            matched: m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map(|l| l.index),
        })
        .collect();
    let leader_addr = m.current_leader.and_then(|l| membership.get_node(&l)).map(|n| n.addr.clone());
    Status {
        node_id: m.id,
        state: state_name(m.state).into(),
        leader: m.current_leader,
        leader_addr,
        term: m.current_term,
        last_log_index: m.last_log_index,
        last_applied: m.last_applied.map(|l| l.index),
        members,
    }
}

fn state_name(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// Makes `change` on this node, which must be the leader. Idempotent: adding
/// a voter that is already one (at the same address), or removing a node that
/// is not a member, succeeds and changes nothing.
pub(crate) async fn apply(raft: &Raft, change: &Change) -> Result<Status, ClusterError> {
    validate(change)?;
    // Ask Raft only as the leader: a follower's openraft may answer "a change
    // is in progress" (a membership it has not seen committed yet) before it
    // says it is not the leader, which would refuse a change the leader takes.
    let me = raft.metrics().borrow().id;
    match leader_within(raft, LEADER_WAIT).await {
        Some((id, _)) if id == me => {}
        Some(leader) => return Err(ClusterError::NotLeader { leader: Some(leader) }),
        None => return Err(ClusterError::Failed("no leader is known; try again once the group has one".into())),
    }
    let now = status(raft);
    match change {
        Change::Add { id, addr, peer_addr } => {
            add(raft, &now, *id, Node::with_peer(addr.clone(), peer_addr.clone())).await?
        }
        Change::Remove { id } => remove(raft, &now, *id).await?,
    }
    Ok(status(raft))
}

fn validate(change: &Change) -> Result<(), ClusterError> {
    let id = match change {
        Change::Add { id, addr, peer_addr } => {
            for a in std::iter::once(addr).chain(peer_addr) {
                if a.parse::<std::net::SocketAddr>().is_err() && !looks_like_host_port(a) {
                    return Err(ClusterError::Invalid(format!("address {a:?} is not host:port")));
                }
            }
            *id
        }
        Change::Remove { id } => *id,
    };
    if id == 0 {
        return Err(ClusterError::Invalid("node ids start at 1".into()));
    }
    Ok(())
}

/// `name:port` with a non-empty name and a port number.
fn looks_like_host_port(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && !h.contains('/') && p.parse::<u16>().is_ok())
}

async fn add(raft: &Raft, now: &Status, id: NodeId, node: Node) -> Result<(), ClusterError> {
    let addr = node.addr.clone();
    match now.members.iter().find(|m| m.id == id) {
        Some(m) if m.addr != node.addr || m.peer_addr != node.peer_addr => {
            return Err(ClusterError::Invalid(format!(
                "node {id} is already a member at {}; remove it first to move it",
                Node::with_peer(m.addr.clone(), m.peer_addr.clone())
            )))
        }
        Some(m) if m.voter => return Ok(()),
        _ => {}
    }
    // Blocking: returns once the learner has caught up with the leader's log.
    let learner = raft.add_learner(id, node, true);
    match tokio::time::timeout(CATCH_UP_TIMEOUT, learner).await {
        Err(_) => return Err(ClusterError::Failed(not_caught_up(&status(raft), id, &addr))),
        Ok(r) => r.map_err(write_error)?,
    };
    raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await.map_err(write_error)?;
    Ok(())
}

/// Why adding node `id` at `addr` gave up, from the leader's view `now`: a
/// learner that never answered is told apart from one that is merely slow
/// (a big state takes minutes to send), which stays a learner and goes on
/// catching up.
fn not_caught_up(now: &Status, id: NodeId, addr: &str) -> String {
    let waited = CATCH_UP_TIMEOUT.as_secs();
    let matched = now.members.iter().find(|m| m.id == id).and_then(|m| m.matched);
    match (matched, now.last_log_index) {
        (None, _) => format!(
            "node {id} at {addr} has not answered the leader within {waited} s: is it running, \
             reachable at that address, and started with an empty data dir and --join?"
        ),
        (Some(matched), last) => format!(
            "node {id} at {addr} is still catching up after {waited} s (it has the log up to index \
             {matched} of {}); it stays a learner and goes on catching up: run the same add again \
             once it has, to make it a voter (`fencelock cluster status`, asked of the leader, shows \
             its progress)",
            last.map_or_else(|| "none".to_string(), |l| l.to_string())
        ),
    }
}

async fn remove(raft: &Raft, now: &Status, id: NodeId) -> Result<(), ClusterError> {
    let Some(member) = now.members.iter().find(|m| m.id == id) else { return Ok(()) };
    if member.voter {
        let voters = now.members.iter().filter(|m| m.voter).count();
        if voters == 1 {
            return Err(ClusterError::Invalid(format!("node {id} is the last voter; a group cannot be empty")));
        }
        raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await.map_err(write_error)?;
    }
    if raft.metrics().borrow().membership_config.membership().get_node(&id).is_some() {
        let nodes = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
        match raft.change_membership(nodes, false).await {
            Ok(_) => {}
            // The leader removed itself and stepped down after the first step:
            // the node is out of the voters, which is what matters; the next
            // leader drops it from the nodes when asked again.
            Err(e) if id == now.node_id => tracing::info!(error = %e, "removed myself from the voters"),
            Err(e) => return Err(write_error(e)),
        }
    }
    Ok(())
}

/// How long a follower that knows no leader yet (the group just formed, or is
/// electing one) waits for one before it answers that there is none.
pub(crate) const LEADER_WAIT: Duration = Duration::from_secs(3);

/// The leader's id and peer address (where a follower hands a change), once
/// one is known, waiting up to `within`: this node itself, if it leads.
pub(crate) async fn leader_within(raft: &Raft, within: Duration) -> Option<(NodeId, String)> {
    let mut metrics = raft.metrics();
    let wait = async {
        loop {
            let leader = {
                let m = metrics.borrow_and_update();
                let node = |l: NodeId| m.membership_config.membership().get_node(&l).map(|n| (l, n.peer().to_string()));
                m.current_leader.and_then(node)
            };
            if leader.is_some() || metrics.changed().await.is_err() {
                return leader;
            }
        }
    };
    tokio::time::timeout(within, wait).await.ok().flatten()
}

fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> ClusterError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ClusterError::NotLeader {
            // Where a follower hands the change to: the leader's peer port.
            leader: f.leader_id.zip(f.leader_node.map(|n| n.peer().to_string())),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => ClusterError::Invalid(c.to_string()),
        RaftError::Fatal(f) => ClusterError::Failed(f.to_string()),
    }
}

/// The voters of a new group from `--peers`: id → `CLIENT` or `CLIENT/PEER`
/// address (see [`crate::config::peer_entry`]).
pub(crate) fn initial_members(peers: &BTreeMap<NodeId, String>) -> BTreeMap<NodeId, Node> {
    peers
        .iter()
        .map(|(id, entry)| {
            let (addr, peer) = crate::config::peer_entry(entry);
            (*id, Node::with_peer(addr, peer.map(str::to_string)))
        })
        .collect()
}

/// On a node that has data, `--peers` and `--join` do nothing: its membership
/// is in its log. Operators restart nodes with the command line they were
/// formed with, so a `--peers` that agrees with the stored membership is fine;
/// one that differs (the group changed since, or the flag is wrong) is named in
/// a warning; one that shares no member (same id, same address) with it means
/// this data dir is another group's, and is refused.
pub(crate) fn check_bootstrap_flags(raft: &Raft, config: &crate::Config) -> Result<(), crate::ServerError> {
    let peers = match &config.bootstrap {
        crate::Bootstrap::Peers(peers) => peers,
        crate::Bootstrap::Join => {
            tracing::info!("--join has no effect: this node has data, and its membership is in its log");
            return Ok(());
        }
        crate::Bootstrap::Single => return Ok(()),
    };
    let stored: BTreeMap<NodeId, String> = {
        let m = raft.metrics().borrow().membership_config.clone();
        // As `--peers` writes a member: CLIENT, or CLIENT/PEER with a peer port.
        let entry = |n: &Node| n.peer_addr.as_ref().map_or_else(|| n.addr.clone(), |p| format!("{}/{p}", n.addr));
        m.membership().nodes().map(|(id, n)| (*id, entry(n))).collect()
    };
    if &stored == peers {
        return Ok(());
    }
    let show = |m: &BTreeMap<NodeId, String>| m.iter().map(|(id, a)| format!("{id}={a}")).collect::<Vec<_>>().join(",");
    let (flag, data, dir) = (show(peers), show(&stored), config.data_dir.display());
    if !peers.iter().any(|(id, addr)| stored.get(id) == Some(addr)) {
        return Err(crate::ServerError::Config(format!(
            "--peers {flag} contradicts the data in {dir}, whose group is {data}: no member in common, so this \
             data dir is another group's. Point --data-dir at this node's data, or drop --peers"
        )));
    }
    tracing::warn!(
        "--peers {flag} differs from the membership in {dir} ({data}); the stored membership is used \
         (--peers only forms a new group; `fencelock cluster add/remove` changes it)"
    );
    Ok(())
}

/// A channel to the peer service of the leader at `addr` (its peer
/// address), for a follower that hands it a change; `Err`: why not.
pub(crate) async fn dial_leader(addr: &str, tls: Option<&ServerTls>) -> Result<tonic::transport::Channel, String> {
    let endpoint = crate::raft::network::peer_endpoint(addr, tls.map(|t| t.peer_client().0))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(3));
    endpoint.connect().await.map_err(|e| e.to_string())
}

/// Sends `change` to the leader at `leader_addr` (its gRPC address) over the
/// peer service, for a follower that was asked to make it.
pub(crate) async fn forward(
    leader_addr: &str,
    change: &Change,
    tls: Option<&ServerTls>,
) -> Result<Status, ClusterError> {
    use fencelock_proto::raft::raft_client::RaftClient;
    use fencelock_proto::raft::RaftPayload;
    let unreachable = |e: String| ClusterError::Failed(format!("cannot reach the leader at {leader_addr}: {e}"));
    let channel = dial_leader(leader_addr, tls).await.map_err(unreachable)?;
    let json = serde_json::to_vec(change).map_err(|e| ClusterError::Failed(e.to_string()))?;
    let mut req = tonic::Request::new(RaftPayload { json });
    req.set_timeout(CATCH_UP_TIMEOUT + Duration::from_secs(10));
    let answer =
        RaftClient::new(channel).change_members(req).await.map_err(|s| unreachable(s.message().to_string()))?;
    serde_json::from_slice::<Result<Status, ClusterError>>(&answer.into_inner().json)
        .map_err(|e| ClusterError::Failed(format!("malformed answer from the leader: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bad changes are refused before Raft sees them (INV-9).
    #[test]
    fn invalid_changes_are_refused_with_a_reason() {
        let bad = |c: Change| validate(&c).unwrap_err().to_string();
        assert!(bad(Change::Add { id: 0, addr: "127.0.0.1:1".into(), peer_addr: None }).contains("start at 1"));
        assert!(bad(Change::Add { id: 4, addr: "nope".into(), peer_addr: None }).contains("host:port"));
        assert!(bad(Change::Add { id: 4, addr: "http://a:1".into(), peer_addr: None }).contains("host:port"));
        assert!(bad(Change::Remove { id: 0 }).contains("start at 1"));
        assert!(validate(&Change::Add { id: 4, addr: "node-4.internal:7070".into(), peer_addr: None }).is_ok());
        assert!(validate(&Change::Add { id: 4, addr: "[::1]:7070".into(), peer_addr: None }).is_ok());
        let with_peer = |p: &str| Change::Add { id: 4, addr: "a:7070".into(), peer_addr: Some(p.into()) };
        assert!(validate(&with_peer("a:7073")).is_ok());
        assert!(bad(with_peer("a")).contains("host:port"));
    }

    /// The wire form the admin endpoint and the peer service share.
    #[test]
    fn changes_are_tagged_json() {
        let c: Change = serde_json::from_str(r#"{"op":"add","id":4,"addr":"127.0.0.1:7470"}"#).unwrap();
        assert_eq!(c, Change::Add { id: 4, addr: "127.0.0.1:7470".into(), peer_addr: None });
        let c: Change = serde_json::from_str(r#"{"op":"remove","id":2}"#).unwrap();
        assert_eq!(c, Change::Remove { id: 2 });
    }

    /// A learner that gave `cluster add` up is told apart from one that never
    /// answered: the slow one is still catching up, with its progress, and is
    /// not sent to check its data dir.
    #[test]
    fn a_slow_learner_is_not_taken_for_a_missing_one() {
        let member =
            |id, voter, matched| Member { id, addr: format!("127.0.0.1:{id}070"), peer_addr: None, voter, matched };
        let leader_view = |learner: Option<u64>| Status {
            node_id: 1,
            state: "leader".into(),
            leader: Some(1),
            leader_addr: Some("127.0.0.1:1070".into()),
            term: 3,
            last_log_index: Some(9_000),
            last_applied: Some(9_000),
            members: vec![member(1, true, Some(9_000)), member(4, false, learner)],
        };
        let silent = not_caught_up(&leader_view(None), 4, "127.0.0.1:4070");
        assert!(silent.contains("has not answered") && silent.contains("--join"), "{silent}");
        let slow = not_caught_up(&leader_view(Some(1_200)), 4, "127.0.0.1:4070");
        assert!(slow.contains("still catching up") && slow.contains("up to index 1200 of 9000"), "{slow}");
        assert!(slow.contains("run the same add again") && !slow.contains("--join"), "{slow}");
    }
}
