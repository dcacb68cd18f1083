//! The Redis backend: locks on one Redis server, with a global fencing token,
//! a FIFO queue of waiters and push wake-ups.
//! URL: `redis://[user:password@]host:port[/db][?prefix=fencelock&durable=true]`,
//! or `rediss://…[&ca=ca.pem&cert=c.pem&key=k.pem]` for TLS (see
//! [`super::tls`]; the server's certificate must chain to `ca=` and name the
//! host). `user:password@` logs in as a Redis 6+ ACL user (`AUTH user pw`),
//! `:password@` as the default user (`requirepass`).
//!
//! Where it sits: [`super::connect`] builds a [`RedisBackend`] for a
//! `redis://` URL. The scripts are in `redis/*.lua` beside this file. The
//! connection handling here (`Conn`: one multiplexed connection per server,
//! made again after it breaks) is shared with the Redlock backend
//! ([`super::redlock`]).
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

mod election;
mod shared;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, RedisResult, Script, TlsCertificates, Value,
};
use tokio::time::{timeout_at, Instant};

use super::election::{encode_holder, encode_holder_parts, leadership_of};
use super::tls::{self, TlsFiles};
use super::{check_name, BackendUrl, BoxFuture, Capabilities, Fencing, Guard, Held, KeptLease, LockBackend};
use super::{Leader, LeaderStream, Leadership, Renew, Renewed};
use crate::backend::Acquire;
use crate::backoff::Backoff;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};

/// The key prefix when the URL gives none.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// How long connecting to a server may take (the connection attempt only).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one request (a script, a command) may take, outside renewals
/// (which the watchdog bounds).
pub(super) const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long past its own timeout a `BLPOP` may stay unanswered before its
/// connection is given up.
const BLOCK_GRACE: Duration = Duration::from_secs(1);

/// Idle connections for `BLPOP` kept for the next waiter.
const MAX_IDLE_BLOCKING: usize = 8;

const QUEUE_LUA: &str = include_str!("redis/queue.lua");
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("redis/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("redis/release.lua")));
static WITHDRAW: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("redis/withdraw.lua")));
static LEADER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis/leader.lua")));
static SET_VALUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis/set_value.lua")));
/// `renew.lua`: `PEXPIRE` if the value matches; shared with Redlock.
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis/renew.lua")));

