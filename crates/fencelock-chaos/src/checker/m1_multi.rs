//! Check M1, "multi grants whole, with consecutive tokens" (multi mode;
//! INV-18 at the server: a multi-acquire is granted all its locks in one
//! log entry, one token each, consecutive in the order asked, or none).
//!
//! Rules where the reference leaves room (it has no M1):
//! * a multi grant is an ok acquire that asked for more than one lock; it
//!   must have asked for exactly the run's K distinct locks and recorded one
//!   token per lock (fewer is a partial grant), token `i + 1` = token `i` + 1
//!   in the order asked;
//! * progress: the run counts multi and single grants; without a multi
//!   grant it proves nothing and is inconclusive;
//! * a backend without fencing tokens cannot show consecutive tokens:
//!   violations are findings (no peer runs multi mode).

use std::collections::BTreeSet;

use super::run::{without, Run, Tally};
use super::{Check, Stats, Status};

const M1: &str = "multi grants whole, with consecutive tokens";

/// M1: every multi grant is whole, its tokens consecutive in the order asked.
pub(super) fn m1_multi(r: &Run<'_>, stats: &Stats) -> Check {
    let progress = format!("{} multi grants, {} single grants", stats.multi_grants, stats.single_grants);
    if stats.multi_grants == 0 {
        return without("M1", M1, Status::Inconclusive, format!("no multi grant: {progress}"));
    }
    let mut tally = Tally::default();
    for o in r.ops.iter().filter(|o| o.is_grant_ok() && o.locks().len() > 1) {
        if let Some(why) = broken(o.locks(), &o.tokens(), r.info.multi) {
            tally.add(|| format!("{}: {why}", r.describe(o)));
        }
    }
    let mut c = tally.judge("M1", M1, !r.info.fencing);
    if c.status == Status::Pass {
        c.examples.push(progress);
    }
    c
}

/// What is wrong with a multi grant of `tokens` for `locks`, if anything.
fn broken(locks: &[String], tokens: &[u64], k: u32) -> Option<String> {
    let distinct: BTreeSet<&String> = locks.iter().collect();
    if locks.len() != k as usize || distinct.len() != locks.len() {
        return Some(format!("asked for {locks:?}, not the run's {k} distinct locks"));
    }
    if tokens.len() != locks.len() {
        return Some(format!("a partial grant: {} tokens for the locks {locks:?}", tokens.len()));
    }
    if tokens.windows(2).any(|w| w[0].checked_add(1) != Some(w[1])) {
        return Some(format!("for the locks {locks:?}: not consecutive in the order asked"));
    }
    None
}
