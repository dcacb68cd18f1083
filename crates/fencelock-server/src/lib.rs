//! `fencelock-server`: one node of the fencelock lock service.
//!
//! Where it sits: it owns the [`fencelock_core::Engine`] (inside the Raft state
//! machine), persists every change through openraft with a redb log before
//! answering, and serves the `fencelock.v1` gRPC API and an HTTP admin endpoint.
//! A single node is a Raft group of one.
//!
//! Layout, from the bottom up (no module imports one above it):
//! - `access/`: who may connect and call, and what they may do: [`auth`]
//!   (the auth file merged with the group's policy), [`policy`] (the rules of
//!   a policy change), [`quota`], [`conn_limits`] (what both listeners
//!   accept), [`tls`] (certificates for the listeners and between members),
//!   [`certs`] (makes them: `fencelock certs init`), and the audit log.
//! - `watching/`: the event history and the streams of the `Watch` RPC.
//! - [`raft`]: type config, storage, the state machine, the network between
//!   members; [`seams`]: the storage backend and hooks a caller may plug in
//!   (nothing by default).
//! - `driver/`: the only proposer (batching, time, leadership); its sans-IO
//!   core is [`driver_core`]. [`clock`]: the only clock, over a time source the
//!   caller may choose.
//! - `config` ([`Config`]), [`cluster`] (membership), `policy_change`
//!   (proposing a policy change, or handing it to the leader), `handover`
//!   (the leader's side of what a follower hands over), [`backup`].
//! - `api` (operations shared by unary RPCs and sessions), `grpc` (tonic
//!   glue), `lease_events`, `admin` (axum), `metrics`.
//!
//! The public surface is this page: [`start`] and [`serve`] with their
//! [`Config`], and the modules and re-exports below, which the CLI, the
//! chaos harness, the benchmarks and the simulator use.
//!
//! ```no_run
//! # async fn f() -> Result<(), fencelock_server::ServerError> {
//! let running = fencelock_server::start(fencelock_server::Config::new("./fencelock-data")).await?;
//! println!("gRPC on {}, HTTP on {}", running.grpc_addr, running.http_addr);
//! running.shutdown().await;
//! # Ok(()) }
//! ```

mod access;
mod admin;
/// The HTTP port's routes (method, path, operationId) and its OpenAPI document.
pub use admin::{OPENAPI, ROUTES as HTTP_ROUTES};
mod api;
pub mod backup;
pub mod clock;
pub mod cluster;
mod config;
mod driver;
mod framed;
mod group_metrics;
mod grpc;
mod handover;
mod http_error;
mod lease_events;
mod local_read;
mod lock_metrics;
mod metrics;
mod policy_change;
pub mod raft;
pub mod seams;
mod watching;

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};

pub use access::{auth, certs, conn_limits, policy, quota, tls};
pub use config::{parse_peers, peer_entry, Config, LogEngine};
pub use driver::core as driver_core;
use fencelock_proto::v1::lock_server::LockServer;
pub use raft::Bootstrap;
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::watch,
    task::JoinHandle,
};
use tokio_stream::wrappers::ReceiverStream;

use crate::{access::audit, api::Ops, clock::Clock, driver::Driver, metrics::Metrics};

/// Why the server could not start. Each variant keeps the error it wraps as its
/// [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The configuration is inconsistent (see [`Config::validate`]), or contradicts
    /// the data dir.
    #[error("configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    /// The data dir cannot be opened, or is refused (see [`raft::identity`]).
    #[error("storage in {}", dir.display())]
    Storage { dir: std::path::PathBuf, source: raft::identity::IdentityError },
    #[error("cannot open the audit log {}", path.display())]
    AuditLog { path: std::path::PathBuf, source: std::io::Error },
    /// openraft refused its configuration or failed to start or form the group.
    #[error("raft: {what}")]
    Raft { what: &'static str, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("{0}")]
    Auth(#[from] auth::AuthFileError),
}

impl ServerError {
    /// A [`ServerError::Raft`] for what failed, keeping openraft's error.
    fn raft<E: std::error::Error + Send + Sync + 'static>(what: &'static str) -> impl FnOnce(E) -> ServerError {
        move |e| ServerError::Raft { what, source: Box::new(e) }
    }
}

