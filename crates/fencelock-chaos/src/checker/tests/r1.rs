//! R1, fenced reads see the last accepted write (shared mode).

use super::*;
use crate::checker::Status;

use AuditOutcome::{Accepted, Stale};

/// Writer w0 (token 1) writes `w0-1`; reader w1 (token 2) reads it; writer w2
/// (token 3) appends `w2-1`; reader w3 (token 4) reads `saw_last`; the final
/// read has both appends. The audit log as the storage wrote it.
fn readers_and_writers(saw_last: &[&str]) -> (H, Vec<AuditEntry>) {
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 1)
        .read_saw("w0", 1, (2, 3), 1, &[])
        .write("w0", 1, (4, 5), 1, Kind::Ok)
        .release("w0", 1, (6, 7))
        .acquire("w1", 1, (10, 11), 2)
        .read_saw("w1", 1, (12, 13), 2, &["w0-1"])
        .release("w1", 1, (14, 15))
        .acquire("w2", 1, (20, 21), 3)
        .read_saw("w2", 1, (22, 23), 3, &["w0-1"])
        .write("w2", 1, (24, 25), 3, Kind::Ok)
        .release("w2", 1, (26, 27))
        .acquire("w3", 1, (30, 31), 4)
        .read_saw("w3", 1, (32, 33), 4, saw_last)
        .release("w3", 1, (34, 35))
        .final_read(5_000, &["w0-1", "w2-1"]);
    let log = audit_ops(&[
        ("GET", 1, Accepted),
        ("PUT", 1, Accepted),
        ("GET", 2, Accepted),
        ("GET", 3, Accepted),
        ("PUT", 3, Accepted),
        ("GET", 4, Accepted),
    ]);
    (h, log)
}

#[test]
fn r1_reads_that_saw_the_last_write_pass() {
    // R1: each read the storage carried out returned the last carried-out write's value.
    let (h, log) = readers_and_writers(&["w0-1", "w2-1"]);
    let v = run(&shared_info(), &h, &log);
    assert_eq!(get(&v, "R1").status, Status::Pass, "{:?}", get(&v, "R1"));
    assert_eq!(get(&v, "C3").status, Status::Pass);
}

#[test]
fn r1_a_read_of_an_older_value_fails() {
    // R1: reader token 4, carried out after PUT token 3, saw the value before it.
    let (h, log) = readers_and_writers(&["w0-1"]);
    let v = run(&shared_info(), &h, &log);
    let c = get(&v, "R1");
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{c:?}");
    assert!(c.examples[0].contains("audit #5") && c.examples[0].contains("audit #4, PUT token 3"), "{c:?}");
    assert!(!v.passed);
}

#[test]
fn r1_refused_reads_are_not_judged_and_no_read_is_inconclusive() {
    // R1 judges only reads the storage carried out: a refused (stale) GET proves nothing.
    let (h, mut log) = readers_and_writers(&["w0-1"]);
    log[5].outcome = Stale;
    assert_eq!(get(&run(&shared_info(), &h, &log), "R1").status, Status::Pass);
    // No fenced read reached the storage: nothing to judge, the run cannot pass.
    let log = audit_ops(&[("PUT", 1, Accepted)]);
    assert_eq!(get(&run(&shared_info(), &h, &log), "R1").status, Status::Inconclusive);
}

#[test]
fn r1_only_in_shared_runs() {
    // R1 and R2 are part of shared runs' verdicts only.
    let (h, log) = readers_and_writers(&["w0-1"]);
    let v = run(&info(), &h, &log);
    assert!(v.checks.iter().all(|c| c.id != "R1" && c.id != "R2"));
}
