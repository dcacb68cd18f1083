//! C4, lost updates.

use super::*;
use crate::checker::Status;

#[test]
fn c4_acknowledged_append_missing_fails() {
    // C4: every acknowledged append is in the final value.
    let mut h = clean();
    h.final_read(5_001, &["w1-1"]);
    let c = get(&run(&info(), &h, &[]), "C4").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("lost update") && c.examples[0].contains("w0-1"));
}

#[test]
fn c4_id_twice_or_from_a_failed_write_fails() {
    // C4: nothing twice, nothing whose write certainly failed, nothing never written.
    let mut h = clean();
    h.write("w0", 2, (40, 41), 3, Kind::Fail).final_read(5_001, &["w0-1", "w1-1", "w0-1", "w0-2", "zz-9"]);
    let c = get(&run(&info(), &h, &[]), "C4").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 3), "{:?}", c.examples);
}

#[test]
fn c4_unknown_write_may_or_may_not_be_there() {
    // An unknown write is allowed in the final value and allowed to be missing.
    for ids in [&["w0-1", "w1-1", "w0-2"][..], &["w0-1", "w1-1"][..]] {
        let mut h = clean();
        h.write("w0", 2, (40, 41), 3, Kind::Unknown).final_read(5_001, ids);
        assert_eq!(get(&run(&info(), &h, &[]), "C4").status, Status::Pass);
    }
}

#[test]
fn c4_without_final_read_is_inconclusive() {
    let mut h = H::default();
    h.cycle("w0", 1, 0, 1);
    let v = run(&info(), &h, &[]);
    assert_eq!(get(&v, "C4").status, Status::Inconclusive);
    assert!(!v.passed);
}

#[test]
fn c4_lost_update_on_a_backend_without_fencing_is_a_finding() {
    // Redlock declares no token: its lost updates are findings, and the run passes.
    let mut i = info();
    i.fencing = false;
    i.durable_tokens = false;
    let mut h = clean();
    h.final_read(5_001, &["w1-1"]);
    let v = run(&i, &h, &[]);
    assert_eq!(get(&v, "C4").status, Status::Finding);
    assert!(v.passed, "{:#?}", v.checks);
}
