//! The Redlock backend: a lock held on a majority of N independent Redis
//! servers (`redlock://h1:p1,h2:p2,h3:p3[/db][?prefix=fencelock]`), after the
//! algorithm described in the Redis documentation ("Distributed Locks with
//! Redis"). No fencing token.
//!
//! Where it sits: [`super::connect`] builds a [`RedlockBackend`] for a
//! `redlock://` URL. It reuses the Redis backend's connection handling
//! (`Conn` in [`super::redis`], one connection per node, made again after it
//! breaks) and its `renew.lua`; `unlock.lua` is the compare-and-delete.
//! Laid out by concern: `nodes` (a round on every node, counted to a
//! majority), `held` (the guard: renewal and release); the URL's parameters
//! are the Redis backend's (`prefix=`, TLS).
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

mod held;
mod nodes;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::redis::{check_params, prefix, Conn, Ticket};
use super::tls::TlsFiles;
use super::{BackendUrl, BoxFuture, Capabilities, Fencing, Guard, LockBackend};
use crate::backend::Outcome;
use crate::error::Error;
use crate::types::LockOptions;
use nodes::{join_all, Nodes, Undo};

/// Retry delay of a waiting acquire: uniform in this range.
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(100);

/// Locks on a majority of independent Redis nodes. See the
/// [module docs](self) for the recipe and what it does not guarantee.
pub struct RedlockBackend {
    nodes: Arc<Nodes>,
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

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>> {
        Box::pin(async move {
            self.capabilities().admit(self.kind(), name, opts)?;
            let key = self.nodes.key(name);
            let end = crate::clock::now() + opts.wait;
            loop {
                let ticket = Ticket::new();
                // Dropped while the SETs are out, it deletes what they set.
                let mut undo = Undo {
                    nodes: Some(self.nodes.clone()),
                    key: key.clone(),
                    owner: ticket.text.clone(),
                    timeout: node_timeout(opts.ttl),
                };
                let sent = crate::clock::now();
                let tally = self.nodes.set_all(&key, &ticket.text, opts.ttl).await;
                if tally.yes >= self.nodes.quorum() && sent.elapsed() + drift(opts.ttl) < opts.ttl {
                    undo.disarm();
                    return Ok(Outcome::Acquired(self.grant(name, key, &ticket, opts.ttl, sent)));
                }
                undo.now().await;
                let failure = tally.cannot_reach_quorum(self.nodes.quorum()).then(|| self.nodes.failure(&tally));
                if opts.wait.is_zero() {
                    let busy = Outcome::Busy { holder_lease: None, holder_token: None, reopens_in: None, waiters: 0 };
                    return failure.map_or(Ok(busy), Err);
                }
                let now = crate::clock::now();
                if now >= end {
                    return failure.map_or(Ok(Outcome::TimedOut), Err);
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn drift_and_node_timeouts_scale_with_the_ttl() {
        assert_eq!(drift(10_000 * MS), 102 * MS);
        assert_eq!(drift(100 * MS), 3 * MS);
        assert_eq!(node_timeout(100 * MS), 50 * MS);
        assert_eq!(node_timeout(3000 * MS), 300 * MS);
        assert_eq!(node_timeout(3600 * 1000 * MS), 1000 * MS);
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
}
