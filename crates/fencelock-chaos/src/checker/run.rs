//! The history of one run, indexed for the checks: operations paired from
//! invokes and completions, outages of the lock service, the statistics,
//! and the small tools every check uses to build its [`Check`].

use std::collections::HashMap;

use fencelock_fence::storage::{AuditEntry, Outcome as AuditOutcome};

use super::{Check, RunInfo, Stats, Status, MAX_EXAMPLES};
use crate::history::{Event, Kind, Op};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Res {
    Ok,
    Fail,
    Unknown,
}

/// An invoke and its completion, if any.
#[derive(Debug, Clone, Copy)]
pub(super) struct Operation<'a> {
    pub(super) invoke: &'a Event,
    pub(super) done: Option<&'a Event>,
}

impl<'a> Operation<'a> {
    pub(super) fn res(&self) -> Res {
        match self.done.map(|d| d.kind) {
            Some(Kind::Ok) => Res::Ok,
            Some(Kind::Fail) => Res::Fail,
            _ => Res::Unknown,
        }
    }

    pub(super) fn is(&self, f: Op, res: Res) -> bool {
        self.invoke.f == f && self.res() == res
    }

    /// An ok grant: an acquire, or a campaign that elected its worker.
    pub(super) fn is_grant_ok(&self) -> bool {
        self.invoke.f.is_grant() && self.res() == Res::Ok
    }

    pub(super) fn p(&self) -> &'a str {
        &self.invoke.p
    }

    pub(super) fn seq(&self) -> u64 {
        self.invoke.seq
    }

    pub(super) fn start(&self) -> u64 {
        self.invoke.t
    }

    /// Completion time; never for an operation that did not complete.
    pub(super) fn end(&self) -> u64 {
        self.done.map_or(u64::MAX, |d| d.t)
    }

    pub(super) fn token(&self) -> Option<u64> {
        self.done.and_then(|d| d.token).or(self.invoke.token)
    }

    /// Every token of the operation: a multi grant's (`tokens`), else its `token`.
    pub(super) fn tokens(&self) -> Vec<u64> {
        match self.done.and_then(|d| d.tokens.clone()).or_else(|| self.invoke.tokens.clone()) {
            Some(all) => all,
            None => self.token().into_iter().collect(),
        }
    }

    /// Multi mode: the locks asked, in order (none outside multi mode).
    pub(super) fn locks(&self) -> &'a [String] {
        self.invoke.locks.as_deref().unwrap_or_default()
    }

    pub(super) fn lease(&self) -> Option<u64> {
        self.done.and_then(|d| d.lease).or(self.invoke.lease)
    }

    pub(super) fn append(&self) -> Option<&'a str> {
        self.invoke.append.as_deref()
    }

    /// A grant's lease deadline by its holder's own clock (`CLOCK_MONOTONIC`
    /// ns): its completion plus the `detail.lease_left_ns` the worker saw
    /// there; `None` where the history does not say.
    pub(super) fn lease_deadline(&self) -> Option<u64> {
        let d = self.done?;
        Some(d.t.saturating_add(d.detail.get("lease_left_ns")?.as_u64()?))
    }

    /// A completion that says the lease was gone: a skipped write or a refused token.
    pub(super) fn saw_lease_gone(&self) -> bool {
        self.done.is_some_and(|d| d.kind == Kind::Fail && (d.skipped || d.stale))
    }
}

/// Pairs invokes with completions by `(p, f, seq, key)`, in invoke order. A
/// second invoke with the same key leaves the first without completion.
pub(super) fn pair(history: &[Event]) -> Vec<Operation<'_>> {
    let mut ops: Vec<Operation<'_>> = Vec::new();
    let mut open: HashMap<(&str, Op, u64, Option<&str>), usize> = HashMap::new();
    for e in history {
        let key = (e.p.as_str(), e.f, e.seq, e.key.as_deref());
        match e.kind {
            Kind::Note => {}
            Kind::Invoke => {
                open.insert(key, ops.len());
                ops.push(Operation { invoke: e, done: None });
            }
            Kind::Ok | Kind::Fail | Kind::Unknown => {
                if let Some(i) = open.remove(&key) {
                    ops[i].done = Some(e);
                }
            }
        }
    }
    ops
}

/// A run's history, indexed for the checks.
pub(super) struct Run<'a> {
    pub(super) info: &'a RunInfo,
    pub(super) ops: Vec<Operation<'a>>,
    pub(super) notes: Vec<&'a Event>,
    /// The object's audit entries, by `seq`.
    pub(super) audit: Vec<&'a AuditEntry>,
    /// Outages of the lock service, `(down, up)` by `down`.
    pub(super) outages: Vec<(u64, u64)>,
    /// The latest `up` among `outages[..=i]`.
    pub(super) up_so_far: Vec<u64>,
    pub(super) t0: u64,
    /// The final read, else the last event.
    pub(super) end: u64,
}

