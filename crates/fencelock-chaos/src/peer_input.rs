//! P1, peer input (issue 14, part 1): the nemesis sends malformed and forged
//! Raft messages to the native server's gRPC port during the run, in seeded
//! rounds, as anyone who reaches that port can. Each round holds, shuffled:
//! - for each of `append_entries`, `vote` and `install_snapshot`, the
//!   framed `append_entries_v2` and `install_snapshot_v2` (the message's JSON
//!   as the frame's head), and the first frame of an `append_entries_stream`:
//!   a payload that is not JSON, one that is a
//!   message's JSON cut short, and one with a structural byte replaced (never
//!   valid JSON, see [`mutate`]);
//! - an `AppendEntriesV2` whose head is well-formed but whose entry does not
//!   decode;
//! - an `InstallSnapshot` whose snapshot data does not decode, or describes
//!   another point of the log than its meta;
//! - a forged, well-formed `InstallSnapshot` (a rollback): from a leader that is
//!   not the target node, of a term above the node's (so that the server's
//!   snapshot checks are reached: a lower vote is answered without them), for a
//!   point of the log far ahead of its own, holding an empty engine. Installed,
//!   it would send the token counter back to 0 (sent only once the server has
//!   issued a token); and the same as an `InstallSnapshotV2`, its data in the
//!   frame.
//!
//! The server must refuse every message (INVALID_ARGUMENT, counted in
//! `fencelock_peer_messages_refused_total`) and keep serving; the usual checks
//! (token order, no stale accept, final object, heal after each round) apply as
//! in every run. Evidence: `refused`, the metric's increase over the run,
//! recorded only if it equals the number of messages sent and every answer was
//! a refusal; `serving`, the same server process healthy at the end.
//!
//! Under `--tls` the messages go over TLS from a connection presenting node
//! 2's certificate of the cluster CA (a member, as far as the server can
//! tell), so that they pass the membership check and reach the decoder and the
//! snapshot checks as they do in plaintext.
//!
//! Not sent: well-formed `AppendEntries` or `Vote` requests of a higher term, or
//! a vote of the node's own term by another leader. P1's sender speaks as a
//! peer (in plaintext anyone does; under TLS it has a member's certificate):
//! the former would move its term and disrupt its leadership, and for the
//! latter openraft's vote comparison panics (it assumes two committed leaders
//! of one term cannot exist). Under TLS only members speak Raft: P2 ([`crate::peer_tls`]) sends
//! well-formed higher-term messages from non-members, which must be refused
//! before they are decoded. The (a) payloads here are built from messages of
//! term 0 and never decode anyway.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use fencelock_proto::raft::{raft_client::RaftClient, RaftFrame, RaftPayload};
use fencelock_server::raft::{Member, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership, Vote};
use prost::Message as _;
use serde_json::json;
use tonic::transport::Channel;
use tonic::Code;

use crate::ctx::{evidence, fault, pause_between_faults, Ctx};
use crate::http;
use crate::metrics::metrics_text;
use crate::targets::Target;
use fencelock_http::prometheus;

/// Index of the forged snapshots' last log entry: beyond any run's log.
const FAR_AHEAD: u64 = 1 << 40;
/// Bytes a peer message never starts with in JSON.
const NOT_JSON_START: &[u8] = b"\x00\xff<#x";
/// Bytes never valid where a `:`, `,`, `}` or `]` stands outside a string.
const NOT_STRUCTURAL: &[u8] = b";#=";

/// The Raft RPC a message goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
    /// `AppendEntriesV2`: the payload is an encoded `RaftFrame`.
    AppendEntriesV2,
    /// `InstallSnapshotV2`: the payload is an encoded `RaftFrame`.
    InstallSnapshotV2,
    /// `AppendEntriesStream`: the payload is an encoded `RaftFrame`, the
    /// first message of a stream of its own.
    AppendEntriesStream,
}

