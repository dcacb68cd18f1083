//! The etcd backend (`etcd://h:p[,h:p…][?prefix=fencelock]`, etcd v3 API over
//! gRPC): etcd's own lock recipe, one lease per acquire, with a fencing token
//! from etcd's global revision counter.
//!
//! Security: `etcd+tls://` connects over TLS (`https` endpoints) and checks
//! the members' certificates against `ca=` (else the system's CAs) and the
//! host names of the URL; `cert=` and `key=` give a client certificate.
//! `user:password@` logs in with etcd's Authenticate; the token it returns
//! goes with every call, and is renewed when etcd answers `invalid auth
//! token` (a simple token expires after `--auth-token-ttl` idle seconds).
//! The user needs `readwrite` on the prefix's keys.
//!
//! Where it sits: [`super::connect`] builds an [`EtcdBackend`] for an `etcd://`
//! URL; its guards are [`Guard`]s kept by a `KeptLease` like every other
//! backend's. The gRPC code is generated (client only) from the subset of
//! etcd's API in `fencelock-proto/proto/etcd/`; `etcd/rpc.rs` holds the connection
//! and the calls.
//!
//! # Keys
//! A lock `name` is the key prefix `P/N/`, where `P` is the URL's `prefix`
//! (default `fencelock`) and `N` the lock name, each with `%` written `%25` and
//! `/` written `%2F`. Neither part then contains a `/`, so the prefix of one
//! lock never contains another lock's keys ("jobs" and "jobs/nightly" are
//! `fencelock/jobs/` and `fencelock/jobs%2Fnightly/`). Each acquire adds one key
//! under it: `P/N/` followed by its lease id in 16 hex digits, attached to the
//! lease. Its value is the request's identity and value
//! ([`LockOptions::identity`], [`LockOptions::value`]): the identity's length
//! in two bytes (big-endian), the identity's UTF-8, then the value; empty when
//! the request carries neither (as every key was before values were stored).
//!
//! # Leader election
//! A campaign is an acquire (the candidate's key is its place in line) that
//! fails with [`Error::LeaseNotFound`] rather than [`Error::Backend`] when the
//! candidate's lease or key is lost while it waits; besides its predecessor,
//! it watches its own key, so that a revoked or expired lease (which deletes
//! the key) ends it at once rather than at the next renewal. The leader is the owner key
//! (the lowest create revision), its term the key's create revision (the
//! token), its identity and value the key's value. `observe` watches the
//! lock's prefix from just after the revision of the read that showed the
//! first leader (see `etcd/election.rs`).
//!
//! # The recipe
//! 1. LeaseGrant with the TTL rounded up to whole seconds; the guard uses the
//!    TTL etcd granted (etcd raises a TTL below its minimum, 1.5 election
//!    timeouts rounded up to a second). A new lease for every acquire, so a
//!    key is never re-created by the same lease (the key-reuse trap of sharing
//!    one session lease between acquires). The lease is kept alive from here on
//!    (`KeptLease`, every TTL/3), while waiting too.
//! 2. Txn: `create_revision(key) == 0` → Put(key, lease), else Range(key). The
//!    key's create revision is `my_rev`.
//! 3. Range `P/N/` sorted by create revision, ascending, limit 1: the owner.
//!    If it is this key, the lock is granted; the token is `my_rev`. If the
//!    owner was created after `my_rev`, this key is gone (deleted by someone,
//!    or its lease expired): the acquire fails.
//! 4. Not granted, with no wait: revoke the lease (which deletes the key) and
//!    answer Busy with the owner's create revision and lease. Otherwise find the
//!    predecessor: Range `P/N/` with `max_create_revision = my_rev - 1`, sorted
//!    by create revision, descending, limit 1. Watch its key for a deletion,
//!    from now (no start revision: a watcher whose start revision is not past
//!    the store's current one is "unsynced", and etcd 3.4 services those only
//!    every 100 ms, which made every contended handoff of the standard recipe
//!    take ~100 ms); once etcd confirmed the watcher, Range the predecessor
//!    again (it may have gone before the watcher existed). When it is gone, go
//!    to 3: the predecessor may have died while an earlier key still holds the
//!    lock.
//! 5. The wait running out, the lease being lost, or the acquire future being
//!    dropped revokes the lease (deleting the key), inline or in a spawned task.
//!
//! Renewal is one LeaseKeepAlive (on a stream of its own) and a Range of the
//! key, concurrently: the lease is gone at TTL 0, and the lock is gone if the
//! key was deleted (or is not the one this acquire created). Release is a Txn
//! `create_revision(key) == token` → delete, then LeaseRevoke. A new value
//! (`Guard::set_value`, `Leadership::proclaim`) is a Txn
//! `create_revision(key) == token` → Put(key, identity and new value, the
//! same lease): the token and the place in line stay.
//!
//! # Read-write locks and semaphores
//! Readers' and permits' keys sit in the same prefix, their kind after the
//! lease id in the key's name (see `etcd/shared.rs`): a reader waits for the
//! last key of another kind older than its own, k permits hold when they fit
//! among the oldest keys; tokens are create revisions here too. No
//! downgrade.
//!
//! # Guarantees
//! * Mutual exclusion among guards used before their deadline: the owner is
//!   the key with the lowest create revision, and a guard's deadline counts
//!   from the send time of its last confirmed keep-alive, never later than
//!   etcd's own expiry of the lease (which deletes the key).
//! * Tokens: the key's create revision. Revisions are etcd's one counter for
//!   the whole keyspace, fsynced in the WAL before a write is acknowledged and
//!   never reused, so tokens of one lock strictly increase in grant order,
//!   across restarts of etcd and leader changes ([`Fencing::PerLock`]). Tokens
//!   of different locks come from the same counter but are taken when the key
//!   is created, i.e. when the request queued: a grant that waited carries the
//!   revision of its arrival, which may be lower than the token of a grant of
//!   another lock that came and went meanwhile. So they are not declared
//!   global: a resource guarded by several locks must keep one high-water mark
//!   per lock.
//! * FIFO: waiters are granted in the order of their keys' creation, and a new
//!   request's key is always the newest. Each waiter is woken by etcd only when
//!   its predecessor goes (no herd, no polling).
//! * A crashed holder blocks others for at most its lease's TTL (etcd expires
//!   the lease and deletes the key).
//!
//! Not guaranteed: etcd's lease TTLs are whole seconds, and etcd raises a TTL
//! below its minimum (1.5 election timeouts, rounded up: 1 s with the test
//! kit's timers, 2 s with etcd's defaults); the guard's deadline and renewals
//! use the TTL etcd granted, so a short TTL may be kept longer than asked.
//! etcd checks lease expiry every 500 ms, so a lock may outlive its TTL by that
//! much on the server (never on the client). A waiting acquire notices the
//! loss of its own lease at its next renewal (every TTL/3), not at once (a
//! campaign also watches its own key, and notices at once). The endpoints of
//! the URL are used
//! one at a time, in order: there is no balancing, and a move to the next
//! endpoint happens only after a call failed (see `etcd/rpc.rs`). No
//! lock-delay.

