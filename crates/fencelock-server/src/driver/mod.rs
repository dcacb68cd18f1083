//! The driver: the one task that turns client commands into Raft log entries.
//!
//! Where it sits: between the request handlers (gRPC, session streams) and the
//! Raft group whose state machine is the engine. It is the only proposer, so it is
//! the engine's sole writer. Its contract:
//!
//! - **Persist, then reply.** A command is answered only after the entry holding it
//!   is committed (fsynced on a quorum) and applied; the reply is the engine's own.
//! - **Group commit.** Up to `max_inflight` entries are written at once; while
//!   that many are in flight, every command that arrives is gathered into the
//!   next single entry (an engine `Input::Batch`), and the log covers the entries
//!   in flight with one fsync, so a burst of requests costs few appends and one
//!   fsync. Outputs are acted on in the order the entries were proposed (see
//!   [`core`]'s docs for the rules, failures and leadership changes included).
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
//!
//! - **Lease ends.** Every lease end the leader applies (a `LeaseRevoked` reply,
//!   a `LeaseExpired` effect) is published on a bounded broadcast
//!   ([`DriverHandle::lease_ends`]) for the `WatchLeases` streams
//!   (`lease_events.rs`). Only the leader's driver sees outputs, so only the
//!   leader publishes; followers serve no lease events (nor any other call).
//!
//! - **Linger.** After an entry's callers are answered, the next write waits
//!   up to [`DEFAULT_LINGER`] for those callers to come back (see [`core`]'s
//!   docs), timed by a `timerfd` (`linger.rs`): tokio's timer ticks in ms.
//!
//! ## The path of one write, and what a handoff costs (issue 19 §3)
//!
//! Crossings between tasks and threads from a request reaching its handler to
//! its reply handed back (openraft 0.9.25, storage v2): handler task → driver
//! (1) → openraft core (2) → log IO (3: with redb, tokio's blocking pool;
//! the segment log writes a lone append on the core's own thread, and only
//! one that finds others queued crosses to its log thread) → core (4:
//! `LogFlushed`, called by whoever wrote) → openraft's state machine worker
//! (5) → core (6) → driver (7, the write's oneshot) → handler (8): eight
//! crossings over five tasks/threads, six when the segment log writes at
//! once.
//! There were ten: openraft saves the committed log id before each apply, and
//! that was a redb commit (without fsync) on the blocking pool and back; the
//! id is now kept in memory and written with the next durable transaction
//! (`raft/log_store/meta.rs`). A session operation adds the handover from the
//! connection's task to the session's (`grpc.rs`); it was spawned as a task
//! of its own before. The state machine worker is spawned by openraft itself
//! and `apply` is only called there, so it cannot run on the driver's task
//! within the 0.9 API. Measured per stage (temporary timestamps along the
//! path, W2, segment log, release build, median of one traced run, ms, with
//! the ten crossings): handler → write proposed 0.09-0.17 (waiting for the
//! write in flight included), append → durable 0.10-0.22, `save_committed`
//! 0.03-0.05 (now gone), apply 0.005, every other crossing ≤ 0.01; the
//! client's two loopback messages ~0.05 each.
//!
//! W2's ~8 ms handoff p99 is the disk: this VM's virtual disk does an
//! `fdatasync` in ~0.1 ms when quiet but ~4 ms (p90 3.6, p99 4.6 during a
//! slow run) while other processes write to it, and a handoff paid about two
//! fsyncs in series. One entry answers both clients of a handoff at once (the
//! releaser, who comes back with its next acquire, and the next holder, who
//! comes back with its release); whichever arrived first was written alone
//! and the other waited for that whole write: 1.65 writes per grant. Lingering
//! puts both into one entry: 1.02 writes per grant, so a slow disk costs a
//! handoff one fsync, not two. A handoff cannot cost less than one fsync
//! while the lock is durable: p99 ≤ 1 ms needs a disk whose fsync p99 is
//! below ~0.7 ms.
//!
//! Measured (W2, 16 clients each with its own connection, release build, 2
//! cores shared with two other builders, load 2-4; medians of interleaved
//! 5 s runs, `FENCELOCK_BENCH_SERVER_LOG=… fencelock-bench --engines
//! fencelock --client-mode per-process --workloads W2 --seconds 5 --runs 1`):
//! segment log, 12 runs each, 1,534 → 1,682 cycles/s, handoff p50 0.41 →
//! 0.34 ms, p99 4.5 → 4.1 ms, runs in the ~8 ms mode 5 → 2; redb, 6 runs
//! each, 1,046 → 1,234 cycles/s, p50 0.64 → 0.48 ms, p99 7.4 → 5.3 ms. The
//! p99 follows the disk: with lingering a handoff's p99 was about the fsync
//! p99 of its run plus the `save_committed` tail (up to ms on the blocking
//! pool when the machine is busy; that round trip is gone since), without it
//! about twice the fsync p99.
//! Redis with `appendfsync always` in the same minutes: 1,565 cycles/s,
//! p99 3.8 ms (the same disk). Two or four writes in flight instead of
//! lingering made W2 slower (segment log: 1,700-1,900 against 2,300 cycles/s
//! with one, runs interleaved): the release is proposed at once but its
//! fsync still follows the acquire's.
//!
//! The decisions are [`core::DriverCore`]'s, which does no IO and is tested
//! alone (`driver/tests/`); this module is its tokio shell: it owns the
//! channels, the Raft handle, the writes in flight and the timers, turns what
//! happens into the core's events and does what its actions say. It hands each
//! entry to openraft (`client_write_ff`, which queues it on the Raft core's
//! channel at once) before the next, so the log holds the entries in the order
//! the core proposed them, and it awaits their results in that order.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use fencelock_core::{
    Acquire, Busy, Caller, Command, Effect, EngineError, Grant, Input, LeaseId, Output, Reply, RequestId, WaitEnd,
};
use openraft::{
    error::{ClientWriteError, RaftError},
    ServerState,
};
use tokio::{
    sync::{broadcast, mpsc, oneshot, watch},
    time::Instant,
};

