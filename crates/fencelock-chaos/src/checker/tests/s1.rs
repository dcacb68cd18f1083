//! S1, dead waiters.

use serde_json::json;

use super::*;
use crate::checker::Status;

pub(super) fn trial(h: &mut H, t: u64, holder_after: Option<u64>, outcome: &str) {
    h.note(t, Op::S1Trial, |e| {
        e.detail = json!({ "lock": "s1-1", "dead_lease": 77, "holder_after": holder_after, "waiter_outcome": outcome });
    });
}

#[test]
fn s1_grant_to_a_dead_waiter_fails() {
    // S1: after the release, the lock does not go to the waiter whose lease expired.
    let mut h = clean();
    trial(&mut h, 40, None, "not-acquired: TimedOut");
    trial(&mut h, 50, Some(80), "acquired with a new lease 80");
    assert_eq!(get(&run(&info(), &h, &[]), "S1").status, Status::Pass);
    trial(&mut h, 60, Some(77), "acquired");
    let v = run(&info(), &h, &[]);
    assert_eq!((get(&v, "S1").status, get(&v, "S1").violations), (Status::Fail, 1));
    assert_eq!(v.stats.s1_trials, 3);
}

#[test]
fn s1_a_lock_no_live_client_can_take_after_the_release_fails() {
    // S1: the server hides a dead lease's hold, so a grant to the dead
    // waiter shows as a lock that a live probe cannot take.
    let mut h = clean();
    h.note(40, Op::S1Trial, |e| {
        e.detail = json!({ "lock": "s1-1", "dead_lease": 77, "holder_after": null, "probe": "acquired",
            "waiter_outcome": "error: no answer" });
    });
    assert_eq!(get(&run(&info(), &h, &[]), "S1").status, Status::Pass);
    h.note(50, Op::S1Trial, |e| {
        e.detail = json!({ "lock": "s1-2", "dead_lease": 78, "holder_after": null, "probe": "not acquired: TimedOut",
            "waiter_outcome": "error: no answer" });
    });
    assert_eq!(get(&run(&info(), &h, &[]), "S1").status, Status::Fail);
}
