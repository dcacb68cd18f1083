//! The checkers: pure functions from a run's merged history and the storage's
//! audit log to a [`Verdict`]. No IO, no clock; `run` calls [`check`] and
//! writes `verdict.json`, `report` reads verdicts back into `docs/safety.md`.
//!
//! Operations are paired by `(p, f, seq)`: an invoke and the next completion
//! with the same key. A completion `unknown`, or none at all, is *unknown*:
//! it may or may not have happened, and is never counted as a success.
//!
//! Every check can fail. A check whose precondition is absent (no restart for
//! C6, no S1 trial for S1) is `not-applicable`; a check that could have
//! evaluated something but saw nothing to evaluate is `inconclusive`, which
//! fails the run like a violation does (C2 with no tokened grant, C3 with no
//! write, C4 with no final read, C6 with no restart it could judge, S6 with
//! every fault ending too close to the run's end, C8 missing evidence). A
//! backend that declares no fencing token turns violations of C2/C3/C4/C6
//! into `finding`s: it does what it declares; so does one that declares no
//! durable tokens, for C2 across restarts, C6, and S6 after a restart.
//!
//! A1 (not in the reference): under TLS and auth, no call of the run was
//! refused for its credentials; see [`a1_no_refusals`].
//!
//! Rules where the reference leaves room:
//! * C2: a duplicate or an inversion counts once per later grant; a pair is
//!   *across a restart* if an outage of the lock service (`restart` note:
//!   `killed_at` to the note; peer engines: the `fault` start to the
//!   `restarted` evidence) overlaps the time between the two grants'
//!   completions (the later grant may have been asked for before the kill).
//! * C3: the audit log and the history see the same accepts, so the check
//!   reports the larger of the two counts, with examples from both.
//! * Stale writes rejected: likewise the larger of the audit log's refused
//!   `PUT`/`DELETE`s and the history's `fail` + `stale` writes. C8's minimum
//!   counts stale writes that reached the fence, refused or (C3) accepted,
//!   and is waived when the backend gives no token (there is nothing to fence).
//! * C6: the holder at a kill is the last grant completed before it, if its
//!   worker had not invoked the release of that cycle and had not seen the
//!   lease gone (a `skipped` write, or a read/write refused as `stale`) before
//!   the kill. A lost grant is reported at the first restart that loses it.
//!   The holder read back must carry that lease and token, unless the worker
//!   invoked its release between the kill and the read-back.
//! * S6: a fault is healed by the earliest completion of a write `ok` invoked
//!   after the fault's end; the run's end is the final read (else the last
//!   event). A fault with no such write is ignored if the run ended within
//!   the bound, a violation otherwise. A slow heal after a fault that
//!   restarted a backend without durable tokens is a finding: its tokens went
//!   back, and the fence refuses every write until they pass the mark again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use fencelock_fence::storage::{AuditEntry, Outcome as AuditOutcome};
use serde::{Deserialize, Serialize};

use crate::history::{Event, Kind, Op};

const NS_PER_MS: u64 = 1_000_000;
/// Examples kept per check.
const MAX_EXAMPLES: usize = 5;

/// What was run, and what the backend declares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// `K1`, `K2`, …
    pub scenario: String,
    /// `fencelock`, `redis`, `redlock`, `etcd`, `zk`, `postgres`.
    pub backend: String,
    /// `fencing-off`, `memory-token`, `dead-waiter`.
    pub mutant: Option<String>,
    pub seed: u64,
    pub duration_ms: u64,
    pub workers: u32,
    /// The backend's grants carry a fencing token.
    pub fencing: bool,
    /// The backend's tokens survive its restarts.
    pub durable_tokens: bool,
    pub ttl_ms: u64,
    /// S6: a fault must be healed within this many ms of its end.
    pub heal_bound_ms: u64,
    /// Stale writes that must reach the fence, else the run is inconclusive.
    pub min_stale_rejects: u64,
    /// Evidence `what`s that must each have been seen.
    pub required_evidence: Vec<String>,
    /// The object the workers append to (also the fence key).
    pub object_key: String,
}

/// A check's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Pass,
    Fail,
    /// The run could not show what the check needs; fails the run.
    Inconclusive,
    /// A violation the backend's declared capabilities allow.
    Finding,
    /// The check's precondition is absent from this run.
    NotApplicable,
}

impl Status {
    /// Fail and Inconclusive fail a run.
    pub fn is_red(self) -> bool {
        matches!(self, Status::Fail | Status::Inconclusive)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Inconclusive => "inconclusive",
            Status::Finding => "finding",
            Status::NotApplicable => "not applicable",
        })
    }
}

/// One check of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// `C2`, `S6`, …
    pub id: String,
    pub name: String,
    pub status: Status,
    pub violations: u64,
    /// Up to five, with times (s from the run's first event), workers, tokens;
    /// for `inconclusive` and `not-applicable`, why.
    pub examples: Vec<String>,
}

/// Completions of one kind of operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub ok: u64,
    pub fail: u64,
    /// Completed `unknown`, or never completed.
    pub unknown: u64,
}

/// Completions of writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteCounts {
    pub ok: u64,
    /// Refused by the fence (409).
    pub stale: u64,
    /// Not sent: the worker found its lease gone.
    pub skipped: u64,
    /// Other definite failures.
    pub fail: u64,
    pub unknown: u64,
}

/// The audit log's decisions on the run's object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditCounts {
    pub accepted: u64,
    pub stale: u64,
    pub unfenced: u64,
}

/// What happened in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Worker operations invoked.
    pub operations: u64,
    pub acquires: Counts,
    /// `fail` includes `reads_stale`.
    pub reads: Counts,
    pub reads_stale: u64,
    pub writes: WriteCounts,
    pub releases: Counts,
    /// `fault` start notes by fault id.
    pub faults: BTreeMap<String, u64>,
    /// Restarts of the lock service.
    pub restarts: u64,
    /// Evidence counts by `what`.
    pub evidence: BTreeMap<String, u64>,
    pub audit: AuditCounts,
    /// Writes refused by the fence: the larger of the audit log's and the history's count.
    pub stale_rejected: u64,
    /// S6: the slowest heal, ms.
    pub heal_max_ms: Option<u64>,
    pub s1_trials: u64,
    pub tokens_issued: Option<u64>,
    /// Grants the server released undelivered (their caller had gone before
    /// the answer reached it): each consumed a token that no client saw.
    pub grants_cancelled: Option<u64>,
    /// Grants ended by their lease's expiry: in S4, a client that lost every
    /// answer for longer than its lease gives the lease up and retries on a new
    /// one; the grant it never heard of ends with the old lease.
    pub grants_expired: Option<u64>,
    /// Grants ended by a revoke of their lease during the run (before the
    /// workers stopped): a client that lost every answer may give its lease up.
    pub grants_revoked: Option<u64>,
}

/// The result of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub info: RunInfo,
    pub checks: Vec<Check>,
    pub stats: Stats,
    /// No check failed or was inconclusive.
    pub passed: bool,
}

/// Checks one run: `history` merged by time, `audit` the storage's whole log.
pub fn check(info: &RunInfo, history: &[Event], audit: &[AuditEntry]) -> Verdict {
    let r = Run::new(info, history, audit);
    let mut stats = r.stats();
    let (s6, heal_max_ms) = s6_heal(&r);
    stats.heal_max_ms = heal_max_ms;
    let c3 = c3_stale_accepts(&r);
    let c8 = c8_evidence(&r, &stats, c3.violations);
    let checks = vec![
        c2_tokens(&r),
        c3,
        c4_lost_updates(&r),
        c6_grants_survive(&r),
        c8,
        s1_dead_waiters(&r),
        s4_exactly_once(&r, &stats),
        s6,
        a1_no_refusals(&r),
    ];
    let passed = !checks.iter().any(|c| c.status.is_red());
    Verdict { info: info.clone(), checks, stats, passed }
}

