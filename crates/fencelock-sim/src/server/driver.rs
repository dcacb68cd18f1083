//! The simulated server's shell around the real driver core
//! (`fencelock_server::driver_core::DriverCore`), in place of the real tokio
//! shell: callers are simulated connections, and the log is [`DurableLog`]
//! (a write is durable once it is in it) with the real engine applied after
//! it.
//!
//! What it does as the real shell does: every request that arrived goes to the
//! core in one step (group commit); the core keeps up to the run's
//! `max_inflight` writes in flight (with one, as the server's default, the
//! core lingers for the callers it just answered, as the real shell has it do,
//! the wait ended by a virtual timer of [`LINGER_MS`]), and the log persists every write queued
//! when its disk is free in one simulated fsync of 1–3 ms (the segment log's
//! group commit), then applies them in order and reports them to the core in
//! that order, which answers their callers (persist, then reply). A crash
//! mid-flight loses every write not in the log yet (nobody was answered for
//! them); a queued acquire's caller is woken by the core; when
//! a caller is done with an acquire (answered, woken) or went away (its
//! connection closed), the core is told, with the `CancelWait` to write in the
//! second case. The node is a single leader of term 1 from its start, so the
//! core's first write is `LeaderStart`. `now` is the virtual monotonic clock.
//!
//! What it leaves out: Raft replication, redb, gRPC (the process-level chaos
//! suite covers those).
//!
//! The mutants: `ReplyBeforePersist` reports a write to the core (which
//! answers) before it is in the log; `RacyCancel` brings back the old driver's
//! race (see the crate docs): acquires carry no generation and a closed
//! connection's cancels are plain commands, so a cancel is written even when a
//! retry of its acquire arrived since; `PartialMultiPush` pushes only the
//! first grant of a queued multi-acquire.
//!
//! [`DurableLog`]: super::log::DurableLog

use std::collections::BTreeMap;

use fencelock_core::{Command, Effect, Engine, Grant, Input, LeaseId, Output, Reply, RequestId};
use fencelock_server::driver_core::{Action, DriverCore, Event, Gen, Msg, RaftView, Time, WaitOutcome};
use tokio::sync::mpsc;

use super::log::{ServerShared, WritePhase};

/// The simulated server's linger (the real one's is 200 µs): the virtual
/// clock counts milliseconds.
pub const LINGER_MS: u64 = 1;
use crate::{
    clock::{now_ms, sleep_ms, sleep_until_opt, token_floor},
    config::Mutant,
    event::EventKind,
    wire::{Push, PushOutcome, Request, ServerMsg},
};

/// Identifies one accepted connection for the life of a server process.
pub type ConnId = u64;

/// The most commands in one batch.
const MAX_BATCH: usize = 64;

/// What connection tasks tell the driver.
#[derive(Debug)]
pub enum ToDriver {
    Opened { conn: ConnId, tx: mpsc::UnboundedSender<ServerMsg> },
    Request { conn: ConnId, req: Request },
    Closed { conn: ConnId },
}

type Key = (LeaseId, RequestId);

/// Where a reply goes: the connection, the request's id on it, and for an
/// acquire its key, generation and lock.
#[derive(Debug)]
struct Origin {
    conn: ConnId,
    id: u64,
    acquire: Option<(Key, Gen, String)>,
}

/// Who is woken when a queued acquire's wait ends.
#[derive(Debug)]
struct Waiter {
    conn: ConnId,
    key: Key,
    gen: Gen,
}