mod election;
mod rpc;
mod shared;

use std::sync::Arc;
use std::time::Duration;

use fencelock_proto::etcd::etcdserverpb::RangeRequest;
use fencelock_proto::etcd::mvccpb::KeyValue;
use tokio::time::Instant;

use self::rpc::{prefix_range, Access, Etcd};
use self::shared::Kind;
use super::election::{encode_holder, encode_holder_parts, leadership_of};
use super::tls::TlsFiles;
use super::{check_name, BackendUrl, BoxFuture, Capabilities, Fencing, Guard, Held, KeptLease, LockBackend};
use super::{Leader, LeaderStream, Leadership, Renew, Renewed, Scheme};
use crate::backend::Acquire;
use crate::error::Error;
use crate::lease::LeaseWatch;
use crate::types::{CheckResult, LockOptions};

/// The key prefix of every lock when the URL names none.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// An etcd cluster as a lock service (see the [module docs](self) for the
/// recipe and what it guarantees).
#[derive(Debug, Clone)]
pub struct EtcdBackend {
    etcd: Arc<Etcd>,
    /// The encoded prefix, with its `/`.
    prefix: Vec<u8>,
}

impl EtcdBackend {
    /// Connects to the cluster of `url` (`etcd://h:p[,h:p…][?prefix=P]`): to
    /// the first endpoint, in the URL's order, that answers a linearizable read
    /// within a few seconds. [`Error::InvalidArgument`] for a URL that is not
    /// `etcd://`, has a user, a path or an unknown parameter, or an empty
    /// prefix; [`Error::Connect`] if no endpoint answers.
    pub async fn connect(url: &BackendUrl) -> Result<Self, Error> {
        let prefix = parse_url(url)?;
        let probe = RangeRequest { count_only: true, ..prefix_range(&prefix) };
        let credentials = match (url.user(), url.password()) {
            (Some(user), Some(password)) => Some((user, password)),
            (None, None) => None,
            _ => return Err(Error::InvalidArgument(format!("{url}: etcd needs both user and password"))),
        };
        let access = Access { tls: TlsFiles::from_url(url)?, credentials };
        let etcd = Etcd::connect(&url.hosts, access, probe).await?;
        Ok(EtcdBackend { etcd: Arc::new(etcd), prefix })
    }

