//! Read-write locks and semaphores (issue 18): shared and exclusive grants,
//! weighted permits, FIFO across modes, downgrade, and old entries that still load.
//!
//! Invariants (see the crate docs): INV-15 the holders of a lock fit together
//! (many readers or one writer; at most N permits); INV-16 FIFO across modes
//! and weights (nobody barges past a live waiter); INV-2 every grant its own
//! token; INV-4, INV-6, INV-9 as for exclusive locks.

use super::harness::*;
use super::*;

/// A shared acquire of `lock` (a reader).
fn shared(req: u64, lease: u64, lock: &str, wait_ms: u64) -> Command {
    with(acq(req, lease, lock, wait_ms, 0), |a| a.mode = Mode::Shared)
}

/// An acquire of `weight` permits of the semaphore `lock` of `permits`.
fn sem(req: u64, lease: u64, lock: &str, wait_ms: u64, permits: u32, weight: u32) -> Command {
    with(acq(req, lease, lock, wait_ms, 0), |a| (a.permits, a.weight) = (permits, weight))
}

fn with(mut c: Command, f: impl FnOnce(&mut Acquire)) -> Command {
    if let Command::Acquire(a) = &mut c {
        f(a);
    }
    c
}

fn down(req: u64, lease: u64, lock: &str, token: u64) -> Command {
    Command::Downgrade { req: r(req), lease: l(lease), lock: lock.to_string(), token: t(token) }
}

/// A `Busy` of an open lock held by `holders` grants, the first `first`.
fn busy_of(first: Grant, holders: u32, waiters: u32) -> Reply {
    Reply::Busy(Busy { holder: Some(first), holders, reopens_in_ms: None, waiters })
}

/// The effect of a shared grant (a reader).
fn granted_shared(g: Grant, req: u64, queued: bool, waited_ms: u64) -> Effect {
    match granted(g, req, queued, waited_ms) {
        Effect::Granted { grant, req, queued, waited_ms, tag, .. } => {
            Effect::Granted { grant, req, queued, waited_ms, tag, mode: Mode::Shared }
        }
        other => other,
    }
}

/// The tokens of the live holders of `lock` at `now`, in grant order.
fn holder_tokens(e: &Engine, now: Millis, lock: &str) -> Vec<u64> {
    let info = e.lock_info(now, lock).map(|i| i.holders).unwrap_or_default();
    info.iter().map(|h| h.token.0).collect()
}

#[test]
fn inv15_readers_share_and_each_gets_its_own_token() {
    let mut e = setup(3);
    let o = batch(&mut e, 0, vec![shared(1, 1, "a", 0), shared(2, 2, "a", 0), shared(3, 3, "a", 0)]);
    let replies = (1..=3).map(|n| Reply::Acquired(grant("a", n, n))).collect();
    let fx = (1..=3).map(|n| granted_shared(grant("a", n, n), n, false, 0)).collect();
    assert_eq!(o, out(replies, fx, Some(1000)));
    assert_eq!(holder_tokens(&e, 0, "a"), vec![1, 2, 3]);
    let info = e.lock_info(0, "a").unwrap();
    assert!(info.holders.iter().all(|h| h.mode == Mode::Shared));
    assert_eq!(info.holder.map(|h| h.token), Some(t(1)));
    assert_eq!((e.check(0, "a", t(2)), e.check(0, "a", t(4))), (Check::Current, Check::Stale { current: Some(t(1)) }));
}

#[test]
fn inv15_a_writer_waits_for_every_reader_and_gets_a_higher_token() {
    let mut e = setup(3);
    batch(&mut e, 0, vec![shared(1, 1, "a", 0), shared(2, 2, "a", 0)]);
    assert_eq!(one(&mut e, 0, acq(3, 3, "a", 0, 0)).0, busy_of(grant("a", 1, 1), 2, 0));
    assert_eq!(one(&mut e, 0, acq(4, 3, "a", 500, 0)).0, Reply::Queued { position: 0 });
    let fx = vec![released(grant("a", 1, 1), 10, ReleaseCause::Released)];
    assert_eq!(one(&mut e, 10, rel(5, 1, "a", 1)), (Reply::Released, fx));
    let fx = vec![released(grant("a", 2, 2), 20, ReleaseCause::Released), granted(grant("a", 3, 3), 4, true, 20)];
    assert_eq!(one(&mut e, 20, rel(6, 2, "a", 2)), (Reply::Released, fx));
}

