//! The operations of the `fencelock.v1` API, from protobuf request to protobuf
//! response, shared by the unary RPCs and the session stream (see `grpc.rs`).
//!
//! Writes go through the driver (persisted before they are answered); reads take
//! the engine's read lock on the leader after confirming leadership. Every
//! operation gets the caller ([`Who`]) and checks its permission before it
//! proposes or reads anything; lease ownership is the engine's (INV-13).

use fencelock_core::{
    Acquire, Busy, Check, Command, EngineError, Grant, HolderInfo, LeaseId, LockInfo, LockName, Reply, RequestId,
    Token, WaiterInfo,
};
use fencelock_proto::v1 as pb;
use tonic::Status;

use crate::access::{
    audit::{Audit, Event},
    auth::{self, Refusal, Verb, Who},
    quota::{Adds, Exhausted, Quotas},
};
use crate::{
    clock::Clock,
    driver::{AcquireOutcome, DriverError, DriverHandle},
    raft::{state_machine::SharedEngine, Raft},
};

/// The most completed slots `DescribeLock` shows (the newest).
const DESCRIBED_SLOTS: usize = 32;

/// Default and largest page of `ListLocks`.
const LIST_DEFAULT: usize = 1000;
const LIST_MAX: usize = 10_000;

/// Everything an API operation needs; cheap to clone.
#[derive(Clone)]
pub struct Ops {
    pub driver: DriverHandle,
    pub engine: SharedEngine,
    pub raft: Raft,
    pub clock: Clock,
    pub quotas: std::sync::Arc<Quotas>,
    pub audit: std::sync::Arc<Audit>,
    /// The watch history, read with the engine for `DescribeLock`'s revision.
    pub hub: std::sync::Arc<crate::watching::Hub>,
    /// This node's estimate of the group's clock, for local reads.
    pub group_time: std::sync::Arc<crate::local_read::GroupTime>,
}

impl Ops {
    /// A request this node could not authenticate: if another node leads, the
    /// client is sent there (a node that follows may not have applied the
    /// newest policy yet; the leader's is authoritative, and every operation
    /// is served by the leader anyway); else the refusal, audited.
    pub fn unauthenticated(&self, remote: Option<std::net::SocketAddr>, r: Refusal) -> Status {
        match (&r, self.other_leader()) {
            (Refusal::Unauthenticated(_), Some(leader)) => {
                driver_status(DriverError::NotLeader { leader: Some(leader) })
            }
            _ => self.refused("-", remote, r),
        }
    }

    /// The status of a call [`crate::access::auth`] refused, recorded in the audit log.
    pub fn refused(&self, who: &str, remote: Option<std::net::SocketAddr>, r: Refusal) -> Status {
        let (verb, object, outcome) = match &r {
            Refusal::Unauthenticated(_) => (String::new(), String::new(), "unauthenticated"),
            Refusal::Denied { verb, object, .. } => (verb.to_string(), object.clone(), "denied"),
        };
        let detail = r.to_string();
        let remote = remote.map(|a| a.to_string());
        self.audit.record(&Event {
            identity: who,
            remote,
            verb: &verb,
            action: "call",
            object: &object,
            outcome,
            detail: &detail,
        });
        r.into()
    }

    /// Checks `verb` on `name` for `who`, and its request rate.
    pub(crate) fn allow(&self, who: &Who, check: impl FnOnce(&Who) -> Result<(), Refusal>) -> Result<(), Status> {
        check(who).map_err(|r| self.refused(who.name(), who.remote(), r))?;
        if let Some((name, own)) = who.for_quota() {
            self.quotas.rate(name, own, self.clock.instant()).map_err(|e| self.exhausted(who, e))?;
        }
        Ok(())
    }

    /// Whether the state has room for what `who` adds.
    fn admit(&self, who: &Who, adds: Adds) -> Result<(), Status> {
        if !self.quotas.applies(who.for_quota().is_some(), adds) {
            return Ok(());
        }
        let admitted = self.read(|e| self.quotas.admit(e, who.for_quota(), adds, self.clock.instant()))?;
        admitted.map_err(|e| self.exhausted(who, e))
    }

