//! Lingering (issue 19 §3, see `core`'s docs): after an entry answers
//! callers who come back at once (a reply other than `Queued`, a granted
//! wait), the next write waits, with nothing in flight, until as many
//! requests are pending or the shell's timer says `LingerOver`; the two
//! clients of a handoff then share one entry instead of two writes in series.

use super::harness::*;
use fencelock_core::{Command, LeaseId, Reply, RequestId, Token};

fn queued() -> Reply {
    Reply::Queued { position: 0 }
}

fn release_cmd(lease: u64, lock: &str, token: u64) -> Command {
    Command::Release { req: RequestId(90 + lease), lease: LeaseId(lease), lock: lock.into(), token: Token(token) }
}

/// A lingering core (one write in flight) where lease 2 holds "a" with token
/// 9 and caller 1 (lease 1, req 5) waits for it; its next write is 3.
fn handoff_ready() -> Core {
    let mut c = core(64);
    c.set_linger(true);
    let mut c = ready_with(c);
    assert_eq!(c.step(at(20), [acquire(1, nth(1), 1, 5, "a")]).len(), 2);
    let a = c.step(at(21), [written(2, vec![queued()], vec![], None)]);
    assert_eq!(a, vec![Action::Reply(1, Ok(queued()))]);
    assert!(!c.lingering(), "a Queued caller sends nothing until its wait ends: nothing to wait for");
    c
}

/// Lease 2's release (caller 2) is written, granting "a" to caller 1: the
/// entry answers two callers who both come back. `deadline`: the engine's next.
fn after_handoff_until(deadline: Option<u64>) -> Core {
    let mut c = handoff_ready();
    let a = c.step(at(30), [request(2, release_cmd(2, "a", 9))]);
    assert_eq!(a, vec![Action::Batched(1), batch(3, 30, vec![release_cmd(2, "a", 9)])]);
    let a = c.step(at(31), [written(3, vec![Reply::Released], vec![granted("a", 1, 5, 10)], deadline)]);
    assert_eq!(a.len(), 3, "the release's reply, the waiter's wake and the effect: {a:?}");
    c
}

fn after_handoff() -> Core {
    after_handoff_until(None)
}

/// The first of the two answered callers to come back is held; the second
/// joins it in one entry.
#[test]
fn the_two_callers_of_a_handoff_share_one_entry() {
    let mut c = after_handoff();
    assert_eq!(c.step(at(32), [acquire(2, nth(2), 2, 6, "a")]), vec![], "held for the other answered caller");
    assert!(c.lingering());
    let a = c.step(at(32), [request(1, release_cmd(1, "a", 10))]);
    assert_eq!(a, vec![Action::Batched(2), batch(4, 32, vec![acquire_cmd(2, 6, "a"), release_cmd(1, "a", 10)])]);
    assert!(!c.lingering());
}

/// The timer ends the wait: what is pending is written then.
#[test]
fn linger_over_writes_what_is_pending() {
    let mut c = after_handoff();
    assert_eq!(c.step(at(32), [acquire(2, nth(2), 2, 6, "a")]), vec![]);
    let a = c.step(at(33), [Event::LingerOver]);
    assert_eq!(a, vec![Action::Batched(1), batch(4, 33, vec![acquire_cmd(2, 6, "a")])]);
    assert!(!c.lingering());
    assert_eq!(c.step(at(34), [request(1, release_cmd(1, "a", 10))]), vec![], "one write in flight: it waits");
}

/// A due tick is written at once, lingering or not.
#[test]
fn a_due_tick_does_not_wait() {
    let mut c = after_handoff_until(Some(40));
    assert_eq!(c.step(at(32), [acquire(2, nth(2), 2, 6, "a")]), vec![]);
    let a = c.step(at(40), [Event::Timer]);
    assert_eq!(a, vec![Action::Batched(1), batch(4, 40, vec![acquire_cmd(2, 6, "a")])]);
}

/// Off (the default), the first request is written at once, alone.
#[test]
fn without_linger_the_first_request_goes_alone() {
    let mut c = ready(64);
    assert_eq!(c.step(at(20), [acquire(1, nth(1), 1, 5, "a")]).len(), 2);
    assert_eq!(c.step(at(21), [written(2, vec![queued()], vec![], None)]).len(), 1);
    assert_eq!(c.step(at(30), [request(2, release_cmd(2, "a", 9))]).len(), 2);
    assert_eq!(c.step(at(31), [written(3, vec![Reply::Released], vec![granted("a", 1, 5, 10)], None)]).len(), 3);
    let a = c.step(at(32), [acquire(2, nth(2), 2, 6, "a")]);
    assert_eq!(a, vec![Action::Batched(1), batch(4, 32, vec![acquire_cmd(2, 6, "a")])]);
    assert!(!c.lingering());
}
