//! Leases on the client side: the lease state signal, the conservative local
//! deadline, and the watchdog that keeps a lease alive.
//!
//! Where it sits: [`crate::backend::native::registry`] shares one lease per TTL between the guards
//! of a [`crate::Client`]; each lease is a [`LeaseCell`] with one watchdog task.
//! Every [`crate::Guard`] on the lease reads the same cell through a
//! [`LeaseWatch`].
//!
//! # The deadline
//! The server moves a lease's deadline to `handled + ttl` when it handles a grant
//! or keep-alive, and it handles the request after the client sent it. So the
//! client counts `sent + ttl`, from the moment it *sent* the first attempt of the
//! request the server confirmed: that is never later than the server's own
//! deadline (clock drift aside). Until then the holder can prove that it holds
//! its locks; after it, it cannot.
//!
//! # Loss
//! A lease is lost, once and for good, when the server answers `NOT_FOUND` to a
//! keep-alive ([`LeaseLost::NotFound`]), when the deadline passes without a
//! confirmed keep-alive ([`LeaseLost::Expired`]), when this client revokes it
//! ([`LeaseLost::Revoked`]), or when the client closes it after its last lock was
//! released ([`LeaseLost::Closed`]). [`LeaseWatch::lost`] fires for each of these,
//! and it fires at the deadline by its own timer even if the watchdog task is
//! stalled: loss is never silent. The native backend also learns of a revocation
//! or an expiry on the server from its push stream (see
//! [`crate::backend::native::lease_rpc`]): [`LeaseLost::Revoked`] or
//! [`LeaseLost::Expired`] within a round trip of the server's decision.
//!
//! # Jeopardy
//! A lease is *in jeopardy* from `deadline - margin` (default margin: TTL/3) until
//! a keep-alive moves the deadline, and for good once it is lost
//! ([`LeaseWatch::jeopardy`]): keep-alives have been failing for long enough that
//! the holder should stop starting new writes (Chubby's jeopardy event). With
//! healthy keep-alives (one every ~TTL/3) a lease never enters jeopardy.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backoff::{renew_interval, Backoff};
use crate::error::Error;
pub use crate::error::LeaseLost;
use crate::metrics;

/// What the client knows about one lease. Pure values: the transitions are
/// functions, tested without a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseState {
    /// `sent + ttl` of the last confirmed grant or keep-alive.
    pub deadline: Instant,
    /// Set once, for good.
    pub lost: Option<LeaseLost>,
    /// The highest leader term an answer about the lease carried (0: none yet).
    pub term: u64,
    /// How many times an answer carried a higher term than the one before:
    /// the lease was carried to a new leader and kept.
    pub failovers: u32,
}

impl LeaseState {
    /// After the server confirmed a request sent at `sent` with `ttl`: the later of
    /// the two deadlines. A lost lease stays lost.
    pub fn confirmed(self, sent: Instant, ttl: Duration) -> LeaseState {
        match self.lost {
            Some(_) => self,
            None => LeaseState { deadline: self.deadline.max(sent + ttl), ..self },
        }
    }

    /// At `now`: lost as [`LeaseLost::Expired`] if the deadline has passed.
    pub fn at(self, now: Instant) -> LeaseState {
        match self.lost {
            None if now >= self.deadline => LeaseState { lost: Some(LeaseLost::Expired), ..self },
            _ => self,
        }
    }

    /// The instant from which the lease is in jeopardy with `margin`:
    /// `deadline - margin` (the deadline itself if that underflows).
    pub fn jeopardy_at(self, margin: Duration) -> Instant {
        self.deadline.checked_sub(margin).unwrap_or(self.deadline)
    }

    /// In jeopardy at `now` with `margin`: lost, or past [`Self::jeopardy_at`].
    pub fn in_jeopardy(self, now: Instant, margin: Duration) -> bool {
        self.lost.is_some() || now >= self.jeopardy_at(margin)
    }

    /// After an answer about the live lease carried leader term `term` (0:
    /// the backend gave none): a fail-over more if it is higher than the last
    /// one seen (the first one seen is the starting point). A lost lease stays
    /// as it was.
    pub fn seen_term(self, term: u64) -> LeaseState {
        match (self.lost, term) {
            (Some(_), _) | (_, 0) => self,
            _ if self.term == 0 => LeaseState { term, ..self },
            _ if term > self.term => LeaseState { term, failovers: self.failovers.saturating_add(1), ..self },
            _ => self,
        }
    }

