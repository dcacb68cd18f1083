//! Lock commands and lock transitions: `Acquire`, `Release`, `SetValue`, `Downgrade`,
//! `CancelWait`, the end of a grant, lock-delay, hold-at-least and reopening
//! (the queues, their grants and wait timeouts are `queue.rs`'s).
//!
//! One rule admits every grant, for read-write locks and semaphores alike: the
//! request fits beside the current holders ([`super::state::Lock::admits`],
//! INV-15) and nobody live is queued before it (INV-3, INV-16). So a queued
//! writer holds back the readers behind it, a semaphore's large request holds
//! back the smaller ones behind it, and whenever a grant or a wait ends the queue
//! is granted from its head for as long as the head fits.

use super::{
    dedup::Outcome,
    state::{ms32, Closed, Closing, Holder, Lock, LockKind, Share},
    Effects, Engine, TimerKind,
};
use crate::validate::{check_acquire, check_cancel, check_release, check_set_value};
use crate::*;
use std::sync::Arc;

/// The arguments of [`Command::SetValue`], borrowed.
pub(super) struct SetValue<'a> {
    pub req: RequestId,
    pub lease: LeaseId,
    pub lock: &'a str,
    pub token: Token,
    pub value: &'a [u8],
}

/// The arguments of [`Command::Downgrade`], borrowed.
pub(super) struct Downgrade<'a> {
    pub req: RequestId,
    pub lease: LeaseId,
    pub lock: &'a str,
    pub token: Token,
}

/// Saturating conversion for counts and positions on the wire.
pub(super) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The kind of `lock` (the one `permits` makes when it has no entry), if
/// `permits` names it.
fn kind_for(lock: Option<&Lock>, permits: u32) -> Result<LockKind, EngineError> {
    let kind = lock.map_or(LockKind::of_permits(permits), |l| l.kind);
    match kind.permits() == permits {
        true => Ok(kind),
        false => Err(EngineError::PermitsMismatch { lock_has: kind.permits(), asked: permits }),
    }
}

/// Nobody is queued on `lock` (or it has no entry), and `share` fits beside
/// the holders of the open lock.
fn admits_now(lock: Option<&Lock>, share: Share) -> bool {
    lock.is_none_or(|l| l.queue.is_empty() && l.admits(share.mode, share.weight))
}

impl Engine {
    pub(super) fn acquire(&mut self, a: &Acquire, fx: &mut Effects) -> Reply {
        let name = match self.check_acquire(a) {
            Ok(name) => name,
            Err(e) => return Reply::Rejected(e),
        };
        if let Some(reply) = self.acquire_retry(a) {
            return reply;
        }
        if a.is_multi() {
            return self.acquire_all(a, fx);
        }
        // One search of the lock map for its kind and whether it admits `a`
        // now (a completed slot, looked at in between, changes no lock).
        let lock = self.locks.get(&name).map(|l| &**l);
        let kind = match kind_for(lock, a.permits) {
            Ok(kind) => kind,
            Err(e) => return Reply::Rejected(e),
        };
        let share = Share::of(a, kind);
        let grantable = admits_now(lock, share);
        if let Some(done) = self.once_done(&name, a) {
            let reply = done.reply();
            self.record(a.lease, a.req, Outcome::replied(reply.clone()));
            return reply;
        }
        if grantable {
            self.locks.get_or_insert_with(name.clone(), || Arc::new(Lock::of_kind(kind)));
            return self.grant_now(&name, share, a, fx);
        }
        if a.wait_ms == 0 {
            let reply = Reply::Busy(self.busy(&name));
            self.record(a.lease, a.req, Outcome::replied(reply.clone()));
            return reply;
        }
        self.enqueue(&[name], share, a)
    }

    /// Who completed the slot `a` runs once per, if that slot is done.
    fn once_done(&mut self, name: &LockName, a: &Acquire) -> Option<SlotCompletion> {
        match a.once_per.is_empty() {
            true => None,
            false => self.slot_done(name, &a.once_per),
        }
    }