/// What is wrong with a message.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Defect {
    NotJson(Rpc),
    Truncated(Rpc),
    Mutated(Rpc),
    BadSnapshotData,
    Rollback,
    /// An `AppendEntriesV2` whose entry does not decode.
    BadEntry,
    /// The rollback as an `InstallSnapshotV2`.
    FramedRollback,
}

impl Defect {
    fn rpc(self) -> Rpc {
        match self {
            Defect::NotJson(r) | Defect::Truncated(r) | Defect::Mutated(r) => r,
            Defect::BadSnapshotData | Defect::Rollback => Rpc::InstallSnapshot,
            Defect::BadEntry => Rpc::AppendEntriesV2,
            Defect::FramedRollback => Rpc::InstallSnapshotV2,
        }
    }

    fn name(self) -> String {
        match self {
            Defect::NotJson(r) => format!("not-json {r:?}"),
            Defect::Truncated(r) => format!("truncated {r:?}"),
            Defect::Mutated(r) => format!("mutated {r:?}"),
            Defect::BadSnapshotData => "bad-snapshot-data".into(),
            Defect::Rollback => "rollback-snapshot".into(),
            Defect::BadEntry => "bad-entry AppendEntriesV2".into(),
            Defect::FramedRollback => "rollback-snapshot InstallSnapshotV2".into(),
        }
    }
}

/// What the server's admin port shows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    pub(crate) node_id: u64,
    pub(crate) term: u64,
    pub(crate) tokens_issued: u64,
    pub(crate) refused: u64,
}

pub(crate) async fn view(admin: SocketAddr) -> anyhow::Result<View> {
    let r = http::request(admin, "GET", "/healthz", &[], b"", Duration::from_secs(5)).await?;
    anyhow::ensure!(r.status == 200, "healthz: {} {}", r.status, r.text());
    let h: serde_json::Value = serde_json::from_slice(&r.body).context("healthz")?;
    let text = metrics_text(admin).await.context("no metrics")?;
    let num = |name: &str| prometheus::value(&text, name).with_context(|| format!("no metric {name}"));
    Ok(View {
        node_id: h["node_id"].as_u64().context("healthz: no node_id")?,
        term: h["term"].as_u64().context("healthz: no term")?,
        tokens_issued: num("fencelock_tokens_issued")?,
        refused: num("fencelock_peer_messages_refused_total")?,
    })
}

/// Answers to the messages sent.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    refused: u64,
    /// Per defect: messages not refused, with how they were answered.
    other: BTreeMap<String, String>,
}

/// P1: rounds of malformed and forged messages, 0.3–1 s apart, until the end.
pub async fn p1_peer_input(ctx: &mut Ctx) -> anyhow::Result<()> {
    let Target::Native { grpc, http: admin, server, .. } = &ctx.target else {
        anyhow::bail!("P1 needs the native server")
    };
    let (grpc, admin, pid) = (*grpc, *admin, server.pid());
    let first = view(admin).await?;
    let mut peer = match &ctx.secure {
        // Under TLS only a member gets past the check to the decoder: speak as
        // node 2 (the server is node 1).
        Some(s) => s.member_raft_client(grpc, 2).await.context("connect with node 2's certificate")?,
        None => RaftClient::connect(format!("http://{grpc}")).await?,
    };
    let mut tally = Tally::default();
    let mut round = 0u64;
    while !ctx.over() {
        pause_between_faults(ctx, 300, 1000).await;
        if ctx.over() {
            break;
        }
        let now = match view(admin).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "P1: the server does not answer; no more rounds");
                break;
            }
        };
        round += 1;
        let defects = defects(ctx, &now);
        fault(ctx, "start", "server", json!({ "round": round, "messages": defects.len() }));
        let sent_before = tally.sent;
        for d in defects {
            let json = message(ctx, &now, grpc, d);
            tally.sent += 1;
            match send(&mut peer, d.rpc(), json).await {
                Err(s) if s.code() == Code::InvalidArgument => tally.refused += 1,
                other => {
                    let answer =
                        other.map_or_else(|s| format!("{:?}: {}", s.code(), s.message()), |_| "answered".into());
                    tally.other.insert(d.name(), answer);
                }
            }
        }
        fault(ctx, "end", "server", serde_json::Value::Null);
        evidence(ctx, "peer-messages", tally.sent - sent_before, "server", json!({ "round": round, "term": now.term }));
    }
    finish(ctx, admin, pid, &first, &tally).await;
    Ok(())
}

