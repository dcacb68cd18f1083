//! The engine state machine: [`Engine::step`] turns one [`Input`] into an
//! [`Output`] (replies, effects, next deadline); the query methods read it.
//!
//! # Time
//! Every input carries `now`; the engine never reads a clock. A batch first
//! *advances* to its `now`: due timers fire one by one in deadline order, and the
//! engine's clock moves to each timer's own deadline as it fires, so the outcome
//! does not depend on how often the driver ticks (a lease that expired at 500 closes
//! its lock-delay from 500, and a waiter granted at 600 waited until 600, even when
//! the tick comes at 1000). Timers due at the same instant fire lease expiries
//! first, then lock reopenings, then wait timeouts, each by id. Then the commands
//! apply at `now`. A batch whose `now` is behind the engine's clock applies at the
//! engine's clock: time never goes back under one leader.
//!
//! # Retries (INV-6)
//! Request ids are chosen by clients: `GrantLease` ids are global, the others are
//! scoped to their lease, and a client must not reuse one for a different request.
//! A retry (same lease, same `req`) is answered from what the engine remembers
//! instead of being applied again:
//! - an acquire still in a queue gets `Queued { position }` with its *current*
//!   position (it is not queued again, its wait deadline is unchanged);
//! - an acquire granted (now or later) gets `Acquired(grant)`, the same grant, even
//!   if it has been released since; a multi-acquire gets `AcquiredAll` with the
//!   same grants (remembered, or, if forgotten, the ones it still holds);
//! - an acquire whose wait timed out gets `Busy` describing the lock *now*;
//! - a try-acquire that was busy gets the same `Busy` again;
//! - a keep-alive gets `LeaseKept` again *without* moving the deadline again
//!   (among the lease's last [`KEEPALIVES_PER_LEASE`] keep-alives);
//! - a downgrade that downgraded gets `Downgraded` again (a `NotHolder` is not
//!   remembered, as for a release);
//! - a release that released gets `Released` again (a `NotHolder` is not
//!   remembered, since a wrong release changes nothing, INV-5: its retry is
//!   evaluated again, and is `NotHolder` again);
//! - a revoke gets `LeaseRevoked` again (from a global memory of the last
//!   [`REVOKED_MEMORY`] revokes, since the lease itself is gone);
//! - a grant-lease gets the same `LeaseGranted` while that lease lives.
//!
//! Each lease remembers the final outcomes of its last [`DEDUP_PER_LEASE`]
//! requests, and apart from them the request ids of its last
//! [`KEEPALIVES_PER_LEASE`] keep-alives (whose answer is the lease's id and
//! TTL: a live lease's keep-alives neither push its other outcomes out nor
//! fill 256 slots of ~56 bytes); they go with the lease. A keep-alive retried
//! after more keep-alives than that is applied again: its answer is the same,
//! and it moves the deadline from now, as the client that retried it meant. `CancelWait` makes the engine forget its
//! request, so a later acquire with that id is a fresh attempt. Invalid commands
//! are rejected before any of this and leave no trace (INV-9).
//!
//! # Memory per lease (issue 19 §4, issue 38 §3)
//! An idle lease holding one lock of its own costs the engine about 329 bytes
//! of heap at 1M leases (617 before issue 38's compact records, 1,505 before
//! issue 19's compact layout), measured by the counting allocator of
//! `tests/it/footprint.rs` with `FOOTPRINT_LEASES=1000000 cargo nextest run -p
//! fencelock-core --release footprint:: --run-ignored only --no-capture` on a
//! 2-core machine (of which 8 are the test's own list of lease ids):
//! - the lease record (128), in place in its chunk of the lease map with its
//!   id (8): it keeps in place its one hold (32, a [`small::Small`]) and its
//!   one remembered reply (48, a [`dedup::Dedup`]), and behind a pointer each
//!   its waits (boxed while it waits: [`ondemand::OnDemand`]), its keep-alives
//!   and its owner; its TTL is 32 bits (`state::ms32`);
//! - two more map slots of 16 bytes, in the sorted vector chunks of a
//!   [`cowmap::CowMap`]: its `GrantLease` request in `grant_reqs`, and its
//!   expiry timer (expiries have a set of their own, by instant and id:
//!   [`timers`]);
//! - the lock record behind its `Arc` (96), which keeps its one holder (56) in
//!   place and its queue and lock-delay behind pointers (8 each), and its map
//!   slot (~24 in chunks three-quarters full on average);
//! - the name (~32), shared by the map key, the hold, the remembered reply and
//!   any timer.
//!
//! Issue 38's steps, at 1M: a set of timers per kind 617 → 588, vector chunks
//! → 513, waits, queue and lock-delay boxed while in use and the owner a
//! `Box<str>` → 449, the hold, the holder and the remembered reply in place
//! → 377, the lease records in place in their chunks → 353, 32-bit durations
//! and a thin owner pointer → 329. Those counts number leases by the engine's
//! counter; with random lease and request ids, as the server and its clients
//! make them, the same state holds 345 bytes per lease (`FOOTPRINT_IDS`), and
//! its grants take six to eight times as long: each map a random id keys is
//! searched at a random place, and a lease record inserted in place moves half
//! its chunk. The server adds its allocator's size classes and pages, the
//! watch history (a bounded ring) and the Raft log's newest entries: `fencelock-bench` W3 saw 489 bytes of resident memory per
//! idle lease at 1M once it settled (`docs/guide/performance.md`, "W3's
//! memory, where it goes"). A copy of the engine (a snapshot's, taken while
//! applies wait) shares its maps' chunks, copied on their next change: 3 ms
//! and 0.8 MB at 1M (0.26 s and 177 MB when the maps were `BTreeMap`s), and
//! keep-alives to every tenth lease while it lives copy 163 MB (a chunk of
//! lease records is copied whole). The JSON snapshot of that state is ~416
//! bytes per lease (at 1M: 416 MB in ~1.4 s; the server streams it to a
//! file). An engine read back from it holds ~327 bytes per lease (in ~4 s):
//! `decode.rs` shares the names again and trims the vectors serde grows.
//!
//! # Cost per command (issue 19 §4)
//! A command searches its lease, its lock, and its lease's memory of outcomes
//! once each where it can: a lookup's miss is noted so that the record after
//! it appends without a second scan (a scan of a full memory's request ids
//! costs less than the sorted index of them it once kept), and
//! [`Engine::stats`] reads counts kept as holders and waiters change instead
//! of walking every lock. `tests/it/per_command.rs` measures it.

