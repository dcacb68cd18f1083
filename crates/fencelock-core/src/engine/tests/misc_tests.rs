//! Lock-delay, the order of timers, LeaderStart, queries and snapshots.

use super::harness::*;
use super::*;
use ReleaseCause::*;

/// Lease 1 (TTL 1000) and lease 2 (TTL 5000), made at 0.
fn two_leases() -> Engine {
    let mut e = Engine::new();
    batch(&mut e, 0, vec![new_lease(1, 1000), new_lease(2, 5000)]);
    e
}

#[test]
fn inv7_expiry_with_lock_delay_closes_the_lock_until_the_delay_ends() {
    let mut e = two_leases();
    one(&mut e, 0, acq(1, 1, "a", 0, 300));
    assert_eq!(one(&mut e, 900, acq(2, 2, "a", 2000, 0)).0, Reply::Queued { position: 0 });
    let fx = vec![expired(1), released(grant("a", 1, 1), 1000, Expired)];
    assert_eq!(tick(&mut e, 1000), out(vec![], fx, Some(1300)));
    assert_eq!(one(&mut e, 1100, acq(3, 2, "a", 0, 0)).0, busy(None, Some(200), 1));
    let waiter = WaiterInfo { lease: l(2), req: r(2), waited_ms: 200, wait_left_ms: 1800, identity: String::new() };
    let (holder, holders) = (None, vec![]);
    let info =
        LockInfo { name: name("a"), holder, holders, permits: 0, reopens_in_ms: Some(200), waiters: vec![waiter] };
    assert_eq!(e.lock_info(1100, "a"), Some(info));
    assert_eq!(tick(&mut e, 1299), out(vec![], vec![], Some(1300)));
    let fx = vec![granted(grant("a", 2, 2), 2, true, 400)];
    assert_eq!(tick(&mut e, 1300), out(vec![], fx, Some(5000)));
}

#[test]
fn inv7_expiry_without_lock_delay_grants_the_next_waiter_at_once() {
    let mut e = two_leases();
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 900, acq(2, 2, "a", 2000, 0));
    let fx = vec![expired(1), released(grant("a", 1, 1), 1000, Expired), granted(grant("a", 2, 2), 2, true, 100)];
    assert_eq!(tick(&mut e, 1000), out(vec![], fx, Some(5000)));
}

#[test]
fn inv7_release_and_cancel_never_close_the_lock() {
    let mut e = two_leases();
    one(&mut e, 0, acq(1, 1, "a", 0, 300));
    one(&mut e, 10, rel(2, 1, "a", 1));
    assert_eq!(e.lock_info(10, "a"), None);
    assert_eq!(one(&mut e, 10, acq(3, 2, "a", 0, 300)).0, Reply::Acquired(grant("a", 2, 2)));
    assert_eq!(one(&mut e, 20, cancel(3, 2, "a")).0, Reply::Cancelled { released: true });
    assert_eq!(one(&mut e, 20, acq(4, 1, "a", 0, 0)).0, Reply::Acquired(grant("a", 1, 3)));
}

#[test]
fn inv7_a_closed_lock_without_waiters_reopens_and_is_forgotten() {
    let mut e = two_leases();
    one(&mut e, 0, acq(1, 1, "a", 0, 500));
    tick(&mut e, 1000);
    assert_eq!(one(&mut e, 1000, acq(2, 2, "a", 100, 0)).0, Reply::Queued { position: 0 });
    let fx = vec![wait_ended("a", 2, 2, WaitEnd::TimedOut)];
    assert_eq!(tick(&mut e, 1100), out(vec![], fx, Some(1500)));
    assert_eq!(e.lock_info(1100, "a").map(|i| i.reopens_in_ms), Some(Some(400)));
    assert_eq!(tick(&mut e, 1500), out(vec![], vec![], Some(5000)));
    assert_eq!(e.lock_info(1500, "a"), None);
}

