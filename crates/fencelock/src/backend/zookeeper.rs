//! The ZooKeeper backend (`zk://h:p[,h:p…][/chroot][?prefix=/fencelock]`): a lock is
//! a queue of ephemeral sequential nodes, the holder is the first of them, and the
//! fencing token is the holder node's creation zxid.
//!
//! Where it sits: [`super::connect`] calls [`ZkBackend::connect`] for `zk://` and
//! `zookeeper://` URLs. The backend talks to the ensemble through the
//! `zookeeper-client` crate, but writes the lock recipe itself: the crate's built-in
//! recipe throws away the creation zxid, which is the token.
//!
//! # The recipe
//! Lock `name` lives under `{chroot}{prefix}/{enc(name)}`, where `enc`
//! percent-encodes every byte outside `[A-Za-z0-9_-]` (injective; no `/`, no `.`,
//! no character ZooKeeper refuses in a path). That parent is a container node,
//! created on demand (the server deletes it some time after it becomes empty).
//! 1. Create `{parent}/lock-{nonce}-` as an ephemeral sequential node of the
//!    session (the nonce, random per acquire, tells this request's node apart from
//!    the other requests of the same session).
//! 2. List the children and sort them by sequence number. If the own node is the
//!    first, the lock is granted: the token is the own node's czxid.
//! 3. Otherwise, with a zero wait, delete the own node and answer
//!    [`Acquire::Busy`] (with the first node's session and czxid). With a wait, set
//!    an exists-watch on the node just before the own one (the predecessor only, so
//!    a release wakes one waiter, not the herd): if it is gone already, go to 2 at
//!    once; otherwise wait for its deletion and go to 2 (an earlier node may still
//!    hold); at the end of the wait, delete the own node and answer
//!    [`Acquire::TimedOut`].
//!
//! The own node's data is the request's identity and value
//! ([`LockOptions::identity`], [`LockOptions::value`]): the identity's length in
//! two bytes (big-endian), the identity's UTF-8, then the value; empty when the
//! request carries neither.
//!
//! Dropping an acquire future withdraws the request: a drop guard deletes the own
//! node in a background task. Release is compare-and-delete by path: the own
//! node's name (the acquire's random nonce and its sequence number) is this
//! grant's alone, so deleting it at any version deletes this grant or
//! nothing; a node that is gone releases nothing. A new value
//! (`Guard::set_value`, `Leadership::proclaim`) is a setData of the own node at
//! any version, the same way: the identity is kept, and a node that is gone
//! (`NoNode`, or the session ended) sets nothing.
//!
//! # Sessions and the lease
//! The TTL of a lock is the ZooKeeper session timeout. The backend shares one
//! session per requested TTL among all its guards and acquires in flight (as
//! Curator shares one per client): a session is opened on demand, and closed when
//! its last user (guard, acquire or background release) is dropped, which deletes
//! every node it still owns. Sharing keeps the connection count at one per TTL in
//! use, and its cost is that one session's expiry loses every guard on it, which is
//! the truth: ZooKeeper deletes all of that session's nodes at once. A session
//! whose last user went is kept for [`SESSION_LINGER`] after its last use (it
//! owns no node by then: releases delete theirs), so that a loop of acquire →
//! release reuses it, as a Curator client keeps its one session for the life
//! of the process; without it every such cycle opened and closed a session, two
//! more fsynced transactions on the ensemble (the bench measured 3.4
//! transactions per cycle against 1.9). Dropping the backend closes lingering
//! sessions at once.
//!
//! The server negotiates the timeout into `[minSessionTimeout, maxSessionTimeout]`
//! (by default `[2, 20] × tickTime`), so the lease uses the *negotiated* timeout,
//! which may be longer or shorter than the TTL asked for. Each guard has its own
//! watchdog (`KeptLease`): every third of the timeout it reads the stat of its own
//! node, one round trip that proves both the session alive (the server touched it)
//! and the node present. The server expires a session one timeout after it last
//! heard from the client, so `sent + timeout` of a confirmed read is a safe
//! deadline. A watcher of the session state loses every guard of the session at
//! once ([`LeaseLost::NotFound`]) when the client learns that the session expired,
//! was closed or failed authentication.
//!
//! # Leader election
//! Curator's LeaderSelector recipe: a campaign is an acquire that fails with
//! [`Error::LeaseNotFound`] (rather than [`Error::Backend`]) as soon as the
//! client learns that its session ended, or finds its node gone, while it
//! waits. The leader is the first node, its term the node's czxid (the token),
//! its identity and value the node's data (a `proclaim` rewrites it). `observe`
//! re-reads the leader on every fire of a children watch on the queue or of a
//! data watch on the leader's node (see `zookeeper/election.rs`).
//!
//! # Read-write locks and semaphores
//! Curator's recipes (see `zookeeper/shared.rs`): a reader's node in the same
//! queue carries a `__READ__` mark and waits only for the last writer before
//! it (every other node, the exclusive lock's included, is a writer), so
//! readers share in strict FIFO order across modes; no downgrade. A semaphore
//! keeps one ephemeral lease node per grant (its weight in its name) under
//! `{parent}/leases`, whose data is N; an internal lock on `{parent}/locks`
//! admits one acquire at a time. Tokens are czxids here too.
//!
//! # Guarantees
//! * Tokens are the czxids of the queue nodes: ZooKeeper's one transaction
//!   counter, logged (fsynced by default) before the create is acknowledged, so
//!   they never go back, even across a crash (durable). They strictly increase
//!   per lock in grant order ([`Fencing::PerLock`]), but not across locks: a
//!   node is created when its request queues, so a grant that waited carries
//!   the zxid of its arrival, which may be lower than the token of a grant of
//!   another lock that came and went meanwhile.
//! * FIFO: sequence numbers order the queue by arrival; a release wakes only the
//!   next waiter (push, no polling).
//! * A crashed holder blocks others for at most the negotiated session timeout
//!   (rounded up to the server's tick).
//! * Survives the loss of a minority of the ensemble (a quorum decides).
//!
//! # Not guaranteed
//! * No lock-delay.
//! * A waiter whose session expires while it waits fails with [`Error::Backend`]
//!   (it lost its place in the queue); it does not requeue by itself.
//! * If a create's answer is lost (connection loss), the acquire fails and the
//!   cleanup looks for the node by its nonce; a create the server applies only
//!   after that look leaves a node that blocks the lock until its session closes
//!   (when its last user goes) or expires.
//! * Renewals are reads, answered by the server the client is connected to. A
//!   follower cut off from the leader still answers until it notices (within
//!   `syncLimit` ticks), while the leader may expire the session meanwhile: in
//!   an ensemble the deadline can be late by up to that window. (A standalone
//!   server has no such window.)
//! * zookeeper-client 0.11 doubles its delay between reconnection attempts
//!   without a cap within one outage (100 ms, 200 ms, 400 ms, …, bounded only by
//!   the session's own end), so after an outage of `d` the session may come back
//!   only about `2d` later: an outage longer than about a third of the timeout can
//!   lose a lease although the ensemble came back in time.
//! * A sequence counter wraps after 2^31 creations under a parent that never
//!   empties; ZooKeeper's own recipe has the same limit.