    fn exhausted(&self, who: &Who, e: Exhausted) -> Status {
        let detail = e.to_string();
        let remote = who.remote().map(|a| a.to_string());
        let event = Event {
            identity: who.name(),
            remote,
            verb: "",
            action: "call",
            object: e.limit,
            outcome: "limited",
            detail: &detail,
        };
        self.audit.record(&event);
        Status::resource_exhausted(detail)
    }

    pub async fn grant_lease(&self, who: &Who, r: pb::GrantLeaseRequest) -> Result<pb::GrantLeaseResponse, Status> {
        self.allow(who, |w| w.require_somewhere(Verb::Acquire))?;
        self.admit(who, Adds::Lease)?;
        let id = auth::random_lease_id().map(LeaseId);
        let cmd = Command::GrantLease { req: RequestId(r.request_id), ttl_ms: r.ttl_ms, id };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::LeaseGranted { lease, ttl_ms } => {
                Ok(pb::GrantLeaseResponse { lease_id: lease.0, ttl_ms, leader_term: self.leader_term() })
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn keep_alive(&self, who: &Who, r: pb::KeepAliveRequest) -> Result<pb::KeepAliveResponse, Status> {
        self.allow(who, |_| Ok(()))?;
        let cmd = Command::KeepAlive { req: RequestId(r.request_id), lease: LeaseId(r.lease_id) };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::LeaseKept { lease, ttl_ms } => {
                Ok(pb::KeepAliveResponse { lease_id: lease.0, ttl_ms, leader_term: self.leader_term() })
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn revoke_lease(&self, who: &Who, r: pb::RevokeLeaseRequest) -> Result<pb::RevokeLeaseResponse, Status> {
        self.allow(who, |_| Ok(()))?;
        let cmd = Command::Revoke { req: RequestId(r.request_id), lease: LeaseId(r.lease_id) };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::LeaseRevoked { .. } => Ok(pb::RevokeLeaseResponse {}),
            other => Err(unexpected(other)),
        }
    }

    /// A lease as the engine sees it now (`None`: it does not exist or
    /// expired). Only its owner (or an admin) may look at a lease that has
    /// one (INV-13); a lease without an owner is anyone's to look at, as it is
    /// to use.
    pub async fn describe_lease(&self, who: &Who, lease: u64) -> Result<Option<fencelock_core::LeaseInfo>, Status> {
        self.allow(who, |_| Ok(()))?;
        self.linearizable().await?;
        let now = self.clock.now();
        let caller = who.caller();
        let info = self.read(|e| {
            let owner_ok = match &caller {
                Some(c) if !c.admin => e.check_lease_owner(c, LeaseId(lease)),
                _ => Ok(()),
            };
            owner_ok.map(|()| e.lease_info(now, LeaseId(lease)))
        })?;
        info.map_err(engine_status)
    }

    pub async fn acquire(&self, who: &Who, r: pb::AcquireRequest) -> Result<pb::AcquireResponse, Status> {
        use pb::acquire_response::Outcome;
        // Too many locks is refused before the permission of each is looked at.
        if !r.also.is_empty() {
            fencelock_core::check_multi_count(r.also.len()).map_err(engine_status)?;
        }
        // A multi-lock needs the permission on every lock it names.
        self.allow(who, |w| std::iter::once(&r.lock).chain(&r.also).try_for_each(|l| w.require(Verb::Acquire, l)))?;
        self.admit(who, Adds::Lock { waits: r.wait_ms > 0, locks: 1 + r.also.len() as u64 })?;
        let attempt = r.attempt;
        let acq = Acquire {
            req: RequestId(r.request_id),
            lease: LeaseId(r.lease_id),
            lock: r.lock,
            wait_ms: r.wait_ms,
            lock_delay_ms: r.lock_delay_ms,
            identity: r.identity,
            value: r.value,
            mode: mode_of(r.mode),
            weight: r.weight.max(1),
            permits: r.permits,
            hold_at_least_ms: r.hold_at_least_ms,
            once_per: r.once_per,
            also: r.also,
        };
        let outcome = match self.driver.acquire(acq, who.caller(), attempt).await.map_err(driver_status)? {
            AcquireOutcome::Acquired { grant, waited_ms } => Outcome::Acquired(acquired(grant, waited_ms)),
            AcquireOutcome::AcquiredAll { grants, waited_ms } => {
                let grants = grants.into_iter().map(|g| acquired(g, waited_ms)).collect();
                Outcome::AcquiredAll(pb::AcquiredAll { grants })
            }
            AcquireOutcome::Busy(b) => Outcome::Busy(busy(b)),
            AcquireOutcome::TimedOut => Outcome::TimedOut(pb::TimedOut {}),
            AcquireOutcome::SlotDone { token, identity, exit_code } => {
                Outcome::SlotDone(pb::SlotDone { token: token.0, identity, exit_code })
            }
            AcquireOutcome::LeaseEnded(l) => {
                return Err(Status::not_found(format!("lease {l} ended (expired or revoked) while waiting")))
            }
            AcquireOutcome::Rejected(e) => return Err(engine_status(e)),
        };
        Ok(pb::AcquireResponse { outcome: Some(outcome) })
    }

    pub async fn release(&self, who: &Who, r: pb::ReleaseRequest) -> Result<pb::ReleaseResponse, Status> {
        self.allow(who, |w| w.require(Verb::Acquire, &r.lock))?;
        let cmd = Command::Release {
            req: RequestId(r.request_id),
            lease: LeaseId(r.lease_id),
            lock: r.lock,
            token: Token(r.token),
        };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::Released => Ok(pb::ReleaseResponse { released: true }),
            Reply::NotHolder => Ok(pb::ReleaseResponse { released: false }),
            other => Err(unexpected(other)),
        }
    }

    /// A new value for a grant, checked as a release is (same verb: whoever may
    /// take and release the lock may publish with it).
    pub async fn set_value(&self, who: &Who, r: pb::SetValueRequest) -> Result<pb::SetValueResponse, Status> {
        self.allow(who, |w| w.require(Verb::Acquire, &r.lock))?;
        let cmd = Command::SetValue {
            req: RequestId(r.request_id),
            lease: LeaseId(r.lease_id),
            lock: r.lock,
            token: Token(r.token),
            value: r.value,
        };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::ValueSet => Ok(pb::SetValueResponse { set: true }),
            Reply::NotHolder => Ok(pb::SetValueResponse { set: false }),
            other => Err(unexpected(other)),
        }
    }

    /// The holder records that its job's slot is done (checked as a release
    /// is, same verb).
    pub async fn complete_slot(
        &self,
        who: &Who,
        r: pb::CompleteSlotRequest,
    ) -> Result<pb::CompleteSlotResponse, Status> {
        self.allow(who, |w| w.require(Verb::Acquire, &r.lock))?;
        let cmd = Command::CompleteSlot {
            req: RequestId(r.request_id),
            lease: LeaseId(r.lease_id),
            lock: r.lock,
            token: Token(r.token),
            slot: r.slot,
            exit_code: r.exit_code,
        };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::SlotCompleted => Ok(pb::CompleteSlotResponse { completed: true }),
            Reply::NotHolder => Ok(pb::CompleteSlotResponse { completed: false }),
            other => Err(unexpected(other)),
        }
    }

