//! Read-write locks and semaphores on Redis: shared grants in the exclusive
//! lock's own FIFO queue.
//!
//! Where it sits: under [`super::RedisBackend`]. `acquire.lua` admits every
//! kind of request (its header states the rules); this module is the guard
//! of a shared grant: its renewal (`renew_shared.lua`) and release
//! (`release_shared.lua`).
//!
//! # The recipe
//! Redisson's `RReadWriteLock` keeps readers in a hash with a TTL per holder,
//! and `RPermitExpirableSemaphore` keeps permits in a sorted set scored by
//! expiry; both let a new request barge past the waiters. Here both are one
//! sorted set `{p}:holders:{name}` of the shared holders' tickets, scored by
//! their expiry on the server's clock (`TIME`) and purged by every script
//! that reads it, with their tokens in the hash `{p}:tokens:{name}`, and the
//! waiters of every kind are the exclusive lock's queue `{p}:queue:{name}`. A
//! ticket says its kind: 32 hex digits for an exclusive request (the writer),
//! then `r` for a reader, `s{k}` for k permits.
//!
//! * A reader is admitted when no exclusive holder holds and no live waiter
//!   of another kind is ahead of it (a try: none queued at all); a writer
//!   when nobody holds and it is first in line. So a queued writer blocks the
//!   readers that come after it (strict FIFO across modes), and a reader
//!   never waits for a reader. A shared grant wakes the next waiter, which
//!   may share too.
//! * A semaphore's N is kept in `{p}:permits:{name}`, set by the first
//!   acquire and kept while the semaphore has holders or waiters (until their
//!   TTLs run out); another N is refused ([`Error::InvalidArgument`] naming
//!   both), and so is an exclusive or shared acquire of a semaphore's name. A
//!   request for k permits is admitted, whole, when it is first in line and
//!   the weights held plus k are at most N: no smaller request overtakes it.
//! * Every grant `INCR`s the backend's token counter, so a writer's token is
//!   above every reader's granted before it, and tokens are global.
//! * The first waiter naps until the first shared holder would expire, as it
//!   does for an exclusive holder: a crashed reader blocks a writer for at
//!   most its TTL.
//!
//! # Not guaranteed
//! * No downgrade ([`crate::Guard::downgrade`] fails with
//!   [`Error::Unsupported`]): release and acquire shared instead.
//! * A shared grant has no holder key, so `leader` and the election channel
//!   show exclusive grants only, and `set_value` is refused.
//! * Expiry of a shared holder is decided by the server's wall clock (`TIME`),
//!   like `PX`.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use tokio::time::Instant;

use super::{millis, with_queue, RedisBackend, Req, Retry, Shared, OP_TIMEOUT};
use crate::backend::{BoxFuture, Guard, Held, KeptLease, Renew, Renewed};
use crate::error::Error;

static RELEASE_SHARED: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("release_shared.lua")));
static RENEW_SHARED: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("renew_shared.lua")));

impl RedisBackend {
    /// The guard of a shared grant made by a request sent at `sent`.
    pub(super) fn grant_shared(&self, req: &Req<'_>, token: u64, sent: Instant) -> Guard {
        let grant = SharedGrant {
            shared: self.shared.clone(),
            name: req.name.to_string(),
            ticket: req.ticket.text.clone(),
            ttl: req.opts.ttl,
        };
        let kept = KeptLease::start(req.ticket.id, req.opts.ttl, sent, Arc::new(grant.clone()));
        let watch = kept.watch();
        Guard::new(req.name.to_string(), Some(token), "redis", watch, Box::new(SharedHeld { kept, grant }))
    }
}

/// One shared grant: whose ticket, of which lock.
#[derive(Clone)]
struct SharedGrant {
    shared: Arc<Shared>,
    name: String,
    ticket: String,
    ttl: Duration,
}

impl SharedGrant {
    /// `release_shared.lua`: `Ok(true)` iff this call released the grant.
    /// Not retried: a lost answer leaves the outcome unknown (an error).
    async fn release(&self) -> Result<bool, Error> {
        let keys = &self.shared.keys;
        let name = &self.name;
        let (lock, queue, holders) = (keys.lock(name), keys.queue(name), keys.holders(name));
        let (tokens, permits) = (keys.tokens(name), keys.permits(name));
        let (prefix, ticket) = (&keys.prefix, &self.ticket);
        let deadline = crate::clock::now() + OP_TIMEOUT;
        let n: i64 = self
            .shared
            .conn
            .run(deadline, Retry::Never, |mut c| {
                let (lock, queue, holders, tokens, permits) = (&lock, &queue, &holders, &tokens, &permits);
                async move {
                    let mut call = RELEASE_SHARED.prepare_invoke();
                    call.key(lock).key(queue).key(holders).key(tokens).key(permits).arg(prefix).arg(ticket);
                    call.invoke_async(&mut c).await
                }
            })
            .await?;
        Ok(n == 1)
    }
}

impl Renew for SharedGrant {
    /// `renew_shared.lua`: the ticket's expiry moves to now + TTL if it
    /// still holds.
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let keys = &self.shared.keys;
            let (holders, tokens, permits) =
                (keys.holders(&self.name), keys.tokens(&self.name), keys.permits(&self.name));
            let (prefix, ticket, ttl_ms) = (&keys.prefix, &self.ticket, millis(self.ttl));
            let n: i64 = self
                .shared
                .conn
                .run(round_end, Retry::Once, |mut c| {
                    let (holders, tokens, permits) = (&holders, &tokens, &permits);
                    async move {
                        let mut call = RENEW_SHARED.prepare_invoke();
                        call.key(holders).key(tokens).key(permits).arg(prefix).arg(ticket).arg(ttl_ms);
                        call.invoke_async(&mut c).await
                    }
                })
                .await?;
            Ok(if n == 1 { Renewed::Confirmed(Some(self.ttl)) } else { Renewed::Gone })
        })
    }
}

/// A held shared grant: keeps its lease alive while it lives.
struct SharedHeld {
    kept: KeptLease,
    grant: SharedGrant,
}

impl Held for SharedHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let SharedHeld { kept, grant } = *self;
            drop(kept); // stop renewing first
            grant.release().await
        })
    }

    fn release_in_background(self: Box<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = self.release().await;
            });
        }
    }

    fn set_value(&self, _value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async {
            Err(Error::Unsupported("redis keeps no value for a shared grant (a reader's or a permit)".into()))
        }))
    }

    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async { Ok(false) }))
    }
}