// ---- operations ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Res {
    Ok,
    Fail,
    Unknown,
}

/// An invoke and its completion, if any.
#[derive(Debug, Clone, Copy)]
struct Operation<'a> {
    invoke: &'a Event,
    done: Option<&'a Event>,
}

impl<'a> Operation<'a> {
    fn res(&self) -> Res {
        match self.done.map(|d| d.kind) {
            Some(Kind::Ok) => Res::Ok,
            Some(Kind::Fail) => Res::Fail,
            _ => Res::Unknown,
        }
    }

    fn is(&self, f: Op, res: Res) -> bool {
        self.invoke.f == f && self.res() == res
    }

    fn p(&self) -> &'a str {
        &self.invoke.p
    }

    fn seq(&self) -> u64 {
        self.invoke.seq
    }

    fn start(&self) -> u64 {
        self.invoke.t
    }

    /// Completion time; never for an operation that did not complete.
    fn end(&self) -> u64 {
        self.done.map_or(u64::MAX, |d| d.t)
    }

    fn token(&self) -> Option<u64> {
        self.done.and_then(|d| d.token).or(self.invoke.token)
    }

    fn lease(&self) -> Option<u64> {
        self.done.and_then(|d| d.lease).or(self.invoke.lease)
    }

    fn append(&self) -> Option<&'a str> {
        self.invoke.append.as_deref()
    }

    /// A completion that says the lease was gone: a skipped write or a refused token.
    fn saw_lease_gone(&self) -> bool {
        self.done.is_some_and(|d| d.kind == Kind::Fail && (d.skipped || d.stale))
    }
}

/// Pairs invokes with completions by `(p, f, seq)`, in invoke order. A second
/// invoke with the same key leaves the first without completion.
fn pair(history: &[Event]) -> Vec<Operation<'_>> {
    let mut ops: Vec<Operation<'_>> = Vec::new();
    let mut open: HashMap<(&str, Op, u64), usize> = HashMap::new();
    for e in history {
        let key = (e.p.as_str(), e.f, e.seq);
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
struct Run<'a> {
    info: &'a RunInfo,
    ops: Vec<Operation<'a>>,
    notes: Vec<&'a Event>,
    /// The object's audit entries, by `seq`.
    audit: Vec<&'a AuditEntry>,
    /// Outages of the lock service, `(down, up)` by `down`.
    outages: Vec<(u64, u64)>,
    /// The latest `up` among `outages[..=i]`.
    up_so_far: Vec<u64>,
    t0: u64,
    /// The final read, else the last event.
    end: u64,
}

impl<'a> Run<'a> {
    fn new(info: &'a RunInfo, history: &'a [Event], audit: &'a [AuditEntry]) -> Self {
        let ops = pair(history);
        let notes: Vec<&Event> = history.iter().filter(|e| e.kind == Kind::Note).collect();
        let mut audit: Vec<&AuditEntry> = audit.iter().filter(|a| a.key == info.object_key).collect();
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

    fn notes(&self, f: Op) -> impl Iterator<Item = &'a Event> + '_ {
        self.notes.iter().copied().filter(move |e| e.f == f)
    }

    /// `t` as seconds since the run's first event.
    fn at(&self, t: u64) -> String {
        if t == u64::MAX {
            return "never".into();
        }
        format!("+{:.3}s", t.saturating_sub(self.t0) as f64 / 1e9)
    }

    /// Whether an outage of the lock service overlaps `(a, b)`.
    fn outage_within(&self, a: u64, b: u64) -> bool {
        let i = self.outages.partition_point(|&(down, _)| down < b);
        i > 0 && self.up_so_far[i - 1] > a
    }

    /// Ok acquires that carry a token.
    fn grants(&self) -> Vec<(Operation<'a>, u64)> {
        self.ops.iter().filter(|o| o.is(Op::Acquire, Res::Ok)).filter_map(|o| o.token().map(|t| (*o, t))).collect()
    }

    fn describe(&self, o: &Operation<'_>) -> String {
        let what = match o.invoke.f {
            Op::Acquire => "acquire",
            Op::Read => "read",
            Op::Write => "write",
            Op::Release => "release",
            _ => "note",
        };
        let token = o.token().map_or(String::new(), |t| format!(" token {t}"));
        format!("{} {what} #{}{token} ({}–{})", o.p(), o.seq(), self.at(o.start()), self.at(o.end()))
    }
}

/// Outages of the lock service, from the kill to the service being back: each
/// `restart` note (`killed_at` to the note); with no `restart` note (peer
/// engines), each `restarted` evidence, from the last `fault` start before it.
fn outages(notes: &[&Event]) -> Vec<(u64, u64)> {
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

fn killed_at(e: &Event) -> u64 {
    e.detail["killed_at"].as_u64().unwrap_or(e.t)
}

// ---- statistics ----

impl Run<'_> {
    fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for o in self.ops.iter().filter(|o| o.p().starts_with('w')) {
            s.operations += 1;
            self.count_op(&mut s, o);
        }
        for e in &self.notes {
            self.count_note(&mut s, e);
        }
        s.restarts = s.restarts.max(s.evidence.get("restarted").copied().unwrap_or(0));
        let mut audit_write_stale = 0;
        for a in &self.audit {
            match a.outcome {
                AuditOutcome::Accepted => s.audit.accepted += 1,
                AuditOutcome::Stale => s.audit.stale += 1,
                AuditOutcome::Unfenced => s.audit.unfenced += 1,
            }
            if a.outcome == AuditOutcome::Stale && a.op != "GET" {
                audit_write_stale += 1;
            }
        }
        s.stale_rejected = audit_write_stale.max(s.writes.stale);
        s
    }

