//! Hold-at-least (INV-17): a grant made with `hold_at_least_ms` keeps its
//! lock closed to everyone until that long after the grant, however the grant
//! ends, on the engine's clock; a longer closure wins; a new leader never
//! shortens it.

use super::harness::*;
use super::*;
use ReleaseCause::*;

/// `acq` with a hold-at-least of `hold_ms`.
fn held_for(cmd: Command, hold_ms: u64) -> Command {
    match cmd {
        Command::Acquire(a) => Command::Acquire(Acquire { hold_at_least_ms: hold_ms, ..a }),
        other => other,
    }
}

fn reopens_in(e: &Engine, now: Millis) -> Option<u64> {
    e.lock_info(now, "a").and_then(|i| i.reopens_in_ms)
}

#[test]
fn inv17_a_release_before_the_hold_ends_keeps_everyone_out_until_it_ends() {
    let mut e = setup(3);
    let first = held_for(acq(1, 1, "a", 0, 0), 500);
    assert_eq!(one(&mut e, 0, first).0, Reply::Acquired(grant("a", 1, 1)));
    assert_eq!(one(&mut e, 0, acq(2, 2, "a", 900, 0)).0, Reply::Queued { position: 0 });
    // Released at 100: nobody is granted, the lock reopens at 500.
    let o = batch(&mut e, 100, vec![rel(3, 1, "a", 1)]);
    assert_eq!(o, out(vec![Reply::Released], vec![released(grant("a", 1, 1), 100, Released)], Some(500)));
    // A try meanwhile is busy, and says when the lock reopens.
    assert_eq!(one(&mut e, 200, acq(4, 3, "a", 0, 0)).0, busy(None, Some(300), 1));
    assert_eq!(tick(&mut e, 499), out(vec![], vec![], Some(500)));
    // The waiter is granted exactly when the hold ends.
    let fx = vec![granted(grant("a", 2, 2), 2, true, 500)];
    assert_eq!(tick(&mut e, 500), out(vec![], fx, Some(1000)));
}

#[test]
fn inv17_a_release_after_the_hold_ended_frees_the_lock_at_once() {
    let mut e = setup(2);
    one(&mut e, 0, held_for(acq(1, 1, "a", 0, 0), 300));
    one(&mut e, 100, acq(2, 2, "a", 800, 0));
    let o = batch(&mut e, 300, vec![rel(3, 1, "a", 1)]);
    let fx = vec![released(grant("a", 1, 1), 300, Released), granted(grant("a", 2, 2), 2, true, 200)];
    assert_eq!(o, out(vec![Reply::Released], fx, Some(1000)));
}

#[test]
fn inv17_revoke_and_cancel_keep_the_lock_closed_for_what_is_left_of_the_hold() {
    let mut e = setup(2);
    one(&mut e, 0, held_for(acq(1, 1, "a", 0, 0), 400));
    batch(&mut e, 100, vec![revoke(2, 1)]);
    assert_eq!(reopens_in(&e, 100), Some(300));
    one(&mut e, 500, held_for(acq(3, 2, "a", 0, 0), 400));
    let (reply, fx) = one(&mut e, 550, cancel(3, 2, "a"));
    assert_eq!((reply, fx), (Reply::Cancelled { released: true }, vec![released(grant("a", 2, 2), 50, Cancelled)]));
    assert_eq!(reopens_in(&e, 550), Some(350));
}

#[test]
fn inv17_an_expiry_closes_the_lock_for_the_longer_of_its_lock_delay_and_the_hold() {
    // Hold left (1000 ms) is longer than the lock-delay (100 ms).
    let mut e = setup(1);
    one(&mut e, 0, held_for(acq(1, 1, "a", 0, 100), 2000));
    let fx = vec![expired(1), released(grant("a", 1, 1), 1000, Expired)];
    assert_eq!(tick(&mut e, 1000), out(vec![], fx, Some(2000)));
    // The lock-delay (500 ms) is longer than the hold left (50 ms).
    let mut e = setup(1);
    one(&mut e, 0, held_for(acq(1, 1, "a", 0, 500), 1050));
    tick(&mut e, 1000);
    assert_eq!(reopens_in(&e, 1000), Some(500));
}