#[test]
fn timers_fire_at_their_own_instants_within_one_tick() {
    // Lease 1 expires at 500 holding "a" with lock-delay 100; the lock reopens at
    // 600 and goes to the waiter (whose wait would end at 700). One tick at 1000
    // gives the same outcome as ticks at 500 and 600.
    let mut e = Engine::new();
    let cmds = vec![new_lease(1, 500), new_lease(2, 5000), acq(1, 1, "a", 0, 100), acq(2, 2, "a", 700, 0)];
    batch(&mut e, 0, cmds);
    let fx = vec![expired(1), released(grant("a", 1, 1), 500, Expired), granted(grant("a", 2, 2), 2, true, 600)];
    assert_eq!(tick(&mut e, 1000), out(vec![], fx, Some(5000)));
    assert_eq!(e.lock_info(1000, "a").unwrap().holder.unwrap().held_ms, 400);
}

#[test]
fn timers_due_together_fire_reopen_before_wait_timeout() {
    let mut e = two_leases();
    one(&mut e, 0, acq(1, 1, "a", 0, 300));
    one(&mut e, 300, acq(2, 2, "a", 1000, 0)); // wait ends at 1300, as the delay
    let fx = vec![expired(1), released(grant("a", 1, 1), 1000, Expired), granted(grant("a", 2, 2), 2, true, 1000)];
    assert_eq!(tick(&mut e, 1300), out(vec![], fx, Some(5000)));
}

#[test]
fn timers_due_together_fire_lease_expiry_before_wait_timeout() {
    let mut e = two_leases();
    batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(2, 2, "a", 1000, 0)]);
    let fx = vec![expired(1), released(grant("a", 1, 1), 1000, Expired), granted(grant("a", 2, 2), 2, true, 1000)];
    assert_eq!(tick(&mut e, 1000), out(vec![], fx, Some(5000)));
}

#[test]
fn a_batch_behind_the_clock_applies_at_the_engine_clock() {
    let mut e = setup(1);
    tick(&mut e, 500);
    assert_eq!(batch(&mut e, 200, vec![acq(1, 1, "a", 0, 0)]).next_deadline, Some(1000));
    assert_eq!(e.now(), 500);
    assert_eq!(e.lock_info(500, "a").unwrap().holder.unwrap().held_ms, 0);
}

/// Lease 1 expired at 1000 holding "a" with lock-delay 300 (closed until 1300);
/// lease 2 holds "b" since 100; lease 3 waits for "b" until 1600. Clock at 1100.
fn before_leader_change() -> Engine {
    let mut e = Engine::new();
    batch(&mut e, 0, vec![new_lease(1, 1000), new_lease(2, 4000), new_lease(3, 4000)]);
    one(&mut e, 0, acq(1, 1, "a", 0, 300));
    batch(&mut e, 100, vec![acq(2, 2, "b", 0, 0), acq(3, 3, "b", 1500, 0)]);
    tick(&mut e, 1100);
    e
}

#[test]
fn inv8_leader_start_rebases_every_instant_onto_the_new_clock() {
    let mut e = before_leader_change();
    assert_eq!(e.step(&Input::leader_start(5000)), out(vec![], vec![], Some(5300)));
    assert_eq!(e.now(), 5000);
    assert_eq!(e.lease_info(5000, l(2)).unwrap().ttl_left_ms, 4000);
    assert_eq!(e.lock_info(5000, "a").unwrap().reopens_in_ms, Some(300));
    let b = e.lock_info(5000, "b").unwrap();
    let holder = HolderInfo {
        lease: l(2),
        owner: None,
        token: t(2),
        held_ms: 1000,
        ttl_left_ms: 4000,
        lock_delay_ms: 0,
        mode: Mode::Exclusive,
        weight: 1,
        identity: String::new(),
        value: Vec::new(),
    };
    assert_eq!(b.holders, vec![holder.clone()]);
    assert_eq!(b.holder, Some(holder));
    let waiter = WaiterInfo { lease: l(3), req: r(3), waited_ms: 1000, wait_left_ms: 500, identity: String::new() };
    assert_eq!(b.waiters, vec![waiter]);
    let fx = vec![wait_ended("b", 3, 3, WaitEnd::TimedOut)];
    assert_eq!(tick(&mut e, 5500), out(vec![], fx, Some(9000)));
}