mod election;
mod shared;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, PoisonError, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::election::{encode_holder, encode_holder_parts, leadership_of};
use super::{
    check_name, BackendUrl, BoxFuture, Capabilities, Fencing, Guard, Held, KeptLease, Leader, LeaderStream, Leadership,
    LockBackend, Renew, Renewed,
};
use crate::backend::Acquire;
use crate::backoff::Backoff;
use crate::error::Error;
use crate::lease::LeaseLost;
use crate::types::{CheckResult, LockMode, LockOptions};

/// Where locks live under the chroot unless the URL says `?prefix=`.
pub const DEFAULT_PREFIX: &str = "/fencelock";

/// The smallest TTL declared: twice the smallest `tickTime` in use (100 ms). A
/// server raises a shorter request to its `minSessionTimeout` (by default
/// 2 × `tickTime`, 4 s with the default tick of 2 s); the lease then keeps the
/// negotiated timeout.
pub const MIN_TTL: Duration = Duration::from_millis(200);

/// Name prefix of the contender nodes under a lock's parent.
const NODE_PREFIX: &str = "lock-";
/// Bound of a connection attempt (every host of the URL tried once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Session timeout of the probe opened by `connect` and of the session `check`
/// opens when no lock session is live.
const PROBE_SESSION: Duration = Duration::from_secs(5);
/// Bound of one request (a request on a disconnected session waits for the
/// reconnection, which the client gives up after 7/5 of the session timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a session is kept after its last use (see the module docs).
pub const SESSION_LINGER: Duration = Duration::from_secs(2);

/// The ACL of the nodes the backend creates: anyone may do anything without
/// a login; with a digest login, only that identity (`creator_all`), so a
/// client without it can neither take these locks nor delete their nodes.
fn acls(login: &Login) -> zk::Acls<'static> {
    if login.auth.is_some() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    }
}

fn own_node(login: &Login) -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(acls(login))
}

fn lock_node(login: &Login) -> zk::CreateOptions<'static> {
    zk::CreateMode::Container.with_acls(acls(login))
}

fn base_node(login: &Login) -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(acls(login))
}

/// Where and as whom sessions are opened: the connect string and the
/// `digest` credentials (`user:password`), if the URL gives them.
#[derive(Clone)]
struct Login {
    /// `h:p,h:p` for the client.
    hosts: String,
    auth: Option<String>,
}

/// Locks on a ZooKeeper ensemble. See the [module docs](self) for the recipe.
pub struct ZkBackend {
    login: Login,
    /// `{chroot}{prefix}`: the parent of every lock's node.
    base: String,
    /// The shared sessions, by requested TTL. Held weakly: the guards and acquires
    /// own them, and the last one to go closes the session.
    sessions: tokio::sync::Mutex<HashMap<Duration, Weak<Session>>>,
    /// The last session used for each TTL and when, kept for [`SESSION_LINGER`].
    lingering: Arc<StdMutex<HashMap<Duration, Lingering>>>,
}

