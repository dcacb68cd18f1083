//! INV-FENCE: the resource never carries out an act the fence's rule refuses
//! (a write whose token is lower than one it accepted before, a read below the
//! last accepted write's token: 0 stale accepts), and stale acts do happen and
//! get rejected: every seed must show an act made after a client pause
//! (Kleppmann's case) that the fence rejected, or it is inconclusive, which
//! fails. The mixed seeds' readers read in any token order.
//!
//! Mutant: a resource that ignores tokens must make INV-FENCE fail for some seed.
//!
//! Checked on every seed by `every_invariant_holds_on_every_seed` (main.rs),
//! from the seeds' one simulation. Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim every_invariant`.

use fencelock_sim::{check::fence, harness, Mutant, Report};

pub fn no_stale_accepts_and_pauses_are_rejected(test: &str, reports: &[Report]) {
    let outcomes = harness::assert_holds(test, reports, fence::check);
    let rejected = harness::total(&outcomes, "rejected_after_pause");
    println!("writes rejected after a pause, over all seeds: {rejected}");
    assert!(rejected >= outcomes.len() as u64, "too few stale acts rejected: {rejected}");
    if outcomes.len() > 1 {
        assert!(harness::total(&outcomes, "accepted_reads") > 0, "no fenced read was accepted in any seed");
    }
}

#[test]
fn mutant_unfenced_resource_makes_inv_fence_fail() {
    harness::assert_caught(Mutant::UnfencedResource, fence::check);
}