fn with_queue(script: &str) -> Script {
    Script::new(&format!("{QUEUE_LUA}\n{script}"))
}

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

    /// One run of the acquire script for `req`; `wait` enqueues its ticket if
    /// the lock is not granted; `queued_before` refuses to enqueue it again.
    async fn attempt(&self, req: &Req<'_>, wait: bool, queued_before: bool) -> Result<Attempt, Error> {
        let keys = &self.shared.keys;
        let (lock, queue, counter, holder) =
            (keys.lock(req.name), keys.queue(req.name), keys.counter(), keys.holder(req.name));
        let (holders, tokens, permits) = (keys.holders(req.name), keys.tokens(req.name), keys.permits(req.name));
        let flag = |yes: bool| if yes { "1" } else { "0" };
        let (prefix, ticket, ttl_ms) = (&keys.prefix, &req.ticket.text, millis(req.opts.ttl));
        let (wait, queued_before, channel) = (flag(wait), flag(queued_before), keys.channel(req.name));
        let deadline = Instant::now() + OP_TIMEOUT;
        let reply: Value = self
            .shared
            .conn
            .run(deadline, Retry::Once, |mut c| {
                let (lock, queue, counter, holder, channel) = (&lock, &queue, &counter, &holder, &channel);
                let (holders, tokens, permits) = (&holders, &tokens, &permits);
                async move {
                    let mut call = ACQUIRE.prepare_invoke();
                    call.key(lock).key(queue).key(counter).key(holder).key(holders).key(tokens).key(permits);
                    call.arg(prefix).arg(ticket).arg(ttl_ms).arg(wait).arg(&req.data).arg(channel).arg(queued_before);
                    call.arg(req.opts.permits);
                    call.invoke_async(&mut c).await
                }
            })
            .await?;
        parse_attempt(&reply)
    }

    /// Tries once: granted, or `Busy` with what the script saw.
    async fn try_once(&self, req: &Req<'_>) -> Result<Acquire<Guard>, Error> {
        let sent = Instant::now();
        Ok(match self.attempt(req, false, false).await? {
            Attempt::Granted { token } => Acquire::Acquired(self.grant(req, token, sent)),
            Attempt::Refused { holder, waiters, .. } => {
                let holder_lease = holder.as_deref().and_then(lease_of);
                let holder_token = holder.as_deref().and_then(token_of);
                Acquire::Busy { holder_lease, holder_token, reopens_in: None, waiters }
            }
            Attempt::Dropped => return Err(req.lost()),
            Attempt::Mismatch { kept } => return Err(shared::mismatch(kept, req.opts.permits)),
        })
    }

    /// Waits in the queue until granted or until `opts.wait` has passed (then
    /// `TimedOut`, with the ticket still queued: the caller withdraws it).
    /// A failure of the server (a restart, a lost connection) is retried with
    /// backoff while the wait lasts; the last one is returned if it outlasts
    /// the wait.
    async fn wait_in_line(&self, req: &Req<'_>) -> Result<Acquire<Guard>, Error> {
        let end = Instant::now() + req.opts.wait;
        let mut failures = 0;
        let mut queued = false;
        loop {
            match self.wait_once(req, end, &mut queued).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) => failures = 0,
                Err(e @ Error::LeaseNotFound(_)) => return Err(e),
                Err(e) => {
                    let retry_at = Instant::now() + Backoff::default().delay(failures, fastrand::f64());
                    if retry_at >= end {
                        return Err(e);
                    }
                    failures += 1;
                    tracing::debug!(lock = req.name, failures, error = %e, "fencelock: redis wait failed; retrying");
                    tokio::time::sleep_until(retry_at).await;
                }
            }
        }
    }

    /// One round of a wait: an attempt, then (not granted, wait not over) a
    /// nap until woken. `None`: go on waiting. `queued`: whether an earlier
    /// round queued the ticket (a campaign's ticket is not queued twice).
    async fn wait_once(&self, req: &Req<'_>, end: Instant, queued: &mut bool) -> Result<Option<Acquire<Guard>>, Error> {
        let sent = Instant::now();
        let queued_before = *queued && req.purpose == Purpose::Campaign;
        let (pttl, first) = match self.attempt(req, true, queued_before).await? {
            Attempt::Granted { token } => {
                return Ok(Some(Acquire::Acquired(self.grant(req, token, sent))));
            }
            Attempt::Refused { pttl, first, .. } => (pttl, first),
            Attempt::Dropped => return Err(req.lost()),
            Attempt::Mismatch { kept } => return Err(shared::mismatch(kept, req.opts.permits)),
        };
        *queued = true;
        let now = Instant::now();
        if now >= end {
            return Ok(Some(Acquire::TimedOut));
        }
        self.nap(&req.ticket, nap_length(end - now, req.opts.ttl, first, pttl)).await?;
        Ok(None)
    }

    /// Blocks on the ticket's wake list for at most `nap`, on a connection of
    /// its own. Returns when woken, at the end of the nap, or (if the server
    /// does not answer) a little after.
    async fn nap(&self, ticket: &Ticket, nap: Duration) -> Result<(), Error> {
        let wake = self.shared.keys.wake(&ticket.text);
        let mut conn = self.shared.blocking_conn().await?;
        // BLPOP takes seconds with decimals; 0 would block for ever.
        let secs = format!("{:.3}", nap.as_secs_f64().max(0.001));
        let mut blpop = redis::cmd("BLPOP");
        blpop.arg(&wake).arg(secs);
        match tokio::time::timeout(nap + BLOCK_GRACE, blpop.query_async::<Value>(&mut conn)).await {
            Ok(Ok(_)) => self.shared.give_back(conn),
            // A refusal by the server would come again: fail.
            Ok(Err(e)) if !breaks(&e) => return Err(self.shared.conn.error(&e)),
            // The connection broke (a restart?) or left the BLPOP unanswered:
            // drop it; the next attempt finds out whether the server is there.
            Ok(Err(_)) | Err(_) => {}
        }
        Ok(())
    }

    /// The guard of a grant made by a request sent at `sent`.
    fn grant(&self, req: &Req<'_>, token: u64, sent: Instant) -> Guard {
        if req.ticket.is_shared() {
            return self.grant_shared(req, token, sent);
        }
        let (keys, name, ttl) = (&self.shared.keys, req.name, req.opts.ttl);
        let owner = format!("{token}:{}", req.ticket.text);
        let (lock, holder) = (keys.lock(name), keys.holder(name));
        let shared = self.shared.clone();
        let renew = Arc::new(RenewLock { shared, lock, holder, owner: owner.clone(), ttl });
        let kept = KeptLease::start(req.ticket.id, ttl, sent, renew);
        let watch = kept.watch();
        let identity = req.opts.identity.clone();
        let held = RedisHeld { kept, shared: self.shared.clone(), name: name.to_string(), owner, identity };
        Guard::new(name.to_string(), Some(token), "redis", watch, Box::new(held))
    }

    /// An acquire (`Purpose::Lock`) or a campaign: queued, or tried once.
    async fn acquire_as(&self, name: &str, opts: &LockOptions, purpose: Purpose) -> Result<Acquire<Guard>, Error> {
        self.capabilities().admit(self.kind(), name, opts)?;
        if purpose == Purpose::Campaign && (opts.permits > 0 || opts.mode == crate::LockMode::Shared) {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        let req = Req { name, ticket: Ticket::for_request(opts), opts, data: encode_holder(opts), purpose };
        // Dropped (with the future, or on an error) it withdraws the ticket.
        let mut withdraw =
            Withdraw { shared: Some(self.shared.clone()), name: name.to_string(), ticket: req.ticket.text.clone() };
        let outcome = if opts.wait.is_zero() { self.try_once(&req).await? } else { self.wait_in_line(&req).await? };
        match outcome {
            Acquire::TimedOut => withdraw.now().await,
            _ => withdraw.disarm(),
        }
        Ok(outcome)
    }
}

