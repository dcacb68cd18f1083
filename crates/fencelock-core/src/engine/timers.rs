//! The timer index: every pending deadline, in the order it fires.
//!
//! A timer is `(at, kind)`; the derived order sorts by instant, then by kind
//! (lease expiries, then lock reopenings, then wait timeouts), then by id, so
//! timers due at the same instant fire in the same order on every replica.

use serde::{Deserialize, Serialize};

use super::cowmap::CowSet;
use crate::{LeaseId, LockName, Millis, RequestId};

/// What a timer does when it fires. Variant order is the tie-break order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum TimerKind {
    /// The lease's deadline passed: it expires.
    LeaseEnd(LeaseId),
    /// The lock's lock-delay is over: it reopens.
    Reopen(LockName),
    /// The queued acquire `(lease, req)` waited long enough.
    WaitEnd(LeaseId, RequestId),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Timer {
    pub at: Millis,
    pub kind: TimerKind,
}

/// Pending timers, earliest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Timers(CowSet<Timer>);

impl Timers {
    pub fn insert(&mut self, at: Millis, kind: TimerKind) {
        self.0.insert(Timer { at, kind });
    }

    pub fn remove(&mut self, at: Millis, kind: TimerKind) {
        self.0.remove(&Timer { at, kind });
    }

    pub fn next_at(&self) -> Option<Millis> {
        self.0.first().map(|t| t.at)
    }

    /// Take the earliest timer if it is due at `now`.
    pub fn pop_due(&mut self, now: Millis) -> Option<Timer> {
        if self.next_at()? > now {
            return None;
        }
        self.0.pop_first()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}
