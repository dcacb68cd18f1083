//! INV-HEAL: after every fault ends, a new grant and an accepted write happen
//! within 2 × TTL plus the restart slack. Every seed must have faults, or it is
//! inconclusive, which fails.
//!
//! Mutant: the real driver's handling of `CancelWait` (a cancel and a retry of
//! the same acquire in one batch wake the retry with `Cancelled`; its later grant
//! is orphaned and the lock stays held) must make INV-HEAL fail for some seed.
//!
//! Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim --test inv_heal`.

use fencelock_sim::{check::heal, harness, Mutant};

#[test]
fn inv_heal_progress_resumes_after_every_fault() {
    let outcomes = harness::assert_holds("inv_heal", heal::check);
    println!(
        "faults healed over all seeds: {}",
        harness::total(&outcomes, "faults")
    );
}

#[test]
fn mutant_racy_cancel_makes_inv_heal_fail() {
    harness::assert_caught(Mutant::RacyCancel, heal::check);
}
