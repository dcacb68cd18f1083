//! Tests of the checkers on synthetic histories: the builders here, one file
//! per check beside them.

mod a1;
mod c2;
mod c3;
mod c4;
mod c6;
mod c8;
mod e1;
mod e2;
mod e3;
mod general;
mod m1;
mod r1;
mod r2;
mod s1;
mod s4;
mod s6;
mod semaphore;

use fencelock_fence::storage::{AuditEntry, Outcome as AuditOutcome};

use serde_json::json;

use super::{check, Check, Counts, RunInfo, Verdict, NS_PER_MS};
use crate::history::{Event, Kind, Op};

pub(super) const MS: u64 = NS_PER_MS;

pub(super) fn info() -> RunInfo {
    RunInfo {
        scenario: "K4".into(),
        backend: "fencelock".into(),
        mutant: None,
        seed: 1,
        duration_ms: 10_000,
        workers: 2,
        fencing: true,
        durable_tokens: true,
        ttl_ms: 1_000,
        heal_bound_ms: 3_000,
        heal_slack_ms: 0,
        min_stale_rejects: 0,
        required_evidence: vec![],
        object_key: "obj".into(),
        election: false,
        shared: false,
        permits: 0,
        polls_holders: false,
        multi: 0,
        lock: "chaos".into(),
    }
}

/// An election run's info: E1–E3 apply.
pub(super) fn election_info() -> RunInfo {
    RunInfo { scenario: "K1".into(), election: true, ..info() }
}

/// A shared run's info: R1 and R2 apply, the holders were polled.
pub(super) fn shared_info() -> RunInfo {
    RunInfo { scenario: "K1".into(), shared: true, polls_holders: true, ..info() }
}

/// Two leaderships (w0 term 5, w1 term 6) in order, both seen by observer o0
/// (who subscribed first), and the final read with both appends.
pub(super) fn elections() -> H {
    let mut h = H::default();
    h.subscribed("o0", 0)
        .leadership("w0", 1, 10, 5)
        .seen_leader("o0", 12, 5, "w0-1")
        .seen_vacant("o0", 18, 5)
        .leadership("w1", 1, 20, 6)
        .seen_leader("o0", 22, 6, "w1-1")
        .final_read(5_000, &["w0-1", "w1-1"]);
    h
}

/// A synthetic history; times in ms.
#[derive(Default)]
pub(super) struct H(Vec<Event>);

impl H {
    pub(super) fn op(
        &mut self,
        p: &str,
        f: Op,
        seq: u64,
        span: (u64, u64),
        kind: Kind,
        fill: impl Fn(&mut Event),
    ) -> &mut Self {
        let mut inv = Event { seq, ..Event::new(span.0 * MS, p, Kind::Invoke, f) };
        fill(&mut inv);
        if f.is_grant() {
            (inv.token, inv.lease) = (None, None);
        }
        let mut done = Event { t: span.1 * MS, kind, ..inv.clone() };
        fill(&mut done);
        self.0.push(inv);
        if kind != Kind::Invoke {
            self.0.push(done);
        }
        self
    }

    pub(super) fn acquire(&mut self, p: &str, seq: u64, span: (u64, u64), token: u64) -> &mut Self {
        self.op(p, Op::Acquire, seq, span, Kind::Ok, |e| {
            e.token = Some(token);
            e.lease = Some(100 + token);
        })
    }

    pub(super) fn write(&mut self, p: &str, seq: u64, span: (u64, u64), token: u64, kind: Kind) -> &mut Self {
        let id = format!("{p}-{seq}");
        self.op(p, Op::Write, seq, span, kind, |e| {
            e.token = Some(token);
            e.append = Some(id.clone());
        })
    }

    pub(super) fn read(&mut self, p: &str, seq: u64, span: (u64, u64), token: u64) -> &mut Self {
        self.op(p, Op::Read, seq, span, Kind::Ok, |e| e.token = Some(token))
    }

