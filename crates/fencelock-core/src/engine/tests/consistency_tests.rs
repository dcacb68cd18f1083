//! `check_consistency`: a state the engine reached passes; each kind of crafted
//! breach (what a forged or corrupted snapshot could carry) is named.

use super::harness::*;
use super::*;

/// One lease holding "a" (token 1) and another queued for it.
fn held_and_queued() -> Engine {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 0, acq(2, 2, "a", 500, 0));
    e.check_consistency().expect("a state the engine reached");
    e
}

fn refused(e: &Engine, what: &str) {
    let err = e.check_consistency().expect_err("a crafted state must be refused");
    assert!(err.contains(what), "{err:?} should mention {what:?}");
}

#[test]
fn a_real_state_passes() {
    let mut e = held_and_queued();
    one(&mut e, 10, rel(3, 1, "a", 1));
    e.check_consistency().expect("after a handoff");
    assert_eq!(Engine::new().check_consistency(), Ok(()));
}

#[test]
fn a_token_at_or_above_the_counter_is_refused() {
    let mut e = held_and_queued();
    e.next_token = 1;
    refused(&e, "not below the next token");
}

#[test]
fn a_hold_missing_on_either_side_is_refused() {
    let mut e = held_and_queued();
    e.leases.get_mut(&l(1)).unwrap().holds.clear();
    refused(&e, "the lease does not hold it");
    let mut e = held_and_queued();
    Arc::make_mut(e.locks.get_mut(&name("a")).unwrap()).holders.clear();
    refused(&e, "no such holder");
}

#[test]
fn a_wait_missing_on_either_side_is_refused() {
    let mut e = held_and_queued();
    e.leases.get_mut(&l(2)).unwrap().waits.change(|waits| waits.clear());
    refused(&e, "the lease does not wait for it");
    let mut e = held_and_queued();
    Arc::make_mut(e.locks.get_mut(&name("a")).unwrap()).queue.change(|q| q.clear());
    refused(&e, "no such waiter");
}

/// INV-18: a multi-acquire waits in every one of its queues.
#[test]
fn a_multi_acquire_missing_from_one_of_its_queues_is_refused() {
    let mut e = held_and_queued();
    let mut multi = acq(3, 2, "b", 500, 0);
    if let Command::Acquire(a) = &mut multi {
        a.also = vec!["a".into()];
    }
    one(&mut e, 0, multi);
    e.check_consistency().expect("a state the engine reached");
    let a = Arc::make_mut(e.locks.get_mut(&name("a")).unwrap());
    a.queue.change(|q| q.retain(|w| w.req != r(3)));
    refused(&e, "in a multi-acquire");
}

#[test]
fn two_holders_of_an_exclusive_lock_are_refused() {
    let mut e = held_and_queued();
    let lock = Arc::make_mut(e.locks.get_mut(&name("a")).unwrap());
    let mut second = lock.holders[0].clone();
    second.lease = l(2);
    lock.holders.push(second);
    refused(&e, "2 holders");
}

#[test]
fn invalid_names_ttls_and_counters_are_refused() {
    let json = serde_json::to_string(&held_and_queued()).unwrap();
    let bad_name: Engine = serde_json::from_str(&json.replace("\"a\"", "\"\"")).unwrap();
    refused(&bad_name, "name is empty");
    let mut e = held_and_queued();
    e.leases.get_mut(&l(1)).unwrap().ttl_ms = 0;
    refused(&e, "invalid ttl");
    let mut e = held_and_queued();
    let lease = e.leases.remove(&l(1)).unwrap();
    e.leases.insert(l(0), lease);
    refused(&e, "lease id 0");
    let mut e = held_and_queued();
    e.next_token = 0;
    refused(&e, "counters start at 1");
}

/// Completed slots are input too: too many for one lock, an invalid slot
/// name, or a token never issued is refused.
#[test]
fn crafted_slot_records_are_refused() {
    let mut e = held_and_queued();
    let complete = |slot: &str| Command::CompleteSlot {
        req: r(50),
        lease: l(1),
        lock: "a".into(),
        token: t(1),
        slot: slot.into(),
        exit_code: 0,
    };
    assert_eq!(one(&mut e, 0, complete("today")).0, Reply::SlotCompleted);
    e.check_consistency().expect("a slot the engine recorded");
    let json = serde_json::to_string(&e).unwrap();
    let bad: Engine = serde_json::from_str(&json.replace("\"today\"", "\"to\\u0007day\"")).unwrap();
    refused(&bad, "control characters");
    let mut bad = e.clone();
    bad.slots.get_mut(&name("a")).unwrap().get_mut("today").unwrap().token = t(7);
    refused(&bad, "never issued");
    let mut bad = e.clone();
    let record = bad.slots[&name("a")]["today"].clone();
    let slots = bad.slots.get_mut(&name("a")).unwrap();
    slots.extend((0..MAX_SLOTS_PER_LOCK).map(|i| (format!("s{i}"), record.clone())));
    refused(&bad, "completed slots (at most");
}

/// A restored engine holds nothing, reuses no lease id, and issues its next
/// token at the floor it was given, never below its own counter (INV-2).
#[test]
fn inv2_a_restored_engine_forgets_holders_and_raises_the_token_counter() {
    let e = held_and_queued();
    let restored = e.restored(1000);
    assert_eq!(restored.stats(), Stats { leases: 0, held_locks: 0, waiters: 0, tokens_issued: 0, token_counter: 999 });
    assert_eq!(restored.check_consistency(), Ok(()));
    assert_eq!(e.restored(0).next_token(), e.next_token(), "a floor below the counter changes nothing");
    let mut r = restored;
    let out = batch(&mut r, 0, vec![new_lease(900, TTL), acq(901, 3, "a", 0, 0)]);
    assert_eq!(out.replies[0], Reply::LeaseGranted { lease: l(3), ttl_ms: TTL }, "lease ids continue");
    assert_eq!(out.replies[1], Reply::Acquired(grant("a", 3, 1000)));
}

/// Issue 18 §4: a waiter's slot is a valid slot name, of a single acquire.
#[test]
fn a_waiter_with_an_invalid_slot_or_a_multi_acquire_with_one_is_refused() {
    let mut e = held_and_queued();
    let first_waiter_of_a = |e: &mut Engine, f: fn(&mut state::Waiter)| {
        Arc::make_mut(e.locks.get_mut(&name("a")).unwrap()).queue.change(|q| f(&mut q[0]));
    };
    first_waiter_of_a(&mut e, |w| w.once_per = "day".into());
    e.check_consistency().expect("a waiter once per a slot");
    first_waiter_of_a(&mut e, |w| w.once_per = "a\nb".into());
    refused(&e, "must not contain control characters");
    let mut e = held_and_queued();
    first_waiter_of_a(&mut e, |w| (w.once_per, w.all) = ("day".into(), vec![name("a")]));
    refused(&e, "a multi-acquire with a slot");
}
