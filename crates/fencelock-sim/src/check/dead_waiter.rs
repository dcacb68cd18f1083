//! INV-DEAD-WAITER: a grant never goes to a lease that has expired (etcd#11456).
//!
//! The checker keeps its own lease model from the durable log, independent of the
//! engine's state: a lease lives `ttl` from the batch that granted it, a keep-alive
//! moves its deadline (once per request id), `LeaderStart` gives every live lease
//! a full TTL, and a lease whose deadline a batch reaches has expired. Each
//! `Granted` effect of the replayed log is then checked against that model at the
//! instant the grant was made (for a queued grant: when it was queued plus
//! `waited_ms`). A lease the engine keeps alive, or forgets, against the model is
//! a violation too. The evidence `waiters_whose_lease_ended` counts the waits
//! that outlived their lease (the case the invariant is about).

use std::collections::{BTreeMap, BTreeSet};

use fencelock_core::{Command, Effect, EngineError, Input, LeaseId, Millis, Output, Reply, RequestId, WaitEnd};

use super::Verdict;
use crate::report::Report;

#[derive(Debug)]
struct Lease {
    ttl: u64,
    deadline: Millis,
    /// Keep-alive request ids already applied (a retry does not move the deadline).
    kept: BTreeSet<RequestId>,
    /// Had its fresh TTL from a leader change and no keep-alive since.
    extended: bool,
}

#[derive(Debug, Default)]
struct Model {
    now: Millis,
    leases: BTreeMap<LeaseId, Lease>,
    /// When each expired lease's deadline was.
    ended: BTreeMap<LeaseId, Millis>,
    /// When each queued acquire was queued (on the current leader's clock).
    queued_at: BTreeMap<(LeaseId, RequestId), Millis>,
}

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-DEAD-WAITER");
    let mut m = Model::default();
    let (mut grants, mut dead_waits) = (0u64, 0u64);
    for (input, out) in r.log.iter().zip(&r.replayed) {
        match input {
            Input::LeaderStart { now, .. } => m.leader_start(*now),
            Input::Batch { now, cmds } => m.batch(&mut v, *now, cmds, out),
        }
        grants += out.effects.iter().filter(|e| matches!(e, Effect::Granted { .. })).count() as u64;
        dead_waits += out.effects.iter().filter(|e| is_dead_wait(e)).count() as u64;
    }
    v.evidence =
        vec![("grants", grants), ("leases_expired", m.ended.len() as u64), ("waiters_whose_lease_ended", dead_waits)];
    // Whether a waiter is queued when its client is cut off is a matter of
    // timing, so this case is proved over a set of seeds (see the test), not in
    // each run.
    v
}

fn is_dead_wait(e: &Effect) -> bool {
    matches!(e, Effect::WaitEnded { why: WaitEnd::LeaseEnded, .. })
}

impl Model {
    fn leader_start(&mut self, now: Millis) {
        let old = self.now;
        for l in self.leases.values_mut() {
            let left = if l.extended { l.deadline.saturating_sub(old).min(l.ttl) } else { l.ttl };
            l.deadline = now.saturating_add(left);
            l.extended = true;
        }
        for at in self.queued_at.values_mut() {
            *at = now.saturating_sub(old.saturating_sub(*at));
        }
        self.now = now;
    }

    fn batch(&mut self, v: &mut Verdict, now: Millis, cmds: &[Command], out: &Output) {
        let at = now.max(self.now);
        let replies = || cmds.iter().zip(&out.replies);
        for (cmd, reply) in replies() {
            self.new_lease(at, cmd, reply);
        }
        for e in &out.effects {
            if let Effect::Granted { grant, req, queued, waited_ms, .. } = e {
                self.check_grant(v, at, grant.lease, *req, *queued, *waited_ms);
            }
        }
        self.expire(at);
        for (cmd, reply) in replies() {
            self.check_reply(v, at, cmd, reply);
        }
        self.track_waits(at, replies(), &out.effects);
        self.now = at;
    }

    fn new_lease(&mut self, at: Millis, cmd: &Command, reply: &Reply) {
        if let (Command::GrantLease { .. }, Reply::LeaseGranted { lease, ttl_ms }) = (cmd, reply) {
            let ttl = *ttl_ms;
            let fresh = || Lease { ttl, deadline: at + ttl, kept: BTreeSet::new(), extended: false };
            self.leases.entry(*lease).or_insert_with(fresh);
        }
    }

    /// The lease must be live at the instant of the grant.
    fn check_grant(&self, v: &mut Verdict, at: Millis, lease: LeaseId, req: RequestId, queued: bool, waited: u64) {
        let Some(l) = self.leases.get(&lease) else {
            let ended = self.ended.get(&lease).map_or("never granted".into(), |d| format!("expired at {d} ms"));
            return v.violate(format!("at {at} ms the engine granted to lease {lease}, which has {ended}"));
        };
        if l.deadline > at {
            return; // live throughout this batch
        }
        // It expires inside this batch's advance: the grant must come first.
        let granted = if queued { self.queued_at.get(&(lease, req)).map(|q| q + waited) } else { Some(at) };
        match granted {
            Some(g) if g < l.deadline => {}
            Some(g) => v.violate(format!(
                "at {g} ms the engine granted to lease {lease}, whose deadline was {} ms",
                l.deadline
            )),
            None => v.violate(format!("at {at} ms a queued grant to lease {lease} (req {}) was never queued", req.0)),
        }
    }

    fn expire(&mut self, at: Millis) {
        let due: Vec<LeaseId> = self.leases.iter().filter(|(_, l)| l.deadline <= at).map(|(id, _)| *id).collect();
        for id in due {
            if let Some(l) = self.leases.remove(&id) {
                self.ended.insert(id, l.deadline);
            }
            self.queued_at.retain(|(lease, _), _| *lease != id);
        }
    }

    /// Keep-alives move deadlines; the engine must agree with the model on which
    /// leases exist.
    fn check_reply(&mut self, v: &mut Verdict, at: Millis, cmd: &Command, reply: &Reply) {
        match (cmd, reply) {
            (Command::KeepAlive { req, lease }, Reply::LeaseKept { .. }) => match self.leases.get_mut(lease) {
                Some(l) => {
                    if l.kept.insert(*req) {
                        l.deadline = at + l.ttl;
                        l.extended = false;
                    }
                }
                None => v.violate(format!("at {at} ms the engine kept lease {lease} alive after it expired")),
            },
            (Command::Revoke { lease, .. }, Reply::LeaseRevoked { .. }) => {
                self.leases.remove(lease);
            }
            (_, Reply::Rejected(EngineError::LeaseNotFound(lease))) if self.leases.contains_key(lease) => {
                v.violate(format!(
                    "at {at} ms the engine had forgotten lease {lease}, live until {} ms",
                    self.leases[lease].deadline
                ));
            }
            _ => {}
        }
    }

    /// Forget waits that ended, then note the ones queued by this batch.
    fn track_waits<'a>(
        &mut self,
        at: Millis,
        replies: impl Iterator<Item = (&'a Command, &'a Reply)>,
        effects: &[Effect],
    ) {
        for e in effects {
            match e {
                Effect::Granted { grant, req, queued: true, .. } => self.queued_at.remove(&(grant.lease, *req)),
                Effect::WaitEnded { lease, req, .. } => self.queued_at.remove(&(*lease, *req)),
                _ => None,
            };
        }
        for (cmd, reply) in replies {
            if let (Command::Acquire(a), Reply::Queued { .. }) = (cmd, reply) {
                self.queued_at.entry((a.lease, a.req)).or_insert(at);
            }
        }
    }
}
