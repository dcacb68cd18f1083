//! Raft traffic between members over gRPC (`fencelock.raft.v1.Raft`).
//!
//! Each RPC carries one openraft message as JSON in a `RaftPayload`; the answer is
//! the JSON of `Result<response, RaftError>` as returned by the callee's
//! `openraft::Raft`. The two messages that carry bulk go as a `RaftFrame`
//! instead (`AppendEntriesV2`, `InstallSnapshotV2`): the request's JSON without
//! its bulk, then each log entry in the log's binary codec 2
//! (`codec`: about a third of its JSON, and cheaper to encode and
//! decode on both sides) or the snapshot chunk as raw bytes (JSON spells each
//! byte as a number, up to 4 characters). A connection sends V2 first; a peer
//! that answers UNIMPLEMENTED (an older fencelock) gets the JSON call from then
//! on, so a group may be upgraded one node at a time. The appends of one
//! replication go on one long-lived `AppendEntriesStream` (each frame
//! answered before the next is sent, as openraft sends them), so that a
//! message costs HTTP/2 no new stream: its headers, its trailers and the
//! service's dispatch per message were most of a follower's HTTP/2 time. A
//! peer that answers the stream UNIMPLEMENTED gets `AppendEntriesV2` calls,
//! as above; a stream that fails or times out is dropped and the next append
//! opens another. A received frame is
//! decoded and checked as strictly as the JSON (every entry through the
//! log's own decoder, a head that carries bulk of its own refused) and a
//! snapshot chunk goes through the same [`snapshot_rx`] checks.
//!
//! A snapshot is sent by openraft's `Chunked` (the default
//! `RaftNetwork::full_snapshot`): each `InstallSnapshot` carries one chunk
//! (`snapshot_max_chunk_size`) read from the snapshot's file
//! ([`super::snapshot_data`]); the receiver writes it into a file of its
//! own ([`snapshot_rx`]). Neither side holds the whole snapshot in memory.
//!
//! Client side: [`Network`] (the `RaftNetworkFactory`) hands out
//! [`NetworkConnection`]s to `http://{node.addr}`. Channels are created lazily
//! (no I/O until the first call), shared per address across connections, and
//! reconnect by themselves. Each call is bounded by the `RPCOption` hard TTL.
//!
//! With TLS ([`crate::access::tls`]) peers are dialled over `https://`, presenting the
//! node's certificate, and [`RaftService`] serves a call only on a connection
//! that presented a node certificate of the cluster CA: anyone else gets
//! UNAUTHENTICATED, and the call never reaches Raft.
//!
//! Server side: [`RaftService`] implements the generated service trait by calling
//! the local `openraft::Raft`. Mount it with [`RaftService::into_server`], which
//! raises tonic's 4 MiB message limit to [`MAX_MESSAGE_BYTES`].
#![allow(clippy::result_large_err)] // openraft's error types are large by design

use crate::raft::Member;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock_proto::raft::raft_client::RaftClient;
use fencelock_proto::raft::raft_server::{Raft as RaftRpc, RaftServer};
use fencelock_proto::raft::{RaftFrame, RaftPayload};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::RPCTypes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status, Streaming};

use super::{codec, snapshot_rx, NodeId, SharedEngine, TypeConfig};
use crate::access::{conn_limits::ConnInfo, tls::ServerTls};
use crate::metrics::Metrics;

