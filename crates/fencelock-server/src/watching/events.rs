//! From one applied entry (its engine [`Input`] and [`Output`]) to the watch
//! [`Event`]s it produced, in order: first the acquires the entry queued (in
//! command order), then the engine's effects in the engine's order. So a
//! request's `Queued` always comes before its grant or its dequeue.

use std::collections::HashSet;

use fencelock_core::{Acquire, Command, Effect, Engine, Input, Output, ReleaseCause, Reply, WaitEnd};

use super::hub::Rev;

/// What happened to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Granted,
    Released,
    Expired,
    Revoked,
    Queued,
    Dequeued,
}

impl Kind {
    /// Lower-case name, as the CLI and the SSE endpoint print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Granted => "granted",
            Kind::Released => "released",
            Kind::Expired => "expired",
            Kind::Revoked => "revoked",
            Kind::Queued => "queued",
            Kind::Dequeued => "dequeued",
        }
    }
}

/// One watch event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub rev: Rev,
    pub kind: Kind,
    pub lock: String,
    pub lease: u64,
    /// The grant's fencing token; 0 for queued and dequeued.
    pub token: u64,
    /// The holder's identity: "" until acquires carry one.
    pub identity: String,
    /// Why a grant ended or a wait ended, when the kind does not say it all.
    pub reason: &'static str,
}

/// The (lease, request) pairs of an entry's acquires that were already queued
/// before it was applied: a retried acquire answers `Queued` again, which is
/// not a new event. Read from the engine just before the entry is applied.
#[derive(Debug, Default)]
pub struct PendingWaits(HashSet<(u64, u64)>);

impl PendingWaits {
    /// The acquires of `input` that `engine` already has queued.
    pub fn before(engine: &Engine, input: &Input) -> PendingWaits {
        let Input::Batch { cmds, .. } = input else { return PendingWaits::default() };
        let now = engine.now();
        let queued = cmds.iter().filter_map(acquire_of).filter(|a| {
            engine
                .lock_info(now, &a.lock)
                .is_some_and(|info| info.waiters.iter().any(|w| w.lease == a.lease && w.req == a.req))
        });
        PendingWaits(queued.map(|a| (a.lease.0, a.req.0)).collect())
    }
}

/// The acquire inside `cmd`, if it is one (possibly sent `As` a caller).
fn acquire_of(cmd: &Command) -> Option<&Acquire> {
    match cmd {
        Command::Acquire(a) => Some(a),
        Command::As { cmd, .. } => acquire_of(cmd),
        _ => None,
    }
}

/// The events of the entry at `index` that applied `input` with `out`.
pub fn of_entry(index: u64, input: &Input, out: &Output, pending: &PendingWaits) -> Vec<Event> {
    let mut events = Vec::new();
    let mut push = |kind, lock: &str, lease: u64, token: u64, reason| {
        let seq = u32::try_from(events.len()).unwrap_or(u32::MAX);
        let rev = Rev { index, seq };
        events.push(Event { rev, kind, lock: lock.to_string(), lease, token, identity: String::new(), reason });
    };
    if let Input::Batch { cmds, .. } = input {
        let mut seen = HashSet::new();
        for (cmd, reply) in cmds.iter().zip(&out.replies) {
            let (Some(a), Reply::Queued { .. }) = (acquire_of(cmd), reply) else { continue };
            let key = (a.lease.0, a.req.0);
            if !pending.0.contains(&key) && seen.insert(key) {
                push(Kind::Queued, &a.lock, a.lease.0, 0, "");
            }
        }
    }
    for fx in &out.effects {
        match fx {
            Effect::Granted { grant, .. } => push(Kind::Granted, grant.lock.as_str(), grant.lease.0, grant.token.0, ""),
            Effect::Released { grant, cause, .. } => {
                let (kind, reason) = released(*cause);
                push(kind, grant.lock.as_str(), grant.lease.0, grant.token.0, reason)
            }
            Effect::WaitEnded { lock, lease, why, .. } => {
                push(Kind::Dequeued, lock.as_str(), lease.0, 0, wait_end(*why))
            }
            // A lease's end shows as the ends of its grants and waits.
            Effect::LeaseExpired { .. } => {}
        }
    }
    events
}

