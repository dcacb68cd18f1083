//! INV-HEAL: after every fault ends, a new grant and an accepted write happen
//! within 2 × TTL plus the restart slack, and in quiet time neither the
//! grants nor the acts stop, nor, on any one lock, the grants while an acquire
//! waits for it. Every seed must have faults, or it is inconclusive, which
//! fails.
//!
//! Mutant: a server that pushes only the first grant of a queued
//! multi-acquire (`partial-multi-push`) leaves the multi-acquirer's other
//! locks held by its live lease, and their waiters stall while the other
//! locks' grants go on: INV-HEAL must fail for some seed, on a lock.
//!
//! Checked on every seed by `every_invariant_holds_on_every_seed` (main.rs),
//! from the seeds' one simulation. Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim every_invariant`.

use fencelock_sim::{check::heal, harness, Mutant, Report, SimConfig};

pub fn progress_resumes_after_every_fault(test: &str, reports: &[Report]) {
    let outcomes = harness::assert_holds(test, reports, heal::check);
    println!("faults healed over all seeds: {}", harness::total(&outcomes, "faults"));
}

#[test]
fn mutant_partial_multi_push_makes_inv_heal_fail_on_a_lock() {
    let seed = harness::assert_caught(Mutant::PartialMultiPush, heal::check);
    let v = heal::check(&fencelock_sim::run(&SimConfig::new(seed).with_mutant(Mutant::PartialMultiPush)));
    assert!(v.violations.iter().any(|s| s.starts_with("lock `multi-")), "seed {seed}: {}", v.summary());
}