/// Largest gRPC message between members, both ways. Snapshot chunks travel as raw
/// bytes in a `RaftFrame`, but as JSON arrays of numbers (up to ~4 bytes per
/// byte) to an older peer, so keep openraft's `snapshot_max_chunk_size` well
/// under a quarter of this.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The bound on each `InstallSnapshot` call (openraft's
/// `install_snapshot_timeout`, whose default is 200 ms). The call that carries
/// the last chunk returns only once the follower has checked and installed the
/// whole snapshot: about 3 s at a million leases on 2 cores, growing with the
/// state. A bound shorter than that never lets a large snapshot in: the
/// leader gives up on the last chunk and starts the snapshot over, again and
/// again (found by `fencelock-bench catchup`: 200,000 leases, 210 starts in
/// 5 minutes, never installed). A follower that stops answering in the middle
/// of a snapshot holds only its own replication this long.
pub const SNAPSHOT_CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Metadata naming the node a Raft message is meant for. A node refuses a
/// message for another id: two members configured with one address (a wrong
/// `--peers`) would otherwise talk to themselves as if to a peer.
pub const TARGET_HEADER: &str = "fencelock-raft-target";

/// TCP connect timeout of peer channels.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The `RaftNetworkFactory`: one per Raft node.
#[derive(Clone, Debug)]
pub struct Network {
    /// This node's id (reported in timeout errors).
    id: NodeId,
    /// One lazily connecting channel per peer address, shared by connections,
    /// with the TLS generation it was made with.
    channels: Arc<Mutex<HashMap<String, (Channel, u64)>>>,
    /// TLS to peers, if on.
    tls: Option<Arc<ServerTls>>,
    /// Peer id → the address to dial it at instead of its own (see
    /// [`crate::Config::peer_routes`]).
    routes: Arc<std::collections::BTreeMap<NodeId, String>>,
}

impl Network {
    /// A factory for node `id`, dialling peers with `tls` if given.
    pub fn new(id: NodeId, tls: Option<Arc<ServerTls>>) -> Self {
        Self { id, channels: Arc::new(Mutex::new(HashMap::new())), tls, routes: Arc::default() }
    }

    /// Dial peer `id` at `routes[id]` instead of its own address.
    pub fn with_routes(mut self, routes: std::collections::BTreeMap<NodeId, String>) -> Self {
        self.routes = Arc::new(routes);
        self
    }

    /// The channel to `addr`; made anew after the certificates were reloaded.
    fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let tls = self.tls.as_ref().map(|t| t.peer_client());
        let generation = tls.as_ref().map_or(0, |(_, g)| *g);
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((c, g)) = channels.get(addr) {
            if *g == generation {
                return Ok(c.clone());
            }
        }
        let endpoint = peer_endpoint(addr, tls.map(|(config, _)| config))?;
        let channel = endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).connect_lazy();
        channels.insert(addr.to_string(), (channel.clone(), generation));
        Ok(channel)
    }
}

