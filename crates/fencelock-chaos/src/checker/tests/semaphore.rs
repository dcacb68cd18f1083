//! Semaphore mode: C3 and C4 per object, R2 on permits.

use super::*;
use crate::checker::Status;

use AuditOutcome::Accepted;

/// A semaphore run of 2 permits: each worker writes its own object.
fn semaphore_info() -> RunInfo {
    RunInfo { scenario: "K1".into(), permits: 2, polls_holders: true, ..info() }
}

/// w0 (token 5) and w1 (token 9) hold permits together, each writing its own
/// object; `w1_final` is w1's object at the end.
fn two_holders(w1_final: &[&str]) -> (H, Vec<AuditEntry>) {
    let mut h = H::default();
    h.acquire("w1", 1, (0, 1), 9)
        .read("w1", 1, (2, 3), 9)
        .acquire("w0", 1, (4, 5), 5)
        .read("w0", 1, (6, 7), 5)
        .write("w0", 1, (8, 9), 5, Kind::Ok)
        .write("w1", 1, (10, 11), 9, Kind::Ok)
        .release("w0", 1, (12, 13))
        .release("w1", 1, (14, 15))
        .holders(6, &[("exclusive", 9, 1), ("exclusive", 5, 1)], 2)
        .final_read_of(5_000, "obj-w0", &["w0-1"])
        .final_read_of(5_000, "obj-w1", w1_final);
    let mut log = audit_ops(&[("GET", 9, Accepted), ("GET", 5, Accepted), ("PUT", 5, Accepted), ("PUT", 9, Accepted)]);
    for (e, key) in log.iter_mut().zip(["obj-w1", "obj-w0", "obj-w0", "obj-w1"]) {
        e.key = key.into();
    }
    (h, log)
}

#[test]
fn semaphore_holders_on_their_own_objects_pass() {
    // C3/C4 per object: w0's write with token 5 after w1's read with token 9
    // is no stale accept, since they touch different objects; R2: 2 of 2 permits.
    let (h, log) = two_holders(&["w1-1"]);
    let v = run(&semaphore_info(), &h, &log);
    for id in ["C3", "C4", "R2"] {
        assert_eq!(get(&v, id).status, Status::Pass, "{:?}", get(&v, id));
    }
    assert_eq!(v.stats.audit.accepted, 4);
    assert!(v.checks.iter().all(|c| c.id != "R1"));
}

#[test]
fn semaphore_lost_update_on_one_object_fails() {
    // C4 per object: w1's acknowledged append missing from its own object.
    let (h, log) = two_holders(&[]);
    let c = get(&run(&semaphore_info(), &h, &log), "C4").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{c:?}");
    assert!(c.examples[0].contains("w1-1"), "{c:?}");
    // The same history judged as one object: the objects' writes look stale to C3.
    let one = RunInfo { permits: 0, ..semaphore_info() };
    assert_eq!(get(&run(&one, &h, &[]), "C3").status, Status::Fail);
}