    /// `P/N/`: the prefix of every key of lock `name`.
    fn lock_prefix(&self, name: &str) -> Vec<u8> {
        let mut key = self.prefix.clone();
        encode(name, &mut key);
        key.push(b'/');
        key
    }

    /// Queues a request for lock `name` (steps 1 and 2 of the recipe) and
    /// takes its turn (steps 3 to 5), for a lock or a campaign (`purpose`).
    async fn acquire_lock(&self, name: &str, opts: &LockOptions, purpose: Purpose) -> Result<Acquire<Guard>, Error> {
        self.capabilities().admit(self.kind(), name, opts)?;
        let kind = Kind::of_request(opts);
        if purpose == Purpose::Campaign && kind != Kind::Writer {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        let lock = self.lock_prefix(name);
        let wait_end = Instant::now() + opts.wait;
        let sent = Instant::now();
        let granted = self.etcd.lease_grant(ttl_secs(opts.ttl), self.etcd.deadline()).await?;
        let (lease_id, ttl) = (granted.id, granted.ttl);
        let withdraw = Withdraw { etcd: self.etcd.clone(), lease_id, armed: true };
        let mut key = key_of(&lock, lease_id);
        key.extend_from_slice(kind.suffix().as_bytes());
        let rev = self.etcd.create(&key, encode_holder(opts), lease_id, self.etcd.deadline()).await?;
        let mine = Mine { etcd: self.etcd.clone(), lease_id, key, rev };
        let kept = KeptLease::start(lease_id as u64, Duration::from_secs(ttl as u64), sent, Arc::new(mine.clone()));
        kept.seen_term(granted.term);
        let turn = if kind != Kind::Writer && opts.wait.is_zero() {
            self.shared_turn(&lock, &mine, kind, false, purpose).await?
        } else if opts.wait.is_zero() {
            self.try_turn(&lock, &mine, purpose).await?
        } else {
            match tokio::time::timeout_at(wait_end, self.wait_turn(&lock, &mine, kind, kept.watch(), purpose)).await {
                Ok(turn) => turn?,
                Err(_) => Turn::TimedOut,
            }
        };
        match turn {
            Turn::Granted => {
                withdraw.disarm();
                let watch = kept.watch();
                let token = Some(mine.rev as u64);
                let held = EtcdHeld { mine, identity: opts.identity.clone(), _kept: kept };
                Ok(Acquire::Acquired(Guard::new(name.to_string(), token, self.kind(), watch, Box::new(held))))
            }
            Turn::Busy { owner, keys } => {
                drop(kept);
                withdraw.now().await;
                Ok(Acquire::Busy {
                    holder_lease: Some(owner.lease as u64),
                    holder_token: Some(owner.create_revision as u64),
                    reopens_in: None,
                    // Every key but the owner's and this one (gone now).
                    waiters: u32::try_from(keys.saturating_sub(2).max(0)).unwrap_or(u32::MAX),
                })
            }
            Turn::TimedOut => {
                drop(kept);
                withdraw.now().await;
                Ok(Acquire::TimedOut)
            }
        }
    }

    /// Step 3, once: granted if `mine` is the owner of `lock`, else busy.
    async fn try_turn(&self, lock: &[u8], mine: &Mine, purpose: Purpose) -> Result<Turn, Error> {
        let (owner, keys) = self.other_owner(lock, mine, purpose).await?;
        match owner {
            None => Ok(Turn::Granted),
            Some(owner) => Ok(Turn::Busy { owner, keys }),
        }
    }

    /// Steps 3 and 4 until `mine` owns `lock`. Fails if the lease is lost (see
    /// `lease`) or the key is gone meanwhile.
    async fn wait_turn(
        &self,
        lock: &[u8],
        mine: &Mine,
        kind: Kind,
        lease: LeaseWatch,
        purpose: Purpose,
    ) -> Result<Turn, Error> {
        let turn = async {
            if kind != Kind::Writer {
                return self.shared_turn(lock, mine, kind, true, purpose).await;
            }
            loop {
                if self.other_owner(lock, mine, purpose).await?.0.is_none() {
                    return Ok(Turn::Granted);
                }
                let end = self.etcd.deadline();
                if let Some(predecessor) = self.etcd.last_created_before(lock, mine.rev, end).await? {
                    self.wait_gone(&predecessor).await?;
                }
            }
        };
        let own_key_gone = async {
            match purpose {
                Purpose::Lock => std::future::pending().await,
                Purpose::Campaign => self.own_key_gone(mine).await,
            }
        };
        tokio::select! {
            biased;
            reason = lease.lost() => Err(purpose.lost(format!("lost the lease {} while waiting: {reason}", mine.lease_id))),
            () = own_key_gone => Err(purpose.lost(format!(
                "the key of a waiting campaign (lease {}) was deleted: its lease was revoked or expired",
                mine.lease_id
            ))),
            turn = turn => turn,
        }
    }

    /// Resolves once `mine`'s key is gone: a campaign's notice, at once, that
    /// its lease was revoked or expired (which deletes the key). A watch or
    /// read that fails leaves the notice to the next renewal: it never
    /// resolves then.
    async fn own_key_gone(&self, mine: &Mine) {
        let own = KeyValue { key: mine.key.clone(), create_revision: mine.rev, ..KeyValue::default() };
        loop {
            if self.wait_gone(&own).await.is_err() {
                return std::future::pending().await;
            }
            match self.etcd.get(&own.key, self.etcd.deadline()).await {
                // The watcher was canceled, the key is still there.
                Ok(Some(kv)) if kv.create_revision == own.create_revision => continue,
                Ok(_) => return,
                Err(_) => return std::future::pending().await,
            }
        }
    }

    /// The owner of `lock` (the key with the lowest create revision), or `None`
    /// if it is `mine`; with the number of keys of the lock. Fails if `mine` is
    /// not among them any more.
    async fn other_owner(&self, lock: &[u8], mine: &Mine, purpose: Purpose) -> Result<(Option<KeyValue>, i64), Error> {
        let (first, keys) = self.etcd.first_created(lock, self.etcd.deadline()).await?;
        if let Some(Kind::Permits { of, .. }) = first.as_ref().map(|kv| Kind::of_key(lock, &kv.key)) {
            return Err(shared::mismatch(of, 0));
        }
        match first {
            Some(kv) if kv.create_revision == mine.rev => Ok((None, keys)),
            Some(kv) if kv.create_revision < mine.rev => Ok((Some(kv), keys)),
            _ => Err(purpose.lost(format!("the key of a waiting acquire (lease {}) was deleted", mine.lease_id))),
        }
    }

    /// Waits until `predecessor` is gone: a watcher from now on its key, then a
    /// look whether it went before the watcher existed.
    async fn wait_gone(&self, predecessor: &KeyValue) -> Result<(), Error> {
        let mut watcher = self.etcd.watch_deletion(&predecessor.key, self.etcd.deadline()).await?;
        match self.etcd.get(&predecessor.key, self.etcd.deadline()).await? {
            Some(kv) if kv.create_revision == predecessor.create_revision => self.etcd.deleted(&mut watcher).await,
            _ => Ok(()),
        }
    }
}

impl LockBackend for EtcdBackend {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    /// Per-lock durable tokens (create revisions, fsynced before a write is
    /// acknowledged; ordered per lock, not across locks: see the module docs),
    /// FIFO with a push wake-up of the next waiter only (a watch on the
    /// predecessor; a semaphore's waiters all wake on any release under the
    /// lock, as etcd cannot watch only the older keys), server-side expiry (leases), Raft fail-over, the holder's
    /// identity and value in its key (shown by `leader`), leader election. TTLs
    /// are whole seconds from 1 s (etcd raises a TTL below its own minimum,
    /// which depends on its election timeout, and the guard uses the TTL etcd
    /// granted); read-write locks and semaphores (see `etcd/shared.rs`; no
    /// downgrade); no lock-delay.
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
            min_ttl: Duration::from_secs(1),
        }
    }

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Acquire<Guard>, Error>> {
        Box::pin(self.acquire_lock(name, opts, Purpose::Lock))
    }

    /// The acquire, except that a lost lease (or key) ends it with
    /// [`Error::LeaseNotFound`].
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Acquire<Leadership>, Error>> {
        Box::pin(async move { leadership_of(self.acquire_lock(name, opts, Purpose::Campaign).await?, &opts.value) })
    }

    /// The owner key of the lock, read linearizably.
    fn leader<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Leader>, Error>> {
        Box::pin(self.leader_of(name))
    }

    /// A watch of the lock's keys (see the module docs).
    fn observe<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LeaderStream, Error>> {
        Box::pin(self.observe_election(name))
    }

    /// Current if `token` is the create revision of a key that holds the lock
    /// (the owner key, a reader's or a permit's; a key exists only while its
    /// lease lives). `current_token` is `token` if current, else the highest
    /// holder's.
    fn check<'a>(&'a self, name: &'a str, token: u64) -> BoxFuture<'a, Result<CheckResult, Error>> {
        Box::pin(async move {
            check_name(name)?;
            let held = self.holder_revisions(&self.lock_prefix(name)).await?;
            let held: Vec<u64> = held.into_iter().map(|rev| rev as u64).collect();
            let current = held.contains(&token);
            let current_token = if current { Some(token) } else { held.into_iter().max() };
            Ok(CheckResult { current, current_token })
        })
    }
}