impl<'a> Run<'a> {
    pub(super) fn new(info: &'a RunInfo, history: &'a [Event], audit: &'a [AuditEntry]) -> Self {
        let ops = pair(history);
        let notes: Vec<&Event> = history.iter().filter(|e| e.kind == Kind::Note).collect();
        let mut audit: Vec<&AuditEntry> = audit.iter().filter(|a| is_object(info, &a.key)).collect();
        audit.sort_by_key(|a| a.seq);
        let t0 = history.iter().map(|e| e.t).min().unwrap_or(0);
        let last = history.iter().map(|e| e.t).max().unwrap_or(0);
        let end = notes.iter().filter(|e| e.f == Op::FinalRead).map(|e| e.t).max().unwrap_or(last);
        let outages = outages(&notes);
        let up_so_far = outages
            .iter()
            .scan(0, |m: &mut u64, &(_, up)| {
                *m = (*m).max(up);
                Some(*m)
            })
            .collect();
        Run { info, ops, notes, audit, outages, up_so_far, t0, end }
    }

    pub(super) fn notes(&self, f: Op) -> impl Iterator<Item = &'a Event> + '_ {
        self.notes.iter().copied().filter(move |e| e.f == f)
    }

    /// `t` as seconds since the run's first event.
    pub(super) fn at(&self, t: u64) -> String {
        if t == u64::MAX {
            return "never".into();
        }
        format!("+{:.3}s", t.saturating_sub(self.t0) as f64 / 1e9)
    }

    /// Whether an outage of the lock service overlaps `(a, b)`.
    pub(super) fn outage_within(&self, a: u64, b: u64) -> bool {
        let i = self.outages.partition_point(|&(down, _)| down < b);
        i > 0 && self.up_so_far[i - 1] > a
    }

    /// Ok grants (acquires, and campaigns: a term is a token) that carry a
    /// token; a multi grant once per token.
    pub(super) fn grants(&self) -> Vec<(Operation<'a>, u64)> {
        self.ops.iter().filter(|o| o.is_grant_ok()).flat_map(|o| o.tokens().into_iter().map(|t| (*o, t))).collect()
    }

    pub(super) fn describe(&self, o: &Operation<'_>) -> String {
        let what = match o.invoke.f {
            Op::Acquire => "acquire",
            Op::Read => "read",
            Op::Write => "write",
            Op::Release => "release",
            Op::Campaign => "campaign",
            Op::Resign => "resign",
            _ => "note",
        };
        let token = match o.tokens().as_slice() {
            [] => String::new(),
            [t] => format!(" token {t}"),
            all => format!(" tokens {all:?}"),
        };
        format!("{} {what} #{}{token} ({}–{})", o.p(), o.seq(), self.at(o.start()), self.at(o.end()))
    }
}

/// Whether `key` is the run's object (in semaphore mode, one of the
/// workers' objects; in multi mode, one of the locks' objects).
fn is_object(info: &RunInfo, key: &str) -> bool {
    let suffixed = |s: &str| key.strip_prefix(info.object_key.as_str()).is_some_and(|k| k.starts_with(s));
    match (info.permits, info.multi) {
        (0, 0) => key == info.object_key,
        (0, _) => suffixed("-m"),
        _ => suffixed("-w"),
    }
}

/// Outages of the lock service, from the kill to the service being back: each
/// `restart` note (`killed_at` to the note); with no `restart` note (peer
/// engines), each `restarted` evidence, from the last `fault` start before it.
pub(super) fn outages(notes: &[&Event]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = notes.iter().filter(|e| e.f == Op::Restart).map(|e| (killed_at(e), e.t)).collect();
    if out.is_empty() {
        let mut last_start = None;
        for e in notes {
            match e.f {
                Op::Fault if e.phase.as_deref() == Some("start") => last_start = Some(e.t),
                Op::Evidence if e.what.as_deref() == Some("restarted") => out.push((last_start.unwrap_or(e.t), e.t)),
                _ => {}
            }
        }
    }
    out.sort_unstable();
    out
}

pub(super) fn killed_at(e: &Event) -> u64 {
    e.detail["killed_at"].as_u64().unwrap_or(e.t)
}

