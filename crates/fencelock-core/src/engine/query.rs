//! Read-only queries. They take `now` from the caller and never mutate.
//!
//! A query may run ahead of the last tick, so a lease whose deadline is `<= now`
//! is treated as already expired: its grants are not shown as holders (a held
//! lock-delay shows as `reopens_in_ms`), its waiters and timed-out waits are not
//! listed, and [`Engine::check`] calls its token stale. Queries do not predict the
//! grants the next tick will make.

use super::{
    lock::count,
    state::{Holder, Lock, Waiter},
    Counts, Engine,
};
use crate::*;

impl Engine {
    /// Is `token` a current live grant of `lock` at `now`? (Chubby's
    /// CheckSequencer.) A shared lock or a semaphore has several; `Stale`
    /// names the first of them.
    pub fn check(&self, now: Millis, lock: &str, token: Token) -> Check {
        let Some(l) = self.locks.get(lock) else { return Check::Stale { current: None } };
        let mut live = self.live_holders(now, l);
        if live.clone().any(|h| h.token == token) {
            return Check::Current;
        }
        Check::Stale { current: live.next().map(|h| h.token) }
    }

    /// Whether the acquire `(lease, req)` waits in a queue now (cheap: no
    /// allocation, for the server's per-entry bookkeeping).
    pub fn is_queued(&self, lease: LeaseId, req: RequestId) -> bool {
        self.leases.get(&lease).is_some_and(|l| l.waits.contains_key(&req))
    }

    /// One lock at `now`, or `None` if it is free, open and nobody waits.
    pub fn lock_info(&self, now: Millis, lock: &str) -> Option<LockInfo> {
        let (name, l) = self.locks.get_key_value(lock)?;
        Some(self.info(now, name, l))
    }

    /// The `k` locks with the most waiters (at least one), deepest first,
    /// ties by name: where the contention is, for the per-lock metrics. One
    /// pass over the locks, holding at most `k` of them.
    pub fn deepest_queues(&self, k: usize) -> Vec<(LockName, u64)> {
        let mut top: Vec<(LockName, u64)> = Vec::with_capacity(k + 1);
        for (name, l) in self.locks.iter().filter(|(_, l)| !l.queue.is_empty()) {
            let depth = l.queue.len() as u64;
            if top.len() == k && top.last().is_some_and(|&(_, d)| d >= depth) {
                continue;
            }
            let at = top.partition_point(|(n, d)| *d > depth || (*d == depth && n < name));
            top.insert(at, (name.clone(), depth));
            top.truncate(k);
        }
        top
    }

    /// The grants of live leases held for at least `min_held_ms` at `now`:
    /// their number, and the `k` held longest, longest first. A lease that is
    /// still live has been kept alive all along, so these are holders that
    /// renew but do not let go (a stuck job). One pass over the locks; a
    /// holder's lease is looked up only once its grant is old enough, so a
    /// pass over locks all granted within `min_held_ms` reads no lease (at
    /// 10M locks, the lookups first made a `/metrics` scrape take 28 s).
    pub fn long_holds(&self, now: Millis, min_held_ms: u64, k: usize) -> (u64, Vec<LongHold>) {
        let mut count = 0;
        let mut top: Vec<LongHold> = Vec::with_capacity(k + 1);
        for (name, l) in self.locks.iter() {
            let old = l.holders.iter().filter(|h| now.saturating_sub(h.granted_at) >= min_held_ms);
            for h in old.filter(|h| self.holds_live(now, h)) {
                let held_ms = now.saturating_sub(h.granted_at);
                count += 1;
                if top.len() == k && top.last().is_some_and(|t| t.held_ms >= held_ms) {
                    continue;
                }
                let identity = Tag::identity(h.tag.as_deref()).to_owned();
                let hold = LongHold { lock: name.clone(), token: h.token, held_ms, identity };
                let at = top.partition_point(|t| t.held_ms >= held_ms);
                top.insert(at, hold);
                top.truncate(k);
            }
        }
        (count, top)
    }

    /// Up to `limit` locks whose name starts with `prefix`, sorted by name.
    pub fn locks(&self, now: Millis, prefix: &str, limit: usize) -> Vec<LockInfo> {
        self.locks
            .range_from::<str>(prefix)
            .take_while(|(name, _)| name.as_str().starts_with(prefix))
            .take(limit)
            .map(|(name, l)| self.info(now, name, l))
            .collect()
    }

    /// One lease at `now`, or `None` if it does not exist or its deadline passed.
    pub fn lease_info(&self, now: Millis, lease: LeaseId) -> Option<LeaseInfo> {
        let l = self.leases.get(&lease).filter(|l| l.deadline > now)?;
        let locks = l.holds.iter();
        let locks = locks.map(|(token, lock)| Grant { lock: lock.clone(), lease, token: *token });
        Some(LeaseInfo {
            lease,
            owner: l.owner().map(str::to_owned),
            ttl_ms: l.ttl(),
            ttl_left_ms: l.deadline - now,
            locks: locks.collect(),
        })
    }

    /// How many leases there are (live or due to expire at the next tick); O(1).
    pub fn lease_count(&self) -> u64 {
        self.leases.len() as u64
    }

    /// How many leases `owner` has; O(1) (see [`Engine::usage`] for the rest).
    pub fn owned_lease_count(&self, owner: &str) -> u64 {
        self.owned.get(owner).map_or(0, |ids| ids.len() as u64)
    }

