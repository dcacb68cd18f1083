//! Check E1, "one leader per term, older terms fenced" (leader election,
//! issue 17): the election runs' counterpart of C2 and C3 for leaderships.
//!
//! Rules:
//! * A term is won by at most one campaign: two ok campaigns (two workers, or
//!   two cycles of one) with the same term are a violation, counted once per
//!   later campaign. That terms increase in election order is C2's rule (a
//!   campaign is a grant, its term the token), not repeated here.
//! * Leaderships overlap as the workers see them (a paused leader still
//!   believes it leads when the next is elected); the fence must then refuse
//!   the older term. These are C3's rules ([`stale_accepts`]), applied here
//!   to the leaders' writes, which in an election run are all its writes:
//!   the fence's audit log carries out no term below one it carried out
//!   before (the order the fence saw: a paused leader's write was invoked
//!   before its pause, so only the audit log shows it arriving late), and in
//!   the history no write succeeds after a write or read of a newer term
//!   completed.

use std::collections::HashMap;

use super::c3_stale_accepts::stale_accepts;
use super::run::{without, Operation, Res, Run, Tally};
use super::{Check, Status};
use crate::history::Op;

const E1: &str = "one leader per term, older terms fenced";

/// E1: no term won twice; no write of an older term accepted after a newer term wrote.
pub(super) fn e1_one_leader(r: &Run<'_>) -> Check {
    let campaigns: Vec<&Operation<'_>> = r.ops.iter().filter(|o| o.invoke.f == Op::Campaign).collect();
    if campaigns.is_empty() {
        return without("E1", E1, Status::NotApplicable, "no campaign in this run".into());
    }
    let mut elected: Vec<(&Operation<'_>, u64)> =
        campaigns.iter().filter(|o| o.res() == Res::Ok).filter_map(|o| o.token().map(|t| (*o, t))).collect();
    if elected.is_empty() {
        return without("E1", E1, Status::Inconclusive, "no campaign elected its worker".into());
    }
    elected.sort_by_key(|(o, _)| o.end());
    let mut tally = Tally::default();
    let mut winner: HashMap<u64, &Operation<'_>> = HashMap::new();
    for (o, term) in elected {
        match winner.get(&term) {
            Some(first) => tally.add(|| format!("term {term} won twice: {} and {}", r.describe(first), r.describe(o))),
            None => {
                winner.insert(term, o);
            }
        }
    }
    let fence = stale_accepts(r);
    tally.violations += fence.violations;
    tally.examples.extend(fence.examples);
    tally.examples.truncate(super::MAX_EXAMPLES);
    tally.judge("E1", E1, !r.info.fencing)
}
