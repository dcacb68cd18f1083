//! [`Outcome`], what every backend's acquire answers: the grant, or
//! contention as an outcome (busy, timed out), never as an error.

use std::time::Duration;

use super::Guard;
use crate::error::NotAcquired;

/// The outcome of an acquire. Contention is an outcome, not an error.
///
/// `G` is what a grant gives: a [`crate::Guard`] (kept alive, released on drop)
/// for [`crate::LockBackend::acquire`] and [`crate::LockRequest::acquire`]; a bare [`crate::Grant`] for
/// [`crate::Client::acquire_detached`] and [`crate::Session::acquire`].
///
/// # Examples
///
/// `?` passes errors on, not contention: a busy lock is `Busy`, never an `Err`.
/// `Busy` answers a try (no wait), `TimedOut` a wait that ran out.
///
/// ```no_run
/// use fencelock::{Client, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// match client.lock("reports/daily").acquire().await? {
///     Outcome::Acquired(guard) => {
///         // ... build the report, writing with guard.fencing_token()? ...
///         guard.release().await?;
///     }
///     Outcome::Busy { holder_token, reopens_in, .. } => {
///         println!("busy: token {holder_token:?} holds it, or it reopens in {reopens_in:?}")
///     }
///     Outcome::TimedOut => println!("not granted within the wait"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "an acquired lock is held until its guard is released or dropped"]
pub enum Outcome<G = Guard> {
    /// The lock is held.
    Acquired(G),
    /// The wait was zero and the lock is held by someone (or closed by lock-delay).
    Busy {
        /// The holder's lease, if the lock is held.
        holder_lease: Option<u64>,
        /// The holder's fencing token, if the lock is held.
        holder_token: Option<u64>,
        /// Time until a lock-delay reopens the lock, if one is running.
        reopens_in: Option<Duration>,
        /// Number of queued requests.
        waiters: u32,
    },
    /// The wait ran out before the lock could be granted.
    TimedOut,
}

impl<G> Outcome<G> {
    /// Applies `f` to the grant, keeping the other outcomes.
    pub fn map<H>(self, f: impl FnOnce(G) -> H) -> Outcome<H> {
        match self {
            Outcome::Acquired(g) => Outcome::Acquired(f(g)),
            Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
                Outcome::Busy { holder_lease, holder_token, reopens_in, waiters }
            }
            Outcome::TimedOut => Outcome::TimedOut,
        }
    }

    /// The grant, or the contention outcome as [`NotAcquired`].
    pub fn acquired(self) -> Result<G, NotAcquired> {
        match self {
            Outcome::Acquired(g) => Ok(g),
            Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
                Err(NotAcquired::Busy { holder_lease, holder_token, reopens_in, waiters })
            }
            Outcome::TimedOut => Err(NotAcquired::TimedOut),
        }
    }

    /// The metric label of this outcome.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Outcome::Acquired(_) => "acquired",
            Outcome::Busy { .. } => "busy",
            Outcome::TimedOut => "timed_out",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquired_maps_contention_to_not_acquired() {
        let busy: Outcome<()> = Outcome::Busy {
            holder_lease: None,
            holder_token: None,
            reopens_in: Some(Duration::from_millis(30)),
            waiters: 0,
        };
        assert_eq!(
            busy.acquired(),
            Err(NotAcquired::Busy {
                holder_lease: None,
                holder_token: None,
                reopens_in: Some(Duration::from_millis(30)),
                waiters: 0
            })
        );
        assert_eq!(Outcome::<()>::TimedOut.acquired(), Err(NotAcquired::TimedOut));
        assert_eq!(Outcome::Acquired(5).map(|x| x * 2).acquired(), Ok(10));
    }
}
