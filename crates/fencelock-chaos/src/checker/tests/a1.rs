//! A1, auth refusals.

use serde_json::json;

use super::*;
use crate::checker::Status;

pub(super) fn auth_audit(count: u64, detail: serde_json::Value) -> impl FnOnce(&mut Event) {
    move |e: &mut Event| {
        e.count = Some(count);
        e.detail = detail;
    }
}

/// A1: a clean run under auth passes; one refused call, in the audit logs
/// or in a worker's history, fails it; unread audit logs make it
/// inconclusive; a run without auth is not applicable.
#[test]
fn a1_fails_on_any_auth_refusal() {
    let i = info();
    let a = audit(&[(1, AuditOutcome::Accepted), (2, AuditOutcome::Accepted)]);
    assert_eq!(get(&run(&i, &clean(), &a), "A1").status, Status::NotApplicable);
    let mut h = clean();
    h.note(6_000, Op::AuthAudit, auth_audit(0, json!({ "files": 3, "examples": [] })));
    assert_eq!(get(&run(&i, &h, &a), "A1").status, Status::Pass);

    let mut h = clean();
    let line = r#"{"identity":"chaos-worker","verb":"acquire","outcome":"denied"}"#;
    h.note(6_000, Op::AuthAudit, auth_audit(2, json!({ "files": 3, "examples": [line] })));
    let v = run(&i, &h, &a);
    let a1 = get(&v, "A1");
    assert_eq!((a1.status, a1.violations), (Status::Fail, 2), "{a1:?}");
    assert!(a1.examples[0].contains("chaos-worker") && !v.passed);

    let mut h = clean();
    h.op("w2", Op::Acquire, 1, (40, 41), Kind::Fail, |e| {
        e.refused = true;
        e.error = Some("permission denied: chaos-worker may not acquire lock \"x\"".into());
    });
    let a1 = get(&run(&i, &h, &a), "A1").clone();
    assert_eq!((a1.status, a1.violations), (Status::Fail, 1), "a refused worker fails even without the audit note");

    let mut h = clean();
    h.note(6_000, Op::AuthAudit, auth_audit(0, json!({ "error": "no audit log" })));
    assert_eq!(get(&run(&i, &h, &a), "A1").status, Status::Inconclusive);
}
