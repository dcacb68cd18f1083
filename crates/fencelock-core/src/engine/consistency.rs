//! [`Engine::check_consistency`]: the structural rules every engine state meets,
//! checked on a decoded snapshot before it is installed.
//!
//! Where it sits: deserializing an [`Engine`] does not re-validate it (names and
//! cross-references are trusted because they only enter through validated
//! commands). A snapshot received from a peer, or read from disk, is input all the
//! same: the server calls this on it before installing it, so a crafted or
//! corrupted snapshot is refused instead of being served (or panicking later).

use super::Engine;
use crate::validate::check_ttl;
use crate::*;

impl Engine {
    /// Checks that the state is one the engine itself could have reached: valid
    /// names and TTLs, tokens below their counter, lease ids not 0 (they may be
    /// above the counter: a server proposes random ones), at most one holder
    /// per exclusive grant and no more permits than a semaphore has (INV-15), every hold and wait recorded on both its lease and
    /// its lock (a multi-acquire's wait on every one of its locks), and the owner index matching the leases' owners. Says what is
    /// wrong with the first breach found.
    pub fn check_consistency(&self) -> Result<(), String> {
        if self.next_token == 0 || self.next_lease_id == 0 {
            return Err("the token and lease counters start at 1".into());
        }
        self.check_leases()?;
        self.check_locks()?;
        self.check_slots()?;
        self.check_owned()
    }

    /// Completed slots: valid lock and slot names, at most
    /// [`MAX_SLOTS_PER_LOCK`] per lock, tokens below their counter.
    fn check_slots(&self) -> Result<(), String> {
        for (name, slots) in &self.slots {
            check_name(name)?;
            if slots.len() > MAX_SLOTS_PER_LOCK {
                return Err(format!(
                    "lock {name:?} has {} completed slots (at most {MAX_SLOTS_PER_LOCK})",
                    slots.len()
                ));
            }
            for (slot, r) in slots {
                crate::validate::check_slot(slot).map_err(|e| format!("lock {name:?}: {e}"))?;
                if r.token.0 == 0 || r.token.0 >= self.next_token {
                    return Err(format!("lock {name:?}: slot {slot:?} names token {}, never issued", r.token));
                }
            }
        }
        Ok(())
    }

    /// [`Engine::owned`] lists exactly the leases that have an owner, under it.
    fn check_owned(&self) -> Result<(), String> {
        let mut want: std::collections::BTreeMap<&str, std::collections::BTreeSet<LeaseId>> = Default::default();
        for (id, lease) in &self.leases {
            if let Some(o) = lease.owner() {
                want.entry(o).or_default().insert(*id);
            }
        }
        let have: std::collections::BTreeMap<&str, std::collections::BTreeSet<LeaseId>> =
            self.owned.iter().map(|(o, ids)| (o.as_str(), ids.iter().copied().collect())).collect();
        match have == want {
            true => Ok(()),
            false => Err("the index of leases by owner does not match the leases' owners".into()),
        }
    }

    fn check_leases(&self) -> Result<(), String> {
        for (id, lease) in &self.leases {
            if id.0 == 0 {
                return Err("lease id 0 is never issued".into());
            }
            check_ttl(lease.ttl()).map_err(|e| format!("lease {id}: {e}"))?;
            let kept = lease.kept.as_ref().map_or(0, |k| k.len());
            if lease.dedup.len() > DEDUP_PER_LEASE || kept > KEEPALIVES_PER_LEASE {
                return Err(format!(
                    "lease {id} remembers {} outcomes and {kept} keep-alives (at most {DEDUP_PER_LEASE} and \
                     {KEEPALIVES_PER_LEASE})",
                    lease.dedup.len()
                ));
            }
            for (token, name) in &lease.holds {
                check_name(name)?;
                let held = self.locks.get(name).and_then(|l| l.holder(*id, *token));
                if held.is_none() {
                    return Err(format!(
                        "lease {id} holds {name:?} with token {token}, but the lock has no such holder"
                    ));
                }
            }
            for (req, name) in lease.waits.iter() {
                check_name(name)?;
                let lock = self.locks.get(name);
                let Some(w) = lock.and_then(|l| l.waiter(*id, *req).and_then(|i| l.queue.get(i))) else {
                    return Err(format!(
                        "lease {id} waits for {name:?} (request {}), but the lock has no such waiter",
                        req.0
                    ));
                };
                self.check_group(*id, *req, name, &w.all)?;
            }
        }
        Ok(())
    }

    /// A multi-acquire (INV-18) is recorded under its first lock, and waits in
    /// the queue of every one of its locks.
    fn check_group(&self, id: LeaseId, req: RequestId, first: &LockName, all: &[LockName]) -> Result<(), String> {
        if all.is_empty() {
            return Ok(());
        }
        if all.first() != Some(first) {
            return Err(format!("lease {id}: a multi-acquire (request {}) is not recorded by its first lock", req.0));
        }
        for name in all {
            if self.locks.get(name).and_then(|l| l.waiter(id, req)).is_none() {
                return Err(format!(
                    "lease {id} waits for {name:?} in a multi-acquire (request {}), but the lock has no such waiter",
                    req.0
                ));
            }
        }
        Ok(())
    }

    fn check_locks(&self) -> Result<(), String> {
        for (name, lock) in &self.locks {
            check_name(name)?;
            if !lock.holders_fit() {
                return Err(format!("lock {name:?} has {} holders that do not fit together", lock.holders.len()));
            }
            for h in lock.holders.iter() {
                if h.token.0 == 0 || h.token.0 >= self.next_token {
                    return Err(format!(
                        "lock {name:?}: token {} is not below the next token {}",
                        h.token, self.next_token
                    ));
                }
                let recorded = self.leases.get(&h.lease).and_then(|l| l.holds.get(&h.token));
                if recorded != Some(name) {
                    return Err(format!(
                        "lock {name:?} is held by lease {} with token {}, but the lease does not hold it",
                        h.lease, h.token
                    ));
                }
            }
            for w in lock.queue.iter() {
                // A multi-acquire is recorded under its first lock, and waits in
                // the queue of each of its locks (INV-18).
                let recorded = self.leases.get(&w.lease).and_then(|l| l.waits.get(&w.req));
                let in_group = w.all.is_empty() || w.all.contains(name);
                if recorded != Some(w.first(name)) || !in_group {
                    return Err(format!(
                        "lock {name:?} queues lease {} (request {}), but the lease does not wait for it",
                        w.lease, w.req.0
                    ));
                }
                check_waiter_slot(name, w)?;
            }
        }
        Ok(())
    }
}

/// A waiter's slot, if it has one, is a valid slot name of a single acquire
/// (a multi-acquire runs once per no slot).
fn check_waiter_slot(name: &LockName, w: &super::state::Waiter) -> Result<(), String> {
    if w.once_per.is_empty() {
        return Ok(());
    }
    let at = || format!("lock {name:?}: waiter of lease {} (request {})", w.lease, w.req.0);
    crate::validate::check_slot(&w.once_per).map_err(|e| format!("{}: {e}", at()))?;
    match w.all.is_empty() {
        true => Ok(()),
        false => Err(format!("{}: a multi-acquire with a slot", at())),
    }
}

fn check_name(name: &LockName) -> Result<(), String> {
    LockName::new(name.as_str()).map(drop).map_err(|e| format!("lock name {name:?}: {e}"))
}
