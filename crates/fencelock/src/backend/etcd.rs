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
//! etcd's API in `fencelock-proto/proto/etcd/`. Laid out by concern, one
//! module each: `rpc` (the connection: endpoints, fail-over, auth, one typed
//! function per call), `keys` (the key layout, a key's kind, the
//! permits-mismatch refusal), `params` (the URL), `recipe` (acquire, wait
//! for the predecessor, withdraw), `held` (the guard:
//! renewal, release, new value), `shared` (read-write locks and semaphores)
//! and `election`.
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
//!    lock. A watch silent for min(1 s, TTL/3) is not trusted: the waiter
//!    watches and reads its predecessor again (a watch can stay open but dead
//!    across an etcd restart, and a deletion made meanwhile is not sent
//!    again); a call that does not reach etcd is repeated with backoff, and
//!    the waiter keeps its place (its key and lease outlive the failure).
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
//!   its predecessor goes (no herd; a waiter whose watch stays silent looks
//!   again at most every min(1 s, TTL/3), see step 4).
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
mod held;
mod keys;
mod params;
mod recipe;
mod rpc;
mod shared;

use std::sync::Arc;
use std::time::Duration;

use fencelock_proto::etcd::etcdserverpb::RangeRequest;

use self::held::Mine;
use self::recipe::{Purpose, Turn};
use self::rpc::{prefix_range, Access, Etcd};
use super::election::leadership_of;
use super::tls::TlsFiles;
use super::{check_name, BackendUrl, BoxFuture, Capabilities, Fencing, Guard, LockBackend};
use super::{Leader, LeaderStream, Leadership};
use crate::backend::Outcome;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};
use params::parse_url;

pub use params::DEFAULT_PREFIX;

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

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>> {
        Box::pin(self.acquire_lock(name, opts, Purpose::Lock))
    }

    /// The acquire, except that a lost lease (or key) ends it with
    /// [`Error::LeaseNotFound`].
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<Leadership>, Error>> {
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
