//! The recipe: a try, then the queue until the wait runs out (woken by
//! `NOTIFY` or its own timers), and the guard of a grant; a request that
//! ends without a result is withdrawn (see the [module docs](super)).
//!
//! Where it sits: under [`super::LeaseMode`]'s acquire and campaign; the
//! statements are in [`super::store`], the guard in [`super::held`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::conn::Failed;
use super::held::{lease_guard, Grant};
use super::store::{kind_of, micros, Seen};
use super::{shared, spawn_detached, LeaseMode, Registration, Store, NOT_QUEUED};
use crate::backend::{Guard, Outcome};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::types::LockOptions;

/// What a request is for, which decides what losing its queue entry means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A lock: an entry that expired is made again, at the back.
    Lock,
    /// A campaign: a candidate whose entry expired is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does; its grant
    /// and its release are announced to observers.
    Campaign,
}

impl LeaseMode {
    /// [`acquire`](Self::acquire) for a lock or a campaign (`purpose`).
    pub(super) async fn acquire_as(
        &self,
        name: &str,
        opts: &LockOptions,
        purpose: Purpose,
    ) -> Result<Outcome<Guard>, Error> {
        let owner = format!("{:016x}-{}", self.instance, self.requests.fetch_add(1, Ordering::Relaxed));
        let deadline = crate::clock::now() + opts.wait;
        let registration = self.wakers.register(name);
        let mut withdraw =
            Withdraw { store: self.store.clone(), name: name.to_string(), owner: owner.clone(), armed: true };
        let sent = crate::clock::now();
        match self.store.attempt(name, &owner, opts, NOT_QUEUED).await {
            Ok(Seen { mismatch: Some(kept), .. }) => {
                withdraw.armed = false; // nothing was written
                return Err(shared::mismatch(kept, opts.permits));
            }
            Ok(Seen { granted: Some(token), .. }) => {
                withdraw.armed = false;
                return Ok(Outcome::Acquired(self.granted(name, owner, opts, token, sent, purpose).await));
            }
            Ok(seen) if opts.wait.is_zero() => {
                withdraw.armed = false; // nothing was written
                return Ok(seen.busy());
            }
            Ok(_) => {}
            Err(failed) if failed.transient && !opts.wait.is_zero() => {} // the wait retries
            Err(failed) => return Err(failed.error),
        }
        match self.wait(name, &owner, opts, deadline, &registration, purpose).await? {
            Some((token, sent)) => {
                withdraw.armed = false;
                Ok(Outcome::Acquired(self.granted(name, owner, opts, token, sent, purpose).await))
            }
            None => {
                if self.store.withdraw(name, &owner).await.is_ok() {
                    withdraw.armed = false;
                }
                Ok(Outcome::TimedOut)
            }
        }
    }

    /// Waits in the queue until granted (the token, and the send time of the
    /// statement that granted) or `deadline` (`None`). A failure of the
    /// connection is retried (with backoff) until the deadline, as the request's
    /// owner makes every step safe to repeat: the queue entry is replaced, and a
    /// grant whose answer was lost is granted again. Other failures end the wait,
    /// and so does, for a campaign, the loss of its queue entry.
    async fn wait(
        &self,
        name: &str,
        owner: &str,
        opts: &LockOptions,
        deadline: Instant,
        registration: &Registration,
        purpose: Purpose,
    ) -> Result<Option<(u64, Instant)>, Error> {
        let ttl_us = micros(opts.ttl);
        let mut id = None;
        let mut failures = 0u32;
        let mut races = 0u32;
        loop {
            if crate::clock::now() >= deadline {
                return Ok(None);
            }
            let step = match id {
                None => self.store.enqueue(name, owner, ttl_us, opts).await.map(|queued| {
                    registration.set_id(queued);
                    id = Some(queued);
                    None
                }),
                Some(queued) => self.step(name, owner, opts, queued, &mut races).await,
            };
            let wake = match step {
                Ok(Some(Step::Granted(token, sent))) => return Ok(Some((token, sent))),
                Ok(Some(Step::Requeue)) if purpose == Purpose::Campaign => {
                    return Err(Error::LeaseNotFound(format!(
                        "postgres: the queue entry of a waiting campaign for {name:?} expired (it stalled past its TTL)"
                    )));
                }
                Ok(Some(Step::Requeue)) => {
                    id = None;
                    continue;
                }
                Ok(Some(Step::SleepUntil(wake))) => {
                    failures = 0;
                    wake
                }
                Ok(None) => continue, // enqueued: attempt at once
                Err(failed) if failed.transient && crate::clock::now() < deadline => {
                    failures = failures.saturating_add(1);
                    let error = &failed.error;
                    tracing::debug!(lock = name, failures, %error, "fencelock: postgres: waiting: retrying");
                    crate::clock::now() + Backoff::default().delay(failures - 1, fastrand::f64())
                }
                Err(failed) => return Err(failed.error),
            };
            tokio::select! {
                _ = registration.notified() => {}
                _ = tokio::time::sleep_until(wake.min(deadline)) => {}
            }
        }
    }

