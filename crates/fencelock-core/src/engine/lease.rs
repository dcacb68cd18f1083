//! Lease commands and lease ends: `GrantLease`, `KeepAlive`, `Revoke`, expiry.

use super::{cowmap::CowSet, state::Lease, Effects, Engine, TimerKind};
use crate::validate::{check_req, check_ttl};
use crate::*;

impl Engine {
    /// A new lease with id `proposed` (or the counter's next), owned by `owner`.
    /// A retry (same `req`) gets the lease it created, if the same owner asks.
    pub(super) fn grant_lease(
        &mut self,
        req: RequestId,
        ttl_ms: u64,
        proposed: Option<LeaseId>,
        owner: Option<&str>,
    ) -> Reply {
        if let Err(e) = check_req(req).and(check_ttl(ttl_ms)) {
            return Reply::Rejected(e);
        }
        if let Some(id) = self.grant_reqs.get(&req).copied() {
            return self.lease_granted(id, owner);
        }
        let deadline = self.now.saturating_add(ttl_ms);
        let lease = Lease::new(ttl_ms, deadline, req, owner);
        let id = match proposed {
            Some(id) if id.0 == 0 => return Reply::Rejected(EngineError::LeaseIdTaken(id)),
            // One search of the lease map, which the server's random ids make
            // a cache miss at a random place (a taken id changes nothing).
            Some(id) => match self.leases.try_insert(id, lease) {
                Ok(()) => id,
                Err(_) => return Reply::Rejected(EngineError::LeaseIdTaken(id)),
            },
            None => {
                let id = self.next_counter_id();
                self.leases.insert(id, lease);
                id
            }
        };
        if let Some(o) = owner {
            self.owned.get_or_insert_with(o.to_string(), CowSet::default).1.insert(id);
        }
        self.grant_reqs.insert(req, id);
        self.timers.insert(deadline, TimerKind::LeaseEnd(id));
        Reply::LeaseGranted { lease: id, ttl_ms }
    }

    /// The counter's next id that no live lease has (a proposed id may have
    /// taken one).
    fn next_counter_id(&mut self) -> LeaseId {
        loop {
            let id = LeaseId(self.next_lease_id);
            self.next_lease_id = self.next_lease_id.saturating_add(1);
            if !self.leases.contains_key(&id) {
                return id;
            }
        }
    }

    /// The reply to a retried `GrantLease` whose lease still lives, for `owner`.
    fn lease_granted(&self, id: LeaseId, owner: Option<&str>) -> Reply {
        match self.leases.get(&id) {
            Some(lease) if lease.owner().is_some() && lease.owner() != owner => {
                Reply::Rejected(EngineError::NotOwner { lease: id })
            }
            Some(lease) => Reply::LeaseGranted { lease: id, ttl_ms: lease.ttl() },
            None => Reply::Rejected(EngineError::LeaseNotFound(id)),
        }
    }

    pub(super) fn keep_alive(&mut self, req: RequestId, id: LeaseId) -> Reply {
        if let Err(e) = check_req(req).and(self.check_lease(id)) {
            return Reply::Rejected(e);
        }
        if let Some(reply) = self.recorded_reply(id, req) {
            return reply;
        }
        // Remembered apart from the other outcomes (see `Lease::kept`): the
        // miss noted for a record does not apply.
        self.missed.take();
        let Some(lease) = self.leases.get_mut(&id) else {
            return Reply::Rejected(EngineError::LeaseNotFound(id));
        };
        let (old, ttl_ms) = (lease.deadline, lease.ttl());
        lease.deadline = self.now.saturating_add(ttl_ms);
        lease.extended = false;
        lease.kept.get_or_insert_with(Box::default).push(req);
        let new = lease.deadline;
        self.timers.remove(old, TimerKind::LeaseEnd(id));
        self.timers.insert(new, TimerKind::LeaseEnd(id));
        Reply::LeaseKept { lease: id, ttl_ms }
    }

    pub(super) fn revoke(&mut self, req: RequestId, id: LeaseId, fx: &mut Effects) -> Reply {
        if let Err(e) = check_req(req) {
            return Reply::Rejected(e);
        }
        if !self.leases.contains_key(&id) {
            return self.revoke_retry(req, id);
        }
        self.end_lease(id, ReleaseCause::Revoked, fx);
        self.revoked.push_back((id, req));
        while self.revoked.len() > REVOKED_MEMORY {
            self.revoked.pop_front();
        }
        Reply::LeaseRevoked { lease: id }
    }

    /// A revoke of a lease that is gone: a retry of a revoke that succeeded, or
    /// an error.
    fn revoke_retry(&self, req: RequestId, id: LeaseId) -> Reply {
        if self.revoked.contains(&(id, req)) {
            Reply::LeaseRevoked { lease: id }
        } else {
            Reply::Rejected(EngineError::LeaseNotFound(id))
        }
    }

    /// The lease timer fired.
    pub(super) fn expire_lease(&mut self, id: LeaseId, fx: &mut Effects) {
        if self.leases.contains_key(&id) {
            fx.push(Effect::LeaseExpired { lease: id });
            self.end_lease(id, ReleaseCause::Expired, fx);
        }
    }

    /// Remove the lease, then release its grants (in token order) and drop its
    /// waits (in request order). Its waiters are not live any more, so a release
    /// never hands a lock to the lease's own queued request (INV-4). (The
    /// dead-waiter mutant, see `crate::mutants`, leaves the waits queued.)
    fn end_lease(&mut self, id: LeaseId, cause: ReleaseCause, fx: &mut Effects) {
        let Some(lease) = self.leases.remove(&id) else {
            return;
        };
        self.timers.remove(lease.deadline, TimerKind::LeaseEnd(id));
        if let Some(o) = lease.owner() {
            self.disown(o, id);
        }
        if self.grant_reqs.get(&lease.grant_req) == Some(&id) {
            self.grant_reqs.remove(&lease.grant_req);
        }
        for (token, lock) in &lease.holds {
            self.end_grant(lock, id, *token, cause, fx);
        }
        if super::dead_waiter_mutant() {
            return;
        }
        for (req, lock) in lease.waits.iter() {
            self.end_wait(lock, id, *req, WaitEnd::LeaseEnded, fx);
        }
    }

    fn disown(&mut self, owner: &str, id: LeaseId) {
        if let Some(ids) = self.owned.get_mut(owner) {
            ids.remove(&id);
            if ids.is_empty() {
                self.owned.remove(owner);
            }
        }
    }

    pub(super) fn check_lease(&self, id: LeaseId) -> Result<(), EngineError> {
        match self.leases.contains_key(&id) {
            true => Ok(()),
            false => Err(EngineError::LeaseNotFound(id)),
        }
    }
}