use crate::{
    clock::Clock,
    metrics::Metrics,
    raft::Raft,
    seams::{CrashPoint, Seams},
};

pub mod core;
mod linger;
#[cfg(test)]
mod tests;

use self::core::{Action, DriverCore, Event, Gen, RaftView, Time, WaitOutcome};

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
    Acquired {
        grant: Grant,
        waited_ms: u64,
    },
    /// A multi-acquire was granted: every lock, in the order asked.
    AcquiredAll {
        grants: Vec<Grant>,
        waited_ms: u64,
    },
    Busy(Busy),
    TimedOut,
    /// The acquire's `once_per` slot is done (see [`Reply::SlotDone`]).
    SlotDone {
        token: fencelock_core::Token,
        identity: String,
        exit_code: i32,
    },
    /// The caller's lease ended while it waited.
    LeaseEnded(LeaseId),
    Rejected(EngineError),
}

/// How long the next write waits, at most, for the callers the last entry
/// answered (see [`core`]'s docs, "Lingering"): the two clients of a handoff
/// come back within ~25-150 µs of each other on loopback.
pub const DEFAULT_LINGER: std::time::Duration = std::time::Duration::from_micros(200);

/// How many lease ends the broadcast keeps for its slowest subscriber; one that
/// falls further behind is told so (and its stream ends): memory stays bounded
/// whatever the subscribers do.
pub const LEASE_END_BUFFER: usize = 1024;

/// A lease that ended in an entry the leader applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseEnd {
    pub lease: LeaseId,
    pub cause: LeaseEndCause,
}

/// Why a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEndCause {
    /// A `Revoke` (by its owner or an admin) was applied.
    Revoked,
    /// Its deadline passed (a tick expired it).
    Expired,
}

