//! Acquire, Release and CancelWait.

use super::harness::*;
use super::*;
use EngineError::*;
use ReleaseCause::*;

#[test]
fn inv2_acquire_of_a_free_lock_grants_at_once_with_token_1() {
    let mut e = setup(1);
    let g = grant("a", 1, 1);
    let o = batch(&mut e, 5, vec![acq(1, 1, "a", 0, 0)]);
    assert_eq!(o, out(vec![Reply::Acquired(g.clone())], vec![granted(g, 1, false, 0)], Some(1000)));
    assert_eq!(e.stats(), Stats { leases: 1, held_locks: 1, waiters: 0, tokens_issued: 1, token_counter: 1 });
}

#[test]
fn inv9_acquire_validates_request_name_wait_delay_then_lease() {
    let mut e = setup(1);
    let (w, d) = (MAX_WAIT_MS, MAX_LOCK_DELAY_MS);
    assert_rejected(&mut e, 0, acq(0, 9, "", w + 1, d + 1), InvalidRequestId);
    assert_rejected(&mut e, 0, acq(1, 9, "", w + 1, d + 1), InvalidName(NameError::Empty));
    let control = InvalidName(NameError::ControlChar { at: 1 });
    assert_rejected(&mut e, 0, acq(1, 9, "a\n", w + 1, d + 1), control);
    let wait = InvalidWait { got_ms: w + 1, max_ms: w };
    assert_rejected(&mut e, 0, acq(1, 9, "a", w + 1, d + 1), wait);
    let delay = InvalidLockDelay { got_ms: d + 1, max_ms: d };
    assert_rejected(&mut e, 0, acq(1, 9, "a", w, d + 1), delay);
    assert_rejected(&mut e, 0, acq(1, 9, "a", w, d), LeaseNotFound(l(9)));
    assert_eq!(one(&mut e, 0, acq(1, 1, "a", w, d)).0, Reply::Acquired(grant("a", 1, 1)));
}

#[test]
fn inv1_try_acquire_of_a_held_lock_is_busy_even_for_its_holder() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_eq!(one(&mut e, 10, acq(2, 2, "a", 500, 0)).0, Reply::Queued { position: 0 });
    let o = batch(&mut e, 20, vec![acq(3, 3, "a", 0, 0), acq(4, 1, "a", 0, 0)]);
    let b = busy(Some(grant("a", 1, 1)), None, 1);
    assert_eq!(o, out(vec![b.clone(), b], vec![], Some(510)));
    assert_eq!(e.stats().held_locks, 1);
}

#[test]
fn inv3_queued_acquires_are_granted_in_fifo_order() {
    let mut e = setup(4);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    let o = batch(&mut e, 10, vec![acq(2, 3, "a", 900, 0), acq(3, 2, "a", 900, 0), acq(4, 4, "a", 900, 0)]);
    let queued = (0..3).map(|position| Reply::Queued { position }).collect::<Vec<_>>();
    assert_eq!(o, out(queued, vec![], Some(910)));
    let fx = vec![released(grant("a", 1, 1), 100, Released), granted(grant("a", 3, 2), 2, true, 90)];
    assert_eq!(batch(&mut e, 100, vec![rel(5, 1, "a", 1)]), out(vec![Reply::Released], fx, Some(910)));
    let fx = vec![released(grant("a", 3, 2), 100, Released), granted(grant("a", 2, 3), 3, true, 190)];
    assert_eq!(batch(&mut e, 200, vec![rel(6, 3, "a", 2)]), out(vec![Reply::Released], fx, Some(910)));
    let fx = vec![released(grant("a", 2, 3), 100, Released), granted(grant("a", 4, 4), 4, true, 290)];
    assert_eq!(batch(&mut e, 300, vec![rel(7, 2, "a", 3)]), out(vec![Reply::Released], fx, Some(1000)));
}