/// A session kept after its last use.
struct Lingering {
    session: Arc<Session>,
    last_used: Instant,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("hosts", &self.login.hosts)
            .field("digest_auth", &self.login.auth.is_some())
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ZkBackend {
    /// Connects to the ensemble of `url` and creates the base path. Fails with
    /// [`Error::InvalidArgument`] for a bad chroot or prefix, [`Error::Connect`]
    /// if no host of the URL answers within a few seconds.
    pub async fn connect(url: &BackendUrl) -> Result<Self, Error> {
        let (hosts, base) = parse_url(url)?;
        let auth = url.user().map(|user| format!("{user}:{}", url.password().unwrap_or_default()));
        let login = Login { hosts: hosts.clone(), auth };
        let probe = open_client(&login, PROBE_SESSION).await.map_err(|e| Error::connect(format!("zk {hosts}: {e}")))?;
        match request(probe.mkdir(&base, &base_node(&login))).await {
            Ok(()) => {}
            Err(zk::Error::ConnectionLoss | zk::Error::Timeout) => {
                return Err(Error::connect(format!("zk {hosts}: the connection was lost while creating {base}")));
            }
            Err(e) => return Err(fail(&format!("create the base path {base}"), e)),
        }
        let lingering = Arc::new(StdMutex::new(HashMap::new()));
        Ok(ZkBackend { login, base, sessions: tokio::sync::Mutex::new(HashMap::new()), lingering })
    }

    /// The connected session for `ttl`, opened if there is none. Opening holds
    /// the map's lock, so concurrent first acquires of one TTL share one session
    /// (and acquires of other TTLs wait for the opening, at most
    /// [`CONNECT_TIMEOUT`]). A session cut off from the ensemble is not handed
    /// to new acquires (its guards keep it): it may be reconnecting to a
    /// restarted server for a while, or expire, where a new session connects
    /// at once to whichever server answers (a kept session once delayed the
    /// first write after a restart of ZooKeeper by 4.6 s in chaos K4).
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>, Error> {
        let mut sessions = self.sessions.lock().await;
        if let Some(live) = sessions.get(&ttl).and_then(Weak::upgrade).filter(|s| s.is_connected()) {
            self.linger(ttl, &live);
            return Ok(live);
        }
        let session = Arc::new(Session::open(&self.login, ttl).await?);
        sessions.retain(|_, s| s.strong_count() > 0);
        sessions.insert(ttl, Arc::downgrade(&session));
        self.linger(ttl, &session);
        Ok(session)
    }

    /// Keeps `session` (for `ttl`) until [`SESSION_LINGER`] after now, its last
    /// use: one task per kept session ends it when that time passes unused.
    fn linger(&self, ttl: Duration, session: &Arc<Session>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let mut kept = self.lingering.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let same = kept.get(&ttl).is_some_and(|l| Arc::ptr_eq(&l.session, session));
        let fresh = kept.insert(ttl, Lingering { session: session.clone(), last_used: now }).is_none();
        if fresh || !same {
            runtime.spawn(end_lingering(Arc::downgrade(&self.lingering), ttl, session.clone()));
        }
    }

    /// Any live session of this backend, or a new one that is not shared (for
    /// reads).
    async fn any_session(&self) -> Result<Arc<Session>, Error> {
        let sessions = self.sessions.lock().await;
        if let Some(live) = sessions.values().filter_map(Weak::upgrade).find(|s| s.is_live()) {
            return Ok(live);
        }
        drop(sessions);
        Ok(Arc::new(Session::open(&self.login, PROBE_SESSION).await?))
    }

    /// The parent node of lock `name`.
    fn lock_path(&self, name: &str) -> String {
        format!("{}/{}", self.base, encode_name(name))
    }

    /// The recipe (see the module docs), for a lock or a campaign (`purpose`).
    async fn lock(&self, name: &str, opts: &LockOptions, purpose: Purpose) -> Result<Acquire<Guard>, Error> {
        self.capabilities().admit(self.kind(), name, opts)?;
        if purpose == Purpose::Campaign && (opts.permits > 0 || opts.mode == LockMode::Shared) {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        let session = self.session(opts.ttl).await?;
        if opts.permits > 0 {
            return self.semaphore(name, opts, session).await;
        }
        let queued = self.queue(name, opts, session.clone(), purpose);
        let result = match purpose {
            Purpose::Lock => queued.await,
            Purpose::Campaign => tokio::select! {
                biased;
                () = ended(&session) => Err(purpose.lost(format!("session {:#x} ended while waiting", session.id))),
                result = queued => result,
            },
        };
        match result {
            Err(e) if purpose == Purpose::Campaign && !session.is_live() => {
                Err(purpose.lost(format!("session {:#x} ended while waiting: {e}", session.id)))
            }
            other => other,
        }
    }

    /// Steps 1 to 3 of the recipe on `session`.
    async fn queue(
        &self,
        name: &str,
        opts: &LockOptions,
        session: Arc<Session>,
        purpose: Purpose,
    ) -> Result<Acquire<Guard>, Error> {
        let wait_end = Instant::now() + opts.wait;
        let stem = shared::queue_stem(opts.mode == LockMode::Shared);
        let mut entry = Entry::new(session.clone(), vec![self.lock_path(name)], stem);
        let (path, czxid) = entry.create(&self.base, &encode_holder(opts), &[]).await?;
        match self.wait_turn(&mut entry, &path, opts.wait, wait_end, purpose).await? {
            Turn::Granted(sent) => {
                entry.disarm();
                Ok(Acquire::Acquired(self.grant(name, opts, session, path, czxid, sent)))
            }
            Turn::NotGranted(outcome) => Ok(outcome),
        }
    }

    /// Steps 2 and 3 for the node `path` of `entry`: granted (with the time the
    /// confirming read was sent), or busy or timed out (the node withdrawn).
    async fn wait_turn(
        &self,
        entry: &mut Entry,
        path: &str,
        wait: Duration,
        wait_end: Instant,
        purpose: Purpose,
    ) -> Result<Turn, Error> {
        let session = entry.session.clone();
        let own = path.rsplit('/').next().unwrap_or_default().to_string();
        loop {
            let sent = Instant::now();
            let queue = list_queue(&session, &entry.parent).await?;
            let Some(pos) = queue.iter().position(|child| *child == own) else {
                return Err(purpose
                    .lost(format!("lock node {path} vanished while queued (session {:#x} expired?)", session.id)));
            };
            let Some(ahead) = shared::blocker(&queue, pos) else {
                return Ok(Turn::Granted(sent));
            };
            if wait.is_zero() {
                let busy = busy(&session, &entry.parent, &queue).await;
                entry.withdraw().await;
                return Ok(Turn::NotGranted(busy));
            }
            let predecessor = format!("{}/{}", entry.parent, queue[ahead]);
            if !wait_for_deletion(&session, &predecessor, wait_end).await? {
                entry.withdraw().await;
                return Ok(Turn::NotGranted(Acquire::TimedOut));
            }
        }
    }

    /// The guard of a grant of `opts`: node `path` with `czxid`, confirmed by a
    /// request sent at `sent`.
    fn grant(
        &self,
        name: &str,
        opts: &LockOptions,
        session: Arc<Session>,
        path: String,
        czxid: u64,
        sent: Instant,
    ) -> Guard {
        let renew = Arc::new(NodeCheck { session: Arc::downgrade(&session), path: path.clone() });
        let lease = Arc::new(KeptLease::start(session.id, session.timeout, sent, renew));
        session.register(&lease);
        let watch = lease.watch();
        let held = ZkHeld { session, path, identity: opts.identity.clone(), _lease: lease };
        Guard::new(name.to_string(), Some(czxid), self.kind(), watch, Box::new(held))
    }

    /// Reads who holds `name` (the queue's holders, the semaphore's lease
    /// nodes), and whether `token` is one of their czxids.
    async fn check_token(&self, name: &str, token: u64) -> Result<CheckResult, Error> {
        check_name(name)?;
        let session = self.any_session().await?;
        let tokens = self.holder_tokens(&session, name).await?;
        let current = tokens.contains(&token);
        let current_token = if current { Some(token) } else { tokens.into_iter().max() };
        Ok(CheckResult { current, current_token })
    }
}

impl LockBackend for ZkBackend {
    fn kind(&self) -> &'static str {
        "zk"
    }

    /// Per-lock durable tokens (czxids, logged before the create is acknowledged),
    /// FIFO with a push to the next waiter only, session expiry on the server, a
    /// quorum ensemble, the holder's identity and value in its node (shown by
    /// `leader`), leader election, read-write locks and semaphores (Curator's
    /// recipes, see `zookeeper/shared.rs`; no downgrade); no lock-delay.
    /// `min_ttl` is `MIN_TTL`; the server may raise it (see there).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::PerLock,
            durable_tokens: true,
            fifo: true,
            push_wakeup: true,
            server_ttl: true,
            survives_failover: true,
            lock_delay: false,
            holder_identity: true,
            election: true,
            shared: true,
            semaphores: true,
            hold_at_least: false,
            once_per: false,
            multi_lock: false,
            min_ttl: MIN_TTL,
        }
    }

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Acquire<Guard>, Error>> {
        Box::pin(self.lock(name, opts, Purpose::Lock))
    }

    /// The acquire, except that the end of the candidate's session (or the
    /// loss of its node) ends it with [`Error::LeaseNotFound`].
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Acquire<Leadership>, Error>> {
        Box::pin(async move { leadership_of(self.lock(name, opts, Purpose::Campaign).await?, &opts.value) })
    }

    /// The lock's first node.
    fn leader<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Leader>, Error>> {
        Box::pin(self.leader_of(name))
    }

    /// A children watch on the lock's node (see the module docs).
    fn observe<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LeaderStream, Error>> {
        Box::pin(self.observe_election(name))
    }

    /// Current iff `token` is the czxid of a node that holds the lock: the
    /// first node, the readers before the first writer, or a semaphore's lease
    /// node (whose session the server has not expired yet). `current_token` is
    /// `token` if current, else the highest holder's czxid.
    fn check<'a>(&'a self, name: &'a str, token: u64) -> BoxFuture<'a, Result<CheckResult, Error>> {
        Box::pin(self.check_token(name, token))
    }
}

