//! Atomic multi-acquires (issue 18, part 3): all locks or none, in one step;
//! a waiting multi-acquire sits in every one of its queues at once and is
//! granted when it heads all of them; retries, cancels, timeouts and lease
//! ends take it out of every queue.
//!
//! Invariants (see the crate docs): INV-18 never a partial multi-lock (all of
//! its grants or none, made in one step, one token each, consecutive); INV-3
//! and INV-16 FIFO per lock (a blocked multi-acquire at the head holds back
//! the waiters behind it); INV-6 retries; INV-9 invalid multi-acquires change
//! nothing; INV-15 a shared multi-acquire shares with readers.

use super::harness::*;
use super::*;

/// A multi-acquire of `locks` (the first is `lock`, the rest `also`).
fn multi(req: u64, lease: u64, locks: &[&str], wait_ms: u64) -> Command {
    let mut c = acq(req, lease, locks[0], wait_ms, 0);
    if let Command::Acquire(a) = &mut c {
        a.also = locks[1..].iter().map(|s| s.to_string()).collect();
    }
    c
}

fn shared(mut c: Command) -> Command {
    if let Command::Acquire(a) = &mut c {
        a.mode = Mode::Shared;
    }
    c
}

/// The leases queued on `lock` at `now`, first in line first.
fn queued(e: &Engine, now: Millis, lock: &str) -> Vec<u64> {
    let waiters = e.lock_info(now, lock).map(|i| i.waiters).unwrap_or_default();
    waiters.iter().map(|w| w.lease.0).collect()
}

fn holders(e: &Engine, now: Millis, lock: &str) -> Vec<(u64, u64)> {
    let info = e.lock_info(now, lock).map(|i| i.holders).unwrap_or_default();
    info.iter().map(|h| (h.lease.0, h.token.0)).collect()
}

fn all(grants: &[(&str, u64, u64)]) -> Reply {
    Reply::AcquiredAll(grants.iter().map(|&(lock, lease, token)| grant(lock, lease, token)).collect())
}

#[test]
fn inv18_a_try_takes_every_lock_or_none() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 2, "b", 0, 0));
    let (reply, fx) = one(&mut e, 0, multi(2, 1, &["a", "b", "c"], 0));
    assert_eq!((reply, fx), (busy(Some(grant("b", 2, 1)), None, 0), vec![]), "Busy names the first lock not free");
    assert_eq!((e.lock_info(0, "a"), e.lock_info(0, "c")), (None, None), "INV-18: nothing was taken");
    one(&mut e, 5, rel(3, 2, "b", 1));
    let (reply, fx) = one(&mut e, 5, multi(4, 1, &["a", "b", "c"], 0));
    assert_eq!(reply, all(&[("a", 1, 2), ("b", 1, 3), ("c", 1, 4)]), "one token per lock, in the order asked");
    let want = [("a", 2), ("b", 3), ("c", 4)].iter().map(|&(n, tk)| granted(grant(n, 1, tk), 4, false, 0));
    assert_eq!(fx, want.collect::<Vec<_>>());
}

#[test]
fn inv18_a_waiting_multi_acquire_is_queued_on_every_lock_and_granted_when_all_are_free() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 2, "b", 0, 0));
    assert_eq!(one(&mut e, 0, multi(2, 1, &["a", "b"], 500)), (Reply::Queued { position: 0 }, vec![]));
    assert_eq!((queued(&e, 0, "a"), queued(&e, 0, "b")), (vec![1], vec![1]));
    assert!(holders(&e, 0, "a").is_empty(), "INV-18: free a is not taken alone");
    e.check_consistency().unwrap();
    // INV-16: a free lock with a queued multi-acquire is not free to a newcomer.
    assert_eq!(one(&mut e, 0, acq(3, 3, "a", 0, 0)).0, busy(None, None, 1));
    let fx = vec![
        released(grant("b", 2, 1), 10, ReleaseCause::Released),
        granted(grant("a", 1, 2), 2, true, 10),
        granted(grant("b", 1, 3), 2, true, 10),
    ];
    assert_eq!(one(&mut e, 10, rel(4, 2, "b", 1)), (Reply::Released, fx));
    assert_eq!(one(&mut e, 10, multi(2, 1, &["a", "b"], 500)).0, all(&[("a", 1, 2), ("b", 1, 3)]), "INV-6");
}