    /// One attempt of a queued request (queue id `id`), and what to do next.
    async fn step(
        &self,
        name: &str,
        owner: &str,
        opts: &LockOptions,
        id: i64,
        races: &mut u32,
    ) -> Result<Option<Step>, Failed> {
        let sent = crate::clock::now();
        let seen = self.store.attempt(name, owner, opts, id).await?;
        if let Some(kept) = seen.mismatch {
            return Err(shared::mismatch(kept, opts.permits).into());
        }
        if let Some(token) = seen.granted {
            return Ok(Some(Step::Granted(token, sent)));
        }
        if !seen.queued {
            // Our entry expired (we stalled past the TTL): back of the queue.
            return Ok(Some(Step::Requeue));
        }
        let next = match seen.next_change() {
            Some(Duration::ZERO) => {
                // Free and nobody ahead, yet not granted: another grant or a new
                // row raced this one. Look again soon.
                *races = races.saturating_add(1);
                crate::clock::now() + Backoff::default().delay(*races - 1, fastrand::f64())
            }
            Some(left) => {
                *races = 0;
                crate::clock::now() + left
            }
            None => sent + opts.ttl / 3,
        };
        // Whatever comes first; the entry is refreshed by the next attempt.
        Ok(Some(Step::SleepUntil(next.min(sent + opts.ttl / 3))))
    }

    /// The guard of a grant of `opts` confirmed by a statement sent at `sent`;
    /// a campaign's grant is announced to observers.
    async fn granted(
        &self,
        name: &str,
        owner: String,
        opts: &LockOptions,
        token: u64,
        sent: Instant,
        purpose: Purpose,
    ) -> Guard {
        if kind_of(opts) != "x" {
            // The next waiter may share too.
            self.store.wake(name).await;
            return shared::guard(self.store.clone(), name, owner, opts, token, sent);
        }
        let announced = purpose == Purpose::Campaign;
        let grant = Arc::new(Grant {
            store: self.store.clone(),
            name: name.to_string(),
            owner,
            token,
            ttl: opts.ttl,
            identity: opts.identity.clone(),
            announced,
        });
        let guard = lease_guard(name, token, opts.ttl, sent, grant);
        if announced {
            self.store.announce(name).await;
        }
        guard
    }
}

/// What a waiting request does after one attempt.
enum Step {
    /// Granted this token by a statement sent at that instant.
    Granted(u64, Instant),
    /// Its queue entry had expired: enqueue again.
    Requeue,
    /// Sleep until then, or until notified.
    SleepUntil(Instant),
}

/// Withdraws a request whose acquire ended without a result (dropped, or
/// failed): spawned on drop while armed.
struct Withdraw {
    store: Arc<Store>,
    name: String,
    owner: String,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let store = self.store.clone();
        let (name, owner) = (std::mem::take(&mut self.name), std::mem::take(&mut self.owner));
        spawn_detached(async move {
            if let Err(e) = store.withdraw(&name, &owner).await {
                tracing::debug!(lock = %name, error = %e, "fencelock: postgres: withdrawing a request failed");
            }
        });
    }
}
