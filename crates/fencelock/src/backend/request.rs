//! [`LockRequest`]: the lock builder of every backend,
//! `backend.lock("name").ttl(..).wait(..).acquire()`.
//!
//! Where it sits: over the [`LockBackend`] trait only (written once, for every
//! backend): [`crate::Client::lock`] and `lock` on a [`super::Backend`] build
//! one; [`LockRequest::acquire`] is [`LockBackend::acquire`] with the options
//! gathered, and [`LockRequest::with_lock`] is [`super::with_lock`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{with_lock, Guard, LockBackend};
use crate::backend::Outcome;
use crate::error::{Error, WithLockError};
use crate::types::LockOptions;

/// A lock request being built: `lock(name)`, then options, then
/// [`acquire`](LockRequest::acquire) or [`with_lock`](LockRequest::with_lock).
/// Owns a handle on its backend, so its futures are `'static` (spawnable).
///
/// # Examples
///
/// Nothing is sent until [`acquire`](LockRequest::acquire) is awaited. The
/// defaults are a 15 s TTL and no wait: without [`wait`](LockRequest::wait)
/// a held lock answers `Busy` at once.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let outcome = client
///     .lock("billing/invoices")
///     .ttl(Duration::from_secs(30)) // renewed about every 10 s while held
///     .wait(Duration::from_secs(10))
///     .identity("invoicer@host-3")
///     .acquire()
///     .await?;
/// if let Outcome::Acquired(guard) = outcome {
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a lock request does nothing until `.acquire().await`"]
pub struct LockRequest {
    backend: Arc<dyn LockBackend>,
    name: String,
    opts: LockOptions,
}

impl LockRequest {
    pub(crate) fn new(backend: Arc<dyn LockBackend>, name: String) -> LockRequest {
        LockRequest { backend, name, opts: LockOptions::default() }
    }

    /// Lease TTL (100 ms to 1 h; at least the backend's
    /// [`min_ttl`](super::Capabilities::min_ttl)). Default 15 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.opts = self.opts.ttl(ttl);
        self
    }

    /// How long to wait for the lock (≤ 1 h), in FIFO order where the backend
    /// has it. Default zero: try once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.opts = self.opts.wait(wait);
        self
    }

    /// Lock-delay after an unclean loss (≤ 60 s), where the backend has it.
    /// Default zero.
    pub fn lock_delay(mut self, lock_delay: Duration) -> Self {
        self.opts = self.opts.lock_delay(lock_delay);
        self
    }

    /// Refuse a backend that gives no fencing token. Default false.
    pub fn require_fencing(mut self, require: bool) -> Self {
        self.opts = self.opts.require_fencing(require);
        self
    }

    /// Who takes the lock, shown with the grant (≤ 256 bytes); default: the
    /// client's identity, if any. See [`LockOptions::identity`](crate::LockOptions::identity).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.opts = self.opts.identity(identity);
        self
    }

    /// Bytes published with the grant (≤ 4096). Default none.
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.opts = self.opts.value(value);
        self
    }

    /// As a reader of a read-write lock ([`LockOptions::shared`]).
    pub fn shared(mut self) -> Self {
        self.opts = self.opts.shared();
        self
    }

    /// On a semaphore of `permits` permits ([`LockOptions::permits`]).
    pub fn permits(mut self, permits: u32) -> Self {
        self.opts = self.opts.permits(permits);
        self
    }

    /// Taking `weight` permits at once ([`LockOptions::weight`]).
    pub fn weight(mut self, weight: u32) -> Self {
        self.opts = self.opts.weight(weight);
        self
    }

    /// Keeping the lock closed until `hold` after the grant, however it ends
    /// (≤ 24 h), where the backend has it ([`LockOptions::hold_at_least`]).
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.opts = self.opts.hold_at_least(hold);
        self
    }

    /// Running once per `slot`, where the backend has it ([`LockOptions::once_per`]).
    pub fn once_per(mut self, slot: impl Into<String>) -> Self {
        self.opts = self.opts.once_per(slot);
        self
    }

    /// All options at once.
    pub fn options(mut self, opts: LockOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Takes the lock: [`LockBackend::acquire`] with these options (its
    /// contract: contention is an outcome; dropping the future withdraws the
    /// request).
    pub async fn acquire(self) -> Result<Outcome<Guard>, Error> {
        self.backend.acquire(&self.name, &self.opts).await
    }

    /// Takes the lock, runs `f` while holding it, and releases it: see
    /// [`super::with_lock`].
    pub async fn with_lock<T, F>(self, f: F) -> Result<T, WithLockError>
    where
        F: AsyncFnOnce(&Guard) -> T,
    {
        with_lock(&*self.backend, &self.name, self.opts, f).await
    }
}

impl fmt::Debug for LockRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRequest")
            .field("backend", &self.backend.kind())
            .field("name", &self.name)
            .field("opts", &self.opts)
            .finish()
    }
}

impl dyn LockBackend {
    /// A request for the lock `name` on this backend, with default
    /// [`LockOptions`] (15 s TTL, try once): `backend.lock("jobs/nightly")
    /// .ttl(ttl).wait(wait).acquire()`.
    pub fn lock(self: &Arc<Self>, name: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), name.into())
    }
}