/// How long a waiter blocks before it runs the script again: at most the wait
/// left and a third of its TTL (to refresh its waiter key); the first in line
/// also wakes just after the holder's lock would expire.
fn nap_length(left: Duration, ttl: Duration, first: bool, holder_pttl: Option<Duration>) -> Duration {
    let nap = left.min(ttl / 3);
    match (first, holder_pttl) {
        (true, Some(pttl)) => nap.min(pttl + Duration::from_millis(1)),
        _ => nap,
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

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Acquire<Guard>, Error>> {
        Box::pin(self.acquire_as(name, opts, Purpose::Lock))
    }

    /// The acquire, except that a ticket dropped from the queue while it
    /// waits ends it with [`Error::LeaseNotFound`].
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Acquire<Leadership>, Error>> {
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
            let deadline = Instant::now() + OP_TIMEOUT;
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

impl Shared {
    /// Release: compare-and-delete lock `name` if it holds `owner`, then wake
    /// the next waiter. `Ok(true)` iff this call deleted it. Not retried: a
    /// lost answer leaves the outcome unknown (an error).
    async fn release(&self, name: &str, owner: &str) -> Result<bool, Error> {
        let keys = &self.keys;
        let (lock, queue, holder, channel) = (keys.lock(name), keys.queue(name), keys.holder(name), keys.channel(name));
        let (lock, queue, holder, channel, prefix) = (&lock, &queue, &holder, &channel, &keys.prefix);
        let deadline = Instant::now() + OP_TIMEOUT;
        let n: i64 = self
            .conn
            .run(deadline, Retry::Never, |mut c| async move {
                let mut call = RELEASE.prepare_invoke();
                call.key(lock).key(queue).key(holder).arg(prefix).arg(owner).arg(channel);
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// Compare-and-set of the holder key of lock `name` if the lock holds
    /// `owner`: see `set_value.lua`. `Ok(true)` iff it did. Idempotent.
    async fn set_value(&self, name: &str, owner: &str, data: Vec<u8>) -> Result<bool, Error> {
        let keys = &self.keys;
        let (lock, holder, channel) = (keys.lock(name), keys.holder(name), keys.channel(name));
        let (lock, holder, channel, data) = (&lock, &holder, &channel, &data);
        let deadline = Instant::now() + OP_TIMEOUT;
        let n: i64 = self
            .conn
            .run(deadline, Retry::Once, |mut c| async move {
                let mut call = SET_VALUE.prepare_invoke();
                call.key(lock).key(holder).arg(owner).arg(data).arg(channel);
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// A waiter gives up: see `withdraw.lua`. Idempotent.
    async fn withdraw(&self, name: &str, ticket: &str) -> Result<(), Error> {
        let keys = &self.keys;
        let (lock, queue, holder, channel) = (keys.lock(name), keys.queue(name), keys.holder(name), keys.channel(name));
        let (holders, tokens) = (keys.holders(name), keys.tokens(name));
        let prefix = &keys.prefix;
        let deadline = Instant::now() + OP_TIMEOUT;
        let _: i64 = self
            .conn
            .run(deadline, Retry::Once, |mut c| {
                let (lock, queue, holder, channel, holders, tokens) =
                    (&lock, &queue, &holder, &channel, &holders, &tokens);
                async move {
                    let mut call = WITHDRAW.prepare_invoke();
                    call.key(lock).key(queue).key(holder).key(holders).key(tokens);
                    call.arg(prefix).arg(ticket).arg(channel);
                    call.invoke_async(&mut c).await
                }
            })
            .await?;
        Ok(())
    }

    /// An idle connection for `BLPOP`, or a new one.
    async fn blocking_conn(&self) -> Result<MultiplexedConnection, Error> {
        if let Some(conn) = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop() {
            return Ok(conn);
        }
        self.conn.open().await
    }

    /// Keeps a `BLPOP` connection whose command was answered.
    fn give_back(&self, conn: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE_BLOCKING {
            idle.push(conn);
        }
    }
}

/// The names of the keys (see the table in the [module docs](self)).
struct Keys {
    /// The prefix with its `:`.
    prefix: String,
}

impl Keys {
    fn lock(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }

    fn queue(&self, name: &str) -> String {
        format!("{}queue:{name}", self.prefix)
    }

    fn counter(&self) -> String {
        format!("{}token", self.prefix)
    }

    fn wake(&self, ticket: &str) -> String {
        format!("{}wake:{ticket}", self.prefix)
    }

    fn holder(&self, name: &str) -> String {
        format!("{}holder:{name}", self.prefix)
    }

    fn channel(&self, name: &str) -> String {
        format!("{}leader:{name}", self.prefix)
    }

    fn holders(&self, name: &str) -> String {
        format!("{}holders:{name}", self.prefix)
    }

    fn tokens(&self, name: &str) -> String {
        format!("{}tokens:{name}", self.prefix)
    }

    fn permits(&self, name: &str) -> String {
        format!("{}permits:{name}", self.prefix)
    }
}

/// What a request is for, which decides what losing its place means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A lock: a ticket dropped from the queue is queued again, at the back.
    Lock,
    /// A campaign: a candidate whose ticket was dropped is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does.
    Campaign,
}

/// One acquire or campaign: what each run of the acquire script sends.
struct Req<'a> {
    name: &'a str,
    ticket: Ticket,
    opts: &'a LockOptions,
    /// The identity and value, encoded for the holder key.
    data: Vec<u8>,
    purpose: Purpose,
}

impl Req<'_> {
    /// The error of a campaign whose ticket was dropped from the queue.
    fn lost(&self) -> Error {
        let why = format!("the ticket of a waiting campaign for {:?} was dropped from the queue (its waiter key expired, or the server lost it)", self.name);
        match self.purpose {
            Purpose::Lock => Error::backend("redis", why),
            Purpose::Campaign => Error::LeaseNotFound(format!("redis: {why}")),
        }
    }
}

/// One acquire's identity: 128 random bits, as 32 hex digits in Redis; `id`
/// (the high half) is the guard's lease id.
pub(super) struct Ticket {
    pub(super) id: u64,
    pub(super) text: String,
}

impl Ticket {
    pub(super) fn new() -> Ticket {
        let bits = crate::unique::u128();
        Ticket { id: (bits >> 64) as u64, text: format!("{bits:032x}") }
    }

    /// A ticket of the kind `opts` asks for: exclusive, or (see `queue.lua`)
    /// a reader's (`r` after the 32 digits) or a semaphore's (`s{weight}`).
    fn for_request(opts: &LockOptions) -> Ticket {
        let mut ticket = Ticket::new();
        if opts.permits > 0 {
            ticket.text.push_str(&format!("s{}", opts.weight));
        } else if opts.mode == crate::LockMode::Shared {
            ticket.text.push('r');
        }
        ticket
    }

    /// Is this a reader's or a semaphore's ticket?
    fn is_shared(&self) -> bool {
        self.text.len() > 32
    }
}

/// What one run of the acquire script found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    Granted {
        token: u64,
    },
    /// `holder`: the lock's value, if held; `pttl`: its time to live.
    Refused {
        holder: Option<String>,
        pttl: Option<Duration>,
        waiters: u32,
        first: bool,
    },
    /// The ticket, queued before, is queued no more (a campaign's).
    Dropped,
    /// The lock keeps another semaphore size `kept` (0: not a semaphore).
    Mismatch {
        kept: u32,
    },
}

/// Parses the acquire script's reply (see `acquire.lua`).
fn parse_attempt(reply: &Value) -> Result<Attempt, Error> {
    let bad = || Error::backend("redis", format!("unexpected reply of the acquire script: {reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    match items.as_slice() {
        [Value::Int(1), token] => Ok(Attempt::Granted { token: decimal(token).ok_or_else(bad)? }),
        [Value::Int(2)] => Ok(Attempt::Dropped),
        [Value::Int(3), Value::Int(kept)] => Ok(Attempt::Mismatch { kept: u32::try_from(*kept).map_err(|_| bad())? }),
        [Value::Int(0), Value::BulkString(holder), Value::Int(pttl), Value::Int(waiters), Value::Int(first)] => {
            Ok(Attempt::Refused {
                holder: (!holder.is_empty()).then(|| String::from_utf8_lossy(holder).into_owned()),
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                waiters: u32::try_from(*waiters).unwrap_or(u32::MAX),
                first: *first == 1,
            })
        }
        _ => Err(bad()),
    }
}

/// A token in a reply: an integer or a decimal string.
fn decimal(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// The token of a lock value `"{token}:{ticket}"`.
fn token_of(value: &str) -> Option<u64> {
    value.split_once(':')?.0.parse().ok()
}

/// The lease id of a lock value `"{token}:{ticket}"`: the high half of the
/// ticket, as the holder's [`Guard::lease_id`].
fn lease_of(value: &str) -> Option<u64> {
    let ticket = value.split_once(':')?.1;
    u64::from_str_radix(ticket.get(..16)?, 16).ok()
}

/// A duration in whole milliseconds, at least 1 (for `PX`).
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Drop guard of an acquire: unless disarmed, withdraws the ticket in the
/// background (the future was dropped, or failed).
struct Withdraw {
    shared: Option<Arc<Shared>>,
    name: String,
    ticket: String,
}

impl Withdraw {
    /// The acquire ended cleanly: nothing to withdraw.
    fn disarm(&mut self) {
        self.shared = None;
    }

    /// Withdraws now (a wait ran out); errors are ignored: the waiter key then
    /// expires after the TTL, and the ticket is skipped after that.
    async fn now(&mut self) {
        if let Some(shared) = self.shared.take() {
            if let Err(e) = shared.withdraw(&self.name, &self.ticket).await {
                tracing::debug!(lock = self.name, error = %e, "fencelock: redis withdraw failed");
            }
        }
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (name, ticket) = (std::mem::take(&mut self.name), std::mem::take(&mut self.ticket));
            runtime.spawn(async move {
                let _ = shared.withdraw(&name, &ticket).await;
            });
        }
    }
}

/// Renews one grant: `PEXPIRE` if the lock still holds `owner`.
struct RenewLock {
    shared: Arc<Shared>,
    lock: String,
    /// Renewed with the lock.
    holder: String,
    owner: String,
    ttl: Duration,
}

impl Renew for RenewLock {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let (lock, holder, owner, ttl_ms) = (&self.lock, &self.holder, &self.owner, millis(self.ttl));
            let n: i64 = self
                .shared
                .conn
                .run(round_end, Retry::Once, |mut c| async move {
                    let mut call = RENEW.prepare_invoke();
                    call.key(lock).key(holder).arg(owner).arg(ttl_ms);
                    call.invoke_async(&mut c).await
                })
                .await?;
            Ok(if n == 1 { Renewed::Confirmed(Some(self.ttl)) } else { Renewed::Gone })
        })
    }
}

/// A held Redis lock: keeps the lease alive while it lives.
struct RedisHeld {
    kept: KeptLease,
    shared: Arc<Shared>,
    /// The lock name.
    name: String,
    owner: String,
    /// The request's identity, stored again with each new value.
    identity: Option<String>,
}

impl Held for RedisHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let RedisHeld { kept, shared, name, owner, .. } = *self;
            drop(kept); // stop renewing first
            shared.release(&name, &owner).await
        })
    }

    fn release_in_background(self: Box<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = self.release().await;
            });
        }
    }

    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let data = encode_holder_parts(self.identity.as_deref(), &value);
        Some(Box::pin(self.shared.set_value(&self.name, &self.owner, data)))
    }

    /// No downgrade: see `redis/shared.rs`.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async {
            Err(Error::Unsupported("redis cannot downgrade a writer; release and acquire shared".into()))
        }))
    }
}

