//! The Redlock backend: a lock held on a majority of N independent Redis
//! servers (`redlock://h1:p1,h2:p2,h3:p3[/db][?prefix=fencelock]`), after the
//! algorithm described in the Redis documentation ("Distributed Locks with
//! Redis"). No fencing token.
//!
//! Where it sits: [`super::connect`] builds a [`RedlockBackend`] for a
//! `redlock://` URL. It reuses the Redis backend's connection handling
//! (`Conn` in [`super::redis`], one connection per node, made again after it
//! breaks) and its `renew.lua`; `unlock.lua` is the compare-and-delete.
//!
//! # Keys
//! On every node, `{prefix}:lock:{name}` (default prefix `fencelock`) holds a
//! random value (32 hex digits) made per attempt, with `PX ttl`. Nothing else:
//! there is no queue and no counter. Do not point a Redis backend and a
//! Redlock backend at the same server with the same prefix.
//!
//! # The recipe
//! * **Acquire**: take `sent` before sending, then `SET key value NX PX ttl`
//!   on every node in parallel, each bounded by a short timeout (TTL/10,
//!   between 50 ms and 1 s). With `drift = ttl/100 + 2 ms`, the lock is granted
//!   iff a majority (N/2+1) answered OK and `ttl − elapsed − drift > 0`; the
//!   guard's deadline is `sent + ttl − drift`. Otherwise the value is deleted
//!   again on every node (compare-and-delete), and a waiting acquire tries
//!   again after a random 20–100 ms until its wait is over: **Redlock polls**.
//!   It has no queue, so it is not FIFO ([`Capabilities::fifo`] and
//!   [`Capabilities::push_wakeup`] are false), and a waiter can starve under
//!   heavy contention.
//! * **Renew**: `PEXPIRE` if the value is ours (`renew.lua`) on every node in
//!   parallel, by the round's end: confirmed (for `ttl − drift` from the
//!   round's send time) iff a majority confirmed; gone iff so many nodes say
//!   "not ours" that a majority can no longer confirm. A node that lost the
//!   key (restarted) is not re-written.
//! * **Release**: compare-and-delete on every node; `Ok(true)` iff a majority
//!   deleted it, `Ok(false)` iff a majority certainly did not.
//! * **Nodes down**: if so many nodes fail (error or no answer) that the
//!   others cannot make a majority, a try fails with [`Error::Backend`] (a
//!   failure of the service, not contention); a waiting acquire goes on
//!   trying while its wait lasts and returns that error if the last attempt
//!   failed so (not `TimedOut`). With a majority up it works as usual. [`RedlockBackend::connect`]
//!   likewise needs a majority to answer ([`Error::Connect`] otherwise); the
//!   others are connected to when they come back.
//!
//! # What it guarantees, and what it does not
//! * With a majority of nodes up and correct, at most one holder at a time,
//!   provided the clocks of the client and the servers run at about the same
//!   rate (the drift allowance is 1 % of the TTL plus 2 ms) and each guard is
//!   used before its deadline. A minority of nodes may fail
//!   ([`Capabilities::survives_failover`]).
//! * **No fencing token** ([`Fencing::None`]): a holder that pauses (GC, swap,
//!   a stopped VM) past its deadline can still write after the lock went to
//!   someone else, and no resource can tell; `require_fencing` is refused.
//!   This, and the points below, are M. Kleppmann's critique ("How to do
//!   distributed locking", 2016):
//!   - Redis expires keys by its wall clock: a clock that jumps forward on a
//!     node (NTP step, manual change) expires the key there early, and two
//!     clients can then hold majorities that overlap in time.
//!   - A node restarted without persistence (or with `appendfsync everysec`)
//!     forgets the key: with one more node down or re-taken, another client
//!     gets a majority. Restart a node only after the longest TTL has
//!     passed, or run the nodes with `appendfsync always`.
//!   - Network delays and process pauses are bounded only by the TTL;
//!     nothing orders the writes of two holders.
//! * No queue, no fairness, no push wake-ups: waiters poll (see above).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::redis::{check_params, millis, prefix, Conn, Retry, Ticket, OP_TIMEOUT, RENEW};
use super::tls::TlsFiles;
use super::{BackendUrl, BoxFuture, Capabilities, Fencing, Guard, Held, KeptLease, LockBackend, Renew, Renewed};
use crate::backend::Acquire;
use crate::error::Error;
use crate::types::LockOptions;

