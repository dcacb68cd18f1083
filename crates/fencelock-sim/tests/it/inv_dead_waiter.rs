//! INV-DEAD-WAITER: a grant never goes to a lease that has expired (etcd#11456).
//! The engine's `Granted` effects are checked against lease liveness that the
//! checker tracks itself from the durable log. Over the seed set, waiters whose
//! lease ended while they were queued must have happened (at least one per seed
//! on average), or the test proves nothing and fails.
//!
//! Checked on every seed by `every_invariant_holds_on_every_seed` (main.rs),
//! from the seeds' one simulation. Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim every_invariant`.

use fencelock_sim::{check::dead_waiter, harness, Report};

pub fn no_grant_to_an_expired_lease(test: &str, reports: &[Report]) {
    let outcomes = harness::assert_holds(test, reports, dead_waiter::check);
    let dead = harness::total(&outcomes, "waiters_whose_lease_ended");
    println!("waiters whose lease ended in the queue, over all seeds: {dead}");
    if outcomes.len() > 1 {
        assert!(dead >= outcomes.len() as u64, "inconclusive: only {dead} waiters outlived their lease");
    }
}