/// What a request is for, which decides what losing its place means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A lock: the acquire fails ([`Error::Backend`]).
    Lock,
    /// A campaign: a candidate whose lease ended is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does.
    Campaign,
}

impl Purpose {
    /// The error of a request that lost its lease or key while waiting.
    fn lost(self, why: String) -> Error {
        match self {
            Purpose::Lock => Error::backend("etcd", why),
            Purpose::Campaign => Error::LeaseNotFound(format!("etcd: {why}")),
        }
    }
}

/// Where an acquire's turn ended.
enum Turn {
    Granted,
    Busy { owner: KeyValue, keys: i64 },
    TimedOut,
}

/// One acquire's key: what renews it, and what release compares.
#[derive(Clone)]
struct Mine {
    etcd: Arc<Etcd>,
    lease_id: i64,
    key: Vec<u8>,
    /// The key's create revision: the token.
    rev: i64,
}

impl Renew for Mine {
    /// A keep-alive of the lease and a read of the key, at once: `Gone` if the
    /// lease is (TTL 0) or the key is no longer this acquire's.
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let (ttl, key) =
                tokio::join!(self.etcd.lease_keep_alive(self.lease_id, round_end), self.etcd.get(&self.key, round_end));
            if matches!(key, Ok(ref kv) if kv.as_ref().map(|kv| kv.create_revision) != Some(self.rev)) {
                return Ok(Renewed::Gone);
            }
            let (ttl, term) = ttl?;
            key?;
            if ttl <= 0 {
                return Ok(Renewed::Gone);
            }
            Ok(Renewed::ConfirmedInTerm(Some(Duration::from_secs(ttl as u64)), term))
        })
    }
}

