//! Taking a native lock: `Client::acquire_guard` and the `Acquire` RPC with
//! its retries.
//!
//! Where it sits: the native [`crate::LockBackend::acquire`] calls
//! `acquire_guard`, which checks out the client's shared lease for the
//! TTL ([`crate::backend::native::registry`]), then sends one `Acquire` RPC that waits on the
//! server's FIFO queue (no polling) and wraps the grant in a [`LockGuard`].
//! [`crate::Client::acquire_detached`] uses the same RPC on a lease of its own.
//!
//! Retries: one logical acquire keeps its request id across transport retries,
//! so the server answers a retry with the first outcome. Two cases start over:
//! the lease ended on the server while the request waited (a fresh lease, same
//! deadline), and a retry answered with a grant the server had meanwhile
//! released (a new request id). A grant that arrives after the client lost its
//! lease is never handed out: the lease is revoked (ending the grant with it)
//! and the acquire starts over on a fresh lease.
//!
//! A multi-lock (`Client::acquire_all_guards`) is the same request naming
//! several locks: one RPC, one request id, one lease, one grant per lock (each
//! its own guard on the shared lease), all or none.

use std::time::Duration;

use fencelock_proto::v1 as pb;
use tokio::time::Instant;

use super::lease_rpc;
use super::Client;
use crate::backend::native::guard::LockGuard;
use crate::backend::native::proto::{acquire_all_of, single};
use crate::backend::native::registry::LeaseHandle;
use crate::backend::native::rpc::Rpc;
use crate::backend::native::wire::new_request_id;
use crate::backend::Outcome;
use crate::error::Error;
use crate::lease::LeaseLost;
use crate::metrics;
use crate::types::{to_ms, Grant, LockOptions};

/// How many times one acquire may start over on a fresh lease or request id (after
/// its lease was lost while it waited, or a retried grant turned out stale).
const ACQUIRE_TRIES: u32 = 3;

impl Client {
    /// Takes the lock `name` with `opts`. One RPC waits on the server's queue
    /// until the grant or the end of the wait (no polling); the deadline of the
    /// whole call is the wait plus the RPC timeout, retries included. The first
    /// acquire with a TTL also grants the client's lease for that TTL.
    ///
    /// Dropping the future cancels the request: the server removes it from the
    /// queue and releases a grant that could not be delivered. If the lease is
    /// lost while the request waits, it starts over on a fresh lease within the
    /// same deadline (losing its place in the queue).
    pub(crate) async fn acquire_guard(&self, name: &str, opts: &LockOptions) -> Result<Outcome<LockGuard>, Error> {
        let start = crate::clock::now();
        let result = run(self, &[name], opts, start, OnLoss::StartOver).await.and_then(single);
        record(&result, start);
        result
    }

    /// Takes every lock of `names` at once, as [`Client::acquire_guard`] takes
    /// one: the server grants all of them in one log entry or none, and a
    /// waiting request queues on every lock at once. One guard per lock, in
    /// the order named.
    pub(crate) async fn acquire_all_guards(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Outcome<Vec<LockGuard>>, Error> {
        let start = crate::clock::now();
        let result = run(self, names, opts, start, OnLoss::StartOver).await;
        record(&result, start);
        result
    }

    /// An election's campaign: [`Client::acquire_guard`], except that a lease
    /// lost while the candidate waits (the server dropped it, or this client
    /// could not renew it by its deadline) ends the campaign at once with
    /// [`Error::LeaseNotFound`] instead of starting over: a candidate whose
    /// lease ended is never elected on it, and is told so now.
    pub(crate) async fn campaign_guard(&self, name: &str, opts: &LockOptions) -> Result<Outcome<LockGuard>, Error> {
        let start = crate::clock::now();
        let result = run(self, &[name], opts, start, OnLoss::Fail).await.and_then(single);
        record(&result, start);
        result
    }
}

/// What an acquire does when its lease is lost while it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnLoss {
    /// Start over on a fresh lease (a lock acquire).
    StartOver,
    /// Fail at once (a campaign).
    Fail,
}

