//! Builders for inputs and expected outputs, so each test reads as
//! "input at instant t -> exactly these replies and effects".

use super::*;

/// The TTL of the leases made by [`setup`].
pub const TTL: u64 = 1000;

pub fn r(n: u64) -> RequestId {
    RequestId(n)
}

pub fn l(n: u64) -> LeaseId {
    LeaseId(n)
}

pub fn t(n: u64) -> Token {
    Token(n)
}

pub fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

pub fn grant(lock: &str, lease: u64, token: u64) -> Grant {
    Grant { lock: name(lock), lease: l(lease), token: t(token) }
}

pub fn new_lease(req: u64, ttl_ms: u64) -> Command {
    Command::GrantLease { req: r(req), ttl_ms, id: None }
}

pub fn keep(req: u64, lease: u64) -> Command {
    Command::KeepAlive { req: r(req), lease: l(lease) }
}

pub fn revoke(req: u64, lease: u64) -> Command {
    Command::Revoke { req: r(req), lease: l(lease) }
}

/// Acquire `lock` for `lease`, waiting up to `wait_ms`, with lock-delay `delay`.
pub fn acq(req: u64, lease: u64, lock: &str, wait_ms: u64, delay: u64) -> Command {
    Command::Acquire(Acquire { lock_delay_ms: delay, ..Acquire::exclusive(r(req), l(lease), lock, wait_ms) })
}

pub fn rel(req: u64, lease: u64, lock: &str, token: u64) -> Command {
    Command::Release { req: r(req), lease: l(lease), lock: lock.to_string(), token: t(token) }
}

pub fn cancel(req: u64, lease: u64, lock: &str) -> Command {
    Command::CancelWait { req: r(req), lease: l(lease), lock: lock.to_string() }
}

pub fn granted(g: Grant, req: u64, queued: bool, waited_ms: u64) -> Effect {
    Effect::Granted { grant: g, req: r(req), queued, waited_ms, tag: None, mode: Mode::Exclusive }
}

pub fn released(g: Grant, held_ms: u64, cause: ReleaseCause) -> Effect {
    Effect::Released { grant: g, held_ms, cause, tag: None }
}

pub fn wait_ended(lock: &str, lease: u64, req: u64, why: WaitEnd) -> Effect {
    Effect::WaitEnded { lock: name(lock), lease: l(lease), req: r(req), why }
}

pub fn expired(lease: u64) -> Effect {
    Effect::LeaseExpired { lease: l(lease) }
}

/// A `Busy` of a lock with one holder (or none).
pub fn busy(holder: Option<Grant>, reopens_in_ms: Option<u64>, waiters: u32) -> Reply {
    let holders = u32::from(holder.is_some());
    Reply::Busy(Busy { holder, holders, reopens_in_ms, waiters })
}

pub fn out(replies: Vec<Reply>, effects: Vec<Effect>, next: Option<Millis>) -> Output {
    Output { replies, effects, next_deadline: next }
}

pub fn batch(e: &mut Engine, now: Millis, cmds: Vec<Command>) -> Output {
    e.step(&Input::Batch { now, cmds })
}

pub fn tick(e: &mut Engine, now: Millis) -> Output {
    batch(e, now, vec![])
}

/// Apply one command at `now`; return its reply and the effects.
pub fn one(e: &mut Engine, now: Millis, cmd: Command) -> (Reply, Vec<Effect>) {
    let mut o = batch(e, now, vec![cmd]);
    assert_eq!(o.replies.len(), 1);
    (o.replies.remove(0), o.effects)
}

/// An engine at instant 0 with leases 1..=n (TTL [`TTL`], deadline 1000),
/// created by requests 101, 102, ...
pub fn setup(n: u64) -> Engine {
    let mut e = Engine::new();
    let cmds = (1..=n).map(|i| new_lease(100 + i, TTL)).collect();
    let o = batch(&mut e, 0, cmds);
    assert!(o.replies.iter().all(|r| matches!(r, Reply::LeaseGranted { .. })));
    e
}

/// Assert that `cmd` at `now` is rejected with `err` and changes nothing (INV-9).
/// The engine is first ticked to `now`, so only the command itself is judged.
///
/// Also: [`Command::validate`], which the server runs before proposing, refuses
/// the command with the same error when the error does not depend on state, and
/// lets it through when it does (only the engine knows which leases exist).
pub fn assert_rejected(e: &mut Engine, now: Millis, cmd: Command, err: EngineError) {
    let stateless = match err {
        EngineError::LeaseNotFound(_) | EngineError::PermitsMismatch { .. } | EngineError::NotASemaphore { .. } => {
            Ok(())
        }
        EngineError::NotAdmin => Ok(()),
        EngineError::ResizeTooSmall { asked, .. } if asked > 0 => Ok(()),
        _ => Err(err.clone()),
    };
    assert_eq!(cmd.validate(), stateless, "validate() and the engine disagree on {cmd:?}");
    tick(e, now);
    let before = e.clone();
    let (reply, fx) = one(e, now, cmd);
    assert_eq!(reply, Reply::Rejected(err));
    assert_eq!(fx, vec![]);
    assert_eq!(*e, before, "INV-9: a rejected command changed the engine");
}
