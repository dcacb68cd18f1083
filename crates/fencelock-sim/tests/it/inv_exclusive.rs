//! INV-EXCL, generalized to INV-15: at any virtual instant the grants clients
//! believe they hold within their own conservative lease deadlines fit
//! together: never a writer beside anyone on the read-write lock (one holder at
//! a time in an exclusive-only run), never more than 3 permits of the
//! semaphore. Every seed must hand the lock to another client after a
//! holder's deadline ran out, and every mixed seed (every third: readers,
//! writers that downgrade, weighted permits) must show readers sharing, a
//! downgrade and more than one permit in use, or it is inconclusive, which
//! fails.
//!
//! Mutant: the old driver's handling of `CancelWait` (a cancel written after a
//! retry of the same acquire, which the retry's caller believes it holds,
//! releases its grant and hands the lock on) must make INV-EXCL fail for some
//! seed.
//!
//! Checked on every seed by `every_invariant_holds_on_every_seed` (main.rs),
//! from the seeds' one simulation. Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim every_invariant`.

use fencelock_sim::{check::exclusive, config::Workload, harness, Mutant, Report};

pub fn one_believer_at_a_time(test: &str, reports: &[Report]) {
    let outcomes = harness::assert_holds(test, reports, exclusive::check);
    println!("beliefs checked over all seeds: {}", harness::total(&outcomes, "beliefs"));
    if outcomes.len() > 1 {
        // All the seeds, not one reproduced: the mixed workload is among them.
        let mixed = outcomes.iter().filter(|o| o.report.config.workload == Workload::Mixed).count();
        assert!(mixed > 0, "no seed ran the mixed workload (shared locks, semaphores)");
        assert!(harness::total(&outcomes, "shared_overlaps") > 0, "readers never shared");
    }
}

#[test]
fn mutant_racy_cancel_makes_inv_excl_fail() {
    harness::assert_caught(Mutant::RacyCancel, exclusive::check);
}
