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
//! E1–E3 (leader election, issue 17; not in the reference): in election mode
//! ([`RunInfo::election`]) the workers campaign and observers follow the
//! leader: one leader per term and older terms fenced ([`e1_one_leader`]), an
//! observer's terms never go back ([`e2_observer_terms`]), no observed leader
//! that no campaign can have elected ([`e3_no_phantom`]). They are part of
//! election runs' verdicts only.
//!
//! R1–R2 (read-write locks, issue 18; not in the reference): in shared mode
//! ([`RunInfo::shared`]) readers take the lock shared and read with their
//! token: every read the storage carried out saw the last write it carried
//! out ([`r1_fenced_reads`]; that it refused the stale ones is C3's), and the
//! holders the server reports fit together: a writer alone, at most N permits
//! ([`r2_holders_fit`]). They are part of shared runs' verdicts only, and R2
//! of semaphore runs' ([`RunInfo::permits`]), whose workers each write an
//! object of their own: C3 and C4 are then judged per object
//! ([`per_object`]), each object's history being its worker's.
//!
//! M1 (atomic multi-locks, issue 18; not in the reference): in multi mode
//! ([`RunInfo::multi`]) lock `<lock>-m<i>` guards object `<object>-m<i>`,
//! and a worker's cycle takes one of the locks or all of them at once:
//! every multi grant is whole, its tokens consecutive in the order asked
//! ([`m1_multi`]); C3, C4 and C6 are judged one lock and its object at a
//! time ([`per_lock`]), so that a multi-holder's and a single holder's
//! operations on one object are judged against each other.
//!
//! One check per file (`c2_tokens.rs`, …, `a1_no_refusals.rs`), the shared
//! indexing of a run in `run.rs`; each check's own rules are in its file.
//! The ids are those of `docs/invariants.md`.

mod a1_no_refusals;
mod c2_tokens;
mod c3_stale_accepts;
mod c4_lost_updates;
mod c6_grants_survive;
mod c8_evidence;
mod e1_one_leader;
mod e2_observer_terms;
mod e3_no_phantom;
mod m1_multi;
mod per_lock;
mod r1_fenced_reads;
mod r2_holders_fit;
mod run;
mod s1_dead_waiters;
mod s4_exactly_once;
mod s6_heal;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use fencelock_fence::storage::AuditEntry;
use serde::{Deserialize, Serialize};

use crate::history::{Event, Kind, Op};
use a1_no_refusals::a1_no_refusals;
use c2_tokens::c2_tokens;
use c3_stale_accepts::c3_stale_accepts;
use c4_lost_updates::c4_lost_updates;
use c6_grants_survive::c6_grants_survive;
use c8_evidence::c8_evidence;
use e1_one_leader::e1_one_leader;
use e2_observer_terms::e2_observer_terms;
use e3_no_phantom::e3_no_phantom;
use m1_multi::m1_multi;
use per_lock::per_lock;
use r1_fenced_reads::r1_fenced_reads;
use r2_holders_fit::r2_holders_fit;
use run::Run;
use s1_dead_waiters::s1_dead_waiters;
use s4_exactly_once::s4_exactly_once;
use s6_heal::s6_heal;

