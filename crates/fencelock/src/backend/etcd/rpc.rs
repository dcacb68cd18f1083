//! The etcd connection of the etcd backend: the endpoints of the URL, with
//! fail-over between them, and one typed function per etcd call the recipe
//! makes, each bounded by a deadline, with failures mapped to
//! [`Error::Backend`] (`"etcd: what: code"`, the `tonic::Status` as its
//! source).
//!
//! Where it sits: under [`super::EtcdBackend`], which holds one [`Etcd`] in an
//! `Arc` shared by its guards, renewals and background cleanups. Calls go to
//! one endpoint at a time (see [`Etcd::connect`]); nothing here retries a call:
//! the recipe decides what a failure means (the watchdog retries renewals, a
//! waiting acquire repeats what got no answer, see [`is_unreachable`], other
//! failures end an acquire, which withdraws).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use fencelock_proto::etcd::etcdserverpb::auth_client::AuthClient;
use fencelock_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use fencelock_proto::etcd::etcdserverpb::kv_client::KvClient;
use fencelock_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fencelock_proto::etcd::etcdserverpb::range_request::{SortOrder, SortTarget};
use fencelock_proto::etcd::etcdserverpb::request_op::Request;
use fencelock_proto::etcd::etcdserverpb::response_op::Response;
use fencelock_proto::etcd::etcdserverpb::watch_client::WatchClient;
use fencelock_proto::etcd::etcdserverpb::watch_create_request::FilterType;
use fencelock_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use fencelock_proto::etcd::etcdserverpb::{
    AuthenticateRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest, WatchResponse,
};
use fencelock_proto::etcd::mvccpb::event::EventType;
use fencelock_proto::etcd::mvccpb::{Event, KeyValue};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status, Streaming};

use crate::backend::tls::{self, TlsFiles};
use crate::error::{is_retryable, Error};

/// What reaching the cluster takes besides its endpoints: TLS files and a
/// user's credentials, if the URL gives them.
#[derive(Debug, Default)]
pub(super) struct Access {
    /// The CAs and client certificate for `https` endpoints; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// `(user, password)` for etcd's Authenticate.
    pub credentials: Option<(String, String)>,
}

/// A channel whose every call carries the current auth token (if any) in
/// the `token` metadata, as etcd's auth expects.
type Chan = InterceptedService<Channel, TokenInterceptor>;

/// Adds the shared token to each call.
#[derive(Clone, Default)]
struct TokenInterceptor(Arc<RwLock<Option<AsciiMetadataValue>>>);

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(token) = self.0.read().unwrap_or_else(|e| e.into_inner()).clone() {
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }
}

/// How long connecting to one endpoint (TCP and the first call) may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The deadline of one call other than a watch's wait for news (which the
/// caller bounds: see [`Etcd::deleted`]).
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A lease etcd granted: its id, its TTL in seconds, and the Raft term of
/// the member that granted it (0 if it did not say).
pub(super) struct GrantedLease {
    pub id: i64,
    pub ttl: i64,
    pub term: u64,
}

/// A connection to an etcd cluster through the endpoints of a URL.
///
/// All calls go to one endpoint, the *current* one. A call that fails in
/// transport (no answer by its deadline, a reset, a refused reconnect) moves
/// the connection to the next endpoint of the list, round robin, for the
/// calls after it; with a single endpoint, it starts a fresh connection to it.
/// So a lease kept through a member that died is kept through the next one,
/// as long as that happens within the lease's TTL.
pub(super) struct Etcd {
    /// `(host:port, endpoint)`, in the URL's order.
    endpoints: Vec<(String, Endpoint)>,
    current: Mutex<Current>,
    /// The generation of the current connection, sent on every move, so that
    /// a wait notices at once that the connection it waits on was given up
    /// (see [`Etcd::on_current`]).
    moves: tokio::sync::watch::Sender<u64>,
    credentials: Option<(String, String)>,
    /// The token of the last Authenticate, sent with every call.
    token: TokenInterceptor,
}

struct Current {
    /// Bumped on every move, so that many calls failing at once move once.
    generation: u64,
    index: usize,
    channel: Chan,
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.endpoints.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Etcd").field("endpoints", &names).finish_non_exhaustive()
    }
}