/// A multi-lock by the engine's rules (2 to 16 distinct names, read-write
/// locks only), checked before anything is sent (by this module and by
/// [`crate::Session::acquire_all`]).
pub(crate) fn check_multi(names: &[&str], opts: &LockOptions) -> Result<(), Error> {
    let acquire = fencelock_core::Acquire {
        req: fencelock_core::RequestId(1),
        lease: fencelock_core::LeaseId(1),
        lock: names.first().map_or(String::new(), |n| n.to_string()),
        wait_ms: 0,
        lock_delay_ms: 0,
        identity: String::new(),
        value: Vec::new(),
        mode: fencelock_core::Mode::Exclusive,
        weight: opts.weight,
        permits: opts.permits,
        hold_at_least_ms: 0,
        once_per: opts.once_per.clone(),
        also: names.iter().skip(1).map(|n| n.to_string()).collect(),
    };
    match names.len() {
        0 | 1 => Err(Error::InvalidArgument(format!("a multi-lock names 2 to 16 locks, not {}", names.len()))),
        _ => acquire.validate().map_err(|e| Error::InvalidArgument(e.to_string())),
    }
}

/// The one check of an acquire's request, by the rules every backend shares
/// (`Capabilities::admit`), for a guard's acquire and a detached one alike:
/// bad input is refused before a lease is checked out or granted for it.
fn admit(client: &Client, names: &[&str], opts: &LockOptions) -> Result<(), Error> {
    for name in names {
        crate::LockBackend::capabilities(client).admit("fencelock", name, opts)?;
    }
    if names.len() != 1 {
        check_multi(names, opts)?;
    }
    Ok(())
}

async fn run(
    client: &Client,
    names: &[&str],
    opts: &LockOptions,
    start: Instant,
    on_loss: OnLoss,
) -> Result<Outcome<Vec<LockGuard>>, Error> {
    admit(client, names, opts)?;
    let name = names[0];
    let inner = &client.inner;
    let deadline = start + opts.wait + inner.rpc.rpc_timeout;
    let mut tries = 0;
    loop {
        tries += 1;
        let lease = inner.leases.check_out(opts.ttl, deadline).await?;
        let lease_id = lease.cell().id;
        let on_lease = client.acquire_on_lease(names, lease_id, opts, start, deadline);
        let on_lease = match on_loss {
            OnLoss::StartOver => on_lease.await?,
            OnLoss::Fail => {
                let watch = crate::lease::LeaseWatch::new(lease.cell().clone());
                tokio::select! {
                    answer = on_lease => answer?,
                    // Dropping the request withdraws it on the server.
                    reason = watch.lost() => return Err(lost_while_waiting(lease_id, name, reason)),
                }
            }
        };
        let outcome = match on_lease {
            OnLease::Answered(outcome) => outcome,
            OnLease::LeaseGone => {
                // The lease ended (on the server) while the request waited.
                lease.cell().lose(LeaseLost::NotFound);
                if on_loss == OnLoss::Fail {
                    return Err(lost_while_waiting(lease_id, name, LeaseLost::NotFound));
                }
                if tries < ACQUIRE_TRIES {
                    continue;
                }
                return Err(lease_kept_ending(lease_id));
            }
        };
        let grants = match outcome {
            Outcome::Acquired(grants) => grants,
            // Busy or timed out: no grant to wrap.
            other => return Ok(other.map(|_| unreachable!())),
        };
        if lease.cell().is_lost() {
            // The lease was lost while the grant travelled: the client cannot
            // prove it holds the lock. The grant ends with its lease, as every
            // grant of a lost lease does (the watchdog's revoke may not have
            // reached the server: revoke it here, before starting over), so the
            // server counts it as ended with its lease, not as a release that
            // a caller asked for.
            tracing::debug!(lock = %name, token = grants[0].token, "fencelock: a grant arrived on a lost lease");
            match lease_rpc::revoke(&inner.rpc, lease_id).await {
                Ok(()) | Err(Error::LeaseNotFound(_)) => {}
                Err(e) => tracing::debug!(lease = lease_id, error = %e, "fencelock: revoke of a lost lease failed"),
            }
            if on_loss == OnLoss::Fail {
                let reason = lease.cell().state().lost.unwrap_or(LeaseLost::Expired);
                return Err(lost_while_waiting(lease_id, name, reason));
            }
            if tries < ACQUIRE_TRIES {
                continue;
            }
            return Err(lease_kept_ending(lease_id));
        }
        return Ok(Outcome::Acquired(guards(client, grants, lease)));
    }
}

