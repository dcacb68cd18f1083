//! GrantLease, KeepAlive, Revoke and lease expiry.

use super::harness::*;
use super::*;
use EngineError::*;
use ReleaseCause::*;

#[test]
fn grant_lease_starts_a_lease_that_ends_at_now_plus_ttl() {
    let mut e = Engine::new();
    let o = batch(&mut e, 50, vec![new_lease(1, 200)]);
    assert_eq!(o, out(vec![Reply::LeaseGranted { lease: l(1), ttl_ms: 200 }], vec![], Some(250)));
    let o = batch(&mut e, 60, vec![new_lease(2, MIN_TTL_MS)]);
    assert_eq!(o, out(vec![Reply::LeaseGranted { lease: l(2), ttl_ms: 100 }], vec![], Some(160)));
    let info = e.lease_info(60, l(1)).unwrap();
    assert_eq!(info, LeaseInfo { lease: l(1), owner: None, ttl_ms: 200, ttl_left_ms: 190, locks: vec![] });
}

#[test]
fn inv9_grant_lease_rejects_a_bad_ttl_or_request_id() {
    let mut e = Engine::new();
    for ttl in [0, MIN_TTL_MS - 1, MAX_TTL_MS + 1, u64::MAX] {
        let err = InvalidTtl { got_ms: ttl, min_ms: MIN_TTL_MS, max_ms: MAX_TTL_MS };
        assert_rejected(&mut e, 0, new_lease(1, ttl), err);
    }
    assert_rejected(&mut e, 0, new_lease(0, 500), InvalidRequestId);
    // The request id is checked first.
    assert_rejected(&mut e, 0, new_lease(0, 5), InvalidRequestId);
    let (reply, _) = one(&mut e, 0, new_lease(1, MAX_TTL_MS));
    assert_eq!(reply, Reply::LeaseGranted { lease: l(1), ttl_ms: MAX_TTL_MS });
}

#[test]
fn inv6_grant_lease_retry_returns_the_same_lease_while_it_lives() {
    let mut e = setup(1); // lease 1 from request 101
    let again = Reply::LeaseGranted { lease: l(1), ttl_ms: TTL };
    let o = batch(&mut e, 10, vec![new_lease(101, TTL), new_lease(101, 5000)]);
    assert_eq!(o, out(vec![again.clone(), again], vec![], Some(1000)));
    assert_eq!(e.stats().leases, 1);
    // Once the lease has ended its request id is forgotten: a retry is a new lease.
    tick(&mut e, 1000);
    let (reply, _) = one(&mut e, 1000, new_lease(101, 300));
    assert_eq!(reply, Reply::LeaseGranted { lease: l(2), ttl_ms: 300 });
}

#[test]
fn inv8_keep_alive_moves_the_deadline_to_now_plus_ttl() {
    let mut e = setup(1);
    let kept = Reply::LeaseKept { lease: l(1), ttl_ms: TTL };
    assert_eq!(batch(&mut e, 600, vec![keep(1, 1)]), out(vec![kept], vec![], Some(1600)));
    assert_eq!(tick(&mut e, 1000), out(vec![], vec![], Some(1600)));
    assert_eq!(tick(&mut e, 1599), out(vec![], vec![], Some(1600)));
    assert_eq!(tick(&mut e, 1600), out(vec![], vec![expired(1)], None));
}

#[test]
fn inv8_lease_expires_exactly_at_its_deadline() {
    let mut e = setup(1);
    assert_eq!(tick(&mut e, 999), out(vec![], vec![], Some(1000)));
    assert_eq!(e.lease_info(999, l(1)).map(|i| i.ttl_left_ms), Some(1));
    assert_eq!(tick(&mut e, 1000), out(vec![], vec![expired(1)], None));
    assert_eq!(e.lease_info(1000, l(1)), None);
    assert_rejected(&mut e, 1000, keep(1, 1), LeaseNotFound(l(1)));
}

#[test]
fn inv9_keep_alive_rejects_unknown_lease_and_request_id_0() {
    let mut e = setup(1);
    assert_rejected(&mut e, 10, keep(1, 9), LeaseNotFound(l(9)));
    assert_rejected(&mut e, 10, keep(0, 1), InvalidRequestId);
    assert_rejected(&mut e, 10, keep(0, 9), InvalidRequestId);
}