#[test]
fn inv8_leader_start_on_a_smaller_clock_saturates_ages() {
    let mut e = before_leader_change();
    assert_eq!(e.step(&Input::leader_start(10)), out(vec![], vec![], Some(310)));
    assert_eq!(e.now(), 10);
    let b = e.lock_info(10, "b").unwrap();
    assert_eq!(b.holder.unwrap().held_ms, 10);
    assert_eq!(b.waiters[0].wait_left_ms, 500);
    assert_eq!(e.lease_info(10, l(3)).unwrap().ttl_left_ms, 4000);
}

#[test]
fn inv8_leader_start_expires_nothing_and_gives_a_full_ttl() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    // The old clock's deadline (1000) is meaningless on the new clock.
    assert_eq!(e.step(&Input::leader_start(5000)), out(vec![], vec![], Some(6000)));
    assert_eq!(tick(&mut e, 5999), out(vec![], vec![], Some(6000)));
    let fx = vec![expired(1), released(grant("a", 1, 1), 1000, Expired)];
    assert_eq!(tick(&mut e, 6000), out(vec![], fx, None));
}

/// INV-12: a lease that already had its fresh TTL from one leader change and
/// was not kept alive since gets no second one: it keeps what it had left.
#[test]
fn inv12_a_second_leader_change_without_keep_alive_gives_no_fresh_ttl() {
    let mut e = setup(1); // lease 1, TTL 1000, at 0
    e.step(&Input::leader_start(5000)); // fresh TTL: ends at 6000
    tick(&mut e, 5400); // 600 left
    assert_eq!(e.step(&Input::leader_start(100)), out(vec![], vec![], Some(700)));
    assert_eq!(tick(&mut e, 699), out(vec![], vec![], Some(700)));
    assert_eq!(tick(&mut e, 700), out(vec![], vec![expired(1)], None));
}

/// INV-12: a keep-alive earns the lease a fresh TTL at the next leader change
/// again (INV-8: the holder's own deadline, sent + TTL, is never cut short).
#[test]
fn inv12_a_keep_alive_earns_the_next_fresh_ttl() {
    let mut e = setup(1);
    e.step(&Input::leader_start(5000));
    tick(&mut e, 5900);
    one(&mut e, 5900, keep(9, 1));
    assert_eq!(e.step(&Input::leader_start(100)), out(vec![], vec![], Some(1100)));
}

/// INV-12, etcd#9888: leader changes in a row, each leader serving 100 ms
/// and no keep-alive at all: the lease still ends, within two TTLs of served
/// time (one fresh TTL, then what was left).
#[test]
fn inv12_elections_alone_never_keep_a_lease_alive() {
    let mut e = setup(1);
    let mut served = 0;
    for term in 1..=100u64 {
        let start = term * 10_000;
        e.step(&Input::leader_start(start));
        let fx = tick(&mut e, start + 100).effects;
        served += 100;
        if fx.contains(&expired(1)) {
            assert!(served <= 2 * 1000, "ended after {served} ms served");
            return;
        }
    }
    panic!("the lease outlived 100 leader changes without a keep-alive");
}

#[test]
fn check_is_current_only_for_the_live_holders_token() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_eq!(e.check(10, "a", t(1)), Check::Current);
    assert_eq!(e.check(10, "a", t(2)), Check::Stale { current: Some(t(1)) });
    assert_eq!(e.check(10, "a", t(0)), Check::Stale { current: Some(t(1)) });
    assert_eq!(e.check(10, "b", t(1)), Check::Stale { current: None });
    assert_eq!(e.check(999, "a", t(1)), Check::Current);
    // The deadline passed; no tick ran yet, but the grant is already stale.
    assert_eq!(e.check(1000, "a", t(1)), Check::Stale { current: None });
}

#[test]
fn lock_info_treats_a_lease_past_its_deadline_as_expired() {
    let mut e = two_leases();
    batch(&mut e, 0, vec![acq(1, 1, "a", 0, 300), acq(2, 2, "b", 0, 0), acq(3, 1, "b", 3000, 0)]);
    let (holder, holders) = (None, vec![]);
    let a = LockInfo { name: name("a"), holder, holders, permits: 0, reopens_in_ms: Some(200), waiters: vec![] };
    assert_eq!(e.lock_info(1100, "a"), Some(a));
    assert_eq!(e.lock_info(1100, "b").unwrap().waiters, vec![]);
    assert_eq!(e.lock_info(999, "b").unwrap().waiters.len(), 1);
}