    /// The kind of `name` (the one `permits` makes when it has no entry), if
    /// `permits` names it.
    pub(super) fn check_permits(&self, name: &LockName, permits: u32) -> Result<LockKind, EngineError> {
        kind_for(self.locks.get(name).map(|l| &**l), permits)
    }

    /// Validation, in this order: request id, name, wait, lock-delay,
    /// hold-at-least, identity, value, weight, lease. (The permits are checked after a retry is answered:
    /// they depend on the lock.)
    fn check_acquire(&self, a: &Acquire) -> Result<LockName, EngineError> {
        let name = check_acquire(a)?;
        self.check_lease(a.lease)?;
        Ok(name)
    }

    /// The answer to a retried acquire: still queued, granted, or remembered
    /// (a multi-acquire: remembered first, as its grants may since have ended
    /// one by one, then what it still holds).
    fn acquire_retry(&mut self, a: &Acquire) -> Option<Reply> {
        let (lease, req) = (a.lease, a.req);
        let l = self.leases.get(&lease)?;
        if let Some(name) = l.waits.get(&req) {
            let position = self.locks.get(name).and_then(|lock| lock.waiter(lease, req));
            return Some(Reply::Queued { position: count(position.unwrap_or(0)) });
        }
        if a.is_multi() {
            return self.recorded_reply(lease, req).or_else(|| self.held_all(lease, req));
        }
        if let Some(granted) = self.held_for_req(lease, req) {
            return Some(granted);
        }
        self.recorded_reply(lease, req)
    }

    /// `Acquired` with the grant `lease` holds for the acquire `req`, if any.
    fn held_for_req(&self, lease: LeaseId, req: RequestId) -> Option<Reply> {
        let l = self.leases.get(&lease)?;
        l.holds.values().find_map(|name| {
            let holder = self.locks.get(name).and_then(|lock| lock.holder_for_req(lease, req));
            holder.map(|h| Reply::Acquired(h.grant(name)))
        })
    }

    /// Nobody queued, and `share` fits beside the holders of the open lock.
    pub(super) fn can_grant_now(&self, name: &LockName, share: Share) -> bool {
        admits_now(self.locks.get(name).map(|l| &**l), share)
    }

    fn grant_now(&mut self, name: &LockName, share: Share, a: &Acquire, fx: &mut Effects) -> Reply {
        let tag = Tag::of(a);
        let grant = self.install_holder(name, a.lease, a.req, Closing::of(a), tag.clone(), share);
        let reply = Reply::Acquired(grant.clone());
        self.record(a.lease, a.req, Outcome::replied(reply.clone()));
        fx.push(Effect::Granted { grant, req: a.req, queued: false, waited_ms: 0, tag, mode: share.mode });
        reply
    }

    /// Issue the next token (INV-2) and make `lease` a holder of `name` (an
    /// entry that exists), with the identity, value, closing and share of its
    /// acquire. The hold and the grant keep the lock map's own name (shared,
    /// not the copy the command brought).
    pub(super) fn install_holder(
        &mut self,
        name: &LockName,
        lease: LeaseId,
        req: RequestId,
        closing: Closing,
        tag: Option<Box<Tag>>,
        share: Share,
    ) -> Grant {
        let token = Token(self.next_token);
        self.next_token = self.next_token.saturating_add(1);
        self.tokens_issued = self.tokens_issued.saturating_add(1);
        let (granted_at, mode, weight) = (self.now, share.mode, share.weight);
        let (lock_delay_ms, hold_at_least_ms) = (ms32(closing.lock_delay_ms), ms32(closing.hold_at_least_ms));
        let holder = Holder { lease, req, token, granted_at, lock_delay_ms, tag, mode, weight, hold_at_least_ms };
        let (name, lock) = self.locks.get_or_insert_with(name.clone(), Default::default);
        let grant = holder.grant(&name);
        Arc::make_mut(lock).add_holder(holder);
        self.counts.holders += 1;
        if let Some(l) = self.leases.get_mut(&lease) {
            l.holds.insert(token, name);
        }
        grant
    }