impl Run<'_> {
    pub(super) fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for o in self.ops.iter().filter(|o| o.p().starts_with('w')) {
            s.operations += 1;
            self.count_op(&mut s, o);
        }
        for e in &self.notes {
            self.count_note(&mut s, e);
        }
        s.restarts = s.restarts.max(s.evidence.get("restarted").copied().unwrap_or(0));
        let (mut audit_write_stale, mut audit_read_stale) = (0, 0);
        for a in &self.audit {
            match a.outcome {
                AuditOutcome::Accepted => s.audit.accepted += 1,
                AuditOutcome::Stale => s.audit.stale += 1,
                AuditOutcome::Unfenced => s.audit.unfenced += 1,
            }
            match (a.outcome, a.op.as_str()) {
                (AuditOutcome::Stale, "GET") => audit_read_stale += 1,
                (AuditOutcome::Stale, _) => audit_write_stale += 1,
                _ => {}
            }
        }
        s.stale_rejected = audit_write_stale.max(s.writes.stale);
        s.stale_reads_rejected = audit_read_stale.max(s.reads_stale);
        s
    }

    pub(super) fn count_op(&self, s: &mut Stats, o: &Operation<'_>) {
        let res = o.res();
        let counts = match o.invoke.f {
            Op::Acquire => &mut s.acquires,
            Op::Read => &mut s.reads,
            Op::Campaign => &mut s.campaigns,
            Op::Release | Op::Resign => &mut s.releases,
            Op::Write => {
                let d = o.done;
                let w = &mut s.writes;
                match res {
                    Res::Ok => w.ok += 1,
                    Res::Unknown => w.unknown += 1,
                    Res::Fail if d.is_some_and(|d| d.stale) => w.stale += 1,
                    Res::Fail if d.is_some_and(|d| d.skipped) => w.skipped += 1,
                    Res::Fail => w.fail += 1,
                }
                return;
            }
            _ => return,
        };
        match res {
            Res::Ok => counts.ok += 1,
            Res::Fail => counts.fail += 1,
            Res::Unknown => counts.unknown += 1,
        }
        if o.invoke.f == Op::Acquire && res == Res::Ok && !o.locks().is_empty() {
            match o.locks().len() {
                1 => s.single_grants += 1,
                _ => s.multi_grants += 1,
            }
        }
        if o.invoke.f == Op::Read && o.done.is_some_and(|d| d.stale) {
            s.reads_stale += 1;
        }
    }

    pub(super) fn count_note(&self, s: &mut Stats, e: &Event) {
        match e.f {
            Op::Fault if e.phase.as_deref() == Some("start") => {
                let id = e.fault.clone().unwrap_or_else(|| self.info.scenario.clone());
                *s.faults.entry(id).or_default() += 1;
            }
            Op::Evidence => {
                let what = e.what.clone().unwrap_or_default();
                *s.evidence.entry(what).or_default() += e.count.unwrap_or(1);
            }
            Op::Restart => s.restarts += 1,
            Op::S1Trial => s.s1_trials += 1,
            Op::Observed => {
                s.leader_events += 1;
                let unvalued = e.value.as_ref().is_some_and(|v| v.iter().all(|x| x.is_empty()));
                s.leaders_without_value += u64::from(e.what.as_deref() == Some("leader") && unvalued);
            }
            Op::Holders => {
                s.holder_polls += 1;
                let n = e.detail["holders"].as_array().map_or(0, Vec::len);
                s.polls_shared += u64::from(n >= 2);
            }
            Op::ServerStats => {
                s.tokens_issued = e.detail["tokens_issued"].as_u64().or(s.tokens_issued);
                s.grants_cancelled = e.detail["grants_cancelled"].as_u64().or(s.grants_cancelled);
                s.grants_expired = e.detail["grants_expired"].as_u64().or(s.grants_expired);
                s.grants_revoked = e.detail["grants_revoked"].as_u64().or(s.grants_revoked);
            }
            _ => {}
        }
    }
}

/// Violations and the first few examples.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) violations: u64,
    pub(super) examples: Vec<String>,
}

impl Tally {
    pub(super) fn add(&mut self, example: impl FnOnce() -> String) {
        self.violations += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(example());
        }
    }

    /// Pass if none; else a finding when `finding`, a failure otherwise.
    pub(super) fn judge(self, id: &str, name: &str, finding: bool) -> Check {
        let status = match (self.violations, finding) {
            (0, _) => Status::Pass,
            (_, true) => Status::Finding,
            (_, false) => Status::Fail,
        };
        Check { id: id.into(), name: name.into(), status, violations: self.violations, examples: self.examples }
    }
}

pub(super) fn without(id: &str, name: &str, status: Status, why: String) -> Check {
    Check { id: id.into(), name: name.into(), status, violations: 0, examples: vec![why] }
}

/// Keeps, for a sweep over time, the operation with the highest token among
/// those completed so far.
pub(super) struct HighestDone<'a> {
    pub(super) by_end: Vec<(Operation<'a>, u64)>,
    pub(super) next: usize,
    pub(super) best: Option<(Operation<'a>, u64)>,
}

impl<'a> HighestDone<'a> {
    pub(super) fn new(mut ops: Vec<(Operation<'a>, u64)>) -> Self {
        ops.sort_by_key(|(o, _)| o.end());
        HighestDone { by_end: ops, next: 0, best: None }
    }

    /// The highest-token operation completed strictly before `t` (call with
    /// `t` ascending).
    pub(super) fn before(&mut self, t: u64) -> Option<(Operation<'a>, u64)> {
        while let Some(&(o, tok)) = self.by_end.get(self.next) {
            if o.end() >= t {
                break;
            }
            if self.best.is_none_or(|(_, b)| tok > b) {
                self.best = Some((o, tok));
            }
            self.next += 1;
        }
        self.best
    }
}
