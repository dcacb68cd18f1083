//! The invariants, one module each, checked on a finished run's [`Report`].
//! `docs/invariants.md` maps their ids (INV-EXCL, …) to the design's INV-n and
//! to the chaos suite's checks.
//!
//! A checker returns a [`Verdict`]: the violations it found, counters that show
//! the dangerous case really happened in this run (evidence), and, when it did
//! not, why the run proves nothing (inconclusive, which fails like a violation).
//! A run whose simulation failed is a violation of every invariant.

pub mod dead_waiter;
pub mod exclusive;
pub mod fence;
pub mod heal;
pub mod multi;
pub mod tokens;

use crate::report::Report;

/// The result of checking one invariant on one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The invariant's id, e.g. `INV-FENCE`.
    pub invariant: &'static str,
    pub violations: Vec<String>,
    /// Named counters that prove the run exercised the invariant.
    pub evidence: Vec<(&'static str, u64)>,
    /// Why the run does not exercise the invariant, if it does not.
    pub inconclusive: Option<String>,
}

impl Verdict {
    pub fn new(invariant: &'static str) -> Self {
        Self { invariant, violations: Vec::new(), evidence: Vec::new(), inconclusive: None }
    }

    /// No violation and conclusive.
    pub fn holds(&self) -> bool {
        self.violations.is_empty() && self.inconclusive.is_none()
    }

    /// The value of the evidence counter `name` (0 if absent).
    pub fn evidence(&self, name: &str) -> u64 {
        self.evidence.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v)
    }

    /// Record a violation, keeping at most a screenful of them.
    pub fn violate(&mut self, what: String) {
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }

    /// Inconclusive unless `cond`.
    pub fn require(&mut self, cond: bool, why: &str) {
        if !cond && self.inconclusive.is_none() {
            self.inconclusive = Some(why.to_string());
        }
    }

    /// One line per finding, for reports and test failures.
    pub fn summary(&self) -> String {
        let evidence: Vec<String> = self.evidence.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let mut s = format!("{} {} [{}]", self.invariant, self.status(), evidence.join(" "));
        for v in &self.violations {
            s.push_str(&format!("\n  violation: {v}"));
        }
        if let Some(why) = &self.inconclusive {
            s.push_str(&format!("\n  inconclusive: {why}"));
        }
        s
    }

    fn status(&self) -> &'static str {
        match (self.violations.is_empty(), self.inconclusive.is_none()) {
            (false, _) => "VIOLATED",
            (true, false) => "INCONCLUSIVE",
            (true, true) => "holds",
        }
    }
}

/// A checker: one invariant on one report.
pub type Checker = fn(&Report) -> Verdict;

/// Every invariant, in a fixed order.
pub const ALL: [Checker; 6] =
    [fence::check, tokens::check, exclusive::check, dead_waiter::check, heal::check, multi::check];

/// Run `checker`, turning a failed simulation into a violation.
pub fn run(checker: Checker, report: &Report) -> Verdict {
    let mut v = checker(report);
    if let Some(e) = &report.error {
        v.violate(format!("the simulation failed: {e}"));
    }
    v
}