pub(crate) const NS_PER_MS: u64 = 1_000_000;
/// Examples kept per check.
pub(crate) const MAX_EXAMPLES: usize = 5;

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
    /// S6: a fault must be healed within this many ms of its end (plus
    /// `heal_slack_ms`).
    pub heal_bound_ms: u64,
    /// S6's allowance for a loaded machine (CI's short profile, beside other
    /// tests): S6 there checks that progress resumes, not how fast; the
    /// slowest heal is reported either way.
    #[serde(default)]
    pub heal_slack_ms: u64,
    /// Stale writes that must reach the fence, else the run is inconclusive.
    pub min_stale_rejects: u64,
    /// Evidence `what`s that must each have been seen.
    pub required_evidence: Vec<String>,
    /// The object the workers append to (also the fence key).
    pub object_key: String,
    /// Election mode: the workers campaign for the lock as an election and
    /// observers follow its leader (E1–E3 apply).
    #[serde(default)]
    pub election: bool,
    /// Shared mode: readers and writers of a read-write lock (R1 and R2 apply).
    #[serde(default)]
    pub shared: bool,
    /// Semaphore mode when above 0: a semaphore of this many permits, each
    /// worker writing its own object `<object_key>-w<i>` (C3 and C4 per
    /// object; R2 applies).
    #[serde(default)]
    pub permits: u32,
    /// Shared or semaphore mode: an observer polled the lock's holders (`holders` notes; R2).
    #[serde(default)]
    pub polls_holders: bool,
    /// Multi mode when above 0: this many locks `<lock>-m<i>`, each guarding
    /// its object `<object_key>-m<i>`; workers take one or all of them (M1
    /// applies; C3, C4 and C6 per lock).
    #[serde(default)]
    pub multi: u32,
    /// The run's lock name (multi mode: the locks' common prefix).
    #[serde(default)]
    pub lock: String,
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
    /// Election mode: campaigns (`ok`: elected).
    pub campaigns: Counts,
    /// `fail` includes `reads_stale`.
    pub reads: Counts,
    pub reads_stale: u64,
    pub writes: WriteCounts,
    /// Releases, and in election mode resignations.
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
    /// Reads refused by the fence: the larger of the audit log's and the
    /// history's count (shared mode: C8 counts them with the writes).
    pub stale_reads_rejected: u64,
    /// Shared mode: polls of the lock's holders that succeeded (R2).
    pub holder_polls: u64,
    /// Shared mode: of those, polls that found two holders or more (readers together).
    pub polls_shared: u64,
    /// Multi mode: ok acquires of all the locks at once.
    pub multi_grants: u64,
    /// Multi mode: ok acquires of one lock.
    pub single_grants: u64,
    /// S6: the slowest heal, ms.
    pub heal_max_ms: Option<u64>,
    pub s1_trials: u64,
    /// Election mode: leader events the observers received.
    pub leader_events: u64,
    /// Election mode: of those, leaders reported without the value their
    /// campaign published (E3 judges them by their term alone).
    pub leaders_without_value: u64,
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
    let (c3, c4, c6) = match (info.permits, info.multi) {
        (0, 0) => (c3_stale_accepts(&r), c4_lost_updates(&r), c6_grants_survive(&r)),
        (0, _) => per_lock(info, history, audit),
        _ => {
            let (c3, c4) = per_object(info, history, audit);
            (c3, c4, c6_grants_survive(&r))
        }
    };
    let c8 = c8_evidence(&r, &stats, c3.violations);
    let mut checks =
        vec![c2_tokens(&r), c3, c4, c6, c8, s1_dead_waiters(&r), s4_exactly_once(&r, &stats), s6, a1_no_refusals(&r)];
    if info.election {
        checks.extend([e1_one_leader(&r), e2_observer_terms(&r), e3_no_phantom(&r)]);
    }
    if info.shared {
        checks.push(r1_fenced_reads(&r));
    }
    if info.shared || info.permits > 0 {
        checks.push(r2_holders_fit(&r));
    }
    if info.multi > 0 {
        checks.push(m1_multi(&r, &stats));
    }
    let passed = !checks.iter().any(|c| c.status.is_red());
    Verdict { info: info.clone(), checks, stats, passed }
}

/// Semaphore mode: C3 and C4 on each worker's own object, from that worker's
/// operations, the harness's notes with that object's final read, and the
/// object's audit entries; each check's counts and examples summed over the
/// objects, its status the reddest.
fn per_object(info: &RunInfo, history: &[Event], audit: &[AuditEntry]) -> (Check, Check) {
    let (mut c3, mut c4) = (Vec::new(), Vec::new());
    for i in 0..info.workers {
        let (p, key) = (format!("w{i}"), format!("{}-w{i}", info.object_key));
        let mine: Vec<Event> = history
            .iter()
            .filter(|e| match e.kind {
                Kind::Note => e.f != Op::FinalRead || e.target.as_deref() == Some(key.as_str()),
                _ => e.p == p,
            })
            .cloned()
            .collect();
        let one = RunInfo { object_key: key, permits: 0, ..info.clone() };
        let r = Run::new(&one, &mine, audit);
        c3.push(c3_stale_accepts(&r));
        c4.push(c4_lost_updates(&r));
    }
    (merge(c3, REDDEST), merge(c4, REDDEST))
}

/// Statuses from the one that wins a [`merge`]: the reddest.
const REDDEST: [Status; 5] = [Status::Fail, Status::Inconclusive, Status::Finding, Status::Pass, Status::NotApplicable];

/// One check from its results on several objects (at least one): the
/// status that comes first in `order`, the violations summed, the examples
/// of the parts with that status (each once).
fn merge(parts: Vec<Check>, order: [Status; 5]) -> Check {
    let rank = |s: Status| order.iter().position(|x| *x == s).unwrap_or(0);
    let status = parts.iter().map(|c| c.status).min_by_key(|s| rank(*s)).unwrap_or(Status::Inconclusive);
    let violations = parts.iter().map(|c| c.violations).sum();
    let mut seen = std::collections::HashSet::new();
    let mut examples: Vec<String> = parts
        .iter()
        .filter(|c| c.status == status)
        .flat_map(|c| c.examples.clone())
        .filter(|e| seen.insert(e.clone()))
        .collect();
    examples.truncate(MAX_EXAMPLES);
    let first = &parts[0];
    Check { id: first.id.clone(), name: first.name.clone(), status, violations, examples }
}