/// A granted lock: the key and the lease keeping it.
struct EtcdHeld {
    mine: Mine,
    /// The request's identity, stored again with each new value.
    identity: Option<String>,
    /// Renews the lease until the release is done (or this is dropped).
    _kept: KeptLease,
}

impl EtcdHeld {
    /// Compare-and-delete of the key, then the lease's revocation.
    async fn release_now(self) -> Result<bool, Error> {
        let Mine { etcd, lease_id, key, rev } = &self.mine;
        let released = etcd.delete_if_created_at(key, *rev, etcd.deadline()).await?;
        if let Err(e) = etcd.lease_revoke(*lease_id, etcd.deadline()).await {
            // The lease then expires by itself (the watchdog stops with `self`).
            tracing::debug!(lease = lease_id, error = %e, "fencelock: etcd: revoke after release failed");
        }
        Ok(released)
    }
}

impl Held for EtcdHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(self.release_now())
    }

    /// A key's kind is its name: see `etcd/shared.rs`.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async {
            Err(Error::Unsupported("etcd cannot downgrade a writer; release and acquire shared".into()))
        }))
    }

    /// Compare-and-set of the key: a Put on the same lease if the key is
    /// still the one this acquire created. Observers see it as a Put of the
    /// owner key, the same term with a new value.
    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let Mine { etcd, lease_id, key, rev } = &self.mine;
        let data = encode_holder_parts(self.identity.as_deref(), &value);
        Some(Box::pin(etcd.put_if_created_at(key, *rev, data, *lease_id, etcd.deadline())))
    }

    fn release_in_background(self: Box<Self>) {
        // Without a runtime, dropping `self` stops the renewals: the lease expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let lease = self.mine.lease_id;
                if let Err(e) = self.release_now().await {
                    tracing::debug!(lease, error = %e, "fencelock: etcd: background release failed");
                }
            });
        }
    }
}