    pub(super) fn release(
        &mut self,
        req: RequestId,
        lease: LeaseId,
        lock: &str,
        token: Token,
        fx: &mut Effects,
    ) -> Reply {
        let name = match check_release(req, lock, token) {
            Ok(name) => name,
            Err(e) => return Reply::Rejected(e),
        };
        if !self.leases.contains_key(&lease) {
            return Reply::NotHolder;
        }
        if let Some(reply) = self.recorded_reply(lease, req) {
            return reply;
        }
        let is_grant = self.locks.get(&name).is_some_and(|l| l.holder(lease, token).is_some());
        if !is_grant {
            // Not remembered: a wrong release changes nothing at all (INV-5).
            return Reply::NotHolder;
        }
        self.end_grant(&name, lease, token, ReleaseCause::Released, fx);
        self.record(lease, req, Outcome::replied(Reply::Released));
        Reply::Released
    }

    /// [`Command::SetValue`]: a compare-and-set on the current grant, checked
    /// as a release is; a wrong one changes nothing and is not remembered (INV-5).
    pub(super) fn set_value(&mut self, s: SetValue<'_>, fx: &mut Effects) -> Reply {
        let name = match check_set_value(s.req, s.lock, s.token, s.value) {
            Ok(name) => name,
            Err(e) => return Reply::Rejected(e),
        };
        if !self.leases.contains_key(&s.lease) {
            return Reply::NotHolder;
        }
        if let Some(reply) = self.recorded_reply(s.lease, s.req) {
            return reply;
        }
        let Some(lock) = self.locks.get_mut(&name).map(Arc::make_mut) else { return Reply::NotHolder };
        let Some(holder) = lock.holder(s.lease, s.token).and_then(|i| lock.holders.get_mut(i)) else {
            return Reply::NotHolder;
        };
        holder.tag = Tag::new(Tag::identity(holder.tag.as_deref()), s.value);
        fx.push(Effect::ValueChanged { grant: holder.grant(&name), tag: holder.tag.clone() });
        self.record(s.lease, s.req, Outcome::replied(Reply::ValueSet));
        Reply::ValueSet
    }

    /// [`Command::Downgrade`]: checked as a release is; a wrong one changes
    /// nothing and is not remembered (INV-5). The readers at the head of the
    /// queue are then granted beside the downgraded holder.
    pub(super) fn downgrade(&mut self, d: Downgrade<'_>, fx: &mut Effects) -> Reply {
        let name = match check_release(d.req, d.lock, d.token) {
            Ok(name) => name,
            Err(e) => return Reply::Rejected(e),
        };
        if !self.leases.contains_key(&d.lease) {
            return Reply::NotHolder;
        }
        if let Some(reply) = self.recorded_reply(d.lease, d.req) {
            return reply;
        }
        let Some(holder) = self.exclusive_holder_mut(&name, d.lease, d.token) else {
            return Reply::NotHolder;
        };
        holder.mode = Mode::Shared;
        fx.push(Effect::Downgraded { grant: holder.grant(&name), tag: holder.tag.clone() });
        self.record(d.lease, d.req, Outcome::replied(Reply::Downgraded));
        self.grant_next(&name, fx);
        Reply::Downgraded
    }

    /// The exclusive grant `(name, lease, token)` of a read-write lock.
    fn exclusive_holder_mut(&mut self, name: &LockName, lease: LeaseId, token: Token) -> Option<&mut Holder> {
        let lock = self.locks.get_mut(name).filter(|l| l.kind == LockKind::ReadWrite).map(Arc::make_mut)?;
        let i = lock.holder(lease, token)?;
        lock.holders.get_mut(i).filter(|h| h.mode == Mode::Exclusive)
    }