/// Refuses durable mode unless the server fsyncs its AOF on every write.
async fn check_durable(conn: &Conn) -> Result<(), Error> {
    let refuse = |why: String| {
        Error::Unsupported(format!(
            "redis: durable=true needs the server {} to run with `appendonly yes` and `appendfsync always` \
             (set them in redis.conf or with CONFIG SET), {why}; or drop durable=true and accept that tokens \
             can go backwards after a restart",
            conn.addr
        ))
    };
    let appendonly = config_get(conn, "appendonly").await.map_err(|e| refuse(format!("and CONFIG GET failed: {e}")))?;
    let appendfsync =
        config_get(conn, "appendfsync").await.map_err(|e| refuse(format!("and CONFIG GET failed: {e}")))?;
    if appendonly == "yes" && appendfsync == "always" {
        Ok(())
    } else {
        Err(refuse(format!("but it has appendonly={appendonly} and appendfsync={appendfsync}")))
    }
}

/// `CONFIG GET param`: its value.
async fn config_get(conn: &Conn, param: &str) -> Result<String, Error> {
    let deadline = Instant::now() + OP_TIMEOUT;
    let pair: Vec<String> = conn
        .run(deadline, Retry::Once, |mut c| async move {
            redis::cmd("CONFIG").arg("GET").arg(param).query_async(&mut c).await
        })
        .await?;
    match pair.as_slice() {
        [_, value] => Ok(value.clone()),
        _ => Err(Error::backend("redis", format!("CONFIG GET {param} answered {pair:?}"))),
    }
}