/// The endpoint of a peer's gRPC port: `https://` presenting this node's
/// certificate when `tls` is given, else `http://`.
pub(crate) fn peer_endpoint(
    addr: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<Endpoint, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?;
    match tls {
        Some(config) => endpoint.tls_config(config),
        None => Ok(endpoint),
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = NetworkConnection;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Self::Network {
        // A route of `Config::peer_routes` (e.g. a fault proxy for this direction).
        let addr = self.routes.get(&target).cloned().unwrap_or_else(|| node.peer().to_string());
        // An unparsable address is reported on every call (as Unreachable) rather
        // than here, where errors cannot be returned.
        let client = self.channel(&addr).map(|ch| {
            RaftClient::new(ch)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        });
        NetworkConnection {
            id: self.id,
            target,
            node: node.clone(),
            client: client.map_err(|e| format!("bad address {:?} of node {target}: {e}", node.addr)),
            frames: true,
            streams: true,
            stream: None,
        }
    }
}

/// A client to one peer.
pub struct NetworkConnection {
    id: NodeId,
    target: NodeId,
    node: Member,
    client: Result<RaftClient<Channel>, String>,
    /// Whether the peer takes `RaftFrame`s (until it answers UNIMPLEMENTED).
    frames: bool,
    /// Whether the peer takes `AppendEntriesStream` (until it answers UNIMPLEMENTED).
    streams: bool,
    /// The open `AppendEntriesStream`, if any: dropped on any error or
    /// timeout (an answer that comes late must not answer the next message),
    /// opened again by the next append.
    stream: Option<AppendStream>,
}

/// This side of an `AppendEntriesStream`: where the messages go, and where
/// their answers come from, in order.
struct AppendStream {
    messages: tokio::sync::mpsc::Sender<RaftFrame>,
    answers: Streaming<RaftPayload>,
}

/// What a call sends: a JSON payload (the method chosen by its kind), or the
/// frame of a V2 call.
enum Outgoing {
    Json(RaftPayload),
    Append(RaftFrame),
    Snapshot(RaftFrame),
}

/// Why a call did not produce the remote's answer.
enum CallError {
    Timeout(Duration),
    Unreachable(Status),
    Network(Status),
    BadAddress(String),
    BadJson(serde_json::Error),
    /// A log entry this node could not encode.
    BadEntry(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Timeout(d) => write!(f, "timed out after {d:?}"),
            CallError::Unreachable(s) | CallError::Network(s) => write!(f, "{s}"),
            CallError::BadAddress(s) => write!(f, "{s}"),
            CallError::BadJson(e) => write!(f, "{e}"),
            CallError::BadEntry(e) => write!(f, "{e}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl NetworkConnection {
    /// Sends `req` as JSON with the method chosen by `kind`, within `ttl`, and
    /// decodes the callee's `Result<Resp, E>`.
    async fn call<Req, Resp>(&mut self, kind: RPCTypes, req: &Req, ttl: Duration) -> Result<Resp, CallError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let json = serde_json::to_vec(req).map_err(CallError::BadJson)?;
        self.send(kind, Outgoing::Json(RaftPayload { json }), ttl).await
    }

    /// Sends `frame` with the V2 method of `kind` while the peer takes frames;
    /// else, or once it answers UNIMPLEMENTED, `req` as JSON.
    async fn call_framed<Req, Resp>(
        &mut self,
        kind: RPCTypes,
        req: &Req,
        frame: impl FnOnce() -> Result<Outgoing, CallError>,
        ttl: Duration,
    ) -> Result<Resp, CallError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        if self.frames {
            let out = match frame()? {
                Outgoing::Append(f) if self.streams => match self.ready_stream(ttl).await {
                    Ok(()) => return self.send_streamed(f, ttl).await,
                    Err(CallError::Network(s)) if s.code() == Code::Unimplemented => {
                        tracing::info!(
                            node_id = self.id,
                            peer = self.target,
                            "peer takes no append stream: a call per append"
                        );
                        self.streams = false;
                        Outgoing::Append(f)
                    }
                    Err(e) => return Err(e),
                },
                out => out,
            };
            match self.send(kind, out, ttl).await {
                Err(CallError::Network(s)) if s.code() == Code::Unimplemented => {
                    tracing::info!(node_id = self.id, peer = self.target, "peer takes no Raft frames: sending JSON");
                    self.frames = false;
                }
                other => return other,
            }
        }
        self.call(kind, req, ttl).await
    }

    /// Sends `out` with the method of `kind`, within `ttl`, and decodes the
    /// callee's `Result<Resp, E>`.
    async fn send<Resp: DeserializeOwned>(
        &mut self,
        kind: RPCTypes,
        out: Outgoing,
        ttl: Duration,
    ) -> Result<Resp, CallError> {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(msg) => return Err(CallError::BadAddress(msg.clone())),
        };
        let target = self.target;
        let request = |r| addressed(r, target, ttl);
        let frame = |r| addressed(r, target, ttl);
        let fut = async {
            match (kind, out) {
                (_, Outgoing::Append(f)) => client.append_entries_v2(frame(f)).await,
                (_, Outgoing::Snapshot(f)) => client.install_snapshot_v2(frame(f)).await,
                (RPCTypes::AppendEntries, Outgoing::Json(p)) => client.append_entries(request(p)).await,
                (RPCTypes::Vote, Outgoing::Json(p)) => client.vote(request(p)).await,
                (RPCTypes::InstallSnapshot, Outgoing::Json(p)) => client.install_snapshot(request(p)).await,
            }
        };
        let resp = match tokio::time::timeout(ttl, fut).await {
            Err(_elapsed) => return Err(CallError::Timeout(ttl)),
            Ok(Err(status)) if status.code() == Code::DeadlineExceeded => return Err(CallError::Timeout(ttl)),
            Ok(Err(status)) => return Err(status_error(status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        serde_json::from_slice(&resp.json).map_err(CallError::BadJson)
    }

    /// Opens the `AppendEntriesStream` unless it is open, within `ttl`.
    async fn ready_stream(&mut self, ttl: Duration) -> Result<(), CallError> {
        if self.stream.is_none() {
            let opened = tokio::time::timeout(ttl, self.open_stream()).await;
            self.stream = Some(opened.map_err(|_elapsed| CallError::Timeout(ttl))??);
        }
        Ok(())
    }

    /// Sends `frame` on the open `AppendEntriesStream` and reads its answer,
    /// within `ttl`. On any failure the stream is dropped: the next append
    /// opens a new one.
    async fn send_streamed<Resp: DeserializeOwned>(
        &mut self,
        frame: RaftFrame,
        ttl: Duration,
    ) -> Result<Resp, CallError> {
        let answer = match tokio::time::timeout(ttl, self.stream_round_trip(frame)).await {
            Err(_elapsed) => Err(CallError::Timeout(ttl)),
            Ok(answer) => answer,
        };
        if answer.is_err() {
            self.stream = None;
        }
        serde_json::from_slice(&answer?.json).map_err(CallError::BadJson)
    }

    /// One message and its answer on the open stream.
    async fn stream_round_trip(&mut self, frame: RaftFrame) -> Result<RaftPayload, CallError> {
        let gone = || CallError::Network(Status::unavailable("the peer ended the append stream"));
        let Some(stream) = self.stream.as_mut() else { return Err(gone()) };
        stream.messages.send(frame).await.map_err(|_| gone())?;
        match stream.answers.message().await {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err(gone()),
            Err(status) => Err(status_error(status)),
        }
    }

    /// Opens an `AppendEntriesStream` to the peer (no deadline of its own:
    /// each message has its caller's).
    async fn open_stream(&mut self) -> Result<AppendStream, CallError> {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(msg) => return Err(CallError::BadAddress(msg.clone())),
        };
        let (messages, outbound) = tokio::sync::mpsc::channel(1);
        let mut request = Request::new(tokio_stream::wrappers::ReceiverStream::new(outbound));
        request.metadata_mut().insert(TARGET_HEADER, self.target.into());
        let answers = client.append_entries_stream(request).await.map_err(status_error)?.into_inner();
        Ok(AppendStream { messages, answers })
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        kind: RPCTypes,
        err: CallError,
    ) -> RPCError<NodeId, Member, RaftError<NodeId, E>> {
        match err {
            CallError::Timeout(timeout) => {
                RPCError::Timeout(Timeout { action: kind, id: self.id, target: self.target, timeout })
            }
            CallError::Unreachable(s) => RPCError::Unreachable(Unreachable::new(&s)),
            CallError::BadAddress(m) => RPCError::Unreachable(Unreachable::new(&Msg(m))),
            CallError::Network(s) => RPCError::Network(NetworkError::new(&s)),
            CallError::BadJson(e) => RPCError::Network(NetworkError::new(&e)),
            CallError::BadEntry(m) => RPCError::Network(NetworkError::new(&Msg(m))),
        }
    }

    /// Maps the callee's answer: its own Raft error becomes a `RemoteError`.
    fn remote<Resp, E: std::error::Error>(
        &self,
        answer: Result<Resp, RaftError<NodeId, E>>,
    ) -> Result<Resp, RPCError<NodeId, Member, RaftError<NodeId, E>>> {
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new_with_node(self.target, self.node.clone(), e)))
    }
}