#[test]
fn inv6_keep_alive_retry_replies_again_without_moving_the_deadline() {
    let mut e = setup(1);
    let kept = Reply::LeaseKept { lease: l(1), ttl_ms: TTL };
    assert_eq!(batch(&mut e, 600, vec![keep(7, 1)]), out(vec![kept.clone()], vec![], Some(1600)));
    assert_eq!(batch(&mut e, 900, vec![keep(7, 1)]), out(vec![kept.clone()], vec![], Some(1600)));
    assert_eq!(batch(&mut e, 900, vec![keep(8, 1)]), out(vec![kept], vec![], Some(1900)));
}

/// A live lease's keep-alives are remembered apart from its other outcomes,
/// the last [`KEEPALIVES_PER_LEASE`] of them: a retry among those replies
/// again without moving the deadline (INV-6), an older one is applied again
/// (same answer, deadline from now); and they push none of the lease's other
/// outcomes out: an acquire's retry after 300 keep-alives still gets its grant.
#[test]
fn inv6_a_lease_remembers_its_last_keep_alives_apart_from_its_other_outcomes() {
    let mut e = setup(1);
    assert_eq!(one(&mut e, 1, acq(1, 1, "a", 0, 0)).0, Reply::Acquired(grant("a", 1, 1)));
    for (i, req) in (1_000..1_300).enumerate() {
        let now = 2 + i as u64;
        assert_eq!(one(&mut e, now, keep(req, 1)).0, Reply::LeaseKept { lease: l(1), ttl_ms: TTL });
    }
    let lease = &e.leases[&l(1)];
    assert_eq!((lease.dedup.len(), lease.kept.as_ref().map(|k| k.len())), (1, Some(KEEPALIVES_PER_LEASE)));
    let kept = Reply::LeaseKept { lease: l(1), ttl_ms: TTL };
    // The last keep-alive was at 301 (deadline 1301); its retry at 400 moves nothing.
    assert_eq!(batch(&mut e, 400, vec![keep(1_299, 1)]), out(vec![kept.clone()], vec![], Some(1301)));
    let oldest_kept = 1_300 - KEEPALIVES_PER_LEASE as u64;
    assert_eq!(batch(&mut e, 400, vec![keep(oldest_kept, 1)]), out(vec![kept.clone()], vec![], Some(1301)));
    // One older than that is forgotten: applied again, the deadline from now.
    assert_eq!(batch(&mut e, 410, vec![keep(oldest_kept - 1, 1)]), out(vec![kept], vec![], Some(1410)));
    assert_eq!(
        one(&mut e, 420, acq(1, 1, "a", 0, 0)).0,
        Reply::Acquired(grant("a", 1, 1)),
        "the acquire is remembered"
    );
}

#[test]
fn inv7_revoke_releases_without_lock_delay_and_grants_the_next_waiter() {
    let mut e = setup(2);
    assert_eq!(one(&mut e, 0, acq(1, 1, "a", 0, 500)).0, Reply::Acquired(grant("a", 1, 1)));
    assert_eq!(one(&mut e, 10, acq(2, 2, "a", 800, 0)).0, Reply::Queued { position: 0 });
    let o = batch(&mut e, 100, vec![revoke(3, 1)]);
    let effects = vec![released(grant("a", 1, 1), 100, Revoked), granted(grant("a", 2, 2), 2, true, 90)];
    assert_eq!(o, out(vec![Reply::LeaseRevoked { lease: l(1) }], effects, Some(1000)));
    let info = e.lock_info(100, "a").unwrap();
    assert_eq!((info.holder.map(|h| h.lease), info.reopens_in_ms), (Some(l(2)), None));
    assert_eq!(e.lease_info(100, l(1)), None);
}

#[test]
fn inv4_revoke_drops_the_leases_waits() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_eq!(one(&mut e, 10, acq(2, 2, "a", 500, 0)).0, Reply::Queued { position: 0 });
    let o = batch(&mut e, 50, vec![revoke(3, 2)]);
    let effects = vec![wait_ended("a", 2, 2, WaitEnd::LeaseEnded)];
    assert_eq!(o, out(vec![Reply::LeaseRevoked { lease: l(2) }], effects, Some(1000)));
    assert_eq!(e.lock_info(50, "a").unwrap().waiters, vec![]);
    assert_eq!(e.stats().waiters, 0);
}