#[test]
fn inv17_a_hold_shorter_than_an_existing_closure_does_not_shorten_it() {
    // Two readers: one expires with a 600 ms lock-delay, the other, held
    // for at least 1100 ms, is released at once after it.
    let mut e = setup(2);
    let shared = |cmd| match cmd {
        Command::Acquire(a) => Command::Acquire(Acquire { mode: Mode::Shared, ..a }),
        other => other,
    };
    one(&mut e, 0, shared(acq(1, 1, "a", 0, 600)));
    one(&mut e, 0, shared(held_for(acq(2, 2, "a", 0, 0), 1100)));
    batch(&mut e, 900, vec![keep(3, 2)]);
    tick(&mut e, 1000);
    assert_eq!(reopens_in(&e, 1000), Some(600));
    one(&mut e, 1000, rel(4, 2, "a", 2));
    assert_eq!(reopens_in(&e, 1000), Some(600));
}

#[test]
fn inv17_a_new_leader_keeps_the_age_of_a_held_grant_and_restarts_a_closure_in_full() {
    let mut e = setup(2);
    one(&mut e, 0, held_for(acq(1, 1, "a", 0, 500), 500));
    tick(&mut e, 200);
    // The new leader's clock reads 10 000 where the old one read 200: the
    // grant is still 200 ms old, so a release at 10 100 leaves 200 ms.
    e.step(&Input::leader_start(10_000));
    one(&mut e, 10_100, rel(2, 1, "a", 1));
    assert_eq!(reopens_in(&e, 10_100), Some(200));
    // A closure restarts in full under the next leader: never shorter.
    e.step(&Input::leader_start(20_000));
    assert_eq!(reopens_in(&e, 20_000), Some(200));
    assert_eq!(one(&mut e, 20_199, acq(3, 2, "a", 0, 0)).0, busy(None, Some(1), 0));
    assert_eq!(one(&mut e, 20_200, acq(4, 2, "a", 0, 0)).0, Reply::Acquired(grant("a", 2, 2)));
}

#[test]
fn inv9_hold_at_least_above_its_limit_is_rejected_after_the_lock_delay() {
    let mut e = setup(1);
    let (max, delay) = (MAX_HOLD_AT_LEAST_MS, MAX_LOCK_DELAY_MS);
    let too_long = EngineError::InvalidHoldAtLeast { got_ms: max + 1, max_ms: max };
    assert_rejected(&mut e, 0, held_for(acq(1, 1, "a", 0, 0), max + 1), too_long);
    let bad_delay = EngineError::InvalidLockDelay { got_ms: delay + 1, max_ms: delay };
    assert_rejected(&mut e, 0, held_for(acq(1, 1, "a", 0, delay + 1), max + 1), bad_delay);
    let bad_identity =
        Command::Acquire(Acquire { identity: "a\nb".into(), ..acquire_of(held_for(acq(1, 1, "a", 0, 0), max + 1)) });
    let err = EngineError::InvalidHoldAtLeast { got_ms: max + 1, max_ms: max };
    assert_rejected(&mut e, 0, bad_identity, err);
    assert_eq!(one(&mut e, 0, held_for(acq(1, 1, "a", 0, 0), max)).0, Reply::Acquired(grant("a", 1, 1)));
}

#[test]
fn an_acquire_written_before_hold_at_least_existed_loads_without_one() {
    let a = acquire_of(acq(1, 1, "a", 0, 0));
    let json = serde_json::to_string(&a).unwrap();
    assert!(!json.contains("hold_at_least_ms"), "{json}");
    let back: Acquire = serde_json::from_str(&json).unwrap();
    assert_eq!(back.hold_at_least_ms, 0);
    let held = serde_json::to_string(&acquire_of(held_for(acq(1, 1, "a", 0, 0), 7))).unwrap();
    assert!(held.contains("\"hold_at_least_ms\":7"), "{held}");
}

fn acquire_of(cmd: Command) -> Acquire {
    match cmd {
        Command::Acquire(a) => a,
        other => panic!("not an acquire: {other:?}"),
    }
}