mod consistency;
mod cowmap;
mod decode;
mod dedup;
mod lease;
mod lock;
mod multi;
mod ondemand;
mod query;
pub use query::LongHold;
mod queue;
mod resize;
mod restore;
mod slots;
mod small;
mod state;
mod timers;
mod vecmap;

#[cfg(all(test, feature = "mutants"))]
mod mutant_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::*;
use cowmap::{CowMap, CowSet};
use dedup::Outcome;
use state::{Lease, Lock};
use timers::{TimerKind, Timers};

/// The effects produced so far while applying one input, in order.
type Effects = Vec<Effect>;

/// The lock engine. See the crate docs and the module docs above. The whole value
/// is the snapshot of the replicated state machine,
/// serialized field by field (`remote = "Self"`: `decode.rs` wraps it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Engine {
    /// The last instant seen, on the current leader's clock.
    now: Millis,
    /// The next lease id to hand out (starts at 1).
    next_lease_id: u64,
    /// The next fencing token to hand out (starts at 1; 0 is never issued;
    /// raised to a `LeaderStart`'s token floor).
    next_token: u64,
    /// How many tokens were issued (absent in states written before it existed).
    #[serde(default)]
    tokens_issued: u64,
    /// The group's id, from the first `LeaderStart` that carried one.
    #[serde(default)]
    cluster_id: Option<ClusterId>,
    /// Test-only: the memory-token mutant also drops the next token floor.
    #[cfg(feature = "mutants")]
    #[serde(skip)]
    mutant_skip_floor: bool,
    /// In a [`CowMap`]: cloning the engine (a snapshot's copy, taken while
    /// applies wait) clones a handle per chunk of the map, and a chunk still
    /// shared is copied when it is first changed, records and all, so the
    /// copy keeps its state. The records are in the chunks themselves, not
    /// behind a pointer each: lease ids only grow, so a chunk of leases fills
    /// up and stays full, and a record in place saves the pointer, the
    /// reference count and the allocation's own overhead (~40 bytes a lease;
    /// issue 38 §3). The price: while a copy lives, the first change to a
    /// chunk copies all of its records, so keep-alives spread over every
    /// chunk copy every lease. At 1M leases (the footprint test), keep-alives
    /// of every tenth lease while a copy lived took 181 MB more, where records
    /// behind an `Arc` (copied one by one) took 60 MB; of every third, 209
    /// against 126 MB (a copy by record grows with the records changed, a
    /// copy by chunk does not). Smaller chunks do not help against changes
    /// spread out.
    leases: CowMap<LeaseId, Lease>,
    /// The live leases of each owner (see [`Command::As`]), for quotas. Absent
    /// in states written before owners existed, which had none.
    #[serde(default, skip_serializing_if = "CowMap::is_empty")]
    owned: CowMap<String, CowSet<LeaseId>>,
    /// `GrantLease` request id -> the lease it created, while that lease lives.
    grant_reqs: CowMap<RequestId, LeaseId>,
    /// The last [`REVOKED_MEMORY`] successful revokes, oldest first.
    revoked: VecDeque<(LeaseId, RequestId)>,
    /// Behind an `Arc` each: lock names arrive in any order, so chunks of
    /// locks split and are three-quarters full on average, and a copy of a
    /// chunk copies pointers rather than records. A changed lock the copy
    /// still shares is copied first (`Arc::make_mut`, at every change).
    locks: CowMap<LockName, Arc<Lock>>,
    timers: Timers,
    /// Who may do what (absent in states written before it existed).
    #[serde(default, skip_serializing_if = "Policy::is_empty")]
    policy: Policy,
    /// The completed slots of jobs that run once (absent in states written
    /// before they existed, which had none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    slots: slots::Slots,
    /// A lookup's miss, so that the record after it does not scan again.
    #[serde(skip)]
    missed: Missed,
    /// How many holders and waiters the locks have, kept as they change (so
    /// that [`Engine::stats`] is O(1)); derived, recounted when read from a
    /// snapshot.
    #[serde(skip)]
    counts: Counts,
}