/// Refuses query parameters other than `known` (a typo would otherwise be
/// ignored silently).
pub(super) fn check_params(url: &BackendUrl, known: &[&str]) -> Result<(), Error> {
    match url.params.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        Some((k, _)) => Err(Error::InvalidArgument(format!(
            "{}: unknown parameter {k:?} for the {} backend (known: {})",
            url,
            url.scheme,
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

/// The `prefix=` parameter (default [`DEFAULT_PREFIX`]): not empty, no
/// control characters.
pub(super) fn prefix(url: &BackendUrl) -> Result<String, Error> {
    let prefix = url.param("prefix").unwrap_or(DEFAULT_PREFIX);
    if prefix.is_empty() || prefix.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!("{url}: prefix must be non-empty text")));
    }
    Ok(prefix.to_string())
}

/// The database number in the URL's path (default 0).
fn db_number(url: &BackendUrl) -> Result<u32, Error> {
    if url.path.is_empty() {
        return Ok(0);
    }
    url.path
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("{}: the path must be a database number, not {:?}", url, url.path)))
}

/// Whether a call may be sent again on a fresh connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// Idempotent: once more if the connection turned out broken (e.g. the
    /// server restarted since the connection was made).
    Once,
    /// The answer matters and a second run could give another one.
    Never,
}

