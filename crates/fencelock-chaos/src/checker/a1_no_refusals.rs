//! Check A1, "no call refused by authentication" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).

use super::run::{without, Run, Tally};
use super::{Check, Status, MAX_EXAMPLES};
use crate::history::{Event, Op};

const A1: &str = "no call refused by authentication";

/// A1, under TLS and auth: the run's own calls were never refused for their
/// credentials (a worker's acquire or release refused, or any refusal in the
/// service's audit logs: a keep-alive too), so no scenario passes because
/// auth stopped its work. Violations: the larger of the audit logs' count and
/// the history's, as for C3. Without the audit note the service ran without
/// auth: not applicable, unless a worker was refused all the same.
pub(super) fn a1_no_refusals(r: &Run<'_>) -> Check {
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
