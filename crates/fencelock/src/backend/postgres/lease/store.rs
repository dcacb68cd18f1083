//! The statements of the recipe as calls: one grant attempt (and what it
//! saw), enqueue, withdraw, and the notifications that wake the next waiter
//! or the observers; and the conversions between rows and values (among
//! them a request's kind as the waiters table keeps it, [`kind_of`], which
//! the shared locks use too).
//!
//! Where it sits: under [`super::recipe`], on the [`super::Store`] every
//! guard of the mode shares.

use std::time::Duration;

use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::Row;

use super::conn::Failed;
use super::{Store, STATEMENT_TIMEOUT};
use crate::backend::{Guard, Outcome};
use crate::error::Error;
use crate::types::{LockMode, LockOptions};

/// What one grant attempt saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    /// The token, if this attempt was granted.
    pub(super) granted: Option<u64>,
    /// The holder's token, if the lock was held.
    pub(super) holder_token: Option<u64>,
    /// Time left to the holder, by the database's clock.
    pub(super) holder_left: Option<Duration>,
    /// Live waiters ahead of this request.
    pub(super) ahead: u64,
    /// Time until the first of those expires, by the database's clock.
    pub(super) ahead_left: Option<Duration>,
    /// Live waiters of the lock.
    pub(super) waiters: u32,
    /// This request's queue entry is live (refreshed by the attempt).
    pub(super) queued: bool,
    /// The lock keeps another semaphore size (0: not a semaphore); nothing
    /// was done.
    pub(super) mismatch: Option<u32>,
}

impl Seen {
    fn from_row(row: &Row) -> Result<Seen, Error> {
        let left = |i| -> Result<Option<Duration>, Error> {
            let us: Option<i64> = column(row, i)?;
            Ok(us.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
        };
        let ahead: Option<i64> = column(row, 3)?;
        let waiters: Option<i64> = column(row, 5)?;
        Ok(Seen {
            granted: column::<Option<i64>>(row, 0)?.map(to_token).transpose()?,
            holder_token: column::<Option<i64>>(row, 1)?.map(to_token).transpose()?,
            holder_left: left(2)?,
            ahead: ahead.and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
            ahead_left: left(4)?,
            waiters: waiters.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            queued: column(row, 6)?,
            mismatch: column::<Option<i32>>(row, 7)?.map(|n| u32::try_from(n).unwrap_or(0)),
        })
    }

    /// When what blocks this request may change by itself: the first waiter
    /// ahead expiring, or (nobody ahead) the holder expiring (an exclusive
    /// holder, or for shared holders the first or the last of them, as the
    /// attempt reported); zero if nothing blocked it (a race); `None` if
    /// nothing will change without a notification.
    pub(super) fn next_change(&self) -> Option<Duration> {
        if self.ahead > 0 {
            self.ahead_left
        } else if self.holder_token.is_some() || self.holder_left.is_some() {
            self.holder_left
        } else {
            Some(Duration::ZERO)
        }
    }

    /// The outcome of a try that was not granted.
    pub(super) fn busy(&self) -> Outcome<Guard> {
        Outcome::Busy {
            holder_lease: self.holder_token,
            holder_token: self.holder_token,
            reopens_in: None,
            waiters: self.waiters,
        }
    }
}

impl Store {
    /// One grant attempt (module docs); `id` is the request's queue id or
    /// [`NOT_QUEUED`](super::NOT_QUEUED).
    pub(super) async fn attempt(&self, name: &str, owner: &str, opts: &LockOptions, id: i64) -> Result<Seen, Failed> {
        if kind_of(opts) != "x" {
            return self.attempt_shared(name, owner, opts, id).await;
        }
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let (ttl_us, identity, value) = (micros(opts.ttl), opts.identity.as_deref(), opts.value.as_slice());
        let params: [(&(dyn ToSql + Sync), Type); 6] = [
            (&name, Type::TEXT),
            (&owner, Type::TEXT),
            (&ttl_us, Type::INT8),
            (&id, Type::INT8),
            (&identity, Type::TEXT),
            (&value, Type::BYTEA),
        ];
        let rows = self.db.query("grant", &self.sql.attempt, &params, by).await?;
        Ok(Seen::from_row(one(&rows, "grant")?)?)
    }

    /// One attempt of a shared request: `"<table>_share"` (see
    /// `lease/shared.rs`), whose answer has the grant statement's columns.
    async fn attempt_shared(&self, name: &str, owner: &str, opts: &LockOptions, id: i64) -> Result<Seen, Failed> {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let (ttl_us, kind) = (micros(opts.ttl), kind_of(opts));
        let (weight, permits) = (weight_param(opts), permits_param(opts));
        let params: [(&(dyn ToSql + Sync), Type); 7] = [
            (&name, Type::TEXT),
            (&owner, Type::TEXT),
            (&ttl_us, Type::INT8),
            (&id, Type::INT8),
            (&kind, Type::TEXT),
            (&weight, Type::INT4),
            (&permits, Type::INT4),
        ];
        let rows = self.db.query("grant", &self.sql.shared.attempt, &params, by).await?;
        Ok(Seen::from_row(one(&rows, "grant")?)?)
    }

    /// Enqueues the request (dropping any earlier entry of it) with its kind,
    /// weight and permits: its queue id.
    pub(super) async fn enqueue(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        opts: &LockOptions,
    ) -> Result<i64, Failed> {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let (kind, weight, permits) = (kind_of(opts), weight_param(opts), permits_param(opts));
        let params: [(&(dyn ToSql + Sync), Type); 6] = [
            (&name, Type::TEXT),
            (&owner, Type::TEXT),
            (&ttl_us, Type::INT8),
            (&kind, Type::TEXT),
            (&weight, Type::INT4),
            (&permits, Type::INT4),
        ];
        let rows = self.db.query("enqueue", &self.sql.enqueue, &params, by).await?;
        Ok(column(one(&rows, "enqueue")?, 0)?)
    }

