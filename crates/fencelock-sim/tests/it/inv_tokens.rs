//! INV-TOKENS: grant tokens are unique and strictly increasing in grant order,
//! across server crash-restarts; replaying the durable log gives exactly the
//! grants that were made, and every grant a client was told of is durable.
//! Every seed must restart the server and grant again afterwards, or it is
//! inconclusive, which fails.
//!
//! Mutant: a server that answers before it persists must make INV-TOKENS fail
//! for some seed (a crash then loses an acknowledged grant and re-issues its
//! token).
//!
//! Checked on every seed by `every_invariant_holds_on_every_seed` (main.rs),
//! from the seeds' one simulation. Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim every_invariant`.

use fencelock_sim::{check::tokens, harness, Mutant, Report};

pub fn strictly_increase_across_restarts(test: &str, reports: &[Report]) {
    let outcomes = harness::assert_holds(test, reports, tokens::check);
    println!("restarts over all seeds: {}", harness::total(&outcomes, "restarts"));
}

#[test]
fn mutant_reply_before_persist_makes_inv_tokens_fail() {
    harness::assert_caught(Mutant::ReplyBeforePersist, tokens::check);
}
