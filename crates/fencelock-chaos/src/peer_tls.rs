//! P2, forged peer under TLS (issue 15): the native server runs with TLS and
//! an auth file (workers connect with `fencelock+tls://…?ca=…&token=…`, the
//! harness reads its admin port over TLS with the token). In seeded rounds,
//! 0.3–1 s apart, the nemesis sends WELL-FORMED Raft messages that would do
//! harm if heard, built by P1's builders ([`crate::peer_input`]):
//! - a `Vote` and an `AppendEntries` from another node of a term far above the
//!   node's (heard, they make it step down and take that term);
//! - the forged rollback `InstallSnapshot` of P1 (installed, it would send the
//!   token counter back to 0; sent once the server has issued a token),
//! - the same `AppendEntries` and rollback as framed calls (`AppendEntriesV2`,
//!   `InstallSnapshotV2`), and the `AppendEntries` on an `AppendEntriesStream`,
//!
//! each from two senders that are not members: (a) a TLS connection without a
//! client certificate, (b) one with the client certificate of the client CA
//! (a fresh connection per sender and round, so each round handshakes again).
//!
//! Every message must be refused with UNAUTHENTICATED (counted in
//! `fencelock_peer_messages_refused_total`), and the node's term, read from
//! `/v1/cluster` with the admin token before the run, at every round and at
//! the end, must never move. Evidence: `refused`, recorded only if every
//! answer was UNAUTHENTICATED and the metric rose by exactly the number sent;
//! `term-unmoved`, only if every term read equals the first; `serving`, the
//! same server process healthy at the end. The usual checks (token order, no
//! stale accept, heal after each round) apply as in every run.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tonic::Code;

use crate::ctx::{evidence, fault, pause_between_faults, Ctx};
use crate::http;
use crate::peer_input::{higher_term, message, send, view, Defect, Rpc, View};
use crate::secure::Sender;
use crate::targets::Target;

/// How far above the node's term the forged messages are (at least).
const FAR_ABOVE: u64 = 1_000;

/// The node's term as `/v1/cluster` shows it (an admin call: the token).
async fn cluster_term(admin: SocketAddr) -> anyhow::Result<u64> {
    let r = http::request(admin, "GET", "/v1/cluster", &[], b"", Duration::from_secs(5)).await?;
    anyhow::ensure!(r.status == 200, "/v1/cluster: {} {}", r.status, r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).context("/v1/cluster")?;
    v["term"].as_u64().context("/v1/cluster: no term")
}

/// One forged message: who sends it and what.
#[derive(Debug, Clone, Copy)]
struct Forged {
    sender: Sender,
    rpc: Rpc,
}

#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    refused: u64,
    /// Messages not refused UNAUTHENTICATED, with their answer.
    other: Vec<String>,
    /// Every term read from `/v1/cluster`, in order.
    terms: Vec<u64>,
}

/// P2: rounds of forged, well-formed peer messages from non-members.
pub async fn p2_forged_peer(ctx: &mut Ctx) -> anyhow::Result<()> {
    let Target::Native { grpc, http: admin, server, .. } = &ctx.target else {
        anyhow::bail!("P2 needs the native server")
    };
    let (grpc, admin, pid) = (*grpc, *admin, server.pid());
    let secure = ctx.secure.clone().context("P2 needs the server run with TLS and auth")?;
    let first = view(admin).await?;
    let mut tally = Tally { terms: vec![cluster_term(admin).await?], ..Tally::default() };
    let mut round = 0u64;
    while !ctx.over() {
        pause_between_faults(ctx, 300, 1000).await;
        if ctx.over() {
            break;
        }
        let (now, term) = match (view(admin).await, cluster_term(admin).await) {
            (Ok(v), Ok(t)) => (v, t),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "P2: the server does not answer; no more rounds");
                break;
            }
        };
        tally.terms.push(term);
        round += 1;
        let mut batch = Vec::new();
        for sender in [Sender::NoCert, Sender::ClientCert] {
            let rpcs = [
                Rpc::Vote,
                Rpc::AppendEntries,
                Rpc::InstallSnapshot,
                Rpc::AppendEntriesV2,
                Rpc::InstallSnapshotV2,
                Rpc::AppendEntriesStream,
            ];
            for rpc in rpcs {
                if matches!(rpc, Rpc::InstallSnapshot | Rpc::InstallSnapshotV2) && now.tokens_issued == 0 {
                    continue;
                }
                batch.push(Forged { sender, rpc });
            }
        }
        ctx.rng.shuffle(&mut batch);
        fault(ctx, "start", "server", json!({ "round": round, "messages": batch.len(), "term": term }));
        let sent_before = tally.sent;
        let mut peers = [None, None];
        for f in batch {
            let json = forged(ctx, &now, grpc, f.rpc);
            let slot = &mut peers[f.sender as usize];
            if slot.is_none() {
                *slot = Some(
                    secure.raft_client(grpc, f.sender).await.with_context(|| format!("connect as {:?}", f.sender))?,
                );
            }
            let peer = slot.as_mut().expect("connected");
            tally.sent += 1;
            match send(peer, f.rpc, json).await {
                Err(s) if s.code() == Code::Unauthenticated => tally.refused += 1,
                other => {
                    let answer =
                        other.map_or_else(|s| format!("{:?}: {}", s.code(), s.message()), |_| "answered".into());
                    tally.other.push(format!("round {round}, {:?} from {:?}: {answer}", f.rpc, f.sender));
                }
            }
        }
        fault(ctx, "end", "server", serde_json::Value::Null);
        evidence(ctx, "forged-messages", tally.sent - sent_before, "server", json!({ "round": round, "term": term }));
    }
    finish(ctx, admin, pid, &first, &mut tally).await;
    Ok(())
}