/// The driver task's state. It is the engine's only writer.
pub struct Driver {
    engine: Engine,
    shared: ServerShared,
    rx: mpsc::UnboundedReceiver<ToDriver>,
    conns: BTreeMap<ConnId, mpsc::UnboundedSender<ServerMsg>>,
    core: DriverCore<Origin, Waiter>,
    /// Per connection, its acquires whose callers are not done: key →
    /// (generation, lock, answered `Queued`).
    acquires: BTreeMap<ConnId, BTreeMap<Key, (Gen, String, bool)>>,
    next_gen: u64,
    /// Writes the core asked for (with their sequence numbers), not on their
    /// way to disk yet: the next fsync takes them all.
    queued: Vec<(u64, Input)>,
    /// The writes of the fsync under way, and when it ends.
    flushing: Vec<(u64, Input)>,
    flush_at: Option<u64>,
    /// Until the first write is done: how many entries the start replayed.
    up: Option<usize>,
    /// When the core's wait for the callers just answered ends (see [`LINGER_MS`]).
    linger_at: Option<u64>,
    /// Events the last actions caused (callers done or gone), for the next
    /// step: as in the real shell, they come after the messages that had
    /// arrived by then.
    followups: Vec<Event<Origin, Waiter>>,
}

impl Driver {
    pub fn new(engine: Engine, shared: ServerShared, rx: mpsc::UnboundedReceiver<ToDriver>) -> Self {
        let mut core = DriverCore::new(MAX_BATCH).with_max_inflight(shared.max_inflight);
        core.set_linger(shared.max_inflight == 1);
        Self {
            engine,
            shared,
            rx,
            conns: BTreeMap::new(),
            core,
            acquires: BTreeMap::new(),
            next_gen: 1,
            queued: Vec::new(),
            flushing: Vec::new(),
            flush_at: None,
            up: None,
            linger_at: None,
            followups: Vec::new(),
        }
    }

    /// Lead from now on: write `LeaderStart`, then serve (until the host crashes).
    pub async fn run(mut self, replayed: usize) {
        let leader = RaftView { is_leader: true, term: 1, voters: 1, ..RaftView::default() };
        self.up = Some(replayed);
        self.step(vec![Event::Raft(leader)]);
        loop {
            if self.flush_at.is_none() && !self.queued.is_empty() {
                self.start_flush();
                continue;
            }
            if !self.followups.is_empty() {
                let mut events = Vec::new();
                while let Ok(msg) = self.rx.try_recv() {
                    events.extend(self.on_msg(msg));
                }
                events.append(&mut self.followups);
                self.step(events);
                continue;
            }
            tokio::select! {
                biased;
                () = sleep_until_opt(self.flush_at) => self.finish_flush().await,
                msg = self.rx.recv() => match msg {
                    Some(msg) => {
                        let mut events = self.on_msg(msg);
                        while let Ok(msg) = self.rx.try_recv() {
                            events.extend(self.on_msg(msg));
                        }
                        self.step(events);
                    }
                    None => std::future::pending::<()>().await,
                },
                () = sleep_until_opt(self.core.next_wake()) => self.step(vec![Event::Timer]),
                () = sleep_until_opt(self.linger_at) => {
                    self.linger_at = None;
                    self.step(vec![Event::LingerOver]);
                }
            }
        }
    }

    /// Gives the core `events` at the current virtual time and does what it
    /// answers; what that causes waits in `followups`.
    fn step(&mut self, events: Vec<Event<Origin, Waiter>>) {
        let time = Time { now: now_ms(), token_floor: token_floor() };
        for action in self.core.step(time, events) {
            if let Some(e) = self.execute(action) {
                self.followups.push(e);
            }
        }
        // As the real shell's timer: armed when the core starts holding a
        // write back, disarmed when it stops.
        self.linger_at = match self.core.lingering() {
            true => self.linger_at.or(Some(time.now + LINGER_MS)),
            false => None,
        };
    }

    /// Does `action`; the event it causes, if any (an acquire's caller is done).
    fn execute(&mut self, action: Action<Origin, Waiter>) -> Option<Event<Origin, Waiter>> {
        match action {
            Action::Write(seq, input) => {
                self.queued.push((seq, input));
                None
            }
            Action::Reply(to, reply) => {
                let Ok(reply) = reply else { return None };
                let queued = matches!(reply, Reply::Queued { .. });
                self.send(to.conn, ServerMsg::Reply { id: to.id, reply });
                let (key, gen, lock) = to.acquire?;
                match queued {
                    false => self.done(to.conn, key, gen),
                    true => self.queued(to.conn, key, gen, lock),
                }
            }
            Action::Wake(w, Ok(outcome)) => {
                let outcome = match outcome {
                    WaitOutcome::Granted { grant, .. } => PushOutcome::Granted(grant),
                    WaitOutcome::Ended(why) => PushOutcome::Ended(why),
                    WaitOutcome::GrantedAll { grants, .. } => self.granted_all(grants),
                };
                let (lease, req) = w.key;
                self.send(w.conn, ServerMsg::Push(Push { lease, req, outcome }));
                self.done(w.conn, w.key, w.gen)
            }
            Action::Wake(_, Err(_)) | Action::Ready(_) | Action::Batched(_) | Action::Effect(_) => None,
        }
    }

