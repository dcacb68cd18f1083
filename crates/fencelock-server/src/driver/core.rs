//! The driver's decisions, without IO: [`DriverCore`] takes events (a request
//! arrived, a caller went away, the write in flight finished, the Raft role
//! changed, a timer fired) with the time they happen at, and answers with
//! [`Action`]s (write this entry, reply to this caller, wake this waiter, say
//! whether this node serves). The tokio shell in `driver` owns the channels,
//! the Raft handle and the timers, and does what the actions say; the tests
//! beside this file drive the core alone and check the exact actions.
//!
//! The rules it keeps are the driver's (see `driver`): persist then reply,
//! up to [`DriverCore::with_max_inflight`] writes in flight with everything
//! that arrives meanwhile gathered into the next, `LeaderStart` first under
//! each new leadership, ticks at the engine's deadlines, a retried acquire
//! owning its wait, and failing closed when the node stops or is cut off from
//! a majority.
//!
//! ## Several writes in flight (pipelining)
//!
//! A new write starts whenever there is something to write and fewer than
//! `max_inflight` are in flight, so a lone request is never delayed, and a
//! burst gives the log several entries at once to cover with one fsync (the
//! segment log's group commit). Each [`Action::Write`] carries a sequence
//! number that its [`Event::Written`] repeats. The rules:
//!
//! - **Persist, then reply.** An entry's output is acted on (replies, wakes,
//!   effects, the next deadline) only once its write returned.
//! - **Proposal order.** Outputs are acted on strictly in the order the writes
//!   were proposed: a later write's completion that arrives first is held until
//!   every earlier one is done. The shell proposes in that order too (it hands
//!   each entry to openraft before the next), so proposal order is log order
//!   and the engine's `now` of successive entries never goes back.
//! - **`LeaderStart` alone.** Under each new leadership, `LeaderStart` is
//!   proposed only when nothing else is in flight, and nothing is proposed
//!   beside it until it is applied.
//! - **A failed write** fails its own callers, and every write proposed after it
//!   that is still in flight is treated as failed too: its callers get the same
//!   retryable error now and its output, whatever it turns out to be, is never
//!   acted on. What this relies on from openraft 0.9: `client_write` returns
//!   `Ok` only once the entry is committed and applied; an error
//!   (`ForwardToLeader` when leadership is lost, `Fatal` when the node stops)
//!   leaves the entry's fate unknown: it may still be committed by a later
//!   leader. Later entries of the same leader come after it in the log, so
//!   their fate is no better known; treating them as failed is always safe
//!   because a caller that is told "unavailable" retries with the same request
//!   id and the engine's dedup answers it with the first outcome (exactly
//!   once). What is lost is only what an ignored output would have told (a
//!   queued waiter's wake): the same as for the failed write itself, whose
//!   client finds the outcome by retrying.
//! - **Losing leadership** (a follower, or a new term) with writes in flight:
//!   their callers get the retryable error at once and their outputs are never
//!   acted on; the new term's `LeaderStart` waits until they have all returned.
//! - After a failure, nothing is proposed until `retry_at`; while cut off from a
//!   majority nothing is proposed and the callers in flight are told at once
//!   (their outputs still count for the wait table and the next deadline: the
//!   term is the same).
//!
//! `max_inflight = 1` is the driver as it was before pipelining: one write at
//! a time, each step's arrivals batched into the next.
//!
//! ## Lingering for the callers just answered
//!
//! With [`DriverCore::set_linger`] on, once an entry's callers are answered
//! the next write waits, while nothing is in flight, until as many requests
//! are pending as callers were answered with something they act on at once
//! (a reply other than `Queued`, a granted wait), or until the shell's short
//! timer ends the wait ([`Event::LingerOver`]); a due tick never waits. On
//! one contended lock an entry answers two clients at once: the holder that
//! released (it comes back with its next acquire) and the next holder (it
//! comes back with its release). Without the wait, whichever arrives first
//! is written alone, the other waits for that whole write, and every
//! handoff pays about two fsyncs in series; with it both go into one entry.
//! A caller answered `Queued` is not counted: it sends nothing until its
//! wait ends.
//!
//! `R` is how a caller is answered and `W` how a waiter is woken: the shell's
//! oneshot senders, the tests' plain ids, the simulator's connections
//! (`fencelock-sim` runs this core behind simulated connections and a
//! simulated log). Its collections are ordered, so the same events give the
//! same actions in the same order.

