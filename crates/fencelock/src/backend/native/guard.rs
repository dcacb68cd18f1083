//! [`LockGuard`]: the native server's side of a held lock, the part of a
//! [`crate::Guard`] that knows how to release a native grant.
//!
//! Where it sits: the native acquire ([`crate::backend::native::acquire`]) makes one per grant
//! and wraps it in the backend-neutral [`crate::Guard`] (the one public lock
//! handle; see `backend/native.rs`). It holds a user count on the client's
//! shared lease for its TTL (see [`crate::backend::native::registry`]), so the watchdog keeps
//! renewing while any guard lives. Releasing consumes it; dropping it releases
//! in the background.

use std::fmt;

use tokio::time::Instant;

use super::Client;
use crate::backend::native::registry::LeaseHandle;
use crate::error::Error;
use crate::lease::{LeaseLost, LeaseWatch};
use crate::metrics;
use crate::types::Grant;

/// A native grant, held.
///
/// # Release
/// [`release`](LockGuard::release) releases the lock and reports whether it was
/// still held. Dropping the guard without releasing it releases the lock in the
/// background, on the current tokio runtime (or the one the client was created
/// on); if no runtime runs any more, the lock is freed when the lease expires on
/// the server, one TTL after the last keep-alive. When the last guard of a lease
/// is gone, the lease is revoked too.
pub(crate) struct LockGuard {
    name: String,
    lease_id: u64,
    token: u64,
    watch: LeaseWatch,
    /// `None` once released.
    held: Option<Held>,
}

struct Held {
    client: Client,
    /// Held for its `Drop`: one user of the shared lease, which stays alive (and
    /// renewed) until the last user is gone.
    #[allow(dead_code)]
    lease: LeaseHandle,
    acquired_at: Instant,
}

impl LockGuard {
    pub(crate) fn new(client: Client, grant: Grant, lease: LeaseHandle) -> LockGuard {
        LockGuard {
            name: grant.lock,
            lease_id: grant.lease_id,
            token: grant.token,
            watch: LeaseWatch::new(lease.cell().clone()),
            held: Some(Held { client, lease, acquired_at: crate::clock::now() }),
        }
    }

    /// The lock name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of this grant: strictly greater than every token the
    /// service issued before it, for any lock.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// A handle on the lease state to move into another task.
    pub(crate) fn lease_watch(&self) -> LeaseWatch {
        self.watch.clone()
    }

    /// Publishes `value` with this grant if it is still current; see
    /// [`crate::Guard::set_value`].
    pub(crate) async fn set_value(&self, value: Vec<u8>) -> Result<bool, Error> {
        let Some(held) = self.held.as_ref() else { return Ok(false) };
        held.client.set_value_raw(&self.name, self.lease_id, self.token, value).await
    }

    /// Records its slot as done; see [`crate::Guard::complete_slot`].
    pub(crate) async fn complete_slot(&self, slot: String, exit_code: i32) -> Result<bool, Error> {
        let Some(held) = self.held.as_ref() else { return Ok(false) };
        held.client.complete_slot_raw(&self.name, self.lease_id, self.token, &slot, exit_code).await
    }

    /// Turns this exclusive grant into a shared one; see [`crate::Guard::downgrade`].
    pub(crate) async fn downgrade(&self) -> Result<bool, Error> {
        let Some(held) = self.held.as_ref() else { return Ok(false) };
        held.client.downgrade_raw(&self.name, self.lease_id, self.token).await
    }

    /// Releases the lock. `Ok(true)`: it was held and is now free. `Ok(false)`:
    /// this guard was not the holder any more (the lease was lost). An error means
    /// the outcome is unknown; the lock is then freed when the lease is revoked or
    /// expires.
    pub(crate) async fn release(mut self) -> Result<bool, Error> {
        let Some(held) = self.held.take() else { return Ok(false) };
        metrics::hold(held.acquired_at.elapsed());
        if let Some(reason) = self.watch.lost_reason() {
            if reason == LeaseLost::Expired {
                // The server may still hold it: free it for others.
                spawn_release(held, self.name.clone(), self.lease_id, self.token);
            }
            return Ok(false);
        }
        let released = held.client.release_raw(&self.name, self.lease_id, self.token).await;
        if let Ok(false) = released {
            tracing::debug!(lock = %self.name, token = self.token, "fencelock: released a lock no longer held");
        }
        drop(held); // after the release, so the lease outlives it
        released
    }
}

/// Releases in the background, then drops the lease handle.
fn spawn_release(held: Held, name: String, lease_id: u64, token: u64) {
    let runtime = held.client.runtime();
    runtime.spawn(async move {
        if let Err(e) = held.client.release_raw(&name, lease_id, token).await {
            tracing::debug!(lock = %name, token, error = %e, "fencelock: background release failed");
        }
        drop(held);
    });
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            metrics::hold(held.acquired_at.elapsed());
            if self.watch.lost_reason().is_some_and(|r| r != LeaseLost::Expired) {
                return; // the server has dropped the grant already
            }
            spawn_release(held, std::mem::take(&mut self.name), self.lease_id, self.token);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("lease_id", &self.lease_id)
            .field("token", &self.token)
            .field("lost", &self.watch.lost_reason())
            .finish_non_exhaustive()
    }
}