#[test]
fn inv15_a_reader_waits_while_a_writer_holds() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_eq!(one(&mut e, 0, shared(2, 2, "a", 0)).0, busy(Some(grant("a", 1, 1)), None, 0));
}

#[test]
fn inv16_a_queued_writer_holds_back_later_readers() {
    let mut e = setup(3);
    one(&mut e, 0, shared(1, 1, "a", 0));
    assert_eq!(one(&mut e, 0, acq(2, 2, "a", 500, 0)).0, Reply::Queued { position: 0 });
    // The lock is shared, but a writer is queued: the reader does not barge.
    assert_eq!(one(&mut e, 0, shared(3, 3, "a", 0)).0, busy(Some(grant("a", 1, 1)), None, 1));
    assert_eq!(one(&mut e, 0, shared(4, 3, "a", 500)).0, Reply::Queued { position: 1 });
    // When the writer's wait ends, the reader behind it joins the first one.
    let fx = vec![wait_ended("a", 2, 2, WaitEnd::Cancelled), granted_shared(grant("a", 3, 2), 4, true, 10)];
    assert_eq!(one(&mut e, 10, cancel(2, 2, "a")), (Reply::Cancelled { released: false }, fx));
    assert_eq!(holder_tokens(&e, 10, "a"), vec![1, 2]);
}

#[test]
fn inv16_a_run_of_readers_after_a_writer_is_granted_together_up_to_the_next_writer() {
    let mut e = setup(5);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    let cmds = vec![shared(2, 2, "a", 900), shared(3, 3, "a", 900), acq(4, 4, "a", 900, 0), shared(5, 5, "a", 900)];
    let o = batch(&mut e, 0, cmds);
    assert_eq!(o.replies, (0..4).map(|position| Reply::Queued { position }).collect::<Vec<_>>());
    let fx = vec![
        released(grant("a", 1, 1), 50, ReleaseCause::Released),
        granted_shared(grant("a", 2, 2), 2, true, 50),
        granted_shared(grant("a", 3, 3), 3, true, 50),
    ];
    assert_eq!(one(&mut e, 50, rel(6, 1, "a", 1)), (Reply::Released, fx));
    assert_eq!(e.lock_info(50, "a").unwrap().waiters.len(), 2);
    one(&mut e, 60, rel(7, 2, "a", 2));
    let fx = vec![released(grant("a", 3, 3), 10, ReleaseCause::Released), granted(grant("a", 4, 4), 4, true, 60)];
    assert_eq!(one(&mut e, 60, rel(8, 3, "a", 3)), (Reply::Released, fx));
    let fx =
        vec![released(grant("a", 4, 4), 10, ReleaseCause::Released), granted_shared(grant("a", 5, 5), 5, true, 70)];
    assert_eq!(one(&mut e, 70, rel(9, 4, "a", 4)), (Reply::Released, fx));
}

#[test]
fn semaphore_weights_are_all_or_nothing_and_fifo_without_barging() {
    let mut e = setup(4);
    assert_eq!(one(&mut e, 0, sem(1, 1, "s", 0, 3, 2)).0, Reply::Acquired(grant("s", 1, 1)));
    // 1 permit left: a weight of 2 waits, and a weight of 1 behind it may not barge.
    assert_eq!(one(&mut e, 0, sem(2, 2, "s", 500, 3, 2)).0, Reply::Queued { position: 0 });
    assert_eq!(one(&mut e, 0, sem(3, 3, "s", 0, 3, 1)).0, busy(Some(grant("s", 1, 1)), None, 1));
    assert_eq!(one(&mut e, 0, sem(4, 3, "s", 500, 3, 1)).0, Reply::Queued { position: 1 });
    // Releasing 2 permits of 3: the weight-2 waiter, then the weight-1 one fit.
    let fx = vec![
        released(grant("s", 1, 1), 10, ReleaseCause::Released),
        granted(grant("s", 2, 2), 2, true, 10),
        granted(grant("s", 3, 3), 4, true, 10),
    ];
    assert_eq!(one(&mut e, 10, rel(5, 1, "s", 1)), (Reply::Released, fx));
    let info = e.lock_info(10, "s").unwrap();
    assert_eq!((info.permits, info.holders.iter().map(|h| h.weight).collect::<Vec<_>>()), (3, vec![2, 1]));
    assert_eq!(one(&mut e, 10, sem(6, 4, "s", 0, 3, 1)).0, busy_of(grant("s", 2, 2), 2, 0));
}

