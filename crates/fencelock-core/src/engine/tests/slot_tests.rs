//! Jobs that run once per slot (issue 18 §4): only the current holder
//! completes a slot (INV-5: a wrong completion changes nothing); an acquire
//! for a done slot is answered `SlotDone`, grants nothing and takes no token
//! (INV-2 untouched); a record lasts `SLOT_RETENTION_MS` of engine time,
//! keeps its age across a new leader and survives a snapshot. A waiter for a
//! slot is looked at again when it could be granted: a slot completed
//! meanwhile ends its wait (`WaitEnd::SlotDone`), never a grant, and the
//! queue moves on.

use super::harness::*;
use super::*;

/// An acquire by `identity` that runs once per `slot`.
fn once(req: u64, lease: u64, slot: &str, identity: &str) -> Command {
    match acq(req, lease, "job", 0, 0) {
        Command::Acquire(a) => Command::Acquire(Acquire { once_per: slot.into(), identity: identity.into(), ..a }),
        other => other,
    }
}

/// `cmd` (an acquire) waiting up to `wait_ms`.
fn waiting(cmd: Command, wait_ms: u64) -> Command {
    match cmd {
        Command::Acquire(a) => Command::Acquire(Acquire { wait_ms, ..a }),
        other => other,
    }
}

/// The wait of (lease, req) on "job" ended: its slot was done by `token`,
/// `identity`, with `exit_code`.
fn wait_done(lease: u64, req: u64, token: u64, identity: &str, exit_code: i32) -> Effect {
    let done = SlotCompletion { token: t(token), identity: identity.into(), exit_code };
    wait_ended("job", lease, req, WaitEnd::SlotDone(Box::new(done)))
}

/// The release of `token` of lease 1 on "job", whose acquire said "host-a:1".
fn released_a(token: u64, held_ms: u64, cause: ReleaseCause) -> Effect {
    let tag = Tag::new("host-a:1", &[]);
    Effect::Released { grant: grant("job", 1, token), held_ms, cause, tag }
}

fn complete(req: u64, lease: u64, token: u64, slot: &str, exit_code: i32) -> Command {
    let (lock, slot) = ("job".to_string(), slot.to_string());
    Command::CompleteSlot { req: r(req), lease: l(lease), lock, token: t(token), slot, exit_code }
}

fn done(token: u64, identity: &str, exit_code: i32) -> Reply {
    Reply::SlotDone { token: t(token), identity: identity.into(), exit_code }
}

/// Lease 1 ran the job of "2026-11-23" (token 1, exit 3) and released.
fn ran_once() -> Engine {
    let mut e = setup(2);
    assert_eq!(one(&mut e, 0, once(1, 1, "2026-11-23", "host-a:1")).0, Reply::Acquired(grant("job", 1, 1)));
    assert_eq!(one(&mut e, 10, complete(2, 1, 1, "2026-11-23", 3)).0, Reply::SlotCompleted);
    assert_eq!(one(&mut e, 10, rel(3, 1, "job", 1)).0, Reply::Released);
    e
}

#[test]
fn a_completed_slot_answers_who_ran_it_and_grants_nothing() {
    let mut e = ran_once();
    let (reply, fx) = one(&mut e, 20, once(4, 2, "2026-11-23", "host-b:2"));
    assert_eq!((reply, fx), (done(1, "host-a:1", 3), vec![]));
    assert_eq!(e.lock_info(20, "job"), None, "nothing held, nothing queued");
    // INV-6: a retry gets the same answer.
    assert_eq!(one(&mut e, 30, once(4, 2, "2026-11-23", "host-b:2")).0, done(1, "host-a:1", 3));
    // Another slot, or no slot, takes the lock as usual (token 2: none was spent).
    assert_eq!(one(&mut e, 30, once(5, 2, "2026-11-24", "host-b:2")).0, Reply::Acquired(grant("job", 2, 2)));
    let shown =
        SlotInfo { slot: "2026-11-23".into(), token: t(1), identity: "host-a:1".into(), exit_code: 3, age_ms: 20 };
    assert_eq!(e.completed_slots(30, "job"), vec![shown]);
}