    /// A semaphore gets a new number of permits: an admin's call (the engine
    /// checks it again inside the caller's envelope).
    pub async fn resize(&self, who: &Who, r: pb::ResizeRequest) -> Result<pb::ResizeResponse, Status> {
        self.allow(who, Who::require_admin)?;
        let cmd = Command::Resize { lock: r.lock, permits: r.permits };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::Resized { was } => Ok(pb::ResizeResponse { was }),
            other => Err(unexpected(other)),
        }
    }

    /// An exclusive grant of a read-write lock becomes shared (checked as a
    /// release is).
    pub async fn downgrade(&self, who: &Who, r: pb::DowngradeRequest) -> Result<pb::DowngradeResponse, Status> {
        self.allow(who, |w| w.require(Verb::Acquire, &r.lock))?;
        let cmd = Command::Downgrade {
            req: RequestId(r.request_id),
            lease: LeaseId(r.lease_id),
            lock: r.lock,
            token: Token(r.token),
        };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::Downgraded => Ok(pb::DowngradeResponse { downgraded: true }),
            Reply::NotHolder => Ok(pb::DowngradeResponse { downgraded: false }),
            other => Err(unexpected(other)),
        }
    }

    /// Cancel a queued acquire (used by the session stream's `Cancel`).
    pub async fn cancel_wait(
        &self,
        who: &Who,
        req: u64,
        lease: u64,
        lock: String,
    ) -> Result<pb::CancelResponse, Status> {
        self.allow(who, |w| w.require(Verb::Acquire, &lock))?;
        let cmd = Command::CancelWait { req: RequestId(req), lease: LeaseId(lease), lock };
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::Cancelled { released } => Ok(pb::CancelResponse { released }),
            other => Err(unexpected(other)),
        }
    }

    pub async fn check(&self, who: &Who, r: pb::CheckRequest) -> Result<pb::CheckResponse, Status> {
        let name = valid_name(&r.lock)?;
        self.allow(who, |w| w.require(Verb::Check, name.as_str()))?;
        if r.token == 0 {
            return Err(engine_status(EngineError::InvalidToken));
        }
        self.linearizable().await?;
        let now = self.clock.now();
        let check = self.read(|e| e.check(now, name.as_str(), Token(r.token)))?;
        Ok(match check {
            Check::Current => pb::CheckResponse { current: true, current_token: Some(r.token) },
            Check::Stale { current } => pb::CheckResponse { current: false, current_token: current.map(|t| t.0) },
        })
    }

    /// A fence's report that it refused a stale write (issue 36): one log
    /// entry, which every member's watch shows as a `write_refused` event of
    /// the lock, and an audit line. In this order, and nothing written before
    /// the last: the report's own rules (the engine's, INVALID_ARGUMENT), the
    /// `check` verb on the lock and the caller's request rate, the node's
    /// rate of reports ([`crate::access::quota::Quotas::report`],
    /// RESOURCE_EXHAUSTED); refusals of the caller and of a limit are audited
    /// as every such refusal is.
    pub async fn report_refusal(
        &self,
        who: &Who,
        r: pb::ReportRefusalRequest,
    ) -> Result<pb::ReportRefusalResponse, Status> {
        let (lock, detail) = (r.lock.clone(), report_detail(&r));
        let cmd = Command::ReportRefusal {
            lock: r.lock,
            refused: Token(r.refused_token),
            highest: Token(r.highest_token),
            resource: r.resource,
        };
        cmd.validate().map_err(engine_status)?;
        self.allow(who, |w| w.require(Verb::Check, &lock))?;
        self.quotas.report(self.clock.instant()).map_err(|e| self.exhausted(who, e))?;
        match self.driver.submit(who.wrap(cmd)).await.map_err(driver_status)? {
            Reply::Reported => {
                let remote = who.remote().map(|a| a.to_string());
                let (identity, verb, action, outcome) = (who.name(), "check", "report_refusal", "ok");
                let object = format!("lock {lock:?}");
                self.audit.record(&Event { identity, remote, verb, action, object: &object, outcome, detail: &detail });
                Ok(pb::ReportRefusalResponse { recorded: true })
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn describe_lock(
        &self,
        who: &Who,
        r: pb::DescribeLockRequest,
    ) -> Result<pb::DescribeLockResponse, Status> {
        let name = valid_name(&r.lock)?;
        self.allow(who, |w| w.require(Verb::Read, name.as_str()))?;
        let (info, next) = self.lock_info_at(&name).await?;
        let next = Some(pb::Revision { index: next.index, seq: next.seq });
        let now = self.clock.now();
        let slots = self.read(|e| e.completed_slots(now, name.as_str()))?;
        let slots = slots.into_iter().take(DESCRIBED_SLOTS).map(completed_slot).collect();
        Ok(pb::DescribeLockResponse { lock: Some(lock_info(info)), next, slots })
    }

    pub async fn list_locks(&self, who: &Who, r: pb::ListLocksRequest) -> Result<pb::ListLocksResponse, Status> {
        self.allow(who, |w| w.require_prefix(Verb::Read, &r.prefix))?;
        let limit = match r.limit as usize {
            0 => LIST_DEFAULT,
            n => n.min(LIST_MAX),
        };
        let locks = self.locks(&r.prefix, limit).await?;
        Ok(pb::ListLocksResponse { locks: locks.into_iter().map(lock_info).collect() })
    }

    /// One lock as the engine sees it now (an unknown lock is free).
    pub async fn lock_info(&self, name: &LockName) -> Result<LockInfo, Status> {
        self.lock_info_at(name).await.map(|(info, _)| info)
    }

    /// [`Self::lock_info`], and the first watch revision after the state it
    /// shows: both read under the engine's read lock, and the state machine
    /// publishes an entry's events before it releases the write lock.
    pub async fn lock_info_at(&self, name: &LockName) -> Result<(LockInfo, crate::watching::Rev), Status> {
        self.linearizable().await?;
        let now = self.clock.now();
        let (info, next) = self.read(|e| (e.lock_info(now, name.as_str()), self.hub.next()))?;
        let info = info.unwrap_or_else(|| LockInfo::free(name.clone()));
        Ok((info, next))
    }

    /// Locks whose names start with `prefix`, sorted, at most `limit`.
    pub async fn locks(&self, prefix: &str, limit: usize) -> Result<Vec<LockInfo>, Status> {
        self.linearizable().await?;
        let now = self.clock.now();
        self.read(|e| e.locks(now, prefix, limit))
    }

    /// [`Self::locks`] from this node's applied state, asking no one (see
    /// [`crate::local_read`]).
    pub fn locks_local(&self, prefix: &str, limit: usize) -> Result<Vec<LockInfo>, Status> {
        let now = self.local_now();
        self.read(|e| e.locks(now.max(e.now()), prefix, limit))
    }

    /// [`Self::lock_info`] from this node's applied state, asking no one.
    pub fn lock_info_local(&self, name: &LockName) -> Result<LockInfo, Status> {
        let now = self.local_now();
        let info = self.read(|e| e.lock_info(now.max(e.now()), name.as_str()))?;
        Ok(info.unwrap_or_else(|| LockInfo::free(name.clone())))
    }

    /// The group's clock as this node knows it: its own when it leads and
    /// serves, else its estimate (0 before it applied anything; the engine's
    /// own reading is the floor).
    pub(crate) fn local_now(&self) -> fencelock_core::Millis {
        match self.driver.is_ready() {
            true => self.clock.now(),
            false => self.group_time.at(self.clock.now()).unwrap_or(0),
        }
    }

    /// The address of the leader, if it is another node: a read refused here
    /// names it, so that the client goes there at once (as a refused write does).
    pub(crate) fn other_leader(&self) -> Option<String> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader.filter(|l| *l != m.id)?;
        m.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&fencelock_core::Engine) -> T) -> Result<T, Status> {
        let engine = crate::raft::state_machine::read_engine(&self.engine)
            .map_err(|_| Status::internal("engine lock poisoned"))?;
        Ok(f(&engine))
    }

    /// The Raft term this node knows, as lease answers carry it: a client
    /// that sees it grow knows its lease was carried to a new leader.
    pub(crate) fn leader_term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Confirm this node still leads (a quorum answers) and has applied everything
    /// committed before this read, so a read never sees stale state.
    pub(crate) async fn linearizable(&self) -> Result<(), Status> {
        if !self.driver.is_ready() {
            return Err(driver_status(DriverError::NotLeader { leader: self.other_leader() }));
        }
        self.raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(|e| Status::unavailable(format!("cannot confirm leadership: {e}")))
    }
}