    /// What the leases of `owner` hold and wait for, as of the last input
    /// (for quotas; costs one step per lease of the owner).
    pub fn usage(&self, owner: &str) -> Usage {
        let leases = self.owned.get(owner).into_iter().flatten().filter_map(|id| self.leases.get(id));
        leases.fold(Usage::default(), |u, l| Usage {
            leases: u.leases + 1,
            holds: u.holds + l.holds.len() as u64,
            waits: u.waits + l.waits.len() as u64,
        })
    }

    /// Gauges, as of the last input; O(1) (a debug build checks the counts
    /// against a walk of every lock).
    pub fn stats(&self) -> Stats {
        debug_assert_eq!(self.counts, self.counted(), "the holder and waiter counts drifted");
        Stats {
            leases: self.leases.len() as u64,
            held_locks: self.counts.holders,
            waiters: self.counts.waiters,
            tokens_issued: self.tokens_issued,
            token_counter: self.next_token.saturating_sub(1),
        }
    }

    /// How many acquires wait in the locks' queues now (kept as a count: no
    /// walk of the locks).
    pub fn waiting(&self) -> u64 {
        self.counts.waiters
    }

    /// The holders and waiters of every lock, counted one lock at a time.
    pub(super) fn counted(&self) -> Counts {
        let count = |f: fn(&Lock) -> usize| self.locks.values().map(|l| f(l) as u64).sum();
        Counts { holders: count(|l| l.holders.len()), waiters: count(|l| l.queue.len()) }
    }

    /// Why a try-acquire of `name` does not get it, at the engine's clock.
    pub(super) fn busy(&self, name: &LockName) -> Busy {
        let Some(lock) = self.locks.get(name) else {
            return Busy { holder: None, holders: 0, reopens_in_ms: None, waiters: 0 };
        };
        Busy {
            holder: lock.holders.first().map(|h| h.grant(name)),
            holders: count(lock.holders.len()),
            reopens_in_ms: lock.closed.as_ref().map(|c| c.until.saturating_sub(self.now)),
            waiters: count(lock.queue.len()),
        }
    }

    fn lease_deadline(&self, lease: LeaseId) -> Option<Millis> {
        self.leases.get(&lease).map(|l| l.deadline)
    }

    /// The holders of `lock` whose lease is live at `now`, in grant order.
    fn live_holders<'a>(&'a self, now: Millis, lock: &'a Lock) -> impl Iterator<Item = &'a Holder> + Clone + 'a {
        lock.holders.iter().filter(move |h| self.holds_live(now, h))
    }

    /// Whether holder `h`'s lease is live at `now`.
    fn holds_live(&self, now: Millis, h: &Holder) -> bool {
        self.lease_deadline(h.lease).is_some_and(|d| d > now)
    }

    fn info(&self, now: Millis, name: &LockName, lock: &Lock) -> LockInfo {
        let holders: Vec<HolderInfo> = self.live_holders(now, lock).map(|h| self.holder_info(now, h)).collect();
        LockInfo {
            name: name.clone(),
            holder: holders.first().cloned(),
            holders,
            permits: lock.kind.permits(),
            reopens_in_ms: self.reopens_at(now, lock).filter(|&t| t > now).map(|t| t - now),
            waiters: self.waiter_infos(now, lock),
        }
    }

    /// When the lock reopens: its lock-delay, or the one a holder whose lease has
    /// passed its deadline is about to leave (the later of the two).
    fn reopens_at(&self, now: Millis, lock: &Lock) -> Option<Millis> {
        let pending = lock.holders.iter().filter(|h| h.lock_delay_ms > 0).filter_map(|h| {
            let deadline = self.lease_deadline(h.lease).filter(|&d| d <= now)?;
            Some(deadline.saturating_add(h.lock_delay()))
        });
        lock.closed.as_ref().map(|c| c.until).into_iter().chain(pending).max()
    }

    fn holder_info(&self, now: Millis, h: &Holder) -> HolderInfo {
        HolderInfo {
            lease: h.lease,
            owner: self.leases.get(&h.lease).and_then(|l| l.owner().map(str::to_owned)),
            token: h.token,
            held_ms: now.saturating_sub(h.granted_at),
            ttl_left_ms: self.lease_deadline(h.lease).unwrap_or(0).saturating_sub(now),
            lock_delay_ms: h.lock_delay(),
            mode: h.mode,
            weight: h.weight,
            identity: Tag::identity(h.tag.as_deref()).to_owned(),
            value: Tag::value(h.tag.as_deref()).to_vec(),
        }
    }

    fn waiter_infos(&self, now: Millis, lock: &Lock) -> Vec<WaiterInfo> {
        let live = |d: Option<Millis>| d.is_some_and(|d| d > now);
        let waiters = lock.queue.iter().filter(|w| w.deadline > now && live(self.lease_deadline(w.lease)));
        let info = |w: &Waiter| WaiterInfo {
            lease: w.lease,
            req: w.req,
            waited_ms: now.saturating_sub(w.queued_at),
            wait_left_ms: w.deadline - now,
            identity: Tag::identity(w.tag.as_deref()).to_owned(),
        };
        waiters.map(info).collect()
    }
}

/// A grant held for long (see [`Engine::long_holds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongHold {
    pub lock: LockName,
    pub token: Token,
    pub held_ms: u64,
    /// The identity its acquire carried ("" when none).
    pub identity: String,
}
