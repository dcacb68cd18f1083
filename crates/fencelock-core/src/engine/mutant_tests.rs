//! Tests of the test-only mutants (`crate::mutants`): each mutant breaks the
//! invariant it names, and with it off the engine keeps that invariant. The switch
//! is process-wide, so every test sets it first (nextest runs each test in its own
//! process).
//!
//! - INV-2 tokens strictly increase across all grants, never reused.
//! - INV-4 no grant to an expired (or revoked) lease; a waiter whose lease ended is
//!   dropped.

use super::*;
use crate::mutants::{dead_waiter_check_removed, set_dead_waiter_check_removed};

fn lease(req: u64, ttl_ms: u64) -> Command {
    Command::GrantLease { req: RequestId(req), ttl_ms, id: None }
}

fn acq(req: u64, lease: u64, lock: &str, wait_ms: u64) -> Command {
    Command::Acquire(Acquire::exclusive(RequestId(req), LeaseId(lease), lock, wait_ms))
}

fn rel(req: u64, lease: u64, lock: &str, token: u64) -> Command {
    Command::Release { req: RequestId(req), lease: LeaseId(lease), lock: lock.into(), token: Token(token) }
}

fn batch(e: &mut Engine, now: Millis, cmds: Vec<Command>) -> Output {
    e.step(&Input::Batch { now, cmds })
}

fn grant(lock: &str, lease: u64, token: u64) -> Grant {
    Grant { lock: LockName::new(lock).unwrap(), lease: LeaseId(lease), token: Token(token) }
}

fn granted(lock: &str, lease: u64, token: u64, req: u64, waited_ms: u64) -> Effect {
    Effect::Granted {
        grant: grant(lock, lease, token),
        req: RequestId(req),
        queued: true,
        waited_ms,
        tag: None,
        mode: Mode::Exclusive,
    }
}

fn released(lock: &str, lease: u64, token: u64, held_ms: u64, cause: ReleaseCause) -> Effect {
    Effect::Released { grant: grant(lock, lease, token), held_ms, cause, tag: None }
}

fn expired(lease: u64) -> Effect {
    Effect::LeaseExpired { lease: LeaseId(lease) }
}

/// Lease 1 (TTL 5000) holds "a" (token 1); lease 2 (TTL 1000) waits for "a" until
/// 4000; at 1000 lease 2 expires. Returns the effects of that expiry.
fn dead_waiter_behind_a_holder(e: &mut Engine) -> Vec<Effect> {
    batch(e, 0, vec![lease(101, 5000), lease(102, 1000)]);
    let o = batch(e, 0, vec![acq(1, 1, "a", 0), acq(2, 2, "a", 4000)]);
    assert_eq!(o.replies[1], Reply::Queued { position: 0 });
    batch(e, 1000, vec![]).effects
}

#[test]
fn inv4_holds_with_the_mutant_off_a_release_does_not_grant_an_expired_waiter() {
    set_dead_waiter_check_removed(false);
    let mut e = Engine::new();
    let name = LockName::new("a").unwrap();
    let wait_ended = Effect::WaitEnded { lock: name, lease: LeaseId(2), req: RequestId(2), why: WaitEnd::LeaseEnded };
    assert_eq!(dead_waiter_behind_a_holder(&mut e), vec![expired(2), wait_ended]);
    let o = batch(&mut e, 1500, vec![rel(3, 1, "a", 1)]);
    assert_eq!(o.replies, vec![Reply::Released]);
    assert_eq!(o.effects, vec![released("a", 1, 1, 1500, ReleaseCause::Released)]);
    assert_eq!(e.lock_info(1500, "a"), None, "INV-4: the lock is free after the release");
}

#[test]
fn inv4_broken_by_dead_waiter_mutant_a_release_grants_an_expired_waiter() {
    set_dead_waiter_check_removed(true);
    assert!(dead_waiter_check_removed());
    let mut e = Engine::new();
    // The ended lease's wait is not dropped ...
    assert_eq!(dead_waiter_behind_a_holder(&mut e), vec![expired(2)]);
    // ... and the release hands the lock to it (a lease that no longer exists).
    let o = batch(&mut e, 1500, vec![rel(3, 1, "a", 1)]);
    assert_eq!(o.replies, vec![Reply::Released]);
    let fx = vec![released("a", 1, 1, 1500, ReleaseCause::Released), granted("a", 2, 2, 2, 1500)];
    assert_eq!(o.effects, fx, "the mutant grants the lock to the expired lease 2");
    // The lock stays held by the dead lease: past its wait timer, through a
    // LeaderStart, nobody else gets it and nothing panics.
    batch(&mut e, 10_000, vec![]);
    e.step(&Input::leader_start(20_000));
    let o = batch(&mut e, 20_000, vec![lease(103, 5000), acq(4, 3, "a", 0)]);
    let busy = Busy { holder: Some(grant("a", 2, 2)), holders: 1, reopens_in_ms: None, waiters: 0 };
    assert_eq!(o.replies[1], Reply::Busy(busy));
    assert_eq!(e.stats().held_locks, 1);
    assert_eq!(e.lock_info(20_000, "a").map(|i| i.holder), Some(None), "a dead holder is not shown as live");
    set_dead_waiter_check_removed(false);
}

#[test]
fn inv4_broken_by_dead_waiter_mutant_a_waiter_due_at_the_same_instant_is_granted() {
    // Leases 1 and 2 end at 1000, lease 3 at 5000; 2 and 3 wait for "a", held by 1.
    // Without the mutant lease 3 gets "a" at 1000 (token 2): see
    // `inv4_same_instant_expiry_skips_a_waiter_whose_lease_is_due_too`.
    set_dead_waiter_check_removed(true);
    let mut e = Engine::new();
    batch(&mut e, 0, vec![lease(1, 1000), lease(2, 1000), lease(3, 5000)]);
    batch(&mut e, 0, vec![acq(1, 1, "a", 0), acq(2, 2, "a", 3000), acq(3, 3, "a", 3000)]);
    let fx = vec![
        expired(1),
        released("a", 1, 1, 1000, ReleaseCause::Expired),
        granted("a", 2, 2, 2, 1000),
        expired(2),
        released("a", 2, 2, 0, ReleaseCause::Expired),
        granted("a", 3, 3, 3, 1000),
    ];
    assert_eq!(batch(&mut e, 1000, vec![]).effects, fx, "lease 2 was due at 1000 and still got token 2");
    set_dead_waiter_check_removed(false);
}

#[test]
fn inv2_broken_by_forget_tokens_mutant_the_next_token_is_1_again() {
    let mut e = Engine::new();
    batch(&mut e, 0, vec![lease(101, 5000)]);
    let o = batch(&mut e, 0, vec![acq(1, 1, "a", 0), acq(2, 1, "b", 0)]);
    assert_eq!(o.replies, vec![Reply::Acquired(grant("a", 1, 1)), Reply::Acquired(grant("b", 1, 2))]);
    e.mutant_forget_tokens();
    let o = batch(&mut e, 10, vec![acq(3, 1, "c", 0)]);
    assert_eq!(o.replies, vec![Reply::Acquired(grant("c", 1, 1))], "INV-2 broken: token 1 issued twice");
}