use std::collections::{BTreeMap, VecDeque};

use fencelock_core::{
    Acquire, ClusterId, Command, Effect, Grant, Input, LeaseId, Millis, Output, Reply, RequestId, WaitEnd,
};

use super::DriverError;

/// Pause after a failed log write before the next attempt, so a failing disk is
/// not hammered in a loop.
pub const RETRY_AFTER_FAILED_WRITE_MS: Millis = 100;

/// Most bytes of commands in one log entry (as estimated by [`approx_bytes`]):
/// a burst of large requests is split over several entries instead of making one
/// entry that every member must write, send and hold in memory at once.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// How many log writes may be in flight at once unless set otherwise (see
/// [`DriverCore::with_max_inflight`]): one, as measured. The whole-node bench
/// (`segment_log`'s, 32 clients, release build, a loaded 2-core VM) gave, on
/// redb and on the segment log alike, the most grants per second with 1 in
/// flight (2,700-4,200/s), about 35-50 % less with 4 and 3-6× less with 16:
/// more entries in flight make each entry smaller (15 grants per entry with 1,
/// 5 with 4, 1.6 with 16) and through openraft 0.9 every entry costs more CPU
/// than the fsyncs it shares save. Raise it where fsync, not CPU, is the limit.
pub const DEFAULT_MAX_INFLIGHT: usize = 1;

/// How a queued acquire's wait ended, as its waiter is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    Granted {
        grant: Grant,
        waited_ms: u64,
    },
    /// A queued multi-acquire was granted: every lock, in the order asked.
    GrantedAll {
        grants: Vec<Grant>,
        waited_ms: u64,
    },
    Ended(WaitEnd),
}

/// One command and who awaits its outcome.
#[derive(Debug)]
pub struct Msg<R, W> {
    pub cmd: Command,
    /// Who gets the engine's reply (`None`: the cancel of a caller that went away).
    pub reply: Option<R>,
    /// For an acquire that may queue: who is woken when its wait ends.
    pub waiter: Option<W>,
    /// For an acquire of a caller that reports when it is done: its
    /// generation (a retry has a newer one).
    pub gen: Option<Gen>,
}

/// What the core needs to know of the Raft node, from its metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RaftView {
    /// The node stopped after a fatal error (a storage failure).
    pub fatal: Option<String>,
    /// This node is the leader (openraft says so and names it).
    pub is_leader: bool,
    pub term: u64,
    /// The leader's client address, if known (hints for refused callers).
    pub leader_addr: Option<String>,
    /// How many voters the group has.
    pub voters: usize,
    /// On a leader: how long since a majority last answered.
    pub millis_since_quorum_ack: Option<u64>,
}

/// Something that happened, for [`DriverCore::step`].
#[derive(Debug)]
pub enum Event<R, W> {
    /// A command arrived.
    Request(Msg<R, W>),
    /// The caller of the acquire `gen` of `key` is done with it; `cancel` is
    /// the `CancelWait` to write if it went away mid-flight.
    AcquireGone { key: (LeaseId, RequestId), gen: Gen, cancel: Option<Command> },
    /// The write of this sequence number (from its [`Action::Write`]) finished:
    /// the engine's output, or why it failed.
    Written(u64, Result<Output, DriverError>),
    /// Raft's view changed.
    Raft(RaftView),
    /// The Raft node is gone (its metrics stopped): fail closed.
    RaftGone,
    /// The time came for [`DriverCore::next_wake`].
    Timer,
    /// The wait for the callers just answered is over (see the module docs):
    /// write what is pending.
    LingerOver,
}

/// What the shell must do, in order.
#[derive(Debug, PartialEq)]
pub enum Action<R, W> {
    /// Propose this entry, after every earlier one (its sequence number comes
    /// back in its [`Event::Written`]).
    Write(u64, Input),
    Reply(R, Result<Reply, DriverError>),
    Wake(W, Result<WaitOutcome, DriverError>),
    /// Whether this node serves requests now.
    Ready(bool),
    /// A batch of this many commands was written (for the metrics).
    Batched(usize),
    /// The engine reported this effect (for the metrics).
    Effect(Effect),
}

