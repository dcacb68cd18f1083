//! The timer index: every pending deadline, in the order it fires.
//!
//! A timer is `(at, kind)`; the derived order sorts by instant, then by kind
//! (lease expiries, then lock reopenings, then wait timeouts), then by id, so
//! timers due at the same instant fire in the same order on every replica.
//!
//! Each kind is kept in an ordered set of its own, by `(instant, id)`: the
//! expiry every lease has is 16 bytes, where one set of [`Timer`]s gave each
//! entry the 32 bytes of its largest kind (issue 38 §3). The next timer is the
//! earliest of the three sets' first ones (by instant, then kind, as the
//! derived order has it), and the index serializes as the one ordered set of
//! `Timer`s it was (the three sets merged in that order), so snapshots of
//! either read as the other.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

/// Which set a timer is in, in the order of [`TimerKind`]'s variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Set {
    LeaseEnds,
    Reopens,
    WaitEnds,
}

/// Pending timers, each kind by instant then id; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Timers {
    lease_ends: CowSet<(Millis, LeaseId)>,
    reopens: CowSet<(Millis, LockName)>,
    wait_ends: CowSet<(Millis, LeaseId, RequestId)>,
}

impl Timers {
    pub fn insert(&mut self, at: Millis, kind: TimerKind) {
        match kind {
            TimerKind::LeaseEnd(lease) => self.lease_ends.insert((at, lease)),
            TimerKind::Reopen(lock) => self.reopens.insert((at, lock)),
            TimerKind::WaitEnd(lease, req) => self.wait_ends.insert((at, lease, req)),
        };
    }

    pub fn remove(&mut self, at: Millis, kind: TimerKind) {
        match kind {
            TimerKind::LeaseEnd(lease) => self.lease_ends.remove(&(at, lease)),
            TimerKind::Reopen(lock) => self.reopens.remove(&(at, lock)),
            TimerKind::WaitEnd(lease, req) => self.wait_ends.remove(&(at, lease, req)),
        };
    }

    pub fn next_at(&self) -> Option<Millis> {
        self.earliest().map(|(at, _)| at)
    }

    /// The instant of the first timer to fire, and the set it is in.
    fn earliest(&self) -> Option<(Millis, Set)> {
        let lease_end = self.lease_ends.first().map(|(at, _)| (*at, Set::LeaseEnds));
        let reopen = self.reopens.first().map(|(at, _)| (*at, Set::Reopens));
        let wait_end = self.wait_ends.first().map(|(at, ..)| (*at, Set::WaitEnds));
        [lease_end, reopen, wait_end].into_iter().flatten().min()
    }

    /// Take the earliest timer if it is due at `now`.
    pub fn pop_due(&mut self, now: Millis) -> Option<Timer> {
        let (at, set) = self.earliest().filter(|(at, _)| *at <= now)?;
        let kind = match set {
            Set::LeaseEnds => TimerKind::LeaseEnd(self.lease_ends.pop_first()?.1),
            Set::Reopens => TimerKind::Reopen(self.reopens.pop_first()?.1),
            Set::WaitEnds => self.wait_ends.pop_first().map(|(_, lease, req)| TimerKind::WaitEnd(lease, req))?,
        };
        Some(Timer { at, kind })
    }

    /// Exactly these timers, given in any order: built in bulk, which a leader
    /// change needs for every lease at once (see `Engine::leader_start`).
    pub fn rebuild(
        &mut self,
        lease_ends: Vec<(Millis, LeaseId)>,
        reopens: Vec<(Millis, LockName)>,
        wait_ends: Vec<(Millis, LeaseId, RequestId)>,
    ) {
        *self = Timers {
            lease_ends: CowSet::from_sorted(lease_ends),
            reopens: CowSet::from_sorted(reopens),
            wait_ends: CowSet::from_sorted(wait_ends),
        };
    }