/// The audit line's detail of a refusal report:
/// `token R refused, highest H, resource X` (no resource: without it).
fn report_detail(r: &pb::ReportRefusalRequest) -> String {
    let (refused, highest, resource) = (r.refused_token, r.highest_token, &r.resource);
    match resource.is_empty() {
        true => format!("token {refused} refused, highest {highest}"),
        false => format!("token {refused} refused, highest {highest}, resource {resource}"),
    }
}

fn valid_name(s: &str) -> Result<LockName, Status> {
    LockName::new(s).map_err(|e| engine_status(EngineError::InvalidName(e)))
}

fn acquired(g: Grant, waited_ms: u64) -> pb::Acquired {
    pb::Acquired { lock: g.lock.to_string(), lease_id: g.lease.0, token: g.token.0, waited_ms }
}

fn busy(b: Busy) -> pb::Busy {
    let holder = b.holder.map(|g| pb::Holder { lease_id: g.lease.0, token: g.token.0, ..Default::default() });
    pb::Busy { holder, reopens_in_ms: b.reopens_in_ms, waiters: b.waiters }
}

fn holder(h: HolderInfo) -> pb::Holder {
    pb::Holder {
        lease_id: h.lease.0,
        token: h.token.0,
        held_ms: h.held_ms,
        ttl_left_ms: h.ttl_left_ms,
        lock_delay_ms: h.lock_delay_ms,
        owner: h.owner.unwrap_or_default(),
        identity: h.identity,
        value: h.value,
        mode: match h.mode {
            fencelock_core::Mode::Exclusive => pb::LockMode::Exclusive,
            fencelock_core::Mode::Shared => pb::LockMode::Shared,
        } as i32,
        weight: h.weight,
    }
}