#[test]
fn semaphore_mode_is_ignored() {
    let mut e = setup(2);
    let a = with(sem(1, 1, "s", 0, 2, 1), |a| a.mode = Mode::Shared);
    assert_eq!(one(&mut e, 0, a).0, Reply::Acquired(grant("s", 1, 1)));
    assert_eq!(one(&mut e, 0, sem(2, 2, "s", 0, 2, 1)).0, Reply::Acquired(grant("s", 2, 2)));
    let modes: Vec<Mode> = e.lock_info(0, "s").unwrap().holders.iter().map(|h| h.mode).collect();
    assert_eq!(modes, vec![Mode::Exclusive, Mode::Exclusive]);
}

#[test]
fn inv9_a_mismatched_permit_count_is_refused_naming_both() {
    let mut e = setup(2);
    one(&mut e, 0, sem(1, 1, "s", 0, 3, 1));
    let err = EngineError::PermitsMismatch { lock_has: 3, asked: 2 };
    assert_eq!(
        err.to_string(),
        "permits mismatch: the lock has 3 permits, the acquire asked for 2 (0 = not a semaphore)"
    );
    assert_rejected(&mut e, 0, sem(2, 2, "s", 0, 2, 1), err);
    assert_rejected(&mut e, 0, acq(3, 2, "s", 0, 0), EngineError::PermitsMismatch { lock_has: 3, asked: 0 });
    one(&mut e, 0, acq(4, 1, "a", 0, 0));
    assert_rejected(&mut e, 0, sem(5, 2, "a", 0, 3, 1), EngineError::PermitsMismatch { lock_has: 0, asked: 3 });
    // Once the semaphore has no entry, the next acquirer sets N again.
    one(&mut e, 10, rel(6, 1, "s", 1));
    assert_eq!(one(&mut e, 10, sem(7, 2, "s", 0, 2, 2)).0, Reply::Acquired(grant("s", 2, 3)));
}

#[test]
fn inv9_a_weight_of_0_or_above_the_permits_is_refused() {
    let mut e = setup(1);
    assert_rejected(&mut e, 0, sem(1, 1, "s", 0, 3, 0), EngineError::InvalidWeight { weight: 0, max: 3 });
    assert_rejected(&mut e, 0, sem(1, 1, "s", 0, 3, 4), EngineError::InvalidWeight { weight: 4, max: 3 });
    assert_rejected(&mut e, 0, sem(1, 1, "a", 0, 0, 2), EngineError::InvalidWeight { weight: 2, max: 1 });
}

#[test]
fn a_downgrade_keeps_the_token_and_admits_the_queued_readers() {
    let mut e = setup(4);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    batch(&mut e, 0, vec![shared(2, 2, "a", 900), shared(3, 3, "a", 900), acq(4, 4, "a", 900, 0)]);
    // Watchers see the writer become a reader, then the readers it lets in.
    let fx = vec![
        Effect::Downgraded { grant: grant("a", 1, 1), tag: None },
        granted_shared(grant("a", 2, 2), 2, true, 30),
        granted_shared(grant("a", 3, 3), 3, true, 30),
    ];
    assert_eq!(one(&mut e, 30, down(5, 1, "a", 1)), (Reply::Downgraded, fx));
    assert_eq!(holder_tokens(&e, 30, "a"), vec![1, 2, 3]);
    assert_eq!(e.lock_info(30, "a").unwrap().holders[0].mode, Mode::Shared);
    // INV-6: a retry is answered from memory and grants nothing more.
    assert_eq!(one(&mut e, 40, down(5, 1, "a", 1)), (Reply::Downgraded, vec![]));
    // A shared grant cannot be downgraded; a wrong one changes nothing (INV-5).
    let before = e.clone();
    assert_eq!(one(&mut e, 40, down(6, 2, "a", 2)), (Reply::NotHolder, vec![]));
    assert_eq!(one(&mut e, 40, down(7, 1, "a", 9)), (Reply::NotHolder, vec![]));
    assert_eq!(e, before);
}

#[test]
fn a_semaphore_grant_cannot_be_downgraded() {
    let mut e = setup(1);
    one(&mut e, 0, sem(1, 1, "s", 0, 2, 1));
    assert_eq!(one(&mut e, 0, down(2, 1, "s", 1)), (Reply::NotHolder, vec![]));
}