/// A call's error status, as [`CallError`]: connection refused or reset,
/// DNS, TLS... (UNAVAILABLE) is unreachable, so openraft backs off before
/// retrying; anything else a network error.
fn status_error(status: Status) -> CallError {
    match status.code() {
        Code::Unavailable => CallError::Unreachable(status),
        _ => CallError::Network(status),
    }
}

/// `message` for node `target` (see [`TARGET_HEADER`]), due within `ttl`.
fn addressed<T>(message: T, target: NodeId, ttl: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(ttl);
    request.metadata_mut().insert(TARGET_HEADER, target.into());
    request
}

/// `rpc` as a frame: its JSON without the entries, each entry in codec 2.
fn append_frame(rpc: &AppendEntriesRequest<TypeConfig>) -> Result<Outgoing, CallError> {
    let head = AppendEntriesRequest::<TypeConfig> {
        vote: rpc.vote,
        prev_log_id: rpc.prev_log_id,
        leader_commit: rpc.leader_commit,
        entries: Vec::new(),
    };
    let entries = rpc.entries.iter().map(codec::encode_entry).collect::<Result<Vec<_>, _>>();
    let entries = entries.map_err(|e| CallError::BadEntry(e.to_string()))?;
    let head = serde_json::to_vec(&head).map_err(CallError::BadJson)?;
    Ok(Outgoing::Append(RaftFrame { head, entries, data: Vec::new() }))
}