    fn count_op(&self, s: &mut Stats, o: &Operation<'_>) {
        let res = o.res();
        let counts = match o.invoke.f {
            Op::Acquire => &mut s.acquires,
            Op::Read => &mut s.reads,
            Op::Release => &mut s.releases,
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
        if o.invoke.f == Op::Read && o.done.is_some_and(|d| d.stale) {
            s.reads_stale += 1;
        }
    }

    fn count_note(&self, s: &mut Stats, e: &Event) {
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

// ---- building checks ----

/// Violations and the first few examples.
#[derive(Default)]
struct Tally {
    violations: u64,
    examples: Vec<String>,
}

impl Tally {
    fn add(&mut self, example: impl FnOnce() -> String) {
        self.violations += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(example());
        }
    }

    /// Pass if none; else a finding when `finding`, a failure otherwise.
    fn judge(self, id: &str, name: &str, finding: bool) -> Check {
        let status = match (self.violations, finding) {
            (0, _) => Status::Pass,
            (_, true) => Status::Finding,
            (_, false) => Status::Fail,
        };
        Check { id: id.into(), name: name.into(), status, violations: self.violations, examples: self.examples }
    }
}

fn without(id: &str, name: &str, status: Status, why: String) -> Check {
    Check { id: id.into(), name: name.into(), status, violations: 0, examples: vec![why] }
}

/// Keeps, for a sweep over time, the operation with the highest token among
/// those completed so far.
struct HighestDone<'a> {
    by_end: Vec<(Operation<'a>, u64)>,
    next: usize,
    best: Option<(Operation<'a>, u64)>,
}

impl<'a> HighestDone<'a> {
    fn new(mut ops: Vec<(Operation<'a>, u64)>) -> Self {
        ops.sort_by_key(|(o, _)| o.end());
        HighestDone { by_end: ops, next: 0, best: None }
    }

    /// The highest-token operation completed strictly before `t` (call with
    /// `t` ascending).
    fn before(&mut self, t: u64) -> Option<(Operation<'a>, u64)> {
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

// ---- C2 ----

const C2: &str = "tokens unique and increasing in grant order";

/// C2: tokens of ok grants are unique, and a grant completed before another
/// was invoked has the smaller token, across restarts.
fn c2_tokens(r: &Run<'_>) -> Check {
    if !r.info.fencing {
        return without("C2", C2, Status::NotApplicable, "the backend gives no fencing token".into());
    }
    let grants = r.grants();
    if grants.is_empty() {
        return without("C2", C2, Status::Inconclusive, "no grant with a token in the history".into());
    }
    let (mut tally, mut local) = (Tally::default(), false);
    let mut seen: HashMap<u64, Operation<'_>> = HashMap::new();
    for (g, tok) in &grants {
        if let Some(first) = seen.get(tok) {
            let (a, b) = if first.end() <= g.end() { (first, g) } else { (g, first) };
            let across = r.outage_within(a.end(), b.end());
            local |= !across;
            tally.add(|| {
                format!("duplicate token {tok}: {} and {}{}", r.describe(a), r.describe(b), restart_note(across))
            });
        } else {
            seen.insert(*tok, *g);
        }
    }
    let mut by_start = grants.clone();
    by_start.sort_by_key(|(o, _)| o.start());
    let mut highest = HighestDone::new(grants);
    for (b, tb) in by_start {
        let Some((a, ta)) = highest.before(b.start()) else { continue };
        if ta > tb {
            let across = r.outage_within(a.end(), b.end());
            local |= !across;
            tally
                .add(|| format!("token inversion: {} then {}{}", r.describe(&a), r.describe(&b), restart_note(across)));
        }
    }
    // Without durable tokens, only inversions across a restart are allowed by the declaration.
    let finding = !r.info.durable_tokens && !local;
    tally.judge("C2", C2, finding)
}

fn restart_note(across: bool) -> &'static str {
    if across {
        ", a restart between"
    } else {
        ""
    }
}

// ---- C3 ----

const C3: &str = "no stale accepts by the fenced storage";

/// C3: the storage never carries out an operation whose token is below the
/// highest token it carried out before (audit log, by `seq`); and in the
/// history no write succeeds after an ok read or write with a higher token
/// had completed.
fn c3_stale_accepts(r: &Run<'_>) -> Check {
    let writes_ok = r.ops.iter().any(|o| o.is(Op::Write, Res::Ok));
    if r.audit.is_empty() && !writes_ok {
        return without("C3", C3, Status::Inconclusive, "no write reached the storage".into());
    }
    let audit = c3_audit(r);
    let history = c3_history(r);
    let mut examples = audit.examples;
    examples.extend(history.examples);
    examples.truncate(MAX_EXAMPLES);
    let tally = Tally { violations: audit.violations.max(history.violations), examples };
    tally.judge("C3", C3, !r.info.fencing)
}

fn c3_audit(r: &Run<'_>) -> Tally {
    let mut tally = Tally::default();
    let mut mark: Option<(u64, u64)> = None; // (token, seq)
    for a in &r.audit {
        if a.outcome == AuditOutcome::Stale {
            continue;
        }
        let below = mark.is_some_and(|(m, _)| a.token < m);
        if a.outcome == AuditOutcome::Unfenced || below {
            let (m, at) = mark.unwrap_or((a.highest, a.seq));
            tally.add(|| {
                format!(
                    "audit #{}: {} token {} carried out ({:?}) after token {m} at #{at}",
                    a.seq, a.op, a.token, a.outcome
                )
            });
        }
        if mark.is_none_or(|(m, _)| a.token > m) {
            mark = Some((a.token, a.seq));
        }
    }
    tally
}

fn c3_history(r: &Run<'_>) -> Tally {
    let mut tally = Tally::default();
    let done: Vec<(Operation<'_>, u64)> = r
        .ops
        .iter()
        .filter(|o| o.is(Op::Write, Res::Ok) || o.is(Op::Read, Res::Ok))
        .filter_map(|o| o.token().map(|t| (*o, t)))
        .collect();
    let mut writes: Vec<(Operation<'_>, u64)> = done.iter().filter(|(o, _)| o.invoke.f == Op::Write).copied().collect();
    writes.sort_by_key(|(o, _)| o.start());
    let mut highest = HighestDone::new(done);
    for (w, tw) in writes {
        if let Some((x, tx)) = highest.before(w.start()) {
            if tx > tw {
                tally.add(|| format!("stale write accepted: {} after {}", r.describe(&w), r.describe(&x)));
            }
        }
    }
    tally
}

// ---- C4 ----

const C4: &str = "no lost updates";

/// C4: the final value holds every acknowledged append, nothing twice, and
/// nothing that was not written (or whose write certainly failed).
fn c4_lost_updates(r: &Run<'_>) -> Check {
    let Some(fin) = r.notes(Op::FinalRead).filter_map(|e| e.value.as_ref()).last() else {
        return without("C4", C4, Status::Inconclusive, "no final read of the object".into());
    };
    let mut writes: HashMap<&str, Operation<'_>> = HashMap::new();
    for o in r.ops.iter().filter(|o| o.invoke.f == Op::Write) {
        if let Some(id) = o.append() {
            writes.entry(id).or_insert(*o);
        }
    }
    let mut in_final: HashMap<&str, u64> = HashMap::new();
    for id in fin {
        *in_final.entry(id.as_str()).or_default() += 1;
    }
    let mut tally = Tally::default();
    let mut acked: Vec<&Operation<'_>> = writes.values().filter(|o| o.res() == Res::Ok).collect();
    acked.sort_by_key(|o| o.start());
    for o in acked {
        if !in_final.contains_key(o.append().unwrap_or_default()) {
            tally.add(|| {
                format!(
                    "lost update: {} appended {:?}, missing from the final value",
                    r.describe(o),
                    o.append().unwrap_or_default()
                )
            });
        }
    }
    let mut reported = HashSet::new();
    for id in fin.iter().map(String::as_str) {
        if !reported.insert(id) {
            continue;
        }
        let n = in_final[id];
        if n > 1 {
            tally.add(|| format!("{id:?} appears {n} times in the final value"));
        }
        match writes.get(id) {
            None => tally.add(|| format!("{id:?} is in the final value but was never written")),
            Some(o) if o.res() == Res::Fail => {
                let why = o.done.and_then(|d| d.error.clone()).unwrap_or_default();
                tally.add(|| format!("{id:?} is in the final value but its write failed: {} ({why})", r.describe(o)));
            }
            Some(_) => {}
        }
    }
    tally.judge("C4", C4, !r.info.fencing)
}

// ---- C6 ----

const C6: &str = "acknowledged grants survive restarts";

/// C6: after each restart, the holder read back is the grant that was live
/// at the kill (see the module's rules).
fn c6_grants_survive(r: &Run<'_>) -> Check {
    let restarts: Vec<&Event> = r.notes(Op::Restart).collect();
    if restarts.is_empty() {
        let why = "no restart with a holder read-back in this run".to_string();
        return without("C6", C6, Status::NotApplicable, why);
    }
    let index = CycleIndex::new(r);
    let (mut tally, mut evaluated) = (Tally::default(), 0);
    let mut lost: HashSet<(&str, u64)> = HashSet::new();
    for (i, restart) in restarts.iter().enumerate() {
        let kill = killed_at(restart);
        let next = restarts.get(i + 1).map_or(u64::MAX, |n| n.t);
        let Some(holder) = holder_after(r, restart, kill, next) else { continue };
        let Some(h) = index.live_at(kill) else { continue };
        if lost.contains(&(h.p(), h.seq())) || index.release_invoked(&h, kill, holder.t) {
            continue;
        }
        evaluated += 1;
        let token_ok = !r.info.fencing || h.token().is_none() || holder.token == h.token();
        if holder.lease != h.lease() || !token_ok {
            lost.insert((h.p(), h.seq()));
            tally.add(|| {
                format!(
                    "killed {}: {} held lease {:?}; read back at {}: lease {:?} token {:?}",
                    r.at(kill),
                    r.describe(&h),
                    h.lease(),
                    r.at(holder.t),
                    holder.lease,
                    holder.token
                )
            });
        }
    }
    if evaluated == 0 {
        let why = format!("{} restarts, none with a live holder at the kill and a holder read back", restarts.len());
        return without("C6", C6, Status::Inconclusive, why);
    }
    tally.judge("C6", C6, !r.info.fencing || !r.info.durable_tokens)
}

/// The first holder note after `restart` (and before the next restart) that
/// belongs to the kill at `kill`.
fn holder_after<'a>(r: &Run<'a>, restart: &Event, kill: u64, next: u64) -> Option<&'a Event> {
    r.notes(Op::Holder)
        .filter(|h| h.t >= restart.t && h.t < next)
        .find(|h| h.detail["killed_at"].as_u64().is_none_or(|k| k == kill))
}

/// Ok grants by completion time, and each worker cycle's operations.
struct CycleIndex<'a> {
    grants: Vec<Operation<'a>>,
    cycles: HashMap<(&'a str, u64), Vec<Operation<'a>>>,
}

impl<'a> CycleIndex<'a> {
    fn new(r: &Run<'a>) -> Self {
        let mut grants: Vec<Operation<'a>> = r.ops.iter().filter(|o| o.is(Op::Acquire, Res::Ok)).copied().collect();
        grants.sort_by_key(|o| o.end());
        let mut cycles: HashMap<(&str, u64), Vec<Operation<'a>>> = HashMap::new();
        for o in &r.ops {
            cycles.entry((o.p(), o.seq())).or_default().push(*o);
        }
        CycleIndex { grants, cycles }
    }

    /// The last grant completed before `kill`, if its worker had neither
    /// invoked that cycle's release nor seen the lease gone by then.
    fn live_at(&self, kill: u64) -> Option<Operation<'a>> {
        let i = self.grants.partition_point(|o| o.end() < kill);
        let h = *self.grants.get(i.checked_sub(1)?)?;
        let cycle = self.cycles.get(&(h.p(), h.seq()))?;
        let ended = cycle
            .iter()
            .any(|o| (o.invoke.f == Op::Release && o.start() < kill) || (o.saw_lease_gone() && o.end() < kill));
        (!ended).then_some(h)
    }

    /// Whether `h`'s worker invoked the cycle's release in `[from, to)`.
    ///
    /// The harness holds every client's traffic to the lock service from the
    /// kill until the holder has been read back, so a release invoked after
    /// the kill can only have taken effect if it was acknowledged before the
    /// read-back; only then is the changed holder excused.
    fn release_invoked(&self, h: &Operation<'_>, from: u64, to: u64) -> bool {
        self.cycles.get(&(h.p(), h.seq())).is_some_and(|c| {
            c.iter().any(|o| {
                o.invoke.f == Op::Release && (from..to).contains(&o.start()) && o.res() == Res::Ok && o.end() < to
            })
        })
    }
}

// ---- C8 ----

const C8: &str = "the faults provably happened";

/// C8: every required evidence was seen, and (K1, K2) enough stale writes
/// reached the fence; else the run is inconclusive.
fn c8_evidence(r: &Run<'_>, stats: &Stats, stale_accepts: u64) -> Check {
    let need_stale = r.info.min_stale_rejects > 0 && r.info.fencing;
    if r.info.required_evidence.is_empty() && !need_stale {
        return without("C8", C8, Status::NotApplicable, "the scenario requires no evidence".into());
    }
    let mut tally = Tally::default();
    for what in &r.info.required_evidence {
        if stats.evidence.get(what).copied().unwrap_or(0) == 0 {
            tally.add(|| format!("no evidence {what:?}"));
        }
    }
    let seen = stats.stale_rejected + stale_accepts;
    if need_stale && seen < r.info.min_stale_rejects {
        tally.add(|| format!("{seen} stale writes reached the fence, {} required", r.info.min_stale_rejects));
    }
    let status = if tally.violations == 0 { Status::Pass } else { Status::Inconclusive };
    Check { id: "C8".into(), name: C8.into(), status, violations: tally.violations, examples: tally.examples }
}

// ---- S1 ----

const S1: &str = "no grant to a dead waiter";

/// S1: after the holder released, the lock did not go to the waiter whose
/// lease had expired.
fn s1_dead_waiters(r: &Run<'_>) -> Check {
    let trials: Vec<&Event> = r.notes(Op::S1Trial).collect();
    if trials.is_empty() {
        return without("S1", S1, Status::NotApplicable, "no S1 trial in this run".into());
    }
    let mut tally = Tally::default();
    for t in trials {
        let d = &t.detail;
        let dead = d["dead_lease"].as_u64();
        let after = d["holder_after"].as_u64();
        let outcome = d["waiter_outcome"].as_str().unwrap_or("");
        // The probe: a live client asks for the lock right after the release.
        // Nobody else waited, so if it cannot have it, the lock went to the
        // dead waiter (the server never shows a dead lease as holder).
        let probe = d["probe"].as_str().unwrap_or("acquired");
        if (after.is_some() && after == dead) || outcome == "acquired" || probe != "acquired" {
            tally.add(|| {
                let lock = d["lock"].as_str().unwrap_or("?");
                format!(
                    "{} {lock}: dead lease {dead:?}, holder after release {after:?}, waiter {outcome:?}, probe {probe:?}",
                    r.at(t.t)
                )
            });
        }
    }
    tally.judge("S1", S1, false)
}

// ---- S4 ----

const S4: &str = "exactly-once grants";

/// S4: the server issued no more tokens than there were acquires that may
/// have been granted (a retried acquire granted twice issues two).
fn s4_exactly_once(r: &Run<'_>, stats: &Stats) -> Check {
    let Some(issued) = stats.tokens_issued.filter(|_| r.info.fencing) else {
        return without("S4", S4, Status::NotApplicable, "no token counter from the server".into());
    };
    // A grant whose answer was lost used a token that no acquire returned,
    // once, without being a second grant, if it ended undelivered: released
    // when the server saw its call end, or with its lease, which the client
    // gave up (revoked, or let expire) after losing every answer. A retry
    // granted twice on a live lease ends none of these ways while the workers
    // run (revokes are counted before they stop), so it stays counted.
    let cancelled = stats.grants_cancelled.unwrap_or(0);
    let ended = stats.grants_expired.unwrap_or(0) + stats.grants_revoked.unwrap_or(0);
    let bound = stats.acquires.ok + stats.acquires.unknown + cancelled + ended;
    let mut tally = Tally::default();
    if issued > bound {
        let example = format!(
            "{issued} tokens issued for {} ok + {} unknown acquires + {cancelled} released undelivered + {ended} ended with their lease",
            stats.acquires.ok, stats.acquires.unknown
        );
        tally = Tally { violations: issued - bound, examples: vec![example] };
    }
    tally.judge("S4", S4, false)
}

// ---- A1 ----

const A1: &str = "no call refused by authentication";

/// A1, under TLS and auth: the run's own calls were never refused for their
/// credentials (a worker's acquire or release refused, or any refusal in the
/// service's audit logs: a keep-alive too), so no scenario passes because
/// auth stopped its work. Violations: the larger of the audit logs' count and
/// the history's, as for C3. Without the audit note the service ran without
/// auth: not applicable, unless a worker was refused all the same.
fn a1_no_refusals(r: &Run<'_>) -> Check {
    let mut history = Tally::default();
    for o in r.ops.iter().filter(|o| o.done.is_some_and(|d| d.refused)) {
        let why = o.done.and_then(|d| d.error.clone()).unwrap_or_default();
        history.add(|| format!("{}: {why}", r.describe(o)));
    }
    let notes: Vec<&Event> = r.notes(Op::AuthAudit).collect();
    if notes.is_empty() && history.violations == 0 {
        return without("A1", A1, Status::NotApplicable, "the service ran without authentication".into());
    }
    let mut audit = Tally::default();
    for n in &notes {
        if let Some(err) = n.detail["error"].as_str().filter(|_| history.violations == 0) {
            return without(
                "A1",
                A1,
                Status::Inconclusive,
                format!("the service's audit logs could not be read: {err}"),
            );
        }
        audit.violations += n.count.unwrap_or(0);
        let examples = n.detail["examples"].as_array().into_iter().flatten().filter_map(|x| x.as_str());
        audit.examples.extend(examples.map(|x| format!("audit log: {x}")));
    }
    let mut tally = if audit.violations > history.violations { audit } else { history };
    tally.examples.truncate(MAX_EXAMPLES);
    tally.judge("A1", A1, false)
}

// ---- S6 ----

const S6: &str = "heal: a fenced write soon after every fault";

/// S6: after each fault's end, some write invoked after it succeeds within
/// the heal bound. Also returns the slowest heal in ms.
fn s6_heal(r: &Run<'_>) -> (Check, Option<u64>) {
    let ends: Vec<&Event> = r.notes(Op::Fault).filter(|e| e.phase.as_deref() == Some("end")).collect();
    if ends.is_empty() {
        return (without("S6", S6, Status::NotApplicable, "no fault ended in this run".into()), None);
    }
    let healed = FirstWrite::new(r);
    let bound = r.info.heal_bound_ms.saturating_mul(NS_PER_MS);
    let (mut tally, mut evaluated, mut slowest, mut local) = (Tally::default(), 0, None::<u64>, false);
    for e in ends {
        let late = match healed.after(e.t) {
            Some(done) => {
                evaluated += 1;
                let ms = (done - e.t) / NS_PER_MS;
                slowest = Some(slowest.map_or(ms, |s| s.max(ms)));
                (done - e.t > bound).then(|| format!("first write ok after {ms} ms"))
            }
            None if r.end.saturating_sub(e.t) > bound => {
                evaluated += 1;
                Some(format!("no write ok in the {} ms left", (r.end - e.t) / NS_PER_MS))
            }
            None => None,
        };
        if let Some(late) = late {
            let start = fault_start(r, e);
            let tokens_went_back = r.info.fencing && !r.info.durable_tokens && r.outage_within(start, e.t);
            local |= !tokens_went_back;
            let why = if tokens_went_back { " (a restart of a backend without durable tokens)" } else { "" };
            tally.add(|| format!("fault {} ended {}: {late}{why}", fault_name(e), r.at(e.t)));
        }
    }
    if evaluated == 0 {
        let why = "every fault ended within the heal bound of the run's end".to_string();
        return (without("S6", S6, Status::Inconclusive, why), slowest);
    }
    (tally.judge("S6", S6, !local), slowest)
}

/// When the fault that ended with `end` began: the last start before it on
/// the same target.
fn fault_start(r: &Run<'_>, end: &Event) -> u64 {
    r.notes(Op::Fault)
        .filter(|s| s.phase.as_deref() == Some("start") && s.t <= end.t && s.target == end.target)
        .map(|s| s.t)
        .last()
        .unwrap_or(end.t)
}

fn fault_name(e: &Event) -> String {
    format!("{} on {}", e.fault.as_deref().unwrap_or("?"), e.target.as_deref().unwrap_or("?"))
}

/// Ok writes by invoke time, with the earliest completion from each on.
struct FirstWrite {
    starts: Vec<u64>,
    min_end_from: Vec<u64>,
}

impl FirstWrite {
    fn new(r: &Run<'_>) -> Self {
        let mut w: Vec<(u64, u64)> =
            r.ops.iter().filter(|o| o.is(Op::Write, Res::Ok)).map(|o| (o.start(), o.end())).collect();
        w.sort_unstable();
        let mut min_end_from = vec![u64::MAX; w.len()];
        let mut m = u64::MAX;
        for (i, &(_, end)) in w.iter().enumerate().rev() {
            m = m.min(end);
            min_end_from[i] = m;
        }
        FirstWrite { starts: w.into_iter().map(|(s, _)| s).collect(), min_end_from }
    }

    /// The earliest completion of an ok write invoked after `t`.
    fn after(&self, t: u64) -> Option<u64> {
        let i = self.starts.partition_point(|&s| s <= t);
        self.min_end_from.get(i).copied()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const MS: u64 = NS_PER_MS;

    fn info() -> RunInfo {
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
            min_stale_rejects: 0,
            required_evidence: vec![],
            object_key: "obj".into(),
        }
    }

    /// A synthetic history; times in ms.
    #[derive(Default)]
    struct H(Vec<Event>);

    impl H {
        fn op(
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
            if f == Op::Acquire {
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

        fn acquire(&mut self, p: &str, seq: u64, span: (u64, u64), token: u64) -> &mut Self {
            self.op(p, Op::Acquire, seq, span, Kind::Ok, |e| {
                e.token = Some(token);
                e.lease = Some(100 + token);
            })
        }

        fn write(&mut self, p: &str, seq: u64, span: (u64, u64), token: u64, kind: Kind) -> &mut Self {
            let id = format!("{p}-{seq}");
            self.op(p, Op::Write, seq, span, kind, |e| {
                e.token = Some(token);
                e.append = Some(id.clone());
            })
        }

        fn read(&mut self, p: &str, seq: u64, span: (u64, u64), token: u64) -> &mut Self {
            self.op(p, Op::Read, seq, span, Kind::Ok, |e| e.token = Some(token))
        }

        fn release(&mut self, p: &str, seq: u64, span: (u64, u64)) -> &mut Self {
            self.op(p, Op::Release, seq, span, Kind::Ok, |e| e.released = Some(true))
        }

        /// A whole cycle: acquire, read, write ok, release, 10 ms apart from `t`.
        fn cycle(&mut self, p: &str, seq: u64, t: u64, token: u64) -> &mut Self {
            self.acquire(p, seq, (t, t + 1), token)
                .read(p, seq, (t + 2, t + 3), token)
                .write(p, seq, (t + 4, t + 5), token, Kind::Ok)
                .release(p, seq, (t + 6, t + 7))
        }

        fn note(&mut self, t: u64, f: Op, fill: impl FnOnce(&mut Event)) -> &mut Self {
            let mut e = Event::new(t * MS, "nemesis", Kind::Note, f);
            fill(&mut e);
            self.0.push(e);
            self
        }

        fn fault(&mut self, t: u64, phase: &str) -> &mut Self {
            self.note(t, Op::Fault, |e| {
                e.fault = Some("K4".into());
                e.phase = Some(phase.into());
                e.target = Some("server".into());
            })
        }

        fn evidence(&mut self, t: u64, what: &str, count: u64) -> &mut Self {
            self.note(t, Op::Evidence, |e| {
                e.what = Some(what.into());
                e.count = Some(count);
            })
        }

        fn restart(&mut self, killed: u64, t: u64) -> &mut Self {
            self.note(t, Op::Restart, |e| e.detail = json!({ "killed_at": killed * MS }))
        }

        fn holder(&mut self, killed: u64, t: u64, token: Option<u64>) -> &mut Self {
            self.note(t, Op::Holder, |e| {
                e.detail = json!({ "killed_at": killed * MS });
                e.token = token;
                e.lease = token.map(|t| 100 + t);
            })
        }

        fn final_read(&mut self, t: u64, ids: &[&str]) -> &mut Self {
            let value = ids.iter().map(|s| s.to_string()).collect();
            self.note(t, Op::FinalRead, |e| e.value = Some(value))
        }

        fn events(&self) -> Vec<Event> {
            let mut v = self.0.clone();
            v.sort_by_key(|e| e.t);
            v
        }
    }

    fn audit(entries: &[(u64, AuditOutcome)]) -> Vec<AuditEntry> {
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

    fn run(info: &RunInfo, h: &H, audit: &[AuditEntry]) -> Verdict {
        check(info, &h.events(), audit)
    }

    fn get<'a>(v: &'a Verdict, id: &str) -> &'a Check {
        v.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no check {id}"))
    }

    /// Two cycles in grant order; the server restarts while w0 holds the
    /// lock, and gives it back; the fault heals; the final read has both appends.
    fn clean() -> H {
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

    #[test]
    fn a_clean_run_passes_every_check() {
        // Every applicable check passes; the run passes.
        let mut i = info();
        i.required_evidence = vec!["restarted".into()];
        let v = run(&i, &clean(), &audit(&[(1, AuditOutcome::Accepted), (2, AuditOutcome::Accepted)]));
        assert!(v.passed, "{:#?}", v.checks);
        let pass = [
            ("C2", Status::Pass),
            ("C3", Status::Pass),
            ("C4", Status::Pass),
            ("C6", Status::Pass),
            ("C8", Status::Pass),
        ];
        for (id, status) in pass {
            assert_eq!(get(&v, id).status, status, "{id}");
        }
        assert_eq!(get(&v, "S1").status, Status::NotApplicable);
        assert_eq!(get(&v, "S4").status, Status::NotApplicable);
        assert_eq!(v.stats.acquires.ok, 2);
        assert_eq!(v.stats.writes.ok, 2);
        assert_eq!(v.stats.operations, 8);
        assert_eq!(v.stats.restarts, 1);
        assert_eq!(v.stats.faults["K4"], 1);
        assert_eq!(v.stats.audit.accepted, 2);
    }

    #[test]
    fn c2_token_inversion_across_a_restart_fails() {
        // C2: a grant completed before another was invoked has the smaller token.
        let mut h = H::default();
        h.cycle("w0", 1, 0, 7).restart(10, 20).cycle("w1", 1, 30, 3);
        let v = run(&info(), &h, &[]);
        let c = get(&v, "C2");
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.violations, 1);
        assert!(c.examples[0].contains("inversion") && c.examples[0].contains("restart"), "{:?}", c.examples);
        assert!(!v.passed);
    }

    #[test]
    fn c2_overlapping_grants_in_either_order_pass() {
        // C2 orders only grants that do not overlap in real time.
        let mut h = H::default();
        h.acquire("w0", 1, (0, 10), 5).acquire("w1", 1, (1, 9), 4).acquire("w0", 2, (20, 21), 6);
        assert_eq!(get(&run(&info(), &h, &[]), "C2").status, Status::Pass);
    }

    #[test]
    fn c2_duplicate_token_fails() {
        // C2: tokens of ok grants are unique.
        let mut h = H::default();
        h.acquire("w0", 1, (0, 10), 5).acquire("w1", 1, (1, 9), 5);
        let c = get(&run(&info(), &h, &[]), "C2").clone();
        assert_eq!((c.status, c.violations), (Status::Fail, 1));
        assert!(c.examples[0].contains("duplicate token 5"));
    }

    #[test]
    fn c2_inversion_without_durable_tokens_is_a_finding() {
        // A backend that declares no durable tokens may go back across a restart.
        let mut i = info();
        i.durable_tokens = false;
        let mut h = H::default();
        h.cycle("w0", 1, 0, 7).restart(10, 20).cycle("w1", 1, 30, 3);
        assert_eq!(get(&run(&i, &h, &[]), "C2").status, Status::Finding);
        // ... but not without a restart between.
        let mut h = H::default();
        h.cycle("w0", 1, 0, 7).cycle("w1", 1, 30, 3);
        assert_eq!(get(&run(&i, &h, &[]), "C2").status, Status::Fail);
    }

    #[test]
    fn c2_grant_asked_before_the_kill_and_answered_after_counts_as_across() {
        // A peer engine without durable tokens: w1 asks before the kill, is granted
        // by the restarted server with a reset counter: a finding, not a failure.
        let mut i = info();
        i.durable_tokens = false;
        let mut h = H::default();
        h.acquire("w0", 1, (0, 1), 7).release("w0", 1, (2, 3)).acquire("w1", 1, (4, 30), 1);
        h.fault(5, "start").evidence(20, "restarted", 1).fault(21, "end");
        let v = run(&i, &h, &[]);
        assert_eq!(get(&v, "C2").status, Status::Finding, "{:?}", get(&v, "C2").examples);
    }

    #[test]
    fn c2_without_tokens_is_not_applicable() {
        let mut i = info();
        i.fencing = false;
        assert_eq!(get(&run(&i, &clean(), &[]), "C2").status, Status::NotApplicable);
    }

    #[test]
    fn c3_refused_stale_writes_pass_and_are_counted() {
        // C3 passes when the fence refuses every stale token; the refusals count.
        let mut h = clean();
        h.write("w0", 2, (40, 41), 1, Kind::Fail).0.last_mut().unwrap().stale = true;
        let log = audit(&[(1, AuditOutcome::Accepted), (2, AuditOutcome::Accepted), (1, AuditOutcome::Stale)]);
        let v = run(&info(), &h, &log);
        assert_eq!(get(&v, "C3").status, Status::Pass);
        assert_eq!((v.stats.stale_rejected, v.stats.audit.stale, v.stats.writes.stale), (1, 1, 1));
    }

    #[test]
    fn c3_accepted_stale_write_in_the_audit_log_fails() {
        // C3: the storage never carries out a token below one it carried out before.
        let log = audit(&[(1, AuditOutcome::Accepted), (5, AuditOutcome::Accepted), (3, AuditOutcome::Accepted)]);
        let c = get(&run(&info(), &clean(), &log), "C3").clone();
        assert_eq!((c.status, c.violations), (Status::Fail, 1));
        assert!(c.examples[0].contains("audit #2"), "{:?}", c.examples);
        // An unfenced entry (fencing-off) is a stale accept too.
        let log = audit(&[(5, AuditOutcome::Accepted), (3, AuditOutcome::Unfenced)]);
        assert_eq!(get(&run(&info(), &clean(), &log), "C3").status, Status::Fail);
    }

    #[test]
    fn c3_history_write_after_a_higher_read_fails() {
        // C3 (history): no write succeeds after an ok read with a higher token completed.
        let mut h = H::default();
        h.read("w1", 1, (0, 1), 9).write("w0", 1, (5, 6), 4, Kind::Ok);
        let c = get(&run(&info(), &h, &[]), "C3").clone();
        assert_eq!((c.status, c.violations), (Status::Fail, 1));
        assert!(c.examples[0].contains("stale write accepted"));
    }

    #[test]
    fn c4_acknowledged_append_missing_fails() {
        // C4: every acknowledged append is in the final value.
        let mut h = clean();
        h.final_read(5_001, &["w1-1"]);
        let c = get(&run(&info(), &h, &[]), "C4").clone();
        assert_eq!((c.status, c.violations), (Status::Fail, 1));
        assert!(c.examples[0].contains("lost update") && c.examples[0].contains("w0-1"));
    }

    #[test]
    fn c4_id_twice_or_from_a_failed_write_fails() {
        // C4: nothing twice, nothing whose write certainly failed, nothing never written.
        let mut h = clean();
        h.write("w0", 2, (40, 41), 3, Kind::Fail).final_read(5_001, &["w0-1", "w1-1", "w0-1", "w0-2", "zz-9"]);
        let c = get(&run(&info(), &h, &[]), "C4").clone();
        assert_eq!((c.status, c.violations), (Status::Fail, 3), "{:?}", c.examples);
    }

    #[test]
    fn c4_unknown_write_may_or_may_not_be_there() {
        // An unknown write is allowed in the final value and allowed to be missing.
        for ids in [&["w0-1", "w1-1", "w0-2"][..], &["w0-1", "w1-1"][..]] {
            let mut h = clean();
            h.write("w0", 2, (40, 41), 3, Kind::Unknown).final_read(5_001, ids);
            assert_eq!(get(&run(&info(), &h, &[]), "C4").status, Status::Pass);
        }
    }

    #[test]
    fn c4_without_final_read_is_inconclusive() {
        let mut h = H::default();
        h.cycle("w0", 1, 0, 1);
        let v = run(&info(), &h, &[]);
        assert_eq!(get(&v, "C4").status, Status::Inconclusive);
        assert!(!v.passed);
    }

    #[test]
    fn c4_lost_update_on_a_backend_without_fencing_is_a_finding() {
        // Redlock declares no token: its lost updates are findings, and the run passes.
        let mut i = info();
        i.fencing = false;
        i.durable_tokens = false;
        let mut h = clean();
        h.final_read(5_001, &["w1-1"]);
        let v = run(&i, &h, &[]);
        assert_eq!(get(&v, "C4").status, Status::Finding);
        assert!(v.passed, "{:#?}", v.checks);
    }

    #[test]
    fn c6_grant_live_at_the_kill_survives() {
        // C6: the holder read back after a restart is the grant live at the kill.
        let mut h = H::default();
        h.acquire("w0", 1, (0, 1), 4).restart(5, 10).holder(5, 11, Some(4)).release("w0", 1, (12, 13));
        assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Pass);
    }

    #[test]
    fn c6_lost_acknowledged_grant_fails() {
        // C6 fails when the restarted server forgot the live grant.
        let mut h = H::default();
        h.acquire("w0", 1, (0, 1), 4).restart(5, 10).holder(5, 11, None).release("w0", 1, (12, 13));
        let v = run(&info(), &h, &[]);
        let c = get(&v, "C6");
        assert_eq!((c.status, c.violations), (Status::Fail, 1));
        assert!(c.examples[0].contains("lease Some(104)"), "{:?}", c.examples);
        // Without durable tokens declared, the same is a finding.
        let mut i = info();
        i.durable_tokens = false;
        assert_eq!(get(&run(&i, &h, &[]), "C6").status, Status::Finding);
    }

    #[test]
    fn c6_released_or_lost_grants_are_not_held() {
        // A grant whose release was invoked, or whose worker saw the lease gone,
        // before the kill is not expected back: nothing to evaluate.
        let mut h = H::default();
        h.acquire("w0", 1, (0, 1), 4).op("w0", Op::Release, 1, (3, 30), Kind::Unknown, |_| {});
        h.restart(5, 10).holder(5, 11, None);
        assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Inconclusive);
        let mut h = H::default();
        h.acquire("w0", 1, (0, 1), 4).op("w0", Op::Write, 1, (2, 3), Kind::Fail, |e| e.skipped = true);
        h.restart(5, 10).holder(5, 11, None);
        assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Inconclusive);
        // A release invoked between the kill and the read-back excuses an empty holder.
        let mut h = H::default();
        h.acquire("w0", 1, (0, 1), 4).release("w0", 1, (6, 7)).restart(5, 10).holder(5, 11, None);
        assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Inconclusive);
    }

    #[test]
    fn c6_without_restarts_is_not_applicable() {
        let mut h = H::default();
        h.cycle("w0", 1, 0, 1);
        assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::NotApplicable);
    }

