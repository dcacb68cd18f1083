//! the whole verdict: a clean run, pairing, JSON.

use super::*;
use crate::checker::Status;

#[test]
fn a_clean_run_passes_every_check() {
    // Every applicable check passes; the run passes.
    let mut i = info();
    i.required_evidence = vec!["restarted".into()];
    let v = run(&i, &clean(), &audit(&[(1, AuditOutcome::Accepted), (2, AuditOutcome::Accepted)]));
    assert!(v.passed, "{:#?}", v.checks);
    let pass =
        [("C2", Status::Pass), ("C3", Status::Pass), ("C4", Status::Pass), ("C6", Status::Pass), ("C8", Status::Pass)];
    for (id, status) in pass {
        assert_eq!(get(&v, id).status, status, "{id}");
    }
    assert_eq!(get(&v, "S1").status, Status::NotApplicable);
    assert_eq!(get(&v, "S4").status, Status::NotApplicable);
    assert_eq!(v.stats.acquires.ok, 2);
    assert_eq!(v.stats.writes.ok, 2);
    assert_eq!(v.stats.operations, 8);
    assert_eq!(v.stats.restarts, 1);
    assert_eq!(v.stats.faults["K4"], 1);
    assert_eq!(v.stats.audit.accepted, 2);
}

#[test]
fn pairing_leaves_an_invoke_without_completion_unknown() {
    let mut h = H::default();
    h.op("w0", Op::Acquire, 1, (0, 0), Kind::Invoke, |_| {}).op("w1", Op::Acquire, 1, (1, 2), Kind::Fail, |_| {});
    let v = run(&info(), &h, &[]);
    assert_eq!(v.stats.acquires, Counts { ok: 0, fail: 1, unknown: 1 });
}

#[test]
fn verdict_round_trips_through_json() {
    let v = run(&info(), &clean(), &[]);
    let text = serde_json::to_string(&v).unwrap();
    assert!(text.contains(r#""status":"not-applicable""#));
    assert_eq!(serde_json::from_str::<Verdict>(&text).unwrap(), v);
}