    /// The push for a queued multi-acquire's grants; under
    /// [`Mutant::PartialMultiPush`] only the first of them.
    fn granted_all(&self, mut grants: Vec<Grant>) -> PushOutcome {
        if self.shared.mutant == Mutant::PartialMultiPush {
            grants.truncate(1);
        }
        PushOutcome::GrantedAll(grants)
    }

    /// The acquire `gen` of `key` on `conn` is queued. Under `RacyCancel`, as
    /// the old driver did, a caller that left while it was written gets its
    /// cancel now, after the entry (a retry may be about to arrive).
    fn queued(&mut self, conn: ConnId, key: Key, gen: Gen, lock: String) -> Option<Event<Origin, Waiter>> {
        if let Some(a) = self.acquires.get_mut(&conn).and_then(|m| m.get_mut(&key)).filter(|a| a.0 == gen) {
            a.2 = true;
        }
        let left = !self.conns.contains_key(&conn);
        let (lease, req) = key;
        let cancel = Command::CancelWait { req, lease, lock };
        (self.racy_cancel() && left).then_some(Event::Request(Msg {
            cmd: cancel,
            reply: None,
            waiter: None,
            gen: None,
        }))
    }

    /// The caller of acquire `gen` of `key` on `conn` has its outcome.
    fn done(&mut self, conn: ConnId, key: Key, gen: Gen) -> Option<Event<Origin, Waiter>> {
        let mine = self.acquires.get_mut(&conn)?;
        if mine.get(&key).is_some_and(|(g, ..)| *g == gen) {
            mine.remove(&key);
        }
        Some(Event::AcquireGone { key, gen, cancel: None })
    }

    fn on_msg(&mut self, msg: ToDriver) -> Vec<Event<Origin, Waiter>> {
        match msg {
            ToDriver::Opened { conn, tx } => {
                self.conns.insert(conn, tx);
                Vec::new()
            }
            ToDriver::Request { conn, req } => self.on_request(conn, req),
            ToDriver::Closed { conn } => self.on_closed(conn),
        }
    }

    /// A request; an acquire that re-asks (same lease and request id) on the
    /// same connection supersedes that connection's earlier caller of it,
    /// which is done.
    fn on_request(&mut self, conn: ConnId, req: Request) -> Vec<Event<Origin, Waiter>> {
        let Command::Acquire(a) = &req.cmd else {
            let origin = Origin { conn, id: req.id, acquire: None };
            return vec![Event::Request(Msg { cmd: req.cmd, reply: Some(origin), waiter: None, gen: None })];
        };
        let key = (a.lease, a.req);
        let gen = Gen { attempt: req.attempt, arrival: self.next_gen };
        self.next_gen += 1;
        let replaced = self.acquires.entry(conn).or_default().insert(key, (gen, a.lock.clone(), false));
        let mut events: Vec<_> =
            replaced.map(|(old, ..)| Event::AcquireGone { key, gen: old, cancel: None }).into_iter().collect();
        let waiter = Waiter { conn, key, gen };
        let origin = Origin { conn, id: req.id, acquire: Some((key, gen, a.lock.clone())) };
        // The old driver's way: no generations, so no ownership of the wait.
        let owned = (!self.racy_cancel()).then_some(gen);
        events.push(Event::Request(Msg { cmd: req.cmd, reply: Some(origin), waiter: Some(waiter), gen: owned }));
        events
    }

    fn racy_cancel(&self) -> bool {
        self.shared.mutant == Mutant::RacyCancel
    }