    #[test]
    fn c8_missing_evidence_is_inconclusive() {
        // C8: a run that cannot prove its fault happened is inconclusive, and fails.
        let mut i = info();
        i.required_evidence = vec!["restarted".into(), "rolled-back".into()];
        let v = run(&i, &clean(), &[]);
        let c = get(&v, "C8");
        assert_eq!((c.status, c.violations), (Status::Inconclusive, 1));
        assert!(c.examples[0].contains("rolled-back"));
        assert!(!v.passed);
    }

    #[test]
    fn c8_k1_needs_stale_writes_at_the_fence() {
        // K1/K2: at least `min_stale_rejects` stale writes must have reached the fence.
        let mut i = info();
        i.scenario = "K1".into();
        i.min_stale_rejects = 1;
        i.required_evidence = vec!["stopped".into()];
        let mut h = clean();
        h.evidence(24, "stopped", 1);
        assert_eq!(get(&run(&i, &h, &[]), "C8").status, Status::Inconclusive);
        h.write("w0", 2, (40, 41), 1, Kind::Fail).0.last_mut().unwrap().stale = true;
        assert_eq!(get(&run(&i, &h, &[]), "C8").status, Status::Pass);
        // Waived for a backend without tokens: it has nothing to fence with.
        let mut h = clean();
        h.evidence(24, "stopped", 1);
        i.fencing = false;
        assert_eq!(get(&run(&i, &h, &[]), "C8").status, Status::Pass);
    }