/// The end of P1: `refused` if the server counted exactly the messages sent
/// and refused every one; `serving` if the same process is healthy.
async fn finish(ctx: &mut Ctx, admin: SocketAddr, pid: Option<u32>, first: &View, tally: &Tally) {
    let last = view(admin).await;
    let counted = last.as_ref().map_or(0, |v| v.refused - first.refused);
    let detail = json!({
        "sent": tally.sent, "refused_answers": tally.refused, "metric_increase": counted, "not_refused": tally.other,
    });
    if tally.sent > 0 && tally.refused == tally.sent && counted == tally.sent {
        evidence(ctx, "refused", counted, "server", detail);
    } else {
        tracing::warn!(%detail, "P1: not every message was refused and counted");
        evidence(ctx, "not-refused", tally.sent.saturating_sub(tally.refused.min(counted)), "server", detail);
    }
    let same = match &mut ctx.target {
        Target::Native { server, .. } => server.exited().is_none() && server.pid() == pid,
        _ => false,
    };
    match last {
        Ok(v) if same => evidence(ctx, "serving", 1, "server", json!({ "pid": pid, "term": [first.term, v.term] })),
        Ok(_) => tracing::warn!("P1: the server process changed during the run"),
        Err(e) => tracing::warn!(error = %e, "P1: the server is not serving at the end"),
    }
}

/// One round's defects, shuffled; the rollback only once the server has
/// issued a token (an empty engine is not below a fresh one).
fn defects(ctx: &mut Ctx, now: &View) -> Vec<Defect> {
    let mut v = Vec::new();
    for rpc in [
        Rpc::AppendEntries,
        Rpc::Vote,
        Rpc::InstallSnapshot,
        Rpc::AppendEntriesV2,
        Rpc::InstallSnapshotV2,
        Rpc::AppendEntriesStream,
    ] {
        v.extend([Defect::NotJson(rpc), Defect::Truncated(rpc), Defect::Mutated(rpc)]);
    }
    v.extend([Defect::BadSnapshotData, Defect::BadEntry]);
    if now.tokens_issued > 0 {
        v.extend([Defect::Rollback, Defect::FramedRollback]);
    }
    ctx.rng.shuffle(&mut v);
    v
}

/// The payload of one message with defect `d` to the node `now` describes:
/// for a framed call, the JSON built as for its plain call, framed (see [`frame`]).
pub(crate) fn message(ctx: &mut Ctx, now: &View, grpc: SocketAddr, d: Defect) -> Vec<u8> {
    let json = match d {
        Defect::BadEntry => {
            let head = harmless(Rpc::AppendEntries, now, grpc);
            // Field 31 of wire type 7: no protobuf message starts so.
            let mut entry = vec![0xff];
            entry.extend((0..ctx.rng.usize(0..32)).map(|_| ctx.rng.u8(..)));
            return RaftFrame { head, entries: vec![entry], data: Vec::new() }.encode_to_vec();
        }
        Defect::FramedRollback => message_json(ctx, now, grpc, Defect::Rollback),
        d => message_json(ctx, now, grpc, d),
    };
    match d.rpc() {
        Rpc::AppendEntriesV2 | Rpc::InstallSnapshotV2 | Rpc::AppendEntriesStream => frame(json),
        _ => json,
    }
}

