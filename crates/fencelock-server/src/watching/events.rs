//! From one applied entry (its engine [`Input`] and [`Output`]) to the watch
//! [`Event`]s it produced, in order: first the acquires the entry queued and
//! the refusals it reported (in command order), then the engine's effects in
//! the engine's order. So a request's `Queued` always comes before its grant
//! or its dequeue.
//!
//! A refusal report ([`Command::ReportRefusal`], issue 36) changes no lock:
//! its event (`write_refused`) is made from the command and its `Reported`
//! reply, as a `queued` one is from an acquire and its `Queued` reply, with
//! the identity of the [`Command::As`] caller that sent it ("" without
//! authentication). Being made from the entry, it has the same revision on
//! every node.

use std::collections::HashSet;

use fencelock_core::{Acquire, Command, Effect, Engine, Input, Mode, Output, ReleaseCause, Reply, Tag, WaitEnd};

/// A position in the event history: (log index, position in the entry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rev {
    pub index: u64,
    pub seq: u32,
}

impl Rev {
    /// The revision right after this one.
    pub fn next(self) -> Rev {
        match self.seq.checked_add(1) {
            Some(seq) => Rev { index: self.index, seq },
            None => Rev { index: self.index.saturating_add(1), seq: 0 },
        }
    }

    /// The first revision of the entry at `index`.
    pub fn entry(index: u64) -> Rev {
        Rev { index, seq: 0 }
    }
}

impl std::fmt::Display for Rev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.index, self.seq)
    }
}

impl std::str::FromStr for Rev {
    type Err = String;

    /// `I.S` or `I` (= `I.0`).
    fn from_str(s: &str) -> Result<Rev, String> {
        let bad = || format!("{s:?} is not a revision (INDEX or INDEX.SEQ)");
        let (index, seq) = s.split_once('.').unwrap_or((s, "0"));
        Ok(Rev { index: index.parse().map_err(|_| bad())?, seq: seq.parse().map_err(|_| bad())? })
    }
}

/// What happened to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Granted,
    Released,
    Expired,
    Revoked,
    Queued,
    Dequeued,
    ValueChanged,
    /// A writer became a reader (same token).
    Downgraded,
    /// A fence reported that it refused a stale write (the token refused,
    /// the fence's highest, the resource, the reporter's identity).
    WriteRefused,
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
            Kind::ValueChanged => "value_changed",
            Kind::Downgraded => "downgraded",
            Kind::WriteRefused => "write_refused",
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
    /// The grant's fencing token; the refused token for write refused; 0 for
    /// queued and dequeued.
    pub token: u64,
    /// The identity the acquire carried ("" for none, and for dequeued); for
    /// write refused, the reporter's authenticated identity.
    pub identity: String,
    /// Why a grant ended or a wait ended, when the kind does not say it all.
    pub reason: &'static str,
    /// The value the grant publishes (granted, value changed) or published
    /// (released, expired, revoked); empty otherwise.
    pub value: Vec<u8>,
    /// A shared grant (granted to a reader, downgraded); false otherwise.
    pub shared: bool,
    /// Write refused: the highest token the fence had admitted; 0 otherwise.
    pub highest: u64,
    /// Write refused: what the fence protects ("" when the report named
    /// none); "" otherwise.
    pub resource: String,
}

/// The (lease, request) pairs of an entry's acquires that were already queued
/// before it was applied: a retried acquire answers `Queued` again, which is
/// not a new event. Read from the engine just before the entry is applied.
#[derive(Debug, Default)]
pub struct PendingWaits(HashSet<(u64, u64)>);

