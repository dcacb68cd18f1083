//! C6, grants survive restarts.

use super::*;
use crate::checker::Status;

#[test]
fn c6_grant_live_at_the_kill_survives() {
    // C6: the holder read back after a restart is the grant live at the kill.
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 4).restart(5, 10).holder(5, 11, Some(4)).release("w0", 1, (12, 13));
    assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Pass);
}

#[test]
fn c6_lost_acknowledged_grant_fails() {
    // C6 fails when the restarted server forgot the live grant.
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 4).restart(5, 10).holder(5, 11, None).release("w0", 1, (12, 13));
    let v = run(&info(), &h, &[]);
    let c = get(&v, "C6");
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("lease Some(104)"), "{:?}", c.examples);
    // Without durable tokens declared, the same is a finding.
    let mut i = info();
    i.durable_tokens = false;
    assert_eq!(get(&run(&i, &h, &[]), "C6").status, Status::Finding);
}

#[test]
fn c6_released_or_lost_grants_are_not_held() {
    // A grant whose release was invoked, or whose worker saw the lease gone,
    // before the kill is not expected back: nothing to evaluate.
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 4).op("w0", Op::Release, 1, (3, 30), Kind::Unknown, |_| {});
    h.restart(5, 10).holder(5, 11, None);
    assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Inconclusive);
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 4).op("w0", Op::Write, 1, (2, 3), Kind::Fail, |e| e.skipped = true);
    h.restart(5, 10).holder(5, 11, None);
    assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Inconclusive);
    // A release invoked between the kill and the read-back excuses an empty holder.
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 4).release("w0", 1, (6, 7)).restart(5, 10).holder(5, 11, None);
    assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Inconclusive);
}

#[test]
fn c6_a_failed_read_back_is_not_judged() {
    // A holder read-back the node never answered is not an empty holder: the
    // restart is not judged (before, a failed read looked like a lost grant).
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 4).restart(5, 10).holder(5, 11, None);
    h.0.last_mut().unwrap().detail["read_error"] = json!("describe: timed out");
    h.release("w0", 1, (12, 13));
    assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::Inconclusive);
}

#[test]
fn c6_without_restarts_is_not_applicable() {
    let mut h = H::default();
    h.cycle("w0", 1, 0, 1);
    assert_eq!(get(&run(&info(), &h, &[]), "C6").status, Status::NotApplicable);
}

#[test]
fn c6_a_reader_read_back_among_several_holders_survives() {
    // C6 in shared mode: readers hold together, so the grant live at the kill
    // may be any of the holders read back, not only the first.
    let readers = |listed: &[u64]| {
        let holders: Vec<serde_json::Value> = listed.iter().map(|t| json!({ "lease": 100 + t, "token": t })).collect();
        let mut h = H::default();
        h.acquire("w1", 1, (0, 1), 3).acquire("w0", 1, (2, 3), 4).restart(5, 10).holder(5, 11, Some(3));
        h.0.last_mut().unwrap().detail["holders"] = serde_json::Value::Array(holders);
        h.release("w0", 1, (12, 13)).release("w1", 1, (14, 15));
        h
    };
    assert_eq!(get(&run(&shared_info(), &readers(&[3, 4]), &[]), "C6").status, Status::Pass);
    assert_eq!(get(&run(&shared_info(), &readers(&[3]), &[]), "C6").status, Status::Fail);
}

#[test]
fn c6_a_lease_that_may_have_run_out_by_the_read_back_is_not_judged() {
    // C6 with INV-12: a restarted server counts a lease's time from its own
    // start, and nobody can renew it while the read-back waits. An empty
    // holder is a lost grant only if the lease, by its holder's deadline,
    // had more left at the kill than the time from the start to the read-back.
    let with = |left_ms: u64, read_back: u64| {
        let mut h = H::default();
        h.acquire("w0", 1, (0, 1), 4);
        h.0.last_mut().unwrap().detail = json!({ "lease_left_ns": left_ms * MS });
        h.restart(5, 10);
        h.0.last_mut().unwrap().detail["started_at"] = json!(6 * MS);
        h.holder(5, read_back, None).release("w0", 1, (read_back + 1, read_back + 2));
        get(&run(&info(), &h, &[]), "C6").status
    };
    // 296 ms left at the kill, read back 5 ms after the start: lost.
    assert_eq!(with(300, 11), Status::Fail);
    // Read back 394 ms after the start: it may have run out.
    assert_eq!(with(300, 400), Status::Inconclusive);
    // By its holder's deadline the lease was already gone at the kill.
    assert_eq!(with(2, 11), Status::Inconclusive);
}
