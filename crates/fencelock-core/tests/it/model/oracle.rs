//! Invariant checks that read only the engine's outputs (replies and effects),
//! independent of both the engine's and the model's state. Each check names the
//! invariant it guards.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_core::*;

type Pair = (LeaseId, RequestId);

/// One grant that holds a lock, as the oracle knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    lease: LeaseId,
    token: Token,
    /// Shared (a reader of a read-write lock; a downgrade makes it so).
    shared: bool,
    weight: u32,
}

/// What an acquire asked for: shared, weight, permits (0: read-write).
type Asked = (bool, u32, u32);

#[derive(Debug, Default)]
pub struct Oracle {
    /// The holders of each lock, in grant order, as told by `Granted` /
    /// `Released` effects and `Downgraded` replies.
    holders: BTreeMap<LockName, Vec<Held>>,
    /// What each acquire asked for, from the command itself.
    asked: BTreeMap<Pair, Asked>,
    /// The last token granted (INV-2).
    last_token: u64,
    /// Leases known to have ended (expired or revoked).
    ended: BTreeSet<LeaseId>,
    /// Queue of each lock, as told by `Queued` replies and effects (INV-3).
    queues: BTreeMap<String, Vec<Pair>>,
    /// Every acquire that was granted, and its token on each lock (INV-6).
    granted: BTreeMap<(Pair, LockName), Token>,
    /// The locks of each multi-acquire, in the order asked (INV-18).
    multi: BTreeMap<Pair, Vec<LockName>>,
    /// The (lock, slot) each acquire once per a slot runs for (issue 18 §4).
    slot_of: BTreeMap<Pair, (String, String)>,
    /// The first completion (its token) of each (lock, slot).
    done: BTreeMap<(String, String), Token>,
}

impl Oracle {
    /// Judge one command applied alone: its effects, then its reply. A revoked
    /// lease counts as ended before its effects, so a grant to it is caught.
    pub fn command(&mut self, c: &Command, fx: &[Effect], r: &Reply) -> Result<(), String> {
        if let (Command::Revoke { lease, .. }, Reply::LeaseRevoked { .. }) = (c, r) {
            self.ended.insert(*lease);
        }
        // A completion tells its slot's waiters in its own effects: it counts
        // as done before them.
        if let (Command::CompleteSlot { lock, token, slot, .. }, Reply::SlotCompleted) = (c, r) {
            self.done.entry((lock.clone(), slot.clone())).or_insert(*token);
        }
        if let Command::Acquire(a) = c {
            let asked = (a.mode == Mode::Shared && a.permits == 0, a.weight, a.permits);
            self.asked.insert((a.lease, a.req), asked);
            let names: Result<Vec<LockName>, _> = a.locks().map(LockName::new).collect();
            if let (true, Ok(names)) = (a.is_multi(), names) {
                self.multi.insert((a.lease, a.req), names);
            }
            if !a.once_per.is_empty() {
                self.slot_of.insert((a.lease, a.req), (a.lock.clone(), a.once_per.clone()));
            }
        }
        // A downgrade happens before the grants it lets in.
        if let (Command::Downgrade { lease, lock, token, .. }, Reply::Downgraded) = (c, r) {
            self.on_downgraded(lock, *lease, *token)?;
        }
        check_release(c, fx, r)?;
        self.effects(fx)?;
        self.reply(c, r)
    }

    /// Judge the effects of one step of the engine (an advance, or one command).
    pub fn effects(&mut self, fx: &[Effect]) -> Result<(), String> {
        for (i, f) in fx.iter().enumerate() {
            self.effect(f, &fx[i + 1..])?;
        }
        self.check_whole(fx)
    }

