//! Waiters: a queued acquire is woken by its grant; a caller that went away
//! gets its `CancelWait` written; a retry of the same acquire (same lease and
//! request id) owns the wait from its arrival, so the cancel of an older caller
//! is never written (the race the simulator found, see `fencelock-sim`).

use super::harness::*;
use crate::driver::AcquireOutcome;
use fencelock_core::{Command, Effect, LeaseId, LockName, Reply, RequestId, SlotCompletion, Token, WaitEnd};

fn queued() -> Reply {
    Reply::Queued { position: 0 }
}

fn cancel(lease: u64, req: u64, lock: &str) -> Command {
    Command::CancelWait { req: RequestId(req), lease: LeaseId(lease), lock: lock.into() }
}

/// Acquire (lease 1, req 5) on "a" by caller 1, generation 1, answered Queued.
fn queued_core() -> Core {
    let mut c = ready(64);
    assert_eq!(
        c.step(at(20), [acquire(1, nth(1), 1, 5, "a")]),
        vec![Action::Batched(1), batch(2, 20, vec![acquire_cmd(1, 5, "a")])]
    );
    assert_eq!(c.step(at(21), [written(2, vec![queued()], vec![], None)]), vec![Action::Reply(1, Ok(queued()))]);
    c
}

#[test]
fn a_grant_wakes_the_waiter_of_its_acquire() {
    let mut c = queued_core();
    assert_eq!(c.step(at(30), [request(2, keep(2, 1))]).len(), 2);
    let effect = granted("a", 1, 5, 9);
    let a = c.step(at(31), [written(3, vec![kept(2)], vec![effect.clone()], None)]);
    let woken = WaitOutcome::Granted { grant: grant("a", 1, 9), waited_ms: 5 };
    assert_eq!(a, vec![Action::Reply(2, Ok(kept(2))), Action::Wake(1, Ok(woken)), Action::Effect(effect)]);
}

/// INV-18: the per-lock grants of a multi-acquire come in one step; its
/// waiter is woken once, with all of them, in order.
#[test]
fn a_multi_grant_wakes_its_waiter_once_with_every_grant() {
    let mut c = queued_core();
    assert_eq!(c.step(at(30), [request(2, keep(2, 1))]).len(), 2);
    let fx = vec![granted("a", 1, 5, 9), granted("b", 1, 5, 10), granted("c", 2, 6, 11)];
    let a = c.step(at(31), [written(3, vec![kept(2)], fx.clone(), None)]);
    let woken = WaitOutcome::GrantedAll { grants: vec![grant("a", 1, 9), grant("b", 1, 10)], waited_ms: 5 };
    let effects = fx.into_iter().map(Action::Effect);
    let want = [Action::Reply(2, Ok(kept(2))), Action::Wake(1, Ok(woken))].into_iter().chain(effects);
    assert_eq!(a, want.collect::<Vec<_>>());
}

#[test]
fn a_caller_that_went_away_gets_its_cancel_written() {
    let mut c = queued_core();
    let a = c.step(at(30), [gone(nth(1), 1, 5, "a")]);
    assert_eq!(a, vec![Action::Batched(1), batch(3, 30, vec![cancel(1, 5, "a")])]);
}

#[test]
fn a_retry_drops_the_unwritten_cancel_of_the_caller_it_replaces() {
    let mut c = queued_core();
    assert_eq!(c.step(at(30), [request(2, keep(2, 1))]).len(), 2, "a write in flight holds the cancel back");
    assert_eq!(c.step(at(31), [gone(nth(1), 1, 5, "a"), acquire(3, nth(2), 1, 5, "a")]), vec![]);
    let a = c.step(at(32), [written(3, vec![kept(2)], vec![], None)]);
    assert_eq!(
        a,
        vec![Action::Reply(2, Ok(kept(2))), Action::Batched(1), batch(4, 32, vec![acquire_cmd(1, 5, "a")])],
        "the retry, without the cancel"
    );
}