/// Where a queued node's wait ended.
enum Turn {
    /// First in line for its mode; the confirming read was sent at this instant.
    Granted(Instant),
    /// Busy or timed out; the node is withdrawn.
    NotGranted(Acquire<Guard>),
}

/// What a request is for, which decides what losing its place means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A lock: the acquire fails ([`Error::Backend`]).
    Lock,
    /// A campaign: a candidate whose session ended is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does.
    Campaign,
}

impl Purpose {
    /// The error of a request that lost its session or node while waiting.
    fn lost(self, why: String) -> Error {
        match self {
            Purpose::Lock => Error::backend("zk", why),
            Purpose::Campaign => Error::LeaseNotFound(format!("zk: {why}")),
        }
    }
}

/// One ZooKeeper session shared by the guards of one TTL. Dropping the last
/// reference closes it (the server then deletes its nodes).
struct Session {
    client: zk::Client,
    login: Login,
    /// The session id (the guards' lease id).
    id: u64,
    /// The negotiated session timeout.
    timeout: Duration,
    /// The leases of the guards on this session, lost together when it ends.
    leases: Arc<StdMutex<Vec<Weak<KeptLease>>>>,
    /// Watches the session state; aborted on drop.
    watcher: JoinHandle<()>,
}

impl Session {
    /// Opens a session asking for `ttl` as its timeout.
    async fn open(login: &Login, ttl: Duration) -> Result<Session, Error> {
        let hosts = &login.hosts;
        let client = open_client(login, ttl).await.map_err(|e| Error::backend("zk", format!("{hosts}: {e}")))?;
        let leases = Arc::new(StdMutex::new(Vec::new()));
        let watcher = tokio::spawn(lose_all_when_ended(client.state_watcher(), leases.clone()));
        let id = client.session_id().0 as u64;
        let timeout = client.session_timeout();
        Ok(Session { client, login: login.clone(), id, timeout, leases, watcher })
    }

