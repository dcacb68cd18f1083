//! [`MultiGuard`]: the locks of one atomic multi-lock
//! ([`super::LockBackend::acquire_all`]), held together.
//!
//! Where it sits: a backend that declares [`super::Capabilities::multi_lock`]
//! answers a multi-lock with one ordinary [`Guard`] per lock, in the order
//! named, all on one lease; this type keeps them together. Each guard has its
//! own fencing token: a resource protected by lock `x` checks the token of
//! `x`'s guard, as for a single lock. The guards may be taken apart
//! ([`MultiGuard::into_guards`]) and released one by one.

use std::fmt;
use std::future::Future;
use std::task::Poll;

use tokio::time::Instant;

use super::Guard;
use crate::error::Error;
use crate::lease::LeaseLost;

/// Every lock of one multi-lock, held: one [`Guard`] per lock, in the order
/// named. Dropping it drops each guard (each releases its lock in the
/// background).
///
/// # Examples
///
/// `acquire_all` is a method of the [`LockBackend`](crate::LockBackend) trait,
/// which must be in scope. Each resource checks the token of its own lock.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, LockBackend, LockOptions, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let opts = LockOptions::default().wait(Duration::from_secs(30));
/// let outcome = client.acquire_all(&["accounts/a", "accounts/b"], &opts).await?;
/// if let Outcome::Acquired(all) = outcome {
///     let (a, b) = (all.guards()[0].fencing_token()?, all.guards()[1].fencing_token()?);
///     tokio::select! {
///         _ = transfer(a, b) => {}
///         reason = all.lost() => eprintln!("locks lost ({reason})"),
///     }
///     all.release().await?;
/// }
/// # Ok(()) }
/// # async fn transfer(_token_a: u64, _token_b: u64) {}
/// ```
pub struct MultiGuard {
    guards: Vec<Guard>,
}

impl MultiGuard {
    /// The guards of one multi-lock grant, in the order named. For backend
    /// implementations.
    pub(crate) fn new(guards: Vec<Guard>) -> MultiGuard {
        MultiGuard { guards }
    }

    /// The guards, one per lock, in the order named.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// The guard of the lock `name`, if it is one of them.
    pub fn get(&self, name: &str) -> Option<&Guard> {
        self.guards.iter().find(|g| g.name() == name)
    }

    /// Each lock with its fencing token, in the order named.
    pub fn tokens(&self) -> Vec<(&str, Option<u64>)> {
        self.guards.iter().map(|g| (g.name(), g.token())).collect()
    }

    /// The guards, to keep or release one by one.
    pub fn into_guards(self) -> Vec<Guard> {
        self.guards
    }

    /// The earliest of the guards' deadlines (see [`Guard::deadline`]).
    pub fn deadline(&self) -> Instant {
        self.guards.iter().map(Guard::deadline).min().unwrap_or_else(crate::clock::now)
    }

    /// True once any of the locks is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(Guard::is_lost)
    }

    /// Resolves when any of the locks is lost (they share one lease, so it is
    /// lost with all of them). Cancel-safe.
    pub async fn lost(&self) -> LeaseLost {
        let mut each: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        std::future::poll_fn(|cx| {
            each.iter_mut()
                .find_map(|f| match f.as_mut().poll(cx) {
                    Poll::Ready(reason) => Some(Poll::Ready(reason)),
                    Poll::Pending => None,
                })
                .unwrap_or(Poll::Pending)
        })
        .await
    }

    /// Releases every lock. `Ok(true)`: each was held and is now free;
    /// `Ok(false)`: at least one was lost before (see [`Guard::release`]).
    /// Every release is tried; the first error is returned (the outcome of
    /// that lock is unknown, and it is freed when the lease expires).
    pub async fn release(self) -> Result<bool, Error> {
        let mut all = Ok(true);
        for g in self.guards {
            all = match (all, g.release().await) {
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                (Ok(a), Ok(b)) => Ok(a && b),
            };
        }
        all
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard").field("guards", &self.guards).finish()
    }
}