/// A framed call's payload from its JSON: a snapshot request's chunk moves
/// into the frame; anything else (a malformed head included) is the head.
pub(crate) fn frame(json: Vec<u8>) -> Vec<u8> {
    let frame = match serde_json::from_slice::<InstallSnapshotRequest<TypeConfig>>(&json) {
        Ok(mut req) => {
            let data = std::mem::take(&mut req.data);
            let head = serde_json::to_vec(&req).expect("a Raft message serializes");
            RaftFrame { head, entries: Vec::new(), data }
        }
        Err(_) => RaftFrame { head: json, entries: Vec::new(), data: Vec::new() },
    };
    frame.encode_to_vec()
}

/// The JSON of one message with defect `d` (a plain call's).
fn message_json(ctx: &mut Ctx, now: &View, grpc: SocketAddr, d: Defect) -> Vec<u8> {
    let rng = &mut ctx.rng;
    match d {
        Defect::NotJson(_) => {
            let mut b = vec![NOT_JSON_START[rng.usize(..NOT_JSON_START.len())]];
            b.extend((0..rng.usize(0..64)).map(|_| rng.u8(..)));
            b
        }
        Defect::Truncated(rpc) => {
            let json = harmless(rpc, now, grpc);
            // A strict prefix of a JSON object is never JSON: it closes only at its last byte.
            json[..rng.usize(..json.len())].to_vec()
        }
        Defect::Mutated(rpc) => mutate(rng, &harmless(rpc, now, grpc)),
        Defect::BadSnapshotData => {
            let term = now.term + rng.u64(1..=3);
            let leader = other_node(now);
            let at = far_ahead(term, leader);
            let good = snapshot_data(at, &membership(now, grpc));
            let data = match rng.u8(..4) {
                0 => (0..rng.usize(1..256)).map(|_| rng.u8(..)).collect(),
                1 => good[..rng.usize(..good.len())].to_vec(),
                2 => br#"{"engine":1}"#.to_vec(),
                // Decodes, but describes another point of the log than its meta.
                _ => snapshot_data(LogId { index: FAR_AHEAD - 1, ..at }, &membership(now, grpc)),
            };
            snapshot_request(term, leader, now, grpc, data)
        }
        Defect::Rollback | Defect::FramedRollback => {
            let term = now.term + rng.u64(1..=3);
            let leader = other_node(now);
            let data = snapshot_data(far_ahead(term, leader), &membership(now, grpc));
            snapshot_request(term, leader, now, grpc, data)
        }
        Defect::BadEntry => unreachable!("framed by message()"),
    }
}

/// A well-formed `Vote` or `AppendEntries` (empty, no previous entry; framed
/// for `AppendEntriesV2`) from another node at `term`: heard from a member, a `term` above the node's
/// makes it step down and take that term.
pub(crate) fn higher_term(rpc: Rpc, term: u64, now: &View) -> Vec<u8> {
    let leader = other_node(now);
    let json = match rpc {
        Rpc::AppendEntries => serde_json::to_vec(&AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(term, leader),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }),
        Rpc::Vote => serde_json::to_vec(&VoteRequest { vote: Vote::new(term, leader), last_log_id: None }),
        Rpc::AppendEntriesV2 | Rpc::AppendEntriesStream => return frame(higher_term(Rpc::AppendEntries, term, now)),
        Rpc::InstallSnapshot | Rpc::InstallSnapshotV2 => {
            unreachable!("a snapshot is built by message(.., Defect::Rollback or FramedRollback)")
        }
    };
    json.expect("a Raft message serializes")
}

/// A node id that is not the target's.
fn other_node(now: &View) -> u64 {
    now.node_id + 1
}

/// A well-formed message of term 0 for `rpc`, below any vote the node has: the
/// base of the payloads cut short or mutated.
fn harmless(rpc: Rpc, now: &View, grpc: SocketAddr) -> Vec<u8> {
    let leader = other_node(now);
    let json = match rpc {
        Rpc::AppendEntries | Rpc::AppendEntriesV2 | Rpc::AppendEntriesStream => {
            serde_json::to_vec(&AppendEntriesRequest::<TypeConfig> {
                vote: Vote::new_committed(0, leader),
                prev_log_id: None,
                entries: Vec::new(),
                leader_commit: None,
            })
        }
        Rpc::Vote => serde_json::to_vec(&VoteRequest { vote: Vote::new(0, leader), last_log_id: None }),
        Rpc::InstallSnapshot | Rpc::InstallSnapshotV2 => {
            let data = snapshot_data(far_ahead(0, leader), &membership(now, grpc));
            return snapshot_request(0, leader, now, grpc, data);
        }
    };
    json.expect("a Raft message serializes")
}