#[test]
fn inv18_crossed_multi_acquires_do_not_deadlock_and_are_granted_in_arrival_order() {
    let mut e = setup(4);
    batch(&mut e, 0, vec![acq(1, 3, "a", 0, 0), acq(2, 4, "b", 0, 0)]);
    assert_eq!(one(&mut e, 0, multi(10, 1, &["a", "b"], 900)).0, Reply::Queued { position: 0 });
    assert_eq!(one(&mut e, 0, multi(20, 2, &["b", "a"], 900)).0, Reply::Queued { position: 1 });
    assert_eq!(one(&mut e, 10, rel(3, 3, "a", 1)).1, vec![released(grant("a", 3, 1), 10, ReleaseCause::Released)]);
    assert!(holders(&e, 10, "a").is_empty(), "INV-18: lease 1 does not take a while b is held");
    let fx = vec![
        released(grant("b", 4, 2), 20, ReleaseCause::Released),
        granted(grant("a", 1, 3), 10, true, 20),
        granted(grant("b", 1, 4), 10, true, 20),
    ];
    assert_eq!(one(&mut e, 20, rel(4, 4, "b", 2)).1, fx, "the first to arrive is granted first");
    one(&mut e, 30, rel(11, 1, "a", 3));
    let fx = vec![
        released(grant("b", 1, 4), 20, ReleaseCause::Released),
        granted(grant("b", 2, 5), 20, true, 40),
        granted(grant("a", 2, 6), 20, true, 40),
    ];
    assert_eq!(one(&mut e, 40, rel(12, 1, "b", 4)).1, fx, "then the second, in its own order");
}

#[test]
fn inv16_a_single_waiter_behind_a_blocked_multi_acquire_waits() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 3, "b", 0, 0));
    one(&mut e, 0, multi(2, 1, &["a", "b"], 500));
    assert_eq!(one(&mut e, 0, acq(3, 2, "a", 900, 0)), (Reply::Queued { position: 1 }, vec![]));
    assert!(holders(&e, 100, "a").is_empty(), "FIFO: a stays free for the multi-acquire at its head");
    // The multi-acquire times out: it leaves both queues, and the waiter behind it gets a.
    let fx = vec![
        wait_ended("a", 1, 2, WaitEnd::TimedOut),
        wait_ended("b", 1, 2, WaitEnd::TimedOut),
        granted(grant("a", 2, 2), 3, true, 500),
    ];
    assert_eq!(tick(&mut e, 500).effects, fx);
    assert!(queued(&e, 500, "b").is_empty());
    assert_eq!(one(&mut e, 500, multi(2, 1, &["a", "b"], 500)).0, busy(Some(grant("a", 2, 2)), None, 0), "INV-6");
    e.check_consistency().unwrap();
}

#[test]
fn inv18_a_cancel_by_any_of_its_locks_leaves_every_queue_and_wakes_those_behind() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 3, "a", 0, 0));
    one(&mut e, 0, multi(2, 1, &["a", "b"], 500));
    one(&mut e, 0, acq(3, 2, "b", 500, 0));
    let fx = vec![
        wait_ended("a", 1, 2, WaitEnd::Cancelled),
        wait_ended("b", 1, 2, WaitEnd::Cancelled),
        granted(grant("b", 2, 2), 3, true, 10),
    ];
    assert_eq!(one(&mut e, 10, cancel(2, 1, "b")), (Reply::Cancelled { released: false }, fx));
    assert_eq!((queued(&e, 10, "a").len(), holders(&e, 10, "a")), (0, vec![(3, 1)]));
}

#[test]
fn inv18_a_lease_that_expires_leaves_every_queue() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 3, "a", 0, 0));
    one(&mut e, 0, multi(2, 1, &["a", "b"], 2000));
    one(&mut e, 0, acq(3, 2, "b", 2000, 0));
    batch(&mut e, 900, vec![keep(4, 2), keep(5, 3)]);
    let fx = vec![
        expired(1),
        wait_ended("a", 1, 2, WaitEnd::LeaseEnded),
        wait_ended("b", 1, 2, WaitEnd::LeaseEnded),
        granted(grant("b", 2, 2), 3, true, 1000),
    ];
    assert_eq!(tick(&mut e, 1000).effects, fx);
    assert!(queued(&e, 1000, "a").is_empty());
    e.check_consistency().unwrap();
}