    /// The callers behind `conn` went away: each acquire they were not done
    /// with gets its cancel (which the core writes only for a wait's newest
    /// owner).
    fn on_closed(&mut self, conn: ConnId) -> Vec<Event<Origin, Waiter>> {
        self.conns.remove(&conn);
        let gone = self.acquires.remove(&conn).unwrap_or_default();
        let racy = self.racy_cancel();
        // Under `RacyCancel`, an acquire not answered yet is cancelled when
        // it is (see `queued`).
        gone.into_iter()
            .filter(|(_, (_, _, queued))| !racy || *queued)
            .map(|((lease, req), (gen, lock, _))| {
                let cancel = Command::CancelWait { req, lease, lock };
                match racy {
                    true => Event::Request(Msg { cmd: cancel, reply: None, waiter: None, gen: None }),
                    false => Event::AcquireGone { key: (lease, req), gen, cancel: Some(cancel) },
                }
            })
            .collect()
    }

    /// The disk takes every queued write into one fsync (under the mutant
    /// [`Mutant::ReplyBeforePersist`], the core is told they are written, and
    /// answers, before it starts).
    fn start_flush(&mut self) {
        self.flushing = std::mem::take(&mut self.queued);
        if self.shared.mutant == Mutant::ReplyBeforePersist {
            let written = self.apply_all();
            self.step(written);
        }
        self.shared.phase.set(WritePhase::Syncing);
        self.flush_at = Some(now_ms() + self.shared.fsync_ms());
    }

    /// The fsync ended: its writes are in the log, in order; they are applied
    /// in that order and, after the reply window, reported to the core in the
    /// reverse order (the real shell reports them in order; the core must act
    /// on them in proposal order whatever order they are reported in, and this
    /// makes the runs check that it does).
    async fn finish_flush(&mut self) {
        self.flush_at = None;
        for (_, input) in &self.flushing {
            self.shared.log.append(input.clone());
        }
        if self.shared.mutant == Mutant::ReplyBeforePersist {
            self.flushing.clear();
            self.shared.phase.set(WritePhase::Idle);
            return self.server_up();
        }
        let mut written = self.apply_all();
        written.reverse();
        self.flushing.clear();
        self.shared.phase.set(WritePhase::Replying);
        sleep_ms(1).await;
        self.shared.phase.set(WritePhase::Idle);
        self.step(written);
        self.server_up();
    }

    /// Applies the writes of the fsync, in order: their `Written` events.
    fn apply_all(&mut self) -> Vec<Event<Origin, Waiter>> {
        let inputs: Vec<(u64, Input)> = self.flushing.clone();
        inputs.into_iter().map(|(seq, input)| Event::Written(seq, Ok(self.apply(&input)))).collect()
    }

    /// The first write is done: the server is up.
    fn server_up(&mut self) {
        if let Some(replayed) = self.up.take() {
            self.shared.events.push(EventKind::ServerUp { replayed });
        }
    }

    fn apply(&mut self, input: &Input) -> Output {
        let out = self.engine.step(input);
        for e in &out.effects {
            if let Some(kind) = effect_event(e) {
                self.shared.events.push(kind);
            }
        }
        out
    }

    fn send(&self, conn: ConnId, msg: ServerMsg) {
        if let Some(tx) = self.conns.get(&conn) {
            let _ = tx.send(msg);
        }
    }
}

/// The trace event for an engine effect, if it is one the checkers use.
fn effect_event(e: &Effect) -> Option<EventKind> {
    match e {
        Effect::Granted { grant, req, queued, .. } => {
            Some(EventKind::Granted { lease: grant.lease, req: *req, token: grant.token, queued: *queued })
        }
        Effect::Released { grant, cause, .. } => {
            Some(EventKind::Released { lease: grant.lease, token: grant.token, cause: *cause })
        }
        Effect::LeaseExpired { lease } => Some(EventKind::LeaseExpired { lease: *lease }),
        Effect::WaitEnded { .. } | Effect::ValueChanged { .. } | Effect::Downgraded { .. } => None,
    }
}