#[test]
fn the_cancel_of_a_superseded_caller_is_never_written() {
    let mut c = queued_core();
    // The retry (generation 2) arrives and is queued again; then the first
    // caller goes away: its cancel would end the retry's wait.
    assert_eq!(c.step(at(30), [acquire(3, nth(2), 1, 5, "a")]).len(), 2);
    assert_eq!(c.step(at(31), [written(3, vec![queued()], vec![], None)]), vec![Action::Reply(3, Ok(queued()))]);
    assert_eq!(c.step(at(32), [gone(nth(1), 1, 5, "a")]), vec![], "no cancel from the older caller");
    // The retry's own caller going away does cancel.
    assert_eq!(
        c.step(at(33), [gone(nth(2), 1, 5, "a")]),
        vec![Action::Batched(1), batch(4, 33, vec![cancel(1, 5, "a")])]
    );
}

/// Exactly-once (the simulator's INV-MULTI, seed 48 with 16 clients): the
/// client's first attempt, delayed on a connection it gave up, arrives after
/// its retry. Ordered by arrival it would take the wait over, its connection's
/// cancel would release the grant the retry waits for, and the retry's next
/// attempt would be granted anew. Ordered by attempt, the late first attempt
/// neither takes the wait nor cancels it: the retry's caller is woken.
#[test]
fn a_late_older_attempt_neither_takes_the_wait_nor_cancels_it() {
    let mut c = ready(64);
    let (first, retry) = (Gen { attempt: 1, arrival: 2 }, Gen { attempt: 2, arrival: 1 });
    assert_eq!(c.step(at(20), [acquire(1, retry, 1, 5, "a")]).len(), 2);
    assert_eq!(c.step(at(21), [written(2, vec![queued()], vec![], None)]), vec![Action::Reply(1, Ok(queued()))]);
    assert_eq!(c.step(at(22), [acquire(2, first, 1, 5, "a")]).len(), 2);
    assert_eq!(c.step(at(23), [written(3, vec![queued()], vec![], None)]), vec![Action::Reply(2, Ok(queued()))]);
    assert_eq!(c.step(at(24), [gone(first, 1, 5, "a")]), vec![], "no cancel from the older attempt");
    assert_eq!(c.step(at(30), [request(3, keep(2, 1))]).len(), 2);
    let effect = granted("a", 1, 5, 9);
    let a = c.step(at(31), [written(4, vec![kept(2)], vec![effect.clone()], None)]);
    let woken = WaitOutcome::Granted { grant: grant("a", 1, 9), waited_ms: 5 };
    assert_eq!(a, vec![Action::Reply(3, Ok(kept(2))), Action::Wake(1, Ok(woken)), Action::Effect(effect)]);
}

#[test]
fn a_caller_done_with_its_outcome_cancels_nothing() {
    let mut c = queued_core();
    assert_eq!(c.step(at(30), [done(nth(1), 1, 5)]), vec![]);
}

/// Issue 18 §4: a waiter whose once-per slot was found done when the lock
/// freed is woken with that end, and its caller is answered `SlotDone` (who
/// ran the slot), as a try for a done slot is.
#[test]
fn a_waiter_told_its_slot_is_done_is_woken_and_answered_slot_done() {
    let mut c = queued_core();
    assert_eq!(c.step(at(30), [request(2, keep(2, 1))]).len(), 2);
    let done = SlotCompletion { token: Token(9), identity: "host-a:1".into(), exit_code: 3 };
    let why = WaitEnd::SlotDone(Box::new(done));
    let (lock, lease, req) = (LockName::new("a").unwrap(), LeaseId(1), RequestId(5));
    let effect = Effect::WaitEnded { lock, lease, req, why: why.clone() };
    let a = c.step(at(31), [written(3, vec![kept(2)], vec![effect.clone()], None)]);
    let woken = WaitOutcome::Ended(why.clone());
    assert_eq!(a, vec![Action::Reply(2, Ok(kept(2))), Action::Wake(1, Ok(woken)), Action::Effect(effect)]);
    let answer = crate::driver::ended(why, LeaseId(1));
    let expected = AcquireOutcome::SlotDone { token: Token(9), identity: "host-a:1".into(), exit_code: 3 };
    assert_eq!(answer, expected);
}