/// The time of an event: the engine's clock, and the token floor a
/// `LeaderStart` written now would carry (see [`fencelock_core::token_floor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Time {
    pub now: Millis,
    pub token_floor: u64,
}

/// Which of the acquires of one (lease, request id) is the newest: the
/// client's attempt number first, then the order of arrival. An older attempt
/// can arrive after a newer one (it was delayed on a connection the client has
/// given up, or went to another server first): ordered by arrival alone, it
/// would take the wait over, and its connection's cancel would release a grant
/// that the newer attempt's caller is waiting for, whose retry then gets a
/// second grant for one request id. A client that sends no attempt number
/// (0) is ordered by arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gen {
    /// The client's attempt number of this request id (1, 2, …; 0 = not sent).
    pub attempt: u32,
    /// The order in which the acquire reached the driver.
    pub arrival: u64,
}

/// Who owns the wait of one (lease, request id): the newest acquire of it (by
/// [`Gen`]), and how many callers of it have not reported that they are done.
#[derive(Debug)]
struct Owner {
    newest: Gen,
    live: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Follower,
    /// Leader of this term; its `LeaderStart` is not applied yet.
    Starting(u64),
    /// Leader of this term, serving.
    Ready(u64),
}

#[derive(Debug)]
struct Inflight<R, W> {
    seq: u64,
    msgs: Vec<Msg<R, W>>,
    /// `Some(term)` when this write is the `LeaderStart` of `term`.
    leader_start: Option<u64>,
    /// Its result, once it returned (held until every earlier write is done).
    done: Option<Result<Output, DriverError>>,
    /// Its callers were told it failed (an earlier write failed, or the term
    /// was lost): its output is never acted on.
    void: bool,
}

/// The driver's state and rules. See the module docs.
#[derive(Debug)]
pub struct DriverCore<R, W> {
    max_batch: usize,
    /// How long a leader of a group of several may go without an answer from
    /// a majority before it stops serving (`None`: never).
    quorum_timeout_ms: Option<u64>,
    /// The cluster id this node proposes in its `LeaderStart`s.
    cluster_id: Option<ClusterId>,
    pending: Vec<Msg<R, W>>,
    waiters: BTreeMap<(LeaseId, RequestId), W>,
    /// Per (lease, request id) with a caller not done yet: the newest acquire
    /// of it (the only one whose cancel is written).
    owners: BTreeMap<(LeaseId, RequestId), Owner>,
    /// How many of `pending` are cancels of callers that went away: an arriving
    /// acquire scans `pending` for its key's cancel only when there is one.
    unwritten_cancels: usize,
    /// The writes in flight, in proposal order.
    inflight: VecDeque<Inflight<R, W>>,
    max_inflight: usize,
    /// The sequence number of the next write.
    next_seq: u64,
    /// The engine's next deadline (a tick must be written then).
    tick_at: Option<Millis>,
    tick_due: bool,
    /// After a failed write, no new write before this instant.
    retry_at: Option<Millis>,
    role: Role,
    leader_hint: Option<String>,
    /// Set once the Raft node has stopped: every request is answered with this.
    stopped: Option<String>,
    /// Set while this node leads but is cut off from a majority.
    cut_off: Option<String>,
    /// What the shell was last told by [`Action::Ready`].
    ready: bool,
    /// Whether the next write waits for the callers just answered.
    linger: bool,
    /// How many callers the last acted-on entry answered with something they
    /// act on at once: the requests the next write waits for (0: none).
    expected: usize,
    /// A write is held back for them now (the shell runs the timer).
    lingering: bool,
}

type Actions<R, W> = Vec<Action<R, W>>;