#[test]
fn inv6_revoke_retry_replies_revoked_again() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    let (reply, fx) = one(&mut e, 10, revoke(5, 1));
    assert_eq!(reply, Reply::LeaseRevoked { lease: l(1) });
    assert_eq!(fx, vec![released(grant("a", 1, 1), 10, Revoked)]);
    assert_eq!(one(&mut e, 20, revoke(5, 1)), (Reply::LeaseRevoked { lease: l(1) }, vec![]));
    // Another request for the gone lease, or an unknown lease, is an error.
    assert_rejected(&mut e, 20, revoke(6, 1), LeaseNotFound(l(1)));
    assert_rejected(&mut e, 20, revoke(5, 9), LeaseNotFound(l(9)));
    assert_rejected(&mut e, 20, revoke(0, 1), InvalidRequestId);
}

#[test]
fn inv6_revoke_memory_is_bounded() {
    let n = REVOKED_MEMORY as u64 + 1;
    let mut e = Engine::new();
    batch(&mut e, 0, (1..=n).map(|i| new_lease(i, TTL)).collect());
    let o = batch(&mut e, 0, (1..=n).map(|i| revoke(i, i)).collect());
    assert!(o.replies.iter().all(|r| matches!(r, Reply::LeaseRevoked { .. })));
    assert_rejected(&mut e, 1, revoke(1, 1), LeaseNotFound(l(1)));
    assert_eq!(one(&mut e, 1, revoke(2, 2)).0, Reply::LeaseRevoked { lease: l(2) });
}

#[test]
fn inv4_lease_expiry_releases_its_locks_and_drops_its_waits() {
    let mut e = setup(3);
    let o = batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(2, 1, "b", 0, 0), acq(3, 2, "c", 0, 0)]);
    assert_eq!(o.effects.len(), 3);
    let cmds = vec![keep(4, 2), keep(5, 3), acq(6, 1, "c", 2000, 0), acq(7, 3, "a", 2000, 0)];
    let o = batch(&mut e, 500, cmds);
    assert_eq!(o.replies[2..], [Reply::Queued { position: 0 }, Reply::Queued { position: 0 }]);
    let effects = vec![
        expired(1),
        released(grant("a", 1, 1), 1000, Expired),
        granted(grant("a", 3, 4), 7, true, 500),
        released(grant("b", 1, 2), 1000, Expired),
        wait_ended("c", 1, 6, WaitEnd::LeaseEnded),
    ];
    assert_eq!(tick(&mut e, 1000), out(vec![], effects, Some(1500)));
    assert_eq!(e.lock_info(1000, "b"), None);
    assert_eq!(e.stats(), Stats { leases: 2, held_locks: 2, waiters: 0, tokens_issued: 4, token_counter: 4 });
}

#[test]
fn inv4_an_ending_lease_is_not_granted_the_lock_it_held_and_queued_for() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    let o = batch(&mut e, 100, vec![keep(3, 2), acq(2, 1, "a", 5000, 0), acq(4, 2, "a", 5000, 0)]);
    assert_eq!(o.replies[1..], [Reply::Queued { position: 0 }, Reply::Queued { position: 1 }]);
    let effects = vec![
        expired(1),
        released(grant("a", 1, 1), 1000, Expired),
        granted(grant("a", 2, 2), 4, true, 900),
        wait_ended("a", 1, 2, WaitEnd::LeaseEnded),
    ];
    assert_eq!(tick(&mut e, 1000), out(vec![], effects, Some(1100)));
}

#[test]
fn inv4_same_instant_expiry_skips_a_waiter_whose_lease_is_due_too() {
    let cmds = vec![new_lease(1, 1000), new_lease(2, 1000), new_lease(3, 5000)];
    let mut e = Engine::new();
    batch(&mut e, 0, cmds);
    let o = batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(2, 2, "a", 3000, 0), acq(3, 3, "a", 3000, 0)]);
    assert_eq!(o.replies[1..], [Reply::Queued { position: 0 }, Reply::Queued { position: 1 }]);
    let effects = vec![
        expired(1),
        released(grant("a", 1, 1), 1000, Expired),
        granted(grant("a", 3, 2), 3, true, 1000),
        expired(2),
        wait_ended("a", 2, 2, WaitEnd::LeaseEnded),
    ];
    assert_eq!(tick(&mut e, 1000), out(vec![], effects, Some(5000)));
}