#[test]
fn inv5_only_the_current_holder_completes_a_slot() {
    let mut e = setup(2);
    one(&mut e, 0, once(1, 1, "s", ""));
    // Another lease, a wrong token, another lock: not the holder, nothing kept.
    assert_eq!(one(&mut e, 10, complete(2, 2, 1, "s", 0)).0, Reply::NotHolder);
    assert_eq!(one(&mut e, 10, complete(3, 1, 9, "s", 0)).0, Reply::NotHolder);
    let other =
        Command::CompleteSlot { req: r(4), lease: l(1), lock: "x".into(), token: t(1), slot: "s".into(), exit_code: 0 };
    assert_eq!(one(&mut e, 10, other).0, Reply::NotHolder);
    assert_eq!(e.completed_slots(0, "job"), vec![]);
    // A run whose lease expired never completes its slot.
    tick(&mut e, 1000);
    assert_eq!(one(&mut e, 1000, complete(5, 1, 1, "s", 0)).0, Reply::NotHolder);
    assert_eq!(e.completed_slots(0, "job"), vec![]);
}

#[test]
fn the_first_completion_of_a_slot_stays() {
    let mut e = setup(2);
    let sem = |req, lease| match once(req, lease, "s", &format!("w{lease}")) {
        Command::Acquire(a) => Command::Acquire(Acquire { permits: 2, ..a }),
        other => other,
    };
    one(&mut e, 0, sem(1, 1));
    one(&mut e, 0, sem(2, 2));
    assert_eq!(one(&mut e, 10, complete(3, 1, 1, "s", 0)).0, Reply::SlotCompleted);
    assert_eq!(one(&mut e, 20, complete(4, 2, 2, "s", 1)).0, Reply::SlotCompleted);
    let first = SlotInfo { slot: "s".into(), token: t(1), identity: "w1".into(), exit_code: 0, age_ms: 10 };
    assert_eq!(e.completed_slots(20, "job"), vec![first]);
}

#[test]
fn a_record_lasts_its_retention_of_engine_time_and_keeps_its_age_across_leaders() {
    let mut e = ran_once();
    // A new leader's clock reads 500 where the old one read 10, when the
    // slot was completed: the record is as old as before (0 ms).
    e.step(&Input::leader_start(500));
    let end = 500 + SLOT_RETENTION_MS;
    let fresh = |e: &mut Engine, now, req| {
        let Reply::LeaseGranted { lease, .. } = one(e, now, new_lease(req, TTL)).0 else { panic!("no lease") };
        one(e, now, once(req, lease.0, "2026-11-23", ""))
    };
    assert_eq!(fresh(&mut e, end - 1, 103).0, done(1, "host-a:1", 3));
    let (reply, _) = fresh(&mut e, end, 104);
    assert!(matches!(reply, Reply::Acquired(_)), "{reply:?}");
    assert_eq!(e.completed_slots(0, "job"), vec![]);
}

#[test]
fn completed_slots_survive_a_snapshot_and_an_old_snapshot_loads_without_any() {
    let e = ran_once();
    let json = serde_json::to_string(&e).unwrap();
    assert!(json.contains("2026-11-23"), "{json}");
    let back: Engine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);
    let old = serde_json::to_string(&setup(1)).unwrap();
    assert!(!old.contains("slots"), "{old}");
    let back: Engine = serde_json::from_str(&old).unwrap();
    assert_eq!(back.completed_slots(0, "job"), vec![]);
}

#[test]
fn inv9_slots_are_validated() {
    let mut e = setup(1);
    let too_long = "x".repeat(MAX_SLOT_BYTES + 1);
    let err = |n: usize| EngineError::InvalidSlot(format!("{n} bytes (must be 1 to {MAX_SLOT_BYTES})"));
    assert_rejected(&mut e, 0, complete(1, 1, 1, "", 0), err(0));
    assert_rejected(&mut e, 0, complete(1, 1, 1, &too_long, 0), err(MAX_SLOT_BYTES + 1));
    assert_rejected(&mut e, 0, once(1, 1, &too_long, ""), err(MAX_SLOT_BYTES + 1));
    let control = EngineError::InvalidSlot("must not contain control characters".into());
    assert_rejected(&mut e, 0, once(1, 1, "a\nb", ""), control);
    // An acquire once per a slot may wait (see the waiter tests below).
    assert_eq!(waiting(once(1, 1, "s", ""), 100).validate(), Ok(()));
    // The token is checked before the slot, as for a release.
    assert_rejected(&mut e, 0, complete(1, 1, 0, "", 0), EngineError::InvalidToken);
}

