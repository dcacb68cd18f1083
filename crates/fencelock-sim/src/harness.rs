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

/// How to run `seed` again, from the test `test` (a nextest filter) or from the binary.
pub fn reproduce(test: &str, seed: u64) -> String {
    format!(
        "reproduce: {SEED_ENV}={seed} cargo nextest run -p fencelock-sim {test}\n       or: cargo run -p fencelock-sim -- --seed {seed} --trace"
    )
}

/// One seed's run and one checker's verdict on it.
pub struct Outcome<'a> {
    pub seed: u64,
    pub report: &'a Report,
    pub verdict: Verdict,
}

/// Every seed of [`seeds`] simulated once with `SimConfig::new(seed)`, the
/// runs every invariant is checked on. Each seed is simulated a second time
/// and must give the identical trace (without that no failing seed could be
/// reproduced), and two different seeds must give different traces.
/// (Each invariant's test used to simulate the seeds again: the same runs
/// six times over, most of the CPU of CI's test run.)
pub fn simulate_every_seed(test: &str) -> Vec<Report> {
    let seeds = seeds();
    let mut reports = Vec::new();
    let mut traces: Vec<(u64, Vec<String>)> = Vec::new();
    for &seed in &seeds {
        let report = sim::run(&SimConfig::new(seed));
        let (first, again) = (report.trace(), sim::run(&SimConfig::new(seed)).trace());
        assert!(
            first == again,
            "seed {seed} gave two different traces, first difference at {}\n{}",
            first_difference(&first, &again),
            reproduce(test, seed)
        );
        reports.push(report);
        traces.push((seed, first));
    }
    if traces.len() == 1 {
        traces.push((seeds[0] + 1, sim::run(&SimConfig::new(seeds[0] + 1)).trace()));
    }
    for w in traces.windows(2) {
        let ((s1, t1), (s2, t2)) = (&w[0], &w[1]);
        assert_ne!(t1, t2, "seeds {s1} and {s2} gave the same trace");
    }
    println!("{} seeds, each run twice: identical traces", seeds.len());
    reports
}

fn first_difference(a: &[String], b: &[String]) -> String {
    let i = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    format!("line {i}: {:?} vs {:?}", a.get(i), b.get(i))
}

/// Judge `reports` with `checker` and panic, naming each failing seed and how
/// to reproduce it, unless it holds on all of them. Returns the outcomes, for
/// assertions on the evidence across seeds.
pub fn assert_holds<'a>(test: &str, reports: &'a [Report], checker: Checker) -> Vec<Outcome<'a>> {
    assert_holds_where(test, reports, checker, |_| true)
}

/// [`assert_holds`] on the seeds for which `keep` is true only (a checker
/// that judges one workload need not judge the others' seeds).
pub fn assert_holds_where<'a>(
    test: &str,
    reports: &'a [Report],
    checker: Checker,
    keep: fn(u64) -> bool,
) -> Vec<Outcome<'a>> {
    let kept = reports.iter().filter(|r| keep(r.config.seed));
    let outcomes: Vec<Outcome> =
        kept.map(|report| Outcome { seed: report.config.seed, report, verdict: check::run(checker, report) }).collect();
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