    /// Lost for `reason`, unless it was lost already.
    pub fn lose(self, reason: LeaseLost) -> LeaseState {
        LeaseState { lost: Some(self.lost.unwrap_or(reason)), ..self }
    }
}

/// One lease, shared by the watchdog and every guard on it.
#[derive(Debug)]
pub(crate) struct LeaseCell {
    pub id: u64,
    pub ttl: Duration,
    state: watch::Sender<LeaseState>,
}

impl LeaseCell {
    pub fn new(id: u64, ttl: Duration, deadline: Instant) -> Arc<LeaseCell> {
        let (state, _) = watch::channel(LeaseState { deadline, lost: None, term: 0, failovers: 0 });
        Arc::new(LeaseCell { id, ttl, state })
    }

    /// The state now (an expired deadline is applied first).
    pub fn state(&self) -> LeaseState {
        self.transition(|s| s.at(crate::clock::now()));
        *self.state.borrow()
    }

    pub fn is_lost(&self) -> bool {
        self.state().lost.is_some()
    }

    /// Records a confirmation of a request sent at `sent`. False if the lease was
    /// already lost (a late confirmation does not revive it).
    pub fn confirm(&self, sent: Instant, ttl: Duration) -> bool {
        let now = crate::clock::now();
        self.transition(|s| s.at(now).confirmed(sent, ttl));
        self.state.borrow().lost.is_none()
    }

    /// Records that an answer about the lease carried leader term `term` (see
    /// [`LeaseState::seen_term`]).
    pub fn seen_term(&self, term: u64) {
        self.transition(|s| s.seen_term(term));
    }

    /// Marks the lease lost for `reason` (no-op if it is lost already).
    pub fn lose(&self, reason: LeaseLost) {
        self.transition(|s| s.lose(reason));
    }

    /// Applies `f`; publishes and counts a loss if it happens now.
    fn transition(&self, f: impl FnOnce(LeaseState) -> LeaseState) {
        let mut newly_lost = None;
        self.state.send_if_modified(|s| {
            let next = f(*s);
            if s.lost.is_none() {
                newly_lost = next.lost;
            }
            let changed = next != *s;
            *s = next;
            changed
        });
        if let Some(reason) = newly_lost {
            if reason != LeaseLost::Closed {
                tracing::warn!(lease = self.id, %reason, "fencelock: lease lost");
                metrics::lease_lost(reason.label());
            }
        }
    }
}

/// A read-only handle on a lease's state: its deadline and its loss signal.
///
/// Cheap to clone, `Send + Sync + 'static`: move it into another task to stop work
/// there when the lease is lost. Every [`crate::Guard`] of a lease sees the
/// same state.
///
/// # Examples
///
/// Stop the work in another task when the lock is lost. The watch does not hold
/// the lock: keep the guard alive (dropping it releases the lock).
///
/// ```no_run
/// use fencelock::{Client, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let Outcome::Acquired(guard) = client.lock("ingest").acquire().await? else { return Ok(()) };
/// let watch = guard.lease_watch();
/// let worker = tokio::spawn(async move {
///     tokio::select! {
///         _ = ingest_forever() => {}
///         reason = watch.lost() => eprintln!("lease {} lost ({reason})", watch.lease_id()),
///     }
/// });
/// let _ = worker.await;
/// guard.release().await?;
/// # Ok(()) }
/// # async fn ingest_forever() {}
/// ```
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    cell: Arc<LeaseCell>,
}

impl LeaseWatch {
    pub(crate) fn new(cell: Arc<LeaseCell>) -> LeaseWatch {
        LeaseWatch { cell }
    }

    /// The lease id.
    pub fn lease_id(&self) -> u64 {
        self.cell.id
    }

    /// The lease's TTL, as granted.
    pub fn ttl(&self) -> Duration {
        self.cell.ttl
    }

    /// The conservative deadline: the moment the request that last confirmed the
    /// lease (grant or keep-alive) was *sent*, plus the TTL. The server's deadline
    /// is never earlier. After a loss, the last deadline the client had.
    pub fn deadline(&self) -> Instant {
        self.cell.state().deadline
    }

    /// Why the lease was lost, or `None` while it is live (the deadline is checked
    /// against the clock, so this is `Some(Expired)` as soon as it passes).
    pub fn lost_reason(&self) -> Option<LeaseLost> {
        self.cell.state().lost
    }