fn released(cause: ReleaseCause) -> (Kind, &'static str) {
    match cause {
        ReleaseCause::Released => (Kind::Released, "released"),
        ReleaseCause::Cancelled => (Kind::Released, "cancelled"),
        ReleaseCause::Expired => (Kind::Expired, ""),
        ReleaseCause::Revoked => (Kind::Revoked, ""),
    }
}

fn wait_end(why: WaitEnd) -> &'static str {
    match why {
        WaitEnd::TimedOut => "timed_out",
        WaitEnd::LeaseEnded => "lease_ended",
        WaitEnd::Cancelled => "cancelled",
    }
}

#[cfg(test)]
mod tests {
    use fencelock_core::{LeaseId, RequestId, Token};

    use super::*;

    /// Applies `cmds` at `now` as the entry `index`; its events as
    /// (kind, lock, lease, token, reason, seq).
    fn apply(
        e: &mut Engine,
        index: u64,
        now: u64,
        cmds: Vec<Command>,
    ) -> Vec<(Kind, String, u64, u64, &'static str, u32)> {
        let input = Input::Batch { now, cmds };
        let pending = PendingWaits::before(e, &input);
        let out = e.step(&input);
        let events = of_entry(index, &input, &out, &pending);
        assert!(events.iter().all(|ev| ev.rev.index == index));
        events.into_iter().map(|ev| (ev.kind, ev.lock, ev.lease, ev.token, ev.reason, ev.rev.seq)).collect()
    }

    fn lease(id: u64) -> Command {
        Command::GrantLease { req: RequestId(id), ttl_ms: 10_000, id: Some(LeaseId(id)) }
    }

    /// Built from JSON so that fields the engine may add with serde defaults
    /// (a holder's identity, its value) need no change here.
    fn acquire(lease: u64, req: u64, lock: &str, wait_ms: u64) -> Command {
        let a = serde_json::json!({ "req": req, "lease": lease, "lock": lock, "wait_ms": wait_ms, "lock_delay_ms": 0 });
        Command::Acquire(serde_json::from_value(a).expect("an acquire"))
    }

    /// Rules: one event per transition, numbered in the entry from 0; a
    /// queued request's `queued` comes before its grant in the same entry; a
    /// retried acquire that is still queued is not queued again; release,
    /// revoke and a wait that runs out map to their kinds and reasons.
    #[test]
    fn engine_outputs_become_events_in_order() {
        let mut e = Engine::new();
        e.step(&Input::leader_start(0));
        assert_eq!(apply(&mut e, 2, 1, vec![lease(1), lease(2), lease(3)]), vec![]);
        let got = apply(&mut e, 3, 2, vec![acquire(1, 10, "a", 0), acquire(2, 20, "a", 5_000)]);
        let token = |ev: &[(Kind, String, u64, u64, &str, u32)], i: usize| ev[i].3;
        let granted1 = got.iter().find(|ev| ev.0 == Kind::Granted).map(|ev| ev.3).expect("a grant");
        assert_eq!(got, vec![(Kind::Queued, "a".into(), 2, 0, "", 0), (Kind::Granted, "a".into(), 1, granted1, "", 1)]);
        // A retry of the queued acquire: nothing new.
        assert_eq!(apply(&mut e, 4, 3, vec![acquire(2, 20, "a", 5_000)]), vec![]);
        let release =
            Command::Release { req: RequestId(11), lease: LeaseId(1), lock: "a".into(), token: Token(granted1) };
        let got = apply(&mut e, 5, 4, vec![release]);
        let t2 = token(&got, 1);
        assert_eq!(
            got,
            vec![(Kind::Released, "a".into(), 1, granted1, "released", 0), (Kind::Granted, "a".into(), 2, t2, "", 1)]
        );
        let got = apply(&mut e, 6, 5, vec![acquire(3, 30, "a", 100)]);
        assert_eq!(got, vec![(Kind::Queued, "a".into(), 3, 0, "", 0)]);
        // The wait of lease 3 runs out at 105.
        assert_eq!(apply(&mut e, 7, 200, vec![]), vec![(Kind::Dequeued, "a".into(), 3, 0, "timed_out", 0)]);
        let revoke = Command::Revoke { req: RequestId(21), lease: LeaseId(2) };
        assert_eq!(apply(&mut e, 8, 201, vec![revoke]), vec![(Kind::Revoked, "a".into(), 2, t2, "", 0)]);
    }
}