fn far_ahead(term: u64, leader: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, leader), FAR_AHEAD)
}

/// The node alone as voter, at its gRPC address.
fn membership(now: &View, grpc: SocketAddr) -> StoredMembership<u64, Member> {
    let nodes = BTreeMap::from([(now.node_id, Member::new(grpc.to_string()))]);
    StoredMembership::new(None, Membership::new(vec![[now.node_id].into()], nodes))
}

/// Snapshot data in the server's format: an empty engine at `at`.
fn snapshot_data(at: LogId<u64>, membership: &StoredMembership<u64, Member>) -> Vec<u8> {
    let payload = json!({ "last_applied": at, "last_membership": membership, "engine": fencelock_core::Engine::new() });
    serde_json::to_vec(&payload).expect("a snapshot serializes")
}

/// An `InstallSnapshot` in one chunk from `leader` at `term`, for the point
/// `far_ahead(term, leader)`, carrying `data`.
fn snapshot_request(term: u64, leader: u64, now: &View, grpc: SocketAddr, data: Vec<u8>) -> Vec<u8> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let meta = SnapshotMeta {
        last_log_id: Some(far_ahead(term, leader)),
        last_membership: membership(now, grpc),
        snapshot_id: format!("chaos-p1-{id}"),
    };
    let req = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        meta,
        offset: 0,
        data,
        done: true,
    };
    serde_json::to_vec(&req).expect("a Raft message serializes")
}

/// `json` with one structural byte outside its strings (`:`, `,`, `}`, `]`)
/// replaced by one of [`NOT_STRUCTURAL`]: no longer JSON, whichever is drawn.
fn mutate(rng: &mut fastrand::Rng, json: &[u8]) -> Vec<u8> {
    let spots = structural(json);
    let mut out = json.to_vec();
    if let Some(&at) = spots.get(rng.usize(..spots.len().max(1))) {
        out[at] = NOT_STRUCTURAL[rng.usize(..NOT_STRUCTURAL.len())];
    }
    out
}

/// Offsets of `:`, `,`, `}` and `]` outside strings.
fn structural(json: &[u8]) -> Vec<usize> {
    let (mut in_string, mut escaped, mut spots) = (false, false, Vec::new());
    for (i, &b) in json.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b':' | b',' | b'}' | b']' => spots.push(i),
            _ => {}
        }
    }
    spots
}

