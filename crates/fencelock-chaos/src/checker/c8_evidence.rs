//! Check C8, "the faults provably happened" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).

use super::run::{without, Run, Tally};
use super::{Check, Stats, Status};

const C8: &str = "the faults provably happened";

/// C8: every required evidence was seen, and (K1, K2) enough stale writes
/// reached the fence (in shared mode, stale reads count too: a reader is
/// paused at its read as a writer at its write); else the run is
/// inconclusive.
pub(super) fn c8_evidence(r: &Run<'_>, stats: &Stats, stale_accepts: u64) -> Check {
    let need_stale = r.info.min_stale_rejects > 0 && r.info.fencing;
    if r.info.required_evidence.is_empty() && !need_stale {
        return without("C8", C8, Status::NotApplicable, "the scenario requires no evidence".into());
    }
    let mut tally = Tally::default();
    for what in &r.info.required_evidence {
        if stats.evidence.get(what).copied().unwrap_or(0) == 0 {
            tally.add(|| format!("no evidence {what:?}"));
        }
    }
    let reads = if r.info.shared { stats.stale_reads_rejected } else { 0 };
    let seen = stats.stale_rejected + reads + stale_accepts;
    let what = if r.info.shared { "stale reads and writes" } else { "stale writes" };
    if need_stale && seen < r.info.min_stale_rejects {
        tally.add(|| format!("{seen} {what} reached the fence, {} required", r.info.min_stale_rejects));
    }
    let status = if tally.violations == 0 { Status::Pass } else { Status::Inconclusive };
    Check { id: "C8".into(), name: C8.into(), status, violations: tally.violations, examples: tally.examples }
}
