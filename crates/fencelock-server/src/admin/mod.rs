//! The HTTP admin endpoint (axum): health, Prometheus metrics, the lock table
//! as JSON, and the group's membership. It never changes a lock.
//!
//! - `GET /`: the dashboard, a web page over this API (module `dashboard`).
//! - `GET /healthz`: 200 `{"status":"ok",…}` when this node leads and serves, else 503.
//! - `GET /metrics`: Prometheus text format.
//! - `GET /v1/locks?prefix=&limit=`: `{"locks":[Lock…]}` sorted by name.
//! - `GET /v1/locks/{name}`: one `Lock` (a free lock has `"holder": null`).
//!   Both read on the leader (linearizable); with `consistency=local`, from
//!   this node's applied state on any member (see `crate::local_read`).
//! - `GET /v1/cluster`: this node's view of the group ([`crate::cluster::Status`]).
//! - `GET /v1/snapshot`: a backup of the state, consistent (one linearizable read
//!   on the leader), as a [`crate::backup::Backup`] JSON document; 503 on a
//!   node that does not lead.
//! - `POST /v1/cluster/members` `{"id":4,"addr":"host:port","peer_addr"?:"host:port"}`:
//!   add a node (its gRPC address, and its peer address if it has a peer port); `DELETE /v1/cluster/members/{id}`: remove one. Any member
//!   takes them (a follower forwards to the leader); 200 with the new status,
//!   400 for a change that makes no sense, 503 when no leader could make it.
//!
//! - `GET /v1/watch?prefix=P&from=R`: lock events as server-sent events
//!   ([`crate::watching::sse`]); needs `read` on the prefix.
//! - `GET /v1/auth`: the roles and identities this node knows, from its auth
//!   file and the group's policy ([`crate::access::policy::View`]; never a hash).
//! - `POST /v1/auth` with a [`fencelock_core::PolicyChange`] as JSON (for
//!   example `{"op":"put_role","name":"worker","rules":[{"prefix":"jobs/","verbs":["acquire"]}]}`):
//!   changes the group's policy through the log (a follower hands it to the
//!   leader); 200 `{"version","changed"}`, 400 for a change that breaks a
//!   rule, 503 when no leader could make it.
//!
//! A `Lock` is `{"name", "holder": Holder | null, "holders": [Holder], "permits",
//! "reopens_in_ms": n | null, "waiters": [{"lease_id","waited_ms","wait_left_ms","identity"}],
//! "watchers"}` (`watchers`: watches of the lock by name open on this node)
//! with a `Holder` `{"lease_id","token","token_age_ms","ttl_left_ms","lock_delay_ms",
//! "owner"?,"identity","value_base64","mode","weight"}`; ids and tokens are
//! decimal strings, as in the whole HTTP API ([`body::Id`]). `identity` is
//! what the acquire said about its requester ("" when nothing); `value_base64` is
//! the holder's value in standard base64 ("" when none), always base64 so that
//! the field has one type whatever the bytes are.
//!
//! With authentication on (see [`crate::access::auth`]) a request carries
//! `Authorization: Bearer <token>` or comes on a connection with a client
//! certificate: without either it gets 401, without the permission 403.
//! `/v1/locks` needs `read` on the lock or the prefix; `/v1/cluster`,
//! `/v1/snapshot`, `/v1/auth` and membership changes need `admin`; `/healthz` and
//! `/metrics` are public unless the auth file says `protect_metrics = true`.
//!
//! [`serve`] runs the router over HTTP/1.1 on connections admitted by
//! [`crate::access::conn_limits`], with a header-read timeout.

mod body;
mod dashboard;
mod elections;
mod errors;
mod leases;
mod locks;
mod openapi;

pub use openapi::DOCUMENT as OPENAPI;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    extract::{rejection::QueryRejection, FromRequestParts, Path, Query, State},
    http::{header, request::Parts, StatusCode},
    response::{IntoResponse, Response},
    Json, Router,
};
use fencelock_core::{ErrorCode, LockInfo, LockName};
use serde::{Deserialize, Serialize};

use crate::access::audit::Event;
use crate::access::auth::{Auth, Refusal, Verb, Who};
use crate::access::conn_limits::{ConnInfo, Stream};
use crate::access::policy::{self, PolicyError};
use crate::access::tls::ServerTls;
use crate::cluster::{self, Change, ClusterError};
use crate::{api::Ops, metrics::Metrics};
use errors::ApiError;
use fencelock_core::PolicyChange;