/// `rpc` as a frame: its JSON without the chunk, and the chunk.
fn snapshot_frame(rpc: &InstallSnapshotRequest<TypeConfig>) -> Result<Outgoing, CallError> {
    let head = InstallSnapshotRequest::<TypeConfig> {
        vote: rpc.vote,
        meta: rpc.meta.clone(),
        offset: rpc.offset,
        data: Vec::new(),
        done: rpc.done,
    };
    let head = serde_json::to_vec(&head).map_err(CallError::BadJson)?;
    Ok(Outgoing::Snapshot(RaftFrame { head, entries: Vec::new(), data: rpc.data.clone() }))
}

impl RaftNetwork<TypeConfig> for NetworkConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let kind = RPCTypes::AppendEntries;
        match self.call_framed(kind, &rpc, || append_frame(&rpc), option.hard_ttl()).await {
            Ok(answer) => self.remote(answer),
            Err(e) => Err(self.rpc_error(kind, e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>>
    {
        let kind = RPCTypes::InstallSnapshot;
        match self.call_framed(kind, &rpc, || snapshot_frame(&rpc), option.hard_ttl()).await {
            Ok(answer) => self.remote(answer),
            Err(e) => Err(self.rpc_error(kind, e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let kind = RPCTypes::Vote;
        match self.call(kind, &rpc, option.hard_ttl()).await {
            Ok(answer) => self.remote(answer),
            Err(e) => Err(self.rpc_error(kind, e)),
        }
    }
}

/// The gRPC service receiving Raft traffic from the other members. Every message
/// is input: one that does not decode, or a snapshot that [`snapshot_rx`] refuses,
/// gets an error and is counted; it never reaches the node's state.
#[derive(Clone)]
pub struct RaftService {
    raft: super::Raft,
    id: NodeId,
    engine: SharedEngine,
    metrics: Arc<Metrics>,
    snapshots: snapshot_rx::SharedReceiver,
    /// With TLS on: callers must present a node certificate.
    tls: Option<Arc<ServerTls>>,
    /// Where changes handed over by a follower go; `None`: none are taken.
    handover: Option<Arc<dyn Handover>>,
    /// Turns true on shutdown: open append streams end, so that a graceful
    /// shutdown does not wait for the leader to close them (it never would).
    stop: Option<tokio::sync::watch::Receiver<bool>>,
}

/// A change a follower hands over (see [`Handover`]).
#[derive(Debug, Clone, Copy)]
enum Handed {
    Members,
    Policy,
}

impl Handed {
    fn name(self) -> &'static str {
        match self {
            Handed::Members => "membership",
            Handed::Policy => "policy",
        }
    }
}

/// Where the leader's peer service hands what a follower forwards to it: a
/// membership change and a policy change, each as the JSON the follower sent
/// (decode it with [`decode_payload`], encode the answer with
/// [`encode_payload`]). The node passes it in ([`RaftService::with_handover`]);
/// the peer service itself only checks that the sender is a member.
#[tonic::async_trait]
pub trait Handover: Send + Sync {
    /// The JSON answer to a membership change. `INVALID_ARGUMENT`: the
    /// payload is malformed (the service counts it as refused).
    async fn change_members(&self, payload: &[u8]) -> Result<Vec<u8>, Status>;
    /// The JSON answer to a policy change, as [`Handover::change_members`].
    async fn change_policy(&self, payload: &[u8]) -> Result<Vec<u8>, Status>;
}

impl RaftService {
    /// The service of `raft`, whose state machine's engine is `engine`.
    pub fn new(raft: super::Raft, engine: SharedEngine, metrics: Arc<Metrics>) -> Self {
        let id = raft.metrics().borrow().id;
        Self { raft, id, engine, metrics, snapshots: Default::default(), tls: None, handover: None, stop: None }
    }

    /// Ends the open append streams once `stop` turns true (the node's shutdown).
    pub fn with_stop(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Serves only callers whose connection presented a node certificate of
    /// `tls`'s cluster CA (when `Some`).
    pub fn with_tls(mut self, tls: Option<Arc<ServerTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// Takes the membership and policy changes followers hand over, and
    /// passes them to `handover`.
    pub fn with_handover(mut self, handover: Arc<dyn Handover>) -> Self {
        self.handover = Some(handover);
        self
    }

    /// Passes a handed-over change to the [`Handover`]; a malformed one is
    /// refused and counted as [`RaftService::decode`] does.
    async fn hand_over(&self, request: Request<RaftPayload>, change: Handed) -> Result<Response<RaftPayload>, Status> {
        self.check_sender(&request)?;
        let Some(handover) = &self.handover else {
            return Err(Status::unavailable(format!("this node takes no {} changes", change.name())));
        };
        let payload = request.into_inner().json;
        let answer = match change {
            Handed::Members => handover.change_members(&payload).await,
            Handed::Policy => handover.change_policy(&payload).await,
        };
        let json = answer.inspect_err(|s| {
            if s.code() == Code::InvalidArgument {
                self.refused(s.message())
            }
        })?;
        Ok(Response::new(RaftPayload { json }))
    }

    /// Refuses a caller that is not a member (no node certificate), then a
    /// message meant for another node id.
    fn check_sender<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if self.tls.is_some() {
            let member = request.extensions().get::<ConnInfo>().map(|i| i.member.clone());
            if let Err(why) = member.unwrap_or_else(|| Err("no connection information".into())) {
                self.refused(&why);
                return Err(Status::unauthenticated(format!(
                    "Raft messages are accepted only from members of the group: {why}"
                )));
            }
        }
        self.check_target(request)
    }

    /// Decodes a peer message; one that does not decode is refused and counted.
    fn decode<T: DeserializeOwned>(&self, request: Request<RaftPayload>) -> Result<T, Status> {
        decode_request(request).inspect_err(|s| self.refused(s.message()))
    }

    /// Decodes a peer's `AppendEntriesV2` (or one message of its stream);
    /// refused and counted as [`RaftService::decode`].
    fn decode_append(&self, frame: RaftFrame) -> Result<AppendEntriesRequest<TypeConfig>, Status> {
        decode_append(frame).inspect_err(|s| self.refused(s.message()))
    }

    /// Serves one message of an `AppendEntriesStream`: decoded as a
    /// `AppendEntriesV2`, answered as one.
    async fn append_framed(&self, frame: RaftFrame) -> Result<RaftPayload, Status> {
        let rpc = self.decode_append(frame)?;
        let answer = self.raft.append_entries(rpc).await;
        encode_payload(&answer).map(|json| RaftPayload { json })
    }

    /// Decodes a peer's `InstallSnapshotV2`; refused and counted as [`RaftService::decode`].
    fn decode_snapshot(&self, request: Request<RaftFrame>) -> Result<InstallSnapshotRequest<TypeConfig>, Status> {
        decode_snapshot(request.into_inner()).inspect_err(|s| self.refused(s.message()))
    }

    /// Takes what this node accepts of a snapshot stream (see
    /// [`snapshot_rx::Limits`]; its default otherwise).
    pub fn with_snapshot_limits(mut self, limits: snapshot_rx::Limits) -> Self {
        self.snapshots = Arc::new(snapshot_rx::Receiver::new(limits));
        self
    }

    /// Installs (a chunk of) a snapshot once [`snapshot_rx`] accepts it.
    async fn install(&self, rpc: InstallSnapshotRequest<TypeConfig>) -> Result<Response<RaftPayload>, Status> {
        match self.snapshots.receive(&self.raft, &self.engine, rpc).await {
            Ok(answer) => encode_answer(&answer),
            Err(refused) => {
                let status = refusal(&refused);
                self.refused(status.message());
                Err(status)
            }
        }
    }

    fn refused(&self, why: &str) {
        self.metrics.peer_messages_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(node_id = self.id, why, "refused a Raft message from a peer");
    }

    /// Refuses a message meant for another node id (see [`TARGET_HEADER`]).
    fn check_target<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(v) = request.metadata().get(TARGET_HEADER) else { return Ok(()) };
        match v.to_str().ok().and_then(|s| s.parse::<NodeId>().ok()) {
            Some(t) if t == self.id => Ok(()),
            t => Err(Status::failed_precondition(format!(
                "this is node {}, not node {}: the sender has a wrong address for node {0} (check --peers and --advertise)",
                self.id,
                t.map(|t| t.to_string()).unwrap_or_else(|| "?".into()),
            ))),
        }
    }

    /// The tonic service to add to the server's router, with the message size limit
    /// raised to [`MAX_MESSAGE_BYTES`].
    pub fn into_server(self) -> RaftServer<RaftService> {
        RaftServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// The answer to a refused snapshot: INVALID_ARGUMENT for one this node may
/// not install, RESOURCE_EXHAUSTED for one that does not fit on its disk
/// (or found it full), INTERNAL for one it could not write otherwise; the
/// reason with its causes.
fn refusal(refused: &snapshot_rx::Refused) -> Status {
    let mut why = refused.to_string();
    let mut source = std::error::Error::source(refused);
    while let Some(cause) = source {
        why.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    match refused {
        snapshot_rx::Refused::Invalid { .. } => Status::invalid_argument(why),
        snapshot_rx::Refused::NoRoom { .. } => Status::resource_exhausted(why),
        snapshot_rx::Refused::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
            Status::resource_exhausted(why)
        }
        snapshot_rx::Refused::Io { .. } => Status::internal(why),
    }
}

fn decode_request<T: DeserializeOwned>(request: Request<RaftPayload>) -> Result<T, Status> {
    decode_payload(&request.into_inner().json)
}

/// A peer message's JSON payload, decoded; `INVALID_ARGUMENT` if malformed.
pub fn decode_payload<T: DeserializeOwned>(json: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(json).map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))
}

/// An answer to a peer, as JSON.
pub fn encode_payload<T: Serialize>(answer: &T) -> Result<Vec<u8>, Status> {
    serde_json::to_vec(answer).map_err(|e| Status::internal(format!("cannot encode raft answer: {e}")))
}

/// A frame's head: the JSON of a request that must carry its bulk in the frame.
fn frame_head<T: DeserializeOwned>(head: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(head).map_err(|e| Status::invalid_argument(format!("malformed raft frame head: {e}")))
}

fn decode_append(frame: RaftFrame) -> Result<AppendEntriesRequest<TypeConfig>, Status> {
    let mut rpc: AppendEntriesRequest<TypeConfig> = frame_head(&frame.head)?;
    if !rpc.entries.is_empty() || !frame.data.is_empty() {
        return Err(Status::invalid_argument("malformed raft frame: entries belong in the frame, not in its head"));
    }
    let entry = |i: usize| move || format!("entry {i} of a peer's AppendEntries");
    let entries = frame.entries.iter().enumerate().map(|(i, b)| codec::decode_entry(&entry(i), codec::CODEC_PROTO, b));
    rpc.entries = entries.collect::<Result<_, _>>().map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(rpc)
}

fn decode_snapshot(frame: RaftFrame) -> Result<InstallSnapshotRequest<TypeConfig>, Status> {
    let mut rpc: InstallSnapshotRequest<TypeConfig> = frame_head(&frame.head)?;
    if !rpc.data.is_empty() || !frame.entries.is_empty() {
        return Err(Status::invalid_argument("malformed raft frame: the chunk belongs in the frame, not in its head"));
    }
    rpc.data = frame.data;
    Ok(rpc)
}

/// The answers of an `AppendEntriesStream`, one per message.
pub type AppendAnswers = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftPayload, Status>> + Send>>;

fn encode_answer<T: Serialize>(answer: &T) -> Result<Response<RaftPayload>, Status> {
    encode_payload(answer).map(|json| Response::new(RaftPayload { json }))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.check_sender(&request)?;
        let rpc: AppendEntriesRequest<TypeConfig> = self.decode(request)?;
        let answer = self.raft.append_entries(rpc).await;
        encode_answer(&answer)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.check_sender(&request)?;
        let rpc: VoteRequest<NodeId> = self.decode(request)?;
        let answer = self.raft.vote(rpc).await;
        encode_answer(&answer)
    }

    async fn install_snapshot(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.check_sender(&request)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = self.decode(request)?;
        self.install(rpc).await
    }

    async fn append_entries_v2(&self, request: Request<RaftFrame>) -> Result<Response<RaftPayload>, Status> {
        self.check_sender(&request)?;
        self.append_framed(request.into_inner()).await.map(Response::new)
    }

    type AppendEntriesStreamStream = AppendAnswers;

    /// The sender is checked once, as the stream opens (its connection and
    /// target do not change); then each message is served as an
    /// `AppendEntriesV2`, in order, when the sender reads the answer before
    /// it (no task of its own: the stream's poll drives it). A message that
    /// is refused ends the stream with its error; so do the sender's end of
    /// it and this node's shutdown (between two messages).
    async fn append_entries_stream(
        &self,
        request: Request<Streaming<RaftFrame>>,
    ) -> Result<Response<AppendAnswers>, Status> {
        self.check_sender(&request)?;
        let (inbound, stop) = (request.into_inner(), self.stop.clone());
        let answers = futures::stream::unfold(Some((self.clone(), inbound, stop)), |open| async move {
            let (svc, mut inbound, mut stop) = open?;
            let stopping = async {
                match stop.as_mut() {
                    Some(stop) => drop(stop.wait_for(|s| *s).await),
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                biased;
                () = stopping => return None,
                next = inbound.message() => next,
            };
            let frame = match next {
                Ok(Some(frame)) => frame,
                Ok(None) => return None,
                Err(status) => return Some((Err(status), None)),
            };
            match svc.append_framed(frame).await {
                Ok(answer) => Some((Ok(answer), Some((svc, inbound, stop)))),
                Err(status) => Some((Err(status), None)),
            }
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn install_snapshot_v2(&self, request: Request<RaftFrame>) -> Result<Response<RaftPayload>, Status> {
        self.check_sender(&request)?;
        let rpc = self.decode_snapshot(request)?;
        self.install(rpc).await
    }

    async fn change_members(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.hand_over(request, Handed::Members).await
    }

    async fn change_policy(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.hand_over(request, Handed::Policy).await
    }
}
