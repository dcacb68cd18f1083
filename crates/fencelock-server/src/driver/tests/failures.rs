//! Failing closed: a failed write answers its callers and pauses writing; a
//! stopped Raft node answers everything with why, for good; a leader cut off
//! from a majority stops serving (and fails what is in flight) until the
//! majority answers again.

use super::harness::*;
use crate::driver::core::RETRY_AFTER_FAILED_WRITE_MS;

fn unavailable(r: &A) -> bool {
    matches!(r, Action::Reply(_, Err(DriverError::Unavailable(_))) | Action::Wake(_, Err(DriverError::Unavailable(_))))
}

#[test]
fn a_failed_write_answers_its_callers_and_writing_pauses() {
    let mut c = ready(64);
    assert_eq!(c.step(at(20), [request(1, keep(1, 1))]).len(), 2);
    let e = DriverError::Unavailable("disk full".into());
    assert_eq!(c.step(at(30), [Event::Written(2, Err(e.clone()))]), vec![Action::Reply(1, Err(e))]);
    assert_eq!(c.next_wake(), Some(30 + RETRY_AFTER_FAILED_WRITE_MS));
    assert_eq!(c.step(at(40), [request(2, keep(1, 2))]), vec![], "no write during the pause");
    let a = c.step(at(30 + RETRY_AFTER_FAILED_WRITE_MS), [Event::Timer]);
    assert_eq!(a, vec![Action::Batched(1), batch(3, 130, vec![keep(1, 2)])]);
}

#[test]
fn a_stopped_node_answers_everything_with_why_for_good() {
    let mut c = ready(64);
    let a = c.step(at(20), [Event::RaftGone]);
    assert_eq!(a, vec![Action::Ready(false)]);
    let a = c.step(at(21), [request(1, keep(1, 1)), leads(2)]);
    assert_eq!(a.len(), 1, "no LeaderStart after a stop: {a:?}");
    assert!(unavailable(&a[0]), "{a:?}");
    assert!(format!("{a:?}").contains("restart the server"));
}

#[test]
fn a_fatal_error_stops_the_node() {
    let mut c = ready(64);
    let fatal = RaftView { fatal: Some("storage failed".into()), ..RaftView::default() };
    assert_eq!(c.step(at(20), [Event::Raft(fatal)]), vec![Action::Ready(false)]);
    let a = c.step(at(21), [request(1, keep(1, 1))]);
    assert!(format!("{a:?}").contains("storage failed"), "{a:?}");
}

/// A leader of 3 with a quorum timeout of 100 ms.
fn leader_of_three(silent_ms: u64) -> E {
    Event::Raft(RaftView {
        is_leader: true,
        term: 1,
        voters: 3,
        millis_since_quorum_ack: Some(silent_ms),
        ..RaftView::default()
    })
}

#[test]
fn a_leader_cut_off_from_its_majority_serves_nothing_until_it_answers() {
    let mut c = core(64).with_quorum_timeout(100);
    assert_eq!(c.step(at(0), [leader_of_three(0)]), vec![leader_start(1, 0)]);
    assert_eq!(c.step(at(1), [written(1, vec![], vec![], None)]), vec![Action::Ready(true)]);
    assert_eq!(c.step(at(20), [request(1, keep(1, 1))]).len(), 2);
    let a = c.step(at(300), [leader_of_three(250)]);
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a[0], Action::Ready(false));
    assert!(unavailable(&a[1]), "the caller in flight is told at once: {a:?}");
    let a = c.step(at(301), [request(2, keep(1, 2))]);
    assert!(a.len() == 1 && unavailable(&a[0]), "{a:?}");
    // The write in flight completes: its caller was already answered.
    assert_eq!(c.step(at(302), [written(2, vec![kept(1)], vec![], None)]), vec![]);
    // The majority answers: serve again, with a tick for the expiries missed.
    let a = c.step(at(400), [leader_of_three(10)]);
    assert_eq!(a, vec![Action::Ready(true), Action::Batched(0), batch(3, 400, vec![])]);
}
