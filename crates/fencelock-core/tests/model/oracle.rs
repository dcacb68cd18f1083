//! Invariant checks that read only the engine's outputs (replies and effects),
//! independent of both the engine's and the model's state. Each check names the
//! invariant it guards.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_core::*;

type Pair = (LeaseId, RequestId);

#[derive(Debug, Default)]
pub struct Oracle {
    /// The holder of each lock, as told by `Granted` / `Released` effects.
    holders: BTreeMap<LockName, (LeaseId, Token)>,
    /// The last token granted (INV-2).
    last_token: u64,
    /// Leases known to have ended (expired or revoked).
    ended: BTreeSet<LeaseId>,
    /// Queue of each lock, as told by `Queued` replies and effects (INV-3).
    queues: BTreeMap<String, Vec<Pair>>,
    /// Every acquire that was granted, and its token (INV-6).
    granted: BTreeMap<Pair, Token>,
}

impl Oracle {
    /// Judge one command applied alone: its effects, then its reply. A revoked
    /// lease counts as ended before its effects, so a grant to it is caught.
    pub fn command(&mut self, c: &Command, fx: &[Effect], r: &Reply) -> Result<(), String> {
        if let (Command::Revoke { lease, .. }, Reply::LeaseRevoked { .. }) = (c, r) {
            self.ended.insert(*lease);
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
    pub fn holders(&self) -> impl Iterator<Item = (&LockName, &(LeaseId, Token))> {
        self.holders.iter()
    }

    fn effect(&mut self, f: &Effect, later: &[Effect]) -> Result<(), String> {
        match f {
            Effect::Granted { grant, req, queued, .. } => self.on_granted(grant, *req, *queued, later),
            Effect::Released { grant, .. } => self.on_released(grant),
            Effect::WaitEnded { lock, lease, req, .. } => {
                self.dequeue(lock.as_str(), (*lease, *req));
                Ok(())
            }
            Effect::ValueChanged { grant, .. } => self.on_value_changed(grant),
            Effect::LeaseExpired { lease } => {
                self.ended.insert(*lease);
                Ok(())
            }
        }
    }

    /// Only the current holder may publish a value (INV-5 for values).
    fn on_value_changed(&self, g: &Grant) -> Result<(), String> {
        match self.holders.get(&g.lock) {
            Some((lease, token)) if *lease == g.lease && *token == g.token => Ok(()),
            h => Err(format!("a value set by {g:?} while the holder is {h:?}")),
        }
    }

    fn on_granted(&mut self, g: &Grant, req: RequestId, queued: bool, later: &[Effect]) -> Result<(), String> {
        if let Some(h) = self.holders.get(&g.lock) {
            return Err(format!("INV-1: {g:?} granted while {h:?} holds it"));
        }
        if g.token.0 <= self.last_token {
            return Err(format!("INV-2: token {} after token {}", g.token, self.last_token));
        }
        if self.ended.contains(&g.lease) {
            return Err(format!("INV-4: {g:?} granted to an ended lease"));
        }
        if let Some(first) = self.granted.insert((g.lease, req), g.token) {
            return Err(format!("INV-6: request {req:?} of lease {} granted twice ({first}, {})", g.lease, g.token));
        }
        if queued {
            self.check_fifo(g, req, later)?;
        }
        self.last_token = g.token.0;
        self.holders.insert(g.lock.clone(), (g.lease, g.token));
        Ok(())
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
        match self.holders.remove(&g.lock) {
            Some(h) if h == (g.lease, g.token) => Ok(()),
            other => Err(format!("INV-1: released {g:?} but the holder was {other:?}")),
        }
    }

    fn dequeue(&mut self, lock: &str, pair: Pair) {
        if let Some(q) = self.queues.get_mut(lock) {
            q.retain(|p| *p != pair);
        }
    }

    fn reply(&mut self, c: &Command, r: &Reply) -> Result<(), String> {
        match (c, r) {
            (Command::Acquire(a), Reply::Queued { position }) => self.on_queued(a, *position),
            (Command::Acquire(a), Reply::Acquired(g)) => self.on_acquired(a, g),
            (Command::Revoke { lease, .. }, Reply::LeaseRevoked { .. }) => {
                self.ended.insert(*lease);
                Ok(())
            }
            (Command::CancelWait { req, lease, .. }, _) => {
                // A cancel makes the engine forget the request: it may be granted anew.
                self.granted.remove(&(*lease, *req));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn on_queued(&mut self, a: &Acquire, position: u32) -> Result<(), String> {
        let queue = self.queues.entry(a.lock.clone()).or_default();
        let pair = (a.lease, a.req);
        if !queue.contains(&pair) {
            queue.push(pair);
        }
        match queue.iter().position(|p| *p == pair) {
            Some(at) if at == position as usize => Ok(()),
            at => Err(format!("INV-3: {pair:?} queued at {position}, oracle queue says {at:?}")),
        }
    }

    /// INV-6: an `Acquired` reply is either this batch's fresh grant or the first
    /// grant of that request again.
    fn on_acquired(&mut self, a: &Acquire, g: &Grant) -> Result<(), String> {
        match self.granted.get(&(a.lease, a.req)) {
            Some(t) if *t == g.token => Ok(()),
            other => Err(format!("INV-6: acquire {a:?} replied {g:?}, first grant {other:?}")),
        }
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