/// The wire's mode (an unknown value reads as exclusive, the safe side: it
/// shares with nobody).
fn mode_of(mode: i32) -> fencelock_core::Mode {
    match pb::LockMode::try_from(mode) {
        Ok(pb::LockMode::Shared) => fencelock_core::Mode::Shared,
        _ => fencelock_core::Mode::Exclusive,
    }
}

fn waiter(w: WaiterInfo) -> pb::Waiter {
    pb::Waiter { lease_id: w.lease.0, waited_ms: w.waited_ms, wait_left_ms: w.wait_left_ms, identity: w.identity }
}

fn lock_info(i: LockInfo) -> pb::LockInfo {
    pb::LockInfo {
        name: i.name.to_string(),
        holder: i.holder.map(holder),
        reopens_in_ms: i.reopens_in_ms,
        waiters: i.waiters.into_iter().map(waiter).collect(),
        holders: i.holders.into_iter().map(holder).collect(),
        permits: i.permits,
    }
}

/// gRPC status for an engine refusal.
pub fn engine_status(e: EngineError) -> Status {
    match e {
        EngineError::LeaseNotFound(_) => Status::not_found(e.to_string()),
        EngineError::NotOwner { .. } => Status::permission_denied(e.to_string()),
        // A random id that collided: a retry proposes another.
        EngineError::LeaseIdTaken(_) => Status::unavailable(e.to_string()),
        EngineError::NotAdmin => Status::permission_denied(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

/// gRPC status for a driver failure; `fencelock-leader` metadata names the leader.
pub fn driver_status(e: DriverError) -> Status {
    // The status code already says "unavailable"; the message says why.
    let message = match &e {
        DriverError::Unavailable(why) => why.clone(),
        other => other.to_string(),
    };
    let mut s = Status::unavailable(message);
    if let DriverError::NotLeader { leader: Some(l) } = &e {
        if let Ok(v) = l.parse() {
            s.metadata_mut().insert(LEADER_METADATA, v);
        }
    }
    s
}

/// The metadata key of a refusal's leader hint: the leader's client address.
pub(crate) const LEADER_METADATA: &str = "fencelock-leader";

fn unexpected(r: Reply) -> Status {
    match r {
        Reply::Rejected(e) => engine_status(e),
        other => Status::internal(format!("unexpected engine reply {other:?}")),
    }
}

fn completed_slot(s: fencelock_core::SlotInfo) -> pb::CompletedSlot {
    let (slot, token, identity, exit_code, age_ms) = (s.slot, s.token.0, s.identity, s.exit_code, s.age_ms);
    pb::CompletedSlot { slot, token, identity, exit_code, age_ms }
}