    /// True once the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Resolves when the lease is lost, with the reason: at once if it is lost
    /// already; when the server answers `NOT_FOUND` to a keep-alive (within about
    /// TTL/3 of the revocation); when the lease is revoked or closed by this
    /// client; and at the latest at [`LeaseWatch::deadline`] if no keep-alive
    /// confirmed the lease by then. It never resolves while the lease is provably
    /// held. Cancel-safe.
    pub async fn lost(&self) -> LeaseLost {
        let mut rx = self.cell.state.subscribe();
        loop {
            // Mark the current value seen first, so that any later change wakes us.
            rx.borrow_and_update();
            let state = self.cell.state();
            if let Some(reason) = state.lost {
                return reason;
            }
            tokio::select! {
                // Cannot fail: `self.cell` owns the sender.
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(state.deadline) => {}
            }
        }
    }

    /// How many times the lease was carried to a new leader and kept, as far as
    /// this client has seen (an answer about it carried a higher leader term
    /// than the one before). Only backends whose answers carry a term count
    /// them (the native server); elsewhere it stays 0.
    pub fn failovers(&self) -> u32 {
        self.cell.state().failovers
    }

    /// Resolves at the next fail-over the lease survives (after this call) with
    /// the new [`Self::failovers`] count, or with the reason if the lease is
    /// lost first. The holder may want to re-check what it assumed of the old
    /// leader (a cached read, a session) then. Cancel-safe.
    pub async fn failed_over(&self) -> Result<u32, LeaseLost> {
        let mut rx = self.cell.state.subscribe();
        let start = self.cell.state().failovers;
        loop {
            rx.borrow_and_update();
            let state = self.cell.state();
            if let Some(reason) = state.lost {
                return Err(reason);
            }
            if state.failovers > start {
                return Ok(state.failovers);
            }
            tokio::select! {
                // Cannot fail: `self.cell` owns the sender.
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(state.deadline) => {}
            }
        }
    }

    /// The default jeopardy margin: a third of the TTL (the keep-alive period, so
    /// jeopardy means "about one keep-alive round has failed").
    pub fn default_jeopardy_margin(&self) -> Duration {
        self.cell.ttl / 3
    }

    /// True while the lease is in jeopardy with the default margin (see
    /// [`Self::jeopardy`]); true once it is lost.
    pub fn in_jeopardy(&self) -> bool {
        self.in_jeopardy_with(self.default_jeopardy_margin())
    }

    /// [`Self::in_jeopardy`] with `margin` before the deadline.
    pub fn in_jeopardy_with(&self, margin: Duration) -> bool {
        self.cell.state().in_jeopardy(crate::clock::now(), margin)
    }

    /// Resolves when the lease is in jeopardy: when `deadline - margin` passes
    /// (default margin: TTL/3) without a keep-alive that moved the deadline, or at
    /// once if the lease is in jeopardy or lost already. A keep-alive confirmed
    /// meanwhile moves the moment with the deadline. Time to stop starting new
    /// writes; [`Self::lost`] says when the lease is gone. Cancel-safe; call it
    /// again after a confirmed keep-alive to wait for the next jeopardy.
    pub async fn jeopardy(&self) {
        self.jeopardy_with(self.default_jeopardy_margin()).await
    }

    /// [`Self::jeopardy`] with `margin` before the deadline.
    pub async fn jeopardy_with(&self, margin: Duration) {
        let mut rx = self.cell.state.subscribe();
        loop {
            // Mark the current value seen first, so that any later change wakes us.
            rx.borrow_and_update();
            let state = self.cell.state();
            if state.in_jeopardy(crate::clock::now(), margin) {
                return;
            }
            tokio::select! {
                // Cannot fail: `self.cell` owns the sender.
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(state.jeopardy_at(margin)) => {}
            }
        }
    }
}

