//! The driver: the one task that turns client commands into Raft log entries.
//!
//! Where it sits: between the request handlers (gRPC, session streams) and the
//! Raft group whose state machine is the engine. It is the only proposer, so it is
//! the engine's sole writer. Its contract:
//!
//! - **Persist, then reply.** A command is answered only after the entry holding it
//!   is committed (fsynced on a quorum) and applied; the reply is the engine's own.
//! - **Group commit.** While one entry is being written, every command that
//!   arrives is gathered into the next single entry (an engine `Input::Batch`), so
//!   a burst of requests costs one append and one fsync.
//! - **Time.** The driver reads the monotonic [`Clock`] and puts `now` into every
//!   entry; when the engine reports its next deadline, the driver proposes an empty
//!   batch (a tick) at that time, so expiries are decided by the leader's clock and
//!   written to the log.
//! - **Leadership.** When this node becomes leader (a restart of a single node
//!   included), the first entry it writes is `LeaderStart`, which gives every
//!   restored lease a fresh full TTL. Until that entry is applied, requests wait.
//!   When it stops being leader, queued callers get [`DriverError::NotLeader`].
//! - **Waiters.** A queued acquire is answered `Queued` by the engine; the caller
//!   then waits for the grant effect with its (lease, request id). If the caller
//!   has gone away when the grant comes, the driver proposes `CancelWait`, which
//!   releases the undelivered grant. A retried acquire (same lease and request id)
//!   owns the wait from the moment it arrives: it drops any unwritten `CancelWait`
//!   of that acquire, and a cancel from an older caller of it is never written, so
//!   a cancel never ends (or releases) the wait of a caller that is still there.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use fencelock_core::{
    Acquire, Busy, Caller, Command, Effect, EngineError, Grant, Input, LeaseId, Output,
    Reply, RequestId, WaitEnd,
};
use openraft::{
    error::{ClientWriteError, RaftError},
    ServerState,
};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
    time::Instant,
};

use crate::{clock::Clock, metrics::Metrics, raft::Raft};

/// Why the driver could not get a command decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// This node is not the leader; `leader` is the current leader's address if known.
    #[error("not the leader{}", leader.as_ref().map(|l| format!("; the leader is {l}")).unwrap_or_default())]
    NotLeader { leader: Option<String> },
    /// The outcome is unknown (storage failed, shutting down, leadership moved
    /// while writing). Retrying with the same request id is safe.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// The final outcome of an acquire, after any wait in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    Acquired { grant: Grant, waited_ms: u64 },
    Busy(Busy),
    TimedOut,
    /// The caller's lease ended while it waited.
    LeaseEnded(LeaseId),
    Rejected(EngineError),
}

type ReplyTx = oneshot::Sender<Result<Reply, DriverError>>;
type WaitTx = oneshot::Sender<Result<WaitOutcome, DriverError>>;

#[derive(Debug)]
enum WaitOutcome {
    Granted { grant: Grant, waited_ms: u64 },
    Ended(WaitEnd),
}

struct Msg {
    cmd: Command,
    reply: Option<ReplyTx>,
    waiter: Option<WaitTx>,
    /// For an acquire sent by [`DriverHandle::acquire`]: its generation.
    gen: Option<u64>,
}

/// What handles send to the driver task.
enum ToDriver {
    Cmd(Msg),
    /// The caller of the acquire of generation `gen` is done with it: it completed,
    /// or it went away mid-flight (`cancel`, carrying the `CancelWait` to write).
    AcquireGone { key: (LeaseId, RequestId), gen: u64, cancel: Option<Command> },
}

/// Who owns the wait of one (lease, request id): the newest acquire of it that
/// arrived, and how many callers of it have not reported that they are done.
struct Owner {
    newest: u64,
    live: u64,
}

/// A cheap, cloneable handle to the driver.
#[derive(Clone)]
pub struct DriverHandle {
    tx: mpsc::UnboundedSender<ToDriver>,
    ready: watch::Receiver<bool>,
    /// Generations of acquires, so a retry supersedes its older callers.
    next_gen: Arc<AtomicU64>,
}

