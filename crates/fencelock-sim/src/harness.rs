//! Helpers for the invariant tests: the fixed seed set, the reproduce-one-seed
//! switch (`FENCELOCK_SIM_SEED`), and failure messages that say how to reproduce.

use std::ops::Range;

use crate::{
    check::{self, Checker, Verdict},
    config::{Mutant, SimConfig},
    report::Report,
    sim,
};

/// The seeds every invariant test runs.
pub const SEEDS: Range<u64> = 1..21;
/// Set to one seed to make the tests run just that seed.
pub const SEED_ENV: &str = "FENCELOCK_SIM_SEED";

/// [`SEEDS`], or the one seed in `FENCELOCK_SIM_SEED`.
pub fn seeds() -> Vec<u64> {
    match std::env::var(SEED_ENV).ok().and_then(|s| s.trim().parse().ok()) {
        Some(seed) => vec![seed],
        None => SEEDS.collect(),
    }
}

/// How to run `seed` again, from the test `test` or from the binary.
pub fn reproduce(test: &str, seed: u64) -> String {
    format!(
        "reproduce: {SEED_ENV}={seed} cargo nextest run -p fencelock-sim {test}::\n       or: cargo run -p fencelock-sim -- --seed {seed} --trace"
    )
}

/// One seed's run and verdict.
pub struct Outcome {
    pub seed: u64,
    pub report: Report,
    pub verdict: Verdict,
}

/// Run `checker` on every seed of [`seeds`] with the config `config(seed)`.
pub fn run_seeds(config: impl Fn(u64) -> SimConfig, checker: Checker) -> Vec<Outcome> {
    seeds().into_iter().map(|seed| run_seed(config(seed), checker)).collect()
}

fn run_seed(config: SimConfig, checker: Checker) -> Outcome {
    let report = sim::run(&config);
    let verdict = check::run(checker, &report);
    Outcome { seed: config.seed, report, verdict }
}

/// Run `checker` on every seed and panic, naming each failing seed and how to
/// reproduce it, unless it holds on all of them. Returns the outcomes, for
/// assertions on the evidence across seeds.
pub fn assert_holds(test: &str, checker: Checker) -> Vec<Outcome> {
    assert_holds_where(test, checker, |_| true)
}

/// [`assert_holds`] on the seeds for which `keep` is true only (a checker
/// that judges one workload need not run the others' seeds).
pub fn assert_holds_where(test: &str, checker: Checker, keep: fn(u64) -> bool) -> Vec<Outcome> {
    let kept = seeds().into_iter().filter(|s| keep(*s));
    let outcomes: Vec<Outcome> = kept.map(|seed| run_seed(SimConfig::new(seed), checker)).collect();
    let failures: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.verdict.holds())
        .map(|o| format!("seed {}: {}\n{}", o.seed, o.verdict.summary(), reproduce(test, o.seed)))
        .collect();
    for o in &outcomes {
        println!("seed {:>3}: {}", o.seed, o.verdict.summary());
    }
    assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), outcomes.len(), failures.join("\n"));
    outcomes
}

/// The sum of evidence counter `name` over `outcomes`.
pub fn total(outcomes: &[Outcome], name: &str) -> u64 {
    outcomes.iter().map(|o| o.verdict.evidence(name)).sum()
}

/// Prove that `checker` can fail: with `mutant` switched on, run the seeds of
/// [`SEEDS`] (always all of them, whatever `FENCELOCK_SIM_SEED` says) until one
/// shows a violation, and return that seed; panic if none does.
pub fn assert_caught(mutant: Mutant, checker: Checker) -> u64 {
    let mut invariant = "the invariant";
    for seed in SEEDS {
        let report = sim::run(&SimConfig::new(seed).with_mutant(mutant));
        let verdict = checker(&report);
        if !verdict.violations.is_empty() {
            println!("mutant {mutant:?} caught by seed {seed}: {}", verdict.summary());
            return seed;
        }
        invariant = verdict.invariant;
    }
    panic!("mutant {mutant:?} did not make {invariant} fail on any of the seeds {SEEDS:?}: the checker cannot fail");
}