impl Etcd {
    /// Connects to the first of `hosts`, in order, that answers a linearizable
    /// `probe` Range (so the member is up and its cluster has a leader) within
    /// [`CONNECT_TIMEOUT`], after authenticating if `access` has credentials.
    /// [`Error::Security`] if an endpoint refuses the TLS handshake or the
    /// credentials; [`Error::Connect`] with every endpoint's reason if none
    /// answers; [`Error::InvalidArgument`] if a host cannot form a URI.
    pub async fn connect(hosts: &[(String, u16)], access: Access, probe: RangeRequest) -> Result<Etcd, Error> {
        let mut endpoints = Vec::new();
        for (host, port) in hosts {
            endpoints.push(endpoint(host, *port, access.tls.as_ref())?);
        }
        let token = TokenInterceptor::default();
        let mut failures = Vec::new();
        for (index, (name, endpoint)) in endpoints.iter().enumerate() {
            let channel = InterceptedService::new(endpoint.connect_lazy(), token.clone());
            let attempt = probe_endpoint(channel, &access.credentials, &token, probe.clone());
            match attempt.await {
                Ok(channel) => {
                    let current = Mutex::new(Current { generation: 0, index, channel });
                    let moves = tokio::sync::watch::Sender::new(0);
                    return Ok(Etcd { endpoints, current, moves, credentials: access.credentials, token });
                }
                Err(e @ Error::Security { .. }) => return Err(e),
                Err(why) => failures.push((name, why)),
            }
        }
        let hint = if access.tls.is_none() { " (a server that speaks TLS only needs etcd+tls://)" } else { "" };
        let texts: Vec<String> = failures.iter().map(|(name, why)| format!("{name}: {why}")).collect();
        let message = format!("etcd: {}{hint}", texts.join("; "));
        // One endpoint tried: its etcd status is the cause.
        let source = match failures.pop() {
            Some((_, Error::Connect { source, .. })) if failures.is_empty() => source,
            _ => None,
        };
        Err(Error::Connect { message, source })
    }

