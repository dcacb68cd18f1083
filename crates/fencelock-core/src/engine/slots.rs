//! Jobs that run once per slot (issue 18 §4): the durable record of the slots
//! whose job ran to its end, [`Command::CompleteSlot`], and the answer to an
//! acquire whose [`Acquire::once_per`] slot is done.
//!
//! Where it sits: beside `lock.rs`, which calls [`Engine::slot_done`] before
//! it answers an acquire, and `queue.rs`, whose `end_slot_waiters` ends the
//! slot's waiters when it is completed (with [`WaitEnd::SlotDone`]) and which
//! calls [`Engine::waiter_slot_done`] before it grants a waiter. All of it
//! happens in the apply of an entry, so every replica gives the same answer.
//! A record is kept for [`SLOT_RETENTION_MS`] of engine time (the
//! leaders' monotonic clocks, re-based as every instant is); an old record is
//! dropped when its lock's slots are next looked at, so every replica drops
//! the same ones at the same entry. At most [`MAX_SLOTS_PER_LOCK`] records are
//! kept per lock: a new one beyond that drops the oldest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::dedup::Outcome;
use super::state::{rebase, Waiter};
use super::{Effects, Engine};
use crate::validate::check_complete;
use crate::*;

/// One completed slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlotRecord {
    pub token: Token,
    /// The identity of the grant that completed it ("" for none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    pub exit_code: i32,
    /// When it was recorded, on the engine's clock.
    pub at: Millis,
}

/// The completed slots of each lock, by slot name.
pub(crate) type Slots = BTreeMap<LockName, BTreeMap<String, SlotRecord>>;

/// The arguments of [`Command::CompleteSlot`], borrowed.
pub(super) struct CompleteSlot<'a> {
    pub req: RequestId,
    pub lease: LeaseId,
    pub lock: &'a str,
    pub token: Token,
    pub slot: &'a str,
    pub exit_code: i32,
}

impl Engine {
    /// [`Command::CompleteSlot`]: checked as a release is (a wrong one changes
    /// nothing and is not remembered, INV-5); the first completion stays.
    /// The live waiters of the lock that run once per this slot are told at
    /// once ([`Engine::end_slot_waiters`]): they need not wait for the lock
    /// (a `hold_at_least` may keep it closed long after the job ended).
    pub(super) fn complete_slot(&mut self, c: CompleteSlot<'_>, fx: &mut Effects) -> Reply {
        let name = match check_complete(c.req, c.lock, c.token, c.slot) {
            Ok(name) => name,
            Err(e) => return Reply::Rejected(e),
        };
        if !self.leases.contains_key(&c.lease) {
            return Reply::NotHolder;
        }
        if let Some(reply) = self.recorded_reply(c.lease, c.req) {
            return reply;
        }
        let holder = self.locks.get(&name).and_then(|l| l.holder(c.lease, c.token).map(|i| &l.holders[i]));
        let Some(identity) = holder.map(|h| Tag::identity(h.tag.as_deref()).to_owned()) else {
            return Reply::NotHolder;
        };
        self.prune_slots(&name);
        let record = SlotRecord { token: c.token, identity, exit_code: c.exit_code, at: self.now };
        let slots = self.slots.entry(name.clone()).or_default();
        if !slots.contains_key(c.slot) && slots.len() >= MAX_SLOTS_PER_LOCK {
            drop_oldest(slots);
        }
        slots.entry(c.slot.to_owned()).or_insert(record);
        self.record(c.lease, c.req, Outcome::replied(Reply::SlotCompleted));
        self.end_slot_waiters(&name, c.slot, fx);
        Reply::SlotCompleted
    }

    /// Who completed `slot` of `name`, if it is done (and not older than the
    /// retention).
    pub(super) fn slot_done(&mut self, name: &LockName, slot: &str) -> Option<SlotCompletion> {
        self.prune_slots(name);
        let r = self.slots.get(name)?.get(slot)?;
        Some(SlotCompletion { token: r.token, identity: r.identity.clone(), exit_code: r.exit_code })
    }

    /// Who completed the slot the waiter `w` of `name` runs once per, if it
    /// runs once per a slot and that slot is done.
    pub(super) fn waiter_slot_done(&mut self, name: &LockName, w: &Waiter) -> Option<SlotCompletion> {
        match w.once_per.is_empty() {
            true => None,
            false => self.slot_done(name, &w.once_per),
        }
    }

    /// Drop the records of `name` older than [`SLOT_RETENTION_MS`].
    fn prune_slots(&mut self, name: &LockName) {
        let now = self.now;
        let Some(slots) = self.slots.get_mut(name) else { return };
        slots.retain(|_, r| now < r.at.saturating_add(SLOT_RETENTION_MS));
        if slots.is_empty() {
            self.slots.remove(name);
        }
    }

    /// Move every record's instant onto a new leader's clock, keeping its age.
    pub(super) fn rebase_slots(&mut self, old_now: Millis, new_now: Millis) {
        for r in self.slots.values_mut().flat_map(|s| s.values_mut()) {
            r.at = rebase(r.at, old_now, new_now);
        }
    }

    /// The completed slots of `name` within their retention at `now`, the
    /// most recently recorded first.
    pub fn completed_slots(&self, now: Millis, name: &str) -> Vec<SlotInfo> {
        let Ok(name) = LockName::new(name) else { return vec![] };
        let now = now.max(self.now);
        let slots = self.slots.get(&name).into_iter().flatten();
        let fresh = slots.filter(|(_, r)| now < r.at.saturating_add(SLOT_RETENTION_MS));
        let mut out: Vec<SlotInfo> = fresh
            .map(|(s, r)| SlotInfo {
                slot: s.clone(),
                token: r.token,
                identity: r.identity.clone(),
                exit_code: r.exit_code,
                age_ms: now.saturating_sub(r.at),
            })
            .collect();
        out.sort_by_key(|s| s.age_ms);
        out
    }
}

/// Drop the record recorded first (the smallest instant; among equals, the
/// first slot name, so every replica drops the same one).
fn drop_oldest(slots: &mut BTreeMap<String, SlotRecord>) {
    let oldest = slots.iter().min_by_key(|(_, r)| r.at).map(|(s, _)| s.clone());
    if let Some(slot) = oldest {
        slots.remove(&slot);
    }
}
