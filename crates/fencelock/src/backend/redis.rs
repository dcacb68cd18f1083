//! The Redis backend: locks on one Redis server, with a global fencing token,
//! a FIFO queue of waiters and push wake-ups.
//! URL: `redis://[user:password@]host:port[/db][?prefix=fencelock&durable=true]`,
//! or `rediss://…[&ca=ca.pem&cert=c.pem&key=k.pem]` for TLS (see
//! [`super::tls`]; the server's certificate must chain to `ca=` and name the
//! host). `user:password@` logs in as a Redis 6+ ACL user (`AUTH user pw`),
//! `:password@` as the default user (`requirepass`).
//!
//! Where it sits: [`super::connect`] builds a [`RedisBackend`] for a
//! `redis://` URL. The scripts are in `redis/*.lua` beside this file. Laid
//! out by concern, one module each: `conn` (one multiplexed connection per
//! server, made again after it breaks, a call resent once when idempotent;
//! shared with the Redlock backend, [`super::redlock`]), `keys` (the key
//! layout below, the tickets, the permits-mismatch refusal), `params` (the URL's parameters), `recipe`
//! (acquire, release, new value, withdraw), `wait` (waiting in line), `held`
//! (the guard: renewal and release), `shared` (read-write locks and
//! semaphores) and `election`.
//!
//! # Keys
//! Every key starts with the prefix (`prefix=`, default `fencelock`) and `:`.
//! A lock name is used as it is (Redis keys are binary-safe), so distinct
//! names are distinct keys:
//!
//! | key | type | what |
//! |---|---|---|
//! | `{p}:lock:{name}` | string, PX ttl | the holder: `"{token}:{ticket}"` |
//! | `{p}:holder:{name}` | string, PX ttl | the holder's `"{token}:{data}"`, `data` its identity and value (below) |
//! | `{p}:token` | string (`INCR`) | the token counter, one for every lock |
//! | `{p}:queue:{name}` | list | waiting tickets, first in line at the head |
//! | `{p}:waiter:{ticket}` | string, PX ttl | a waiter is alive (its TTL in ms) |
//! | `{p}:wake:{ticket}` | list | the waiter `BLPOP`s here; a push wakes it alone |
//! | `{p}:leader:{name}` | pub/sub channel | `"g{token}:{data}"` on a grant (and a new value), `"r{token}"` on a release |
//! | `{p}:holders:{name}` | sorted set | shared holders (readers, permits): tickets scored by expiry (ms) |
//! | `{p}:tokens:{name}` | hash | the shared holders' tokens, by ticket |
//! | `{p}:permits:{name}` | string | a semaphore's N |
//!
//! `data` is the request's identity and value ([`LockOptions::identity`],
//! [`LockOptions::value`]): the identity's length in two bytes (big-endian),
//! the identity's UTF-8, then the value; empty when it carries neither.
//!
//! A ticket is 128 random bits in hex, made per acquire; it is also the owner
//! part of the lock's value, so release and renewal are compare-and-act on it,
//! and its high 64 bits are the guard's [`Guard::lease_id`] (and
//! `holder_lease` in `Busy`).
//!
//! # The recipe
//! * **Acquire** (`acquire.lua`, one atomic script): drop dead tickets at the
//!   head of the queue (their waiter key expired); grant iff the lock is free
//!   and the queue is empty or the caller's ticket is its head: `INCR` the
//!   counter, `SET` the lock `PX ttl`, take the ticket off the queue. A try
//!   (`wait` zero) never enqueues, so with a live waiter queued it is `Busy`:
//!   nobody overtakes a waiter. A waiting acquire enqueues its ticket once and
//!   sets its waiter key `PX ttl`.
//! * **Waiting**: on a connection of its own (a blocking command must not stall
//!   the shared one), `BLPOP {p}:wake:{ticket}` for at most the wait left and
//!   TTL/3 (to refresh its waiter key); the first in line also wakes when the
//!   holder's lock would expire (its `PTTL`: a crashed holder never releases).
//!   Then the script runs again. Nothing polls for the lock. A failure of the
//!   server while waiting (a restart, a broken connection) is retried with
//!   backoff while the wait lasts (the ticket may lose its place if its
//!   waiter key expires meanwhile); a try is not retried beyond one resend on
//!   a fresh connection, which every idempotent call gets (the acquire script
//!   is idempotent per ticket: it answers the same grant again).
//! * **Release** (`release.lua`): compare-and-delete, then push one wake to the
//!   first live waiter only.
//! * **Renew** (`renew.lua`): `PEXPIRE` if the value is still ours, else the
//!   lock is gone (`Renewed::Gone`).
//! * **New value** (`set_value.lua`; `Guard::set_value`,
//!   `Leadership::proclaim`): compare-and-set: if the lock still holds the
//!   grant, the holder key gets the grant's identity and the new value (with
//!   the lock's remaining TTL), and the grant is published again on the
//!   channel, which observers take as the same term's new value.
//! * **Leader election** (`redis/election.rs`): a campaign is an acquire that,
//!   once queued, is not queued again: a candidate whose ticket was dropped
//!   (it stalled past its TTL, or the server lost the queue) fails with
//!   [`Error::LeaseNotFound`]. `leader` reads the lock and holder keys
//!   (`leader.lua`); `observe` subscribes to the lock's channel, and reads the
//!   leader again when the leader's lock would expire (an expiry publishes
//!   nothing) and every second (pub/sub drops messages while the connection
//!   is down). The scripts publish with `redis.pcall`: an ACL user without
//!   the channel (Redis 7 gives a new user none) still takes and releases
//!   locks and campaigns, but announces nothing, so observers see its terms
//!   only by those reads (and miss a term shorter than a second); `observe`
//!   itself needs `&{p}:leader:*` and is refused ([`Error::Security`])
//!   without it.
//! * **Give up** (`withdraw.lua`): a wait that times out, or an acquire future
//!   that is dropped (a drop guard spawns it), takes its ticket off the queue,
//!   deletes a grant made to it whose answer was lost, and passes the wake on
//!   if it was first in line. A waiter that crashed stays in the queue until
//!   its waiter key expires (at most its TTL), and is skipped after that.
//!
//! * **Read-write locks and semaphores** (`redis/shared.rs`): readers and
//!   permits are shared holders in one sorted set, admitted by the same
//!   acquire script from the same FIFO queue (a ticket says its kind), so a
//!   queued writer blocks later readers and a request for k permits is not
//!   overtaken by a smaller one; N is kept and a mismatch refused. No
//!   downgrade.
//!
//! # What it guarantees, and what it does not
//! * One holder at a time on one Redis server whose memory is intact, as long
//!   as each guard is used before its deadline (counted from when the acquire
//!   or renewal was sent, so never later than Redis's own expiry; Redis decides
//!   expiry with `PX`). Redis measures `PX` with its own wall clock: a jump of
//!   the server's clock can expire a lock early.
//! * Tokens increase across every lock of the server ([`Fencing::Global`])
//!   while the counter survives. What survives a restart of the server (or a
//!   crash, or a fail-over to a replica):
//!
//!   | server set-up | locks | tokens |
//!   |---|---|---|
//!   | no persistence (a cache) | all lost | **start again at 1** |
//!   | RDB snapshots, or AOF `appendfsync everysec` (the default) | the last writes lost | **can go backwards** |
//!   | AOF with `appendfsync always`, `durable=true` | kept (expiry by the server's clock) | keep increasing |
//!   | fail-over to an asynchronous replica | the last writes may be lost | **can go backwards** |
//!
//!   A lost lock can be granted again while its old holder has not yet
//!   learnt (at its next renewal, within TTL/3) that it is gone; with the
//!   counter gone too, the new holder's token may be smaller than the old
//!   one's, and a fenced resource would refuse the new holder.
//!   [`Capabilities::durable_tokens`] is true only in `durable=true` mode.
//! * `durable=true` makes the tokens durable: at connect the backend reads
//!   `CONFIG GET appendonly` / `appendfsync` and refuses ([`Error::Unsupported`])
//!   unless they are `yes` / `always`; then Redis fsyncs its AOF before it
//!   answers each write, so an acknowledged token survives SIGKILL or a power
//!   loss. The cost: one fsync per write on the Redis server (every acquire,
//!   renewal and release; throughput falls to what the disk can fsync, and
//!   every other client of that server pays it too). The check is made once,
//!   at connect: a later `CONFIG SET` is not seen. (Redis 7.0 has no
//!   `WAITAOF`, so the backend cannot ask per write.)
//! * No fail-over: a replica promoted after a crash may miss the last
//!   grants and increments (replication is asynchronous), so neither locks
//!   nor tokens survive a fail-over ([`Capabilities::survives_failover`] is
//!   false). Not for Redis Cluster: the scripts touch keys they compute
//!   (waiter and wake keys), which a cluster would route elsewhere.
//! * Waiters are served in arrival order, woken one at a time by push.

