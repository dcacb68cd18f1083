//! Check C2, "tokens unique and increasing in grant order" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).
//!
//! Rules where the reference leaves room:
//! * C2: a duplicate or an inversion counts once per later grant; a pair is
//!   *across a restart* if an outage of the lock service (`restart` note:
//!   `killed_at` to the note; peer engines: the `fault` start to the
//!   `restarted` evidence) overlaps the time between the two grants'
//!   completions (the later grant may have been asked for before the kill).

use std::collections::HashMap;

use super::run::{without, HighestDone, Operation, Run, Tally};
use super::{Check, Status};

const C2: &str = "tokens unique and increasing in grant order";

/// C2: tokens of ok grants are unique, and a grant completed before another
/// was invoked has the smaller token, across restarts.
pub(super) fn c2_tokens(r: &Run<'_>) -> Check {
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
