//! Reading an [`Engine`] from its serialized form (a snapshot received from a
//! peer or read from disk): the fields as written, then one pass that makes the
//! state use memory as the commands that built it did (issue 19 §4).
//!
//! Where it sits: `engine.rs` derives the field-by-field form (serde's
//! `remote = "Self"`), unchanged, so the serialized form is the one every
//! version wrote; the `Serialize`/`Deserialize` impls here wrap it. Serde reads
//! each name as its own string, and grows each vector as a `Vec` grows (four
//! slots for the first entry); the pass below shares every name of a lease
//! (its holds, waits and remembered grants) with the lock map's key, as
//! `LockName` clones do, and trims the per-lease and per-lock vectors to their
//! length, as the engine's own one-slot growth keeps them. Nothing it changes
//! is visible: names compare by content, capacities are not state. It also
//! counts the holders and waiters, which the engine keeps as they change.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

use super::dedup::{Answer, Outcome};
use super::Engine;
use crate::LockName;

impl Serialize for Engine {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Engine::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for Engine {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut engine = Engine::deserialize(d)?;
        engine.compact_after_decode();
        Ok(engine)
    }
}

impl Engine {
    /// Shares the leases' names with the lock map's keys, trims the small
    /// vectors and counts holders and waiters (see the module docs). A name
    /// whose lock has no entry (a remembered grant since released) keeps its
    /// own string.
    fn compact_after_decode(&mut self) {
        let locks = &self.locks;
        let shared = |name: &mut LockName| {
            if let Some((key, _)) = locks.get_key_value(name.as_str()) {
                *name = key.clone();
            }
        };
        for lease in self.leases.values_mut() {
            lease.holds.values_mut().for_each(shared);
            lease.waits.change(|waits| waits.values_mut().for_each(shared));
            lease.dedup.shrink_to_fit();
            lease.dedup.names_mut().for_each(shared);
        }
        for lock in self.locks.values_mut().map(Arc::make_mut) {
            lock.holders.shrink_to_fit();
            lock.queue.change(|queue| queue.shrink_to_fit());
        }
        self.counts = self.counted();
    }
}

impl Outcome {
    /// The lock name it keeps, if any (a boxed reply's names are left alone).
    pub(super) fn name_mut(&mut self) -> Option<&mut LockName> {
        match self {
            Outcome::Replied(Answer::Acquired(grant)) => Some(&mut grant.lock),
            Outcome::TimedOut(name) => Some(name),
            Outcome::Replied(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Acquire, Command, Engine, Input, LeaseId, RequestId};

    /// An engine with lease 1 holding `a` and remembering that grant, and
    /// lease 2 waiting for `a`.
    fn engine() -> Engine {
        let mut e = Engine::new();
        let grant = |req| Command::GrantLease { req: RequestId(req), ttl_ms: 60_000, id: None };
        let acquire = |lease, wait_ms| Command::Acquire(Acquire::exclusive(RequestId(7), LeaseId(lease), "a", wait_ms));
        e.step(&Input::Batch { now: 1, cmds: vec![grant(1), grant(2), acquire(1, 0), acquire(2, 5_000)] });
        e
    }

    /// A snapshot reads back to an equal engine whose leases share the lock
    /// map's name (holds, waits, remembered grants) and whose per-lock
    /// vectors hold no spare slots, as the engine that wrote it.
    #[test]
    fn a_decoded_engine_shares_names_and_keeps_vectors_exact() {
        let e = engine();
        let back: Engine = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back, e);
        let (key, lock) = back.locks.get_key_value("a").expect("a is held");
        let same = |n: &crate::LockName| std::ptr::eq(n.as_str(), key.as_str());
        let (one, two) = (&back.leases[&LeaseId(1)], &back.leases[&LeaseId(2)]);
        assert!(one.holds.values().all(same) && two.waits.values().all(same));
        let mut remembered = one.dedup.clone();
        assert_eq!(remembered.names_mut().map(|n| same(n)).collect::<Vec<_>>(), [true]);
        assert_eq!((lock.holders.capacity(), lock.queue.capacity()), (1, 1));
    }
}