#[test]
fn inv1_a_lease_may_queue_for_a_lock_it_holds_and_gets_it_after_release() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_eq!(one(&mut e, 10, acq(2, 1, "a", 500, 0)).0, Reply::Queued { position: 0 });
    assert_eq!(e.stats().held_locks, 1);
    let fx = vec![released(grant("a", 1, 1), 20, Released), granted(grant("a", 1, 2), 2, true, 10)];
    assert_eq!(batch(&mut e, 20, vec![rel(3, 1, "a", 1)]), out(vec![Reply::Released], fx, Some(1000)));
}

#[test]
fn queued_wait_times_out_at_its_deadline() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_eq!(batch(&mut e, 10, vec![acq(2, 2, "a", 300, 0)]).next_deadline, Some(310));
    assert_eq!(tick(&mut e, 309), out(vec![], vec![], Some(310)));
    let fx = vec![wait_ended("a", 2, 2, WaitEnd::TimedOut)];
    assert_eq!(tick(&mut e, 310), out(vec![], fx, Some(1000)));
    assert_eq!(e.lock_info(310, "a").unwrap().waiters, vec![]);
}

#[test]
fn inv6_acquire_retry_while_queued_returns_the_current_position() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    batch(&mut e, 10, vec![acq(2, 2, "a", 500, 0), acq(3, 3, "a", 500, 0)]);
    let fx = vec![wait_ended("a", 2, 2, WaitEnd::Cancelled)];
    assert_eq!(one(&mut e, 20, cancel(2, 2, "a")), (Reply::Cancelled { released: false }, fx));
    // Not queued again, and its wait deadline (510) is unchanged.
    let o = batch(&mut e, 30, vec![acq(3, 3, "a", 900, 0)]);
    assert_eq!(o, out(vec![Reply::Queued { position: 0 }], vec![], Some(510)));
    assert_eq!(e.stats().waiters, 1);
}

#[test]
fn inv6_acquire_retry_after_a_grant_returns_the_same_grant_and_grants_nothing() {
    let mut e = setup(2);
    let o = batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(1, 1, "a", 0, 0)]);
    let g = grant("a", 1, 1);
    let replies = vec![Reply::Acquired(g.clone()), Reply::Acquired(g.clone())];
    assert_eq!(o, out(replies, vec![granted(g, 1, false, 0)], Some(1000)));
    // Queued, then granted, then released: the retry still gets that grant.
    one(&mut e, 10, acq(2, 2, "a", 500, 0));
    one(&mut e, 20, rel(3, 1, "a", 1));
    assert_eq!(one(&mut e, 30, acq(2, 2, "a", 500, 0)), (Reply::Acquired(grant("a", 2, 2)), vec![]));
    assert_eq!(one(&mut e, 40, rel(4, 2, "a", 2)).0, Reply::Released);
    assert_eq!(one(&mut e, 50, acq(2, 2, "a", 500, 0)), (Reply::Acquired(grant("a", 2, 2)), vec![]));
    assert_eq!(e.stats(), Stats { leases: 2, held_locks: 0, waiters: 0, tokens_issued: 2, token_counter: 2 });
}

#[test]
fn inv6_try_acquire_retry_after_busy_returns_the_same_busy() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    let b = busy(Some(grant("a", 1, 1)), None, 0);
    assert_eq!(one(&mut e, 10, acq(2, 2, "a", 0, 0)).0, b);
    one(&mut e, 20, rel(3, 1, "a", 1));
    assert_eq!(one(&mut e, 30, acq(2, 2, "a", 0, 0)), (b, vec![]));
    assert_eq!(e.lock_info(30, "a"), None);
}