impl LeaseEnd {
    /// The lease end a reply reports, if any (a revoke's; a repeated revoke
    /// reports it again, which subscribers ignore).
    fn of_reply(r: &Result<Reply, DriverError>) -> Option<LeaseEnd> {
        match r {
            Ok(Reply::LeaseRevoked { lease }) => Some(LeaseEnd { lease: *lease, cause: LeaseEndCause::Revoked }),
            _ => None,
        }
    }

    /// The lease end an effect reports, if any.
    fn of_effect(e: &Effect) -> Option<LeaseEnd> {
        match e {
            Effect::LeaseExpired { lease } => Some(LeaseEnd { lease: *lease, cause: LeaseEndCause::Expired }),
            _ => None,
        }
    }
}

type ReplyTx = oneshot::Sender<Result<Reply, DriverError>>;
type WaitTx = oneshot::Sender<Result<WaitOutcome, DriverError>>;

type Msg = core::Msg<ReplyTx, WaitTx>;

/// What handles send to the driver task.
enum ToDriver {
    Cmd(Msg),
    /// The caller of the acquire of generation `gen` is done with it: it completed,
    /// or it went away mid-flight (`cancel`, carrying the `CancelWait` to write).
    AcquireGone {
        key: (LeaseId, RequestId),
        gen: Gen,
        cancel: Option<Command>,
    },
}

/// A cheap, cloneable handle to the driver.
#[derive(Clone)]
pub struct DriverHandle {
    tx: mpsc::UnboundedSender<ToDriver>,
    ready: watch::Receiver<bool>,
    /// Generations of acquires, so a retry supersedes its older callers.
    next_gen: Arc<AtomicU64>,
    /// Lease ends, as the driver publishes them.
    ends: broadcast::Sender<LeaseEnd>,
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