    fn trial(h: &mut H, t: u64, holder_after: Option<u64>, outcome: &str) {
        h.note(t, Op::S1Trial, |e| {
            e.detail =
                json!({ "lock": "s1-1", "dead_lease": 77, "holder_after": holder_after, "waiter_outcome": outcome });
        });
    }

    #[test]
    fn s1_grant_to_a_dead_waiter_fails() {
        // S1: after the release, the lock does not go to the waiter whose lease expired.
        let mut h = clean();
        trial(&mut h, 40, None, "not-acquired: TimedOut");
        trial(&mut h, 50, Some(80), "acquired with a new lease 80");
        assert_eq!(get(&run(&info(), &h, &[]), "S1").status, Status::Pass);
        trial(&mut h, 60, Some(77), "acquired");
        let v = run(&info(), &h, &[]);
        assert_eq!((get(&v, "S1").status, get(&v, "S1").violations), (Status::Fail, 1));
        assert_eq!(v.stats.s1_trials, 3);
    }

    #[test]
    fn s1_a_lock_no_live_client_can_take_after_the_release_fails() {
        // S1: the server hides a dead lease's hold, so a grant to the dead
        // waiter shows as a lock that a live probe cannot take.
        let mut h = clean();
        h.note(40, Op::S1Trial, |e| {
            e.detail = json!({ "lock": "s1-1", "dead_lease": 77, "holder_after": null, "probe": "acquired",
                "waiter_outcome": "error: no answer" });
        });
        assert_eq!(get(&run(&info(), &h, &[]), "S1").status, Status::Pass);
        h.note(50, Op::S1Trial, |e| {
            e.detail = json!({ "lock": "s1-2", "dead_lease": 78, "holder_after": null, "probe": "not acquired: TimedOut",
                "waiter_outcome": "error: no answer" });
        });
        assert_eq!(get(&run(&info(), &h, &[]), "S1").status, Status::Fail);
    }