#[test]
fn inv6_acquire_retry_after_its_wait_timed_out_is_busy_with_the_current_state() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 10, acq(2, 2, "a", 100, 0));
    assert_eq!(tick(&mut e, 110).effects, vec![wait_ended("a", 2, 2, WaitEnd::TimedOut)]);
    assert_eq!(one(&mut e, 120, acq(3, 3, "a", 500, 0)).0, Reply::Queued { position: 0 });
    let o = batch(&mut e, 130, vec![acq(2, 2, "a", 100, 0)]);
    assert_eq!(o, out(vec![busy(Some(grant("a", 1, 1)), None, 1)], vec![], Some(620)));
    assert_eq!(e.stats().waiters, 1);
}

#[test]
fn inv6_dedup_memory_keeps_the_last_requests_of_a_lease() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    let n = DEDUP_PER_LEASE as u64 + 1;
    let o = batch(&mut e, 0, (1..=n).map(|i| acq(i, 2, "a", 0, 0)).collect());
    assert!(o.replies.iter().all(|r| matches!(r, Reply::Busy(_))));
    assert_eq!(one(&mut e, 10, rel(1000, 1, "a", 1)).0, Reply::Released);
    // Request 2 is still remembered; request 1 was forgotten, so it is fresh.
    assert_eq!(one(&mut e, 20, acq(2, 2, "a", 0, 0)).0, busy(Some(grant("a", 1, 1)), None, 0));
    assert_eq!(one(&mut e, 20, acq(1, 2, "a", 0, 0)).0, Reply::Acquired(grant("a", 2, 2)));
}

#[test]
fn inv5_release_of_a_wrong_grant_changes_nothing() {
    let mut e = setup(2);
    batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(2, 2, "b", 0, 0)]);
    tick(&mut e, 10);
    let before = e.clone();
    let wrong = [
        rel(3, 1, "a", 2), // wrong token
        rel(4, 2, "a", 1), // wrong lease
        rel(5, 1, "b", 1), // wrong lock
        rel(6, 1, "c", 1), // no such lock
        rel(7, 9, "a", 1), // unknown lease
    ];
    for cmd in wrong {
        assert_eq!(one(&mut e, 10, cmd), (Reply::NotHolder, vec![]));
        assert_eq!(e, before, "INV-5");
    }
}

#[test]
fn inv9_release_validates_request_name_then_token() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_rejected(&mut e, 0, rel(0, 1, "", 0), InvalidRequestId);
    assert_rejected(&mut e, 0, rel(2, 1, "", 0), InvalidName(NameError::Empty));
    assert_rejected(&mut e, 0, rel(2, 1, "a", 0), InvalidToken);
    assert_rejected(&mut e, 0, rel(2, 9, "a", 0), InvalidToken);
}

#[test]
fn release_after_the_lease_expired_is_not_holder() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    tick(&mut e, 1000);
    assert_eq!(one(&mut e, 1000, rel(2, 1, "a", 1)), (Reply::NotHolder, vec![]));
}

#[test]
fn inv6_release_retry_replies_released_again_and_changes_nothing() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 10, acq(2, 2, "a", 500, 0));
    assert_eq!(one(&mut e, 20, rel(3, 1, "a", 1)).0, Reply::Released);
    tick(&mut e, 30);
    let before = e.clone();
    assert_eq!(one(&mut e, 30, rel(3, 1, "a", 1)), (Reply::Released, vec![]));
    assert_eq!(e, before);
    assert_eq!(e.check(30, "a", t(2)), Check::Current);
}

#[test]
fn cancel_wait_removes_a_queued_request() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    batch(&mut e, 10, vec![acq(2, 2, "a", 500, 0), acq(3, 3, "a", 500, 0)]);
    let o = batch(&mut e, 20, vec![cancel(2, 2, "a")]);
    let fx = vec![wait_ended("a", 2, 2, WaitEnd::Cancelled)];
    assert_eq!(o, out(vec![Reply::Cancelled { released: false }], fx, Some(510)));
    assert_eq!(one(&mut e, 30, acq(3, 3, "a", 500, 0)).0, Reply::Queued { position: 0 });
}