/// One Redis server over one multiplexed connection, made on first use and
/// made again after it breaks (an IO error or a call without an answer by its
/// deadline). Every call is bounded by a deadline.
pub(super) struct Conn {
    client: redis::Client,
    /// `host:port`, for messages.
    pub(super) addr: String,
    /// Whether the connection is TLS.
    tls: bool,
    /// The connection in use with its generation (from 1), if any.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while connecting, so that concurrent callers wait for one connection.
    connecting: tokio::sync::Mutex<()>,
    generations: AtomicU64,
}

impl Conn {
    /// A handle on the server `host:port` with the URL's credentials,
    /// database and TLS files (`tls`, read once by the caller: see
    /// [`super::tls`]); does not connect yet.
    pub(super) fn new(url: &BackendUrl, host: &str, port: u16, tls: Option<&TlsFiles>) -> Result<Conn, Error> {
        let mut redis = RedisConnectionInfo::default().set_db(i64::from(db_number(url)?));
        if let Some(user) = url.user() {
            redis = redis.set_username(user);
        }
        if let Some(password) = url.password() {
            redis = redis.set_password(password);
        }
        let addr = match tls {
            None => ConnectionAddr::Tcp(host.to_string(), port),
            Some(_) => ConnectionAddr::TcpTls { host: host.to_string(), port, insecure: false, tls_params: None },
        };
        let info = addr
            .into_connection_info()
            .map_err(|e| Error::InvalidArgument(format!("{url}: {e}")))?
            .set_redis_settings(redis);
        let client = match tls {
            None => redis::Client::open(info),
            Some(files) => redis::Client::build_with_tls(info, certificates(files)),
        }
        .map_err(|e| Error::InvalidArgument(format!("{url}: {e}")))?;
        let shown = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
        Ok(Conn {
            client,
            addr: format!("{shown}:{port}"),
            tls: tls.is_some(),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(0),
        })
    }