/// A started node. Dropping it does not stop it; call [`Running::shutdown`].
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The peer listener's address, with `--peer-listen`.
    pub peer_addr: Option<SocketAddr>,
    pub raft: raft::Raft,
    /// The data dir's identity (node id, cluster id once known).
    pub identity: raft::identity::SharedIdentity,
    engine: raft::state_machine::SharedEngine,
    /// Why the node stopped serving on its own (see [`Running::failed`]).
    failed: watch::Receiver<Option<String>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// The engine's gauges, as applied on this node.
    pub fn stats(&self) -> fencelock_core::Stats {
        self.engine.read().map(|e| e.stats()).unwrap_or_default()
    }

    /// The group's cluster id, once this node has applied it.
    pub fn cluster_id(&self) -> Option<fencelock_core::ClusterId> {
        self.identity.cluster_id()
    }

    /// Resolves with the reason when the node stops serving on its own (its
    /// data dir was deleted or replaced, see [`raft::identity::watch`]); never
    /// resolves otherwise.
    pub async fn failed(&self) -> String {
        let mut rx = self.failed.clone();
        let why = match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => return std::future::pending().await,
        };
        why
    }

    /// Resolves once the node was told to stop: the shutdown future given to
    /// [`serve`] resolved (or [`Running::shutdown`] was called). Call
    /// [`Running::shutdown`] then to wait for it to finish.
    pub async fn stopping(&self) {
        stopped(self.stop.subscribe()).await
    }

    /// Stop serving, finish in-flight requests, stop Raft. What was acknowledged is
    /// already durable, so this is only about being tidy.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let _ = self.raft.shutdown().await;
    }
}

/// The sockets a node serves on, bound by its caller (so a test can bind port 0
/// and know the port before the node starts) but not listening yet: [`serve`]
/// listens only once storage and Raft are up, so that until then a client (or
/// a peer) is refused at once and tries another node, instead of hanging on a
/// handshake nobody answers.
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC port: the client API (and Raft, without a peer port).
    pub client: TcpSocket,
    /// The HTTP admin port.
    pub admin: TcpSocket,
    /// Raft's own port (`--peer-listen`), if any.
    pub peer: Option<TcpSocket>,
}

impl Listeners {
    /// Binds the addresses of `config`: `grpc_listen`, `http_listen` and
    /// `peer_listen`.
    pub fn bind(config: &Config) -> Result<Listeners, ServerError> {
        Ok(Listeners {
            client: reserve(config.grpc_listen)?,
            admin: reserve(config.http_listen)?,
            peer: config.peer_listen.map(reserve).transpose()?,
        })
    }
}

/// Bind the listeners of `config` and [`serve`] on them with the real clock,
/// until [`Running::shutdown`].
pub async fn start(config: Config) -> Result<Running, ServerError> {
    config.validate().map_err(ServerError::Config)?;
    let listeners = Listeners::bind(&config)?;
    serve(config, listeners, Clock::new(), std::future::pending()).await
}