impl DriverHandle {
    /// Propose `cmd` and return the engine's reply once it is durable and applied.
    ///
    /// A command that breaks a stateless rule ([`Command::validate`]) is answered
    /// `Rejected` here, as the engine would answer it, and is never proposed: a
    /// rejected request costs no log entry and no disk.
    pub async fn submit(&self, cmd: Command) -> Result<Reply, DriverError> {
        if let Err(e) = cmd.validate() {
            return Ok(Reply::Rejected(e));
        }
        self.send(cmd, None, None).await
    }

    async fn send(&self, cmd: Command, waiter: Option<WaitTx>, gen: Option<u64>) -> Result<Reply, DriverError> {
        let (tx, rx) = oneshot::channel();
        let msg = Msg { cmd, reply: Some(tx), waiter, gen };
        self.tx.send(ToDriver::Cmd(msg)).map_err(|_| shutting_down())?;
        rx.await.map_err(|_| shutting_down())?
    }

    /// Acquire, waiting in the server-side queue if the command says so. If this
    /// future is dropped before it completes, the wait is cancelled (and a grant
    /// that was made but not delivered is released).
    /// An invalid acquire is rejected before it reaches the driver (see [`Self::submit`]).
    /// `caller`: who asks (see [`Command::As`]); `None` with authentication off.
    pub async fn acquire(&self, acq: Acquire, caller: Option<Caller>) -> Result<AcquireOutcome, DriverError> {
        let cmd = match caller {
            Some(caller) => Command::As { caller, cmd: Box::new(Command::Acquire(acq.clone())) },
            None => Command::Acquire(acq.clone()),
        };
        if let Err(e) = cmd.validate() {
            return Ok(AcquireOutcome::Rejected(e));
        }
        let gen = self.next_gen.fetch_add(1, Ordering::Relaxed);
        let mut guard = CancelOnDrop::new(self, &acq, gen);
        let (wtx, wrx) = oneshot::channel();
        let lease = acq.lease;
        let outcome = match self.send(cmd, Some(wtx), Some(gen)).await {
            Ok(Reply::Queued { .. }) => match wrx.await {
                Ok(Ok(WaitOutcome::Granted { grant, waited_ms })) => {
                    Ok(AcquireOutcome::Acquired { grant, waited_ms })
                }
                Ok(Ok(WaitOutcome::Ended(why))) => Ok(ended(why, lease)),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(shutting_down()),
            },
            Ok(reply) => immediate(reply),
            Err(e) => Err(e),
        };
        // Completed (either way): the caller has the outcome, or will retry with the
        // same request id; a cancel now could race with that retry. The guard still
        // tells the driver that this caller is done.
        guard.armed = false;
        outcome
    }

    /// Whether this node currently serves requests (leader with `LeaderStart` applied).
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }
}

fn ended(why: WaitEnd, lease: LeaseId) -> AcquireOutcome {
    match why {
        WaitEnd::TimedOut => AcquireOutcome::TimedOut,
        WaitEnd::LeaseEnded => AcquireOutcome::LeaseEnded(lease),
        // Only the wait's current owner cancels it, and it is gone by then.
        WaitEnd::Cancelled => AcquireOutcome::TimedOut,
    }
}

fn immediate(reply: Reply) -> Result<AcquireOutcome, DriverError> {
    match reply {
        Reply::Acquired(grant) => Ok(AcquireOutcome::Acquired { grant, waited_ms: 0 }),
        Reply::Busy(b) => Ok(AcquireOutcome::Busy(b)),
        Reply::Rejected(e) => Ok(AcquireOutcome::Rejected(e)),
        other => Err(DriverError::Unavailable(format!("internal: unexpected reply {other:?}"))),
    }
}

/// Most bytes of commands in one log entry (as estimated by [`approx_bytes`]):
/// a burst of large requests is split over several entries instead of making one
/// entry that every member must write, send and hold in memory at once.
const MAX_BATCH_BYTES: usize = 1 << 20;

/// How many of the first `pending` commands go into the next entry: at most
/// `max_batch`, at most [`MAX_BATCH_BYTES`], and always at least one.
fn batch_len(pending: &[Msg], max_batch: usize) -> usize {
    let mut bytes = 0;
    let fits = pending.iter().take(max_batch).take_while(|m| {
        bytes += approx_bytes(&m.cmd);
        bytes <= MAX_BATCH_BYTES
    });
    fits.count().max(1).min(pending.len())
}

