//! Resizing a semaphore ([`Command::Resize`], issue 18 §2): a resize up
//! grants the queue at once; a resize never leaves fewer permits than are in
//! use or than one waiter asks for; only a semaphore can be resized; inside
//! an `As` only an admin may.
//!
//! Invariants: INV-15 (never more than N permits in use, with N the current
//! number), INV-16 (the queue is granted from its head, no barging), INV-9
//! (a refused resize changes nothing).

use super::harness::*;
use super::*;

/// An acquire of `weight` permits of the semaphore `lock` of `permits`.
fn sem(req: u64, lease: u64, lock: &str, wait_ms: u64, permits: u32, weight: u32) -> Command {
    let mut c = acq(req, lease, lock, wait_ms, 0);
    if let Command::Acquire(a) = &mut c {
        (a.permits, a.weight) = (permits, weight);
    }
    c
}

fn resize(lock: &str, permits: u32) -> Command {
    Command::Resize { lock: lock.into(), permits }
}

fn as_caller(admin: bool, cmd: Command) -> Command {
    Command::As { caller: Caller { name: "ops".into(), admin }, cmd: Box::new(cmd) }
}

#[test]
fn inv15_a_resize_up_grants_the_queue_at_once_in_order() {
    let mut e = setup(4);
    batch(&mut e, 0, vec![sem(1, 1, "s", 0, 2, 1), sem(2, 2, "s", 0, 2, 1)]);
    assert_eq!(one(&mut e, 0, sem(3, 3, "s", 500, 2, 1)).0, Reply::Queued { position: 0 });
    assert_eq!(one(&mut e, 0, sem(4, 4, "s", 500, 2, 2)).0, Reply::Queued { position: 1 });
    // Three permits: the first waiter fits, the second (weight 2) does not and
    // holds back nobody behind it, since there is nobody.
    let fx = vec![granted(grant("s", 3, 3), 3, true, 10)];
    assert_eq!(one(&mut e, 10, resize("s", 3)), (Reply::Resized { was: 2 }, fx));
    let fx = vec![granted(grant("s", 4, 4), 4, true, 20)];
    assert_eq!(one(&mut e, 20, resize("s", 5)), (Reply::Resized { was: 3 }, fx));
    assert_eq!(e.lock_info(20, "s").map(|i| (i.permits, i.holders.len())), Some((5, 4)));
}

#[test]
fn inv15_acquires_must_name_the_new_number() {
    let mut e = setup(2);
    one(&mut e, 0, sem(1, 1, "s", 0, 2, 1));
    assert_eq!(one(&mut e, 0, resize("s", 4)).0, Reply::Resized { was: 2 });
    let err = EngineError::PermitsMismatch { lock_has: 4, asked: 2 };
    assert_rejected(&mut e, 0, sem(2, 2, "s", 0, 2, 1), err);
    assert_eq!(one(&mut e, 0, sem(3, 2, "s", 0, 4, 1)).0, Reply::Acquired(grant("s", 2, 2)));
}

#[test]
fn inv15_a_resize_never_leaves_fewer_permits_than_in_use_or_than_a_waiter_needs() {
    let mut e = setup(3);
    one(&mut e, 0, sem(1, 1, "s", 0, 4, 3));
    assert_rejected(&mut e, 0, resize("s", 2), EngineError::ResizeTooSmall { asked: 2, needed: 3 });
    one(&mut e, 0, sem(2, 2, "s", 500, 4, 4));
    assert_rejected(&mut e, 0, resize("s", 3), EngineError::ResizeTooSmall { asked: 3, needed: 4 });
    // Down to what is needed: nothing more is granted, nobody loses a permit.
    assert_eq!(one(&mut e, 0, resize("s", 4)), (Reply::Resized { was: 4 }, vec![]));
    assert_rejected(&mut e, 0, resize("s", 0), EngineError::ResizeTooSmall { asked: 0, needed: 1 });
}

#[test]
fn inv9_only_a_semaphore_that_exists_can_be_resized() {
    let mut e = setup(1);
    let not = |lock: &str| EngineError::NotASemaphore { lock: lock.into() };
    assert_rejected(&mut e, 0, resize("nobody", 3), not("nobody"));
    one(&mut e, 0, acq(1, 1, "rw", 0, 0));
    assert_rejected(&mut e, 0, resize("rw", 3), not("rw"));
    let bad = LockName::new("").unwrap_err();
    assert_rejected(&mut e, 0, resize("", 3), EngineError::InvalidName(bad));
}

#[test]
fn inv13_inside_an_as_only_an_admin_resizes() {
    let mut e = setup(2);
    batch(&mut e, 0, vec![sem(1, 1, "s", 0, 1, 1), sem(2, 2, "s", 500, 1, 1)]);
    assert_rejected(&mut e, 0, as_caller(false, resize("s", 2)), EngineError::NotAdmin);
    let fx = vec![granted(grant("s", 2, 2), 2, true, 0)];
    assert_eq!(one(&mut e, 0, as_caller(true, resize("s", 2))), (Reply::Resized { was: 1 }, fx));
}
