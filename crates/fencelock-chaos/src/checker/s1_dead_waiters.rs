//! Check S1, "no grant to a dead waiter" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).

use super::run::{without, Run, Tally};
use super::{Check, Status};
use crate::history::{Event, Op};

const S1: &str = "no grant to a dead waiter";

/// S1: after the holder released, the lock did not go to the waiter whose
/// lease had expired.
pub(super) fn s1_dead_waiters(r: &Run<'_>) -> Check {
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