/// One guard per grant, each one user of the shared `lease`.
fn guards(client: &Client, grants: Vec<Grant>, lease: LeaseHandle) -> Vec<LockGuard> {
    let mut handles: Vec<LeaseHandle> = (1..grants.len()).map(|_| lease.another()).collect();
    handles.insert(0, lease);
    grants.into_iter().zip(handles).map(|(g, h)| LockGuard::new(client.clone(), g, h)).collect()
}

/// The error of an acquire whose lease ended under it [`ACQUIRE_TRIES`] times:
/// the server kept dropping leases (a fail-over, a revoking operator); the
/// outcome is known (nothing is held), and a later try may succeed.
fn lease_kept_ending(lease_id: u64) -> Error {
    Error::Unavailable(format!("lease {lease_id} ended while acquiring, {ACQUIRE_TRIES} times in a row"))
}

/// The error of a campaign whose lease was lost while it waited.
fn lost_while_waiting(lease_id: u64, name: &str, reason: LeaseLost) -> Error {
    Error::LeaseNotFound(format!("lease {lease_id} was lost while campaigning for {name:?}: {reason}"))
}

/// An acquire's outcome (one grant per lock asked), and whether it took more
/// than one attempt.
struct Granted {
    outcome: Outcome<Vec<Grant>>,
    retried: bool,
}

/// What one acquire on a lease found: the server's answer, or that the lease
/// itself is gone (the server's "lease not found", as an outcome).
enum OnLease {
    Answered(Outcome<Vec<Grant>>),
    LeaseGone,
}

/// One logical `Acquire` RPC on `lease_id` (one request id), retried until
/// `deadline`. Each attempt asks to wait only for what is left of the wait.
async fn acquire_once(
    rpc: &Rpc,
    names: &[&str],
    lease_id: u64,
    (opts, identity): (&LockOptions, &str),
    start: Instant,
    deadline: Instant,
) -> Result<Granted, Error> {
    let wait_end = start + opts.wait;
    let request_id = new_request_id();
    let mut attempts = 0u32;
    let resp = rpc
        .send("acquire", deadline, || {
            attempts += 1;
            pb::AcquireRequest {
                request_id,
                lease_id,
                lock: names[0].to_string(),
                wait_ms: wait_left(opts.wait, wait_end, crate::clock::now()),
                lock_delay_ms: to_ms(opts.lock_delay),
                identity: identity.to_string(),
                value: opts.value.clone(),
                mode: crate::types::mode_to_proto(opts.mode),
                permits: opts.permits,
                weight: opts.weight,
                hold_at_least_ms: to_ms(opts.hold_at_least),
                once_per: opts.once_per.clone(),
                also: names[1..].iter().map(|n| n.to_string()).collect(),
                attempt: attempts,
            }
        })
        .await?;
    let outcome = acquire_all_of(resp, names)?;
    Ok(Granted { outcome, retried: attempts > 1 })
}

/// The `wait_ms` of an attempt at `now`: what is left of the wait, but at least
/// 1 ms if there was a wait at all (0 would turn a wait into a try, and answer
/// busy instead of timed out).
fn wait_left(wait: Duration, wait_end: Instant, now: Instant) -> u64 {
    if wait.is_zero() {
        0
    } else {
        to_ms(wait_end.saturating_duration_since(now)).max(1)
    }
}