mod conn;
mod election;
mod held;
mod keys;
mod params;
mod recipe;
mod shared;
mod wait;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::election::leadership_of;
use super::tls::TlsFiles;
use super::{check_name, BackendUrl, BoxFuture, Capabilities, Fencing, Guard, LockBackend};
use super::{Leader, LeaderStream, Leadership};
use crate::backend::Outcome;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};
use conn::check_durable;
use keys::{token_of, Keys};
use recipe::{with_queue, Purpose, Req, LEADER};

pub(super) use conn::{Conn, Retry, CONNECT_TIMEOUT, OP_TIMEOUT};
pub(super) use keys::{millis, Ticket};
pub use params::DEFAULT_PREFIX;
pub(super) use params::{check_params, prefix};
pub(super) use recipe::RENEW;

/// Locks on one Redis server. See the [module docs](self) for the recipe and
/// what it guarantees.
pub struct RedisBackend {
    shared: Arc<Shared>,
}

/// What the backend, its guards and its background tasks share.
struct Shared {
    conn: Conn,
    keys: Keys,
    durable: bool,
    /// Connections for `BLPOP`, idle.
    idle: Mutex<Vec<MultiplexedConnection>>,
}

impl RedisBackend {
    /// Connects to the server of `url` (`redis://[user:password@]host:port[/db]`
    /// with `prefix=` and `durable=` parameters). [`Error::InvalidArgument`]
    /// for a bad URL, [`Error::Connect`] if the server does not answer within
    /// a few seconds, [`Error::Unsupported`] if `durable=true` and the server
    /// does not fsync every write (see the [module docs](self)).
    pub async fn connect(url: &BackendUrl) -> Result<Self, Error> {
        check_params(url, &["prefix", "durable", "ca", "cert", "key"])?;
        let (host, port) = url.single_host()?;
        let durable = url.flag("durable", false)?;
        let keys = Keys { prefix: format!("{}:", prefix(url)?) };
        let conn = Conn::new(url, host, port, TlsFiles::from_url(url)?.as_ref())?;
        conn.connect_now().await?;
        if durable {
            check_durable(&conn).await?;
        }
        let shared = Arc::new(Shared { conn, keys, durable, idle: Mutex::new(Vec::new()) });
        Ok(RedisBackend { shared })
    }
}