#[test]
fn inv6_a_granted_multi_acquire_answers_retries_and_a_cancel_releases_every_grant() {
    let mut e = setup(1);
    assert_eq!(one(&mut e, 0, multi(1, 1, &["a", "b"], 0)).0, all(&[("a", 1, 1), ("b", 1, 2)]));
    assert_eq!(one(&mut e, 5, multi(1, 1, &["a", "b"], 0)), (all(&[("a", 1, 1), ("b", 1, 2)]), vec![]));
    one(&mut e, 10, rel(2, 1, "b", 2));
    assert_eq!(one(&mut e, 10, multi(1, 1, &["a", "b"], 0)).0, all(&[("a", 1, 1), ("b", 1, 2)]), "recorded");
    assert_eq!(holders(&e, 10, "a"), vec![(1, 1)], "after the grant, each grant ends on its own");
    // A cancel that names the lock already released still releases the rest.
    let fx = vec![released(grant("a", 1, 1), 20, ReleaseCause::Cancelled)];
    assert_eq!(one(&mut e, 20, cancel(1, 1, "b")), (Reply::Cancelled { released: true }, fx));
    let mut e = setup(1);
    one(&mut e, 0, multi(1, 1, &["a", "b", "c"], 0));
    let fx = ["a", "b", "c"].iter().zip(1..).map(|(n, tk)| released(grant(n, 1, tk), 0, ReleaseCause::Cancelled));
    assert_eq!(one(&mut e, 0, cancel(1, 1, "a")), (Reply::Cancelled { released: true }, fx.collect()));
    assert_eq!(e.stats().held_locks, 0);
}

#[test]
fn inv15_a_shared_multi_acquire_shares_with_readers_and_does_not_barge() {
    let mut e = setup(5);
    batch(&mut e, 0, vec![shared(acq(1, 2, "a", 0, 0)), shared(acq(2, 3, "b", 0, 0))]);
    assert_eq!(one(&mut e, 0, shared(multi(3, 1, &["a", "b"], 0))).0, all(&[("a", 1, 3), ("b", 1, 4)]));
    assert_eq!(one(&mut e, 0, multi(4, 4, &["b", "a"], 500)).0, Reply::Queued { position: 0 });
    let busy_b = Reply::Busy(Busy { holder: Some(grant("b", 3, 2)), holders: 2, reopens_in_ms: None, waiters: 1 });
    assert_eq!(one(&mut e, 0, shared(multi(5, 5, &["b", "a"], 0))).0, busy_b, "INV-16: no barging past a writer");
}

#[test]
fn inv9_invalid_multi_acquires_are_rejected_and_change_nothing() {
    let mut e = setup(1);
    let twice = EngineError::InvalidLocks("a lock is named twice".into());
    assert_rejected(&mut e, 0, multi(1, 1, &["a", "b", "a"], 0), twice);
    let names: Vec<String> = (0..17).map(|i| format!("l{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let many = EngineError::InvalidLocks("17 locks (a multi-acquire names 2 to 16)".into());
    assert_rejected(&mut e, 0, multi(1, 1, &names, 0), many);
    let not_rw = "a multi-acquire takes read-write locks only: no permits, no weight, no once-per slot";
    let mut sem = multi(1, 1, &["a", "b"], 0);
    let mut once = sem.clone();
    if let (Command::Acquire(s), Command::Acquire(o)) = (&mut sem, &mut once) {
        (s.permits, o.once_per) = (3, "today".into());
    }
    assert_rejected(&mut e, 0, sem, EngineError::InvalidLocks(not_rw.into()));
    assert_rejected(&mut e, 0, once, EngineError::InvalidLocks(not_rw.into()));
    let mut bad = multi(1, 1, &["a", ""], 0);
    assert!(matches!(bad.validate(), Err(EngineError::InvalidName(_))));
    // A lock that is a semaphore: it depends on state, so only the engine knows.
    let mut s = acq(2, 1, "b", 0, 0);
    if let (Command::Acquire(a), Command::Acquire(b)) = (&mut s, &mut bad) {
        (a.permits, b.also) = (3, vec!["b".into()]);
    }
    one(&mut e, 0, s);
    assert_rejected(&mut e, 0, bad, EngineError::PermitsMismatch { lock_has: 3, asked: 0 });
}

#[test]
fn old_entries_and_snapshots_without_multi_acquires_still_load() {
    let entry = r#"{"Acquire":{"req":1,"lease":2,"lock":"a","wait_ms":0,"lock_delay_ms":0}}"#;
    let cmd: Command = serde_json::from_str(entry).unwrap();
    assert_eq!(cmd, acq(1, 2, "a", 0, 0));
    assert_eq!(serde_json::to_string(&cmd).unwrap(), entry, "a single acquire is written as before");
    let mut e = setup(2);
    batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(2, 2, "a", 500, 0)]);
    let json = serde_json::to_string(&e).unwrap();
    assert!(!json.contains("\"all\"") && !json.contains("also"), "{json}");
    let back: Engine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);
    // And a snapshot with a queued multi-acquire goes back and forth.
    one(&mut e, 0, multi(3, 2, &["b", "a"], 500));
    let back: Engine = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
    assert_eq!(back, e);
    back.check_consistency().unwrap();
}