    /// True until the client learns that the session ended.
    fn is_live(&self) -> bool {
        !self.client.state().is_terminated()
    }

    /// Whether the session is connected to a server now.
    fn is_connected(&self) -> bool {
        matches!(self.client.state(), zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly)
    }

    /// Adds a guard's lease to those lost when the session ends (at once if it
    /// ended already).
    fn register(&self, lease: &Arc<KeptLease>) {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        leases.retain(|l| l.strong_count() > 0);
        leases.push(Arc::downgrade(lease));
        drop(leases);
        if !self.is_live() {
            lease.lose(LeaseLost::NotFound);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Drops the kept session for `ttl` once [`SESSION_LINGER`] has passed since
/// its last use (or when another session replaced it, or the backend is gone).
async fn end_lingering(kept: Weak<StdMutex<HashMap<Duration, Lingering>>>, ttl: Duration, session: Arc<Session>) {
    let session = Arc::downgrade(&session);
    loop {
        let until = {
            let Some(kept) = kept.upgrade() else { return };
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(l) = kept.get(&ttl).filter(|l| Weak::ptr_eq(&Arc::downgrade(&l.session), &session)) else {
                return;
            };
            let until = l.last_used + SESSION_LINGER;
            if Instant::now() >= until {
                kept.remove(&ttl);
                return;
            }
            until
        };
        tokio::time::sleep_until(until).await;
    }
}

/// Waits until the session ends (expired, closed, authentication failed), then
/// loses every lease registered on it.
async fn lose_all_when_ended(states: zk::StateWatcher, leases: Arc<StdMutex<Vec<Weak<KeptLease>>>>) {
    let state = terminal_state(states).await;
    tracing::warn!(%state, "fencelock: zk session ended; its locks are lost");
    let leases = std::mem::take(&mut *leases.lock().unwrap_or_else(PoisonError::into_inner));
    for lease in leases.iter().filter_map(Weak::upgrade) {
        lease.lose(LeaseLost::NotFound);
    }
}

/// Resolves once the client learns that `session` ended.
async fn ended(session: &Session) {
    terminal_state(session.client.state_watcher()).await;
}

/// The state that ends the session `states` watches, once it comes.
async fn terminal_state(mut states: zk::StateWatcher) -> zk::SessionState {
    let mut state = states.state();
    while !state.is_terminated() {
        state = states.changed().await;
    }
    state
}

/// A new client session with `timeout` asked for, logged in with `digest`
/// if `login` says so; every host is tried once.
async fn open_client(login: &Login, timeout: Duration) -> Result<zk::Client, String> {
    let mut connector = zk::Client::connector().with_session_timeout(timeout).with_fail_eagerly();
    if let Some(auth) = &login.auth {
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    let connect = connector.connect(&login.hosts);
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(format!("cannot open a session: {e}")),
        Err(_) => Err(format!("no session within {} s", CONNECT_TIMEOUT.as_secs())),
    }
}

/// One acquire's place in a lock's queue, and its drop guard: dropped while it
/// still owns (or may own) a node, it deletes that node in the background.
struct Entry {
    session: Arc<Session>,
    /// The containers the node lives in, outermost first, created on demand.
    containers: Vec<String>,
    /// The lock's parent node (the last of `containers`).
    parent: String,
    /// `lock-{nonce}-`: the own node's name before its sequence number.
    stem: String,
    own: Own,
}

/// What an [`Entry`] owns on the server.
#[derive(Debug, Default)]
enum Own {
    #[default]
    Nothing,
    /// A create was sent and not answered (yet, or its answer was lost): a node
    /// with the stem may exist.
    Unknown,
    /// This node.
    Node(String),
}

impl Entry {
    /// An entry under the last of `containers`, named `{prefix}{nonce}-{mark}`
    /// (`stem` is `(prefix, mark)`).
    fn new(session: Arc<Session>, containers: Vec<String>, stem: (&str, &str)) -> Entry {
        let parent = containers.last().cloned().unwrap_or_default();
        let stem = format!("{}{:016x}-{}", stem.0, crate::unique::u64(), stem.1);
        Entry { session, containers, parent, stem, own: Own::Nothing }
    }

    /// Creates the own node with `data` (and the containers if missing, the
    /// parent with `parent_data`): its path and czxid.
    async fn create(&mut self, base: &str, data: &[u8], parent_data: &[u8]) -> Result<(String, u64), Error> {
        let prefix = format!("{}/{}", self.parent, self.stem);
        // The parent may be missing, or deleted as an empty container between our
        // creating it and our node: a few tries.
        for _ in 0..3 {
            self.own = Own::Unknown;
            match request(self.session.client.create(&prefix, data, &own_node(&self.session.login))).await {
                Ok((stat, sequence)) => {
                    let path = format!("{prefix}{sequence}");
                    self.own = Own::Node(path.clone());
                    return match u64::try_from(stat.czxid) {
                        Ok(czxid) if czxid > 0 => Ok((path, czxid)),
                        _ => Err(Error::backend("zk", format!("create answered czxid {}", stat.czxid))),
                    };
                }
                Err(zk::Error::NoNode) => {
                    self.own = Own::Nothing;
                    ensure_containers(&self.session, base, &self.containers, parent_data).await?;
                }
                Err(e) => {
                    if refused(&e) || session_ended(&e) {
                        self.own = Own::Nothing;
                    }
                    return Err(fail("create the lock node", e));
                }
            }
        }
        Err(Error::backend("zk", format!("the lock node {} keeps disappearing", self.parent)))
    }

    /// The caller owns the node now: dropping the entry leaves it.
    fn disarm(&mut self) {
        self.own = Own::Nothing;
    }

    /// Deletes the own node now (one try, for at most a session timeout); if that
    /// fails, dropping the entry retries in the background.
    async fn withdraw(&mut self) {
        if let Own::Node(path) = &self.own {
            let deleted = tokio::time::timeout(self.session.timeout, delete_node(&self.session, path)).await;
            if matches!(deleted, Ok(Ok(_))) {
                self.own = Own::Nothing;
            }
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let own = std::mem::take(&mut self.own);
        if matches!(own, Own::Nothing) {
            return;
        }
        // Without a runtime the node lives until its session closes, which
        // happens when the session's last user goes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (session, parent, stem) = (self.session.clone(), self.parent.clone(), self.stem.clone());
            runtime.spawn(async move { remove(&session, &parent, &stem, own).await });
        }
    }
}

/// Deletes what an entry owns: its node, or any node with its stem if the create's
/// answer was lost. Retries on connection trouble until twice the session timeout;
/// gives up silently after (the node then goes with the session).
async fn remove(session: &Session, parent: &str, stem: &str, own: Own) {
    let path = match own {
        Own::Nothing => return,
        Own::Node(path) => path,
        Own::Unknown => match find_by_stem(session, parent, stem).await {
            Some(path) => path,
            None => return,
        },
    };
    delete_with_retries(session, &path).await;
}

/// The node under `parent` whose name starts with `stem`, if any (read errors: none).
async fn find_by_stem(session: &Session, parent: &str, stem: &str) -> Option<String> {
    let children = request(session.client.list_children(parent)).await.ok()?;
    children.into_iter().find(|c| c.starts_with(stem)).map(|c| format!("{parent}/{c}"))
}

/// [`delete_node`] until it answers, for at most twice the session timeout.
async fn delete_with_retries(session: &Session, path: &str) {
    let end = Instant::now() + (2 * session.timeout).max(Duration::from_secs(2));
    let backoff = Backoff::default();
    for attempt in 0.. {
        match delete_node(session, path).await {
            Ok(_) => return,
            Err(e) if Instant::now() >= end => {
                tracing::debug!(path, error = %e, "fencelock: zk node not deleted; it goes with its session");
                return;
            }
            Err(_) => tokio::time::sleep(backoff.delay(attempt, fastrand::f64())).await,
        }
    }
}

/// Compare-and-delete of a node of ours (by its path, which no other request
/// has; at any version, as a new value changes it): deleted → `true`; gone
/// (or its session ended, which deletes it) → `false`; [`Error::Backend`]
/// when the outcome is unknown.
async fn delete_node(session: &Session, path: &str) -> Result<bool, Error> {
    match request(session.client.delete(path, None)).await {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode | zk::Error::BadVersion) => Ok(false),
        Err(e) if session_ended(&e) => Ok(false),
        Err(e) => Err(fail("delete the lock node", e)),
    }
}

/// Creates the containers `paths` (outermost first; the last with `data`)
/// where missing, and the base path if it is missing too.
async fn ensure_containers(session: &Session, base: &str, paths: &[String], data: &[u8]) -> Result<(), Error> {
    let client = &session.client;
    let (lock, base_options) = (lock_node(&session.login), base_node(&session.login));
    for _ in 0..3 {
        let mut missing = false;
        for (i, path) in paths.iter().enumerate() {
            let data = if i + 1 == paths.len() { data } else { &[] };
            match request(client.create(path, data, &lock)).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(zk::Error::NoNode) => {
                    missing = true;
                    break;
                }
                Err(e) => return Err(fail("create the lock's parent node", e)),
            }
        }
        if !missing {
            return Ok(());
        }
        request(client.mkdir(base, &base_options)).await.map_err(|e| fail("create the base path", e))?;
    }
    Err(Error::backend("zk", format!("the lock's parent nodes {paths:?} keep disappearing")))
}

/// The contender nodes under `parent`, first in line first (an absent parent has
/// none).
async fn list_queue(session: &Session, parent: &str) -> Result<Vec<String>, Error> {
    match request(session.client.list_children(parent)).await {
        Ok(children) => Ok(queue_order(children)),
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(fail("list the lock's queue", e)),
    }
}

/// Keeps the contender nodes among `children` and sorts them by sequence number.
fn queue_order(children: Vec<String>) -> Vec<String> {
    let mut queue: Vec<(i64, String)> = children.into_iter().filter_map(|c| Some((sequence(&c)?, c))).collect();
    queue.sort_unstable();
    queue.into_iter().map(|(_, c)| c).collect()
}

/// The sequence number of a contender node `lock-{nonce}-{digits}`; `None` for
/// any other name.
fn sequence(child: &str) -> Option<i64> {
    let (_, digits) = child.strip_prefix(NODE_PREFIX)?.rsplit_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// [`Acquire::Busy`] for a queue whose first node is the holder: its session and
/// czxid if it can still be read, and the others but us as waiters.
async fn busy(session: &Session, parent: &str, queue: &[String]) -> Acquire<Guard> {
    let holder = match queue.first() {
        Some(first) => request(session.client.check_stat(&format!("{parent}/{first}"))).await.ok().flatten(),
        None => None,
    };
    Acquire::Busy {
        holder_lease: holder.map(|s| s.ephemeral_owner as u64),
        holder_token: holder.and_then(|s| u64::try_from(s.czxid).ok()),
        reopens_in: None,
        waiters: u32::try_from(queue.len().saturating_sub(2)).unwrap_or(u32::MAX),
    }
}

/// Waits until node `path` is deleted (`true`, also when it is gone already or
/// the watch ends for another reason: the caller re-reads the queue) or until
/// `until` (`false`).
async fn wait_for_deletion(session: &Session, path: &str, until: Instant) -> Result<bool, Error> {
    let (stat, watcher) =
        request(session.client.check_and_watch_stat(path)).await.map_err(|e| fail("watch the predecessor", e))?;
    if stat.is_none() {
        return Ok(true);
    }
    tokio::select! {
        _ = watcher.changed() => Ok(true),
        _ = tokio::time::sleep_until(until) => Ok(false),
    }
}

/// The held lock: the own node on a session, kept by a watchdog.
struct ZkHeld {
    session: Arc<Session>,
    path: String,
    /// The request's identity, stored again with each new value.
    identity: Option<String>,
    /// Renewed while this lives; the session's state watcher holds it weakly, to
    /// lose it when the session ends.
    _lease: Arc<KeptLease>,
}

impl Held for ZkHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move { delete_node(&self.session, &self.path).await })
    }

    fn release_in_background(self: Box<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { delete_with_retries(&self.session, &self.path).await });
        }
    }

    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let data = encode_holder_parts(self.identity.as_deref(), &value);
        Some(Box::pin(async move {
            match request(self.session.client.set_data(&self.path, &data, None)).await {
                Ok(_) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(e) if session_ended(&e) => Ok(false),
                Err(e) => Err(fail("set the lock node's data", e)),
            }
        }))
    }

    /// A node's mode is in its name: see `zookeeper/shared.rs`.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async {
            Err(Error::Unsupported(
                "zk cannot downgrade a writer (its mode is its node's name); release and acquire shared".into(),
            ))
        }))
    }
}