/// The watchdog loop shared by every backend: renews the lease
/// [`renew_interval`] after the send time of the last confirmed renewal; after a
/// failed round, retries with `backoff` until the deadline. Returns once the
/// lease is lost.
///
/// `renew(round_end)` runs one renewal that must finish by `round_end`: it
/// answers `Renewed::Confirmed` with the TTL the server confirmed (`None`:
/// the cell's TTL), or `Renewed::Gone` when the server says the lease is gone
/// (the cell is then lost as [`LeaseLost::NotFound`]); an error is retried.
pub(crate) async fn renew_loop<F, Fut>(
    cell: &LeaseCell,
    backoff: Backoff,
    round_timeout: Duration,
    mut last_sent: Instant,
    mut renew: F,
) where
    F: FnMut(Instant) -> Fut,
    Fut: std::future::Future<Output = Result<Renewed, Error>>,
{
    let mut failures = 0u32;
    loop {
        let next = match failures {
            0 => last_sent + renew_interval(cell.ttl, fastrand::f64()),
            n => crate::clock::now() + backoff.delay(n - 1, fastrand::f64()),
        };
        let state = cell.state();
        if state.lost.is_some() {
            return;
        }
        tokio::time::sleep_until(next.min(state.deadline)).await;
        if cell.is_lost() {
            return;
        }
        let sent = crate::clock::now();
        // A round may take a third of the TTL, so that a hung attempt leaves room
        // for another round before the deadline.
        let round_end = (sent + round_timeout.min(cell.ttl / 3)).min(cell.state().deadline);
        let answer = renew(round_end).await;
        if let Ok(Renewed::ConfirmedInTerm(_, term)) = answer {
            cell.seen_term(term);
        }
        match answer {
            Ok(Renewed::Confirmed(ttl) | Renewed::ConfirmedInTerm(ttl, _)) => {
                metrics::renewal();
                if !cell.confirm(sent, ttl.unwrap_or(cell.ttl)) {
                    return;
                }
                last_sent = sent;
                failures = 0;
            }
            Ok(Renewed::Gone) => {
                cell.lose(LeaseLost::NotFound);
                return;
            }
            Err(e) => {
                metrics::renewal_failure();
                failures += 1;
                tracing::debug!(lease = cell.id, failures, error = %e, "fencelock: renewal failed");
            }
        }
    }
}