#[derive(Clone)]
struct Admin {
    ops: Ops,
    metrics: Arc<Metrics>,
    node_id: u64,
    auth: Arc<Auth>,
    /// For a membership change handed to the leader.
    tls: Option<Arc<ServerTls>>,
    /// For `/v1/watch` (absent: 404).
    watch: Option<crate::watching::serve::Source>,
}

/// The caller of a request, or why it has none; and where it came from, and
/// what it presented (for a watch, which authenticates it again later).
struct Caller(Result<Who, Refusal>, Option<SocketAddr>, Presented);

/// A request's bearer token and client certificate CN.
#[derive(Clone)]
struct Presented {
    token: Option<header::HeaderValue>,
    cn: Option<Arc<str>>,
}

impl Presented {
    fn authenticate(&self, auth: &Auth, remote: Option<SocketAddr>) -> Result<Who, Refusal> {
        let token = self.token.as_ref().map(|v| v.to_str().unwrap_or("\u{fffd}"));
        auth.authenticate(token, self.cn.as_deref()).map(|w| w.at(remote))
    }
}

impl FromRequestParts<Admin> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, a: &Admin) -> Result<Self, Self::Rejection> {
        let token = parts.headers.get(header::AUTHORIZATION).cloned();
        let info = parts.extensions.get::<ConnInfo>();
        let (cn, remote) = (info.and_then(|c| c.client_cn.clone()), info.and_then(|c| c.remote));
        let presented = Presented { token, cn };
        Ok(Caller(presented.authenticate(&a.auth, remote), remote, presented))
    }
}

// axum's Response is what a handler answers, refusals included.
#[allow(clippy::result_large_err)]
impl Caller {
    /// The caller, once it is allowed by `allowed`; else the 401 or 403 (and
    /// an audit line).
    fn allowed(self, a: &Admin, allowed: impl FnOnce(&Who) -> Result<(), Refusal>) -> Result<Who, Response> {
        let remote = self.1;
        let who = self.0.map_err(|r| a.refusal("-", remote, r))?;
        allowed(&who).map_err(|r| a.refusal(who.name(), remote, r))?;
        Ok(who)
    }

    /// For a watch: [`Caller::allowed`] now, and the same credentials
    /// authenticated again at each later call.
    fn watching(
        self,
        a: &Admin,
        allowed: impl FnOnce(&Who) -> Result<(), Refusal>,
    ) -> Result<crate::watching::serve::Caller, Response> {
        let (remote, presented, auth) = (self.1, self.2.clone(), a.auth.clone());
        self.allowed(a, allowed)?;
        Ok(Box::new(move || presented.authenticate(&auth, remote)))
    }

    /// The caller of an API operation, which checks its own permission (as
    /// the gRPC port's do); or the refusal of a caller this node does not
    /// know (audited, or naming the leader, whose policy is the newest).
    fn api(self, a: &Admin) -> Result<Who, ApiError> {
        let Caller(who, remote, _) = self;
        who.map_err(|r| a.ops.unauthenticated(remote, r).into())
    }

    /// For `/healthz` and `/metrics`: anyone, unless the auth file protects them.
    fn for_metrics(self, a: &Admin) -> Result<(), Response> {
        match a.auth.protect_metrics() {
            true => self.0.map(drop).map_err(|r| a.refusal("-", self.1, r)),
            false => Ok(()),
        }
    }
}

impl Admin {
    fn refusal(&self, who: &str, remote: Option<SocketAddr>, r: Refusal) -> Response {
        let (verb, object, outcome) = match &r {
            Refusal::Unauthenticated(_) => (String::new(), String::new(), "unauthenticated"),
            Refusal::Denied { verb, object, .. } => (verb.to_string(), object.clone(), "denied"),
        };
        let detail = r.to_string();
        let remote = remote.map(|a| a.to_string());
        let event =
            Event { identity: who, remote, verb: &verb, action: "http", object: &object, outcome, detail: &detail };
        self.ops.audit.record(&event);
        refusal(r)
    }