pub(crate) fn record<G>(result: &Result<Outcome<G>, Error>, start: Instant) {
    let label = match result {
        Ok(outcome) => outcome.label(),
        Err(_) => "error",
    };
    metrics::acquire(label, start.elapsed());
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Client {
    /// One acquire of `names` (one lock, or a multi-lock) on a lease of its
    /// own, not renewed after the grant; see [`Client::acquire_detached`].
    pub(crate) async fn detached(
        &self,
        names: &[&str],
        opts: &LockOptions,
        start: Instant,
    ) -> Result<Outcome<Vec<Grant>>, Error> {
        admit(self, names, opts)?;
        let rpc = &self.inner.rpc;
        let deadline = start + opts.wait + rpc.rpc_timeout;
        let (cell, sent) = lease_rpc::grant(rpc, opts.ttl, deadline).await?;
        let watchdog = AbortOnDrop(lease_rpc::spawn_watchdog(rpc.clone(), cell.clone(), sent));
        let outcome = match self.acquire_on_lease(names, cell.id, opts, start, deadline).await {
            Ok(OnLease::Answered(outcome)) => Ok(outcome),
            Ok(OnLease::LeaseGone) => Err(Error::LeaseNotFound(format!("lease {} ended while acquiring", cell.id))),
            Err(e) => Err(e),
        };
        drop(watchdog);
        if !matches!(outcome, Ok(Outcome::Acquired(_))) {
            if let Err(e) = lease_rpc::revoke(rpc, cell.id).await {
                tracing::debug!(lease = cell.id, error = %e, "fencelock: revoke of unused lease failed");
            }
        }
        outcome
    }

    /// One acquire on `lease_id`. If a retried request was answered with a grant
    /// that is no longer current (the server released it because the first
    /// attempt's caller had gone away, then answered the retry with the first
    /// outcome), it asks again with a new request id.
    async fn acquire_on_lease(
        &self,
        names: &[&str],
        lease_id: u64,
        opts: &LockOptions,
        start: Instant,
        deadline: Instant,
    ) -> Result<OnLease, Error> {
        // The request's own identity, else the client's.
        let identity = opts.identity.as_deref().or(self.inner.identity.as_deref()).unwrap_or("");
        for _ in 0..ACQUIRE_TRIES {
            let Granted { outcome, retried } =
                match acquire_once(&self.inner.rpc, names, lease_id, (opts, identity), start, deadline).await {
                    Ok(granted) => granted,
                    Err(Error::LeaseNotFound(_)) => return Ok(OnLease::LeaseGone),
                    Err(e) => return Err(e),
                };
            match outcome {
                Outcome::Acquired(grants) if retried && !self.all_current(&grants).await? => {
                    tracing::debug!(lock = names[0], "fencelock: a retry returned a stale grant");
                }
                outcome => return Ok(OnLease::Answered(outcome)),
            }
        }
        Err(Error::Unavailable(format!("grants of {names:?} kept being lost in transit")))
    }

    /// Whether every grant of `grants` is current (a retry's answer: a
    /// multi-lock's grants may have been released since, one by one).
    async fn all_current(&self, grants: &[Grant]) -> Result<bool, Error> {
        for g in grants {
            if !self.check(&g.lock, g.token).await?.current {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn wait_left_shrinks_but_never_turns_into_a_try() {
        let t0 = crate::clock::now();
        assert_eq!(wait_left(Duration::ZERO, t0, t0), 0);
        assert_eq!(wait_left(5000 * MS, t0 + 5000 * MS, t0), 5000);
        assert_eq!(wait_left(5000 * MS, t0 + 5000 * MS, t0 + 1200 * MS), 3800);
        assert_eq!(wait_left(5000 * MS, t0 + 5000 * MS, t0 + 9000 * MS), 1);
    }
}
