//! [`Guard`]: a lock held through any [`super::LockBackend`], and `Held`, the
//! part each backend supplies (how to release its grant).
//!
//! Where it sits: every backend's `acquire` returns `Outcome<Guard>`. The guard
//! reads the lease state through a [`LeaseWatch`] (the same type the native
//! client uses), so `deadline()` and `lost()` mean the same thing everywhere:
//! see the timing contract in the crate docs.

use std::fmt;

use tokio::time::Instant;

use super::BoxFuture;
use crate::error::Error;
use crate::lease::{LeaseLost, LeaseWatch};

/// The backend's side of a held lock.
///
/// Implementations keep the lease alive for as long as they live (usually by
/// owning a `KeptLease`) and stop renewing when dropped.
pub(crate) trait Held: Send + Sync {
    /// Releases the lock if this grant still holds it (compare-and-delete):
    /// `Ok(true)` released, `Ok(false)` it was not held any more (nothing
    /// changed). An error leaves the outcome unknown; the lock is then freed when
    /// its lease expires on the backend.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>>;

    /// The guard was dropped without [`Guard::release`]: free the lock in the
    /// background, without blocking (or leave it to expire, if the backend
    /// cannot run a task here).
    fn release_in_background(self: Box<Self>);

    /// Replaces the value published with this grant if it still holds the lock
    /// (compare-and-set): `Ok(true)` set, `Ok(false)` it was not held any more.
    /// `None`: the backend cannot change a held lock's value.
    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let _ = value;
        None
    }

    /// Turns this exclusive grant of a read-write lock into a shared one
    /// (same token): `Ok(true)` done, `Ok(false)` it is not an exclusive grant
    /// that holds the lock. `None`: the backend has no read-write locks.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        None
    }

    /// Records that this grant's job of `slot` ended with `exit_code`:
    /// `Ok(true)` recorded, `Ok(false)` it does not hold the lock any more.
    /// `None`: the backend records no slots.
    fn complete_slot(&self, slot: String, exit_code: i32) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let _ = (slot, exit_code);
        None
    }
}

/// A held lock, from any backend.
///
/// * [`token`](Guard::token) is the fencing token (`None` where the backend has
///   none: see [`super::Capabilities::fencing`]).
/// * [`lost`](Guard::lost) resolves when the lock is lost; select on it next to
///   the work.
/// * [`jeopardy`](Guard::jeopardy) resolves earlier, when keep-alives have failed
///   for a while (deadline minus TTL/3): stop starting new writes.
/// * [`deadline`](Guard::deadline) is the latest instant until which the client
///   can prove it holds the lock.
///
/// Dropping the guard releases the lock in the background.
///
/// # Examples
///
/// Pass the fencing token with every write, so that the resource refuses a
/// write from a holder that lost the lock, and stop working when
/// [`lost`](Guard::lost) fires: that is where a lost lock is reported.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let outcome = client.lock("orders/42").wait(Duration::from_secs(5)).acquire().await?;
/// let Outcome::Acquired(guard) = outcome else {
///     return Ok(()); // busy or timed out: not an error
/// };
/// guard.set_value("worker-3").await?; // what describe and watchers show
/// let token = guard.fencing_token()?;
/// tokio::select! {
///     _ = write_order(42, token) => {}
///     reason = guard.lost() => eprintln!("lock lost ({reason}): the write was stopped"),
/// }
/// guard.release().await?; // Ok(false) if it had been lost
/// # Ok(()) }
/// # async fn write_order(_id: u64, _token: u64) {}
/// ```
pub struct Guard {
    name: String,
    token: Option<u64>,
    backend: &'static str,
    watch: LeaseWatch,
    /// `None` once released.
    held: Option<Box<dyn Held>>,
}

