//! C8, evidence.

use super::*;
use crate::checker::Status;

#[test]
fn c8_missing_evidence_is_inconclusive() {
    // C8: a run that cannot prove its fault happened is inconclusive, and fails.
    let mut i = info();
    i.required_evidence = vec!["restarted".into(), "rolled-back".into()];
    let v = run(&i, &clean(), &[]);
    let c = get(&v, "C8");
    assert_eq!((c.status, c.violations), (Status::Inconclusive, 1));
    assert!(c.examples[0].contains("rolled-back"));
    assert!(!v.passed);
}

#[test]
fn c8_k1_needs_stale_writes_at_the_fence() {
    // K1/K2: at least `min_stale_rejects` stale writes must have reached the fence.
    let mut i = info();
    i.scenario = "K1".into();
    i.min_stale_rejects = 1;
    i.required_evidence = vec!["stopped".into()];
    let mut h = clean();
    h.evidence(24, "stopped", 1);
    assert_eq!(get(&run(&i, &h, &[]), "C8").status, Status::Inconclusive);
    h.write("w0", 2, (40, 41), 1, Kind::Fail).0.last_mut().unwrap().stale = true;
    assert_eq!(get(&run(&i, &h, &[]), "C8").status, Status::Pass);
    // Waived for a backend without tokens: it has nothing to fence with.
    let mut h = clean();
    h.evidence(24, "stopped", 1);
    i.fencing = false;
    assert_eq!(get(&run(&i, &h, &[]), "C8").status, Status::Pass);
}

#[test]
fn c8_shared_runs_count_stale_reads() {
    // C8 in shared mode: a reader paused at its read and refused shows the fault as a stale write does.
    let mut i = shared_info();
    i.min_stale_rejects = 1;
    let log = audit_ops(&[("PUT", 2, AuditOutcome::Accepted), ("GET", 1, AuditOutcome::Stale)]);
    assert_eq!(get(&run(&i, &clean(), &log), "C8").status, Status::Pass);
    assert_eq!(run(&i, &clean(), &log).stats.stale_reads_rejected, 1);
    // Outside shared mode only stale writes count.
    i.shared = false;
    assert_eq!(get(&run(&i, &clean(), &log), "C8").status, Status::Inconclusive);
}