/// `unlock.lua`: compare-and-delete on one node.
static UNLOCK: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("redis/unlock.lua")));

/// Retry delay of a waiting acquire: uniform in this range.
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(100);

/// Locks on a majority of independent Redis nodes. See the
/// [module docs](self) for the recipe and what it does not guarantee.
pub struct RedlockBackend {
    nodes: Arc<Nodes>,
}

/// The nodes, shared by the backend, its guards and background tasks.
struct Nodes {
    conns: Vec<Conn>,
    /// The prefix with its `:`.
    prefix: String,
}

impl RedlockBackend {
    /// Connects to every node of `url` (`redlock://h1:p1,h2:p2,…[/db][?prefix=…]`).
    /// [`Error::InvalidArgument`] for a bad URL or a node named twice;
    /// [`Error::Connect`] if fewer than a majority of the nodes answer within
    /// a few seconds.
    pub async fn connect(url: &BackendUrl) -> Result<Self, Error> {
        check_params(url, &["prefix", "ca", "cert", "key"])?;
        let tls = TlsFiles::from_url(url)?;
        let prefix = format!("{}:", prefix(url)?);
        for (i, node) in url.hosts.iter().enumerate() {
            if url.hosts[..i].contains(node) {
                return Err(Error::InvalidArgument(format!(
                    "{}: node {}:{} is named twice (it would count twice towards a majority)",
                    url, node.0, node.1
                )));
            }
        }
        let conns =
            url.hosts.iter().map(|(h, p)| Conn::new(url, h, *p, tls.as_ref())).collect::<Result<Vec<_>, _>>()?;
        let nodes = Nodes { conns, prefix };
        let pings = nodes.conns.iter().map(|c| Box::pin(c.connect_now()) as BoxFuture<'_, Result<(), Error>>);
        let answers = join_all(pings).await;
        let failed: Vec<Error> = answers.into_iter().filter_map(Result::err).collect();
        if nodes.conns.len() - failed.len() < nodes.quorum() {
            // A refused certificate or password is the same mistake on every
            // node: say it as itself, not as "unreachable".
            if let Some(refused) = failed.iter().find(|e| matches!(e, Error::Security { .. })) {
                return Err(refused.clone());
            }
            let texts: Vec<String> = failed.iter().map(Error::to_string).collect();
            let message = format!(
                "redlock: {} of {} nodes unreachable, a majority ({}) is needed: {}",
                failed.len(),
                nodes.conns.len(),
                nodes.quorum(),
                texts.join("; ")
            );
            // The first node's error (its driver's error its own source).
            return Err(match failed.into_iter().next() {
                Some(first) => Error::connect_caused(message, first),
                None => Error::connect(message),
            });
        }
        Ok(RedlockBackend { nodes: Arc::new(nodes) })
    }

    /// The guard of a grant whose first `SET` was sent at `sent`.
    fn grant(&self, name: &str, key: String, ticket: &Ticket, ttl: Duration, sent: Instant) -> Guard {
        let valid = ttl - drift(ttl);
        let owner = ticket.text.clone();
        let renew = Arc::new(RenewOnNodes { nodes: self.nodes.clone(), key: key.clone(), owner: owner.clone(), ttl });
        let kept = KeptLease::start(ticket.id, valid, sent, renew);
        let watch = kept.watch();
        let held = RedlockHeld { kept, nodes: self.nodes.clone(), key, owner };
        Guard::new(name.to_string(), None, "redlock", watch, Box::new(held))
    }
}

/// The clock drift allowance subtracted from a TTL: 1 % plus 2 ms.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long one node may take to answer a `SET` of an acquire.
fn node_timeout(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

impl LockBackend for RedlockBackend {
    fn kind(&self) -> &'static str {
        "redlock"
    }

    /// No token, no queue, no push wake-ups; expiry by each node (`PX`); a
    /// minority of nodes may fail. See the [module docs](self) for the caveats.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::None,
            durable_tokens: false,
            fifo: false,
            push_wakeup: false,
            server_ttl: true,
            survives_failover: true,
            lock_delay: false,
            holder_identity: false,
            election: false,
            shared: false,
            semaphores: false,
            hold_at_least: false,
            once_per: false,
            multi_lock: false,
            min_ttl: Duration::from_millis(100),
        }
    }

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Acquire<Guard>, Error>> {
        Box::pin(async move {
            self.capabilities().admit(self.kind(), name, opts)?;
            let key = self.nodes.key(name);
            let end = Instant::now() + opts.wait;
            loop {
                let ticket = Ticket::new();
                // Dropped while the SETs are out, it deletes what they set.
                let mut undo = Undo {
                    nodes: Some(self.nodes.clone()),
                    key: key.clone(),
                    owner: ticket.text.clone(),
                    timeout: node_timeout(opts.ttl),
                };
                let sent = Instant::now();
                let tally = self.nodes.set_all(&key, &ticket.text, opts.ttl).await;
                if tally.yes >= self.nodes.quorum() && sent.elapsed() + drift(opts.ttl) < opts.ttl {
                    undo.disarm();
                    return Ok(Acquire::Acquired(self.grant(name, key, &ticket, opts.ttl, sent)));
                }
                undo.now().await;
                let failure = tally.cannot_reach_quorum(self.nodes.quorum()).then(|| self.nodes.failure(&tally));
                if opts.wait.is_zero() {
                    let busy = Acquire::Busy { holder_lease: None, holder_token: None, reopens_in: None, waiters: 0 };
                    return failure.map_or(Ok(busy), Err);
                }
                let now = Instant::now();
                if now >= end {
                    return failure.map_or(Ok(Acquire::TimedOut), Err);
                }
                let delay = RETRY_MIN + (RETRY_MAX - RETRY_MIN).mul_f64(fastrand::f64());
                tokio::time::sleep_until((now + delay).min(end)).await;
            }
        })
    }
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<&str> = self.nodes.conns.iter().map(|c| c.addr.as_str()).collect();
        f.debug_struct("RedlockBackend").field("nodes", &nodes).field("prefix", &self.nodes.prefix).finish()
    }
}