#[test]
fn locks_lists_by_prefix_in_name_order_up_to_limit() {
    let mut e = setup(1);
    let cmds = ["x", "jobs", "job/2", "job/1"].iter().enumerate();
    batch(&mut e, 0, cmds.map(|(i, n)| acq(i as u64 + 1, 1, n, 0, 0)).collect());
    let names = |v: Vec<LockInfo>| v.into_iter().map(|i| i.name.to_string()).collect::<Vec<_>>();
    assert_eq!(names(e.locks(0, "job/", 10)), ["job/1", "job/2"]);
    assert_eq!(names(e.locks(0, "job", 2)), ["job/1", "job/2"]);
    assert_eq!(names(e.locks(0, "", 10)), ["job/1", "job/2", "jobs", "x"]);
    assert_eq!(names(e.locks(0, "y", 10)), Vec::<String>::new());
    assert_eq!(e.lock_info(0, "nope"), None);
}

#[test]
fn lease_info_lists_grants_in_token_order() {
    let mut e = setup(2);
    batch(&mut e, 0, vec![acq(1, 1, "b", 0, 0), acq(2, 1, "a", 0, 0)]);
    let locks = vec![grant("b", 1, 1), grant("a", 1, 2)];
    let info = LeaseInfo { lease: l(1), owner: None, ttl_ms: TTL, ttl_left_ms: 600, locks };
    assert_eq!(e.lease_info(400, l(1)), Some(info));
    assert_eq!(e.lease_info(1000, l(1)), None);
    assert_eq!(e.lease_info(0, l(9)), None);
}

#[test]
fn snapshot_round_trip_gives_an_identical_engine() {
    let mut e = before_leader_change();
    batch(&mut e, 1200, vec![revoke(9, 2), acq(4, 3, "c", 0, 0), acq(5, 3, "d", 0, 0)]);
    let json = serde_json::to_string(&e).unwrap();
    let mut back: Engine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);
    // Both continue identically, including the remembered outcomes.
    let input = Input::Batch { now: 1400, cmds: vec![revoke(9, 2), acq(4, 3, "c", 0, 0)] };
    assert_eq!(back.step(&input), e.step(&input));
    assert_eq!(back, e);
}

#[test]
fn never_panics_at_the_edges_of_time() {
    let mut e = Engine::new();
    let end = u64::MAX - 10;
    let cmds = vec![
        new_lease(1, MAX_TTL_MS),
        new_lease(2, MAX_TTL_MS),
        acq(1, 1, "a", MAX_WAIT_MS, MAX_LOCK_DELAY_MS),
        acq(2, 2, "a", MAX_WAIT_MS, 0),
    ];
    let o = batch(&mut e, end, cmds);
    assert_eq!(o.next_deadline, Some(u64::MAX));
    e.step(&Input::leader_start(u64::MAX));
    e.step(&Input::leader_start(0));
    e.step(&Input::leader_start(u64::MAX));
    // Everything is due at the last instant, the saturated lock-delay included.
    let o = tick(&mut e, u64::MAX);
    assert_eq!(o.effects[0], expired(1));
    assert_eq!(o.next_deadline, None);
    assert_eq!(e.lock_info(u64::MAX, "a"), None);
    assert_eq!(e.check(u64::MAX, "a", t(1)), Check::Stale { current: None });
}

/// A copy of the engine (a snapshot's, taken between applies) keeps the state
/// it was taken at while the original goes on: changing a lock the copy
/// shares copies that record first (`Arc::make_mut`), and changing a lease
/// copies its chunk of the map, so the copy serializes exactly as the original
/// did when copied. Locks the original did not change stay shared, one
/// allocation for both.
#[test]
fn a_copy_keeps_its_state_while_the_original_changes_and_shares_the_rest() {
    let mut e = setup(3);
    batch(&mut e, 10, vec![acq(1, 1, "a", 0, 0), acq(2, 2, "b", 0, 0), acq(3, 3, "c", 0, 0)]);
    let copy = e.clone();
    let before = serde_json::to_string(&e).unwrap();
    // Lease 1 releases "a" and lease 2 waits on "c"; lease 3 is revoked, which
    // frees "c" for lease 2: leases 1-3 and locks a, c change; b does not.
    batch(&mut e, 20, vec![rel(4, 1, "a", 1), acq(5, 2, "c", 5_000, 0), revoke(6, 3)]);
    assert_ne!(serde_json::to_string(&e).unwrap(), before, "the original changed");
    assert_eq!(serde_json::to_string(&copy).unwrap(), before, "the copy did not");
    assert!(Arc::ptr_eq(&e.locks[&name("b")], &copy.locks[&name("b")]), "an unchanged lock is shared");
    assert_eq!((copy.leases[&l(1)].holds.len(), e.leases[&l(1)].holds.len()), (1, 0));
}