    /// Every timer, in the order they fire (the order of [`Timer`]).
    fn iter(&self) -> impl Iterator<Item = Timer> + '_ {
        let lease_ends = self.lease_ends.iter().map(|(at, lease)| Timer { at: *at, kind: TimerKind::LeaseEnd(*lease) });
        let reopens = self.reopens.iter().map(|(at, lock)| Timer { at: *at, kind: TimerKind::Reopen(lock.clone()) });
        let wait_ends =
            self.wait_ends.iter().map(|(at, lease, req)| Timer { at: *at, kind: TimerKind::WaitEnd(*lease, *req) });
        merge(merge(lease_ends, reopens), wait_ends)
    }
}

/// The timers of two iterators in order, each in order already.
fn merge<'a>(
    a: impl Iterator<Item = Timer> + 'a,
    b: impl Iterator<Item = Timer> + 'a,
) -> impl Iterator<Item = Timer> + 'a {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || {
        let b_first = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => y < x,
            (x, _) => x.is_none(),
        };
        match b_first {
            true => b.next(),
            false => a.next(),
        }
    })
}

/// As the newtype of the set of [`Timer`]s it was (`Timers(CowSet<Timer>)`,
/// derived): a sequence, in firing order.
impl Serialize for Timers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_newtype_struct("Timers", &InOrder(self))
    }
}

/// The timers of a [`Timers`], serialized as a sequence in firing order.
struct InOrder<'a>(&'a Timers);

impl Serialize for InOrder<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

/// Reads the newtype, then its sequence, one timer at a time into its set.
struct Each;

impl<'de> Visitor<'de> for Each {
    type Value = Timers;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence of timers")
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Timers, D::Error> {
        d.deserialize_seq(Each)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut timers: A) -> Result<Timers, A::Error> {
        let mut out = Timers::default();
        while let Some(Timer { at, kind }) = timers.next_element()? {
            out.insert(at, kind);
        }
        Ok(out)
    }
}

impl<'de> Deserialize<'de> for Timers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct("Timers", Each)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn kind() -> impl Strategy<Value = TimerKind> {
        let lease = (1u64..4).prop_map(LeaseId);
        prop_oneof![
            lease.clone().prop_map(TimerKind::LeaseEnd),
            prop::sample::select(vec!["a", "b", "c"]).prop_map(|n| TimerKind::Reopen(LockName::new(n).unwrap())),
            (lease, (1u64..4).prop_map(RequestId)).prop_map(|(l, r)| TimerKind::WaitEnd(l, r)),
        ]
    }

    fn timer() -> impl Strategy<Value = Timer> {
        (0u64..6, kind()).prop_map(|(at, kind)| Timer { at, kind })
    }

    proptest! {
        /// The three sets fire, and serialize, as the one ordered set of
        /// timers they replace: the same timers in the same order, however
        /// they were inserted and removed, and a snapshot of either reads as
        /// the other.
        #[test]
        fn fire_and_serialize_as_one_ordered_set(
            added in prop::collection::vec(timer(), 0..40),
            removed in prop::collection::vec(timer(), 0..20),
            now in 0u64..7,
        ) {
            let (mut timers, mut model) = (Timers::default(), BTreeSet::new());
            for t in added {
                timers.insert(t.at, t.kind.clone());
                model.insert(t);
            }
            for t in removed {
                timers.remove(t.at, t.kind.clone());
                model.remove(&t);
            }
            let json = serde_json::to_string(&timers).unwrap();
            prop_assert_eq!(&json, &serde_json::to_string(&model).unwrap());
            prop_assert!(serde_json::from_str::<Timers>(&json).unwrap() == timers);
            prop_assert_eq!(timers.next_at(), model.first().map(|t| t.at));
            let due: Vec<Timer> = std::iter::from_fn(|| timers.pop_due(now)).collect();
            let model_due: Vec<Timer> = model.iter().take_while(|t| t.at <= now).cloned().collect();
            prop_assert_eq!(due, model_due);
        }
    }
}
