//! INV-MULTI, the design's INV-18 (never a partial multi-lock): in every mixed
//! seed (every third), a client told of a multi-acquire's grant believes it
//! holds one token per lock asked, and the server granted exactly those, in
//! one step, in increasing order. Every mixed seed must show a multi-acquire
//! granted after waiting and two clients asking for the same locks in crossed
//! orders, or it is inconclusive, which fails. (INV-15 per multi-lock is
//! INV-EXCL's; a multi-acquire stuck in a deadlock would stop the grants, which
//! INV-HEAL reports.)
//!
//! Mutant: a server that pushes only the first grant of a queued multi-acquire
//! (`partial-multi-push`) must make INV-MULTI fail for some seed.
//!
//! Checked on every seed by `every_invariant_holds_on_every_seed` (main.rs),
//! from the seeds' one simulation. Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim every_invariant`.

use fencelock_sim::{check::multi, config::Workload, harness, Mutant, Report};

pub fn never_a_partial_multi_lock(test: &str, reports: &[Report]) {
    let mixed = |seed| Workload::for_seed(seed) == Workload::Mixed;
    let outcomes = harness::assert_holds_where(test, reports, multi::check, mixed);
    if outcomes.len() > 1 {
        assert!(harness::total(&outcomes, "multi_grants") > 0, "no seed granted a multi-acquire");
    }
}

#[test]
fn mutant_partial_multi_push_makes_inv_multi_fail() {
    harness::assert_caught(Mutant::PartialMultiPush, multi::check);
}
