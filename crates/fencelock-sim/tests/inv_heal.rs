//! INV-HEAL: after every fault ends, a new grant and an accepted write happen
//! within 2 × TTL plus the restart slack. Every seed must have faults, or it is
//! inconclusive, which fails.
//!
//! Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim --test inv_heal`.

use fencelock_sim::{check::heal, harness};

#[test]
fn inv_heal_progress_resumes_after_every_fault() {
    let outcomes = harness::assert_holds("inv_heal", heal::check);
    println!("faults healed over all seeds: {}", harness::total(&outcomes, "faults"));
}
