//! INV-EXCL: at any virtual instant at most one client believes it holds the lock
//! within its own conservative lease deadline (two clients that both believe they
//! hold it within their deadlines is a violation). Every seed must hand the lock
//! to another client after a holder's deadline ran out, or it is inconclusive,
//! which fails.
//!
//! Mutant: the old driver's handling of `CancelWait` (a cancel written after a
//! retry of the same acquire, which the retry's caller believes it holds,
//! releases its grant and hands the lock on) must make INV-EXCL fail for some
//! seed.
//!
//! Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim --test inv_exclusive`.

use fencelock_sim::{check::exclusive, harness, Mutant};

#[test]
fn inv_excl_one_believer_at_a_time() {
    let outcomes = harness::assert_holds("inv_exclusive", exclusive::check);
    println!("beliefs checked over all seeds: {}", harness::total(&outcomes, "beliefs"));
}

#[test]
fn mutant_racy_cancel_makes_inv_excl_fail() {
    harness::assert_caught(Mutant::RacyCancel, exclusive::check);
}