/// Serve on `listeners`: open storage, start Raft (forming a new group on an
/// empty data dir, see [`Bootstrap`]), the driver and the servers, all reading
/// `clock`. The node stops when `shutdown` resolves (see [`Running::stopping`])
/// or on [`Running::shutdown`]. `config`'s listen addresses are replaced by the
/// listeners' own.
pub async fn serve(
    mut config: Config,
    listeners: Listeners,
    clock: Clock,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Running, ServerError> {
    let Listeners { client: grpc, admin: http, peer } = listeners;
    let grpc_addr = reserved_addr(&grpc, config.grpc_listen)?;
    let http_addr = reserved_addr(&http, config.http_listen)?;
    let peer_addr = peer.as_ref().map(|s| reserved_addr(s, config.peer_listen.unwrap_or(grpc_addr))).transpose()?;
    (config.grpc_listen, config.http_listen, config.peer_listen) = (grpc_addr, http_addr, peer_addr);
    config.validate().map_err(ServerError::Config)?;
    let tls = config.tls.clone().map(tls::ServerTls::load).transpose()?;
    let auth_file = config.auth_file.as_deref().map(auth::Loaded::read).transpose()?;
    let node = own_member(&config, grpc_addr, peer_addr);
    let group_time = Arc::new(local_read::GroupTime::default());
    let raft = start_raft(&config, node, tls.clone(), (group_time.clone(), clock.clone())).await?;
    // Only now accept connections: before, a client (or a peer) would connect
    // and hang on a handshake nobody answers, instead of being refused at once
    // and trying another node.
    let grpc = listen(grpc, grpc_addr)?;
    let http = listen(http, http_addr)?;
    let peer = match (peer, peer_addr) {
        (Some(s), Some(a)) => Some(listen(s, a)?),
        _ => None,
    };
    let (raft, engine, log, identity, hub) = raft;
    let auth = auth::Auth::new(auth_file, engine.clone());

    let locks = lock_metrics::LockMetrics::new(config.lock_metrics_top, config.stuck_after);
    let metrics = Arc::new(Metrics { locks, data_dir: Some(config.data_dir.clone()), ..Metrics::default() });
    let (driver, handle) = Driver::new(raft.clone(), config.node_id, clock.clone(), metrics.clone(), config.max_batch);
    let driver = driver.with_seams(config.seams.clone());
    let driver = driver.with_max_inflight(config.max_inflight_writes);
    let driver = driver.with_linger(Some(driver::DEFAULT_LINGER));
    // A follower stands for election after one to two election timeouts of
    // silence; a leader silent from its majority for twice the longest of
    // those has almost surely been replaced.
    let driver = driver.with_quorum_timeout(config.election_timeout * 4);
    let id = identity.get();
    let driver = driver.with_cluster_id(Some(id.cluster_id.unwrap_or(id.proposed)));
    let (stop, stop_rx) = watch::channel(false);
    let (failed_tx, failed) = watch::channel(None);
    let audit = match &config.audit_log {
        Some(path) => {
            audit::Audit::open(path).map_err(|source| ServerError::AuditLog { path: path.clone(), source })?
        }
        None => audit::Audit::off(),
    };
    let quotas = Arc::new(quota::Quotas::new(config.limits));
    let ops = Ops {
        driver: handle,
        engine: engine.clone(),
        raft: raft.clone(),
        clock,
        quotas,
        audit: audit.clone(),
        hub: hub.clone(),
        group_time,
    };

    let mut tasks = vec![tokio::spawn(driver.run(stopped(stop_rx.clone())))];
    count_refusals(&hub, metrics.clone(), ops.clock.clone());
    tasks.push(tokio::spawn(stop_on(shutdown, stop.clone())));
    let watched = raft::identity::Watched {
        dir: config.data_dir.clone(),
        identity: identity.clone(),
        log,
        engine: engine.clone(),
        raft: raft.clone(),
    };
    tasks.push(tokio::spawn(raft::identity::watch(watched, failed_tx, stop_rx.clone())));
    let snapshots = raft::snapshot_policy::run(raft.clone(), engine.clone(), config.snapshot_every, stop_rx.clone());
    tasks.push(tokio::spawn(snapshots));
    let lock_svc = grpc::LockService::new(ops.clone(), auth.clone(), stop_rx.clone())
        .with_watch(hub.clone())
        .with_limits(&config.connections);
    let sessions = lock_svc.sessions();
    let lock_svc = LockServer::new(lock_svc).max_decoding_message_size(grpc::MAX_REQUEST_BYTES);
    let gate = conn_limits::Gate::new(config.connections.clone(), metrics.clone());
    let raft_svc = raft::network::RaftService::new(raft.clone(), ops.engine.clone(), metrics.clone())
        .with_tls(tls.clone())
        .with_stop(stop_rx.clone())
        .with_snapshot_limits(config.snapshot_limits)
        .with_handover(Arc::new(handover::Owners {
            raft: raft.clone(),
            driver: ops.driver.clone(),
            auth: auth.clone(),
        }))
        .into_server();
    if let Some(tls) = &tls {
        tasks.push(tokio::spawn(tls.clone().watch(stop_rx.clone())));
    }
    if auth.is_on() {
        tasks.push(tokio::spawn(auth.clone().watch(audit.clone(), stop_rx.clone())));
    }
    tasks.push(tokio::spawn(audit.run(stop_rx.clone())));
    let grpc_stop = stopped(stop_rx.clone());
    let (grpc, framed) = conn_limits::accept_grpc(grpc, gate.clone(), tls.clone().map(|t| (t, tls::Port::Grpc)));
    let grpc = handed_over(grpc);
    let hello_timeout = gate.limits().header_read_timeout;
    tasks.push(tokio::spawn(framed::serve(framed, sessions, hello_timeout, stop_rx.clone())));
    let server = || tonic::transport::Server::builder().max_concurrent_streams(grpc::MAX_STREAMS_PER_CONNECTION);
    // With a peer port, Raft is served there only; else next to the client API.
    let (client_router, raft_svc) = match peer {
        Some(_) => (server().add_service(lock_svc), Some(raft_svc)),
        None => (server().add_service(lock_svc).add_service(raft_svc), None),
    };
    tasks.push(tokio::spawn(async move {
        if let Err(e) = client_router.serve_with_incoming_shutdown(grpc, grpc_stop).await {
            tracing::error!(error = %e, "gRPC server failed");
        }
    }));
    if let (Some(peer), Some(raft_svc)) = (peer, raft_svc) {
        let peers = incoming(peer, &gate, tls.clone().map(|t| (t, tls::Port::Peer)));
        let peer_stop = stopped(stop_rx.clone());
        let router = server().add_service(raft_svc);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = router.serve_with_incoming_shutdown(peers, peer_stop).await {
                tracing::error!(error = %e, "peer gRPC server failed");
            }
        }));
    }
    let watch_source = watching::serve::Source { hub, stop: stop_rx.clone() };
    let router = admin::router_with_watch(ops, metrics, config.node_id, auth, tls.clone(), Some(watch_source));
    let http_stop = stopped(stop_rx);
    let header_read_timeout = gate.limits().header_read_timeout;
    let http = conn_limits::accept(http, gate, tls.map(|t| (t, tls::Port::Admin)));
    tasks.push(tokio::spawn(admin::serve(http, router, header_read_timeout, http_stop)));
    tracing::info!(%grpc_addr, %http_addr, peer_addr = ?peer_addr, data_dir = %config.data_dir.display(), "fencelock serving");
    Ok(Running { grpc_addr, http_addr, peer_addr, raft, identity, engine, failed, stop, tasks })
}