    /// Withdraws the request: its queue entry, and a grant it never received;
    /// then wakes the next waiter if the request was first in line or held a
    /// grant.
    pub(super) async fn withdraw(&self, name: &str, owner: &str) -> Result<(), Error> {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&owner, Type::TEXT)];
        let rows = self.db.query("withdraw", &self.sql.withdraw, &params, by).await?;
        if column::<bool>(one(&rows, "withdraw")?, 0)? {
            self.wake(name).await;
        }
        Ok(())
    }

    /// Notifies the oldest live waiter of `name`, if there is one. Run after
    /// the statement that freed the lock (or left the queue) committed: its
    /// snapshot sees every waiter that could have missed that change (see the
    /// module docs). A failure is only logged: the waiter then wakes by its own
    /// timers.
    pub(super) async fn wake(&self, name: &str) {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&self.table.as_str(), Type::TEXT)];
        if let Err(failed) = self.db.query("wake", &self.sql.wake, &params, by).await {
            tracing::debug!(lock = name, error = %failed.error, "fencelock: postgres: waking the next waiter failed");
        }
    }

    /// Tells the observers of `name` that its holder or value changed. Run
    /// after the change committed; a failure is only logged (observers then
    /// see the change at their next read).
    pub(super) async fn announce(&self, name: &str) {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&self.table.as_str(), Type::TEXT)];
        if let Err(failed) = self.db.query("announce", &self.sql.announce, &params, by).await {
            tracing::debug!(lock = name, error = %failed.error, "fencelock: postgres: announcing a change failed");
        }
    }
}

/// `d` in whole microseconds, rounded up (so the database never keeps a lock
/// for less than the client counts on).
pub(super) fn micros(d: Duration) -> i64 {
    let us = d.as_nanos().div_ceil(1000);
    i64::try_from(us).unwrap_or(i64::MAX)
}

/// A request's weight as a statement parameter (1 outside a semaphore).
fn weight_param(opts: &LockOptions) -> i32 {
    i32::try_from(opts.weight.max(1)).unwrap_or(i32::MAX)
}

/// A request's semaphore size as a statement parameter (0: none).
fn permits_param(opts: &LockOptions) -> i32 {
    i32::try_from(opts.permits).unwrap_or(i32::MAX)
}

/// The only row of an answer that always has one.
pub(super) fn one<'r>(rows: &'r [Row], what: &str) -> Result<&'r Row, Error> {
    rows.first().ok_or_else(|| Error::backend("postgres", format!("{what}: no row in the answer")))
}

/// Column `i` of `row`, or [`Error::Backend`] if it is not what the statement
/// returns.
pub(super) fn column<'r, T: FromSql<'r>>(row: &'r Row, i: usize) -> Result<T, Error> {
    row.try_get(i).map_err(|e| Error::backend_caused("postgres", format!("unexpected column {i} in the answer"), e))
}

/// The kind of a request, as the waiters table keeps it: `x` exclusive, `r`
/// a reader, `s` permits of a semaphore.
pub(super) fn kind_of(opts: &LockOptions) -> &'static str {
    if opts.permits > 0 {
        "s"
    } else if opts.mode == LockMode::Shared {
        "r"
    } else {
        "x"
    }
}

/// A token from the sequence (bigint, starts at 1).
pub(super) fn to_token(t: i64) -> Result<u64, Error> {
    u64::try_from(t).map_err(|_| Error::backend("postgres", format!("negative token {t} in the lock table")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> Seen {
        Seen {
            granted: None,
            holder_token: None,
            holder_left: None,
            ahead: 0,
            ahead_left: None,
            waiters: 0,
            queued: true,
            mismatch: None,
        }
    }

    #[test]
    fn a_waiter_wakes_when_what_blocks_it_can_change() {
        let ms = Duration::from_millis;
        let held = Seen { holder_token: Some(4), holder_left: Some(ms(300)), ..seen() };
        assert_eq!(held.next_change(), Some(ms(300)), "nobody ahead: the holder's expiry");
        let behind = Seen { ahead: 2, ahead_left: Some(ms(900)), ..held.clone() };
        assert_eq!(behind.next_change(), Some(ms(900)), "waiters ahead: the first of their expiries");
        assert_eq!(seen().next_change(), Some(Duration::ZERO), "free and not granted: a race, look again");
        let shared = Seen { holder_left: Some(ms(700)), ..seen() };
        assert_eq!(shared.next_change(), Some(ms(700)), "shared holders: when they may have expired");
    }

    #[test]
    fn a_busy_try_reports_the_holder_and_the_queue() {
        let held = Seen { holder_token: Some(4), holder_left: Some(Duration::from_secs(1)), waiters: 3, ..seen() };
        let got = held.busy();
        assert!(matches!(
            got,
            Outcome::Busy { holder_lease: Some(4), holder_token: Some(4), reopens_in: None, waiters: 3 }
        ));
    }

    #[test]
    fn ttls_round_up_to_the_microsecond() {
        assert_eq!(micros(Duration::from_millis(100)), 100_000);
        assert_eq!(micros(Duration::from_nanos(100_000_001)), 100_001);
        assert_eq!(micros(Duration::from_secs(3600)), 3_600_000_000);
    }
}