    #[test]
    fn s4_more_tokens_than_acquires_fails() {
        // S4: a retried acquire granted twice issues more tokens than acquires.
        let stats = |n: u64| move |e: &mut Event| e.detail = json!({ "tokens_issued": n });
        let mut h = clean();
        h.note(6_000, Op::ServerStats, stats(2));
        assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Pass);
        let mut h = clean();
        h.note(6_000, Op::ServerStats, stats(4));
        let v = run(&info(), &h, &[]);
        assert_eq!((get(&v, "S4").status, get(&v, "S4").violations), (Status::Fail, 2));
    }

    #[test]
    fn s4_a_grant_released_undelivered_is_not_a_second_grant() {
        // S4: a grant whose answer was lost and which the server released when
        // the call ended used a token no acquire returned; only tokens beyond
        // those are double grants.
        let stats =
            |n: u64, c: u64| move |e: &mut Event| e.detail = json!({ "tokens_issued": n, "grants_cancelled": c });
        let mut h = clean();
        h.note(6_000, Op::ServerStats, stats(3, 1));
        assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Pass);
        let mut h = clean();
        h.note(6_000, Op::ServerStats, |e: &mut Event| e.detail = json!({ "tokens_issued": 3, "grants_revoked": 1 }));
        assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Pass, "ended with a lease given up");
        let mut h = clean();
        h.note(6_000, Op::ServerStats, stats(4, 1));
        assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Fail);
    }

    #[test]
    fn s6_unhealed_fault_fails() {
        // S6: after a fault ends, a write succeeds within the heal bound.
        let mut h = clean();
        h.fault(100, "start").fault(200, "end").write("w0", 9, (4_000, 4_100), 9, Kind::Ok);
        let v = run(&info(), &h, &[]);
        let c = get(&v, "S6");
        assert_eq!((c.status, c.violations), (Status::Fail, 1), "{:?}", c.examples);
        assert!(c.examples[0].contains("after 3900 ms"));
        assert_eq!(v.stats.heal_max_ms, Some(3_900));
        // No write at all while the run went on for longer than the bound.
        let mut h = clean();
        h.fault(100, "start").fault(200, "end");
        assert_eq!(get(&run(&info(), &h, &[]), "S6").status, Status::Fail);
    }

    #[test]
    fn s6_slow_heal_after_a_restart_without_durable_tokens_is_a_finding() {
        // Tokens that went back on a restart make the fence refuse writes until
        // they pass the mark: declared by the backend, so a finding.
        let mut h = clean();
        h.fault(100, "start").restart(110, 150).fault(200, "end");
        h.write("w0", 9, (4_000, 4_100), 9, Kind::Ok).final_read(5_001, &["w0-1", "w1-1", "w0-9"]);
        let mut i = info();
        i.durable_tokens = false;
        let v = run(&i, &h, &[]);
        assert_eq!(get(&v, "S6").status, Status::Finding, "{:?}", get(&v, "S6").examples);
        assert!(v.passed, "{:#?}", v.checks);
        assert_eq!(get(&run(&info(), &h, &[]), "S6").status, Status::Fail);
    }

    #[test]
    fn s6_healed_fault_passes_and_a_fault_at_the_end_is_ignored() {
        let mut h = clean();
        h.fault(100, "start").fault(200, "end").write("w0", 9, (300, 400), 9, Kind::Ok);
        h.fault(4_000, "start").fault(4_500, "end");
        let v = run(&info(), &h, &[]);
        assert_eq!(get(&v, "S6").status, Status::Pass, "{:?}", get(&v, "S6").examples);
        assert_eq!(v.stats.heal_max_ms, Some(200));
    }

    #[test]
    fn pairing_leaves_an_invoke_without_completion_unknown() {
        let mut h = H::default();
        h.op("w0", Op::Acquire, 1, (0, 0), Kind::Invoke, |_| {}).op("w1", Op::Acquire, 1, (1, 2), Kind::Fail, |_| {});
        let v = run(&info(), &h, &[]);
        assert_eq!(v.stats.acquires, Counts { ok: 0, fail: 1, unknown: 1 });
    }

    #[test]
    fn verdict_round_trips_through_json() {
        let v = run(&info(), &clean(), &[]);
        let text = serde_json::to_string(&v).unwrap();
        assert!(text.contains(r#""status":"not-applicable""#));
        assert_eq!(serde_json::from_str::<Verdict>(&text).unwrap(), v);
    }

    fn auth_audit(count: u64, detail: serde_json::Value) -> impl FnOnce(&mut Event) {
        move |e: &mut Event| {
            e.count = Some(count);
            e.detail = detail;
        }
    }

    /// A1: a clean run under auth passes; one refused call, in the audit logs
    /// or in a worker's history, fails it; unread audit logs make it
    /// inconclusive; a run without auth is not applicable.
    #[test]
    fn a1_fails_on_any_auth_refusal() {
        let i = info();
        let a = audit(&[(1, AuditOutcome::Accepted), (2, AuditOutcome::Accepted)]);
        assert_eq!(get(&run(&i, &clean(), &a), "A1").status, Status::NotApplicable);
        let mut h = clean();
        h.note(6_000, Op::AuthAudit, auth_audit(0, json!({ "files": 3, "examples": [] })));
        assert_eq!(get(&run(&i, &h, &a), "A1").status, Status::Pass);

        let mut h = clean();
        let line = r#"{"identity":"chaos-worker","verb":"acquire","outcome":"denied"}"#;
        h.note(6_000, Op::AuthAudit, auth_audit(2, json!({ "files": 3, "examples": [line] })));
        let v = run(&i, &h, &a);
        let a1 = get(&v, "A1");
        assert_eq!((a1.status, a1.violations), (Status::Fail, 2), "{a1:?}");
        assert!(a1.examples[0].contains("chaos-worker") && !v.passed);

        let mut h = clean();
        h.op("w2", Op::Acquire, 1, (40, 41), Kind::Fail, |e| {
            e.refused = true;
            e.error = Some("permission denied: chaos-worker may not acquire lock \"x\"".into());
        });
        let a1 = get(&run(&i, &h, &a), "A1").clone();
        assert_eq!((a1.status, a1.violations), (Status::Fail, 1), "a refused worker fails even without the audit note");

        let mut h = clean();
        h.note(6_000, Op::AuthAudit, auth_audit(0, json!({ "error": "no audit log" })));
        assert_eq!(get(&run(&i, &h, &a), "A1").status, Status::Inconclusive);
    }
}