/// One renewal: read the own node's stat. Present and ours → confirmed for the
/// negotiated timeout; gone, or the session ended → `Renewed::Gone`.
struct NodeCheck {
    /// Weak: the guard keeps the session, not its watchdog.
    session: Weak<Session>,
    path: String,
}

impl Renew for NodeCheck {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let Some(session) = self.session.upgrade() else {
                return Ok(Renewed::Gone);
            };
            let read = tokio::time::timeout_at(round_end, session.client.check_stat(&self.path)).await;
            match read {
                Err(_) => Err(Error::backend("zk", "renewal round timed out")),
                Ok(Ok(Some(stat))) if stat.ephemeral_owner as u64 == session.id => {
                    Ok(Renewed::Confirmed(Some(session.timeout)))
                }
                Ok(Ok(_)) => Ok(Renewed::Gone),
                Ok(Err(e)) if session_ended(&e) => Ok(Renewed::Gone),
                Ok(Err(e)) => Err(fail("renew", e)),
            }
        })
    }
}

/// Errors after which the session, and every node it owned, is gone.
fn session_ended(e: &zk::Error) -> bool {
    matches!(e, zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed)
}

/// Errors the server answers when it refuses a write (nothing changed).
fn refused(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::NodeExists
            | zk::Error::NoAuth
            | zk::Error::InvalidAcl
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::BadArguments(_)
            | zk::Error::QuotaExceeded
    )
}