impl LockBackend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    /// Global tokens from one counter, durable only in `durable=true` mode; a
    /// FIFO queue with push wake-ups; expiry by Redis (`PX`); the holder's
    /// identity and value (shown by `leader`); leader election. No fail-over
    /// (asynchronous replicas) and no lock-delay. Read-write locks and
    /// semaphores in the same queue (see `redis/shared.rs`), without downgrade. `PX` counts milliseconds,
    /// and the shared TTL floor is 100 ms.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Global,
            durable_tokens: self.shared.durable,
            fifo: true,
            push_wakeup: true,
            server_ttl: true,
            survives_failover: false,
            lock_delay: false,
            holder_identity: true,
            election: true,
            shared: true,
            semaphores: true,
            hold_at_least: false,
            once_per: false,
            multi_lock: false,
            min_ttl: Duration::from_millis(100),
        }
    }

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>> {
        Box::pin(self.acquire_as(name, opts, Purpose::Lock))
    }

    /// The acquire, except that a ticket dropped from the queue while it
    /// waits ends it with [`Error::LeaseNotFound`].
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<Leadership>, Error>> {
        Box::pin(async move { leadership_of(self.acquire_as(name, opts, Purpose::Campaign).await?, &opts.value) })
    }

    /// The lock and holder keys, read at once.
    fn leader<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Leader>, Error>> {
        Box::pin(async move { Ok(self.leader_of(name).await?.map(|(leader, _)| leader)) })
    }

    /// The lock's channel (see the module docs).
    fn observe<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LeaderStream, Error>> {
        Box::pin(self.observe_election(name))
    }

    /// Is `token` the value of the lock now? Reads the lock key once.
    fn check<'a>(&'a self, name: &'a str, token: u64) -> BoxFuture<'a, Result<CheckResult, Error>> {
        Box::pin(async move {
            check_name(name)?;
            let lock = self.shared.keys.lock(name);
            let deadline = crate::clock::now() + OP_TIMEOUT;
            let value: Option<String> = self
                .shared
                .conn
                .run(deadline, Retry::Once, |mut c| {
                    let lock = &lock;
                    async move { redis::cmd("GET").arg(lock).query_async(&mut c).await }
                })
                .await?;
            let current_token = value.as_deref().and_then(token_of);
            Ok(CheckResult { current: current_token == Some(token), current_token })
        })
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.shared.conn.addr)
            .field("prefix", &self.shared.keys.prefix)
            .field("durable", &self.shared.durable)
            .finish_non_exhaustive()
    }
}