/// A well-formed message for `rpc` that would do harm if heard.
fn forged(ctx: &mut Ctx, now: &View, grpc: SocketAddr, rpc: Rpc) -> Vec<u8> {
    match rpc {
        Rpc::Vote | Rpc::AppendEntries | Rpc::AppendEntriesV2 | Rpc::AppendEntriesStream => {
            let term = now.term + FAR_ABOVE + ctx.rng.u64(0..FAR_ABOVE);
            higher_term(rpc, term, now)
        }
        Rpc::InstallSnapshot => message(ctx, now, grpc, Defect::Rollback),
        Rpc::InstallSnapshotV2 => message(ctx, now, grpc, Defect::FramedRollback),
    }
}

/// `refused`, `term-unmoved` and `serving`, each only if it holds.
async fn finish(ctx: &mut Ctx, admin: SocketAddr, pid: Option<u32>, first: &View, tally: &mut Tally) {
    let last = view(admin).await;
    match cluster_term(admin).await {
        Ok(t) => tally.terms.push(t),
        Err(e) => tracing::warn!(error = %e, "P2: no term at the end"),
    }
    let counted = last.as_ref().map_or(0, |v| v.refused - first.refused);
    let detail = json!({
        "sent": tally.sent, "unauthenticated_answers": tally.refused, "metric_increase": counted,
        "not_refused": tally.other.iter().take(10).collect::<Vec<_>>(),
    });
    if tally.sent > 0 && tally.refused == tally.sent && counted == tally.sent {
        evidence(ctx, "refused", counted, "server", detail);
    } else {
        tracing::warn!(%detail, "P2: not every forged message was refused and counted");
        evidence(ctx, "not-refused", tally.sent.saturating_sub(tally.refused.min(counted)), "server", detail);
    }
    let t0 = tally.terms[0];
    let moved: Vec<u64> = tally.terms.iter().copied().filter(|&t| t != t0).collect();
    let terms = json!({ "first": t0, "reads": tally.terms.len(), "moved_to": moved });
    if moved.is_empty() && tally.terms.len() > 2 {
        evidence(ctx, "term-unmoved", tally.terms.len() as u64, "server", terms);
    } else {
        tracing::warn!(%terms, "P2: the node's term moved (or was not read)");
        evidence(ctx, "term-moved", moved.len() as u64, "server", terms);
    }
    let same = match &mut ctx.target {
        Target::Native { server, .. } => server.exited().is_none() && server.pid() == pid,
        _ => false,
    };
    match last {
        Ok(v) if same => evidence(ctx, "serving", 1, "server", json!({ "pid": pid, "term": [first.term, v.term] })),
        Ok(_) => tracing::warn!("P2: the server process changed during the run"),
        Err(e) => tracing::warn!(error = %e, "P2: the server is not serving at the end"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_server::raft::TypeConfig;
    use openraft::raft::{AppendEntriesRequest, VoteRequest};
    use openraft::Vote;

    /// The forged Vote and AppendEntries decode as the server would decode
    /// them, from another node, of a term far above the node's: what a member
    /// would be heeded for.
    #[test]
    fn forged_messages_are_well_formed_and_far_above() {
        let now = View { node_id: 1, term: 3, tokens_issued: 5, refused: 0 };
        let term = now.term + FAR_ABOVE;
        let ours = Vote::new_committed(now.term, now.node_id);
        let v: VoteRequest<u64> = serde_json::from_slice(&higher_term(Rpc::Vote, term, &now)).unwrap();
        assert_eq!((v.vote.leader_id().term, v.vote.leader_id().voted_for()), (term, Some(2)));
        assert!(v.vote > ours);
        let a: AppendEntriesRequest<TypeConfig> =
            serde_json::from_slice(&higher_term(Rpc::AppendEntries, term, &now)).unwrap();
        assert!(a.vote > ours && a.vote.is_committed());
    }
}
