//! A model of `fencelock-server`'s driver loop, around the real engine.
//!
//! It keeps the real driver's contract (see `fencelock-server/src/driver.rs`):
//! - **Persist, then reply.** A batch is written to the durable log (a simulated
//!   fsync of 1–3 ms) before the engine applies it and before any reply or push.
//! - **Group commit.** Requests that arrive while a batch is written wait, and all
//!   of them go into the next `Input::Batch`.
//! - **Time.** `now` is the virtual monotonic clock in milliseconds; when the
//!   engine reports a next deadline the driver writes an empty batch (a tick) then.
//! - **Leadership.** After a (re)start the first entry written is `LeaderStart`.
//! - **Waiters.** An acquire's connection owns its (lease, req) from the moment
//!   the request arrives; the grant or the end of the wait is pushed to the owner.
//!   When the owner closes, its waits are cancelled with `CancelWait`, as the real
//!   driver does when a caller goes away.
//!
//! One deliberate difference: a retried acquire (same lease and request id)
//! supersedes a `CancelWait` of that acquire that is not written yet, and takes
//! the ownership over, so a cancel never ends the wait of a caller that is still
//! there. The real driver registers a waiter only from the `Queued` reply and
//! writes the cancel anyway: with the cancel and the retry in one batch, the
//! cancel's `WaitEnded{Cancelled}` wakes the retry, whose caller is told
//! `TimedOut` while its acquire stays queued, and the grant it later gets is held
//! by nobody for as long as the lease is kept alive. [`Mutant::RacyCancel`]
//! brings that behaviour back.
//!
//! What it leaves out: Raft replication, redb, gRPC (the process-level chaos suite
//! covers those).

use std::collections::{BTreeMap, VecDeque};

use fencelock_core::{Command, Effect, Engine, Input, LeaseId, Millis, Output, Reply, RequestId};
use tokio::sync::mpsc;

use super::log::{ServerShared, WritePhase};
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
    Opened {
        conn: ConnId,
        tx: mpsc::UnboundedSender<ServerMsg>,
    },
    Request {
        conn: ConnId,
        req: Request,
    },
    Closed {
        conn: ConnId,
    },
}

/// Where a reply goes: (connection, request id on that connection). Commands the
/// driver makes itself (`CancelWait`) have none.
type Origin = Option<(ConnId, u64)>;

struct Pending {
    origin: Origin,
    cmd: Command,
}

/// A queued acquire whose outcome is owed to a connection.
struct Waiter {
    conn: ConnId,
    lock: String,
}

/// The driver task's state. It is the engine's only writer.
pub struct Driver {
    engine: Engine,
    shared: ServerShared,
    rx: mpsc::UnboundedReceiver<ToDriver>,
    conns: BTreeMap<ConnId, mpsc::UnboundedSender<ServerMsg>>,
    waiters: BTreeMap<(LeaseId, RequestId), Waiter>,
    pending: VecDeque<Pending>,
    /// The engine's next deadline: write a tick then.
    tick_at: Option<Millis>,
}

impl Driver {
    pub fn new(
        engine: Engine,
        shared: ServerShared,
        rx: mpsc::UnboundedReceiver<ToDriver>,
    ) -> Self {
        Self {
            engine,
            shared,
            rx,
            conns: BTreeMap::new(),
            waiters: BTreeMap::new(),
            pending: VecDeque::new(),
            tick_at: None,
        }
    }

    /// Write `LeaderStart`, then serve batches forever (until the host crashes).
    pub async fn run(mut self, replayed: usize) {
        // The token floor from the virtual wall clock, as the real server's
        // from the real one: tokens jump at restarts, as they do there.
        let input = Input::LeaderStart { now: now_ms(), token_floor: token_floor(), cluster_id: None };
        self.write(input, Vec::new())
            .await;
        self.shared.events.push(EventKind::ServerUp { replayed });
        loop {
            self.wait_for_work().await;
            let n = self.pending.len().min(MAX_BATCH);
            let (origins, cmds) = self.pending.drain(..n).map(|p| (p.origin, p.cmd)).unzip();
            self.write(
                Input::Batch {
                    now: now_ms(),
                    cmds,
                },
                origins,
            )
            .await;
        }
    }