    /// INV-18: never a partial multi-lock. A multi-acquire granted in this step
    /// got every one of its locks in it, in the order asked, with consecutive
    /// tokens (and, INV-6, it was never granted in an earlier step).
    fn check_whole(&self, fx: &[Effect]) -> Result<(), String> {
        let mut got: BTreeMap<Pair, Vec<(LockName, Token)>> = BTreeMap::new();
        for f in fx {
            if let Effect::Granted { grant, req, .. } = f {
                if self.multi.contains_key(&(grant.lease, *req)) {
                    got.entry((grant.lease, *req)).or_default().push((grant.lock.clone(), grant.token));
                }
            }
        }
        for (pair, grants) in got {
            let names: Vec<&LockName> = grants.iter().map(|(n, _)| n).collect();
            let consecutive = grants.windows(2).all(|w| w[1].1 .0 == w[0].1 .0 + 1);
            if names.iter().copied().ne(self.multi[&pair].iter()) || !consecutive {
                return Err(format!("INV-18: multi-acquire {pair:?} got {grants:?} in one step"));
            }
        }
        Ok(())
    }

    /// Judge the effects of a `LeaderStart` (there must be none).
    pub fn leader_start(&mut self, out: &Output) -> Result<(), String> {
        if !out.replies.is_empty() || !out.effects.is_empty() {
            return Err(format!("INV-8: LeaderStart expired or replied something: {out:?}"));
        }
        Ok(())
    }

    /// The lock holders the oracle believes in, to compare with `Engine::check`.
    pub fn holders(&self) -> impl Iterator<Item = (&LockName, (LeaseId, Token))> {
        self.holders.iter().flat_map(|(name, hs)| hs.iter().map(move |h| (name, (h.lease, h.token))))
    }

    /// The holder of a downgrade was exclusive, on a read-write lock (a retry
    /// finds it shared already, or gone).
    fn on_downgraded(&mut self, lock: &str, lease: LeaseId, token: Token) -> Result<(), String> {
        let hs = self.holders.iter_mut().find(|(n, _)| n.as_str() == lock).map(|(_, hs)| hs);
        let Some(h) = hs.into_iter().flatten().find(|h| h.lease == lease && h.token == token) else {
            return Ok(());
        };
        if h.weight != 1 {
            return Err(format!("a semaphore's grant {lock}/{token} was downgraded"));
        }
        h.shared = true;
        Ok(())
    }

    fn effect(&mut self, f: &Effect, later: &[Effect]) -> Result<(), String> {
        match f {
            Effect::Granted { grant, req, queued, mode, .. } => {
                self.check_mode(grant, *req, *mode)?;
                self.check_slot_not_done(grant, *req)?;
                self.on_granted(grant, *req, *queued, later)
            }
            // The downgrade itself is judged with its command.
            Effect::Downgraded { grant, .. } => self.on_value_changed(grant),
            Effect::Released { grant, .. } => self.on_released(grant),
            Effect::WaitEnded { lock, lease, req, why } => {
                self.dequeue(lock.as_str(), (*lease, *req));
                match why {
                    WaitEnd::SlotDone(c) => self.check_done_names_first((*lease, *req), c.token),
                    _ => Ok(()),
                }
            }
            Effect::ValueChanged { grant, .. } => self.on_value_changed(grant),
            Effect::LeaseExpired { lease } => {
                self.ended.insert(*lease);
                Ok(())
            }
        }
    }

    /// Issue 18 §4: a run once per a slot is never granted after that slot
    /// was completed on its lock (a record outlives every run of this test).
    fn check_slot_not_done(&self, g: &Grant, req: RequestId) -> Result<(), String> {
        let Some(key) = self.slot_of.get(&(g.lease, req)) else { return Ok(()) };
        match self.done.get(key) {
            Some(by) => Err(format!("once per slot: {g:?} granted for {key:?}, done by token {by}")),
            None => Ok(()),
        }
    }

    /// Issue 18 §4: a `SlotDone` to the acquire `pair` names the first
    /// completion of its slot.
    fn check_done_names_first(&self, pair: Pair, token: Token) -> Result<(), String> {
        let first = self.slot_of.get(&pair).and_then(|key| self.done.get(key));
        match first == Some(&token) {
            true => Ok(()),
            false => {
                Err(format!("once per slot: {pair:?} told token {token} did its slot; first completion {first:?}"))
            }
        }
    }

