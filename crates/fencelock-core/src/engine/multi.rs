//! Atomic multi-acquires ([`Acquire::also`]): several read-write locks for one
//! lease and one request, all granted in one step or none (INV-18).
//!
//! Where it sits: the one admission rule of `lock.rs` decides for each lock
//! (it fits, nobody live is queued before it); this module applies it to every
//! lock of the request at once. A multi-acquire that cannot be granted now
//! waits in the queue of every one of its locks, placed there in one step,
//! and `lock.rs`'s `grant_from` grants it when it heads every one of those
//! queues and fits in each. Since every queue is ordered by the step its
//! waiters arrived in, two multi-acquires that share locks are in the same
//! order in each shared queue: they never wait for each other in a cycle
//! (no deadlock), and no partial hold ever exists. After the grant, its
//! grants are independent (released, expiring, downgraded one by one); they
//! share the request id, so a `CancelWait` of it releases all that are held.

use super::{
    dedup::Outcome,
    state::{Lock, LockKind, Share},
    Effects, Engine,
};
use crate::validate::multi_names;
use crate::*;
use std::sync::Arc;

impl Engine {
    /// A multi-acquire that is not a retry: granted now if every lock admits
    /// it now, else `Busy` (a try: the first lock that does not) or queued on
    /// every lock.
    pub(super) fn acquire_all(&mut self, a: &Acquire, fx: &mut Effects) -> Reply {
        let names = match self.check_multi(a) {
            Ok(names) => names,
            Err(e) => return Reply::Rejected(e),
        };
        let share = Share { mode: a.mode, weight: 1 };
        let Some(blocked) = names.iter().find(|n| !self.can_grant_now(n, share)) else {
            return self.grant_all_now(&names, share, a, fx);
        };
        if a.wait_ms == 0 {
            let reply = Reply::Busy(self.busy(blocked));
            self.record(a.lease, a.req, Outcome::replied(reply.clone()));
            return reply;
        }
        self.enqueue(&names, share, a)
    }

    /// The locks of `a`, each a read-write lock (or none yet).
    fn check_multi(&self, a: &Acquire) -> Result<Vec<LockName>, EngineError> {
        let names = multi_names(a)?;
        for name in &names {
            self.check_permits(name, 0)?;
        }
        Ok(names)
    }

    fn grant_all_now(&mut self, names: &[LockName], share: Share, a: &Acquire, fx: &mut Effects) -> Reply {
        let tag = Tag::of(a);
        let closing = super::state::Closing::of(a);
        let mut grants = Vec::with_capacity(names.len());
        for name in names {
            self.locks.get_or_insert_with(name.clone(), || Arc::new(Lock::of_kind(LockKind::ReadWrite)));
            let grant = self.install_holder(name, a.lease, a.req, closing, tag.clone(), share);
            grants.push(grant.clone());
            let (tag, mode) = (tag.clone(), share.mode);
            fx.push(Effect::Granted { grant, req: a.req, queued: false, waited_ms: 0, tag, mode });
        }
        let reply = Reply::AcquiredAll(grants);
        self.record(a.lease, a.req, Outcome::replied(reply.clone()));
        reply
    }

    /// The grants of `lease` made for `req` that it still holds, in token
    /// order (for a multi-acquire: the order asked).
    pub(super) fn grants_of_req(&self, lease: LeaseId, req: RequestId) -> Vec<(LockName, Token)> {
        let Some(l) = self.leases.get(&lease) else { return Vec::new() };
        let of_req = |(token, name): (&Token, &LockName)| {
            let lock = self.locks.get(name)?;
            let h = lock.holder(lease, *token).and_then(|i| lock.holders.get(i))?;
            (h.req == req).then(|| (name.clone(), *token))
        };
        l.holds.iter().filter_map(of_req).collect()
    }

    /// `AcquiredAll` of what the multi-acquire `(lease, req)` still holds, if anything.
    pub(super) fn held_all(&self, lease: LeaseId, req: RequestId) -> Option<Reply> {
        let grants: Vec<Grant> =
            self.grants_of_req(lease, req).into_iter().map(|(lock, token)| Grant { lock, lease, token }).collect();
        (!grants.is_empty()).then_some(Reply::AcquiredAll(grants))
    }
}