/// [`Error::Backend`] caused by `e`; [`Error::Security`] if the server
/// refused it for want of rights (`NoAuth`) or refused the login.
fn fail(what: &str, e: zk::Error) -> Error {
    match e {
        zk::Error::NoAuth => Error::security(
            format!("zk: {what}: not authorized: the node's ACL does not admit this client (digest login user:password@ of the identity that created it)"),
            e,
        ),
        zk::Error::AuthFailed => Error::security(format!("zk: {what}: the server refused the login"), e),
        e => Error::backend_caused("zk", format!("{what}: {e}"), e),
    }
}

/// A request bounded by [`REQUEST_TIMEOUT`] (then [`zk::Error::Timeout`]).
async fn request<T>(f: impl Future<Output = Result<T, zk::Error>>) -> Result<T, zk::Error> {
    tokio::time::timeout(REQUEST_TIMEOUT, f).await.unwrap_or(Err(zk::Error::Timeout))
}

/// The ZooKeeper path component of lock `name`: every byte outside
/// `[A-Za-z0-9_-]` as `%XX`. Injective (`%` itself is encoded), never `.` or
/// `..`, never a `/` or a character ZooKeeper refuses.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The client's connect string (`h:p,[v6]:p`) and the base path
/// (`/{chroot}{prefix}`) of `url`.
fn parse_url(url: &BackendUrl) -> Result<(String, String), Error> {
    if url.userinfo.is_some() && (url.user().is_none() || url.password().is_none()) {
        return Err(Error::InvalidArgument(format!("{url}: zk digest auth needs user:password@")));
    }
    let hosts: Vec<String> = url
        .hosts
        .iter()
        .map(|(h, p)| if h.contains(':') { format!("[{h}]:{p}") } else { format!("{h}:{p}") })
        .collect();
    let chroot = if url.path.is_empty() { String::new() } else { format!("/{}", url.path) };
    let prefix = url.param("prefix").unwrap_or(DEFAULT_PREFIX);
    if !prefix.starts_with('/') {
        return Err(Error::InvalidArgument(format!("{url}: prefix {prefix:?} must start with /")));
    }
    let base = format!("{chroot}{prefix}");
    check_path(&base).map_err(|why| Error::InvalidArgument(format!("{url}: path {base:?} {why}")))?;
    Ok((hosts.join(","), base))
}