type Started =
    (raft::Raft, raft::state_machine::SharedEngine, raft::LogStore, raft::identity::SharedIdentity, Arc<watching::Hub>);

async fn start_raft(
    config: &Config,
    node: raft::Member,
    tls: Option<Arc<tls::ServerTls>>,
    (group_time, clock): (Arc<local_read::GroupTime>, Clock),
) -> Result<Started, ServerError> {
    let (log, sm, identity) =
        open_data_dir(config).map_err(|source| ServerError::Storage { dir: config.data_dir.clone(), source })?;
    let sm = sm.with_watch_history(config.watch_history).with_group_time(group_time, clock);
    let engine = sm.engine();
    let hub = sm.watch_hub();
    let log_store = log.clone();
    let election = config.election_timeout.as_millis() as u64;
    let rc = openraft::Config {
        cluster_name: "fencelock".into(),
        heartbeat_interval: config.heartbeat.as_millis() as u64,
        election_timeout_min: election,
        election_timeout_max: election * 2,
        // Taken by raft::snapshot_policy, which also weighs the state's size.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 1000,
        snapshot_max_chunk_size: 1024 * 1024,
        install_snapshot_timeout: raft::network::SNAPSHOT_CALL_TIMEOUT.as_millis() as u64,
        ..Default::default()
    }
    .validate()
    .map_err(ServerError::raft("its configuration"))?;
    let network = raft::network::Network::new(config.node_id, tls).with_routes(config.peer_routes.clone());
    let raft =
        raft::Raft::new(config.node_id, Arc::new(rc), network, log, sm).await.map_err(ServerError::raft("start"))?;
    let initialized = raft.is_initialized().await.map_err(ServerError::raft("read whether the group is formed"))?;
    if !initialized {
        bootstrap(&raft, config, node).await?;
    } else {
        cluster::check_bootstrap_flags(&raft, config)?;
    }
    Ok((raft, engine, log_store, identity, hub))
}

/// Opens the data dir of `config` for serving (see [`raft::identity::open`]).
#[allow(clippy::result_large_err)] // openraft's StorageError is large by design
pub(crate) fn open_data_dir(
    config: &Config,
) -> Result<(raft::LogStore, raft::StateMachine, raft::identity::SharedIdentity), raft::identity::IdentityError> {
    let storage = |admit: raft::log_store::Admit<'_>| {
        raft::log_store::open_admitted(&config.data_dir, &config.seams, config.log, admit)
    };
    raft::identity::open(&raft::identity::Node {
        dir: &config.data_dir,
        id: config.node_id,
        force_new_cluster: config.force_new_cluster,
        bootstrap: &config.bootstrap,
        storage: &storage,
    })
}

/// Forms the group on a node whose storage is empty (see [`Bootstrap`]).
async fn bootstrap(raft: &raft::Raft, config: &Config, node: raft::Member) -> Result<(), ServerError> {
    let members = match &config.bootstrap {
        Bootstrap::Single => BTreeMap::from([(config.node_id, node)]),
        // Every listed node initializes with the same voters: the same first
        // entry on each, so it does not matter which of them comes up first.
        Bootstrap::Peers(peers) => cluster::initial_members(peers),
        Bootstrap::Join => {
            tracing::info!(
                node_id = config.node_id,
                "empty node waiting to be added to a group (fencelock cluster add)"
            );
            return Ok(());
        }
    };
    raft.initialize(members).await.map_err(ServerError::raft("form the group"))
}