    /// Authenticates again (after etcd answered `invalid auth token`: the
    /// token expired, or the member restarted).
    async fn reauthenticate(&self, end: Instant) -> Result<(), Error> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let (_, channel) = self.channel();
        let answer = tokio::time::timeout_at(end, authenticate(channel, credentials, &self.token)).await;
        answer.unwrap_or_else(|_| Err(Unanswered::InTime.error("authenticate")))
    }

    /// The current channel and its generation.
    fn channel(&self) -> (u64, Chan) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.generation, current.channel.clone())
    }

    /// The deadline of a call started now.
    pub fn deadline(&self) -> Instant {
        crate::clock::now() + CALL_TIMEOUT
    }

    /// A call on the channel of `generation` failed in transport: move to the
    /// next endpoint (unless another call did already).
    fn failed(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.generation != generation {
            return;
        }
        current.generation += 1;
        current.index = (current.index + 1) % self.endpoints.len();
        let (name, endpoint) = &self.endpoints[current.index];
        tracing::debug!(endpoint = %name, "fencelock: etcd: moving to the next endpoint");
        current.channel = InterceptedService::new(endpoint.connect_lazy(), self.token.clone());
        self.moves.send_replace(current.generation);
    }

    /// Runs `work` (calls on the current connection) unless that connection
    /// is given up meanwhile (a call on it failed in transport or got no
    /// answer in time, and later calls go to the next endpoint or a fresh
    /// connection): then `work` is dropped and the answer is an error that
    /// [`is_unreachable`] knows, so that the caller starts over on the new
    /// connection at once, rather than wait out a call's deadline or a
    /// silent watch on the old one.
    pub async fn on_current<T>(&self, work: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        let mut moves = self.moves.subscribe();
        let generation = *moves.borrow_and_update();
        tokio::select! {
            done = work => done,
            Ok(_) = moves.wait_for(|now| *now != generation) => Err(Unanswered::GivenUp.error("call")),
        }
    }

    /// Runs `call` on the current channel until `end`. A transport failure or
    /// no answer by `end` moves to the next endpoint; an expired auth token is
    /// renewed and the call made once more; every failure is
    /// [`Error::Backend`].
    async fn call<T, F, Fut>(&self, what: &str, end: Instant, call: F) -> Result<T, Error>
    where
        F: Fn(Chan) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let (generation, channel) = self.channel();
        match self.call_on(generation, channel, what, end, &call).await {
            Err(Expired) if self.credentials.is_some() => {
                self.reauthenticate(end).await?;
                let (generation, channel) = self.channel();
                self.call_on(generation, channel, what, end, &call).await.map_err(Failure::into_error)
            }
            other => other.map_err(Failure::into_error),
        }
    }

    /// [`Etcd::call`] on `channel`, of `generation`, once.
    async fn call_on<T, F, Fut>(
        &self,
        generation: u64,
        channel: Chan,
        what: &str,
        end: Instant,
        call: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce(Chan) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        match tokio::time::timeout_at(end, call(channel)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if is_expired_token(&status) => Err(Expired),
            Ok(Err(status)) => {
                if is_transport(&status) {
                    self.failed(generation);
                }
                Err(Failed(status_error(what, &status)))
            }
            Err(_) => {
                self.failed(generation);
                Err(Failed(Unanswered::InTime.error(what)))
            }
        }
    }

    /// A linearizable Range.
    pub async fn range(&self, request: RangeRequest, end: Instant) -> Result<(Option<KeyValue>, i64), Error> {
        let response = self
            .call("range", end, |ch| {
                let request = request.clone();
                async move { KvClient::new(ch).range(request).await }
            })
            .await?;
        Ok((response.kvs.into_iter().next(), response.count))
    }

    /// The key `key`, if it exists.
    pub async fn get(&self, key: &[u8], end: Instant) -> Result<Option<KeyValue>, Error> {
        Ok(self.range(RangeRequest { key: key.to_vec(), ..RangeRequest::default() }, end).await?.0)
    }

    /// The oldest key (lowest create revision) under `prefix`, and the number of
    /// keys under it.
    pub async fn first_created(&self, prefix: &[u8], end: Instant) -> Result<(Option<KeyValue>, i64), Error> {
        let request = RangeRequest {
            limit: 1,
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Create as i32,
            ..prefix_range(prefix)
        };
        self.range(request, end).await
    }

    /// Every key under `prefix`, oldest (lowest create revision) first, and the
    /// store's revision the read saw.
    pub async fn all_created(&self, prefix: &[u8], end: Instant) -> Result<(Vec<KeyValue>, i64), Error> {
        let request = RangeRequest {
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Create as i32,
            ..prefix_range(prefix)
        };
        let response = self
            .call("range", end, |ch| {
                let request = request.clone();
                async move { KvClient::new(ch).range(request).await }
            })
            .await?;
        let revision = response.header.map_or(0, |h| h.revision);
        Ok((response.kvs, revision))
    }

    /// The newest key under `prefix` created before revision `before`.
    pub async fn last_created_before(
        &self,
        prefix: &[u8],
        before: i64,
        end: Instant,
    ) -> Result<Option<KeyValue>, Error> {
        let request = RangeRequest {
            limit: 1,
            sort_order: SortOrder::Descend as i32,
            sort_target: SortTarget::Create as i32,
            max_create_revision: before - 1,
            ..prefix_range(prefix)
        };
        Ok(self.range(request, end).await?.0)
    }

    async fn txn(&self, request: TxnRequest, end: Instant) -> Result<TxnResponse, Error> {
        self.call("txn", end, |ch| {
            let request = request.clone();
            async move { KvClient::new(ch).txn(request).await }
        })
        .await
    }

    /// Creates `key` with `value`, attached to `lease`, unless it exists;
    /// either way returns the key's create revision. One Txn:
    /// `create_revision(key) == 0` → Put, else Range.
    pub async fn create(&self, key: &[u8], value: Vec<u8>, lease: i64, end: Instant) -> Result<i64, Error> {
        let put = PutRequest { key: key.to_vec(), value, lease, ..PutRequest::default() };
        let get = RangeRequest { key: key.to_vec(), ..RangeRequest::default() };
        let request = TxnRequest {
            compare: vec![compare_created_at(key, 0)],
            success: vec![RequestOp { request: Some(Request::RequestPut(put)) }],
            failure: vec![RequestOp { request: Some(Request::RequestRange(get)) }],
        };
        let response = self.txn(request, end).await?;
        let revision = if response.succeeded {
            // The Put is the Txn's only write: the key was created at its revision.
            response.header.map_or(0, |h| h.revision)
        } else {
            match response.responses.into_iter().next().and_then(|r| r.response) {
                Some(Response::ResponseRange(r)) => r.kvs.first().map_or(0, |kv| kv.create_revision),
                _ => 0,
            }
        };
        if revision <= 0 {
            return Err(Error::backend("etcd", "txn: no create revision in the answer"));
        }
        Ok(revision)
    }

    /// Deletes `key` if its create revision is `revision` (compare-and-delete).
    /// True if it did.
    pub async fn delete_if_created_at(&self, key: &[u8], revision: i64, end: Instant) -> Result<bool, Error> {
        let delete = DeleteRangeRequest { key: key.to_vec(), ..DeleteRangeRequest::default() };
        let request = TxnRequest {
            compare: vec![compare_created_at(key, revision)],
            success: vec![RequestOp { request: Some(Request::RequestDeleteRange(delete)) }],
            failure: vec![],
        };
        Ok(self.txn(request, end).await?.succeeded)
    }

    /// Replaces the value of `key`, keeping it on `lease`, if its create
    /// revision is `revision` (compare-and-set). True if it did.
    pub async fn put_if_created_at(
        &self,
        key: &[u8],
        revision: i64,
        value: Vec<u8>,
        lease: i64,
        end: Instant,
    ) -> Result<bool, Error> {
        let put = PutRequest { key: key.to_vec(), value, lease, ..PutRequest::default() };
        let request = TxnRequest {
            compare: vec![compare_created_at(key, revision)],
            success: vec![RequestOp { request: Some(Request::RequestPut(put)) }],
            failure: vec![],
        };
        Ok(self.txn(request, end).await?.succeeded)
    }

    /// Grants a lease of `ttl_secs`: its id and the TTL etcd granted, in
    /// seconds (etcd raises a TTL below its minimum).
    pub async fn lease_grant(&self, ttl_secs: i64, end: Instant) -> Result<GrantedLease, Error> {
        let request = LeaseGrantRequest { ttl: ttl_secs, id: 0 };
        let response =
            self.call("lease grant", end, |ch| async move { LeaseClient::new(ch).lease_grant(request).await }).await?;
        if !response.error.is_empty() {
            return Err(Error::backend("etcd", format!("lease grant: {}", response.error)));
        }
        if response.id <= 0 || response.ttl <= 0 {
            return Err(Error::backend("etcd", format!("lease grant: id {} ttl {}", response.id, response.ttl)));
        }
        let term = response.header.map_or(0, |h| h.raft_term);
        Ok(GrantedLease { id: response.id, ttl: response.ttl, term })
    }

    /// Revokes lease `id`, which deletes every key attached to it. A lease
    /// that is gone already counts as revoked.
    pub async fn lease_revoke(&self, id: i64, end: Instant) -> Result<(), Error> {
        let request = LeaseRevokeRequest { id };
        let call = self.call("lease revoke", end, |ch| async move {
            match LeaseClient::new(ch).lease_revoke(request).await {
                Err(status) if status.code() == Code::NotFound => Ok(tonic::Response::new(Default::default())),
                other => other,
            }
        });
        call.await.map(|_| ())
    }

    /// One keep-alive of lease `id` (on a stream of its own): the TTL etcd
    /// renewed it to, in seconds (0 or less if the lease is gone), and the
    /// Raft term of the member that answered (0 if it did not say).
    pub async fn lease_keep_alive(&self, id: i64, end: Instant) -> Result<(i64, u64), Error> {
        let request = LeaseKeepAliveRequest { id };
        let response = self
            .call("keep-alive", end, |ch| async move {
                let mut stream = LeaseClient::new(ch).lease_keep_alive(tokio_stream::once(request)).await?.into_inner();
                match stream.message().await? {
                    Some(answer) => Ok(tonic::Response::new(answer)),
                    None => Err(Status::unavailable("the keep-alive stream ended without an answer")),
                }
            })
            .await?;
        Ok((response.ttl, response.header.map_or(0, |h| h.raft_term)))
    }

    /// Starts watching `key` for its deletion, from now (no start revision, so
    /// the watcher is synced at once and its events come without delay); returns
    /// once etcd confirmed the watcher, by `end`.
    pub async fn watch_deletion(&self, key: &[u8], end: Instant) -> Result<Watcher, Error> {
        let create = WatchCreateRequest {
            key: key.to_vec(),
            filters: vec![FilterType::Noput as i32],
            ..WatchCreateRequest::default()
        };
        self.watch(create, end).await
    }

    /// Starts watching every key under `prefix` for deletions, from now (as
    /// [`Etcd::watch_deletion`] does for one key).
    pub async fn watch_deletions_under(&self, prefix: &[u8], end: Instant) -> Result<Watcher, Error> {
        let range = prefix_range(prefix);
        let create = WatchCreateRequest {
            key: range.key,
            range_end: range.range_end,
            filters: vec![FilterType::Noput as i32],
            ..WatchCreateRequest::default()
        };
        self.watch(create, end).await
    }

    /// Starts watching every key under `prefix`, from revision `start` on (the
    /// events of `start` included); returns once etcd confirmed the watcher,
    /// by `end`. A `start` that etcd compacted away shows as
    /// [`WatchNews::Compacted`] from [`Etcd::news`].
    pub async fn watch_prefix(&self, prefix: &[u8], start: i64, end: Instant) -> Result<Watcher, Error> {
        let create = WatchCreateRequest { start_revision: start, ..WatchCreateRequest::default() };
        let range = prefix_range(prefix);
        self.watch(WatchCreateRequest { key: range.key, range_end: range.range_end, ..create }, end).await
    }

    /// Creates the watcher `create` on a stream of its own.
    async fn watch(&self, create: WatchCreateRequest, end: Instant) -> Result<Watcher, Error> {
        let (requests, rx) = mpsc::channel(1);
        // Sent before the call: etcd answers (headers included) only once it has
        // a request to answer.
        let first = WatchRequest { request_union: Some(RequestUnion::CreateRequest(create)) };
        if requests.try_send(first).is_err() {
            return Err(Error::backend("etcd", "watch: cannot queue the create request"));
        }
        let (generation, channel) = self.channel();
        let (responses, created) = self
            .call_on(generation, channel, "watch", end, |channel| async move {
                let mut responses = WatchClient::new(channel).watch(ReceiverStream::new(rx)).await?.into_inner();
                let created = responses.message().await?;
                Ok(tonic::Response::new((responses, created)))
            })
            .await
            .map_err(Failure::into_error)?;
        match created {
            Some(r) if r.created && !r.canceled => Ok(Watcher { _requests: requests, responses, generation }),
            Some(r) => Err(Error::backend("etcd", format!("watch: not created: {}", r.cancel_reason))),
            None => Err(Error::backend_caused(
                "etcd",
                "watch: the stream ended before the watcher was created",
                Unanswered::StreamEnded,
            )),
        }
    }

    /// The next events of `watcher` (a non-empty batch, in revision order), or
    /// the news that it was canceled. An error if the stream fails or ends.
    pub async fn news(&self, watcher: &mut Watcher) -> Result<WatchNews, Error> {
        loop {
            match watcher.responses.message().await {
                Ok(Some(r)) if r.canceled && r.compact_revision > 0 => return Ok(WatchNews::Compacted),
                Ok(Some(r)) if r.canceled => {
                    return Err(Error::backend("etcd", format!("watch: canceled: {}", r.cancel_reason)))
                }
                Ok(Some(r)) if !r.events.is_empty() => return Ok(WatchNews::Events(r.events)),
                Ok(Some(_)) => {}
                Ok(None) => return Err(Unanswered::StreamEnded.error("watch")),
                Err(status) => {
                    if is_transport(&status) {
                        self.failed(watcher.generation);
                    }
                    return Err(status_error("watch", &status));
                }
            }
        }
    }

    /// Waits until `watcher`'s key is deleted ([`Woken::Deleted`]), or until
    /// etcd cancels the watcher or `until` passes without news
    /// ([`Woken::LookAgain`]: the caller reads the key again and, if it is
    /// still there, watches anew). A watch that stays silent is not trusted
    /// past `until`: its connection may be dead without the client knowing
    /// yet, or the deletion may have been sent while it was. An error if the
    /// stream fails (a transport failure moves to the next endpoint) or ends.
    pub async fn deleted(&self, watcher: &mut Watcher, until: Instant) -> Result<Woken, Error> {
        loop {
            let Ok(message) = tokio::time::timeout_at(until, watcher.responses.message()).await else {
                return Ok(Woken::LookAgain);
            };
            match message {
                Ok(Some(r)) if r.canceled => return Ok(Woken::LookAgain),
                Ok(Some(r)) if r.events.iter().any(|e| e.r#type == EventType::Delete as i32) => {
                    return Ok(Woken::Deleted)
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(Unanswered::StreamEnded.error("watch")),
                Err(status) => {
                    if is_transport(&status) {
                        self.failed(watcher.generation);
                    }
                    return Err(status_error("watch", &status));
                }
            }
        }
    }
}