    /// An admin action's audit line.
    fn audit(&self, who: &Who, action: &str, object: &str, outcome: &str, detail: &str) {
        let remote = who.remote().map(|a| a.to_string());
        self.ops.audit.record(&Event { identity: who.name(), remote, verb: "admin", action, object, outcome, detail });
    }
}

fn refusal(r: Refusal) -> Response {
    ApiError::from(r).into_response()
}

/// The admin router. `tls`: the node's certificates, to reach the leader;
/// `/v1/watch` is served from `watch`, if any.
pub fn router_with_watch(
    ops: Ops,
    metrics: Arc<Metrics>,
    node_id: u64,
    auth: Arc<Auth>,
    tls: Option<Arc<ServerTls>>,
    watch: Option<crate::watching::serve::Source>,
) -> Router {
    let mut router = Router::new();
    for &(method, path, operation) in ROUTES {
        router = router.route(path, handler(method, operation));
    }
    dashboard::routes(router).fallback(no_route).method_not_allowed_fallback(no_method).with_state(Admin {
        ops,
        metrics,
        node_id,
        auth,
        tls,
        watch,
    })
}

/// Every route of the HTTP port: method, path, and the `operationId` the
/// OpenAPI document (`openapi.json`, served at `/v1/openapi.json`) gives it.
/// The router is built from this table, and a test checks the document
/// against it, both ways.
pub const ROUTES: &[(&str, &str, &str)] = &[
    ("GET", "/healthz", "health"),
    ("GET", "/metrics", "metrics"),
    ("GET", "/v1/openapi.json", "openapi"),
    ("GET", "/v1/watch", "watch"),
    ("GET", "/v1/locks", "listLocks"),
    ("GET", "/v1/locks/{name}", "describeLock"),
    ("POST", "/v1/locks/{name}/acquire", "acquire"),
    ("POST", "/v1/locks/{name}/release", "release"),
    ("GET", "/v1/locks/{name}/check", "check"),
    ("PUT", "/v1/locks/{name}/value", "setValue"),
    ("POST", "/v1/locks/{name}/complete", "completeSlot"),
    ("POST", "/v1/locks/{name}/downgrade", "downgrade"),
    ("PUT", "/v1/locks/{name}/permits", "resize"),
    ("POST", "/v1/locks/{name}/refusals", "reportRefusal"),
    ("POST", "/v1/leases", "grantLease"),
    ("GET", "/v1/leases/{id}", "describeLease"),
    ("DELETE", "/v1/leases/{id}", "revokeLease"),
    ("POST", "/v1/leases/{id}/keepalive", "keepAlive"),
    ("POST", "/v1/elections/{name}/campaign", "campaign"),
    ("POST", "/v1/elections/{name}/proclaim", "proclaim"),
    ("POST", "/v1/elections/{name}/resign", "resign"),
    ("GET", "/v1/elections/{name}/leader", "leader"),
    ("GET", "/v1/cluster", "clusterStatus"),
    ("POST", "/v1/cluster/members", "addMember"),
    ("DELETE", "/v1/cluster/members/{id}", "removeMember"),
    ("GET", "/v1/snapshot", "snapshot"),
    ("GET", "/v1/auth", "authView"),
    ("POST", "/v1/auth", "authChange"),
];

/// The handler of `operation` (one of [`ROUTES`]), answering `method`.
fn handler(method: &str, operation: &str) -> axum::routing::MethodRouter<Admin> {
    use axum::routing::on;
    let filter = match method {
        "GET" => axum::routing::MethodFilter::GET,
        "POST" => axum::routing::MethodFilter::POST,
        "PUT" => axum::routing::MethodFilter::PUT,
        "DELETE" => axum::routing::MethodFilter::DELETE,
        other => unreachable!("ROUTES has method {other}"),
    };
    match operation {
        "health" => on(filter, healthz),
        "metrics" => on(filter, metrics_text),
        "openapi" => on(filter, openapi::serve),
        "watch" => on(filter, watch_sse),
        "listLocks" => on(filter, list),
        "describeLock" => on(filter, one),
        "acquire" => on(filter, locks::acquire),
        "release" => on(filter, locks::release),
        "check" => on(filter, locks::check),
        "setValue" => on(filter, locks::set_value),
        "completeSlot" => on(filter, locks::complete_slot),
        "downgrade" => on(filter, locks::downgrade),
        "resize" => on(filter, locks::resize),
        "reportRefusal" => on(filter, locks::report_refusal),
        "grantLease" => on(filter, leases::grant),
        "describeLease" => on(filter, leases::describe),
        "revokeLease" => on(filter, leases::revoke),
        "keepAlive" => on(filter, leases::keep_alive),
        "campaign" => on(filter, elections::campaign),
        "proclaim" => on(filter, elections::proclaim),
        "resign" => on(filter, elections::resign),
        "leader" => on(filter, elections::leader),
        "clusterStatus" => on(filter, cluster_status),
        "addMember" => on(filter, cluster_add),
        "removeMember" => on(filter, cluster_remove),
        "snapshot" => on(filter, snapshot),
        "authView" => on(filter, auth_view),
        "authChange" => on(filter, auth_change),
        other => unreachable!("ROUTES names operation {other}, which has no handler"),
    }
}