/// This node as the membership records it: the address clients and peers use.
fn own_member(config: &Config, grpc_addr: SocketAddr, peer_addr: Option<SocketAddr>) -> raft::Member {
    let addr = config.advertise.clone().unwrap_or_else(|| grpc_addr.to_string());
    let peer = peer_addr.map(|p| config.peer_advertise.clone().unwrap_or_else(|| p.to_string()));
    raft::Member::with_peer(addr, peer)
}

/// The gRPC port's connections as tonic takes them: admitted by `gate`, with
/// Nagle's algorithm off, through TLS if on (see [`conn_limits::accept`]).
/// The connections handed over on `rx`, as tonic takes them.
fn handed_over(rx: conn_limits::Admitted) -> impl tokio_stream::Stream<Item = std::io::Result<conn_limits::Stream>> {
    use tokio_stream::StreamExt as _;
    ReceiverStream::new(rx).map(|(conn, _peer)| Ok(conn))
}

fn incoming(
    listener: TcpListener,
    gate: &Arc<conn_limits::Gate>,
    tls: conn_limits::ListenerTls,
) -> impl tokio_stream::Stream<Item = std::io::Result<conn_limits::Stream>> {
    use tokio_stream::StreamExt as _;
    ReceiverStream::new(conn_limits::accept(listener, gate.clone(), tls)).map(|(conn, _peer)| Ok(conn))
}

/// A socket bound to `addr` (so its port is taken and known) that does not
/// accept connections yet.
fn reserve(addr: SocketAddr) -> Result<TcpSocket, ServerError> {
    let bind_err = |source| ServerError::Bind { addr, source };
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(bind_err)?;
    // As `TcpListener::bind` does: a restart can take the port again at once.
    socket.set_reuseaddr(true).map_err(bind_err)?;
    socket.bind(addr).map_err(bind_err)?;
    Ok(socket)
}

fn reserved_addr(s: &TcpSocket, addr: SocketAddr) -> Result<SocketAddr, ServerError> {
    s.local_addr().map_err(|source| ServerError::Bind { addr, source })
}

fn listen(s: TcpSocket, addr: SocketAddr) -> Result<TcpListener, ServerError> {
    s.listen(1024).map_err(|source| ServerError::Bind { addr, source })
}

/// Turns `stop` true when `shutdown` resolves; returns at once when `stop`
/// turns true first.
async fn stop_on(shutdown: impl std::future::Future<Output = ()>, stop: watch::Sender<bool>) {
    let mut rx = stop.subscribe();
    tokio::select! {
        _ = shutdown => {
            let _ = stop.send(true);
        }
        _ = rx.wait_for(|s| *s) => {}
    }
}

/// Counts the `write_refused` events this node applies into its per-lock
/// metrics ([`lock_metrics`]), as the hub publishes them: any member's
/// `/metrics` shows the refusals of the whole group. (Here, where the hub and
/// the metrics meet, so that neither module imports the other.)
fn count_refusals(hub: &watching::Hub, metrics: Arc<Metrics>, clock: Clock) {
    use watching::events::Kind;
    let counted = hub.tap(Box::new(move |batch| {
        for e in batch.iter().filter(|e| e.kind == Kind::WriteRefused) {
            if let Ok(lock) = fencelock_core::LockName::new(e.lock.clone()) {
                metrics.locks.refused(clock.now(), &lock);
            }
        }
    }));
    if !counted {
        tracing::error!("internal: the watch hub has a tap already; refused writes are not counted per lock");
    }
}

/// Resolves when `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// A data dir that is refused comes back as `ServerError::Storage` whose
    /// source is the identity check's own error, not its text.
    #[tokio::test]
    async fn a_refused_data_dir_keeps_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new(dir.path());
        config.grpc_listen = "127.0.0.1:0".parse().unwrap();
        config.http_listen = "127.0.0.1:0".parse().unwrap();
        let Err(err) = start(config).await else { panic!("an empty existing data dir must be refused") };
        assert!(matches!(err, ServerError::Storage { .. }), "{err:?}");
        let source = err.source().expect("the storage error keeps its source");
        let identity = source.downcast_ref::<raft::identity::IdentityError>().expect("an IdentityError");
        assert!(matches!(identity, raft::identity::IdentityError::EmptyDir { .. }), "{identity:?}");
    }
}