/// A lock keeps at most `MAX_SLOTS_PER_LOCK` records: one more drops the
/// oldest (its slot may run again, as after its retention), the others stay,
/// and completing a slot already recorded drops nothing.
#[test]
fn a_lock_keeps_at_most_max_slots_records_and_drops_the_oldest() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "job", 0, 0));
    let n = MAX_SLOTS_PER_LOCK as u64;
    for i in 0..n {
        // Within the lease's TTL (1000), in the order recorded.
        let reply = one(&mut e, i * 900 / n, complete(100 + i, 1, 1, &format!("s{i}"), 0)).0;
        assert_eq!(reply, Reply::SlotCompleted);
    }
    let n = 900;
    assert_eq!(one(&mut e, n, complete(5000, 1, 1, "s5", 9)).0, Reply::SlotCompleted);
    assert_eq!(e.completed_slots(0, "job").len(), MAX_SLOTS_PER_LOCK, "a slot recorded again drops nothing");
    assert_eq!(one(&mut e, n, complete(5001, 1, 1, "new", 0)).0, Reply::SlotCompleted);
    let slots: Vec<String> = e.completed_slots(0, "job").into_iter().map(|s| s.slot).collect();
    assert_eq!(slots.len(), MAX_SLOTS_PER_LOCK);
    assert!(!slots.contains(&"s0".to_string()), "the oldest is dropped");
    assert!(slots.contains(&"s1".to_string()) && slots.contains(&"new".to_string()));
    assert_eq!(slots[0], "new", "the most recently recorded first");
}

/// Lease 1 ("host-a:1") holds "job" for slot "s" (token 1); leases 2 and 3
/// wait for the same slot (requests 2, 3), lease 4 waits without a slot
/// (request 4), all queued at 0 for up to 900 ms.
fn three_wait() -> Engine {
    let mut e = setup(4);
    assert_eq!(one(&mut e, 0, once(1, 1, "s", "host-a:1")).0, Reply::Acquired(grant("job", 1, 1)));
    for (lease, req) in [(2, 2), (3, 3)] {
        one(&mut e, 0, waiting(once(req, lease, "s", ""), 900));
    }
    assert_eq!(one(&mut e, 0, acq(4, 4, "job", 900, 0)).0, Reply::Queued { position: 2 });
    e
}

/// Issue 18 §4: the holder completes the slot; the two waiters for that slot
/// are told who ran it in the step of the completion (never granted, no
/// token spent), the plain waiter behind them stays queued and is granted
/// token 2 at the release.
#[test]
fn waiters_for_a_slot_are_told_when_it_is_completed_and_the_next_waiter_is_granted() {
    let mut e = three_wait();
    let (reply, fx) = one(&mut e, 100, complete(10, 1, 1, "s", 0));
    assert_eq!(reply, Reply::SlotCompleted);
    assert_eq!(fx, vec![wait_done(2, 2, 1, "host-a:1", 0), wait_done(3, 3, 1, "host-a:1", 0)]);
    assert_eq!(e.lock_info(100, "job").unwrap().waiters.len(), 1, "the plain waiter stays");
    let (reply, fx) = one(&mut e, 200, rel(11, 1, "job", 1));
    assert_eq!(reply, Reply::Released);
    assert_eq!(fx, vec![released_a(1, 200, ReleaseCause::Released), granted(grant("job", 4, 2), 4, true, 200)]);
    let info = e.lock_info(200, "job").unwrap();
    assert_eq!((info.holders.len(), info.waiters.len()), (1, 0));
    // Their wait timers are gone: nothing happens at their deadline.
    assert_eq!(tick(&mut e, 900).effects, vec![]);
}

/// INV-6: a retry of a waiter's request after it was told gets the same
/// answer as a reply, and queues nothing.
#[test]
fn inv6_a_retry_of_a_waiter_told_its_slot_is_done_gets_the_same_answer() {
    let mut e = three_wait();
    one(&mut e, 100, complete(10, 1, 1, "s", 7));
    one(&mut e, 200, rel(11, 1, "job", 1));
    let (reply, fx) = one(&mut e, 300, waiting(once(2, 2, "s", ""), 900));
    assert_eq!((reply, fx), (done(1, "host-a:1", 7), vec![]));
    assert_eq!(e.lock_info(300, "job").unwrap().waiters, vec![]);
}