/// Roughly how many bytes `cmd` takes in an entry: fixed fields plus its lock name
/// (validated commands have names of at most 512 bytes).
fn approx_bytes(cmd: &Command) -> usize {
    const FIXED: usize = 128;
    FIXED
        + match cmd {
            Command::Acquire(a) => a.lock.len(),
            Command::Release { lock, .. } | Command::CancelWait { lock, .. } => lock.len(),
            Command::GrantLease { .. } | Command::KeepAlive { .. } | Command::Revoke { .. } => 0,
            Command::As { caller, cmd } => caller.name.len() + approx_bytes(cmd),
            Command::Policy(change) => serde_json::to_vec(change).map_or(1024, |j| j.len()),
        }
}

fn shutting_down() -> DriverError {
    DriverError::Unavailable("server is shutting down".into())
}

/// Tells the driver when the caller of an acquire is done with it, and asks for a
/// `CancelWait` if it went away mid-flight (the driver writes it only if no newer
/// acquire of the same lease and request id has arrived).
struct CancelOnDrop {
    tx: mpsc::UnboundedSender<ToDriver>,
    key: (LeaseId, RequestId),
    gen: u64,
    lock: String,
    armed: bool,
}

impl CancelOnDrop {
    fn new(h: &DriverHandle, a: &Acquire, gen: u64) -> Self {
        Self { tx: h.tx.clone(), key: (a.lease, a.req), gen, lock: a.lock.clone(), armed: true }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let ((lease, req), gen) = (self.key, self.gen);
        let cancel = self.armed.then(|| Command::CancelWait { req, lease, lock: std::mem::take(&mut self.lock) });
        let _ = self.tx.send(ToDriver::AcquireGone { key: self.key, gen, cancel });
    }
}

/// Everything the driver task owns.
pub struct Driver {
    raft: Raft,
    node_id: u64,
    clock: Clock,
    metrics: Arc<Metrics>,
    max_batch: usize,
    rx: mpsc::UnboundedReceiver<ToDriver>,
    ready_tx: watch::Sender<bool>,
    pending: Vec<Msg>,
    waiters: HashMap<(LeaseId, RequestId), WaitTx>,
    /// Per (lease, request id) with a caller of [`DriverHandle::acquire`] not done
    /// yet: the newest acquire of it (the only one whose cancel is written).
    owners: HashMap<(LeaseId, RequestId), Owner>,
    /// How many of `pending` are cancels of dropped callers: an arriving acquire
    /// scans `pending` for its key's cancel only when there is one at all.
    unwritten_cancels: usize,
    inflight: Option<Inflight>,
    /// When the engine's next deadline falls due (a tick must be written then).
    tick_at: Option<Instant>,
    tick_due: bool,
    /// After a failed write, no new write before this instant.
    retry_at: Option<Instant>,
    role: Role,
    leader_hint: Option<String>,
    /// Set once the Raft node has stopped (a storage failure is fatal to it):
    /// every request is then answered with this reason until a restart.
    stopped: Option<String>,
    /// How long a leader of a group of several may go without an answer from
    /// a majority before it stops serving (`None`: never).
    quorum_timeout: Option<std::time::Duration>,
    /// The cluster id this node proposes in its `LeaderStart`s (adopted by the
    /// engine only if the group has none yet; see [`crate::raft::identity`]).
    cluster_id: Option<fencelock_core::ClusterId>,
    /// Set while this node leads but is cut off from a majority: every request
    /// is answered with this reason (retryable: a client tries another node),
    /// nothing is written, until a majority answers again or another leads.
    cut_off: Option<String>,
}

struct Inflight {
    task: JoinHandle<Result<Output, DriverError>>,
    msgs: Vec<Msg>,
    /// `Some(term)` when this write is the `LeaderStart` of `term`.
    leader_start: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Follower,
    /// Leader of this term; its `LeaderStart` is not applied yet.
    Starting(u64),
    /// Leader of this term, serving.
    Ready(u64),
}