    /// Connects and pings: [`Error::Connect`] if that fails within
    /// [`CONNECT_TIMEOUT`], [`Error::Security`] if the TLS handshake or the
    /// authentication fails.
    pub(super) async fn connect_now(&self) -> Result<(), Error> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        self.run(deadline, Retry::Never, |mut c| async move { redis::cmd("PING").query_async::<()>(&mut c).await })
            .await
            .map_err(|e| {
                let hint = " (a server that closes plaintext connections may speak TLS only: use rediss://)";
                e.while_connecting(if self.tls { "" } else { hint })
            })
    }

    /// A new connection of its own (not the shared one), for a blocking command.
    pub(super) async fn open(&self) -> Result<MultiplexedConnection, Error> {
        let config = connection_config();
        let connect = self.client.get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => Err(Error::backend("redis", format!("{}: no connection within {CONNECT_TIMEOUT:?}", self.addr))),
        }
    }

    /// Runs `op` on the shared connection by `deadline`. A broken connection
    /// is dropped (the next call makes a new one); with [`Retry::Once`], a
    /// call that found the connection broken runs once more on a new one.
    pub(super) async fn run<T, F, Fut>(&self, deadline: Instant, retry: Retry, op: F) -> Result<T, Error>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let used = AtomicU64::new(0);
        let call = async {
            let mut retried = false;
            loop {
                let (generation, conn, fresh) = self.get().await?;
                used.store(generation, Ordering::Relaxed);
                match op(conn).await {
                    Err(e) if breaks(&e) => {
                        self.forget(generation);
                        if retry == Retry::Never || fresh || retried {
                            return Err(e);
                        }
                        retried = true;
                    }
                    other => return other,
                }
            }
        };
        match timeout_at(deadline, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => {
                // A connection that leaves a call unanswered may be dead
                // without an error (a partition): make a new one next time.
                self.forget(used.load(Ordering::Relaxed));
                Err(Error::backend("redis", format!("{}: no answer in time", self.addr)))
            }
        }
    }

    /// The shared connection (and whether it was made by this call).
    async fn get(&self) -> RedisResult<(u64, MultiplexedConnection, bool)> {
        if let Some((generation, conn)) = self.current() {
            return Ok((generation, conn, false));
        }
        let _connecting = self.connecting.lock().await;
        if let Some((generation, conn)) = self.current() {
            return Ok((generation, conn, true));
        }
        let conn = self.client.get_multiplexed_async_connection_with_config(&connection_config()).await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some((generation, conn.clone()));
        Ok((generation, conn, true))
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Drops connection `generation` if it is still the one in use.
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// A failed call as [`Error::Backend`], or [`Error::Security`] for a
    /// failed TLS handshake or a refused authentication.
    pub(super) fn error(&self, e: &RedisError) -> Error {
        if let Some(cause) = tls::rustls_cause(e) {
            return Error::security(format!("redis: {}: TLS handshake failed: {cause}", self.addr), cause.clone());
        }
        // The redis crate keeps rustls's error only as text.
        let text = e.to_string();
        if self.tls
            && ["invalid peer certificate", "received fatal alert", "peer is incompatible"]
                .iter()
                .any(|t| text.contains(t))
        {
            return Error::Security {
                message: format!("redis: {}: TLS handshake failed: {text}", self.addr),
                source: None,
            };
        }
        let refused = match e.code() {
            _ if e.kind() == ErrorKind::AuthenticationFailed => Some("authentication refused (wrong user or password)"),
            Some("WRONGPASS") => Some("authentication refused (wrong user or password)"),
            Some("NOAUTH") => Some("the server requires authentication: give user:password@ in the URL"),
            Some("NOPERM") => Some("the ACL user lacks a permission the backend needs (+@all on its keys)"),
            _ => None,
        };
        match refused {
            Some(why) => Error::Security { message: format!("redis: {}: {why}: {e}", self.addr), source: None },
            None => Error::backend_caused("redis", format!("{}: {e}", self.addr), e.clone()),
        }
    }
}

/// The TLS files as the redis driver takes them.
fn certificates(files: &TlsFiles) -> TlsCertificates {
    TlsCertificates {
        client_tls: files
            .identity
            .as_ref()
            .map(|(cert, key)| ClientTlsConfig { client_cert: cert.clone(), client_key: key.clone() }),
        root_cert: Some(files.ca_pem.clone()),
    }
}

/// No response timeout in the driver: every call has its own deadline here
/// (and a `BLPOP` must be able to block).
fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT)).set_response_timeout(None)
}

