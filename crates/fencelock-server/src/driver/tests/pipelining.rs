//! Pipelining (issue 19 §3): up to `max_inflight` writes in flight; outputs
//! are acted on only once their own write returned (persist, then reply) and
//! strictly in proposal order; a failed write fails every write after it; a
//! lost term acts on none of its outputs; `LeaderStart` is alone in flight.

use super::harness::*;
use crate::driver::core::RETRY_AFTER_FAILED_WRITE_MS;

/// A core allowing two writes in flight, ready (its next write is 2).
fn two_in_flight() -> Core {
    ready_with(Core::new(64).with_max_inflight(2))
}

/// Writes 2 and 3 in flight: keep-alives of callers 1 and 2; caller 3 pending.
fn two_writes() -> Core {
    let mut c = two_in_flight();
    assert_eq!(c.step(at(20), [request(1, keep(1, 1))]), vec![Action::Batched(1), batch(2, 20, vec![keep(1, 1)])]);
    let a = c.step(at(21), [request(2, keep(2, 1))]);
    assert_eq!(a, vec![Action::Batched(1), batch(3, 21, vec![keep(2, 1)])], "a lone request is not held back");
    assert_eq!(c.step(at(22), [request(3, keep(3, 1))]), vec![], "two in flight: the third waits");
    c
}

fn unavailable(e: &str) -> DriverError {
    DriverError::Unavailable(e.into())
}

/// Proposal order: a later write's completion is held until the earlier one's.
#[test]
fn a_later_write_that_returns_first_waits_for_the_earlier_one() {
    let mut c = two_writes();
    assert_eq!(c.step(at(30), [written(3, vec![kept(2)], vec![], None)]), vec![], "held: write 2 has not returned");
    let a = c.step(at(31), [written(2, vec![kept(1)], vec![], None)]);
    let want = vec![
        Action::Reply(1, Ok(kept(1))),
        Action::Reply(2, Ok(kept(2))),
        Action::Batched(1),
        batch(4, 31, vec![keep(3, 1)]),
    ];
    assert_eq!(a, want, "both in proposal order, then the one that waited");
}

/// The deadline that counts is the last applied entry's, in proposal order.
#[test]
fn the_next_deadline_is_the_latest_entrys() {
    let mut c = two_writes();
    assert_eq!(c.step(at(30), [written(3, vec![kept(2)], vec![], Some(900))]), vec![]);
    assert_eq!(c.next_wake(), None, "nothing of write 3 is acted on before write 2");
    assert_eq!(c.step(at(31), [written(2, vec![kept(1)], vec![], Some(500))]).len(), 4);
    assert_eq!(c.next_wake(), Some(900));
}

/// A failed write fails its callers and those of every write after it; the
/// later write's output, even a success, is not acted on.
#[test]
fn a_failed_write_fails_every_write_after_it() {
    let mut c = two_writes();
    let e = unavailable("disk full");
    let a = c.step(at(30), [Event::Written(2, Err(e.clone()))]);
    assert_eq!(a, vec![Action::Reply(1, Err(e.clone())), Action::Reply(2, Err(e))]);
    assert_eq!(c.step(at(31), [written(3, vec![kept(2)], vec![], Some(99))]), vec![], "write 3's output is ignored");
    assert_eq!(c.next_wake(), Some(30 + RETRY_AFTER_FAILED_WRITE_MS));
    let a = c.step(at(30 + RETRY_AFTER_FAILED_WRITE_MS), [Event::Timer]);
    assert_eq!(a, vec![Action::Batched(1), batch(4, 130, vec![keep(3, 1)])], "after the pause, what was pending");
}

/// A later write's failure that returns first is held too: the earlier write's
/// success is answered, then the failure.
#[test]
fn a_later_failure_waits_for_the_earlier_success() {
    let mut c = two_writes();
    let e = unavailable("disk full");
    assert_eq!(c.step(at(30), [Event::Written(3, Err(e.clone()))]), vec![]);
    let a = c.step(at(31), [written(2, vec![kept(1)], vec![], None)]);
    assert_eq!(a, vec![Action::Reply(1, Ok(kept(1))), Action::Reply(2, Err(e))]);
}

/// Losing leadership with two writes in flight: both callers get NotLeader at
/// once, and neither output is acted on when it comes.
#[test]
fn losing_leadership_fails_every_write_in_flight_and_ignores_their_outputs() {
    let mut c = two_writes();
    let a = c.step(at(30), [follows(2, "b:1")]);
    let nl = not_leader(Some("b:1"));
    let want =
        vec![Action::Ready(false), Action::Reply(1, nl.clone()), Action::Reply(2, nl.clone()), Action::Reply(3, nl)];
    assert_eq!(a, want);
    assert_eq!(c.step(at(31), [written(2, vec![kept(1)], vec![], Some(50))]), vec![]);
    assert_eq!(c.step(at(32), [written(3, vec![kept(2)], vec![], Some(60))]), vec![]);
    assert_eq!(c.next_wake(), None, "no deadline from a lost term");
}

/// `LeaderStart` goes out alone: nothing beside it until it is applied.
#[test]
fn the_leader_start_is_alone_in_flight() {
    let mut c = Core::new(64).with_max_inflight(4);
    assert_eq!(c.step(at(0), [leads(1), request(1, keep(1, 1))]), vec![leader_start(1, 0)]);
    assert_eq!(c.step(at(1), [request(2, keep(2, 1))]), vec![], "requests wait for the LeaderStart");
    let a = c.step(at(5), [written(1, vec![], vec![], None)]);
    assert_eq!(a, vec![Action::Ready(true), Action::Batched(2), batch(2, 5, vec![keep(1, 1), keep(2, 1)])]);
}

/// A new term's `LeaderStart` waits until the old term's writes returned
/// (their callers were told at once).
#[test]
fn a_new_terms_leader_start_waits_for_the_old_writes() {
    let mut c = two_writes();
    let a = c.step(at(30), [leads(2)]);
    assert_eq!(a.len(), 3, "not ready, callers 1 and 2 told: {a:?}");
    assert!(a.iter().all(|a| !matches!(a, Action::Write(..))), "{a:?}");
    assert_eq!(c.step(at(31), [written(2, vec![kept(1)], vec![], None)]), vec![]);
    assert_eq!(c.step(at(32), [written(3, vec![kept(2)], vec![], None)]), vec![leader_start(4, 32)]);
    let a = c.step(at(33), [written(4, vec![], vec![], None)]);
    assert_eq!(a, vec![Action::Ready(true), Action::Batched(1), batch(5, 33, vec![keep(3, 1)])]);
}