/// A request id for the engine's de-duplication: the client's, else a fresh
/// random one (never 0, which the engine refuses).
fn request_id(given: Option<body::Id>) -> u64 {
    given.map(|id| id.0).or_else(crate::access::auth::random_lease_id).unwrap_or(1)
}

async fn no_route(uri: axum::http::Uri) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("no route {} (the API is in /v1/openapi.json)", uri.path()))
}

async fn no_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    let message = format!("{method} is not a method of {} (the API is in /v1/openapi.json)", uri.path());
    ApiError::new(ErrorCode::MethodNotAllowed, message)
}

#[derive(Deserialize)]
struct WatchQuery {
    #[serde(default)]
    prefix: String,
    from: Option<String>,
}

/// `GET /v1/watch`: see [`crate::watching::sse`].
async fn watch_sse(
    State(a): State<Admin>,
    caller: Caller,
    Query(q): Query<WatchQuery>,
    headers: axum::http::HeaderMap,
) -> Response {
    let selector = crate::watching::serve::Selector::Prefix(q.prefix.clone());
    let caller = match caller.watching(&a, |w| selector.required(w)) {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let Some(source) = &a.watch else {
        return error_json(ErrorCode::NotFound, "this node does not serve watches".into());
    };
    match crate::watching::sse::start_rev(&headers, q.from.as_deref()) {
        Ok(from) => crate::watching::sse::respond(source, caller, q.prefix, from),
        Err(e) => error_json(ErrorCode::InvalidArgument, e),
    }
}

/// Serves `router` on the connections from `incoming` until `stop`; then lets
/// requests in progress finish (each connection closes after its current
/// request) and returns once all are closed. A connection whose request headers
/// are not all in within `header_read_timeout` is closed (hyper's timer).
pub async fn serve(
    mut incoming: tokio::sync::mpsc::Receiver<(Stream, SocketAddr)>,
    router: Router,
    header_read_timeout: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let (closing, close) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let conn = tokio::select! {
            _ = &mut stop => break,
            c = incoming.recv() => c,
        };
        let Some((conn, _peer)) = conn else { break };
        while conns.try_join_next().is_some() {}
        conns.spawn(serve_connection(conn, router.clone(), header_read_timeout, close.clone()));
    }
    drop(incoming);
    let _ = closing.send(true);
    while conns.join_next().await.is_some() {}
}

async fn serve_connection(
    conn: Stream,
    router: Router,
    header_read_timeout: Duration,
    mut close: tokio::sync::watch::Receiver<bool>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_read_timeout);
    let router = router.layer(axum::Extension(conn.info()));
    let service = hyper_util::service::TowerToHyperService::new(router);
    let mut served = std::pin::pin!(http.serve_connection(hyper_util::rt::TokioIo::new(conn), service));
    tokio::select! {
        _ = served.as_mut() => return,
        _ = close.wait_for(|c| *c) => served.as_mut().graceful_shutdown(),
    }
    let _ = served.await;
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    node_id: u64,
    leader: Option<u64>,
    term: u64,
    last_applied: Option<u64>,
    /// Why the node stopped serving (a storage failure), if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

async fn healthz(State(a): State<Admin>, c: Caller) -> Response {
    if let Err(r) = c.for_metrics(&a) {
        return r;
    }
    let m = a.ops.raft.metrics().borrow().clone();
    let ready = a.ops.driver.is_ready();
    let body = Health {
        status: if ready { "ok" } else { "unavailable" },
        node_id: a.node_id,
        leader: m.current_leader,
        term: m.current_term,
        last_applied: m.last_applied.map(|l| l.index),
        error: m.running_state.as_ref().err().map(|e| e.to_string()),
    };
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(body)).into_response()
}