/// Is `path` an absolute ZooKeeper path other than `/` that ZooKeeper accepts?
fn check_path(path: &str) -> Result<(), &'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("is not absolute");
    };
    for part in rest.split('/') {
        match part {
            "" => return Err("has an empty component"),
            "." | ".." => return Err("has a . or .. component"),
            _ if part.chars().any(refused_in_path) => return Err("has a character ZooKeeper refuses"),
            _ => {}
        }
    }
    Ok(())
}

/// Characters ZooKeeper's `PathUtils.validatePath` refuses (surrogates are no `char`).
fn refused_in_path(c: char) -> bool {
    c.is_control() || ('\u{e000}'..='\u{f8ff}').contains(&c) || ('\u{fff0}'..='\u{ffff}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_encode_injectively_into_one_path_component() {
        let names = ["jobs/nightly", "jobs", "jobs/nightly/x", "..", ".", "%2F", "/", "ключ", "a b", "a-b_C9"];
        let encoded: Vec<String> = names.iter().map(|n| encode_name(n)).collect();
        for (name, enc) in names.iter().zip(&encoded) {
            assert!(!enc.contains('/') && !enc.contains('.') && !enc.is_empty(), "{name:?} → {enc:?}");
            assert!(check_path(&format!("/{enc}")).is_ok(), "{name:?} → {enc:?}");
        }
        let mut unique = encoded.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{encoded:?}");
        assert_eq!(encode_name("a-b_C9"), "a-b_C9");
        assert_eq!(encode_name("%2F"), "%252F");
        assert_eq!(encode_name("/"), "%2F");
    }

    #[test]
    fn the_queue_is_ordered_by_sequence_and_ignores_foreign_nodes() {
        let children = ["lock-ab-0000000010", "other", "lock-cd-0000000002", "lock-x-", "lock-ef-0000000007"];
        let queue = queue_order(children.iter().map(|c| c.to_string()).collect());
        assert_eq!(queue, ["lock-cd-0000000002", "lock-ef-0000000007", "lock-ab-0000000010"]);
        assert_eq!(sequence("lock-0123abcd-0000000042"), Some(42));
        assert_eq!(sequence("lock-0123abcd-"), None);
    }

    #[test]
    fn urls_give_hosts_and_base_path() {
        let parse = |u: &str| parse_url(&BackendUrl::parse(u).unwrap());
        assert_eq!(parse("zk://a:1,b,[::1]:3").unwrap(), ("a:1,b:2181,[::1]:3".into(), "/fencelock".into()));
        assert_eq!(parse("zk://a/app/x?prefix=/locks").unwrap().1, "/app/x/locks");
        for bad in
            ["zk://a?prefix=locks", "zk://a?prefix=/", "zk://a/../x", "zk://u@a", "zk://:p@a", "zk://a?prefix=/a//b"]
        {
            assert!(matches!(parse(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }
}
