//! Events, engine outputs and a ready core, for the driver core's tests.
//! Callers are answered through plain ids: `R = W = u32`.

use fencelock_core::{
    Acquire, Command, Effect, Grant, Input, LeaseId, LockName, Millis, Output, Reply, RequestId, Token,
};

pub use crate::driver::core::{Action, DriverCore, Event, Gen, Msg, RaftView, Time, WaitOutcome};
pub use crate::driver::DriverError;

pub type Core = DriverCore<u32, u32>;
pub type A = Action<u32, u32>;
pub type E = Event<u32, u32>;

/// The token floor every test `LeaderStart` carries.
pub const FLOOR: u64 = 7;

pub fn at(now: Millis) -> Time {
    Time { now, token_floor: FLOOR }
}

/// This node leads `term` (a group of one).
pub fn leads(term: u64) -> E {
    Event::Raft(RaftView { is_leader: true, term, voters: 1, ..RaftView::default() })
}

/// Another node leads, at `addr`.
pub fn follows(term: u64, addr: &str) -> E {
    Event::Raft(RaftView { term, leader_addr: Some(addr.into()), voters: 3, ..RaftView::default() })
}

/// Write `seq`: the `LeaderStart` at `now`.
pub fn leader_start(seq: u64, now: Millis) -> A {
    Action::Write(seq, Input::LeaderStart { now, token_floor: FLOOR, cluster_id: None })
}

/// A follower core with one write in flight at a time (the driver before
/// pipelining: the tests that pin exact batching use it).
pub fn core(max_batch: usize) -> Core {
    Core::new(max_batch).with_max_inflight(1)
}

/// A core (one write in flight at a time) that leads term 1 with its
/// `LeaderStart` (write 1) applied, at time 10: its next write is 2.
pub fn ready(max_batch: usize) -> Core {
    ready_with(core(max_batch))
}

/// `c`, leading term 1 with its `LeaderStart` (write 1) applied, at time 10.
pub fn ready_with(mut c: Core) -> Core {
    assert_eq!(c.step(at(0), [leads(1)]), vec![leader_start(1, 0)]);
    assert_eq!(c.step(at(10), [written(1, vec![], vec![], None)]), vec![Action::Ready(true)]);
    c
}

/// Write `seq` succeeded with these replies and effects.
pub fn written(seq: u64, replies: Vec<Reply>, effects: Vec<Effect>, next_deadline: Option<Millis>) -> E {
    Event::Written(seq, Ok(Output { replies, effects, next_deadline }))
}

pub fn keep(lease: u64, req: u64) -> Command {
    Command::KeepAlive { req: RequestId(req), lease: LeaseId(lease) }
}

/// Caller `id` sends `cmd` and awaits the reply.
pub fn request(id: u32, cmd: Command) -> E {
    Event::Request(Msg { cmd, reply: Some(id), waiter: None, gen: None })
}

pub fn acquire_cmd(lease: u64, req: u64, lock: &str) -> Command {
    Command::Acquire(Acquire::exclusive(RequestId(req), LeaseId(lease), lock, 1000))
}

/// The `n`th acquire to arrive, from a client that sends no attempt number.
pub fn nth(n: u64) -> Gen {
    Gen { attempt: 0, arrival: n }
}

/// Caller `id` sends a waiting acquire of generation `gen`, woken through `id` too.
pub fn acquire(id: u32, gen: Gen, lease: u64, req: u64, lock: &str) -> E {
    Event::Request(Msg { cmd: acquire_cmd(lease, req, lock), reply: Some(id), waiter: Some(id), gen: Some(gen) })
}

/// The caller of acquire `gen` of (lease, req) went away mid-flight.
pub fn gone(gen: Gen, lease: u64, req: u64, lock: &str) -> E {
    let cancel = Command::CancelWait { req: RequestId(req), lease: LeaseId(lease), lock: lock.into() };
    Event::AcquireGone { key: (LeaseId(lease), RequestId(req)), gen, cancel: Some(cancel) }
}

/// The caller of acquire `gen` of (lease, req) got its outcome.
pub fn done(gen: Gen, lease: u64, req: u64) -> E {
    Event::AcquireGone { key: (LeaseId(lease), RequestId(req)), gen, cancel: None }
}

/// Write `seq`: a batch of `cmds` at `now`.
pub fn batch(seq: u64, now: Millis, cmds: Vec<Command>) -> A {
    Action::Write(seq, Input::Batch { now, cmds })
}

pub fn grant(lock: &str, lease: u64, token: u64) -> Grant {
    Grant { lock: LockName::new(lock).unwrap(), lease: LeaseId(lease), token: Token(token) }
}

pub fn granted(lock: &str, lease: u64, req: u64, token: u64) -> Effect {
    let mode = fencelock_core::Mode::Exclusive;
    Effect::Granted {
        grant: grant(lock, lease, token),
        req: RequestId(req),
        queued: true,
        waited_ms: 5,
        tag: None,
        mode,
    }
}

pub fn kept(lease: u64) -> Reply {
    Reply::LeaseKept { lease: LeaseId(lease), ttl_ms: 1000 }
}

pub fn not_leader(addr: Option<&str>) -> Result<Reply, DriverError> {
    Err(DriverError::NotLeader { leader: addr.map(str::to_string) })
}