async fn metrics_text(State(a): State<Admin>, c: Caller) -> Response {
    if let Err(r) = c.for_metrics(&a) {
        return r;
    }
    let (now, engine_now) = (a.ops.clock.now(), a.ops.local_now());
    // On a blocking thread: the per-lock metrics pass over every lock (about
    // a second at 10M), and the engine's lock may be held by a long apply (a
    // new leader's first entry); a runtime thread waits for neither.
    let engine_part = {
        let a = a.clone();
        tokio::task::spawn_blocking(move || {
            let e = a.ops.engine.read().ok()?;
            let mut body = a.metrics.render(&e.stats(), a.ops.driver.is_ready());
            a.metrics.locks.render(&mut body, &e, now, engine_now.max(e.now()));
            Some(body)
        })
        .await
    };
    let mut body = match engine_part {
        Ok(Some(body)) => body,
        Ok(None) => return error_json(ErrorCode::Internal, "engine lock poisoned".into()),
        Err(e) => return error_json(ErrorCode::Internal, format!("the metrics could not be read: {e}")),
    };
    crate::group_metrics::render(&mut body, &a.ops.raft, a.metrics.data_dir.as_deref());
    a.ops.quotas.render(&mut body);
    crate::lease_events::render_metrics(&mut body, a.ops.driver.lease_watchers());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// How a lock read is served: by the leader, after a quorum confirms it
/// still leads (`linearizable`, the default), or from this node's applied
/// state (`local`, see [`crate::local_read`]).
#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Consistency {
    #[default]
    Linearizable,
    Local,
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    #[serde(default)]
    consistency: Consistency,
}

async fn list(State(a): State<Admin>, c: Caller, q: Result<Query<ListQuery>, QueryRejection>) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return error_json(ErrorCode::InvalidArgument, e.body_text()),
    };
    if let Err(r) = c.allowed(&a, |w| w.require_prefix(Verb::Read, &q.prefix)) {
        return r;
    }
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    let locks = match q.consistency {
        Consistency::Linearizable => a.ops.locks(&q.prefix, limit).await,
        Consistency::Local => a.ops.locks_local(&q.prefix, limit),
    };
    match locks {
        Ok(locks) => {
            let watchers = a.watchers(locks.iter().map(|l| l.name.as_str()));
            let locks = locks.into_iter().zip(watchers).map(|(l, w)| lock_json(l, w)).collect();
            Json(LocksJson { locks }).into_response()
        }
        Err(s) => status_json(s),
    }
}

#[derive(Deserialize)]
struct OneQuery {
    #[serde(default)]
    consistency: Consistency,
}

async fn one(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    q: Result<Query<OneQuery>, QueryRejection>,
) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return error_json(ErrorCode::InvalidArgument, e.body_text()),
    };
    let name = match LockName::new(name) {
        Ok(n) => n,
        Err(e) => return error_json(ErrorCode::InvalidArgument, format!("invalid lock name: {e}")),
    };
    if let Err(r) = c.allowed(&a, |w| w.require(Verb::Read, name.as_str())) {
        return r;
    }
    let info = match q.consistency {
        Consistency::Linearizable => a.ops.lock_info(&name).await,
        Consistency::Local => a.ops.lock_info_local(&name),
    };
    match info {
        Ok(info) => {
            let watchers = a.watchers([info.name.as_str()].into_iter());
            Json(lock_json(info, watchers[0])).into_response()
        }
        Err(s) => status_json(s),
    }
}

async fn snapshot(State(a): State<Admin>, c: Caller) -> Response {
    let who = match c.allowed(&a, Who::require_admin) {
        Ok(who) => who,
        Err(r) => return r,
    };
    if let Err(s) = a.ops.linearizable().await {
        a.audit(&who, "snapshot", "the state", "error", s.message());
        return status_json(s);
    }
    let applied = a.ops.raft.metrics().borrow().last_applied.map(|l| l.index);
    a.audit(&who, "snapshot", "the state", "ok", "");
    match crate::raft::state_machine::read_engine(&a.ops.engine) {
        Ok(e) => Json(crate::backup::Backup::of(&e, a.node_id, applied)).into_response(),
        Err(_) => error_json(ErrorCode::Internal, "engine lock poisoned".into()),
    }
}