/// Withdraws a request that was not granted: revokes its lease, which deletes
/// its key. Armed until granted; if dropped armed (the acquire future was
/// dropped, or failed), the revocation runs in a spawned task.
struct Withdraw {
    etcd: Arc<Etcd>,
    lease_id: i64,
    armed: bool,
}

impl Withdraw {
    /// The request was granted: nothing to withdraw.
    fn disarm(mut self) {
        self.armed = false;
    }

    /// Withdraws now; if that fails, once more in the background.
    async fn now(mut self) {
        match self.etcd.lease_revoke(self.lease_id, self.etcd.deadline()).await {
            Ok(()) => self.armed = false,
            Err(e) => {
                tracing::debug!(lease = self.lease_id, error = %e, "fencelock: etcd: withdraw failed")
            }
        }
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Without a runtime the lease expires by itself (nobody renews it).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (etcd, lease_id) = (self.etcd.clone(), self.lease_id);
            runtime.spawn(async move {
                if let Err(e) = etcd.lease_revoke(lease_id, etcd.deadline()).await {
                    tracing::debug!(lease = lease_id, error = %e, "fencelock: etcd: withdraw failed");
                }
            });
        }
    }
}

/// The prefix of `url` (encoded, with its `/`), after checking the URL.
fn parse_url(url: &BackendUrl) -> Result<Vec<u8>, Error> {
    let bad = |why: String| Error::InvalidArgument(format!("{url}: {why}"));
    if url.scheme != Scheme::Etcd {
        return Err(bad(format!("not an etcd url (scheme {})", url.scheme)));
    }
    if !url.path.is_empty() {
        return Err(bad("an etcd url has no path (use ?prefix=)".into()));
    }
    if let Some((key, _)) = url.params.iter().find(|(k, _)| !["prefix", "ca", "cert", "key"].contains(&k.as_str())) {
        return Err(bad(format!("unknown parameter {key:?} (etcd takes prefix, ca, cert, key)")));
    }
    let prefix = url.param("prefix").unwrap_or(DEFAULT_PREFIX);
    if prefix.is_empty() || prefix.chars().any(char::is_control) {
        return Err(bad("the prefix must be non-empty, without control characters".into()));
    }
    let mut out = Vec::new();
    encode(prefix, &mut out);
    out.push(b'/');
    Ok(out)
}