/// Why [`Etcd::deleted`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    /// The key was deleted.
    Deleted,
    /// No deletion seen: the watcher was canceled, or stayed silent until
    /// the caller's re-check.
    LookAgain,
}

/// What a watcher of a prefix brings next.
pub(super) enum WatchNews {
    /// Changes, in revision order.
    Events(Vec<Event>),
    /// The start revision was compacted away: the events from it are lost.
    Compacted,
}

/// A watcher on one key or prefix; dropping it ends its stream (and the
/// watcher on etcd).
pub(super) struct Watcher {
    /// Kept open so that etcd keeps the stream.
    _requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
    generation: u64,
}

/// The endpoint of `host:port`: `https` with `tls`'s CAs and client
/// certificate (the host name checked against the server's certificate),
/// else `http`.
fn endpoint(host: &str, port: u16, tls: Option<&TlsFiles>) -> Result<(String, Endpoint), Error> {
    let name = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{name}"))
        .map_err(|e| Error::InvalidArgument(format!("etcd: bad endpoint {name}: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        // Notice a dead connection even while a watch waits on it.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(3));
    if let Some(files) = tls {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&files.ca_pem)).domain_name(host);
        if let Some((cert, key)) = &files.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint =
            endpoint.tls_config(config).map_err(|e| Error::security(format!("etcd: TLS setup for {name}"), e))?;
    }
    Ok((name, endpoint))
}

/// Authenticates (if there are credentials) and runs `probe` on `channel`,
/// within [`CONNECT_TIMEOUT`]. [`Error::Security`] for a refused handshake or
/// credentials, else the reason as [`Error::Connect`].
async fn probe_endpoint(
    channel: Chan,
    credentials: &Option<(String, String)>,
    token: &TokenInterceptor,
    probe: RangeRequest,
) -> Result<Chan, Error> {
    let attempt = async {
        if let Some(credentials) = credentials {
            authenticate(channel.clone(), credentials, token).await?;
        }
        match KvClient::new(channel.clone()).range(probe).await {
            Ok(_) => Ok(channel),
            Err(status) => Err(refused_or_unreachable(status)),
        }
    };
    let answer = tokio::time::timeout(CONNECT_TIMEOUT, attempt).await;
    answer.unwrap_or_else(|_| Err(Error::connect("no answer in time")))
}

/// A failed call while connecting: [`Error::Security`] for refused
/// credentials, else [`Error::Connect`] caused by the status.
fn refused_or_unreachable(status: tonic::Status) -> Error {
    refusal(&status).unwrap_or_else(|| Error::connect_caused(format!("{:?}", status.code()), status))
}

/// etcd's Authenticate with `credentials`; its token is sent with every later call.
async fn authenticate(channel: Chan, credentials: &(String, String), token: &TokenInterceptor) -> Result<(), Error> {
    let (name, password) = credentials.clone();
    // etcd refuses an Authenticate that carries an expired token: send none.
    *token.0.write().unwrap_or_else(|e| e.into_inner()) = None;
    let answer = AuthClient::new(channel).authenticate(AuthenticateRequest { name, password }).await;
    let answer = answer.map_err(refused_or_unreachable)?;
    let value = AsciiMetadataValue::try_from(answer.into_inner().token)
        .map_err(|e| Error::backend_caused("etcd", "authenticate: a token that is no header value", e))?;
    *token.0.write().unwrap_or_else(|e| e.into_inner()) = Some(value);
    Ok(())
}

/// The [`Error::Security`] that `status` is, if it is one: a failed TLS
/// handshake, refused credentials, or a call without credentials to a
/// cluster with auth on.
fn refusal(status: &Status) -> Option<Error> {
    if let Some(cause) = tls::rustls_cause(status) {
        return Some(Error::security(format!("etcd: TLS handshake failed: {cause}"), cause.clone()));
    }
    let message = status.message();
    let why = if message.contains("authentication failed") {
        "authentication refused (wrong user or password)"
    } else if message.contains("user name is empty") || message.contains("auth: invalid auth token") {
        "the cluster has auth on: give user:password@ in the URL"
    } else if message.contains("permission denied") {
        "the user lacks a permission the backend needs (readwrite on the prefix)"
    } else {
        return None;
    };
    Some(Error::security(format!("etcd: {why}: {message}"), status.clone()))
}

/// Did etcd refuse the call's auth token (expired, or unknown after a
/// restart of the member)?
fn is_expired_token(status: &Status) -> bool {
    status.message().contains("invalid auth token")
}

/// How one attempt of a call failed.
enum Failure {
    /// etcd refused the auth token: authenticate again and retry.
    Expired,
    Failed(Error),
}

use Failure::{Expired, Failed};

impl Failure {
    fn into_error(self) -> Error {
        match self {
            Expired => Error::backend("etcd", "invalid auth token (it expired, and a new one was refused too)"),
            Failed(e) => e,
        }
    }
}

/// A Range over every key that starts with `prefix`.
pub(super) fn prefix_range(prefix: &[u8]) -> RangeRequest {
    RangeRequest { key: prefix.to_vec(), range_end: prefix_end(prefix), ..RangeRequest::default() }
}

/// The end of the range of keys starting with `prefix`: `prefix` with its last
/// byte below 0xff incremented (and what follows it dropped); `\0` (to the end
/// of the keyspace) if there is none.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `create_revision(key) == revision`; 0 means "the key does not exist".
fn compare_created_at(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        range_end: vec![],
    }
}