mod many_remembered {
    use crate::{Acquire, Command, Engine, Input, LeaseId, Reply, RequestId, Token, DEDUP_PER_LEASE};

    fn step(e: &mut Engine, cmds: Vec<Command>) -> Vec<Reply> {
        e.step(&Input::Batch { now: 1, cmds }).replies
    }

    fn try_a(req: u64, lease: u64) -> Command {
        Command::Acquire(Acquire::exclusive(RequestId(req), LeaseId(lease), "a", 0))
    }

    /// INV-6 for a lease that remembers many outcomes (a full memory, whose
    /// scan once went through an index): it answers a retry of each of them with its first
    /// outcome (`Busy`, though the lock is free by then), and a new request is
    /// applied (the lock is granted).
    #[test]
    fn inv6_a_lease_remembering_many_requests_answers_each_retry_the_same() {
        let mut e = Engine::new();
        let grant = |req| Command::GrantLease { req: RequestId(req), ttl_ms: 60_000, id: None };
        step(&mut e, vec![grant(1), grant(2), try_a(1, 1)]);
        let n = DEDUP_PER_LEASE as u64 / 2;
        let busy = step(&mut e, (1..=n).map(|req| try_a(req, 2)).collect());
        assert!(busy.iter().all(|r| matches!(r, Reply::Busy(_))), "{busy:?}");
        let release = Command::Release { req: RequestId(2), lease: LeaseId(1), lock: "a".into(), token: Token(1) };
        assert_eq!(step(&mut e, vec![release]), [Reply::Released]);
        assert_eq!(step(&mut e, (1..=n).map(|req| try_a(req, 2)).collect()), busy);
        assert!(matches!(step(&mut e, vec![try_a(n + 1, 2)])[..], [Reply::Acquired(_)]));
    }
}

/// The per-lock metrics' queries: the deepest queues first (ties by name,
/// at most k, none without a waiter), and the grants held at least a
/// threshold by live leases (their number, the longest first); a grant whose
/// lease expired is no longer held.
#[test]
fn deepest_queues_and_long_holds_rank_the_locks() {
    let mut e = Engine::new();
    let leases = (1..=6).map(|i| new_lease(i, if i == 1 { 500 } else { 60_000 })).collect();
    batch(&mut e, 0, leases);
    for (req, lease, lock) in [(1, 1, "a"), (2, 2, "b"), (3, 3, "c"), (4, 4, "d")] {
        one(&mut e, 0, acq(req, lease, lock, 0, 0));
    }
    for (req, lease, lock) in [(5, 5, "b"), (6, 6, "b"), (7, 5, "c"), (8, 6, "c"), (9, 5, "d")] {
        assert!(matches!(one(&mut e, 10, acq(req, lease, lock, 30_000, 0)).0, Reply::Queued { .. }));
    }
    let deepest = e.deepest_queues(2);
    assert_eq!(deepest, vec![(name("b"), 2), (name("c"), 2)], "two of depth 2, by name; d's 1 is cut");
    assert_eq!(e.deepest_queues(10).len(), 3, "a has no waiter");

    // At 1000 lease 1 (TTL 500) is gone: a is not held, whatever its grant's age.
    let (count, top) = e.long_holds(1000, 1000, 2);
    assert_eq!(count, 3, "b, c and d are held 1000 ms by live leases");
    assert_eq!(top.iter().map(|h| (h.lock.as_str(), h.held_ms)).collect::<Vec<_>>(), [("b", 1000), ("c", 1000)]);
    assert_eq!(e.long_holds(1000, 1001, 10), (0, vec![]));
}
