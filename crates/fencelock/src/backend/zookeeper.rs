//! The ZooKeeper backend (`zk://h:p[,h:p…][/chroot][?prefix=/fencelock]`): a lock is
//! a queue of ephemeral sequential nodes, the holder is the first of them, and the
//! fencing token is the holder node's creation zxid.
//!
//! Where it sits: [`super::connect`] calls [`ZkBackend::connect`] for `zk://` and
//! `zookeeper://` URLs. The backend talks to the ensemble through the
//! `zookeeper-client` crate, but writes the lock recipe itself: the crate's built-in
//! recipe throws away the creation zxid, which is the token. Laid out by
//! concern, one module each: `session` (the connection: shared sessions, the
//! bound on each request, driver errors), `keys` (the node layout,
//! readers' and writers' places in the queue, ACLs), `params` (the URL), `recipe` (queue, wait for the predecessor,
//! check), `entry` (one request's node, its create and its cleanup), `held`
//! (the guard: renewal, release, new value), `shared` (read-write locks and
//! semaphores) and `election`.
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
//!    [`Outcome::Busy`] (with the first node's session and czxid). With a wait, set
//!    an exists-watch on the node just before the own one (the predecessor only, so
//!    a release wakes one waiter, not the herd): if it is gone already, go to 2 at
//!    once; otherwise wait for its deletion and go to 2 (an earlier node may still
//!    hold); at the end of the wait, delete the own node and answer
//!    [`Outcome::TimedOut`].
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
//! owns no node by then: releases delete theirs, and a release whose answer
//! is lost retries its delete in the background), so that a loop of acquire →
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
//! once ([`LeaseLost::NotFound`](crate::LeaseLost::NotFound)) when the client learns that the session expired,
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
//!   or expires. Such a session, and one where a release's delete could not be
//!   confirmed within twice its timeout, is *orphaning*: no new acquire uses
//!   it, so it closes when the guards and acquires it has now are gone.
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
mod entry;
mod held;
mod keys;
mod params;
mod recipe;
mod session;
mod shared;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use zookeeper_client as zk;

use super::election::leadership_of;
use super::{BackendUrl, BoxFuture, Capabilities, Fencing, Guard, Leader, LeaderStream, Leadership, LockBackend};
use crate::backend::Outcome;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};
use entry::{ensure_containers, Entry};
use keys::{base_node, queue_order, NODE_PREFIX};
use params::parse_url;
use recipe::{list_queue, Purpose, Turn};
use session::{fail, open_client, request, Lingering, Login, Session, PROBE_SESSION};

pub use keys::encode_name;
pub use params::DEFAULT_PREFIX;
pub use session::SESSION_LINGER;

// The election and shared-lock recipes read these from here.
use super::election::encode_holder;

/// The smallest TTL declared: twice the smallest `tickTime` in use (100 ms). A
/// server raises a shorter request to its `minSessionTimeout` (by default
/// 2 × `tickTime`, 4 s with the default tick of 2 s); the lease then keeps the
/// negotiated timeout.
pub const MIN_TTL: Duration = Duration::from_millis(200);

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
        let probe = open_client(&login, PROBE_SESSION).await.map_err(|e| e.connect(&hosts))?;
        match request(probe.mkdir(&base, &base_node(&login))).await {
            Ok(()) => {}
            Err(e @ (zk::Error::ConnectionLoss | zk::Error::Timeout)) => {
                let message = format!("zk {hosts}: the connection was lost while creating {base}");
                return Err(Error::connect_caused(message, e));
            }
            Err(e) => return Err(fail(&format!("create the base path {base}"), e)),
        }
        let lingering = Arc::new(StdMutex::new(HashMap::new()));
        Ok(ZkBackend { login, base, sessions: tokio::sync::Mutex::new(HashMap::new()), lingering })
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

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>> {
        Box::pin(self.lock(name, opts, Purpose::Lock))
    }

    /// The acquire, except that the end of the candidate's session (or the
    /// loss of its node) ends it with [`Error::LeaseNotFound`].
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<Leadership>, Error>> {
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