/// Sends one payload (a framed call's: an encoded `RaftFrame`); the server's
/// answer, or its refusal.
pub(crate) async fn send(peer: &mut RaftClient<Channel>, rpc: Rpc, payload: Vec<u8>) -> Result<(), tonic::Status> {
    fn timed<T>(message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        req.set_timeout(Duration::from_secs(5));
        req
    }
    let framed =
        || RaftFrame::decode(payload.as_slice()).map_err(|e| tonic::Status::internal(format!("P1's frame: {e}")));
    match rpc {
        Rpc::AppendEntriesV2 => peer.append_entries_v2(timed(framed()?)).await.map(drop),
        Rpc::InstallSnapshotV2 => peer.install_snapshot_v2(timed(framed()?)).await.map(drop),
        Rpc::AppendEntries => peer.append_entries(timed(RaftPayload { json: payload })).await.map(drop),
        Rpc::Vote => peer.vote(timed(RaftPayload { json: payload })).await.map(drop),
        Rpc::InstallSnapshot => peer.install_snapshot(timed(RaftPayload { json: payload })).await.map(drop),
        Rpc::AppendEntriesStream => {
            let first = async {
                let mut answers =
                    peer.append_entries_stream(tonic::codegen::tokio_stream::iter([framed()?])).await?.into_inner();
                match answers.message().await? {
                    Some(_) => Ok(()),
                    None => Err(tonic::Status::internal("the append stream ended without an answer")),
                }
            };
            let late = |_| tonic::Status::deadline_exceeded("no answer on the append stream within 5 s");
            tokio::time::timeout(Duration::from_secs(5), first).await.map_err(late)?
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> View {
        View { node_id: 1, term: 3, tokens_issued: 5, refused: 0 }
    }

    fn addr() -> SocketAddr {
        "127.0.0.1:7070".parse().unwrap()
    }

    /// INV-9 is what P1 probes: every malformed payload it sends must be one
    /// the server's decoder refuses, else the `refused` count could not match.
    /// No cut or mutation of a real message, and no non-JSON bytes, decode.
    #[test]
    fn malformed_payloads_never_decode() {
        let mut rng = fastrand::Rng::with_seed(7);
        for rpc in [Rpc::AppendEntries, Rpc::Vote, Rpc::InstallSnapshot] {
            let base = harmless(rpc, &view(), addr());
            assert!(serde_json::from_slice::<serde_json::Value>(&base).is_ok(), "the base is JSON");
            assert!(!structural(&base).is_empty());
            for _ in 0..500 {
                let cut = &base[..rng.usize(..base.len())];
                assert!(serde_json::from_slice::<serde_json::Value>(cut).is_err(), "{}", String::from_utf8_lossy(cut));
                let m = mutate(&mut rng, &base);
                assert!(serde_json::from_slice::<serde_json::Value>(&m).is_err(), "{}", String::from_utf8_lossy(&m));
            }
        }
    }

    /// A framed call carries what the plain one does: a snapshot request's
    /// chunk moves into the frame (its head then carries none, as the server
    /// requires), and malformed JSON is the head, byte for byte, so that the
    /// server's head decoder refuses it.
    #[test]
    fn frames_carry_what_the_plain_calls_do() {
        let v = view();
        let data = snapshot_data(far_ahead(v.term + 1, other_node(&v)), &membership(&v, addr()));
        let json = snapshot_request(v.term + 1, other_node(&v), &v, addr(), data.clone());
        let framed = RaftFrame::decode(frame(json).as_slice()).unwrap();
        assert_eq!(framed.data, data);
        let head: InstallSnapshotRequest<TypeConfig> = serde_json::from_slice(&framed.head).unwrap();
        assert!(head.data.is_empty() && framed.entries.is_empty());
        let cut = harmless(Rpc::AppendEntries, &v, addr());
        let cut = cut[..cut.len() / 2].to_vec();
        let framed = RaftFrame::decode(frame(cut.clone()).as_slice()).unwrap();
        assert_eq!((framed.head, framed.data, framed.entries), (cut, vec![], vec![]));
    }

    /// Escaped quotes do not end a string: a `:` inside one is not structural.
    #[test]
    fn structural_bytes_skip_strings() {
        assert_eq!(structural(br#"{"a\":,}":[1,2]}"#), vec![9, 12, 14, 15]);
    }

    /// The rollback is a message the server would otherwise act on: a vote of
    /// a later term from another node, at a point far ahead of its log.
    #[test]
    fn the_rollback_is_well_formed_and_from_a_later_term() {
        let v = view();
        let data = snapshot_data(far_ahead(v.term + 1, other_node(&v)), &membership(&v, addr()));
        let json = snapshot_request(v.term + 1, other_node(&v), &v, addr(), data);
        let req: InstallSnapshotRequest<TypeConfig> = serde_json::from_slice(&json).unwrap();
        assert!(req.vote > Vote::new_committed(v.term, v.node_id));
        assert_eq!(req.meta.last_log_id.map(|l| l.index), Some(FAR_AHEAD));
        let payload: serde_json::Value = serde_json::from_slice(&req.data).unwrap();
        assert_eq!(payload["last_applied"], serde_json::to_value(req.meta.last_log_id).unwrap());
    }
}