type WriteError = RaftError<u64, ClientWriteError<u64, crate::raft::Member>>;

impl Driver {
    /// Create the driver and its handle. Run it with [`Driver::run`].
    pub fn new(
        raft: Raft,
        node_id: u64,
        clock: Clock,
        metrics: Arc<Metrics>,
        max_batch: usize,
    ) -> (Self, DriverHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready) = watch::channel(false);
        let driver = Self {
            raft,
            node_id,
            clock,
            metrics,
            max_batch: max_batch.max(1),
            rx,
            ready_tx,
            pending: Vec::new(),
            waiters: HashMap::new(),
            owners: HashMap::new(),
            unwritten_cancels: 0,
            inflight: None,
            tick_at: None,
            tick_due: false,
            retry_at: None,
            role: Role::Follower,
            leader_hint: None,
            stopped: None,
            quorum_timeout: None,
            cluster_id: None,
            cut_off: None,
        };
        (driver, DriverHandle { tx, ready, next_gen: Arc::new(AtomicU64::new(1)) })
    }

    /// A leader of a group of several that has not heard from a majority for
    /// `timeout` stops serving until it does: its writes cannot commit, so its
    /// callers get a retryable error now rather than a hang (and retry, with
    /// the same request ids, on the majority's new leader).
    pub fn with_quorum_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.quorum_timeout = Some(timeout);
        self
    }

    /// Propose `id` as the group's cluster id in every `LeaderStart`.
    pub fn with_cluster_id(mut self, id: Option<fencelock_core::ClusterId>) -> Self {
        self.cluster_id = id;
        self
    }

    /// Run until `shutdown` resolves, the Raft node stops, or every handle is dropped.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let mut metrics_rx = self.raft.metrics();
        tokio::pin!(shutdown);
        let first = metrics_rx.borrow_and_update().clone();
        self.on_metrics(&first);
        loop {
            self.maybe_write();
            let wake = earliest(self.tick_at, self.retry_at);
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                done = wait_inflight(&mut self.inflight) => self.on_written(done),
                changed = metrics_rx.changed(), if self.stopped.is_none() => {
                    if changed.is_err() {
                        self.stop_serving("the Raft node stopped".into());
                        continue;
                    }
                    let m = metrics_rx.borrow_and_update().clone();
                    self.on_metrics(&m);
                }
                msg = self.rx.recv() => match msg {
                    Some(m) => self.enqueue(m),
                    None => break,
                },
                _ = sleep_until(wake) => self.on_timer(),
            }
        }
        self.fail_all(shutting_down());
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        if self.tick_at.is_some_and(|t| t <= now) {
            self.tick_at = None;
            self.tick_due = true;
        }
        if self.retry_at.is_some_and(|t| t <= now) {
            self.retry_at = None;
        }
    }

    fn enqueue(&mut self, msg: ToDriver) {
        self.accept(msg);
        // Gather everything already queued into this same batch.
        while self.pending.len() < self.max_batch {
            match self.rx.try_recv() {
                Ok(m) => self.accept(m),
                Err(_) => break,
            }
        }
    }

    fn accept(&mut self, msg: ToDriver) {
        let msg = match msg {
            ToDriver::Cmd(m) => m,
            ToDriver::AcquireGone { key, gen, cancel } => match self.acquire_gone(key, gen, cancel) {
                Some(cmd) => Msg { cmd, reply: None, waiter: None, gen: None },
                None => return,
            },
        };
        if let (Command::Acquire(a), Some(gen)) = (msg.cmd.inner(), msg.gen) {
            self.acquire_arrived((a.lease, a.req), gen);
        }
        if let Some(why) = &self.stopped {
            reply(msg.reply, Err(DriverError::Unavailable(why.clone())));
            return;
        }
        if self.role == Role::Follower {
            let leader = self.leader_hint.clone();
            reply(msg.reply, Err(DriverError::NotLeader { leader }));
            return;
        }
        if let Some(why) = &self.cut_off {
            reply(msg.reply, Err(DriverError::Unavailable(why.clone())));
            return;
        }
        self.unwritten_cancels += usize::from(is_dropped_cancel(&msg));
        self.pending.push(msg);
    }

    /// An acquire (maybe a retry) arrived: it owns the wait of its key from now on,
    /// so an unwritten cancel of that key, from an older caller, is dropped.
    fn acquire_arrived(&mut self, key: (LeaseId, RequestId), gen: u64) {
        let owner = self.owners.entry(key).or_insert(Owner { newest: gen, live: 0 });
        owner.newest = owner.newest.max(gen);
        owner.live += 1;
        if self.unwritten_cancels > 0 {
            let before = self.pending.len();
            self.pending.retain(|m| !(is_dropped_cancel(m) && cancels(&m.cmd, key)));
            self.unwritten_cancels -= before - self.pending.len();
        }
    }

    /// The caller of the acquire `gen` of `key` is done; the `CancelWait` to write,
    /// if it went away and was the wait's newest owner.
    fn acquire_gone(&mut self, key: (LeaseId, RequestId), gen: u64, cancel: Option<Command>) -> Option<Command> {
        let Some(owner) = self.owners.get_mut(&key) else {
            return cancel;
        };
        let current = gen >= owner.newest;
        owner.live = owner.live.saturating_sub(1);
        if owner.live == 0 {
            self.owners.remove(&key);
        }
        cancel.filter(|_| current)
    }

    /// Start the next write if none is in flight and there is something to write.
    fn maybe_write(&mut self) {
        if self.inflight.is_some() || self.retry_at.is_some() || self.cut_off.is_some() {
            return;
        }
        match self.role {
            Role::Follower => {}
            Role::Starting(term) => {
                // The floor and the cluster id: see `raft::identity` (issue 14).
                let (token_floor, cluster_id) = (self.clock.token_floor(), self.cluster_id);
                let input = Input::LeaderStart { now: self.clock.now(), token_floor, cluster_id };
                self.spawn_write(input, Vec::new(), Some(term));
            }
            Role::Ready(_) => {
                if self.pending.is_empty() && !self.tick_due {
                    return;
                }
                let n = batch_len(&self.pending, self.max_batch);
                let msgs: Vec<Msg> = self.pending.drain(..n).collect();
                self.unwritten_cancels -= msgs.iter().filter(|m| is_dropped_cancel(m)).count();
                let cmds = msgs.iter().map(|m| m.cmd.clone()).collect();
                self.tick_due = false;
                self.metrics.batch(msgs.len());
                let input = Input::Batch { now: self.clock.now(), cmds };
                self.spawn_write(input, msgs, None);
            }
        }
    }

    fn spawn_write(&mut self, input: Input, msgs: Vec<Msg>, leader_start: Option<u64>) {
        let raft = self.raft.clone();
        let task = tokio::spawn(async move {
            match raft.client_write(input).await {
                Ok(resp) => Ok(resp.data),
                Err(e) => Err(map_write_error(e)),
            }
        });
        self.inflight = Some(Inflight { task, msgs, leader_start });
    }

    fn on_written(&mut self, (done, res): (Inflight, Result<Output, DriverError>)) {
        let out = match res {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(error = %e, "log write failed");
                for m in done.msgs {
                    reply(m.reply, Err(e.clone()));
                }
                self.retry_at = Some(Instant::now() + RETRY_AFTER_FAILED_WRITE);
                return;
            }
        };
        if let Some(term) = done.leader_start {
            if self.role == Role::Starting(term) {
                self.role = Role::Ready(term);
                let _ = self.ready_tx.send(true);
                tracing::info!(term, "leader ready: restored leases got a fresh TTL");
            }
        }
        #[cfg(feature = "failpoints")]
        crate::faults::crash_point(crate::faults::REPLY_BEFORE_SEND);
        self.deliver(done.msgs, out);
    }

    /// Send each caller its reply, register queued waiters, then act on effects
    /// (replies first, so a waiter queued and granted in one batch is found).
    fn deliver(&mut self, msgs: Vec<Msg>, out: Output) {
        let mut replies = out.replies.into_iter();
        for m in msgs {
            let Some(r) = replies.next() else {
                reply(m.reply, Err(DriverError::Unavailable("internal: missing reply".into())));
                continue;
            };
            if let (Reply::Queued { .. }, Command::Acquire(a), Some(w)) = (&r, m.cmd.inner(), m.waiter) {
                // A superseded caller of a retried acquire does not take the wait back.
                let key = (a.lease, a.req);
                if self.owners.get(&key).is_none_or(|o| m.gen.is_none_or(|g| g >= o.newest)) {
                    self.waiters.insert(key, w);
                }
            }
            reply(m.reply, Ok(r));
        }
        for e in &out.effects {
            self.metrics.effect(e);
            self.wake(e);
        }
        self.tick_at = out.next_deadline.map(|d| Instant::from_std(self.clock.instant_at(d)));
    }

    /// Complete the wait of a queued acquire. A waiter with no registered caller was
    /// queued before a leader change or restart; its client retries with the same
    /// request id and then finds the outcome. A caller that went away proposes
    /// `CancelWait` itself (see [`DriverHandle::acquire`]).
    fn wake(&mut self, e: &Effect) {
        let (key, outcome) = match e {
            Effect::Granted { grant, req, queued: true, waited_ms } => (
                (grant.lease, *req),
                WaitOutcome::Granted { grant: grant.clone(), waited_ms: *waited_ms },
            ),
            Effect::WaitEnded { lease, req, why, .. } => ((*lease, *req), WaitOutcome::Ended(*why)),
            _ => return,
        };
        if let Some(w) = self.waiters.remove(&key) {
            let _ = w.send(Ok(outcome));
        }
    }

    /// Fail closed: answer everything with `why` from now on. Nothing more is
    /// written, so the last durable state is what a restart will find.
    fn stop_serving(&mut self, why: String) {
        tracing::error!(reason = %why, "not serving any more; restart the server");
        let why = format!("{why}; nothing more is written and the last durable state is kept; restart the server");
        self.stopped = Some(why.clone());
        self.role = Role::Follower;
        let _ = self.ready_tx.send(false);
        self.fail_all(DriverError::Unavailable(why));
    }

    fn on_metrics(&mut self, m: &openraft::RaftMetrics<u64, crate::raft::Member>) {
        if let Err(fatal) = &m.running_state {
            return self.stop_serving(format!("the server stopped after a fatal error: {fatal}"));
        }
        let leader_id = m.current_leader;
        self.leader_hint = leader_id
            .and_then(|id| m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()));
        let is_leader = m.state == ServerState::Leader && leader_id == Some(self.node_id);
        let term = m.current_term;
        let role = match (is_leader, self.role) {
            (false, _) => Role::Follower,
            (true, Role::Starting(t) | Role::Ready(t)) if t == term => self.role,
            (true, _) => Role::Starting(term),
        };
        if role != self.role {
            tracing::info!(?role, term, leader = ?leader_id, "role changed");
            self.role = role;
            if !matches!(role, Role::Ready(_)) {
                let _ = self.ready_tx.send(false);
                self.retry_at = None;
            }
            if role == Role::Follower {
                let leader = self.leader_hint.clone();
                self.fail_all(DriverError::NotLeader { leader });
            }
        }
        self.check_quorum(m, is_leader);
    }

    /// Stops serving while this leader is cut off from a majority, and serves
    /// again once a majority answers (see [`Driver::with_quorum_timeout`]).
    fn check_quorum(&mut self, m: &openraft::RaftMetrics<u64, crate::raft::Member>, is_leader: bool) {
        let Some(limit) = self.quorum_timeout else { return };
        let voters = m.membership_config.membership().voter_ids().count();
        let silent = m.millis_since_quorum_ack.filter(|ms| *ms > limit.as_millis() as u64);
        let lost = match silent {
            Some(ms) if is_leader && voters > 1 => Some(ms),
            _ => None,
        };
        match (lost, self.cut_off.is_some()) {
            (Some(ms), false) => {
                let why = format!(
                    "node {} leads but has not heard from a majority of its group for {ms} ms; the outcome of requests \
                     in flight here is unknown; retry on another node",
                    self.node_id
                );
                tracing::warn!(ms, "cut off from a majority: serving nothing until it answers again");
                self.cut_off = Some(why.clone());
                let _ = self.ready_tx.send(false);
                let e = DriverError::Unavailable(why);
                self.fail_all(e.clone());
                if let Some(inflight) = self.inflight.as_mut() {
                    for m in &mut inflight.msgs {
                        reply(m.reply.take(), Err(e.clone()));
                        m.waiter = None;
                    }
                }
            }
            (None, true) => {
                self.cut_off = None;
                if matches!(self.role, Role::Ready(_)) {
                    tracing::info!("a majority answers again: serving");
                    let _ = self.ready_tx.send(true);
                    // Expiries were not ticked meanwhile: tick now.
                    self.tick_due = true;
                }
            }
            _ => {}
        }
    }

    fn fail_all(&mut self, e: DriverError) {
        self.unwritten_cancels = 0;
        for m in self.pending.drain(..) {
            reply(m.reply, Err(e.clone()));
        }
        for (_, w) in self.waiters.drain() {
            let _ = w.send(Err(e.clone()));
        }
        self.tick_at = None;
        self.tick_due = false;
    }
}

