//! C3, stale accepts.

use super::*;
use crate::checker::Status;

#[test]
fn c3_refused_stale_writes_pass_and_are_counted() {
    // C3 passes when the fence refuses every stale token; the refusals count.
    let mut h = clean();
    h.write("w0", 2, (40, 41), 1, Kind::Fail).0.last_mut().unwrap().stale = true;
    let log = audit(&[(1, AuditOutcome::Accepted), (2, AuditOutcome::Accepted), (1, AuditOutcome::Stale)]);
    let v = run(&info(), &h, &log);
    assert_eq!(get(&v, "C3").status, Status::Pass);
    assert_eq!((v.stats.stale_rejected, v.stats.audit.stale, v.stats.writes.stale), (1, 1, 1));
}

#[test]
fn c3_accepted_stale_write_in_the_audit_log_fails() {
    // C3: the storage never carries out a token below one it carried out before.
    let log = audit(&[(1, AuditOutcome::Accepted), (5, AuditOutcome::Accepted), (3, AuditOutcome::Accepted)]);
    let c = get(&run(&info(), &clean(), &log), "C3").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("audit #2"), "{:?}", c.examples);
    // An unfenced entry (fencing-off) is a stale accept too.
    let log = audit(&[(5, AuditOutcome::Accepted), (3, AuditOutcome::Unfenced)]);
    assert_eq!(get(&run(&info(), &clean(), &log), "C3").status, Status::Fail);
}

#[test]
fn c3_history_write_after_a_higher_read_fails() {
    // C3 (history): no write succeeds after an ok read with a higher token completed.
    let mut h = H::default();
    h.read("w1", 1, (0, 1), 9).write("w0", 1, (5, 6), 4, Kind::Ok);
    let c = get(&run(&info(), &h, &[]), "C3").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("stale write accepted"));
}

#[test]
fn c3_judges_fenced_gets_by_the_read_rule() {
    // C3 with the fence's read rule: a GET is carried out iff its token is at
    // or above the last write's, so holder 5 reading after holder 6 only
    // read is no stale accept, but reading after holder 6 wrote is.
    let gets = |ops: &[(&str, u64)]| {
        let mut log = audit(&ops.iter().map(|&(_, t)| (t, AuditOutcome::Accepted)).collect::<Vec<_>>());
        for (entry, (op, _)) in log.iter_mut().zip(ops) {
            entry.op = (*op).into();
        }
        log
    };
    let log = gets(&[("PUT", 5), ("GET", 6), ("GET", 5)]);
    assert_eq!(get(&run(&info(), &clean(), &log), "C3").status, Status::Pass);
    let log = gets(&[("PUT", 5), ("GET", 6), ("PUT", 6), ("GET", 5)]);
    let c = get(&run(&info(), &clean(), &log), "C3").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("stale read: token 5 < last write token 6"), "{:?}", c.examples);
}

#[test]
fn c3_history_read_after_a_higher_write_fails() {
    // C3 (history): no read succeeds after an ok write with a higher token
    // completed: the fence refuses it, whether or not the audit log shows it.
    let mut h = H::default();
    h.write("w1", 1, (0, 1), 9, Kind::Ok).read("w0", 1, (5, 6), 4);
    let c = get(&run(&info(), &h, &[]), "C3").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("stale read accepted"), "{c:?}");
    // A lower read that started before the higher write completed is no stale accept.
    let mut h = H::default();
    h.write("w1", 1, (0, 3), 9, Kind::Ok).read("w0", 1, (2, 6), 4);
    assert_eq!(get(&run(&info(), &h, &[]), "C3").status, Status::Pass);
}
