//! INV-FENCE: the resource never accepts a write whose token is lower than one it
//! accepted before (0 stale accepts), and stale writes do happen and get rejected:
//! every seed must show a write made after a client pause (Kleppmann's case)
//! that the fence rejected, or it is inconclusive, which fails.
//!
//! Mutant: a resource that ignores tokens must make INV-FENCE fail for some seed.
//!
//! Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim --test inv_fence`.

use fencelock_sim::{check::fence, harness, Mutant};

#[test]
fn inv_fence_no_stale_accepts_and_pauses_are_rejected() {
    let outcomes = harness::assert_holds("inv_fence", fence::check);
    let rejected = harness::total(&outcomes, "rejected_after_pause");
    println!("writes rejected after a pause, over all seeds: {rejected}");
    assert!(rejected >= outcomes.len() as u64, "too few stale writes rejected: {rejected}");
}

#[test]
fn mutant_unfenced_resource_makes_inv_fence_fail() {
    harness::assert_caught(Mutant::UnfencedResource, fence::check);
}