/// Pause after a failed log write before the next attempt, so a failing disk is
/// not hammered in a loop.
const RETRY_AFTER_FAILED_WRITE: std::time::Duration = std::time::Duration::from_millis(100);

/// `m` is the `CancelWait` of a caller that went away (nobody awaits its reply).
fn is_dropped_cancel(m: &Msg) -> bool {
    m.reply.is_none() && matches!(m.cmd.inner(), Command::CancelWait { .. })
}

/// `cmd` is a `CancelWait` of the acquire `(lease, req)`.
fn cancels(cmd: &Command, (lease, req): (LeaseId, RequestId)) -> bool {
    matches!(cmd.inner(), Command::CancelWait { lease: l, req: r, .. } if (*l, *r) == (lease, req))
}

fn reply(tx: Option<ReplyTx>, r: Result<Reply, DriverError>) {
    if let Some(tx) = tx {
        let _ = tx.send(r);
    }
}

async fn wait_inflight(
    inflight: &mut Option<Inflight>,
) -> (Inflight, Result<Output, DriverError>) {
    let Some(f) = inflight.as_mut() else {
        return std::future::pending().await;
    };
    let res = match (&mut f.task).await {
        Ok(r) => r,
        Err(join) => Err(DriverError::Unavailable(format!("write task failed: {join}"))),
    };
    let Some(f) = inflight.take() else {
        return std::future::pending().await;
    };
    (f, res)
}