    /// An ok read that returned `value`.
    pub(super) fn read_saw(&mut self, p: &str, seq: u64, span: (u64, u64), token: u64, value: &[&str]) -> &mut Self {
        let value: Vec<String> = value.iter().map(|s| s.to_string()).collect();
        self.op(p, Op::Read, seq, span, Kind::Ok, |e| {
            e.token = Some(token);
            e.value = Some(value.clone());
        })
    }

    /// A poll of the lock's holders at `t`: `(mode, token, weight)` each.
    pub(super) fn holders(&mut self, t: u64, holders: &[(&str, u64, u32)], permits: u32) -> &mut Self {
        let holders: Vec<serde_json::Value> = holders
            .iter()
            .map(|&(mode, token, weight)| json!({ "mode": mode, "token": token, "weight": weight }))
            .collect();
        self.note_by("d0", t, Op::Holders, |e| e.detail = json!({ "holders": holders, "permits": permits }))
    }

    pub(super) fn release(&mut self, p: &str, seq: u64, span: (u64, u64)) -> &mut Self {
        self.op(p, Op::Release, seq, span, Kind::Ok, |e| e.released = Some(true))
    }

    /// A whole cycle: acquire, read, write ok, release, 10 ms apart from `t`.
    pub(super) fn cycle(&mut self, p: &str, seq: u64, t: u64, token: u64) -> &mut Self {
        self.acquire(p, seq, (t, t + 1), token)
            .read(p, seq, (t + 2, t + 3), token)
            .write(p, seq, (t + 4, t + 5), token, Kind::Ok)
            .release(p, seq, (t + 6, t + 7))
    }

    pub(super) fn note(&mut self, t: u64, f: Op, fill: impl FnOnce(&mut Event)) -> &mut Self {
        self.note_by("nemesis", t, f, fill)
    }

    pub(super) fn note_by(&mut self, p: &str, t: u64, f: Op, fill: impl FnOnce(&mut Event)) -> &mut Self {
        let mut e = Event::new(t * MS, p, Kind::Note, f);
        fill(&mut e);
        self.0.push(e);
        self
    }

    /// Election mode: `p` elected with `term`, its campaign invoked at `span.0`.
    pub(super) fn campaign(&mut self, p: &str, seq: u64, span: (u64, u64), term: u64) -> &mut Self {
        self.op(p, Op::Campaign, seq, span, Kind::Ok, |e| {
            e.token = Some(term);
            e.lease = Some(100 + term);
        })
    }

    /// A whole leadership: campaign, read, write ok, resign, 10 ms apart from `t`.
    pub(super) fn leadership(&mut self, p: &str, seq: u64, t: u64, term: u64) -> &mut Self {
        self.campaign(p, seq, (t, t + 1), term)
            .read(p, seq, (t + 2, t + 3), term)
            .write(p, seq, (t + 4, t + 5), term, Kind::Ok)
            .op(p, Op::Resign, seq, (t + 6, t + 7), Kind::Ok, |e| {
                e.token = Some(term);
                e.released = Some(true);
            })
    }

    /// Observer `p` (re)subscribed at `t`.
    pub(super) fn subscribed(&mut self, p: &str, t: u64) -> &mut Self {
        self.note_by(p, t, Op::Subscribed, |_| {})
    }

    /// Observer `p` received, at `t`, the leader of `term` with `value`.
    pub(super) fn seen_leader(&mut self, p: &str, t: u64, term: u64, value: &str) -> &mut Self {
        self.note_by(p, t, Op::Observed, |e| {
            e.what = Some("leader".into());
            e.token = Some(term);
            e.value = Some(vec![value.into()]);
        })
    }

    /// Observer `p` received, at `t`, the end of `term`.
    pub(super) fn seen_vacant(&mut self, p: &str, t: u64, term: u64) -> &mut Self {
        self.note_by(p, t, Op::Observed, |e| {
            e.what = Some("vacant".into());
            e.token = Some(term);
        })
    }