/// Appends `s` with `%` as `%25` and `/` as `%2F` (injective, and the result
/// has no `/`).
fn encode(s: &str, out: &mut Vec<u8>) {
    for b in s.bytes() {
        match b {
            b'%' => out.extend_from_slice(b"%25"),
            b'/' => out.extend_from_slice(b"%2F"),
            b => out.push(b),
        }
    }
}

/// The key of lease `lease_id`'s request on `lock`.
fn key_of(lock: &[u8], lease_id: i64) -> Vec<u8> {
    let mut key = lock.to_vec();
    key.extend_from_slice(format!("{lease_id:016x}").as_bytes());
    key
}

/// `ttl` in whole seconds, rounded up.
fn ttl_secs(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix_of(url: &str) -> Result<String, Error> {
        parse_url(&BackendUrl::parse(url)?).map(|p| String::from_utf8(p).unwrap())
    }

    #[test]
    fn names_are_encoded_injectively_and_never_nest() {
        let names = ["jobs/nightly", "jobs", "jobs/nightly/x", "..", "%2F", "/", "ключ", "a b", "%", "%25"];
        let mut encoded: Vec<Vec<u8>> = Vec::new();
        for name in names {
            let mut e = Vec::new();
            encode(name, &mut e);
            assert!(!e.contains(&b'/'), "{name:?}");
            e.push(b'/');
            for other in &encoded {
                assert!(!e.starts_with(other) && !other.starts_with(&e), "{name:?} nests with {other:?}");
            }
            encoded.push(e);
        }
    }

    #[test]
    fn urls_give_the_prefix_or_say_why_not() {
        assert_eq!(prefix_of("etcd://h:1").unwrap(), "fencelock/");
        assert_eq!(prefix_of("etcd://h:1,g:2?prefix=app/locks").unwrap(), "app%2Flocks/");
        for bad in ["etcd://h/x", "etcd://h?prefix=", "etcd://h?ttl=3", "redis://h"] {
            assert!(matches!(prefix_of(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        let ms = Duration::from_millis;
        assert_eq!([ms(100), ms(1000), ms(1001), ms(15_000)].map(ttl_secs), [1, 1, 2, 15]);
    }

    #[test]
    fn keys_sort_under_their_lock() {
        assert_eq!(key_of(b"fencelock/a/", 0x1234), b"fencelock/a/0000000000001234");
    }
}