fn map_write_error(e: WriteError) -> DriverError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            DriverError::NotLeader { leader: f.leader_node.map(|n| n.addr) }
        }
        other => DriverError::Unavailable(other.to_string()),
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(name_len: usize) -> Msg {
        let lock = "x".repeat(name_len);
        let acq = Acquire { req: RequestId(1), lease: LeaseId(1), lock, wait_ms: 0, lock_delay_ms: 0 };
        Msg { cmd: Command::Acquire(acq), reply: None, waiter: None, gen: None }
    }

    /// Small commands fill a batch up to `max_batch`.
    #[test]
    fn batch_len_is_capped_by_count() {
        let pending: Vec<Msg> = (0..10).map(|_| acquire(8)).collect();
        assert_eq!(batch_len(&pending, 4), 4);
        assert_eq!(batch_len(&pending, 100), 10);
    }

    /// Large commands close a batch at `MAX_BATCH_BYTES`, whatever the count.
    #[test]
    fn batch_len_is_capped_by_bytes() {
        let each = approx_bytes(&acquire(512).cmd);
        let pending: Vec<Msg> = (0..4096).map(|_| acquire(512)).collect();
        let n = batch_len(&pending, 4096);
        assert_eq!(n, MAX_BATCH_BYTES / each);
        assert!(n * each <= MAX_BATCH_BYTES && (n + 1) * each > MAX_BATCH_BYTES);
    }

    /// One command larger than the cap still goes out alone (it cannot be split).
    #[test]
    fn batch_len_takes_at_least_one() {
        let pending = vec![acquire(MAX_BATCH_BYTES), acquire(8)];
        assert_eq!(batch_len(&pending, 4096), 1);
        assert_eq!(batch_len(&[], 4096), 0);
    }
}
