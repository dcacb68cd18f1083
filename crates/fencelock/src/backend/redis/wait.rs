//! Waiting in line: a waiter blocks (`BLPOP`) on its wake list, on a
//! connection of its own, until woken, until its waiter key needs a refresh,
//! or until the holder's lock would expire; a failed round is retried with
//! backoff while the wait lasts (a waiter that gives up is withdrawn by the
//! acquire, in [`super::recipe`]).
//!
//! Where it sits: under [`super::recipe`]'s acquire, when `wait` is not zero.

use std::sync::PoisonError;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::time::Instant;

use super::conn::breaks;
use super::keys::{mismatch, Ticket};
use super::recipe::{Attempt, Purpose, Req};
use super::{RedisBackend, Shared};
use crate::backend::{Guard, Outcome};
use crate::backoff::Backoff;
use crate::error::Error;

/// How long past its own timeout a `BLPOP` may stay unanswered before its
/// connection is given up.
const BLOCK_GRACE: Duration = Duration::from_secs(1);

/// Idle connections for `BLPOP` kept for the next waiter.
const MAX_IDLE_BLOCKING: usize = 8;

impl RedisBackend {
    /// Waits in the queue until granted or until `opts.wait` has passed (then
    /// `TimedOut`, with the ticket still queued: the caller withdraws it).
    /// A failure of the server (a restart, a lost connection) is retried with
    /// backoff while the wait lasts; the last one is returned if it outlasts
    /// the wait.
    pub(super) async fn wait_in_line(&self, req: &Req<'_>) -> Result<Outcome<Guard>, Error> {
        let end = crate::clock::now() + req.opts.wait;
        let mut failures = 0;
        let mut queued = false;
        loop {
            match self.wait_once(req, end, &mut queued).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) => failures = 0,
                Err(e @ Error::LeaseNotFound(_)) => return Err(e),
                Err(e) => {
                    let retry_at = crate::clock::now() + Backoff::default().delay(failures, fastrand::f64());
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
    async fn wait_once(&self, req: &Req<'_>, end: Instant, queued: &mut bool) -> Result<Option<Outcome<Guard>>, Error> {
        let sent = crate::clock::now();
        let queued_before = *queued && req.purpose == Purpose::Campaign;
        let (pttl, first) = match self.attempt(req, true, queued_before).await? {
            Attempt::Granted { token } => {
                return Ok(Some(Outcome::Acquired(self.grant(req, token, sent))));
            }
            Attempt::Refused { pttl, first, .. } => (pttl, first),
            Attempt::Dropped => return Err(req.lost()),
            Attempt::Mismatch { kept } => return Err(mismatch(kept, req.opts.permits)),
        };
        *queued = true;
        let now = crate::clock::now();
        if now >= end {
            return Ok(Some(Outcome::TimedOut));
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

impl Shared {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_in_line_wakes_at_the_holders_expiry() {
        let s = Duration::from_secs(1);
        assert_eq!(nap_length(10 * s, 30 * s, false, Some(s)), 10 * s, "not first: the refresh or the wait");
        assert_eq!(nap_length(10 * s, 3 * s, false, None), s, "a third of the TTL");
        assert_eq!(nap_length(10 * s, 30 * s, true, Some(s)), s + Duration::from_millis(1));
        assert_eq!(nap_length(s / 2, 30 * s, true, Some(s)), s / 2, "never past the wait");
    }
}