impl PendingWaits {
    /// The acquires of `input` that `engine` already has queued. None when
    /// nothing waits, without looking up each acquire's lease (W3's entries
    /// of a thousand acquires spent 5 % of the server's CPU here).
    pub fn before(engine: &Engine, input: &Input) -> PendingWaits {
        let Input::Batch { cmds, .. } = input else { return PendingWaits::default() };
        if engine.waiting() == 0 {
            return PendingWaits::default();
        }
        let queued = cmds.iter().filter_map(acquire_of).filter(|a| engine.is_queued(a.lease, a.req));
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

/// The refusal report in `cmd`, if it is one, and who sent it ("" without
/// a caller).
fn report_of(cmd: &Command) -> Option<(&Command, &str)> {
    match cmd {
        Command::ReportRefusal { .. } => Some((cmd, "")),
        Command::As { caller, cmd } => report_of(cmd).map(|(r, _)| (r, caller.name.as_str())),
        _ => None,
    }
}

/// The events of one entry as they are made, numbered from 0.
struct Made {
    index: u64,
    events: Vec<Event>,
}

impl Made {
    /// One more event. `mode`: the grant's after the event (shared for a
    /// reader's grant and a downgrade), exclusive for every event that is not
    /// about a grant's mode.
    #[allow(clippy::too_many_arguments)] // the fields of the event
    fn push(
        &mut self,
        kind: Kind,
        lock: &str,
        lease: u64,
        token: u64,
        reason: &'static str,
        tag: Option<&Tag>,
        mode: Mode,
    ) {
        let event = self.event(kind, lock, lease, token, reason, tag, mode);
        self.events.push(event);
    }

    /// The next event, not pushed yet.
    #[allow(clippy::too_many_arguments)] // the fields of the event
    fn event(
        &self,
        kind: Kind,
        lock: &str,
        lease: u64,
        token: u64,
        reason: &'static str,
        tag: Option<&Tag>,
        mode: Mode,
    ) -> Event {
        let seq = u32::try_from(self.events.len()).unwrap_or(u32::MAX);
        let rev = Rev { index: self.index, seq };
        let (identity, value) = (Tag::identity(tag).to_owned(), Tag::value(tag).to_vec());
        let shared = mode == Mode::Shared;
        let (lock, highest, resource) = (lock.to_string(), 0, String::new());
        Event { rev, kind, lock, lease, token, identity, reason, value, shared, highest, resource }
    }

    /// The `write_refused` event of the report `cmd` sent by `identity`.
    fn report(&mut self, cmd: &Command, identity: &str) {
        let Command::ReportRefusal { lock, refused, highest, resource } = cmd else { return };
        let tag = Tag { identity: identity.to_owned(), value: Vec::new() };
        let mut event = self.event(Kind::WriteRefused, lock, 0, refused.0, "", Some(&tag), Mode::Exclusive);
        (event.highest, event.resource) = (highest.0, resource.clone());
        self.events.push(event);
    }
}

/// The events of the entry at `index` that applied `input` with `out`.
pub fn of_entry(index: u64, input: &Input, out: &Output, pending: &PendingWaits) -> Vec<Event> {
    let mut made = Made { index, events: Vec::new() };
    let x = Mode::Exclusive;
    if let Input::Batch { cmds, .. } = input {
        let mut seen = HashSet::new();
        for (cmd, reply) in cmds.iter().zip(&out.replies) {
            if let (Some((report, identity)), Reply::Reported) = (report_of(cmd), reply) {
                made.report(report, identity);
                continue;
            }
            let (Some(a), Reply::Queued { .. }) = (acquire_of(cmd), reply) else { continue };
            let key = (a.lease.0, a.req.0);
            if !pending.0.contains(&key) && seen.insert(key) {
                let tag = Tag { identity: a.identity.clone(), value: Vec::new() };
                // A multi-acquire queues on every one of its locks.
                for lock in a.locks() {
                    made.push(Kind::Queued, lock, a.lease.0, 0, "", Some(&tag), x);
                }
            }
        }
    }
    for fx in &out.effects {
        match fx {
            Effect::Granted { grant, tag, mode, .. } => {
                made.push(Kind::Granted, grant.lock.as_str(), grant.lease.0, grant.token.0, "", tag.as_deref(), *mode)
            }
            Effect::Downgraded { grant, tag } => {
                let (lock, lease, token) = (grant.lock.as_str(), grant.lease.0, grant.token.0);
                made.push(Kind::Downgraded, lock, lease, token, "", tag.as_deref(), Mode::Shared)
            }
            Effect::Released { grant, cause, tag, .. } => {
                let (kind, reason) = released(*cause);
                made.push(kind, grant.lock.as_str(), grant.lease.0, grant.token.0, reason, tag.as_deref(), x)
            }
            Effect::ValueChanged { grant, tag } => {
                made.push(Kind::ValueChanged, grant.lock.as_str(), grant.lease.0, grant.token.0, "", tag.as_deref(), x)
            }
            Effect::WaitEnded { lock, lease, why, .. } => {
                made.push(Kind::Dequeued, lock.as_str(), lease.0, 0, wait_end(why), None, x)
            }
            // A lease's end shows as the ends of its grants and waits.
            Effect::LeaseExpired { .. } => {}
        }
    }
    made.events
}

fn released(cause: ReleaseCause) -> (Kind, &'static str) {
    match cause {
        ReleaseCause::Released => (Kind::Released, "released"),
        ReleaseCause::Cancelled => (Kind::Released, "cancelled"),
        ReleaseCause::Expired => (Kind::Expired, ""),
        ReleaseCause::Revoked => (Kind::Revoked, ""),
    }
}

fn wait_end(why: &WaitEnd) -> &'static str {
    match why {
        WaitEnd::TimedOut => "timed_out",
        WaitEnd::LeaseEnded => "lease_ended",
        WaitEnd::Cancelled => "cancelled",
        WaitEnd::SlotDone(_) => "slot_done",
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

    /// Issue 18 §4: a waiter for a once-per slot leaves the queue as
    /// `dequeued` with the reason `slot_done` when the slot is completed,
    /// never granted.
    #[test]
    fn a_waiter_whose_slot_was_done_is_dequeued_as_slot_done() {
        let mut e = Engine::new();
        e.step(&Input::leader_start(0));
        apply(&mut e, 2, 1, vec![lease(1), lease(2)]);
        let once = |lease: u64, req: u64, wait_ms: u64| {
            let a = serde_json::json!({ "req": req, "lease": lease, "lock": "j", "wait_ms": wait_ms,
                "lock_delay_ms": 0, "once_per": "day" });
            Command::Acquire(serde_json::from_value(a).expect("an acquire"))
        };
        let got = apply(&mut e, 3, 2, vec![once(1, 10, 0), once(2, 20, 5_000)]);
        let t1 = got[1].3;
        let (lock, token) = ("j".to_string(), Token(t1));
        let complete = Command::CompleteSlot {
            req: RequestId(11),
            lease: LeaseId(1),
            lock,
            token,
            slot: "day".into(),
            exit_code: 0,
        };
        let release = Command::Release { req: RequestId(12), lease: LeaseId(1), lock: "j".into(), token };
        let got = apply(&mut e, 4, 3, vec![complete, release]);
        // The completion ends the waiter at once, before the release.
        let want = vec![
            (Kind::Dequeued, "j".into(), 2, 0, "slot_done", 0),
            (Kind::Released, "j".into(), 1, t1, "released", 1),
        ];
        assert_eq!(got, want);
    }

    /// A grant's events carry what its acquire said (identity, value), a
    /// queued request its identity, and a new value shows as `value_changed`
    /// with the same token; the end of the grant carries the last value.
    #[test]
    fn identity_and_value_ride_on_grant_events() {
        let mut e = Engine::new();
        e.step(&Input::leader_start(0));
        e.step(&Input::Batch { now: 1, cmds: vec![lease(1), lease(2)] });
        let tagged = |lease: u64, req: u64, wait_ms: u64, who: &str, value: &[u8]| {
            let a = serde_json::json!({ "req": req, "lease": lease, "lock": "e", "wait_ms": wait_ms,
                "lock_delay_ms": 0, "identity": who, "value": fencelock_core::b64::encode(value) });
            Command::Acquire(serde_json::from_value(a).expect("an acquire"))
        };
        let mut step = |index, cmds: Vec<Command>| {
            let input = Input::Batch { now: 2, cmds };
            let pending = PendingWaits::before(&e, &input);
            let out = e.step(&input);
            let events = of_entry(index, &input, &out, &pending);
            events.into_iter().map(|ev| (ev.kind, ev.token, ev.identity, ev.value)).collect::<Vec<_>>()
        };
        let got = step(3, vec![tagged(1, 10, 0, "host-a:1", b"10.0.0.1"), tagged(2, 20, 5_000, "host-b:2", b"B")]);
        let t1 = got[1].1;
        assert_eq!(
            got,
            vec![
                (Kind::Queued, 0, "host-b:2".into(), vec![]),
                (Kind::Granted, t1, "host-a:1".into(), b"10.0.0.1".to_vec())
            ]
        );
        let set = Command::SetValue {
            req: RequestId(11),
            lease: LeaseId(1),
            lock: "e".into(),
            token: Token(t1),
            value: b"10.0.0.9".to_vec(),
        };
        assert_eq!(step(4, vec![set]), vec![(Kind::ValueChanged, t1, "host-a:1".into(), b"10.0.0.9".to_vec())]);
        let release = Command::Release { req: RequestId(12), lease: LeaseId(1), lock: "e".into(), token: Token(t1) };
        let got = step(5, vec![release]);
        assert_eq!(got[0], (Kind::Released, t1, "host-a:1".into(), b"10.0.0.9".to_vec()));
        assert_eq!((got[1].0, &got[1].2, &got[1].3), (Kind::Granted, &"host-b:2".to_string(), &b"B".to_vec()));
    }

    /// Issue 36. Rule: a refusal report that the engine answered `Reported`
    /// becomes one `write_refused` event of its lock, in command order beside
    /// the acquires the entry queued, with the refused token, the fence's
    /// highest, the resource and the identity of the caller that sent it
    /// ("" without one); a report the engine refused makes none, and the
    /// other kinds carry `highest` 0 and `resource` "".
    #[test]
    fn a_report_becomes_one_write_refused_event() {
        let mut e = Engine::new();
        e.step(&Input::leader_start(0));
        e.step(&Input::Batch { now: 1, cmds: vec![lease(1), lease(2)] });
        let report = |refused: u64, highest: u64, resource: &str| Command::ReportRefusal {
            lock: "orders".into(),
            refused: Token(refused),
            highest: Token(highest),
            resource: resource.into(),
        };
        let by = |name: &str, cmd| Command::As {
            caller: fencelock_core::Caller { name: name.into(), admin: false },
            cmd: Box::new(cmd),
        };
        let cmds = vec![
            acquire(1, 10, "orders", 0),
            by("storage-1", report(5, 9, "orders-42")),
            acquire(2, 20, "orders", 5_000),
            report(3, 4, ""),
            report(4, 4, "refused by the engine: not below"),
        ];
        let input = Input::Batch { now: 2, cmds };
        let pending = PendingWaits::before(&e, &input);
        let out = e.step(&input);
        assert!(matches!(out.replies[4], Reply::Rejected(_)), "{:?}", out.replies[4]);
        let got: Vec<_> = of_entry(9, &input, &out, &pending)
            .into_iter()
            .map(|ev| (ev.kind, ev.lock, ev.lease, ev.token, ev.highest, ev.resource, ev.identity, ev.rev.seq))
            .collect();
        let refused = |token, highest, resource: &str, who: &str, seq| {
            (Kind::WriteRefused, "orders".to_string(), 0, token, highest, resource.to_string(), who.to_string(), seq)
        };
        let t1 = got[3].3;
        assert_eq!(
            got,
            vec![
                refused(5, 9, "orders-42", "storage-1", 0),
                (Kind::Queued, "orders".into(), 2, 0, 0, String::new(), String::new(), 1),
                refused(3, 4, "", "", 2),
                (Kind::Granted, "orders".into(), 1, t1, 0, String::new(), String::new(), 3),
            ]
        );
        assert_eq!(Kind::WriteRefused.as_str(), "write_refused");
    }

    /// Read-write locks: a reader's grant is shared, a writer's is not, and a
    /// downgrade is its own event (same token, shared) before the grants of
    /// the readers it lets in.
    #[test]
    fn modes_and_downgrades_ride_on_events() {
        let mut e = Engine::new();
        e.step(&Input::leader_start(0));
        e.step(&Input::Batch { now: 1, cmds: vec![lease(1), lease(2)] });
        let reader = |lease: u64, req: u64, wait_ms: u64| {
            let a = serde_json::json!({ "req": req, "lease": lease, "lock": "rw", "wait_ms": wait_ms,
                "lock_delay_ms": 0, "mode": "Shared" });
            Command::Acquire(serde_json::from_value(a).expect("a shared acquire"))
        };
        let mut step = |index, cmds: Vec<Command>| {
            let input = Input::Batch { now: 2, cmds };
            let pending = PendingWaits::before(&e, &input);
            let out = e.step(&input);
            let events = of_entry(index, &input, &out, &pending);
            events.into_iter().map(|ev| (ev.kind, ev.lease, ev.token, ev.shared)).collect::<Vec<_>>()
        };
        let got = step(3, vec![acquire(1, 10, "rw", 0), reader(2, 20, 5_000)]);
        let t1 = got[1].2;
        assert_eq!(got, vec![(Kind::Queued, 2, 0, false), (Kind::Granted, 1, t1, false)]);
        let down = Command::Downgrade { req: RequestId(11), lease: LeaseId(1), lock: "rw".into(), token: Token(t1) };
        let got = step(4, vec![down]);
        assert_eq!(got, vec![(Kind::Downgraded, 1, t1, true), (Kind::Granted, 2, got[1].2, true)]);
        assert!(got[1].2 > t1);
    }
}
