//! The FIFO queues of the locks: queueing an acquire (on every lock of a
//! multi-acquire at once), ending a wait (timeout, cancel, lease end), and
//! granting each queue from its head.
//!
//! Where it sits: `lock.rs` decides whether an acquire is granted at once;
//! whatever waits is kept here, and every transition that may free a lock
//! (`end_grant`, `reopen`, `downgrade`, a wait that ends) calls
//! `grant_next`. The head of a queue is granted while it can be: it fits
//! beside the holders (INV-15) and, for a multi-acquire, it also heads and
//! fits every other queue it is in (INV-18).

use super::{
    dedup::Outcome,
    state::{Closing, Lock, Share, Waiter},
    Effects, Engine, TimerKind,
};
use crate::*;
use std::sync::Arc;

use super::lock::count;

impl Engine {
    /// Queue `a` on every lock of `names` (one for a single acquire), in this
    /// one step: its place in each queue is the step it arrived in. One wait
    /// timer; its lease's `waits` names the first lock.
    pub(super) fn enqueue(&mut self, names: &[LockName], share: Share, a: &Acquire) -> Reply {
        let deadline = self.now.saturating_add(a.wait_ms);
        let (lease, req, lock_delay_ms, tag) = (a.lease, a.req, a.lock_delay_ms, Tag::of(a));
        let (mode, weight, hold_at_least_ms) = (share.mode, share.weight, a.hold_at_least_ms);
        let (queued_at, all) = (self.now, if names.len() > 1 { names.to_vec() } else { Vec::new() });
        let once_per = a.once_per.clone();
        let waiter = Waiter {
            lease,
            req,
            queued_at,
            deadline,
            lock_delay_ms,
            tag,
            mode,
            weight,
            hold_at_least_ms,
            once_per,
            all,
        };
        let (mut position, mut first) = (None, None);
        for name in names {
            let (key, lock) = self.locks.get_or_insert_with(name.clone(), Default::default);
            // The lease's wait keeps the lock map's own name (shared).
            first.get_or_insert(key);
            let lock = Arc::make_mut(lock);
            position.get_or_insert(count(lock.queue.len()));
            lock.queue.add(|queue| queue.push_back(waiter.clone()));
            self.counts.waiters += 1;
        }
        let position = position.unwrap_or(0);
        if let (Some(l), Some(first)) = (self.leases.get_mut(&a.lease), first) {
            l.waits.add(|waits| waits.insert(a.req, first));
        }
        self.timers.insert(deadline, TimerKind::WaitEnd(a.lease, a.req));
        Reply::Queued { position }
    }

