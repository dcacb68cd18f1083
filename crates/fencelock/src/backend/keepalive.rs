//! `KeptLease`: the lease state and watchdog that every backend other than the
//! native server uses for its grants.
//!
//! Where it sits: a backend confirms a grant (or a session) by a request it sent
//! at `sent`, then starts a `KeptLease` with a `Renew` that extends it once.
//! The watchdog (the same loop as the native client's, [`crate::lease`]) renews
//! every TTL/3 ± 10 %, retries failures with backoff until the deadline, and
//! the [`LeaseWatch`] it hands out fires `lost()` on a reported loss or at the
//! deadline. The deadline counts from the send time of the last confirmed
//! request, so it is never later than the backend's own expiry (clock drift
//! aside; Redlock subtracts a drift allowance as well).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::BoxFuture;
use crate::backoff::Backoff;
use crate::error::Error;
pub(crate) use crate::lease::Renewed;
use crate::lease::{renew_loop, LeaseCell, LeaseLost, LeaseWatch};

/// The longest one renewal round may take (further bounded by TTL/3).
const ROUND_TIMEOUT: Duration = Duration::from_secs(10);

/// One renewal of a backend's lease.
pub(crate) trait Renew: Send + Sync + 'static {
    /// Extends the lease once, finishing by `round_end`. An error is retried
    /// (with backoff) until the lease's deadline.
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>>;
}

/// A lease kept alive by a watchdog task until this value is dropped (which
/// stops the watchdog and marks the lease [`LeaseLost::Closed`] for every
/// [`LeaseWatch`] still around).
#[derive(Debug)]
pub(crate) struct KeptLease {
    cell: Arc<LeaseCell>,
    task: JoinHandle<()>,
}

impl KeptLease {
    /// Starts keeping lease `id`, confirmed with `ttl` by a request sent at
    /// `sent`: the deadline is `sent + ttl`, and the first renewal goes out about
    /// TTL/3 after `sent`. Must be called within a tokio runtime.
    pub(crate) fn start(id: u64, ttl: Duration, sent: Instant, renew: Arc<dyn Renew>) -> KeptLease {
        let cell = LeaseCell::new(id, ttl, sent + ttl);
        let watched = cell.clone();
        let task = tokio::spawn(async move {
            renew_loop(&watched, Backoff::default(), ROUND_TIMEOUT, sent, |end| {
                let renew = renew.clone();
                async move { renew.renew(end).await }
            })
            .await;
        });
        KeptLease { cell, task }
    }

    /// A handle on the lease state (for a [`super::Guard`]).
    pub(crate) fn watch(&self) -> LeaseWatch {
        LeaseWatch::new(self.cell.clone())
    }

    /// The Raft term of the leader that granted or renewed the lease, where
    /// the backend says (see [`crate::lease::Renewed::ConfirmedInTerm`]).
    pub(crate) fn seen_term(&self, term: u64) {
        self.cell.seen_term(term);
    }

    /// Marks the lease lost now (e.g. a ZooKeeper session expired, an etcd
    /// keep-alive stream said TTL 0). Final.
    pub(crate) fn lose(&self, reason: LeaseLost) {
        self.cell.lose(reason);
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.task.abort();
        self.cell.lose(LeaseLost::Closed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// Answers from a script, counting calls.
    struct Script {
        calls: AtomicU32,
        answers: fn(u32) -> Result<Renewed, Error>,
    }

    impl Renew for Script {
        fn renew(&self, _round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let answer = (self.answers)(n);
            Box::pin(async move { answer })
        }
    }

    fn script(answers: fn(u32) -> Result<Renewed, Error>) -> Arc<Script> {
        Arc::new(Script { calls: AtomicU32::new(0), answers })
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_move_the_deadline_and_gone_loses_the_lease() {
        let t0 = crate::clock::now();
        let renew = script(|n| if n < 3 { Ok(Renewed::Confirmed(None)) } else { Ok(Renewed::Gone) });
        let lease = KeptLease::start(1, 3 * S, t0, renew.clone());
        let watch = lease.watch();
        assert_eq!(watch.lost().await, LeaseLost::NotFound);
        assert_eq!(renew.calls.load(Ordering::SeqCst), 4);
        // Three renewals about a second apart moved the deadline past t0 + 3 s.
        assert!(watch.deadline() > t0 + 5 * S, "{:?}", watch.deadline() - t0);
        assert!(crate::clock::now() < watch.deadline(), "lost by the report, before the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn failing_renewals_lose_the_lease_at_the_deadline() {
        let t0 = crate::clock::now();
        let renew = script(|_| Err(Error::backend("redis", "connection refused")));
        let lease = KeptLease::start(1, 3 * S, t0, renew.clone());
        assert_eq!(lease.watch().lost().await, LeaseLost::Expired);
        assert_eq!(crate::clock::now(), t0 + 3 * S);
        assert!(renew.calls.load(Ordering::SeqCst) >= 2, "retried before giving up");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_lease_closes_it_for_every_watch() {
        let lease = KeptLease::start(1, 3 * S, crate::clock::now(), script(|_| Ok(Renewed::Confirmed(None))));
        let watch = lease.watch();
        drop(lease);
        assert_eq!(watch.lost().await, LeaseLost::Closed);
    }
}