    /// Until there is a command to write or a tick is due.
    async fn wait_for_work(&mut self) {
        loop {
            while let Ok(msg) = self.rx.try_recv() {
                self.on_msg(msg);
            }
            if !self.pending.is_empty() || self.tick_due() {
                return;
            }
            tokio::select! {
                biased;
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.on_msg(msg),
                    None => std::future::pending::<()>().await,
                },
                () = sleep_until_opt(self.tick_at) => {}
            }
        }
    }

    fn tick_due(&self) -> bool {
        self.tick_at.is_some_and(|t| now_ms() >= t)
    }

    fn on_msg(&mut self, msg: ToDriver) {
        match msg {
            ToDriver::Opened { conn, tx } => {
                self.conns.insert(conn, tx);
            }
            ToDriver::Request { conn, req } => self.on_request(conn, req),
            ToDriver::Closed { conn } => self.on_closed(conn),
        }
    }

    fn on_request(&mut self, conn: ConnId, req: Request) {
        if let (Command::Acquire(a), false) = (&req.cmd, self.racy_cancel()) {
            // A retry supersedes an unwritten cancel of the same acquire, and its
            // connection owns the wait from now on.
            let key = (a.lease, a.req);
            self.pending
                .retain(|p| p.origin.is_some() || !cancels(&p.cmd, key));
            self.waiters.insert(
                key,
                Waiter {
                    conn,
                    lock: a.lock.clone(),
                },
            );
        }
        let origin = Some((conn, req.id));
        self.pending.push_back(Pending {
            origin,
            cmd: req.cmd,
        });
    }

    fn racy_cancel(&self) -> bool {
        self.shared.mutant == Mutant::RacyCancel
    }

    /// The caller behind `conn` went away: cancel the waits it owns.
    fn on_closed(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
        let gone: Vec<_> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.conn == conn)
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            if let Some(w) = self.waiters.remove(&key) {
                self.cancel_later(key, w.lock);
            }
        }
    }

    fn cancel_later(&mut self, (lease, req): (LeaseId, RequestId), lock: String) {
        let cmd = Command::CancelWait { req, lease, lock };
        self.pending.push_back(Pending { origin: None, cmd });
    }

    /// Persist `input`, apply it, then reply (or, as a mutant, the reverse).
    async fn write(&mut self, input: Input, origins: Vec<Origin>) {
        if self.shared.mutant == Mutant::ReplyBeforePersist {
            return self.write_reply_first(input, origins).await;
        }
        self.shared.phase.set(WritePhase::Syncing);
        sleep_ms(self.shared.fsync_ms()).await;
        self.shared.log.append(input.clone());
        let out = self.apply(&input);
        self.shared.phase.set(WritePhase::Replying);
        sleep_ms(1).await;
        self.shared.phase.set(WritePhase::Idle);
        self.deliver(&input, origins, out);
    }

    /// The bug that persist-before-reply prevents: answer, then write.
    async fn write_reply_first(&mut self, input: Input, origins: Vec<Origin>) {
        let out = self.apply(&input);
        self.deliver(&input, origins, out);
        self.shared.phase.set(WritePhase::Syncing);
        sleep_ms(self.shared.fsync_ms()).await;
        self.shared.log.append(input);
        self.shared.phase.set(WritePhase::Idle);
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

    /// Send each origin its reply, register queued waiters, then push outcomes
    /// (replies first, so a wait queued and decided in one batch is found).
    fn deliver(&mut self, input: &Input, origins: Vec<Origin>, out: Output) {
        let cmds: &[Command] = match input {
            Input::Batch { cmds, .. } => cmds,
            Input::LeaderStart { .. } => &[],
        };
        for ((cmd, origin), reply) in cmds.iter().zip(origins).zip(out.replies) {
            self.register_wait(cmd, origin, &reply);
            if let Some((conn, id)) = origin {
                self.send(conn, ServerMsg::Reply { id, reply });
            }
        }
        for e in &out.effects {
            self.wake(e);
        }
        self.tick_at = out.next_deadline;
    }

    /// An acquire's reply: an immediate outcome ends its owner's wait.
    fn register_wait(&mut self, cmd: &Command, origin: Origin, reply: &Reply) {
        let (Command::Acquire(a), Some((conn, _))) = (cmd, origin) else {
            return;
        };
        let key = (a.lease, a.req);
        if self.racy_cancel() {
            return self.register_wait_racy(a, conn, reply);
        }
        let owned = self.waiters.get(&key).is_some_and(|w| w.conn == conn);
        if owned && !matches!(reply, Reply::Queued { .. }) {
            self.waiters.remove(&key);
        }
    }

    /// The real driver's way: register from the `Queued` reply.
    fn register_wait_racy(&mut self, a: &fencelock_core::Acquire, conn: ConnId, reply: &Reply) {
        if !matches!(reply, Reply::Queued { .. }) {
            return;
        }
        let key = (a.lease, a.req);
        if self.conns.contains_key(&conn) {
            let lock = a.lock.clone();
            self.waiters.insert(key, Waiter { conn, lock });
        } else {
            // Its caller left while the batch was written.
            self.cancel_later(key, a.lock.clone());
        }
    }

    /// Push the outcome of a queued acquire to the connection waiting for it.
    fn wake(&mut self, e: &Effect) {
        let (lease, req, outcome) = match e {
            Effect::Granted {
                grant,
                req,
                queued: true,
                ..
            } => (grant.lease, *req, PushOutcome::Granted(grant.clone())),
            Effect::WaitEnded {
                lease, req, why, ..
            } => (*lease, *req, PushOutcome::Ended(*why)),
            _ => return,
        };
        if let Some(w) = self.waiters.remove(&(lease, req)) {
            self.send(
                w.conn,
                ServerMsg::Push(Push {
                    lease,
                    req,
                    outcome,
                }),
            );
        }
    }

    fn send(&self, conn: ConnId, msg: ServerMsg) {
        if let Some(tx) = self.conns.get(&conn) {
            let _ = tx.send(msg);
        }
    }
}

/// `cmd` is a `CancelWait` of the acquire `(lease, req)`.
fn cancels(cmd: &Command, (lease, req): (LeaseId, RequestId)) -> bool {
    matches!(cmd, Command::CancelWait { lease: l, req: r, .. } if (*l, *r) == (lease, req))
}

/// The trace event for an engine effect, if it is one the checkers use.
fn effect_event(e: &Effect) -> Option<EventKind> {
    match e {
        Effect::Granted {
            grant, req, queued, ..
        } => Some(EventKind::Granted {
            lease: grant.lease,
            req: *req,
            token: grant.token,
            queued: *queued,
        }),
        Effect::Released { grant, cause, .. } => Some(EventKind::Released {
            lease: grant.lease,
            token: grant.token,
            cause: *cause,
        }),
        Effect::LeaseExpired { lease } => Some(EventKind::LeaseExpired { lease: *lease }),
        Effect::WaitEnded { .. } => None,
    }
}
