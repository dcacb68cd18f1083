//! The simulator's invariant checks, one binary (each invariant a module).
//! Every seed is simulated once, twice for determinism
//! (`harness::simulate_every_seed`), and each invariant is judged on those
//! runs by `every_invariant_holds_on_every_seed`; the mutant tests, in the
//! invariants' modules, run their own simulations.
//! Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim every_invariant`.

mod inv_dead_waiter;
mod inv_exclusive;
mod inv_fence;
mod inv_heal;
mod inv_multi;
mod inv_tokens;
mod many_clients;

use std::panic::{catch_unwind, AssertUnwindSafe};

use fencelock_sim::{harness, Report};

/// An invariant's judgement of every seed's run: panics, naming the seeds, if
/// it does not hold (its first argument is the test's name, for the
/// reproduce line).
type Judge = fn(&str, &[Report]);

/// Determinism, then each invariant on the same runs. A failing invariant
/// does not hide the others: each is judged, and the test fails naming all
/// that failed (each one's seeds and message are printed above it).
#[test]
fn every_invariant_holds_on_every_seed() {
    const TEST: &str = "every_invariant_holds_on_every_seed";
    let reports = harness::simulate_every_seed(TEST);
    let invariants: [(&str, Judge); 6] = [
        ("INV-EXCL", inv_exclusive::one_believer_at_a_time),
        ("INV-FENCE", inv_fence::no_stale_accepts_and_pauses_are_rejected),
        ("INV-TOKENS", inv_tokens::strictly_increase_across_restarts),
        ("INV-DEAD-WAITER", inv_dead_waiter::no_grant_to_an_expired_lease),
        ("INV-HEAL", inv_heal::progress_resumes_after_every_fault),
        ("INV-MULTI", inv_multi::never_a_partial_multi_lock),
    ];
    let mut failed = Vec::new();
    for (name, holds) in invariants {
        println!("== {name}");
        if catch_unwind(AssertUnwindSafe(|| holds(TEST, &reports))).is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "failed: {} (see above)", failed.join(", "));
}