    /// A grant's effect names the mode its acquire asked for (a semaphore's
    /// permits are exclusive).
    fn check_mode(&self, g: &Grant, req: RequestId, mode: Mode) -> Result<(), String> {
        let shared = self.asked.get(&(g.lease, req)).is_some_and(|a| a.0);
        match shared == (mode == Mode::Shared) {
            true => Ok(()),
            false => Err(format!("{g:?} granted {mode:?} to a request that asked shared={shared}")),
        }
    }

    /// Only the current holder may publish a value or be downgraded (INV-5).
    fn on_value_changed(&self, g: &Grant) -> Result<(), String> {
        let hs = self.holders.get(&g.lock);
        match hs.is_some_and(|hs| hs.iter().any(|h| h.lease == g.lease && h.token == g.token)) {
            true => Ok(()),
            false => Err(format!("a value set by {g:?} while the holders are {hs:?}")),
        }
    }

    fn on_granted(&mut self, g: &Grant, req: RequestId, queued: bool, later: &[Effect]) -> Result<(), String> {
        let Some(&(shared, weight, permits)) = self.asked.get(&(g.lease, req)) else {
            return Err(format!("{g:?} granted to request {req:?} that was never asked"));
        };
        self.check_fits(g, shared, weight, permits)?;
        if g.token.0 <= self.last_token {
            return Err(format!("INV-2: token {} after token {}", g.token, self.last_token));
        }
        if self.ended.contains(&g.lease) {
            return Err(format!("INV-4: {g:?} granted to an ended lease"));
        }
        if let Some(first) = self.granted.insert(((g.lease, req), g.lock.clone()), g.token) {
            return Err(format!("INV-6: request {req:?} of lease {} granted twice ({first}, {})", g.lease, g.token));
        }
        if queued {
            self.check_fifo(g, req, later)?;
        } else if let Some(ahead) = self.queues.get(g.lock.as_str()).and_then(|q| q.first()) {
            return Err(format!("INV-16: {g:?} granted at once past queued {ahead:?}"));
        }
        self.last_token = g.token.0;
        let held = Held { lease: g.lease, token: g.token, shared, weight };
        self.holders.entry(g.lock.clone()).or_default().push(held);
        Ok(())
    }

    /// INV-1, INV-15: a semaphore of N never has more than N permits taken;
    /// a read-write lock never has a writer beside anyone.
    fn check_fits(&self, g: &Grant, shared: bool, weight: u32, permits: u32) -> Result<(), String> {
        let hs = self.holders.get(&g.lock).map_or(&[][..], Vec::as_slice);
        if permits > 0 {
            let used: u64 = hs.iter().map(|h| u64::from(h.weight)).sum::<u64>() + u64::from(weight);
            return match used <= u64::from(permits) {
                true => Ok(()),
                false => Err(format!("INV-15: {g:?} takes {weight} permits of {permits} while {hs:?} hold")),
            };
        }
        match hs.is_empty() || (shared && hs.iter().all(|h| h.shared)) {
            true => Ok(()),
            false => Err(format!("INV-1/INV-15: {g:?} (shared: {shared}) granted beside {hs:?}")),
        }
    }

    /// INV-3: every waiter queued ahead of the granted one must be a waiter whose
    /// lease is ending (dropped later in the same output).
    fn check_fifo(&mut self, g: &Grant, req: RequestId, later: &[Effect]) -> Result<(), String> {
        let queue = self.queues.entry(g.lock.to_string()).or_default();
        let Some(at) = queue.iter().position(|p| *p == (g.lease, req)) else {
            return Err(format!("INV-3: {g:?} granted to request {req:?} that never queued"));
        };
        for ahead in &queue[..at] {
            let dropped = later.iter().any(|f| {
                matches!(f, Effect::WaitEnded { lease, req, why: WaitEnd::LeaseEnded, .. }
                    if (*lease, *req) == *ahead)
            });
            if !dropped {
                return Err(format!("INV-3: {g:?} granted ahead of live waiter {ahead:?}"));
            }
        }
        queue.remove(at);
        Ok(())
    }