/// The number of holders and of waiters over all locks (a multi-acquire
/// waits, and counts, once per lock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    holders: u64,
    waiters: u64,
}

impl Default for Engine {
    fn default() -> Self {
        Self {
            now: 0,
            next_lease_id: 1,
            next_token: 1,
            tokens_issued: 0,
            cluster_id: None,
            #[cfg(feature = "mutants")]
            mutant_skip_floor: false,
            leases: CowMap::default(),
            owned: CowMap::default(),
            grant_reqs: CowMap::default(),
            revoked: VecDeque::new(),
            locks: CowMap::default(),
            timers: Timers::default(),
            policy: Policy::default(),
            slots: BTreeMap::new(),
            missed: Missed::default(),
            counts: Counts::default(),
        }
    }
}

impl Engine {
    /// An empty engine at instant 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply one input. Never panics; an invalid command is answered with
    /// [`Reply::Rejected`] and changes nothing.
    pub fn step(&mut self, input: &Input) -> Output {
        let mut out = Output::default();
        match input {
            Input::LeaderStart { now, token_floor, cluster_id } => {
                self.leader_start(*now);
                self.raise_token_floor(*token_floor);
                self.cluster_id = self.cluster_id.or(*cluster_id);
            }
            Input::Batch { now, cmds } => {
                self.advance(*now, &mut out.effects);
                out.replies = cmds.iter().map(|c| self.apply(c, &mut out.effects)).collect();
            }
        }
        out.next_deadline = self.next_deadline();
        out
    }

    /// Test-only mutant (see [`crate::mutants`]): forget the token counter, as if it
    /// were kept only in memory, so the next grant gets token 1 again (INV-2 broken).
    /// The next `LeaderStart`'s token floor is ignored too (as if it were lower,
    /// a start in the same second), or it would hide the mutant.
    /// Bookkeeping keyed by token may then be confused; nothing panics.
    #[cfg(feature = "mutants")]
    pub fn mutant_forget_tokens(&mut self) {
        self.next_token = 1;
        self.mutant_skip_floor = true;
    }

    /// The next token is at least `floor` (see [`crate::token_floor`]).
    fn raise_token_floor(&mut self, floor: u64) {
        #[cfg(feature = "mutants")]
        if std::mem::take(&mut self.mutant_skip_floor) {
            return;
        }
        self.next_token = self.next_token.max(floor);
    }