/// Does `e` mean the connection is unusable (rather than a refusal by the
/// server, over a healthy connection)?
fn breaks(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Io | ErrorKind::Parse) || e.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquire_replies_parse() {
        let granted = Value::Array(vec![Value::Int(1), bulk("42")]);
        assert_eq!(parse_attempt(&granted), Ok(Attempt::Granted { token: 42 }));
        let value = "7:00000000000000ff0000000000000001";
        let held = Value::Array(vec![Value::Int(0), bulk(value), Value::Int(900), Value::Int(2), Value::Int(1)]);
        let want = Attempt::Refused {
            holder: Some(value.to_string()),
            pttl: Some(Duration::from_millis(900)),
            waiters: 2,
            first: true,
        };
        assert_eq!(parse_attempt(&held), Ok(want));
        let free = Value::Array(vec![Value::Int(0), bulk(""), Value::Int(-2), Value::Int(1), Value::Int(0)]);
        let want = Attempt::Refused { holder: None, pttl: None, waiters: 1, first: false };
        assert_eq!(parse_attempt(&free), Ok(want));
        assert_eq!(parse_attempt(&Value::Array(vec![Value::Int(2)])), Ok(Attempt::Dropped));
        assert_eq!(parse_attempt(&Value::Array(vec![Value::Int(3), Value::Int(4)])), Ok(Attempt::Mismatch { kept: 4 }));
        for bad in [Value::Nil, Value::Array(vec![Value::Int(1), bulk("x")]), Value::Array(vec![Value::Int(3)])] {
            assert!(matches!(parse_attempt(&bad), Err(Error::Backend { .. })), "{bad:?}");
        }
    }

    #[test]
    fn lock_values_carry_their_token() {
        assert_eq!(token_of("12:00ff"), Some(12));
        assert_eq!(token_of("x:00ff"), None);
        assert_eq!(token_of("12"), None);
        assert_eq!(lease_of("12:00000000000000ff0000000000000001"), Some(255));
        assert_eq!(lease_of("12:ff"), None);
    }

    #[test]
    fn the_first_in_line_wakes_at_the_holders_expiry() {
        let s = Duration::from_secs(1);
        assert_eq!(nap_length(10 * s, 30 * s, false, Some(s)), 10 * s, "not first: the refresh or the wait");
        assert_eq!(nap_length(10 * s, 3 * s, false, None), s, "a third of the TTL");
        assert_eq!(nap_length(10 * s, 30 * s, true, Some(s)), s + Duration::from_millis(1));
        assert_eq!(nap_length(s / 2, 30 * s, true, Some(s)), s / 2, "never past the wait");
    }

    #[test]
    fn urls_are_checked() {
        let url = |u: &str| BackendUrl::parse(u).unwrap();
        assert!(check_params(&url("redis://h?prefix=a&durable=1"), &["prefix", "durable"]).is_ok());
        let err = check_params(&url("redis://h?durabel=1"), &["prefix", "durable"]).unwrap_err();
        assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("durabel")), "{err}");
        assert_eq!(prefix(&url("redis://h")).unwrap(), "fencelock");
        assert_eq!(prefix(&url("redis://h?prefix=app")).unwrap(), "app");
        assert!(prefix(&url("redis://h?prefix=")).is_err());
        assert_eq!(db_number(&url("redis://h/3")).unwrap(), 3);
        assert!(db_number(&url("redis://h/x")).is_err());
        assert!(Conn::new(&url("redis://h/x"), "h", 1, None).is_err());
        assert_eq!(Conn::new(&url("redis://[::1]:7/2"), "::1", 7, None).unwrap().addr, "[::1]:7");
    }

    #[test]
    fn tickets_are_random_and_hex() {
        let (a, b) = (Ticket::new(), Ticket::new());
        assert_ne!(a.text, b.text);
        assert_eq!(a.text.len(), 32);
        assert!(a.text.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{:016x}", a.id), a.text[..16]);
    }

    /// A ticket says its kind after its 32 digits (`queue.lua`'s `kind_of`).
    #[test]
    fn tickets_say_their_kind() {
        let reader = Ticket::for_request(&LockOptions::default().shared());
        assert!(reader.text.ends_with('r') && reader.text.len() == 33 && reader.is_shared());
        let permits = Ticket::for_request(&LockOptions::default().permits(5).weight(3));
        assert!(permits.text.ends_with("s3") && permits.is_shared());
        let writer = Ticket::for_request(&LockOptions::default());
        assert!(writer.text.len() == 32 && !writer.is_shared());
    }
}