impl<R, W> DriverCore<R, W> {
    /// A follower with nothing pending. `max_batch`: most commands in one entry.
    pub fn new(max_batch: usize) -> Self {
        Self {
            max_batch: max_batch.max(1),
            quorum_timeout_ms: None,
            cluster_id: None,
            pending: Vec::new(),
            waiters: BTreeMap::new(),
            owners: BTreeMap::new(),
            unwritten_cancels: 0,
            inflight: VecDeque::new(),
            max_inflight: DEFAULT_MAX_INFLIGHT,
            next_seq: 1,
            tick_at: None,
            tick_due: false,
            retry_at: None,
            role: Role::Follower,
            leader_hint: None,
            stopped: None,
            cut_off: None,
            ready: false,
            linger: false,
            expected: 0,
            lingering: false,
        }
    }

    /// Whether the next write waits for the callers just answered (see the
    /// module docs); off by default. The shell turns it on only where it has
    /// a timer to end the wait.
    pub fn set_linger(&mut self, on: bool) {
        self.linger = on;
        self.expected = 0;
        self.lingering = false;
    }

    /// A write is held back for the callers just answered: the shell must
    /// send [`Event::LingerOver`] after its short wait.
    pub fn lingering(&self) -> bool {
        self.lingering
    }

    /// See `Driver::with_quorum_timeout`.
    pub fn with_quorum_timeout(mut self, ms: u64) -> Self {
        self.quorum_timeout_ms = Some(ms);
        self
    }

    /// At most `n` writes in flight at once (at least 1; 1 is one at a time).
    pub fn with_max_inflight(mut self, n: usize) -> Self {
        self.max_inflight = n.max(1);
        self
    }

    /// Propose `id` as the group's cluster id in every `LeaderStart`.
    pub fn with_cluster_id(mut self, id: Option<ClusterId>) -> Self {
        self.cluster_id = id;
        self
    }