/// What the nodes answered to one round.
#[derive(Debug, Default)]
struct Tally {
    /// Did what was asked (set, renewed, deleted).
    yes: usize,
    /// Answered no (held by another, not ours).
    no: usize,
    /// Failed or did not answer in time (each node's error, its driver's
    /// error as its source).
    errors: Vec<Error>,
}

impl Tally {
    fn new(answers: Vec<Result<bool, Error>>) -> Tally {
        let mut tally = Tally::default();
        for answer in answers {
            match answer {
                Ok(true) => tally.yes += 1,
                Ok(false) => tally.no += 1,
                Err(e) => tally.errors.push(e),
            }
        }
        tally
    }

    /// True if the nodes that did not fail are fewer than `quorum`.
    fn cannot_reach_quorum(&self, quorum: usize) -> bool {
        self.yes + self.no < quorum
    }
}

impl Nodes {
    /// The error of a round in which too many nodes failed for a majority.
    fn failure(&self, tally: &Tally) -> Error {
        let (quorum, n, failed) = (self.quorum(), self.conns.len(), tally.errors.len());
        majority_failed(format!("a majority ({quorum}) of {n} nodes is needed and {failed} failed"), &tally.errors)
    }

    /// A majority: N/2 + 1.
    fn quorum(&self) -> usize {
        self.conns.len() / 2 + 1
    }