#[test]
fn inv6_retries_of_shared_and_weighted_acquires_are_answered_from_memory() {
    let mut e = setup(3);
    one(&mut e, 0, shared(1, 1, "a", 0));
    assert_eq!(one(&mut e, 10, shared(1, 1, "a", 0)), (Reply::Acquired(grant("a", 1, 1)), vec![]));
    one(&mut e, 0, sem(2, 2, "s", 0, 2, 2));
    assert_eq!(one(&mut e, 10, sem(3, 3, "s", 500, 2, 1)).0, Reply::Queued { position: 0 });
    assert_eq!(one(&mut e, 20, sem(3, 3, "s", 500, 2, 1)), (Reply::Queued { position: 0 }, vec![]));
    one(&mut e, 30, rel(4, 2, "s", 2));
    assert_eq!(one(&mut e, 40, sem(3, 3, "s", 500, 2, 1)), (Reply::Acquired(grant("s", 3, 3)), vec![]));
    assert_eq!(e.stats().tokens_issued, 3);
}

#[test]
fn inv4_the_expiry_of_one_reader_leaves_the_others() {
    let mut e = setup(2);
    batch(&mut e, 0, vec![shared(1, 1, "a", 0), shared(2, 2, "a", 0)]);
    one(&mut e, 500, keep(3, 2));
    let fx = vec![expired(1), released(grant("a", 1, 1), 1000, ReleaseCause::Expired)];
    assert_eq!(tick(&mut e, 1000), out(vec![], fx, Some(1500)));
    assert_eq!(holder_tokens(&e, 1000, "a"), vec![2]);
    assert_eq!(e.check(1000, "a", t(2)), Check::Current);
}

#[test]
fn inv7_the_expiry_of_a_reader_with_lock_delay_closes_the_whole_lock() {
    let mut e = setup(3);
    batch(&mut e, 0, vec![with(shared(1, 1, "a", 0), |a| a.lock_delay_ms = 200), shared(2, 2, "a", 0)]);
    batch(&mut e, 500, vec![keep(3, 2), keep(4, 3)]);
    tick(&mut e, 1000);
    assert_eq!(one(&mut e, 1000, shared(5, 3, "a", 0)).0, busy(Some(grant("a", 2, 2)), Some(200), 0));
    assert_eq!(holder_tokens(&e, 1000, "a"), vec![2]);
}

#[test]
fn old_entries_and_snapshots_without_mode_weight_or_permits_still_load() {
    let entry = r#"{"Acquire":{"req":1,"lease":2,"lock":"a","wait_ms":0,"lock_delay_ms":0}}"#;
    let cmd: Command = serde_json::from_str(entry).unwrap();
    assert_eq!(cmd, acq(1, 2, "a", 0, 0));
    assert_eq!(serde_json::to_string(&cmd).unwrap(), entry, "an exclusive acquire is written as before");
    // A Busy remembered for a retry before it counted holders.
    let busy: Busy = serde_json::from_str(r#"{"holder":null,"reopens_in_ms":null,"waiters":0}"#).unwrap();
    assert_eq!(busy.holders, 0);
    // A snapshot of an engine whose holders and waiters predate modes and weights.
    let mut e = setup(2);
    batch(&mut e, 0, vec![acq(1, 1, "a", 0, 0), acq(2, 2, "a", 500, 0)]);
    let json = serde_json::to_string(&e).unwrap();
    assert!(!json.contains("mode") && !json.contains("weight") && !json.contains("permits"), "{json}");
    let back: Engine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);
    back.check_consistency().unwrap();
}

/// Found by the model test: a second holder's shorter lock-delay must not
/// reopen a lock that the first one's longer delay closed.
#[test]
fn inv7_the_lock_reopens_when_the_last_of_several_lock_delays_ends() {
    let mut e = setup(3);
    let first = with(shared(1, 1, "a", 0), |a| a.lock_delay_ms = 1500);
    batch(&mut e, 0, vec![first, with(shared(2, 2, "a", 0), |a| a.lock_delay_ms = 100)]);
    one(&mut e, 500, keep(3, 3));
    let fx = vec![
        expired(1),
        released(grant("a", 1, 1), 1000, ReleaseCause::Expired),
        expired(2),
        released(grant("a", 2, 2), 1000, ReleaseCause::Expired),
    ];
    assert_eq!(tick(&mut e, 1000), out(vec![], fx, Some(1500)));
    one(&mut e, 1200, keep(4, 3));
    assert_eq!(one(&mut e, 1200, shared(5, 3, "a", 0)).0, busy(None, Some(1300), 0));
    one(&mut e, 2000, keep(7, 3));
    assert_eq!(tick(&mut e, 2499).effects, vec![]);
    assert_eq!(one(&mut e, 2500, shared(6, 3, "a", 0)).0, Reply::Acquired(grant("a", 3, 3)));
}