    /// When the shell must send [`Event::Timer`] (the engine's next deadline or
    /// the end of the pause after a failed write), if ever.
    pub fn next_wake(&self) -> Option<Millis> {
        match (self.tick_at, self.retry_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Handles `events`, all at `time`, then starts the next write if one can
    /// start: every request among the events goes into the same entry (group
    /// commit).
    pub fn step(&mut self, time: Time, events: impl IntoIterator<Item = Event<R, W>>) -> Actions<R, W> {
        let mut out = Vec::new();
        for e in events {
            self.handle(time, e, &mut out);
        }
        self.maybe_write(time, &mut out);
        out
    }

    /// Everything pending and waiting fails with `e`, as when the server shuts down.
    pub fn shut_down(&mut self, e: DriverError) -> Actions<R, W> {
        let mut out = Vec::new();
        self.fail_all(e, &mut out);
        out
    }

    fn handle(&mut self, time: Time, e: Event<R, W>, out: &mut Actions<R, W>) {
        match e {
            Event::Request(m) => self.accept(m, out),
            Event::AcquireGone { key, gen, cancel } => {
                if let Some(cmd) = self.acquire_gone(key, gen, cancel) {
                    self.accept(Msg { cmd, reply: None, waiter: None, gen: None }, out);
                }
            }
            Event::Written(seq, res) => self.on_written(time, seq, res, out),
            Event::Raft(view) => self.on_raft(view, out),
            Event::RaftGone => self.stop_serving("the Raft node stopped".into(), out),
            Event::Timer => self.on_timer(time),
            Event::LingerOver => self.expected = 0,
        }
    }

    fn on_timer(&mut self, time: Time) {
        if self.tick_at.is_some_and(|t| t <= time.now) {
            self.tick_at = None;
            self.tick_due = true;
        }
        if self.retry_at.is_some_and(|t| t <= time.now) {
            self.retry_at = None;
        }
    }

    fn accept(&mut self, msg: Msg<R, W>, out: &mut Actions<R, W>) {
        if let (Command::Acquire(a), Some(gen)) = (msg.cmd.inner(), msg.gen) {
            self.acquire_arrived((a.lease, a.req), gen);
        }
        let refused = match (&self.stopped, self.role, &self.cut_off) {
            (Some(why), _, _) => Some(DriverError::Unavailable(why.clone())),
            (None, Role::Follower, _) => Some(DriverError::NotLeader { leader: self.leader_hint.clone() }),
            (None, _, Some(why)) => Some(DriverError::Unavailable(why.clone())),
            _ => None,
        };
        match refused {
            Some(e) => reply(out, msg.reply, Err(e)),
            None => {
                self.unwritten_cancels += usize::from(is_dropped_cancel(&msg));
                self.pending.push(msg);
            }
        }
    }

    /// An acquire (maybe a retry) arrived: it owns the wait of its key from now on,
    /// so an unwritten cancel of that key, from an older caller, is dropped.
    fn acquire_arrived(&mut self, key: (LeaseId, RequestId), gen: Gen) {
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
    fn acquire_gone(&mut self, key: (LeaseId, RequestId), gen: Gen, cancel: Option<Command>) -> Option<Command> {
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

    /// Starts writes while one may start and there is something to write.
    fn maybe_write(&mut self, time: Time, out: &mut Actions<R, W>) {
        self.lingering = false;
        while self.may_write() && !self.holds_for_answered() && self.start_write(time, out) {
            self.expected = 0;
        }
    }

    /// Whether the next write waits for the callers just answered: lingering
    /// is on, nothing is in flight, no tick is due, and fewer requests are
    /// pending than callers were answered (sets [`Self::lingering`]).
    fn holds_for_answered(&mut self) -> bool {
        let ready = matches!(self.role, Role::Ready(_));
        self.lingering = self.linger
            && ready
            && self.inflight.is_empty()
            && !self.tick_due
            && !self.pending.is_empty()
            && self.pending.len() < self.expected;
        self.lingering
    }

    /// Whether a new write may start: room in flight, no pause after a failure,
    /// not cut off, and no `LeaderStart` in flight.
    fn may_write(&self) -> bool {
        let starting = self.inflight.iter().any(|w| w.leader_start.is_some());
        self.inflight.len() < self.max_inflight && self.retry_at.is_none() && self.cut_off.is_none() && !starting
    }

    /// Starts the next write if there is one to start; whether it did.
    fn start_write(&mut self, time: Time, out: &mut Actions<R, W>) -> bool {
        match self.role {
            Role::Follower => false,
            // `LeaderStart` goes out alone: nothing of an older term in flight.
            Role::Starting(_) if !self.inflight.is_empty() => false,
            Role::Starting(term) => {
                // The floor and the cluster id: see `raft::identity` (issue 14).
                let input =
                    Input::LeaderStart { now: time.now, token_floor: time.token_floor, cluster_id: self.cluster_id };
                self.propose(input, Vec::new(), Some(term), out);
                true
            }
            Role::Ready(_) => {
                if self.pending.is_empty() && !self.tick_due {
                    return false;
                }
                let n = batch_len(&self.pending, self.max_batch);
                let mut msgs: Vec<Msg<R, W>> = self.pending.drain(..n).collect();
                self.unwritten_cancels -= msgs.iter().filter(|m| is_dropped_cancel(m)).count();
                let cmds = msgs.iter_mut().map(|m| into_batch(&mut m.cmd)).collect();
                self.tick_due = false;
                out.push(Action::Batched(msgs.len()));
                self.propose(Input::Batch { now: time.now, cmds }, msgs, None, out);
                true
            }
        }
    }

    fn propose(&mut self, input: Input, msgs: Vec<Msg<R, W>>, leader_start: Option<u64>, out: &mut Actions<R, W>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.inflight.push_back(Inflight { seq, msgs, leader_start, done: None, void: false });
        out.push(Action::Write(seq, input));
    }

    /// Write `seq` returned: its result is kept, then every returned write at
    /// the head of the queue is acted on, in proposal order.
    fn on_written(&mut self, time: Time, seq: u64, res: Result<Output, DriverError>, out: &mut Actions<R, W>) {
        let Some(w) = self.inflight.iter_mut().find(|w| w.seq == seq && w.done.is_none()) else { return };
        w.done = Some(res);
        while self.inflight.front().is_some_and(|w| w.done.is_some()) {
            let Some(mut done) = self.inflight.pop_front() else { break };
            match done.done.take() {
                _ if done.void => {}
                Some(Ok(output)) => self.on_applied(done, output, out),
                Some(Err(e)) => self.on_failed(time, done, e, out),
                None => {}
            }
        }
    }

    /// A write failed: its callers and those of every write in flight after it
    /// get `e` (see the module docs), and writing pauses.
    fn on_failed(&mut self, time: Time, done: Inflight<R, W>, e: DriverError, out: &mut Actions<R, W>) {
        tracing::warn!(error = %e, "log write failed");
        for m in done.msgs {
            reply(out, m.reply, Err(e.clone()));
        }
        self.void_inflight(e, out);
        self.retry_at = Some(time.now.saturating_add(RETRY_AFTER_FAILED_WRITE_MS));
    }

    /// Every write in flight is treated as failed with `e`: its callers are told
    /// now, and its output is never acted on.
    fn void_inflight(&mut self, e: DriverError, out: &mut Actions<R, W>) {
        for w in &mut self.inflight {
            w.void = true;
            w.leader_start = None;
            for m in w.msgs.drain(..) {
                reply(out, m.reply, Err(e.clone()));
            }
        }
    }

    fn on_applied(&mut self, done: Inflight<R, W>, output: Output, out: &mut Actions<R, W>) {
        if let Some(term) = done.leader_start {
            if self.role == Role::Starting(term) {
                self.role = Role::Ready(term);
                self.set_ready(self.cut_off.is_none(), out);
                tracing::info!(term, "leader ready: restored leases got a fresh TTL");
            }
        }
        self.deliver(done.msgs, output, out);
    }

    /// Sends each caller its reply, registers queued waiters, then acts on
    /// effects (replies first, so a waiter queued and granted in one batch is found).
    fn deliver(&mut self, msgs: Vec<Msg<R, W>>, output: Output, out: &mut Actions<R, W>) {
        let first = out.len();
        let mut replies = output.replies.into_iter();
        for m in msgs {
            let Some(r) = replies.next() else {
                reply(out, m.reply, Err(DriverError::Unavailable("internal: missing reply".into())));
                continue;
            };
            if let (Reply::Queued { .. }, Command::Acquire(a), Some(w)) = (&r, m.cmd.inner(), m.waiter) {
                // A superseded caller of a retried acquire does not take the wait back.
                let key = (a.lease, a.req);
                if self.owners.get(&key).is_none_or(|o| m.gen.is_none_or(|g| g >= o.newest)) {
                    self.waiters.insert(key, w);
                }
            }
            reply(out, m.reply, Ok(r));
        }
        let wakes: Vec<Option<Action<R, W>>> =
            (0..output.effects.len()).map(|i| self.wake(&output.effects[i..])).collect();
        for (e, wake) in output.effects.into_iter().zip(wakes) {
            out.extend(wake);
            out.push(Action::Effect(e));
        }
        self.tick_at = output.next_deadline;
        if self.linger {
            self.expected = out[first..].iter().filter(|a| comes_back(a)).count();
        }
    }

    /// Completes the wait of a queued acquire, for the first of `effects` (the
    /// rest are those after it). A waiter with no registered caller was queued
    /// before a leader change or restart; its client retries with the same
    /// request id and then finds the outcome.
    ///
    /// A multi-acquire's grants are one `Granted` effect per lock (watch events
    /// and metrics count per lock), which the engine pushes one after another
    /// in the step that grants them all: the waiter is woken once, at the first,
    /// with the run of grants of its (lease, req) that starts there. Collecting
    /// them here is simpler than an extra effect carrying the set, which every
    /// other reader of effects would have to skip.
    fn wake(&mut self, effects: &[Effect]) -> Option<Action<R, W>> {
        let (key, outcome) = match effects.first()? {
            Effect::Granted { grant, req, queued: true, waited_ms, .. } => {
                let grants = grant_run(effects, grant.lease, *req);
                let outcome = match grants.len() {
                    1 => WaitOutcome::Granted { grant: grant.clone(), waited_ms: *waited_ms },
                    _ => WaitOutcome::GrantedAll { grants, waited_ms: *waited_ms },
                };
                ((grant.lease, *req), outcome)
            }
            Effect::WaitEnded { lease, req, why, .. } => ((*lease, *req), WaitOutcome::Ended(why.clone())),
            _ => return None,
        };
        self.waiters.remove(&key).map(|w| Action::Wake(w, Ok(outcome)))
    }

    /// Fails closed: answers everything with `why` from now on. Nothing more is
    /// written, so the last durable state is what a restart will find.
    fn stop_serving(&mut self, why: String, out: &mut Actions<R, W>) {
        if self.stopped.is_some() {
            return;
        }
        tracing::error!(reason = %why, "not serving any more; restart the server");
        let why = format!("{why}; nothing more is written and the last durable state is kept; restart the server");
        self.stopped = Some(why.clone());
        self.role = Role::Follower;
        self.set_ready(false, out);
        self.fail_all(DriverError::Unavailable(why), out);
    }

    fn on_raft(&mut self, view: RaftView, out: &mut Actions<R, W>) {
        if let Some(fatal) = &view.fatal {
            return self.stop_serving(format!("the server stopped after a fatal error: {fatal}"), out);
        }
        if self.stopped.is_some() {
            return;
        }
        self.leader_hint = view.leader_addr.clone();
        let role = match (view.is_leader, self.role) {
            (false, _) => Role::Follower,
            (true, Role::Starting(t) | Role::Ready(t)) if t == view.term => self.role,
            (true, _) => Role::Starting(view.term),
        };
        if role != self.role {
            tracing::info!(?role, term = view.term, "role changed");
            self.role = role;
            if !matches!(role, Role::Ready(_)) {
                self.set_ready(false, out);
                self.retry_at = None;
            }
            // Nothing acts on an output of a lost term.
            let lost = match role {
                Role::Follower => DriverError::NotLeader { leader: self.leader_hint.clone() },
                _ => DriverError::Unavailable(format!("leadership changed (term {}) while writing", view.term)),
            };
            self.void_inflight(lost, out);
            if role == Role::Follower {
                let leader = self.leader_hint.clone();
                self.fail_all(DriverError::NotLeader { leader }, out);
            }
        }
        self.check_quorum(&view, out);
    }

    /// Stops serving while this leader is cut off from a majority, and serves
    /// again once a majority answers.
    fn check_quorum(&mut self, view: &RaftView, out: &mut Actions<R, W>) {
        let Some(limit) = self.quorum_timeout_ms else { return };
        let silent = view.millis_since_quorum_ack.filter(|ms| *ms > limit);
        let lost = silent.filter(|_| view.is_leader && view.voters > 1);
        match (lost, self.cut_off.is_some()) {
            (Some(ms), false) => {
                let why = format!(
                    "this node leads but has not heard from a majority of its group for {ms} ms; the outcome of \
                     requests in flight here is unknown; retry on another node"
                );
                tracing::warn!(ms, "cut off from a majority: serving nothing until it answers again");
                self.cut_off = Some(why.clone());
                self.set_ready(false, out);
                let e = DriverError::Unavailable(why);
                self.fail_all(e.clone(), out);
                for inflight in &mut self.inflight {
                    for m in &mut inflight.msgs {
                        if let Some(r) = m.reply.take() {
                            out.push(Action::Reply(r, Err(e.clone())));
                        }
                        m.waiter = None;
                    }
                }
            }
            (None, true) => {
                self.cut_off = None;
                if matches!(self.role, Role::Ready(_)) {
                    tracing::info!("a majority answers again: serving");
                    self.set_ready(true, out);
                    // Expiries were not ticked meanwhile: tick now.
                    self.tick_due = true;
                }
            }
            _ => {}
        }
    }

    fn set_ready(&mut self, ready: bool, out: &mut Actions<R, W>) {
        if self.ready != ready {
            self.ready = ready;
            out.push(Action::Ready(ready));
        }
    }

    fn fail_all(&mut self, e: DriverError, out: &mut Actions<R, W>) {
        self.unwritten_cancels = 0;
        for m in self.pending.drain(..) {
            reply(out, m.reply, Err(e.clone()));
        }
        for (_, w) in std::mem::take(&mut self.waiters) {
            out.push(Action::Wake(w, Err(e.clone())));
        }
        self.tick_at = None;
        self.tick_due = false;
    }
}

fn reply<R, W>(out: &mut Actions<R, W>, to: Option<R>, r: Result<Reply, DriverError>) {
    if let Some(to) = to {
        out.push(Action::Reply(to, r));
    }
}

/// Whether the caller `a` answers is likely to send its next request at once:
/// a reply other than `Queued` (whose caller waits on), or a granted wait.
fn comes_back<R, W>(a: &Action<R, W>) -> bool {
    match a {
        Action::Reply(_, Ok(r)) => !matches!(r, Reply::Queued { .. }),
        Action::Wake(_, Ok(WaitOutcome::Granted { .. } | WaitOutcome::GrantedAll { .. })) => true,
        _ => false,
    }
}

/// `m` is the `CancelWait` of a caller that went away (nobody awaits its reply).
fn is_dropped_cancel<R, W>(m: &Msg<R, W>) -> bool {
    m.reply.is_none() && matches!(m.cmd.inner(), Command::CancelWait { .. })
}

/// `cmd` is a `CancelWait` of the acquire `(lease, req)`.
fn cancels(cmd: &Command, (lease, req): (LeaseId, RequestId)) -> bool {
    matches!(cmd.inner(), Command::CancelWait { lease: l, req: r, .. } if (*l, *r) == (lease, req))
}

/// How many of the first `pending` commands go into the next entry: at most
/// `max_batch`, at most [`MAX_BATCH_BYTES`], and always at least one.
pub fn batch_len<R, W>(pending: &[Msg<R, W>], max_batch: usize) -> usize {
    let mut bytes = 0;
    let fits = pending.iter().take(max_batch).take_while(|m| {
        bytes += approx_bytes(&m.cmd);
        bytes <= MAX_BATCH_BYTES
    });
    fits.count().max(1).min(pending.len())
}

/// The grants of the queued `Granted` effects of `(lease, req)` at the head of
/// `effects`, up to the first effect that is not one.
fn grant_run(effects: &[Effect], lease: LeaseId, req: RequestId) -> Vec<Grant> {
    let of_wait = |e: &Effect| match e {
        Effect::Granted { grant, req: r, queued: true, .. } if grant.lease == lease && *r == req => Some(grant.clone()),
        _ => None,
    };
    effects.iter().map_while(of_wait).collect()
}

/// Roughly how many bytes `cmd` takes in an entry: fixed fields plus its lock name
/// (validated commands have names of at most 512 bytes), and an acquire's
/// identity and value, or a new value (base64 in JSON: 4 characters per 3 bytes).
pub fn approx_bytes(cmd: &Command) -> usize {
    const FIXED: usize = 128;
    FIXED
        + match cmd {
            Command::Acquire(a) => {
                let also: usize = a.also.iter().map(|l| l.len() + 8).sum();
                a.lock.len() + also + a.identity.len() + a.once_per.len() + a.value.len().div_ceil(3) * 4
            }
            Command::Release { lock, .. } | Command::CancelWait { lock, .. } | Command::Downgrade { lock, .. } => {
                lock.len()
            }
            Command::SetValue { lock, value, .. } => lock.len() + value.len().div_ceil(3) * 4,
            Command::CompleteSlot { lock, slot, .. } => lock.len() + slot.len(),
            Command::Resize { lock, .. } => lock.len(),
            Command::ReportRefusal { lock, resource, .. } => lock.len() + resource.len(),
            Command::GrantLease { .. } | Command::KeepAlive { .. } | Command::Revoke { .. } => 0,
            Command::As { caller, cmd } => caller.name.len() + approx_bytes(cmd),
            Command::Policy(change) => serde_json::to_vec(change).map_or(1024, |j| j.len()),
        }
}

/// Moves a proposed command into its batch (no copy of its names and value),
/// leaving in its message only what is read of it once written: an acquire's
/// (lease, request id), to register its waiter (see `deliver`).
fn into_batch(cmd: &mut Command) -> Command {
    let kept = match cmd.inner() {
        Command::Acquire(a) => Command::Acquire(Acquire {
            req: a.req,
            lease: a.lease,
            lock: String::new(),
            wait_ms: 0,
            lock_delay_ms: 0,
            identity: String::new(),
            value: Vec::new(),
            mode: Default::default(),
            weight: 1,
            permits: 0,
            hold_at_least_ms: 0,
            once_per: String::new(),
            also: Vec::new(),
        }),
        _ => Command::KeepAlive { req: RequestId(0), lease: LeaseId(0) },
    };
    std::mem::replace(cmd, kept)
}