async fn cluster_status(State(a): State<Admin>, c: Caller) -> Response {
    if let Err(r) = c.allowed(&a, Who::require_admin) {
        return r;
    }
    Json(cluster::status(&a.ops.raft)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMember {
    id: u64,
    addr: String,
    #[serde(default)]
    peer_addr: Option<String>,
}

async fn cluster_add(State(a): State<Admin>, c: Caller, body: Result<body::JsonBody<AddMember>, ApiError>) -> Response {
    let who = match c.allowed(&a, Who::require_admin) {
        Ok(who) => who,
        Err(r) => return r,
    };
    match body {
        Ok(body::JsonBody(m)) => change(&a, &who, Change::Add { id: m.id, addr: m.addr, peer_addr: m.peer_addr }).await,
        Err(e) => e.into_response(),
    }
}

async fn cluster_remove(State(a): State<Admin>, c: Caller, Path(id): Path<String>) -> Response {
    let who = match c.allowed(&a, Who::require_admin) {
        Ok(who) => who,
        Err(r) => return r,
    };
    match id.parse::<u64>() {
        Ok(id) => change(&a, &who, Change::Remove { id }).await,
        Err(_) => error_json(ErrorCode::InvalidArgument, format!("node id {id:?} is not a number")),
    }
}

/// Makes the change (see [`change_once`]), audited.
async fn change(a: &Admin, who: &Who, c: Change) -> Response {
    // A refusal for want of a leader changed nothing: while leadership is in
    // flux (a leader just elected and not serving yet, or handing over) the
    // change is tried again, for up to 5 s.
    let mut res = change_once(a, &c).await;
    for _ in 0..CHANGE_TRIES {
        if !matches!(res, Err(ClusterError::NotLeader { .. })) {
            break;
        }
        tokio::time::sleep(CHANGE_RETRY_PAUSE).await;
        res = change_once(a, &c).await;
    }
    let (action, object) = match &c {
        Change::Add { id, addr, peer_addr } => (
            "cluster.add",
            format!("node {id} at {addr}{}", peer_addr.as_ref().map(|p| format!(" (peers: {p})")).unwrap_or_default()),
        ),
        Change::Remove { id } => ("cluster.remove", format!("node {id}")),
    };
    let error = res.as_ref().err().map(ToString::to_string);
    a.audit(who, action, &object, if error.is_some() { "error" } else { "ok" }, error.as_deref().unwrap_or(""));
    match res {
        Ok(s) => Json(s).into_response(),
        Err(e @ ClusterError::Invalid(_)) => error_json(ErrorCode::InvalidArgument, e.to_string()),
        Err(e) => error_json(ErrorCode::Unavailable, e.to_string()),
    }
}

/// How often, and how far apart, a membership change refused for want of a
/// leader is tried again (see [`change`]).
const CHANGE_TRIES: usize = 20;
const CHANGE_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// The change made here if this node leads, else handed to the leader once.
async fn change_once(a: &Admin, c: &Change) -> Result<cluster::Status, ClusterError> {
    match cluster::apply(&a.ops.raft, c).await {
        Err(ClusterError::NotLeader { leader: Some((id, addr)) }) if id != a.node_id => {
            cluster::forward(&addr, c, a.tls.as_deref()).await
        }
        r => r,
    }
}

async fn auth_view(State(a): State<Admin>, c: Caller) -> Response {
    if let Err(r) = c.allowed(&a, Who::require_admin) {
        return r;
    }
    Json(policy::view(&a.auth.file(), &a.auth.group_policy())).into_response()
}

async fn auth_change(
    State(a): State<Admin>,
    c: Caller,
    body: Result<body::JsonBody<PolicyChange>, ApiError>,
) -> Response {
    let who = match c.allowed(&a, Who::require_admin) {
        Ok(who) => who,
        Err(r) => return r,
    };
    let change = match body {
        Ok(body::JsonBody(change)) => change,
        Err(e) => return e.into_response(),
    };
    let (action, object) = match &change {
        PolicyChange::PutRole { name, .. } => ("auth.put_role", format!("role {name}")),
        PolicyChange::DeleteRole { name } => ("auth.delete_role", format!("role {name}")),
        PolicyChange::PutIdentity { name, .. } => ("auth.put_identity", format!("identity {name}")),
        PolicyChange::DeleteIdentity { name } => ("auth.delete_identity", format!("identity {name}")),
    };
    let res = crate::policy_change::change(&a.ops.driver, &a.ops.raft, &a.auth, &who, change, a.tls.as_deref()).await;
    let error = res.as_ref().err().map(ToString::to_string);
    a.audit(&who, action, &object, if error.is_some() { "error" } else { "ok" }, error.as_deref().unwrap_or(""));
    match res {
        Ok(changed) => Json(changed).into_response(),
        Err(e @ PolicyError::Invalid(_)) => error_json(ErrorCode::InvalidArgument, e.to_string()),
        Err(e) => error_json(ErrorCode::Unavailable, e.to_string()),
    }
}

fn status_json(s: tonic::Status) -> Response {
    ApiError::from(s).into_response()
}

fn error_json(code: ErrorCode, message: String) -> Response {
    ApiError::new(code, message).into_response()
}

#[derive(Serialize)]
struct LocksJson {
    locks: Vec<LockJson>,
}

/// One lock in the admin JSON.
#[derive(Serialize)]
struct LockJson {
    name: String,
    /// The first of `holders`.
    holder: Option<HolderJson>,
    /// Every holder, in grant order (readers, a semaphore's permit holders).
    holders: Vec<HolderJson>,
    /// A semaphore's permits (0: a read-write lock).
    permits: u32,
    reopens_in_ms: Option<u64>,
    waiters: Vec<WaiterJson>,
    /// Watches of this lock by name open on this node: how an election's
    /// candidates and observers follow it.
    watchers: u32,
}

#[derive(Serialize)]
struct HolderJson {
    lease_id: body::Id,
    token: body::Id,
    token_age_ms: u64,
    ttl_left_ms: u64,
    lock_delay_ms: u64,
    /// The identity that owns the holder's lease (absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    /// The identity its acquire carried ("" when none).
    identity: String,
    /// Its value, standard base64 ("" when none).
    value_base64: String,
    /// "exclusive" or "shared".
    mode: &'static str,
    /// Permits of a semaphore it holds (1 otherwise).
    weight: u32,
}

impl From<fencelock_core::HolderInfo> for HolderJson {
    fn from(h: fencelock_core::HolderInfo) -> Self {
        HolderJson {
            lease_id: body::Id(h.lease.0),
            token: body::Id(h.token.0),
            token_age_ms: h.held_ms,
            ttl_left_ms: h.ttl_left_ms,
            lock_delay_ms: h.lock_delay_ms,
            owner: h.owner,
            value_base64: fencelock_core::b64::encode(&h.value),
            identity: h.identity,
            mode: match h.mode {
                fencelock_core::Mode::Exclusive => "exclusive",
                fencelock_core::Mode::Shared => "shared",
            },
            weight: h.weight,
        }
    }
}

#[derive(Serialize)]
struct WaiterJson {
    lease_id: body::Id,
    waited_ms: u64,
    wait_left_ms: u64,
    /// The identity its acquire carried ("" when none).
    identity: String,
}

impl Admin {
    /// The watches by name of each of `names` open on this node (0 each
    /// without a watch hub), read at once.
    fn watchers<'a>(&self, names: impl ExactSizeIterator<Item = &'a str>) -> Vec<u32> {
        match self.watch.as_ref() {
            Some(w) => w.hub.followers_of(names),
            None => vec![0; names.len()],
        }
    }
}

/// A lock's JSON, with its `watchers` on this node.
fn lock_json(i: LockInfo, watchers: u32) -> LockJson {
    LockJson {
        watchers,
        name: i.name.to_string(),
        holder: i.holder.map(HolderJson::from),
        holders: i.holders.into_iter().map(HolderJson::from).collect(),
        permits: i.permits,
        reopens_in_ms: i.reopens_in_ms,
        waiters: i
            .waiters
            .into_iter()
            .map(|w| WaiterJson {
                lease_id: body::Id(w.lease.0),
                waited_ms: w.waited_ms,
                wait_left_ms: w.wait_left_ms,
                identity: w.identity,
            })
            .collect(),
    }
}