    /// Remove the queued acquire `(lease, req)` from `name`'s queue, and from
    /// the queues of the other locks of a multi-acquire (one `WaitEnded` per
    /// lock).
    pub(super) fn end_wait(&mut self, name: &LockName, lease: LeaseId, req: RequestId, why: WaitEnd, fx: &mut Effects) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.waits.change(|waits| waits.remove(&req));
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
            fx.push(Effect::WaitEnded { lock: n.clone(), lease, req, why: why.clone() });
        }
        // It may have held back the waiters behind it (INV-16).
        self.grant_from(names.clone(), fx);
        names.iter().for_each(|n| self.drop_if_unused(n));
    }

    /// Take the waiter `(lease, req)` out of `name`'s queue.
    pub(super) fn take_waiter(&mut self, name: &LockName, lease: LeaseId, req: RequestId) -> Option<Waiter> {
        let lock = self.locks.get_mut(name).map(Arc::make_mut)?;
        let at = lock.waiter(lease, req);
        let taken = at.and_then(|i| lock.queue.change(|queue| queue.remove(i)).flatten());
        self.counts.waiters -= u64::from(taken.is_some());
        taken
    }

    /// The wait timer of `(lease, req)` fired.
    pub(super) fn time_out_wait(&mut self, lease: LeaseId, req: RequestId, fx: &mut Effects) {
        let Some(name) = self.leases.get(&lease).and_then(|l| l.waits.get(&req)).cloned() else {
            return;
        };
        self.end_wait(&name, lease, req, WaitEnd::TimedOut, fx);
        self.record(lease, req, Outcome::TimedOut(name));
    }

    /// Grant `name` to its first live waiters (see [`Engine::grant_from`]).
    pub(super) fn grant_next(&mut self, name: &LockName, fx: &mut Effects) {
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
    ///
    /// A waiter that runs once per a slot is looked at once more when it
    /// could be granted: if the slot is done, it leaves with
    /// [`WaitEnd::SlotDone`] instead, and the next waiter is looked at
    /// (see [`Engine::end_done_wait`]).
    pub(super) fn grant_from(&mut self, mut work: Vec<LockName>, fx: &mut Effects) {
        while let Some(name) = work.pop() {
            while let Some(w) = self.take_next_live_waiter(&name) {
                if let Some(done) = self.waiter_slot_done(&name, &w) {
                    self.end_done_wait(&name, w, done, fx);
                    continue;
                }
                let names = w.locks(&name);
                self.grant_waiter(&names, w, fx);
                work.extend(names.into_iter().filter(|n| *n != name));
            }
        }
    }

    /// `slot` of `name` was just completed: every live waiter of `name` that
    /// runs once per it leaves now, in queue order, with
    /// [`WaitEnd::SlotDone`] (as [`Engine::grant_from`] would end it when its
    /// turn came). Waiters whose lease is not live are left to their lease's
    /// end, as everywhere (INV-4). A once-per waiter is a single acquire (no
    /// multi-acquire runs once per a slot), so it is in this queue only.
    pub(super) fn end_slot_waiters(&mut self, name: &LockName, slot: &str, fx: &mut Effects) {
        let Some(done) = self.slot_done(name, slot) else { return };
        let Some(lock) = self.locks.get(name) else { return };
        let ending: Vec<(LeaseId, RequestId)> = (lock.queue.iter())
            .filter(|w| w.once_per == slot && self.is_live(w.lease))
            .map(|w| (w.lease, w.req))
            .collect();
        for (lease, req) in ending {
            if let Some(w) = self.take_waiter(name, lease, req) {
                self.end_done_wait(name, w, done.clone(), fx);
            }
        }
        // One of them may have been the head that held the others back.
        self.grant_next(name, fx);
    }

    /// The waiter `w` (taken out of every queue) leaves: its timer and its
    /// lease's note of the wait go.
    fn forget_wait(&mut self, w: &Waiter) {
        self.timers.remove(w.deadline, TimerKind::WaitEnd(w.lease, w.req));
        if let Some(l) = self.leases.get_mut(&w.lease) {
            l.waits.change(|waits| waits.remove(&w.req));
        }
    }

    /// The waiter `w` of `name` (a single acquire, taken out of the queue)
    /// runs once per a slot that is done: it ends without a grant, and a
    /// retry of its request gets the same answer (INV-6).
    fn end_done_wait(&mut self, name: &LockName, w: Waiter, done: SlotCompletion, fx: &mut Effects) {
        self.forget_wait(&w);
        self.record(w.lease, w.req, Outcome::replied(done.reply()));
        let why = WaitEnd::SlotDone(Box::new(done));
        fx.push(Effect::WaitEnded { lock: name.clone(), lease: w.lease, req: w.req, why });
    }

    /// Install the grants of the waiter `w` (taken out of every queue) on
    /// `names`, in order, and record its reply.
    fn grant_waiter(&mut self, names: &[LockName], w: Waiter, fx: &mut Effects) {
        self.forget_wait(&w);
        let share = Share { mode: w.mode, weight: w.weight };
        let waited_ms = self.now.saturating_sub(w.queued_at);
        let mut grants = Vec::with_capacity(names.len());
        for name in names {
            let grant = self.install_holder(name, w.lease, w.req, Closing::of_waiter(&w), w.tag.clone(), share);
            grants.push(grant.clone());
            let (tag, mode) = (w.tag.clone(), share.mode);
            fx.push(Effect::Granted { grant, req: w.req, queued: true, waited_ms, tag, mode });
        }
        let reply = match w.all.is_empty() {
            true => Reply::Acquired(grants.remove(0)),
            false => Reply::AcquiredAll(grants),
        };
        self.record(w.lease, w.req, Outcome::replied(reply));
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
}
