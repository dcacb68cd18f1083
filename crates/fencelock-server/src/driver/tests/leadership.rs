//! Leadership: a follower refuses with the leader's address; a new leader
//! writes `LeaderStart` before anything else and serves once it is applied; a
//! leader that loses its role fails what it holds with NotLeader.

use super::harness::*;

#[test]
fn a_follower_refuses_with_the_leaders_address() {
    let mut c = core(64);
    assert_eq!(c.step(at(0), [follows(2, "10.0.0.2:7070")]), vec![]);
    assert_eq!(c.step(at(1), [request(1, keep(1, 1))]), vec![Action::Reply(1, not_leader(Some("10.0.0.2:7070")))]);
}

#[test]
fn requests_wait_for_the_leader_start_which_is_written_first() {
    let mut c = core(64);
    assert_eq!(c.step(at(0), [leads(1), request(1, keep(1, 1))]), vec![leader_start(1, 0)]);
    let a = c.step(at(5), [written(1, vec![], vec![], None)]);
    assert_eq!(a, vec![Action::Ready(true), Action::Batched(1), batch(2, 5, vec![keep(1, 1)])]);
}

#[test]
fn a_new_term_writes_a_new_leader_start() {
    let mut c = ready(64);
    assert_eq!(c.step(at(20), [leads(1)]), vec![], "the same term changes nothing");
    assert_eq!(c.step(at(30), [leads(2)]), vec![Action::Ready(false), leader_start(2, 30)]);
}

#[test]
fn losing_leadership_fails_what_is_pending_and_waiting() {
    let mut c = ready(64);
    assert_eq!(c.step(at(20), [request(1, keep(1, 1))]).len(), 2);
    let queued = fencelock_core::Reply::Queued { position: 0 };
    let a = c.step(at(21), [acquire(2, nth(1), 1, 2, "a")]);
    assert_eq!(a, vec![], "waits for the write in flight");
    let a = c.step(at(22), [written(2, vec![kept(1)], vec![], None)]);
    assert_eq!(a.len(), 3, "reply, then the acquire's entry: {a:?}");
    assert_eq!(c.step(at(23), [written(3, vec![queued.clone()], vec![], None)]), vec![Action::Reply(2, Ok(queued))]);
    let a = c.step(at(24), [request(3, keep(1, 3)), follows(2, "b:1")]);
    assert_eq!(a.len(), 3, "{a:?}");
    assert!(a.contains(&Action::Ready(false)));
    assert!(a.contains(&Action::Reply(3, not_leader(Some("b:1")))), "pending: {a:?}");
    assert!(a.contains(&Action::Wake(2, Err(DriverError::NotLeader { leader: Some("b:1".into()) }))), "waiting: {a:?}");
}
