//! Lock commands and lock transitions: `Acquire`, `Release`, `SetValue`, `Downgrade`,
//! `CancelWait`, the grants to the next waiters, wait timeouts, lock-delay,
//! hold-at-least and reopening.
//!
//! One rule admits every grant, for read-write locks and semaphores alike: the
//! request fits beside the current holders ([`super::state::Lock::admits`],
//! INV-15) and nobody live is queued before it (INV-3, INV-16). So a queued
//! writer holds back the readers behind it, a semaphore's large request holds
//! back the smaller ones behind it, and whenever a grant or a wait ends the queue
//! is granted from its head for as long as the head fits.

use super::{
    state::{Closed, Closing, Holder, Lock, LockKind, Outcome, Share, Waiter},
    Effects, Engine, TimerKind,
};
use crate::validate::{check_acquire, check_cancel, check_release, check_set_value};
use crate::*;

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
        let kind = match self.check_permits(&name, a.permits) {
            Ok(kind) => kind,
            Err(e) => return Reply::Rejected(e),
        };
        if let Some(done) = self.once_done(&name, a) {
            self.record(a.lease, a.req, Outcome::Replied(done.clone()));
            return done;
        }
        let share = Share::of(a, kind);
        if self.can_grant_now(&name, share) {
            self.locks.entry(name.clone()).or_insert_with(|| Lock::of_kind(kind));
            return self.grant_now(&name, share, a, fx);
        }
        if a.wait_ms == 0 {
            let reply = Reply::Busy(self.busy(&name));
            self.record(a.lease, a.req, Outcome::Replied(reply.clone()));
            return reply;
        }
        self.enqueue(&[name], share, a)
    }

    /// [`Reply::SlotDone`] when `a` runs once per a slot that is done.
    fn once_done(&mut self, name: &LockName, a: &Acquire) -> Option<Reply> {
        match a.once_per.is_empty() {
            true => None,
            false => self.slot_done(name, &a.once_per),
        }
    }

    /// The kind of `name` (the one `permits` makes when it has no entry), if
    /// `permits` names it.
    pub(super) fn check_permits(&self, name: &LockName, permits: u32) -> Result<LockKind, EngineError> {
        let kind = self.locks.get(name).map_or(LockKind::of_permits(permits), |l| l.kind);
        match kind.permits() == permits {
            true => Ok(kind),
            false => Err(EngineError::PermitsMismatch { lock_has: kind.permits(), asked: permits }),
        }
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
    fn acquire_retry(&self, a: &Acquire) -> Option<Reply> {
        let (lease, req) = (a.lease, a.req);
        let l = self.leases.get(&lease)?;
        if let Some(name) = l.waits.get(&req) {
            let position = self.locks.get(name).and_then(|lock| lock.waiter(lease, req));
            return Some(Reply::Queued { position: count(position.unwrap_or(0)) });
        }
        if a.is_multi() {
            return self.recorded_reply(lease, req).or_else(|| self.held_all(lease, req));
        }
        for name in l.holds.values() {
            let holder = self.locks.get(name).and_then(|lock| lock.holder_for_req(lease, req));
            if let Some(h) = holder {
                return Some(Reply::Acquired(h.grant(name)));
            }
        }
        self.recorded_reply(lease, req)
    }

    /// Nobody queued, and `share` fits beside the holders of the open lock.
    pub(super) fn can_grant_now(&self, name: &LockName, share: Share) -> bool {
        self.locks.get(name).is_none_or(|l| l.queue.is_empty() && l.admits(share.mode, share.weight))
    }

    fn grant_now(&mut self, name: &LockName, share: Share, a: &Acquire, fx: &mut Effects) -> Reply {
        let tag = Tag::of(a);
        let grant = self.install_holder(name, a.lease, a.req, Closing::of(a), tag.clone(), share);
        let reply = Reply::Acquired(grant.clone());
        self.record(a.lease, a.req, Outcome::Replied(reply.clone()));
        fx.push(Effect::Granted { grant, req: a.req, queued: false, waited_ms: 0, tag });
        reply
    }

    /// Queue `a` on every lock of `names` (one for a single acquire), in this
    /// one step: its place in each queue is the step it arrived in. One wait
    /// timer; its lease's `waits` names the first lock.
    pub(super) fn enqueue(&mut self, names: &[LockName], share: Share, a: &Acquire) -> Reply {
        let deadline = self.now.saturating_add(a.wait_ms);
        let (lease, req, lock_delay_ms, tag) = (a.lease, a.req, a.lock_delay_ms, Tag::of(a));
        let (mode, weight, hold_at_least_ms) = (share.mode, share.weight, a.hold_at_least_ms);
        let (queued_at, all) = (self.now, if names.len() > 1 { names.to_vec() } else { Vec::new() });
        let waiter =
            Waiter { lease, req, queued_at, deadline, lock_delay_ms, tag, mode, weight, hold_at_least_ms, all };
        let mut position = None;
        for name in names {
            let lock = self.locks.entry(name.clone()).or_default();
            position.get_or_insert(count(lock.queue.len()));
            lock.queue.push_back(waiter.clone());
        }
        let position = position.unwrap_or(0);
        if let (Some(l), Some(first)) = (self.leases.get_mut(&a.lease), names.first()) {
            l.waits.insert(a.req, first.clone());
        }
        self.timers.insert(deadline, TimerKind::WaitEnd(a.lease, a.req));
        Reply::Queued { position }
    }

    /// Issue the next token (INV-2) and make `lease` a holder of `name` (an
    /// entry that exists), with the identity, value, closing and share of its
    /// acquire.
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
        let Closing { lock_delay_ms, hold_at_least_ms } = closing;
        let holder = Holder { lease, req, token, granted_at, lock_delay_ms, tag, mode, weight, hold_at_least_ms };
        let grant = holder.grant(name);
        self.locks.entry(name.clone()).or_default().holders.push(holder);
        if let Some(l) = self.leases.get_mut(&lease) {
            l.holds.insert(token, name.clone());
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
        self.record(lease, req, Outcome::Replied(Reply::Released));
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
        let Some(lock) = self.locks.get_mut(&name) else { return Reply::NotHolder };
        let Some(holder) = lock.holder(s.lease, s.token).and_then(|i| lock.holders.get_mut(i)) else {
            return Reply::NotHolder;
        };
        holder.tag = Tag::new(Tag::identity(holder.tag.as_deref()), s.value);
        fx.push(Effect::ValueChanged { grant: holder.grant(&name), tag: holder.tag.clone() });
        self.record(s.lease, s.req, Outcome::Replied(Reply::ValueSet));
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
        self.record(d.lease, d.req, Outcome::Replied(Reply::Downgraded));
        self.grant_next(&name, fx);
        Reply::Downgraded
    }

    /// The exclusive grant `(name, lease, token)` of a read-write lock.
    fn exclusive_holder_mut(&mut self, name: &LockName, lease: LeaseId, token: Token) -> Option<&mut Holder> {
        let lock = self.locks.get_mut(name).filter(|l| l.kind == LockKind::Exclusive)?;
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
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        let Some(i) = lock.holder(lease, token) else {
            return;
        };
        let holder = lock.holders.remove(i);
        let held_ms = self.now.saturating_sub(holder.granted_at);
        let hold_left = holder.hold_left(self.now);
        fx.push(Effect::Released { grant: holder.grant(name), held_ms, cause, tag: holder.tag });
        if cause == ReleaseCause::Expired && holder.lock_delay_ms > 0 {
            self.close(name, holder.lock_delay_ms);
        }
        if hold_left > 0 {
            self.close(name, hold_left);
        }
        self.grant_next(name, fx);
        self.drop_if_unused(name);
    }

    /// Remove the queued acquire `(lease, req)` from `name`'s queue, and from
    /// the queues of the other locks of a multi-acquire (one `WaitEnded` per
    /// lock).
    pub(super) fn end_wait(&mut self, name: &LockName, lease: LeaseId, req: RequestId, why: WaitEnd, fx: &mut Effects) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.waits.remove(&req);
        }
        let Some(w) = self.take_waiter(name, lease, req) else {
            return;
        };
        self.timers.remove(w.deadline, TimerKind::WaitEnd(lease, req));
        let names = w.locks(name);
        for other in names.iter().filter(|n| *n != name) {
            self.take_waiter(other, lease, req);
        }
        for n in &names {
            fx.push(Effect::WaitEnded { lock: n.clone(), lease, req, why });
        }
        // It may have held back the waiters behind it (INV-16).
        self.grant_from(names.clone(), fx);
        names.iter().for_each(|n| self.drop_if_unused(n));
    }

    /// Take the waiter `(lease, req)` out of `name`'s queue.
    fn take_waiter(&mut self, name: &LockName, lease: LeaseId, req: RequestId) -> Option<Waiter> {
        let lock = self.locks.get_mut(name)?;
        lock.waiter(lease, req).and_then(|i| lock.queue.remove(i))
    }

    /// The wait timer of `(lease, req)` fired.
    pub(super) fn time_out_wait(&mut self, lease: LeaseId, req: RequestId, fx: &mut Effects) {
        let Some(name) = self.leases.get(&lease).and_then(|l| l.waits.get(&req)).cloned() else {
            return;
        };
        self.end_wait(&name, lease, req, WaitEnd::TimedOut, fx);
        self.record(lease, req, Outcome::TimedOut(name));
    }

    /// Close `name` for `delay_ms` from now, unless it is closed until later
    /// already (several holders of a shared lock or a semaphore may expire one
    /// after another: the lock reopens when the last of their delays ends).
    fn close(&mut self, name: &LockName, delay_ms: u64) {
        let until = self.now.saturating_add(delay_ms);
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        if let Some(old) = lock.closed {
            if old.until >= until {
                return;
            }
            self.timers.remove(old.until, TimerKind::Reopen(name.clone()));
        }
        lock.closed = Some(Closed { until, delay_ms });
        self.timers.insert(until, TimerKind::Reopen(name.clone()));
    }

    /// The lock-delay timer of `name` fired.
    pub(super) fn reopen(&mut self, name: &LockName, fx: &mut Effects) {
        if let Some(lock) = self.locks.get_mut(name) {
            lock.closed = None;
        }
        self.grant_next(name, fx);
        self.drop_if_unused(name);
    }

    /// Grant `name` to its first live waiters (see [`Engine::grant_from`]).
    fn grant_next(&mut self, name: &LockName, fx: &mut Effects) {
        self.grant_from(vec![name.clone()], fx);
    }

    /// Grant each lock of `work` to its first live waiters (FIFO, INV-3,
    /// INV-16) while the first one can be granted: it fits beside the holders
    /// (INV-15) and, for a multi-acquire, it is also the first live waiter of
    /// each of its other locks and fits there (INV-18: all at once, in one
    /// step). A run of readers at the head is granted together, up to the
    /// first writer. A multi-acquire at the head that cannot be granted yet
    /// holds back the waiters behind it, as any head does: that is what keeps
    /// it from starving. A multi grant changes its other locks too, so they
    /// join the worklist (a worklist, not recursion: a chain of multi-waiters
    /// can be long). Waiters whose lease is not live are skipped, never granted
    /// (INV-4); their lease's expiry removes them.
    pub(super) fn grant_from(&mut self, mut work: Vec<LockName>, fx: &mut Effects) {
        while let Some(name) = work.pop() {
            while let Some(w) = self.take_next_live_waiter(&name) {
                let names = w.locks(&name);
                self.grant_waiter(&names, w, fx);
                work.extend(names.into_iter().filter(|n| *n != name));
            }
        }
    }

    /// Install the grants of the waiter `w` (taken out of every queue) on
    /// `names`, in order, and record its reply.
    fn grant_waiter(&mut self, names: &[LockName], w: Waiter, fx: &mut Effects) {
        self.timers.remove(w.deadline, TimerKind::WaitEnd(w.lease, w.req));
        if let Some(l) = self.leases.get_mut(&w.lease) {
            l.waits.remove(&w.req);
        }
        let share = Share { mode: w.mode, weight: w.weight };
        let waited_ms = self.now.saturating_sub(w.queued_at);
        let mut grants = Vec::with_capacity(names.len());
        for name in names {
            let grant = self.install_holder(name, w.lease, w.req, Closing::of_waiter(&w), w.tag.clone(), share);
            grants.push(grant.clone());
            fx.push(Effect::Granted { grant, req: w.req, queued: true, waited_ms, tag: w.tag.clone() });
        }
        let reply = match w.all.is_empty() {
            true => Reply::Acquired(grants.remove(0)),
            false => Reply::AcquiredAll(grants),
        };
        self.record(w.lease, w.req, Outcome::Replied(reply));
    }

    /// The first waiter of `name` whose lease is live, if it can be granted
    /// now (see [`Engine::grant_from`]), taken out of every queue it is in.
    fn take_next_live_waiter(&mut self, name: &LockName) -> Option<Waiter> {
        let lock = self.locks.get(name)?;
        let w = lock.queue.get(self.first_live(lock)?)?;
        let grantable = w.locks(name).iter().all(|n| self.heads(n, w));
        let (lease, req, names) = (w.lease, w.req, w.locks(name));
        if !grantable {
            return None;
        }
        let taken = self.take_waiter(name, lease, req);
        names.iter().filter(|n| *n != name).for_each(|n| drop(self.take_waiter(n, lease, req)));
        taken
    }

    /// Whether `w` is the first live waiter of `name` and fits beside its holders.
    fn heads(&self, name: &LockName, w: &Waiter) -> bool {
        let Some(lock) = self.locks.get(name) else { return false };
        let head = self.first_live(lock).and_then(|i| lock.queue.get(i));
        head.is_some_and(|h| h.lease == w.lease && h.req == w.req) && lock.admits(w.mode, w.weight)
    }

    /// The place of the first waiter of `lock` whose lease is live (with the
    /// dead-waiter mutant, see `crate::mutants`: the first waiter).
    fn first_live(&self, lock: &Lock) -> Option<usize> {
        let mutant = super::dead_waiter_mutant();
        lock.queue.iter().position(|w| mutant || self.is_live(w.lease))
    }

    fn drop_if_unused(&mut self, name: &LockName) {
        if self.locks.get(name).is_some_and(|l| l.is_unused()) {
            self.locks.remove(name);
        }
    }
}