    fn on_released(&mut self, g: &Grant) -> Result<(), String> {
        let hs = self.holders.entry(g.lock.clone()).or_default();
        let Some(i) = hs.iter().position(|h| h.lease == g.lease && h.token == g.token) else {
            return Err(format!("INV-1: released {g:?} but the holders were {hs:?}"));
        };
        hs.remove(i);
        if hs.is_empty() {
            self.holders.remove(&g.lock);
        }
        Ok(())
    }

    fn dequeue(&mut self, lock: &str, pair: Pair) {
        if let Some(q) = self.queues.get_mut(lock) {
            q.retain(|p| *p != pair);
        }
    }

    fn reply(&mut self, c: &Command, r: &Reply) -> Result<(), String> {
        match (c, r) {
            (Command::Acquire(a), Reply::Queued { position }) => self.on_queued(a, *position),
            (Command::Acquire(a), Reply::Acquired(g)) if !a.is_multi() => self.on_acquired(a, g),
            (Command::Acquire(a), Reply::AcquiredAll(gs)) if a.is_multi() => self.on_acquired_all(a, gs),
            (Command::Acquire(a), Reply::Acquired(_) | Reply::AcquiredAll(_)) => {
                Err(format!("INV-18: {a:?} answered {r:?}: one grant for a multi-acquire or several for one lock"))
            }
            (Command::Revoke { lease, .. }, Reply::LeaseRevoked { .. }) => {
                self.ended.insert(*lease);
                Ok(())
            }
            (Command::Acquire(a), Reply::SlotDone { token, .. }) => {
                self.check_done_names_first((a.lease, a.req), *token)
            }
            (Command::CancelWait { req, lease, .. }, _) => {
                // A cancel makes the engine forget the request: it may be granted anew.
                self.granted.retain(|(pair, _), _| *pair != (*lease, *req));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A multi-acquire queues on every one of its locks; its position is the
    /// one in the queue of its first lock.
    fn on_queued(&mut self, a: &Acquire, position: u32) -> Result<(), String> {
        let pair = (a.lease, a.req);
        for lock in a.locks() {
            let queue = self.queues.entry(lock.to_string()).or_default();
            if !queue.contains(&pair) {
                queue.push(pair);
            }
        }
        let queue = &self.queues[&a.lock];
        match queue.iter().position(|p| *p == pair) {
            Some(at) if at == position as usize => Ok(()),
            at => Err(format!("INV-3: {pair:?} queued at {position}, oracle queue says {at:?}")),
        }
    }

    /// INV-6: an `Acquired` reply is either this batch's fresh grant or the first
    /// grant of that request again.
    fn on_acquired(&mut self, a: &Acquire, g: &Grant) -> Result<(), String> {
        match self.granted.get(&((a.lease, a.req), g.lock.clone())) {
            Some(t) if *t == g.token => Ok(()),
            other => Err(format!("INV-6: acquire {a:?} replied {g:?}, first grant {other:?}")),
        }
    }

    /// INV-18 and INV-6: an `AcquiredAll` names every lock asked, in order,
    /// each with the token of its (first) grant.
    fn on_acquired_all(&mut self, a: &Acquire, gs: &[Grant]) -> Result<(), String> {
        if gs.iter().map(|g| g.lock.as_str()).ne(a.locks()) {
            return Err(format!("INV-18: acquire {a:?} replied {gs:?}: not its locks in order"));
        }
        gs.iter().try_for_each(|g| self.on_acquired(a, g))
    }
}

/// INV-5: a release ends only the grant it names, and `NotHolder` ends nothing.
fn check_release(c: &Command, fx: &[Effect], r: &Reply) -> Result<(), String> {
    let Command::Release { lease, lock, token, .. } = c else {
        return Ok(());
    };
    if *r == Reply::NotHolder && !fx.is_empty() {
        return Err(format!("INV-5: {c:?} was NotHolder but had effects {fx:?}"));
    }
    let named = |g: &Grant| g.lock.as_str() == lock && g.lease == *lease && g.token == *token;
    let wrong =
        fx.iter().find(|f| matches!(f, Effect::Released { grant, cause: ReleaseCause::Released, .. } if !named(grant)));
    match wrong {
        Some(f) => Err(format!("INV-5: {c:?} ended another grant: {f:?}")),
        None => Ok(()),
    }
}