    fn key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }

    /// `SET key owner NX PX ttl` on every node in parallel.
    async fn set_all(&self, key: &str, owner: &str, ttl: Duration) -> Tally {
        let deadline = Instant::now() + node_timeout(ttl);
        let ttl_ms = millis(ttl);
        self.each(deadline, |mut c| async move {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(owner).arg("NX").arg("PX").arg(ttl_ms);
            Ok(matches!(set.query_async::<Value>(&mut c).await?, Value::Okay))
        })
        .await
    }

    /// Compare-and-delete on every node in parallel, by `deadline`.
    async fn unlock_all(&self, key: &str, owner: &str, deadline: Instant) -> Tally {
        self.each(deadline, |mut c| async move {
            let mut call = UNLOCK.prepare_invoke();
            call.key(key).arg(owner);
            Ok(call.invoke_async::<i64>(&mut c).await? == 1)
        })
        .await
    }

    /// `PEXPIRE`-if-ours on every node in parallel.
    async fn renew_all(&self, key: &str, owner: &str, ttl: Duration, deadline: Instant) -> Tally {
        let ttl_ms = millis(ttl);
        self.each(deadline, |mut c| async move {
            let mut call = RENEW.prepare_invoke();
            call.key(key).arg(owner).arg(ttl_ms);
            Ok(call.invoke_async::<i64>(&mut c).await? == 1)
        })
        .await
    }

    /// Runs `op` on every node in parallel (an idempotent call: a node whose
    /// connection turned out broken gets it once more), each by `deadline`.
    async fn each<F, Fut>(&self, deadline: Instant, op: F) -> Tally
    where
        F: Fn(redis::aio::MultiplexedConnection) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<bool>> + Send,
    {
        let op = &op;
        let calls = self.conns.iter().map(|c| Box::pin(c.run(deadline, Retry::Once, op)) as BoxFuture<'_, _>);
        Tally::new(join_all(calls).await)
    }
}

/// Polls every future in place until all are done; their outputs in order.
/// (Dropping it drops the calls still out.)
async fn join_all<'a, T>(futures: impl Iterator<Item = BoxFuture<'a, T>>) -> Vec<T> {
    let mut futures: Vec<BoxFuture<'a, T>> = futures.collect();
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match Pin::as_mut(future).poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Drop guard of one acquire attempt: unless disarmed, deletes the attempt's
/// value from every node ([`Undo::now`] at once, within the attempt's node
/// timeout; on drop in the background).
struct Undo {
    nodes: Option<Arc<Nodes>>,
    key: String,
    owner: String,
    /// How long each node may take.
    timeout: Duration,
}

impl Undo {
    fn disarm(&mut self) {
        self.nodes = None;
    }

    /// Deletes the attempt's value now (a refused attempt); errors are left to
    /// the TTL.
    async fn now(&mut self) {
        if let Some(nodes) = self.nodes.take() {
            nodes.unlock_all(&self.key, &self.owner, Instant::now() + self.timeout).await;
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some(nodes) = self.nodes.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (key, owner) = (std::mem::take(&mut self.key), std::mem::take(&mut self.owner));
            runtime.spawn(async move {
                nodes.unlock_all(&key, &owner, Instant::now() + OP_TIMEOUT).await;
            });
        }
    }
}

/// Renews one grant on every node.
struct RenewOnNodes {
    nodes: Arc<Nodes>,
    key: String,
    owner: String,
    /// The full TTL (what the nodes get); the lease counts `ttl − drift`.
    ttl: Duration,
}

impl Renew for RenewOnNodes {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let tally = self.nodes.renew_all(&self.key, &self.owner, self.ttl, round_end).await;
            let (n, quorum) = (self.nodes.conns.len(), self.nodes.quorum());
            if tally.yes >= quorum {
                Ok(Renewed::Confirmed(Some(self.ttl - drift(self.ttl))))
            } else if tally.no > n - quorum {
                Ok(Renewed::Gone)
            } else {
                let yes = tally.yes;
                let why = format!("renewal confirmed by {yes} of {n} nodes, a majority ({quorum}) is needed");
                Err(majority_failed(why, &tally.errors))
            }
        })
    }
}