/// Without a completion the slot's waiters are granted in turn, as any waiter.
#[test]
fn waiters_for_a_slot_not_done_are_granted_in_turn() {
    let mut e = three_wait();
    let (_, fx) = one(&mut e, 200, rel(10, 1, "job", 1));
    assert_eq!(fx, vec![released_a(1, 200, ReleaseCause::Released), granted(grant("job", 2, 2), 2, true, 200)]);
}

/// A waiter for another slot of the same lock stays queued at the
/// completion and is granted at the release; one queued behind it for the
/// done slot is told so at the completion.
#[test]
fn a_waiter_for_another_slot_is_granted() {
    let mut e = setup(3);
    one(&mut e, 0, once(1, 1, "s", "host-a:1"));
    one(&mut e, 0, waiting(once(2, 2, "t", ""), 900));
    one(&mut e, 0, waiting(once(3, 3, "s", ""), 900));
    let (_, fx) = one(&mut e, 100, complete(10, 1, 1, "s", 0));
    assert_eq!(fx, vec![wait_done(3, 3, 1, "host-a:1", 0)]);
    let (_, fx) = one(&mut e, 200, rel(11, 1, "job", 1));
    assert_eq!(fx, vec![released_a(1, 200, ReleaseCause::Released), granted(grant("job", 2, 2), 2, true, 200)]);
    let (_, fx) = one(&mut e, 300, rel(12, 2, "job", 2));
    assert_eq!(fx, vec![released(grant("job", 2, 2), 100, ReleaseCause::Released)]);
    assert_eq!(e.lock_info(300, "job"), None, "nothing held, nothing queued: the lock's entry is gone");
}

/// Hold-at-least with once-per: the job ends early and completes its slot;
/// the waiter for that slot is told at once, although the lock stays closed
/// until the hold ends (a waiter need not wait out the hold to learn the job
/// ran).
#[test]
fn inv17_a_waiter_for_the_slot_is_told_before_the_hold_at_least_ends() {
    let mut e = setup(2);
    let held = match once(1, 1, "s", "host-a:1") {
        Command::Acquire(a) => Command::Acquire(Acquire { hold_at_least_ms: 500, ..a }),
        other => other,
    };
    one(&mut e, 0, held);
    one(&mut e, 0, waiting(once(2, 2, "s", ""), 900));
    let (_, fx) = one(&mut e, 100, complete(10, 1, 1, "s", 0));
    assert_eq!(fx, vec![wait_done(2, 2, 1, "host-a:1", 0)]);
    let o = batch(&mut e, 200, vec![rel(11, 1, "job", 1)]);
    assert_eq!(o, out(vec![Reply::Released], vec![released_a(1, 200, ReleaseCause::Released)], Some(500)));
    assert_eq!(tick(&mut e, 500).effects, vec![]);
    assert_eq!(e.lock_info(500, "job"), None);
}

/// A new lease made at `now` with `ttl_ms` by request `req`: its id.
fn fresh_lease(e: &mut Engine, now: Millis, req: u64, ttl_ms: u64) -> u64 {
    match one(e, now, new_lease(req, ttl_ms)).0 {
        Reply::LeaseGranted { lease, .. } => lease.0,
        other => panic!("no lease: {other:?}"),
    }
}

/// The holder's lease expires after completing its slot (the job ended, the
/// release was lost): the waiter was told at the completion, and the expiry
/// only ends the grant.
#[test]
fn a_waiter_for_the_slot_is_told_at_the_completion_not_at_the_expiry() {
    let mut e = setup(1);
    one(&mut e, 0, once(1, 1, "s", "host-a:1"));
    let second = fresh_lease(&mut e, 500, 2, 2000);
    one(&mut e, 500, waiting(once(3, second, "s", ""), 2000));
    let (_, fx) = one(&mut e, 600, complete(10, 1, 1, "s", 0));
    assert_eq!(fx, vec![wait_done(second, 3, 1, "host-a:1", 0)]);
    let fx = tick(&mut e, 1000).effects;
    assert_eq!(fx, vec![expired(1), released_a(1, 1000, ReleaseCause::Expired)]);
}
