//! R2, holders fit (INV-15 at the server).

use super::*;
use crate::checker::Status;

#[test]
fn r2_readers_together_or_a_writer_alone_pass() {
    // R2 (INV-15): readers share the lock, a writer holds it alone.
    let mut h = clean();
    h.holders(1, &[], 0).holders(2, &[("shared", 5, 1), ("shared", 6, 1)], 0).holders(3, &[("exclusive", 7, 1)], 0);
    let v = run(&shared_info(), &h, &[]);
    assert_eq!(get(&v, "R2").status, Status::Pass, "{:?}", get(&v, "R2"));
    assert_eq!((v.stats.holder_polls, v.stats.polls_shared), (3, 1));
}

#[test]
fn r2_a_writer_beside_a_reader_fails() {
    // R2 (INV-15): a poll that shows a writer beside anyone is a violation.
    let mut h = clean();
    h.holders(2, &[("shared", 6, 1)], 0).holders(3, &[("exclusive", 7, 1), ("shared", 8, 1)], 0);
    let c = get(&run(&shared_info(), &h, &[]), "R2").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("tokens 7, 8"), "{c:?}");
    // Two writers at once too.
    let mut h = clean();
    h.holders(3, &[("exclusive", 7, 1), ("exclusive", 8, 1)], 0);
    assert_eq!(get(&run(&shared_info(), &h, &[]), "R2").status, Status::Fail);
}

#[test]
fn r2_a_semaphore_over_its_permits_fails() {
    // R2 (INV-15): a semaphore of N permits never has more than N in use.
    let mut h = clean();
    h.holders(2, &[("exclusive", 5, 1), ("exclusive", 6, 1)], 2);
    assert_eq!(get(&run(&shared_info(), &h, &[]), "R2").status, Status::Pass);
    h.holders(3, &[("exclusive", 5, 1), ("exclusive", 7, 2)], 2);
    let c = get(&run(&shared_info(), &h, &[]), "R2").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("3 permits in use of 2"), "{c:?}");
}

#[test]
fn r2_without_polls_is_inconclusive_or_not_applicable() {
    // R2: an observer that never got an answer shows nothing; a backend without one is not judged.
    let v = run(&shared_info(), &clean(), &[]);
    assert_eq!(get(&v, "R2").status, Status::Inconclusive);
    let i = RunInfo { polls_holders: false, ..shared_info() };
    assert_eq!(get(&run(&i, &clean(), &[]), "R2").status, Status::NotApplicable);
}