    pub(super) fn fault(&mut self, t: u64, phase: &str) -> &mut Self {
        self.note(t, Op::Fault, |e| {
            e.fault = Some("K4".into());
            e.phase = Some(phase.into());
            e.target = Some("server".into());
        })
    }

    pub(super) fn evidence(&mut self, t: u64, what: &str, count: u64) -> &mut Self {
        self.note(t, Op::Evidence, |e| {
            e.what = Some(what.into());
            e.count = Some(count);
        })
    }

    pub(super) fn restart(&mut self, killed: u64, t: u64) -> &mut Self {
        self.note(t, Op::Restart, |e| e.detail = json!({ "killed_at": killed * MS }))
    }

    pub(super) fn holder(&mut self, killed: u64, t: u64, token: Option<u64>) -> &mut Self {
        self.note(t, Op::Holder, |e| {
            e.detail = json!({ "killed_at": killed * MS });
            e.token = token;
            e.lease = token.map(|t| 100 + t);
        })
    }

    /// Semaphore mode: the final read of object `key`.
    pub(super) fn final_read_of(&mut self, t: u64, key: &str, ids: &[&str]) -> &mut Self {
        let value = ids.iter().map(|s| s.to_string()).collect();
        self.note_by("harness", t, Op::FinalRead, |e| {
            e.value = Some(value);
            e.target = Some(key.into());
        })
    }

    pub(super) fn final_read(&mut self, t: u64, ids: &[&str]) -> &mut Self {
        let value = ids.iter().map(|s| s.to_string()).collect();
        self.note(t, Op::FinalRead, |e| e.value = Some(value))
    }

    pub(super) fn events(&self) -> Vec<Event> {
        let mut v = self.0.clone();
        v.sort_by_key(|e| e.t);
        v
    }
}

pub(super) fn audit(entries: &[(u64, AuditOutcome)]) -> Vec<AuditEntry> {
    let mut highest = 0;
    entries
        .iter()
        .enumerate()
        .map(|(i, &(token, outcome))| {
            if outcome == AuditOutcome::Accepted {
                highest = highest.max(token);
            }
            AuditEntry {
                seq: i as u64,
                time_ms: 0,
                op: "PUT".into(),
                key: "obj".into(),
                lock: "chaos".into(),
                token,
                outcome,
                highest,
            }
        })
        .collect()
}

/// An audit log of `(op, token, outcome)` entries (`GET` a fenced read).
pub(super) fn audit_ops(entries: &[(&str, u64, AuditOutcome)]) -> Vec<AuditEntry> {
    let tokens: Vec<(u64, AuditOutcome)> = entries.iter().map(|&(_, t, o)| (t, o)).collect();
    let mut log = audit(&tokens);
    for (entry, (op, _, _)) in log.iter_mut().zip(entries) {
        entry.op = (*op).into();
    }
    log
}

pub(super) fn run(info: &RunInfo, h: &H, audit: &[AuditEntry]) -> Verdict {
    check(info, &h.events(), audit)
}

pub(super) fn get<'a>(v: &'a Verdict, id: &str) -> &'a Check {
    v.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no check {id}"))
}

/// Two cycles in grant order; the server restarts while w0 holds the
/// lock, and gives it back; the fault heals; the final read has both appends.
pub(super) fn clean() -> H {
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 1)
        .read("w0", 1, (2, 3), 1)
        .write("w0", 1, (4, 5), 1, Kind::Ok)
        .fault(10, "start")
        .restart(10, 20)
        .holder(10, 21, Some(1))
        .evidence(22, "restarted", 1)
        .fault(23, "end")
        .release("w0", 1, (24, 25))
        .cycle("w1", 1, 30, 2)
        .final_read(5_000, &["w0-1", "w1-1"]);
    h
}