/// Did the call fail in transport (rather than being answered by etcd)?
fn is_transport(status: &Status) -> bool {
    is_retryable(status)
}

/// How a call got no answer from etcd at all: the source of its
/// [`Error::Backend`], which marks the failure as the connection's (see
/// [`is_unreachable`]).
#[derive(Debug, Clone, Copy, thiserror::Error)]
enum Unanswered {
    /// The call's deadline passed (the connection then moves on).
    #[error("no answer by the call's deadline")]
    InTime,
    /// The stream ended without etcd canceling the watcher.
    #[error("etcd closed the stream")]
    StreamEnded,
    /// Another call found the connection dead (see [`Etcd::on_current`]).
    #[error("another call on the connection failed")]
    GivenUp,
}

impl Unanswered {
    /// The [`Error::Backend`] of call `what` that got no answer this way.
    fn error(self, what: &str) -> Error {
        let why = match self {
            Unanswered::InTime => "no answer in time",
            Unanswered::StreamEnded => "the stream ended",
            Unanswered::GivenUp => "its connection was given up",
        };
        Error::backend_caused("etcd", format!("{what}: {why}"), self)
    }
}

/// Did the call that failed with `error` not reach etcd, or get no answer
/// (a transport failure, no answer by its deadline, a stream that ended)?
/// Such a call may succeed once the connection is redone (a transport
/// failure or a missed deadline has moved it to the next endpoint, or to a
/// fresh connection, already); any other error is etcd's answer, or the
/// recipe's, and repeating the call gets the same.
pub(super) fn is_unreachable(error: &Error) -> bool {
    let (Error::Backend { source: Some(cause), .. } | Error::Connect { source: Some(cause), .. }) = error else {
        return false;
    };
    let cause = cause.get();
    cause.is::<Unanswered>() || cause.downcast_ref::<Status>().is_some_and(is_transport)
}

/// [`Error::Backend`] of a failed call `what`, caused by its status (whose
/// code, message and transport error stay in the source chain).
fn status_error(what: &str, status: &Status) -> Error {
    Error::backend_caused("etcd", format!("{what}: {:?}", status.code()), status.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors keep their sources: no server on the port is an
    /// `Error::Connect` whose chain holds tonic's status and, under it,
    /// tonic's transport error.
    #[tokio::test]
    async fn a_refused_connection_keeps_the_tonic_error() {
        let port = crate::backend::refused_port();
        let url = crate::backend::BackendUrl::parse(&format!("etcd://127.0.0.1:{port}")).unwrap();
        let err = super::super::EtcdBackend::connect(&url).await.unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
        assert!(crate::error::caused_by::<Status>(&err), "{err:?}");
        assert!(crate::error::caused_by::<tonic::transport::Error>(&err), "{err:?}");
    }

    #[test]
    fn a_prefix_range_ends_after_the_prefix() {
        assert_eq!(prefix_end(b"fencelock/a/"), b"fencelock/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
