//! Leader election on the lease table: the leader is the lock's live holder,
//! its term the grant's token, its identity and value the holders row of
//! that token.
//!
//! Where it sits: under [`super::LeaseMode`]'s `leader` and `observe` (the
//! campaign is `LeaseMode::campaign`); the rule that terms never go back is
//! [`crate::backend::election`]'s.
//!
//! Observing: the observer registers with the backend's listener (as a
//! waiter without a queue id, so every notification for the lock wakes it)
//! before it reads the leader, so no change after the read is missed while
//! the listening connection lasts. A campaign's grant and release and every
//! new value are announced (`pg_notify(<table>, '0:<name>')`) after they
//! committed; a waiter's wake-up (after a release) wakes it too. An expiry
//! announces nothing, and neither does a plain lock of the same name, so the
//! observer also reads the leader when the leader's lock would expire, and
//! at least every [`REREAD`] (which also covers notifications lost while the
//! listening connection was down). A change announced while the observer
//! reads is read once more; of values set faster than it reads, it may show
//! only the last.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::{column, to_token, Failed, LeaseMode, Registration, Store, STATEMENT_TIMEOUT};
use crate::backend::{check_name, leader_stream, Leader, LeaderSink, LeaderStream};
use crate::backoff::Backoff;
use crate::error::Error;

/// The longest an observer goes without reading the leader.
const REREAD: Duration = Duration::from_secs(1);

/// A leader as read, with the time its lock has left.
type Read = Option<(Leader, Duration)>;

impl LeaseMode {
    /// The leader of the election `name`: the live holder, with its holders row.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>, Error> {
        check_name(name)?;
        Ok(self.store.leader(name).await?.map(|(leader, _)| leader))
    }

    /// The changes of the election `name` from now on, the current leader
    /// first. The first read happens here, so that its failure is this call's.
    pub async fn observe(&self, name: &str) -> Result<LeaderStream, Error> {
        check_name(name)?;
        let registration = self.wakers.register(name);
        let first = self.store.leader(name).await?;
        let follower = Follower { store: self.store.clone(), name: name.to_string(), registration };
        Ok(leader_stream(move |sink| follower.run(first, sink)))
    }
}

impl Store {
    /// The leader of `name` and the time its lock has left, by the
    /// database's clock.
    async fn leader(&self, name: &str) -> Result<Read, Failed> {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&name, Type::TEXT)];
        let rows = self.db.query("leader", &self.sql.leader, &params, by).await?;
        rows.first().map(|row| leader_of(name, row)).transpose().map_err(Failed::from)
    }
}

/// The leader a row of the leader statement shows: without a holders row of
/// its token, no identity and an empty value.
fn leader_of(name: &str, row: &Row) -> Result<(Leader, Duration), Error> {
    let term = to_token(column(row, 0)?)?;
    let identity: Option<String> = column(row, 1)?;
    let value: Option<Vec<u8>> = column(row, 2)?;
    let left_us: i64 = column(row, 3)?;
    let left = Duration::from_micros(u64::try_from(left_us).unwrap_or(0));
    Ok((Leader { name: name.to_string(), term, value: value.unwrap_or_default(), identity }, left))
}

/// One observer: its registration with the listener, and reads of the leader.
struct Follower {
    store: Arc<Store>,
    name: String,
    registration: Registration,
}

impl Follower {
    /// Shows `first`, then the leader after every notification or timer,
    /// until the reader is gone or a read fails for good.
    async fn run(self, first: Read, mut sink: LeaderSink) {
        let mut next_read = reread_after(&first);
        if !sink.show(first.map(|(leader, _)| leader)).await {
            return;
        }
        let backoff = Backoff::default();
        let mut failures = 0u32;
        loop {
            tokio::select! {
                () = self.registration.notified() => {}
                () = tokio::time::sleep_until(next_read) => {}
            }
            match self.store.leader(&self.name).await {
                Ok(read) => {
                    failures = 0;
                    next_read = reread_after(&read);
                    if !sink.show(read.map(|(leader, _)| leader)).await {
                        return;
                    }
                }
                Err(failed) if failed.transient => {
                    tracing::debug!(lock = %self.name, error = %failed.error, "fencelock: postgres: election read failed; retrying");
                    next_read = crate::clock::now() + backoff.delay(failures, fastrand::f64());
                    failures = failures.saturating_add(1);
                }
                Err(failed) => return sink.fail(failed.error).await,
            }
        }
    }
}

/// When to read again after `read`: just after the leader's lock would
/// expire, and within [`REREAD`].
fn reread_after(read: &Read) -> Instant {
    let wait = match read {
        Some((_, left)) => (*left + Duration::from_millis(1)).min(REREAD),
        None => REREAD,
    };
    crate::clock::now() + wait
}