    /// The group's id: adopted from the first `LeaderStart` that carried one,
    /// never changed after (`None` until then).
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.cluster_id
    }

    /// The last instant the engine has seen.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// The earliest pending deadline: the driver should tick at that instant.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.timers.next_at()
    }

    /// Fire every timer due at `now`, in order, then move the clock to `now`.
    fn advance(&mut self, now: Millis, fx: &mut Effects) {
        while let Some(timer) = self.timers.pop_due(now) {
            self.now = self.now.max(timer.at);
            self.fire(timer.kind, fx);
        }
        self.now = self.now.max(now);
    }

    fn fire(&mut self, kind: TimerKind, fx: &mut Effects) {
        match kind {
            TimerKind::LeaseEnd(lease) => self.expire_lease(lease, fx),
            TimerKind::Reopen(lock) => self.reopen(&lock, fx),
            TimerKind::WaitEnd(lease, req) => self.time_out_wait(lease, req, fx),
        }
    }

    /// Re-base every stored instant onto a new leader's clock (INV-8): leases get a
    /// full TTL, lock-delays restart in full, waits keep the time they had left,
    /// ages are kept. Nothing expires here.
    fn leader_start(&mut self, now: Millis) {
        let old_now = self.now;
        self.now = now;
        for lease in self.leases.values_mut() {
            lease.rebase(old_now, now);
        }
        for lock in self.locks.values_mut().map(Arc::make_mut) {
            lock.rebase(old_now, now);
        }
        self.rebase_slots(old_now, now);
        self.rebuild_timers();
    }

    fn rebuild_timers(&mut self) {
        let lease_ends = self.leases.iter().map(|(id, lease)| (lease.deadline, *id)).collect();
        let (mut reopens, mut wait_ends) = (Vec::new(), Vec::new());
        for (name, lock) in &self.locks {
            if let Some(closed) = &lock.closed {
                reopens.push((closed.until, name.clone()));
            }
            wait_ends.extend(lock.queue.iter().map(|w| (w.deadline, w.lease, w.req)));
        }
        self.timers.rebuild(lease_ends, reopens, wait_ends);
    }

    fn apply(&mut self, cmd: &Command, fx: &mut Effects) -> Reply {
        match cmd {
            Command::GrantLease { req, ttl_ms, id } => self.grant_lease(*req, *ttl_ms, *id, None),
            Command::KeepAlive { req, lease } => self.keep_alive(*req, *lease),
            Command::Revoke { req, lease } => self.revoke(*req, *lease, fx),
            Command::Acquire(a) => self.acquire(a, fx),
            Command::Release { req, lease, lock, token } => self.release(*req, *lease, lock, *token, fx),
            Command::CancelWait { req, lease, lock } => self.cancel_wait(*req, *lease, lock, fx),
            Command::SetValue { req, lease, lock, token, value } => {
                let s = lock::SetValue { req: *req, lease: *lease, lock, token: *token, value };
                self.set_value(s, fx)
            }
            Command::Downgrade { req, lease, lock, token } => {
                self.downgrade(lock::Downgrade { req: *req, lease: *lease, lock, token: *token }, fx)
            }
            Command::CompleteSlot { req, lease, lock, token, slot, exit_code } => {
                let (req, lease, token, exit_code) = (*req, *lease, *token, *exit_code);
                self.complete_slot(slots::CompleteSlot { req, lease, lock, token, slot, exit_code }, fx)
            }
            Command::As { caller, cmd } => self.apply_as(caller, cmd, fx),
            Command::Policy(_) => Reply::Rejected(EngineError::NotAdmin),
            Command::Resize { lock, permits } => self.resize(lock, *permits, fx),
            // A report changes nothing (see `Command::ReportRefusal`): its
            // answer is all, and the watch makes its event from it.
            Command::ReportRefusal { lock, refused, highest, resource } => {
                match crate::validate::check_report(lock, *refused, *highest, resource) {
                    Ok(_) => Reply::Reported,
                    Err(e) => Reply::Rejected(e),
                }
            }
        }
    }

    /// A policy change from `caller`, who must be an admin.
    fn change_policy(&mut self, caller: &Caller, change: &PolicyChange) -> Reply {
        if !caller.admin {
            return Reply::Rejected(EngineError::NotAdmin);
        }
        match self.policy.apply(change) {
            Ok(changed) => Reply::PolicyChanged { version: self.policy.version(), changed },
            Err(e) => Reply::Rejected(e),
        }
    }

    /// Who may do what (see [`crate::policy`]).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// `cmd` from `caller`: a grant makes the caller the lease's owner; any other
    /// command on a lease that has an owner needs to come from that owner (or be
    /// a revoke by an admin). Rules without state first (INV-9), then ownership,
    /// then the command's own rules.
    fn apply_as(&mut self, caller: &Caller, cmd: &Command, fx: &mut Effects) -> Reply {
        if let Err(e) = crate::validate::check_caller(caller, cmd) {
            return Reply::Rejected(e);
        }
        if let Command::GrantLease { req, ttl_ms, id } = cmd {
            return self.grant_lease(*req, *ttl_ms, *id, Some(&caller.name));
        }
        if let Command::Policy(change) = cmd {
            return self.change_policy(caller, change);
        }
        if matches!(cmd, Command::Resize { .. }) && !caller.admin {
            return Reply::Rejected(EngineError::NotAdmin);
        }
        if let Err(e) = cmd.validate().and_then(|()| self.check_owner(caller, cmd)) {
            return Reply::Rejected(e);
        }
        self.apply(cmd, fx)
    }

    /// Whether `caller` may send `cmd` on its lease (a lease that is gone is
    /// left to the command, which knows what to answer).
    fn check_owner(&self, caller: &Caller, cmd: &Command) -> Result<(), EngineError> {
        let Some(lease) = cmd.lease() else { return Ok(()) };
        if caller.admin && matches!(cmd, Command::Revoke { .. }) {
            return Ok(()); // an admin may revoke any lease
        }
        self.check_lease_owner(caller, lease)
    }

    /// Whether `caller` may use `lease` (keep it alive, lock with it, watch it):
    /// a lease with an owner is its owner's alone (INV-13). A lease that is gone
    /// or has no owner is left to the caller, which knows what to answer.
    pub fn check_lease_owner(&self, caller: &Caller, lease: LeaseId) -> Result<(), EngineError> {
        match self.leases.get(&lease).and_then(|l| l.owner()) {
            Some(o) if o != caller.name => Err(EngineError::NotOwner { lease }),
            _ => Ok(()),
        }
    }

    /// The lease exists and its deadline has not passed at the engine's clock.
    /// (Inside `advance`, a lease due at the current instant may not have been
    /// expired yet: it is not live.)
    fn is_live(&self, lease: LeaseId) -> bool {
        self.leases.get(&lease).is_some_and(|l| l.deadline > self.now)
    }

    /// Remember `outcome` for `(lease, req)`. When the last lookup missed this
    /// very request and nothing was recorded since, it has no entry: appended
    /// without a second scan of the lease's memory.
    /// The oldest outcome is forgotten first if the memory is full.
    fn record(&mut self, lease: LeaseId, req: RequestId, outcome: Outcome) {
        let known_new = self.missed.take() == Some((lease, req));
        let Some(l) = self.leases.get_mut(&lease) else { return };
        let outcome = match known_new {
            true => Some(outcome),
            false => l.dedup.replace(req, outcome),
        };
        let Some(outcome) = outcome else { return };
        l.dedup.make_room();
        l.dedup.push_new(req, outcome);
    }

    /// The answer to a retry of `(lease, req)` from the lease's memory, if any.
    /// A miss is noted for the [`Engine::record`] that usually follows.
    fn recorded_reply(&mut self, lease: LeaseId, req: RequestId) -> Option<Reply> {
        let l = self.leases.get(&lease)?;
        if l.kept.as_ref().is_some_and(|k| k.contains(req)) {
            return Some(Reply::LeaseKept { lease, ttl_ms: l.ttl() });
        }
        match l.dedup.get(req) {
            None => {
                self.missed = Missed(Some((lease, req)));
                None
            }
            Some(Outcome::Replied(answer)) => Some(answer.clone().into()),
            Some(Outcome::TimedOut(lock)) => Some(Reply::Busy(self.busy(lock))),
        }
    }
}

/// The request the engine's last lookup of a lease's memory did not find,
/// while nothing has been recorded since (only a record adds an entry, so it
/// still has none). Not part of the state: equal whatever it holds, never
/// serialized, empty after a restore.
#[derive(Debug, Clone, Copy, Default)]
struct Missed(Option<(LeaseId, RequestId)>);

impl Missed {
    fn take(&mut self) -> Option<(LeaseId, RequestId)> {
        self.0.take()
    }
}

impl PartialEq for Missed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Missed {}

/// Whether the dead-waiter mutant is on (see [`crate::mutants`]).
#[cfg(feature = "mutants")]
fn dead_waiter_mutant() -> bool {
    crate::mutants::dead_waiter_check_removed()
}

/// Without the `mutants` feature the dead-waiter protection is always on.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
fn dead_waiter_mutant() -> bool {
    false
}