#[test]
fn cancel_wait_releases_a_grant_that_is_still_held() {
    let mut e = setup(3);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    batch(&mut e, 10, vec![acq(2, 2, "a", 500, 0), acq(3, 3, "a", 500, 0)]);
    let fx = one(&mut e, 20, rel(4, 1, "a", 1)).1;
    assert_eq!(fx[1], granted(grant("a", 2, 2), 2, true, 10));
    let o = batch(&mut e, 30, vec![cancel(2, 2, "a")]);
    let fx = vec![released(grant("a", 2, 2), 10, Cancelled), granted(grant("a", 3, 3), 3, true, 20)];
    assert_eq!(o, out(vec![Reply::Cancelled { released: true }], fx, Some(1000)));
}

#[test]
fn cancel_wait_of_nothing_cancels_nothing_and_forgets_the_request() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 10, rel(2, 1, "a", 1));
    let nothing = (Reply::Cancelled { released: false }, vec![]);
    assert_eq!(one(&mut e, 20, cancel(1, 1, "a")), nothing);
    assert_eq!(one(&mut e, 20, cancel(5, 1, "a")), nothing);
    assert_eq!(one(&mut e, 20, cancel(1, 9, "a")), nothing);
    // Request 1 was forgotten: acquiring with it again is a fresh attempt.
    let g = grant("a", 1, 2);
    let o = batch(&mut e, 30, vec![acq(1, 1, "a", 0, 0)]);
    assert_eq!(o, out(vec![Reply::Acquired(g.clone())], vec![granted(g, 1, false, 0)], Some(1000)));
}

#[test]
fn cancel_wait_names_the_lock_of_the_request() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 0, acq(2, 2, "a", 500, 0));
    assert_eq!(one(&mut e, 10, cancel(2, 2, "b")), (Reply::Cancelled { released: false }, vec![]));
    assert_eq!(one(&mut e, 10, acq(2, 2, "a", 500, 0)).0, Reply::Queued { position: 0 });
}

#[test]
fn inv9_cancel_wait_validates_request_and_name() {
    let mut e = setup(1);
    assert_rejected(&mut e, 0, cancel(0, 1, "a"), InvalidRequestId);
    assert_rejected(&mut e, 0, cancel(1, 1, ""), InvalidName(NameError::Empty));
}

#[test]
fn inv2_tokens_strictly_increase_across_locks() {
    let mut e = setup(2);
    let mut fx = batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(2, 2, "b", 0, 0), acq(3, 1, "c", 0, 0)]).effects;
    fx.extend(batch(&mut e, 10, vec![rel(4, 2, "b", 2), acq(5, 1, "b", 0, 0)]).effects);
    let tokens: Vec<u64> = fx
        .iter()
        .filter_map(|f| match f {
            Effect::Granted { grant, .. } => Some(grant.token.0),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, vec![1, 2, 3, 4]);
}

/// A grant or a wait on a lock that has an entry keeps the lock map's name,
/// not the copy its command brought (issue 19 §4: one string per lock): the
/// hold, the remembered grant and the wait of a second lease all point at it.
#[test]
fn a_second_lease_shares_the_lock_maps_name() {
    let mut e = setup(3);
    batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(1, 2, "a", 1_000, 0)]);
    let key = e.locks.get_key_value("a").map(|(k, _)| k.clone()).expect("a is held");
    let same = |n: &LockName| std::ptr::eq(n.as_str(), key.as_str());
    assert!(e.leases[&LeaseId(2)].waits.values().all(same));
    assert_eq!(one(&mut e, 10, rel(2, 1, "a", 1)).0, Reply::Released);
    let two = &e.leases[&LeaseId(2)];
    assert_eq!(two.holds.values().map(same).collect::<Vec<_>>(), [true]);
    let mut remembered = two.dedup.clone();
    assert_eq!(remembered.names_mut().map(|n| same(n)).collect::<Vec<_>>(), [true]);
}