/// What one renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// The backend extended the lease; with the TTL it granted, if it says.
    Confirmed(Option<Duration>),
    /// As `Confirmed`, by a service that says the Raft term of the leader
    /// that answered (etcd's response header): a higher term than before is a
    /// fail-over the lease survived ([`LeaseWatch::failovers`]).
    ConfirmedInTerm(Option<Duration>, u64),
    /// The backend no longer has the lease or the lock (expired, deleted, owned
    /// by someone else): it is lost.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn live(deadline: Instant) -> LeaseState {
        LeaseState { deadline, lost: None, term: 0, failovers: 0 }
    }

    #[test]
    fn deadline_counts_from_the_send_time() {
        let t0 = crate::clock::now();
        let s = live(t0 + 15 * S).confirmed(t0 + 5 * S, 15 * S);
        assert_eq!(s.deadline, t0 + 20 * S);
    }

    #[test]
    fn a_stale_confirmation_never_moves_the_deadline_back() {
        let t0 = crate::clock::now();
        // A keep-alive sent at t0+1 confirmed after one sent at t0+5.
        let s = live(t0 + 20 * S).confirmed(t0 + S, 15 * S);
        assert_eq!(s.deadline, t0 + 20 * S);
    }

    #[test]
    fn expires_exactly_at_the_deadline() {
        let t0 = crate::clock::now();
        let s = live(t0 + 15 * S);
        assert_eq!(s.at(t0 + 15 * S - Duration::from_nanos(1)).lost, None);
        assert_eq!(s.at(t0 + 15 * S).lost, Some(LeaseLost::Expired));
    }

    /// Rule (issue 17, fail-over event): the first term seen is the starting
    /// point; each higher term is one fail-over; an equal, lower or unknown
    /// (0) term changes nothing; a lost lease counts nothing more.
    #[test]
    fn a_higher_leader_term_counts_one_failover() {
        let s = live(crate::clock::now());
        let s = s.seen_term(0).seen_term(4);
        assert_eq!((s.term, s.failovers), (4, 0));
        let s = s.seen_term(4).seen_term(3).seen_term(0);
        assert_eq!((s.term, s.failovers), (4, 0));
        let s = s.seen_term(6);
        assert_eq!((s.term, s.failovers), (6, 1));
        let s = s.seen_term(9).lose(LeaseLost::Revoked).seen_term(12);
        assert_eq!((s.term, s.failovers), (9, 2));
    }

    #[test]
    fn loss_is_final_and_keeps_its_first_reason() {
        let t0 = crate::clock::now();
        let s = live(t0 + 15 * S).lose(LeaseLost::NotFound);
        assert_eq!(s.lose(LeaseLost::Closed).lost, Some(LeaseLost::NotFound));
        let late = s.confirmed(t0 + 10 * S, 15 * S);
        assert_eq!(late, s, "a confirmation after the loss changes nothing");
        assert_eq!(live(t0).at(t0).confirmed(t0, 15 * S).lost, Some(LeaseLost::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_the_deadline_without_any_watchdog() {
        let t0 = crate::clock::now();
        let cell = LeaseCell::new(7, 3 * S, t0 + 3 * S);
        let watch = LeaseWatch::new(cell.clone());
        assert!(!watch.is_lost());
        assert_eq!(watch.lost().await, LeaseLost::Expired);
        assert_eq!(crate::clock::now(), t0 + 3 * S);
        assert!(watch.is_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn lost_waits_for_a_moved_deadline() {
        let t0 = crate::clock::now();
        let cell = LeaseCell::new(7, 3 * S, t0 + 3 * S);
        let watch = LeaseWatch::new(cell.clone());
        let c = cell.clone();
        tokio::spawn(async move {
            tokio::time::sleep(2 * S).await;
            assert!(c.confirm(t0 + 2 * S, 3 * S));
        });
        assert_eq!(watch.lost().await, LeaseLost::Expired);
        assert_eq!(crate::clock::now(), t0 + 5 * S);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_on_a_reported_loss_before_the_deadline() {
        let t0 = crate::clock::now();
        let cell = LeaseCell::new(7, 30 * S, t0 + 30 * S);
        let watch = LeaseWatch::new(cell.clone());
        let c = cell.clone();
        tokio::spawn(async move {
            tokio::time::sleep(S).await;
            c.lose(LeaseLost::NotFound);
        });
        assert_eq!(watch.lost().await, LeaseLost::NotFound);
        assert_eq!(crate::clock::now(), t0 + S);
        assert_eq!(watch.deadline(), t0 + 30 * S, "the deadline stays what it was");
    }

    /// Jeopardy: `deadline - margin`, the default margin TTL/3.
    #[tokio::test(start_paused = true)]
    async fn jeopardy_fires_at_the_deadline_minus_a_third_of_the_ttl() {
        let t0 = crate::clock::now();
        let cell = LeaseCell::new(7, 30 * S, t0 + 30 * S);
        let watch = LeaseWatch::new(cell.clone());
        assert!(!watch.in_jeopardy());
        watch.jeopardy().await;
        assert_eq!(crate::clock::now(), t0 + 20 * S);
        assert!(watch.in_jeopardy());
        assert!(!watch.is_lost(), "in jeopardy, not lost");
    }

    /// Jeopardy with a margin of the caller's choice.
    #[tokio::test(start_paused = true)]
    async fn jeopardy_with_a_margin_fires_that_long_before_the_deadline() {
        let t0 = crate::clock::now();
        let cell = LeaseCell::new(7, 30 * S, t0 + 30 * S);
        let watch = LeaseWatch::new(cell.clone());
        assert!(!watch.in_jeopardy_with(5 * S));
        watch.jeopardy_with(5 * S).await;
        assert_eq!(crate::clock::now(), t0 + 25 * S);
        assert!(watch.in_jeopardy_with(5 * S));
        assert!(!watch.in_jeopardy_with(4 * S));
    }

    /// A keep-alive confirmed before `deadline - margin` moves the jeopardy with
    /// the deadline (as `lost` follows a moved deadline).
    #[tokio::test(start_paused = true)]
    async fn jeopardy_follows_a_moved_deadline() {
        let t0 = crate::clock::now();
        let cell = LeaseCell::new(7, 3 * S, t0 + 3 * S);
        let watch = LeaseWatch::new(cell.clone());
        let c = cell.clone();
        tokio::spawn(async move {
            tokio::time::sleep(S).await;
            // Sent at t0+1 s: the deadline moves to t0+4 s, jeopardy to t0+3 s.
            assert!(c.confirm(t0 + S, 3 * S));
        });
        watch.jeopardy().await;
        assert_eq!(crate::clock::now(), t0 + 3 * S);
        assert_eq!(watch.deadline(), t0 + 4 * S);
        assert!(!watch.is_lost());
    }

    /// A lost lease is in jeopardy at once, whatever its deadline.
    #[tokio::test(start_paused = true)]
    async fn jeopardy_fires_at_once_when_the_lease_is_lost() {
        let t0 = crate::clock::now();
        let cell = LeaseCell::new(7, 30 * S, t0 + 30 * S);
        let watch = LeaseWatch::new(cell.clone());
        let c = cell.clone();
        tokio::spawn(async move {
            tokio::time::sleep(S).await;
            c.lose(LeaseLost::Revoked);
        });
        watch.jeopardy().await;
        assert_eq!(crate::clock::now(), t0 + S);
        assert!(watch.in_jeopardy());
        watch.jeopardy().await;
        assert_eq!(crate::clock::now(), t0 + S, "and at once for every later call");
    }
}
