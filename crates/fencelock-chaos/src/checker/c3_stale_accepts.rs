//! Check C3, "no stale accepts by the fenced storage" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).
//!
//! Rules where the reference leaves room:
//! * C3: the audit log and the history see the same accepts, so the check
//!   reports the larger of the two counts, with examples from both.

use fencelock_fence::storage::Outcome as AuditOutcome;
use fencelock_fence::{Access, Marks};

use super::run::{without, HighestDone, Operation, Res, Run, Tally};
use super::{Check, Status, MAX_EXAMPLES};
use crate::history::Op;

const C3: &str = "no stale accepts by the fenced storage";

/// C3: the storage never carries out an operation that the fence's rule
/// refuses given the operations it carried out before (audit log, by `seq`:
/// a read below the last write's token, a write below any carried-out
/// token); and in the
/// history no write succeeds after an ok read or write with a higher token
/// had completed, and no read after an ok write with a higher token had
/// (the fence's rule as the workers saw it: this catches a stale read that
/// the audit log does not show).
pub(super) fn c3_stale_accepts(r: &Run<'_>) -> Check {
    let writes_ok = r.ops.iter().any(|o| o.is(Op::Write, Res::Ok));
    if r.audit.is_empty() && !writes_ok {
        return without("C3", C3, Status::Inconclusive, "no write reached the storage".into());
    }
    stale_accepts(r).judge("C3", C3, !r.info.fencing)
}

/// C3's rules, without the verdict (E1 applies them to the leaders' writes):
/// the larger count of the audit log's and the history's stale accepts.
pub(super) fn stale_accepts(r: &Run<'_>) -> Tally {
    let audit = c3_audit(r);
    let history = c3_history(r);
    let mut examples = audit.examples;
    examples.extend(history.examples);
    examples.truncate(MAX_EXAMPLES);
    Tally { violations: audit.violations.max(history.violations), examples }
}

/// The audit log replayed through the fence's own rule (`Marks::admit`: a
/// `GET` is a read, judged against the last write; any other op a write,
/// judged against every carried-out token): an operation carried out that
/// the rule refuses is a stale accept.
fn c3_audit(r: &Run<'_>) -> Tally {
    let mut tally = Tally::default();
    let mut marks: Option<(Marks, u64)> = None; // (marks, seq of the last raise)
    for a in &r.audit {
        if a.outcome == AuditOutcome::Stale {
            continue;
        }
        let access = if a.op == "GET" { Access::Read } else { Access::Write };
        let at = marks.map_or(a.seq, |(_, at)| at);
        let why = match Marks::admit(marks.map(|(m, _)| m), access, a.token) {
            Ok(after) if a.outcome == AuditOutcome::Accepted => {
                marks = Some((after, a.seq));
                continue;
            }
            Ok(_) => format!("{:?}", a.outcome),
            Err(stale) => stale.to_string(),
        };
        tally.add(|| {
            format!("audit #{}: {} token {} carried out ({why}) after the marks of #{at}", a.seq, a.op, a.token)
        });
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
    let mut reads: Vec<(Operation<'_>, u64)> = done.iter().filter(|(o, _)| o.invoke.f == Op::Read).copied().collect();
    reads.sort_by_key(|(o, _)| o.start());
    let mut highest_write = HighestDone::new(writes.clone());
    let mut highest = HighestDone::new(done);
    for (w, tw) in writes {
        if let Some((x, tx)) = highest.before(w.start()) {
            if tx > tw {
                tally.add(|| format!("stale write accepted: {} after {}", r.describe(&w), r.describe(&x)));
            }
        }
    }
    for (rd, tr) in reads {
        if let Some((x, tx)) = highest_write.before(rd.start()) {
            if tx > tr {
                tally.add(|| format!("stale read accepted: {} after {}", r.describe(&rd), r.describe(&x)));
            }
        }
    }
    tally
}