    async fn send(&self, cmd: Command, waiter: Option<WaitTx>, gen: Option<Gen>) -> Result<Reply, DriverError> {
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
    /// `attempt`: the client's attempt number of this request id (0 if it
    /// sent none), which orders the callers of one request id (see [`Gen`]).
    pub async fn acquire(
        &self,
        acq: Acquire,
        caller: Option<Caller>,
        attempt: u32,
    ) -> Result<AcquireOutcome, DriverError> {
        let cmd = match caller {
            Some(caller) => Command::As { caller, cmd: Box::new(Command::Acquire(acq.clone())) },
            None => Command::Acquire(acq.clone()),
        };
        if let Err(e) = cmd.validate() {
            return Ok(AcquireOutcome::Rejected(e));
        }
        let gen = Gen { attempt, arrival: self.next_gen.fetch_add(1, Ordering::Relaxed) };
        let mut guard = CancelOnDrop::new(self, &acq, gen);
        let (wtx, wrx) = oneshot::channel();
        let lease = acq.lease;
        let outcome = match self.send(cmd, Some(wtx), Some(gen)).await {
            Ok(Reply::Queued { .. }) => match wrx.await {
                Ok(Ok(WaitOutcome::Granted { grant, waited_ms })) => Ok(AcquireOutcome::Acquired { grant, waited_ms }),
                Ok(Ok(WaitOutcome::GrantedAll { grants, waited_ms })) => {
                    Ok(AcquireOutcome::AcquiredAll { grants, waited_ms })
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

    /// Follows [`Self::is_ready`]: a stream ends when it turns false.
    pub fn ready_watch(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }

    /// How many subscribers [`Self::lease_ends`] has now (open lease event streams).
    pub fn lease_watchers(&self) -> usize {
        self.ends.receiver_count()
    }

    /// Every lease end applied from now on (see [`LEASE_END_BUFFER`]).
    pub fn lease_ends(&self) -> broadcast::Receiver<LeaseEnd> {
        self.ends.subscribe()
    }
}

fn ended(why: WaitEnd, lease: LeaseId) -> AcquireOutcome {
    match why {
        WaitEnd::TimedOut => AcquireOutcome::TimedOut,
        WaitEnd::LeaseEnded => AcquireOutcome::LeaseEnded(lease),
        // Only the wait's current owner cancels it, and it is gone by then.
        WaitEnd::Cancelled => AcquireOutcome::TimedOut,
        WaitEnd::SlotDone(done) => {
            let fencelock_core::SlotCompletion { token, identity, exit_code } = *done;
            AcquireOutcome::SlotDone { token, identity, exit_code }
        }
    }
}

fn immediate(reply: Reply) -> Result<AcquireOutcome, DriverError> {
    match reply {
        Reply::Acquired(grant) => Ok(AcquireOutcome::Acquired { grant, waited_ms: 0 }),
        Reply::AcquiredAll(grants) => Ok(AcquireOutcome::AcquiredAll { grants, waited_ms: 0 }),
        Reply::Busy(b) => Ok(AcquireOutcome::Busy(b)),
        Reply::SlotDone { token, identity, exit_code } => Ok(AcquireOutcome::SlotDone { token, identity, exit_code }),
        Reply::Rejected(e) => Ok(AcquireOutcome::Rejected(e)),
        other => Err(DriverError::Unavailable(format!("internal: unexpected reply {other:?}"))),
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
    gen: Gen,
    lock: String,
    armed: bool,
}

impl CancelOnDrop {
    fn new(h: &DriverHandle, a: &Acquire, gen: Gen) -> Self {
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

/// The driver task: the tokio shell of a [`DriverCore`].
pub struct Driver {
    raft: Raft,
    node_id: u64,
    clock: Clock,
    metrics: Arc<Metrics>,
    max_batch: usize,
    rx: mpsc::UnboundedReceiver<ToDriver>,
    ready_tx: watch::Sender<bool>,
    core: DriverCore<ReplyTx, WaitTx>,
    /// The writes in flight, in proposal order, by sequence number: openraft's
    /// answer to come, or why it could not be proposed.
    writes: VecDeque<(u64, Result<WriteRx, DriverError>)>,
    /// Hooks at [`CrashPoint::ReplyBeforeSend`] (see [`crate::seams`]).
    seams: Seams,
    /// Where lease ends are published.
    ends: broadcast::Sender<LeaseEnd>,
    /// How long the next write waits for the callers just answered (see
    /// [`core`]'s docs); `None`: it does not.
    linger: Option<std::time::Duration>,
    /// How often a leader of a group reads how long ago a majority answered
    /// (see [`Self::run`]); `None` without a quorum timeout.
    quorum_poll: Option<std::time::Duration>,
}

type WriteError = RaftError<u64, ClientWriteError<u64, crate::raft::Member>>;

/// Where openraft answers one proposed entry (committed and applied, or why not).
type WriteRx = tokio::sync::oneshot::Receiver<openraft::raft::ClientWriteResult<crate::raft::TypeConfig>>;

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
        let max_batch = max_batch.max(1);
        let core = DriverCore::new(max_batch);
        let seams = Seams::default();
        let (ends, _) = broadcast::channel(LEASE_END_BUFFER);
        let handle = DriverHandle { tx, ready, next_gen: Arc::new(AtomicU64::new(1)), ends: ends.clone() };
        let writes = VecDeque::new();
        let driver = Self {
            raft,
            node_id,
            clock,
            metrics,
            max_batch,
            rx,
            ready_tx,
            core,
            writes,
            seams,
            ends,
            linger: None,
            quorum_poll: None,
        };
        (driver, handle)
    }

    /// A leader of a group of several that has not heard from a majority for
    /// `timeout` stops serving until it does: its writes cannot commit, so its
    /// callers get a retryable error now rather than a hang (and retry, with
    /// the same request ids, on the majority's new leader).
    /// It reads that time every tenth of `timeout` (at least every 10 ms).
    pub fn with_quorum_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.core = self.core.with_quorum_timeout(timeout.as_millis() as u64);
        self.quorum_poll = Some((timeout / 10).max(std::time::Duration::from_millis(10)));
        self
    }

    /// At most `n` log writes in flight at once (see [`core::DriverCore::with_max_inflight`]).
    pub fn with_max_inflight(mut self, n: usize) -> Self {
        self.core = self.core.with_max_inflight(n);
        self
    }

    /// After an entry's callers are answered, the next write waits up to
    /// `after` for them to come back, so their requests share one entry (see
    /// [`core`]'s docs); `None` or zero: it never waits.
    pub fn with_linger(mut self, after: Option<std::time::Duration>) -> Self {
        self.linger = after.filter(|d| !d.is_zero());
        self
    }

    /// Call the hooks of `seams` at [`CrashPoint::ReplyBeforeSend`].
    pub fn with_seams(mut self, seams: Seams) -> Self {
        self.seams = seams;
        self
    }

    /// Propose `id` as the group's cluster id in every `LeaderStart`.
    pub fn with_cluster_id(mut self, id: Option<fencelock_core::ClusterId>) -> Self {
        self.core = self.core.with_cluster_id(id);
        self
    }

    /// Run until `shutdown` resolves or every handle is dropped.
    ///
    /// The role comes from openraft's server metrics, which change only with
    /// the state, the vote, the leader or the membership: its full metrics
    /// change with every entry appended, applied or acknowledged, and waking
    /// on those cost a follower 3 % of its CPU for nothing. What only the full
    /// metrics have is read from them when needed: how long ago a majority
    /// answered, every [`Self::with_quorum_timeout`] poll while this node leads
    /// a group of several, and a fatal error, when the server metrics' sender
    /// is gone (openraft records the error in the full metrics before it drops
    /// its core, and the sender with it).
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let full = self.raft.metrics();
        let mut server_rx = self.raft.server_metrics();
        tokio::pin!(shutdown);
        let mut last = view(&server_rx.borrow_and_update(), &full.borrow(), self.node_id);
        self.step(vec![Event::Raft(last.clone())]).await;
        let mut raft_gone = false;
        let mut linger = self.linger.and_then(linger::Timer::start);
        self.core.set_linger(linger.is_some());
        // A deadline, not a sleep made anew each turn: a busy loop would
        // never let one run out.
        let mut quorum_at = crate::clock::mono_now();
        loop {
            let wake = self.core.next_wake().map(|at| Instant::from_std(self.clock.instant_at(at)));
            let lingering = self.core.lingering();
            if let Some(t) = &mut linger {
                t.follow(lingering);
            }
            let poll = self.quorum_poll.filter(|_| !raft_gone && last.is_leader && last.voters > 1);
            let poll_at = poll.map(|_| quorum_at);
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                (seq, done) = next_written(&mut self.writes) => {
                    if done.is_ok() {
                        self.seams.crash_point(CrashPoint::ReplyBeforeSend);
                    }
                    self.step(vec![Event::Written(seq, done)]).await;
                }
                changed = server_rx.changed(), if !raft_gone => {
                    last = view(&server_rx.borrow_and_update(), &full.borrow(), self.node_id);
                    let mut events = vec![Event::Raft(last.clone())];
                    if changed.is_err() {
                        raft_gone = true;
                        events.push(Event::RaftGone);
                    }
                    self.step(events).await;
                }
                msg = self.rx.recv() => match msg {
                    Some(m) => {
                        // Everything already queued goes into the same entry.
                        let mut events = vec![event(m)];
                        while events.len() < self.max_batch {
                            match self.rx.try_recv() {
                                Ok(m) => events.push(event(m)),
                                Err(_) => break,
                            }
                        }
                        self.step(events).await;
                    }
                    None => break,
                },
                () = linger::fired(&linger), if lingering => self.step(vec![Event::LingerOver]).await,
                _ = sleep_until(wake) => self.step(vec![Event::Timer]).await,
                _ = sleep_until(poll_at) => {
                    quorum_at = crate::clock::mono_now() + poll.unwrap_or_default();
                    let now = view(&server_rx.borrow(), &full.borrow(), self.node_id);
                    if now != last {
                        last = now;
                        self.step(vec![Event::Raft(last.clone())]).await;
                    }
                }
            }
        }
        for a in self.core.shut_down(shutting_down()) {
            self.execute(a);
        }
    }

    async fn step(&mut self, events: Vec<Event<ReplyTx, WaitTx>>) {
        let time = Time { now: self.clock.now(), token_floor: self.clock.token_floor() };
        let actions = self.core.step(time, events);
        for a in actions {
            match a {
                Action::Write(seq, input) => self.propose(seq, input).await,
                other => self.execute(other),
            }
        }
    }

    /// Hands the entry to openraft now, after every earlier one (the send to
    /// its core does not wait), and keeps where its answer comes.
    async fn propose(&mut self, seq: u64, input: Input) {
        let rx = self.raft.client_write_ff(input.into()).await;
        self.writes.push_back((seq, rx.map_err(|fatal| DriverError::Unavailable(fatal.to_string()))));
    }

    /// Does what `a` says, but for a write (see [`Self::propose`]).
    fn execute(&mut self, a: Action<ReplyTx, WaitTx>) {
        match a {
            Action::Write(seq, _) => {
                tracing::error!(seq, "internal: a write outside a step is not proposed");
            }
            Action::Reply(tx, r) => {
                self.publish(LeaseEnd::of_reply(&r));
                let _ = tx.send(r);
            }
            Action::Wake(w, r) => {
                let _ = w.send(r);
            }
            Action::Ready(ready) => {
                let _ = self.ready_tx.send(ready);
            }
            Action::Batched(n) => self.metrics.batch(n),
            Action::Effect(e) => {
                self.publish(LeaseEnd::of_effect(&e));
                self.metrics.effect(&e);
                self.metrics.locks.effect(self.clock.now(), &e);
            }
        }
    }

    /// Tells the `WatchLeases` streams (none listening is fine).
    fn publish(&self, end: Option<LeaseEnd>) {
        if let Some(end) = end {
            let _ = self.ends.send(end);
        }
    }
}

fn event(m: ToDriver) -> Event<ReplyTx, WaitTx> {
    match m {
        ToDriver::Cmd(m) => Event::Request(m),
        ToDriver::AcquireGone { key, gen, cancel } => Event::AcquireGone { key, gen, cancel },
    }
}

/// What the core needs of Raft's metrics: the role from the server metrics
/// (`server`), a fatal error and the time since a majority answered from the
/// full ones (`full`).
fn view(
    server: &openraft::metrics::RaftServerMetrics<u64, crate::raft::Member>,
    full: &openraft::RaftMetrics<u64, crate::raft::Member>,
    node_id: u64,
) -> RaftView {
    let membership = server.membership_config.membership();
    RaftView {
        fatal: full.running_state.as_ref().err().map(|e| e.to_string()),
        is_leader: server.state == ServerState::Leader && server.current_leader == Some(node_id),
        term: server.vote.leader_id().term,
        leader_addr: server.current_leader.and_then(|id| membership.get_node(&id).map(|n| n.addr.clone())),
        voters: membership.voter_ids().count(),
        millis_since_quorum_ack: full.millis_since_quorum_ack,
    }
}

/// The result of the oldest write in flight, with its sequence number (never,
/// if none is in flight). Cancel-safe: the answer stays in its receiver.
async fn next_written(
    writes: &mut VecDeque<(u64, Result<WriteRx, DriverError>)>,
) -> (u64, Result<Output, DriverError>) {
    let Some((seq, front)) = writes.front_mut() else {
        return std::future::pending().await;
    };
    let seq = *seq;
    let res = match front {
        Ok(rx) => match rx.await {
            Ok(Ok(resp)) => Ok(resp.data),
            Ok(Err(e)) => Err(map_write_error(RaftError::APIError(e))),
            Err(_) => Err(DriverError::Unavailable("the Raft node stopped before answering a write".into())),
        },
        Err(e) => Err(e.clone()),
    };
    writes.pop_front();
    (seq, res)
}

fn map_write_error(e: WriteError) -> DriverError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            DriverError::NotLeader { leader: f.leader_node.map(|n| n.addr) }
        }
        other => DriverError::Unavailable(other.to_string()),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
