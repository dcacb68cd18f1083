//! The held lock: a grant's renewal on every node (confirmed by a majority,
//! for the TTL less the drift), and its release (a majority deleted, or
//! certainly not, or unknown).
//!
//! Where it sits: under [`super::RedlockBackend`]'s acquire, which makes the
//! guard of a grant.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::nodes::{majority_failed, Nodes, Tally};
use super::{drift, RedlockBackend};
use crate::backend::redis::{Ticket, OP_TIMEOUT};
use crate::backend::{BoxFuture, Guard, Held, KeptLease, Renew, Renewed};
use crate::error::Error;

impl RedlockBackend {
    /// The guard of a grant whose first `SET` was sent at `sent`.
    pub(super) fn grant(&self, name: &str, key: String, ticket: &Ticket, ttl: Duration, sent: Instant) -> Guard {
        let valid = ttl - drift(ttl);
        let owner = ticket.text.clone();
        let renew = Arc::new(RenewOnNodes { nodes: self.nodes.clone(), key: key.clone(), owner: owner.clone(), ttl });
        let kept = KeptLease::start(ticket.id, valid, sent, renew);
        let watch = kept.watch();
        let held = RedlockHeld { kept, nodes: self.nodes.clone(), key, owner };
        Guard::new(name.to_string(), None, "redlock", watch, Box::new(held))
    }
}

/// Renews one grant on every node.
struct RenewOnNodes {
    nodes: Arc<Nodes>,
    key: String,
    owner: String,
    /// The full TTL (what the nodes get); the lease counts `ttl − drift`.
    ttl: Duration,
}

impl Renew for RenewOnNodes {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let tally = self.nodes.renew_all(&self.key, &self.owner, self.ttl, round_end).await;
            let (n, quorum) = (self.nodes.conns.len(), self.nodes.quorum());
            if tally.yes >= quorum {
                Ok(Renewed::Confirmed(Some(self.ttl - drift(self.ttl))))
            } else if tally.no > n - quorum {
                Ok(Renewed::Gone)
            } else {
                let yes = tally.yes;
                let why = format!("renewal confirmed by {yes} of {n} nodes, a majority ({quorum}) is needed");
                Err(majority_failed(why, &tally.errors))
            }
        })
    }
}

/// A held Redlock lock: keeps the lease alive while it lives.
struct RedlockHeld {
    kept: KeptLease,
    nodes: Arc<Nodes>,
    key: String,
    owner: String,
}

impl Held for RedlockHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let RedlockHeld { kept, nodes, key, owner } = *self;
            drop(kept); // stop renewing first
            let tally = nodes.unlock_all(&key, &owner, crate::clock::now() + OP_TIMEOUT).await;
            released(&tally, nodes.quorum())
        })
    }

    fn release_in_background(self: Box<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = self.release().await;
            });
        }
    }
}

/// A release's outcome: a majority deleted (true); a majority certainly did
/// not, even counting the failed nodes as deleted (false); else unknown.
fn released(tally: &Tally, quorum: usize) -> Result<bool, Error> {
    if tally.yes >= quorum {
        Ok(true)
    } else if tally.yes + tally.errors.len() < quorum {
        Ok(false)
    } else {
        let why = format!("release confirmed by {} nodes, a majority ({quorum}) is needed", tally.yes);
        Err(majority_failed(why, &tally.errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(yes: usize, no: usize, errors: usize) -> Tally {
        Tally { yes, no, errors: vec![Error::backend("redis", "down"); errors] }
    }

    #[test]
    fn a_release_counts_a_majority() {
        assert_eq!(released(&tally(2, 1, 0), 2), Ok(true));
        assert_eq!(released(&tally(0, 3, 0), 2), Ok(false));
        assert_eq!(released(&tally(0, 2, 1), 2), Ok(false), "one failure cannot make a majority");
        assert!(released(&tally(1, 1, 1), 2).is_err(), "the failed node may have deleted: unknown");
    }
}