/// A held Redlock lock: keeps the lease alive while it lives.
struct RedlockHeld {
    kept: KeptLease,
    nodes: Arc<Nodes>,
    key: String,
    owner: String,
}

impl Held for RedlockHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let RedlockHeld { kept, nodes, key, owner } = *self;
            drop(kept); // stop renewing first
            let tally = nodes.unlock_all(&key, &owner, Instant::now() + OP_TIMEOUT).await;
            released(&tally, nodes.quorum())
        })
    }

    fn release_in_background(self: Box<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = self.release().await;
            });
        }
    }
}

/// A release's outcome: a majority deleted (true); a majority certainly did
/// not, even counting the failed nodes as deleted (false); else unknown.
fn released(tally: &Tally, quorum: usize) -> Result<bool, Error> {
    if tally.yes >= quorum {
        Ok(true)
    } else if tally.yes + tally.errors.len() < quorum {
        Ok(false)
    } else {
        let why = format!("release confirmed by {} nodes, a majority ({quorum}) is needed", tally.yes);
        Err(majority_failed(why, &tally.errors))
    }
}

/// [`Error::Backend`] of a round without a majority: `why`, then what each
/// failed node said; the first node's error is the source (with its driver's
/// error as its own source).
fn majority_failed(why: String, errors: &[Error]) -> Error {
    let texts: Vec<String> = errors.iter().map(Error::to_string).collect();
    let message = format!("{why}; failures: {}", texts.join("; "));
    match errors.first() {
        Some(first) => Error::backend_caused("redlock", message, first.clone()),
        None => Error::backend("redlock", message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn tally(yes: usize, no: usize, errors: usize) -> Tally {
        Tally { yes, no, errors: vec![Error::backend("redis", "down"); errors] }
    }

    #[test]
    fn drift_and_node_timeouts_scale_with_the_ttl() {
        assert_eq!(drift(10_000 * MS), 102 * MS);
        assert_eq!(drift(100 * MS), 3 * MS);
        assert_eq!(node_timeout(100 * MS), 50 * MS);
        assert_eq!(node_timeout(3000 * MS), 300 * MS);
        assert_eq!(node_timeout(3600 * 1000 * MS), 1000 * MS);
    }

    #[test]
    fn a_release_counts_a_majority() {
        assert_eq!(released(&tally(2, 1, 0), 2), Ok(true));
        assert_eq!(released(&tally(0, 3, 0), 2), Ok(false));
        assert_eq!(released(&tally(0, 2, 1), 2), Ok(false), "one failure cannot make a majority");
        assert!(released(&tally(1, 1, 1), 2).is_err(), "the failed node may have deleted: unknown");
    }

    #[test]
    fn too_many_failures_cannot_reach_a_majority() {
        assert!(!tally(1, 1, 1).cannot_reach_quorum(2));
        assert!(tally(1, 0, 2).cannot_reach_quorum(2));
        assert!(!tally(0, 1, 0).cannot_reach_quorum(1));
    }

    /// Errors keep their sources: a node that refuses the connection is an
    /// `Error::Connect` whose chain holds the `redis::RedisError`.
    #[tokio::test]
    async fn a_refused_connection_keeps_the_redis_error() {
        let port = crate::backend::refused_port();
        let url = BackendUrl::parse(&format!("redlock://127.0.0.1:{port}")).unwrap();
        let err = RedlockBackend::connect(&url).await.unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
        assert!(crate::error::caused_by::<redis::RedisError>(&err), "{err:?}");
    }

    #[tokio::test]
    async fn join_all_keeps_the_order() {
        let futures = (0..4u64).map(|i| {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(4 - i)).await;
                i
            }) as BoxFuture<'static, u64>
        });
        assert_eq!(join_all(futures).await, vec![0, 1, 2, 3]);
    }
}