    pub(super) fn cancel_wait(&mut self, req: RequestId, lease: LeaseId, lock: &str, fx: &mut Effects) -> Reply {
        let name = match check_cancel(req, lock) {
            Ok(name) => name,
            Err(e) => return Reply::Rejected(e),
        };
        let released = self.withdraw(&name, lease, req, fx);
        // A later acquire with this id is a fresh attempt.
        if let Some(l) = self.leases.get_mut(&lease) {
            l.dedup.forget(req);
        }
        Reply::Cancelled { released }
    }

    /// Withdraw the acquire `(lease, req)` of `name`: take it out of the queue
    /// (of every lock, for a multi-acquire), or release every grant of the
    /// request that is still held (all of a multi-acquire's, even when the
    /// one `name` names has ended already). Returns whether a grant ended.
    fn withdraw(&mut self, name: &LockName, lease: LeaseId, req: RequestId, fx: &mut Effects) -> bool {
        let first = self.leases.get(&lease).and_then(|l| l.waits.get(&req)).cloned();
        let queued_here = self.locks.get(name).is_some_and(|l| l.waiter(lease, req).is_some());
        if let Some(first) = first.filter(|f| f == name || queued_here) {
            self.end_wait(&first, lease, req, WaitEnd::Cancelled, fx);
            return false;
        }
        let held = self.grants_of_req(lease, req);
        for (lock, token) in &held {
            self.end_grant(lock, lease, *token, ReleaseCause::Cancelled, fx);
        }
        !held.is_empty()
    }

    /// End the grant `(name, lease, token)` if it exists, then close the lock
    /// (expiry with a lock-delay, INV-7; a hold-at-least whose time has not
    /// come, whatever the cause) or grant it to the next live waiter.
    pub(super) fn end_grant(
        &mut self,
        name: &LockName,
        lease: LeaseId,
        token: Token,
        cause: ReleaseCause,
        fx: &mut Effects,
    ) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.holds.remove(&token);
        }
        let Some(lock) = self.locks.get_mut(name).map(Arc::make_mut) else {
            return;
        };
        let Some(i) = lock.holder(lease, token) else {
            return;
        };
        let holder = lock.holders.remove(i);
        self.counts.holders -= 1;
        let has_waiters = !lock.queue.is_empty();
        let held_ms = self.now.saturating_sub(holder.granted_at);
        let (hold_left, lock_delay) = (holder.hold_left(self.now), holder.lock_delay());
        fx.push(Effect::Released { grant: holder.grant(name), held_ms, cause, tag: holder.tag });
        if cause == ReleaseCause::Expired && lock_delay > 0 {
            self.close(name, lock_delay);
        }
        if hold_left > 0 {
            self.close(name, hold_left);
        }
        if has_waiters {
            self.grant_next(name, fx);
        }
        self.drop_if_unused(name);
    }

    /// Close `name` for `delay_ms` from now, unless it is closed until later
    /// already (several holders of a shared lock or a semaphore may expire one
    /// after another: the lock reopens when the last of their delays ends).
    fn close(&mut self, name: &LockName, delay_ms: u64) {
        let until = self.now.saturating_add(delay_ms);
        let Some(lock) = self.locks.get_mut(name).map(Arc::make_mut) else {
            return;
        };
        if let Some(old) = lock.closed.as_ref().map(|c| c.until) {
            if old >= until {
                return;
            }
            self.timers.remove(old, TimerKind::Reopen(name.clone()));
        }
        lock.closed = Some(Box::new(Closed { until, delay_ms }));
        self.timers.insert(until, TimerKind::Reopen(name.clone()));
    }

    /// The lock-delay timer of `name` fired.
    pub(super) fn reopen(&mut self, name: &LockName, fx: &mut Effects) {
        if let Some(lock) = self.locks.get_mut(name).map(Arc::make_mut) {
            lock.closed = None;
        }
        self.grant_next(name, fx);
        self.drop_if_unused(name);
    }

    /// Removes the entry of `name` if it is held by nobody, nobody waits and
    /// it is open (one search of the map).
    pub(super) fn drop_if_unused(&mut self, name: &LockName) {
        self.locks.remove_if(name, |l| l.is_unused());
    }
}