impl Guard {
    /// A guard on `name` granted by `backend` with `token`, whose lease state is
    /// `watch`. For backend implementations.
    pub(crate) fn new(
        name: String,
        token: Option<u64>,
        backend: &'static str,
        watch: LeaseWatch,
        held: Box<dyn Held>,
    ) -> Guard {
        Guard { name, token, backend, watch, held: Some(held) }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backend that granted the lock (as [`super::LockBackend::kind`]).
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The fencing token of this grant, or `None` if the backend gives none.
    pub fn token(&self) -> Option<u64> {
        self.token
    }

    /// The fencing token, or [`Error::Unsupported`] if the backend gives none:
    /// for code that must not write without one.
    pub fn fencing_token(&self) -> Result<u64, Error> {
        self.token.ok_or_else(|| Error::Unsupported(format!("{} gives no fencing token", self.backend)))
    }

    /// The backend's id of the lease behind the lock (a lease, session or owner
    /// id, depending on the backend).
    pub fn lease_id(&self) -> u64 {
        self.watch.lease_id()
    }

    /// The conservative deadline: when the request that last confirmed the lease
    /// was sent, plus the TTL the backend granted. See [`LeaseWatch::deadline`].
    pub fn deadline(&self) -> Instant {
        self.watch.deadline()
    }

    /// Resolves when the lock is lost (at the latest at
    /// [`deadline`](Self::deadline) unless a renewal moved it). Cancel-safe.
    pub async fn lost(&self) -> LeaseLost {
        self.watch.lost().await
    }

    /// True once the lock is lost (including a passed deadline).
    pub fn is_lost(&self) -> bool {
        self.watch.is_lost()
    }

    /// Resolves when the lock is in jeopardy: [`deadline`](Self::deadline) minus
    /// a third of the TTL has passed without a keep-alive that moved the
    /// deadline, or at once if the lock is lost. Stop starting new writes then;
    /// [`lost`](Self::lost) says when it is gone. Follows a moved deadline.
    /// Cancel-safe. See [`LeaseWatch::jeopardy`].
    pub async fn jeopardy(&self) {
        self.watch.jeopardy().await
    }

    /// [`jeopardy`](Self::jeopardy) with `margin` before the deadline instead of
    /// a third of the TTL.
    pub async fn jeopardy_with(&self, margin: std::time::Duration) {
        self.watch.jeopardy_with(margin).await
    }

    /// True while the lock is in jeopardy (default margin), or lost.
    pub fn in_jeopardy(&self) -> bool {
        self.watch.in_jeopardy()
    }

    /// How many times the lock's lease was carried to a new leader and kept
    /// (native server; 0 on backends whose answers carry no leader term). See
    /// [`LeaseWatch::failovers`].
    pub fn failovers(&self) -> u32 {
        self.watch.failovers()
    }

    /// Resolves at the next fail-over the lock survives, with the new count, or
    /// with the reason if the lock is lost first. See [`LeaseWatch::failed_over`].
    pub async fn failed_over(&self) -> Result<u32, LeaseLost> {
        self.watch.failed_over().await
    }

    /// A handle on the lease state to move into another task.
    pub fn lease_watch(&self) -> LeaseWatch {
        self.watch.clone()
    }

    /// Replaces the value published with this grant (what `describe`, watchers
    /// and an election's observers see), keeping the lock, its token and its
    /// place: `Ok(true)` set; `Ok(false)` the lock is not held any more (nothing
    /// changed). [`Error::Unsupported`] where the backend cannot. An error
    /// leaves the outcome unknown; a retry is safe.
    pub async fn set_value(&self, value: impl Into<Vec<u8>>) -> Result<bool, Error> {
        let Some(held) = self.held.as_ref() else { return Ok(false) };
        if self.watch.lost_reason().is_some() {
            return Ok(false);
        }
        let value = value.into();
        super::check_value(&value)?;
        match held.set_value(value) {
            Some(set) => set.await,
            None => Err(Error::Unsupported(format!("{} cannot change the value of a held lock", self.backend))),
        }
    }

    /// Turns this writer's grant of a read-write lock into a reader's, with
    /// the same token, without letting go: the readers queued first are then
    /// granted beside it. `Ok(true)` done; `Ok(false)` the lock is not held
    /// exclusively by this grant (already shared, a semaphore's, or lost;
    /// nothing changed). There is no upgrade: two readers that both upgraded
    /// would wait for each other forever; release and acquire again instead.
    /// [`Error::Unsupported`] where the backend has no read-write locks.
    pub async fn downgrade(&self) -> Result<bool, Error> {
        let Some(held) = self.held.as_ref() else { return Ok(false) };
        if self.watch.lost_reason().is_some() {
            return Ok(false);
        }
        match held.downgrade() {
            Some(done) => done.await,
            None => Err(Error::Unsupported(format!("{} has no read-write locks", self.backend))),
        }
    }

    /// Records that the job of `slot` run under this grant ended with
    /// `exit_code`, so that a later acquire with that
    /// [`once_per`](crate::LockOptions::once_per) answers
    /// [`Error::SlotDone`]. `Ok(true)` recorded; `Ok(false)` the lock
    /// is not held by this grant any more (lost: a run that lost its lease never
    /// completes its slot). [`Error::Unsupported`] where the backend records no
    /// slots.
    pub async fn complete_slot(&self, slot: &str, exit_code: i32) -> Result<bool, Error> {
        let Some(held) = self.held.as_ref() else { return Ok(false) };
        if self.watch.lost_reason().is_some() {
            return Ok(false);
        }
        match held.complete_slot(slot.to_string(), exit_code) {
            Some(done) => done.await,
            None => Err(Error::Unsupported(format!("{} records no completed slots", self.backend))),
        }
    }

    /// Releases the lock. `Ok(true)`: it was held and is now free. `Ok(false)`:
    /// it was lost before (nothing to release, or a background release was
    /// started for a lease that may still live on the backend). An error means
    /// the outcome is unknown; the lock is freed when the lease expires.
    pub async fn release(mut self) -> Result<bool, Error> {
        let Some(held) = self.held.take() else { return Ok(false) };
        match self.watch.lost_reason() {
            None => held.release().await,
            Some(LeaseLost::Expired) => {
                // The backend may still hold it: free it for others.
                held.release_in_background();
                Ok(false)
            }
            Some(_) => Ok(false),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            match self.watch.lost_reason() {
                None | Some(LeaseLost::Expired) => held.release_in_background(),
                Some(_) => {} // the backend dropped the grant already
            }
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("token", &self.token)
            .field("lost", &self.watch.lost_reason())
            .finish_non_exhaustive()
    }
}
