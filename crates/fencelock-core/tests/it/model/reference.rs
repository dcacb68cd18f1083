//! A naive reference model of the engine, written from the specification
//! (`docs/design.md`, the `Engine` module docs) rather than from the engine's code:
//! flat `Vec`s, linear scans, timers found by looking at every deadline.
//! It is slow and obviously correct; that is its only job.
//!
//! Read-write locks and semaphores: a lock's permit count (0: read-write) is
//! set when an acquire finds no holder, waiter or lock-delay on it; a request is
//! granted when no waiter of the lock is queued (immediately) or no live one is
//! before it (from the queue), and it fits: on a semaphore the weights add up to
//! at most the permits, on a read-write lock nobody holds it or everybody
//! (itself included) is shared.
//!
//! Multi-acquires (INV-18): a waiting one is a waiter on each of its locks
//! (same lease and request, each knowing the whole group), pushed at once; it
//! is granted when it is the first live waiter of every lock of its group and
//! fits in each, and then every lock it touched is looked at again, in the
//! order the engine documents (a stack of locks to look at).
//!
//! Jobs once per slot (issue 18 §4): the current holder completes a slot (the
//! first completion stays); an acquire for a done slot is answered `SlotDone`;
//! a waiter for one is looked at when it would be granted and leaves with
//! `WaitEnd::SlotDone` instead, the queue moving on. A record lasts 7 days of
//! engine time and a lock keeps 1,024: a run of the property test lasts
//! minutes and names two slots, so the model keeps every record.

use fencelock_core::*;

const DEDUP: usize = DEDUP_PER_LEASE;

#[derive(Clone, Debug)]
enum Memo {
    Said(Reply),
    TimedOut(String),
}

#[derive(Clone, Debug)]
struct MLease {
    id: u64,
    ttl: u64,
    deadline: u64,
    grant_req: u64,
    memo: Vec<(u64, Memo)>,
    /// The request ids of its last [`KEEPALIVES_PER_LEASE`] keep-alives,
    /// remembered apart from `memo`.
    kept: Vec<u64>,
    /// Had its fresh TTL from a leader change and no keep-alive since.
    extended: bool,
}

#[derive(Clone, Debug)]
struct MHolder {
    lock: String,
    lease: u64,
    req: u64,
    token: u64,
    since: u64,
    delay: u64,
    /// Hold-at-least: however it ends, the lock stays closed until `since + hold`.
    hold: u64,
    /// The published value (acquires carry none; `SetValue` sets it).
    value: Vec<u8>,
    shared: bool,
    weight: u32,
}

#[derive(Clone, Debug)]
struct MWaiter {
    lock: String,
    lease: u64,
    req: u64,
    since: u64,
    until: u64,
    delay: u64,
    hold: u64,
    shared: bool,
    weight: u32,
    /// A multi-acquire: all of its locks, in the order asked (empty: single).
    group: Vec<String>,
    /// The slot it runs once per ("" for none).
    slot: String,
}

/// A completed slot of a lock: by the grant `token` of `lease`, at `at`.
#[derive(Clone, Debug)]
struct MSlot {
    lock: String,
    slot: String,
    token: u64,
    lease: u64,
    exit_code: i32,
    at: u64,
}

impl MWaiter {
    fn locks(&self) -> Vec<String> {
        match self.group.is_empty() {
            true => vec![self.lock.clone()],
            false => self.group.clone(),
        }
    }
}

#[derive(Clone, Debug)]
struct MClosed {
    lock: String,
    until: u64,
    delay: u64,
}

/// A due timer: (instant, kind rank, lease, lock, req). Sorting these tuples is the
/// specified firing order: by instant, then lease < reopen < wait, then by id.
type Due = (u64, u8, u64, String, u64);

#[derive(Clone, Debug, Default)]
pub struct Model {
    now: u64,
    leases_made: u64,
    tokens_made: u64,
    /// The last token issued, or the last token floor minus one if higher.
    counter: u64,
    cluster: Option<ClusterId>,
    leases: Vec<MLease>,
    /// Holders and waiters of all locks; waiters in arrival order.
    holders: Vec<MHolder>,
    waiters: Vec<MWaiter>,
    closed: Vec<MClosed>,
    revoked: Vec<(u64, u64)>,
    /// The permits each lock was given when it was last unused (meaningful
    /// only while it has a holder, a waiter or a lock-delay).
    permits: Vec<(String, u32)>,
    slots: Vec<MSlot>,
}

fn lock_name(s: &str) -> LockName {
    LockName::new(s).expect("model only builds valid names")
}

fn grant(lock: &str, lease: u64, token: u64) -> Grant {
    Grant { lock: lock_name(lock), lease: LeaseId(lease), token: Token(token) }
}

impl Model {
    pub fn step(&mut self, input: &Input) -> Output {
        let mut out = Output::default();
        match input {
            Input::LeaderStart { now, token_floor, cluster_id } => {
                self.leader_start(*now);
                self.counter = self.counter.max(token_floor.saturating_sub(1));
                self.cluster = self.cluster.or(*cluster_id);
            }
            Input::Batch { now, cmds } => {
                self.advance(*now, &mut out.effects);
                for c in cmds {
                    let reply = self.apply(c, &mut out.effects);
                    out.replies.push(reply);
                }
            }
        }
        out.next_deadline = self.all_timers().into_iter().map(|t| t.0).min();
        out
    }

    fn all_timers(&self) -> Vec<Due> {
        let mut v: Vec<Due> = vec![];
        for l in &self.leases {
            v.push((l.deadline, 0, l.id, String::new(), 0));
        }
        for c in &self.closed {
            v.push((c.until, 1, 0, c.lock.clone(), 0));
        }
        for w in &self.waiters {
            v.push((w.until, 2, w.lease, String::new(), w.req));
        }
        v
    }

    fn advance(&mut self, to: u64, fx: &mut Vec<Effect>) {
        while let Some(t) = self.all_timers().into_iter().min().filter(|t| t.0 <= to) {
            self.now = self.now.max(t.0);
            match t.1 {
                0 => {
                    fx.push(Effect::LeaseExpired { lease: LeaseId(t.2) });
                    self.end_lease(t.2, ReleaseCause::Expired, fx);
                }
                1 => {
                    self.closed.retain(|c| c.lock != t.3);
                    self.grant_next(&t.3, fx);
                }
                _ => self.time_out(t.2, t.4, fx),
            }
        }
        self.now = self.now.max(to);
    }

    fn leader_start(&mut self, now: u64) {
        let old = self.now;
        self.now = now;
        let age = |t: u64| now.saturating_sub(old.saturating_sub(t));
        for l in &mut self.leases {
            let left = if l.extended { l.deadline.saturating_sub(old).min(l.ttl) } else { l.ttl };
            l.deadline = now.saturating_add(left);
            l.extended = true;
        }
        for h in &mut self.holders {
            h.since = age(h.since);
        }
        for w in &mut self.waiters {
            w.since = age(w.since);
            w.until = now.saturating_add(w.until.saturating_sub(old));
        }
        for c in &mut self.closed {
            c.until = now.saturating_add(c.delay);
        }
        for s in &mut self.slots {
            s.at = age(s.at);
        }
    }

    fn lease(&self, id: u64) -> Option<&MLease> {
        self.leases.iter().find(|l| l.id == id)
    }

    fn live(&self, id: u64) -> bool {
        self.lease(id).is_some_and(|l| l.deadline > self.now)
    }

    fn memo(&self, lease: u64, req: u64) -> Option<Reply> {
        let l = self.lease(lease)?;
        if l.kept.contains(&req) {
            return Some(Reply::LeaseKept { lease: LeaseId(lease), ttl_ms: l.ttl });
        }
        let (_, m) = l.memo.iter().find(|(r, _)| *r == req)?;
        Some(match m {
            Memo::Said(r) => r.clone(),
            Memo::TimedOut(lock) => Reply::Busy(self.busy(lock)),
        })
    }

    fn remember(&mut self, lease: u64, req: u64, m: Memo) {
        let Some(l) = self.leases.iter_mut().find(|l| l.id == lease) else {
            return;
        };
        if let Some(e) = l.memo.iter_mut().find(|(r, _)| *r == req) {
            e.1 = m;
            return;
        }
        l.memo.push((req, m));
        if l.memo.len() > DEDUP {
            l.memo.remove(0);
        }
    }

    fn busy(&self, lock: &str) -> Busy {
        Busy {
            holder: self.holders.iter().find(|h| h.lock == lock).map(|h| grant(lock, h.lease, h.token)),
            holders: self.holders.iter().filter(|h| h.lock == lock).count() as u32,
            reopens_in_ms: self.closed.iter().find(|c| c.lock == lock).map(|c| c.until - self.now),
            waiters: self.waiters.iter().filter(|w| w.lock == lock).count() as u32,
        }
    }

    fn end_lease(&mut self, id: u64, cause: ReleaseCause, fx: &mut Vec<Effect>) {
        self.leases.retain(|l| l.id != id);
        let mut held: Vec<MHolder> = self.holders.iter().filter(|h| h.lease == id).cloned().collect();
        held.sort_by_key(|h| h.token);
        for h in held {
            self.end_grant(&h.lock, id, h.token, cause, fx);
        }
        let mut waits: Vec<MWaiter> = self.waiters.iter().filter(|w| w.lease == id).cloned().collect();
        waits.sort_by_key(|w| w.req);
        // A multi-acquire ends once, by its first lock.
        waits.dedup_by_key(|w| w.req);
        for w in waits {
            self.end_wait(&w.lock, id, w.req, WaitEnd::LeaseEnded, fx);
        }
    }

    fn end_grant(&mut self, lock: &str, lease: u64, token: u64, cause: ReleaseCause, fx: &mut Vec<Effect>) {
        let i = self.holders.iter().position(|h| h.lock == lock && h.lease == lease && h.token == token);
        let h = self.holders.remove(i.expect("end_grant of a holder"));
        let held_ms = self.now - h.since;
        let tag = Tag::new(&identity_of(lease), &h.value);
        fx.push(Effect::Released { grant: grant(lock, lease, token), held_ms, cause, tag });
        if cause == ReleaseCause::Expired && h.delay > 0 {
            self.close(lock, h.delay);
        }
        if h.since + h.hold > self.now {
            self.close(lock, h.since + h.hold - self.now);
        }
        self.grant_next(lock, fx);
    }

    /// Close `lock` for `delay` from now, unless it is closed until later
    /// already: it reopens when the last lock-delay ends.
    fn close(&mut self, lock: &str, delay: u64) {
        let until = self.now.saturating_add(delay);
        if self.closed.iter().any(|c| c.lock == lock && c.until >= until) {
            return;
        }
        self.closed.retain(|c| c.lock != lock);
        self.closed.push(MClosed { lock: lock.to_string(), until, delay });
    }

    fn grant_next(&mut self, lock: &str, fx: &mut Vec<Effect>) {
        self.grant_from(vec![lock.to_string()], fx);
    }

    /// Take the last lock of `work` and grant its first live waiters, one
    /// after another, while the first one fits (and, for a multi-acquire,
    /// heads and fits every lock of its group: its other locks then join
    /// `work`); until `work` is empty.
    fn grant_from(&mut self, mut work: Vec<String>, fx: &mut Vec<Effect>) {
        while let Some(lock) = work.pop() {
            while let Some(w) = self.first_live(&lock).filter(|w| self.grantable(w)) {
                self.waiters.retain(|x| !(x.lease == w.lease && x.req == w.req));
                if let Some(done) = self.done(&lock, &w.slot) {
                    let (lease, req) = (LeaseId(w.lease), RequestId(w.req));
                    let why = WaitEnd::SlotDone(Box::new(done.clone()));
                    fx.push(Effect::WaitEnded { lock: lock_name(&lock), lease, req, why });
                    self.remember(w.lease, w.req, Memo::Said(done.reply()));
                    continue;
                }
                self.grant_waiter(&w, fx);
                work.extend(w.locks().into_iter().filter(|n| *n != lock));
            }
        }
    }

    /// Who completed `slot` of `lock`, if it is a slot and done.
    fn done(&self, lock: &str, slot: &str) -> Option<SlotCompletion> {
        let s = self.slots.iter().find(|s| !slot.is_empty() && s.lock == lock && s.slot == slot)?;
        Some(SlotCompletion { token: Token(s.token), identity: identity_of(s.lease), exit_code: s.exit_code })
    }

    fn first_live(&self, lock: &str) -> Option<MWaiter> {
        self.waiters.iter().find(|w| w.lock == lock && self.live(w.lease)).cloned()
    }

    /// `w` is the first live waiter of each of its locks and fits in each.
    fn grantable(&self, w: &MWaiter) -> bool {
        w.locks().iter().all(|n| {
            let first = self.first_live(n).is_some_and(|f| f.lease == w.lease && f.req == w.req);
            first && self.fits(n, w.shared, w.weight)
        })
    }

    fn grant_waiter(&mut self, w: &MWaiter, fx: &mut Vec<Effect>) {
        let waited_ms = self.now - w.since;
        let mut grants = vec![];
        for lock in w.locks() {
            let g = self.make_holder(&lock, (w.lease, w.req), (w.delay, w.hold), (w.shared, w.weight));
            grants.push(g.clone());
            let tag = Tag::new(&identity_of(w.lease), &[]);
            let mode = mode_of(w.shared);
            fx.push(Effect::Granted { grant: g, req: RequestId(w.req), queued: true, waited_ms, tag, mode });
        }
        let reply = if w.group.is_empty() { Reply::Acquired(grants.remove(0)) } else { Reply::AcquiredAll(grants) };
        self.remember(w.lease, w.req, Memo::Said(reply));
    }

    /// Whether a grant (shared or not, of `weight`) fits beside the holders of
    /// the open `lock`.
    fn fits(&self, lock: &str, shared: bool, weight: u32) -> bool {
        if self.closed.iter().any(|c| c.lock == lock) {
            return false;
        }
        let holders: Vec<&MHolder> = self.holders.iter().filter(|h| h.lock == lock).collect();
        match self.permits_of(lock) {
            0 => holders.is_empty() || (shared && holders.iter().all(|h| h.shared)),
            n => holders.iter().map(|h| u64::from(h.weight)).sum::<u64>() + u64::from(weight) <= u64::from(n),
        }
    }

    /// Whether `lock` has a holder, a waiter or a lock-delay.
    fn in_use(&self, lock: &str) -> bool {
        self.holders.iter().any(|h| h.lock == lock)
            || self.waiters.iter().any(|w| w.lock == lock)
            || self.closed.iter().any(|c| c.lock == lock)
    }

    /// The permits of `lock` (0: read-write), as set when it was last unused.
    fn permits_of(&self, lock: &str) -> u32 {
        self.permits.iter().find(|(l, _)| l == lock).map_or(0, |(_, n)| *n)
    }

    fn make_holder(
        &mut self,
        lock: &str,
        (lease, req): (u64, u64),
        (delay, hold): (u64, u64),
        share: (bool, u32),
    ) -> Grant {
        self.tokens_made += 1;
        self.counter += 1;
        let token = self.counter;
        let since = self.now;
        let (shared, weight) = share;
        let value = Vec::new();
        let lock = lock.to_string();
        self.holders.push(MHolder { lock: lock.clone(), lease, req, token, since, delay, hold, value, shared, weight });
        grant(&lock, lease, token)
    }

    /// Take the waiter `(lease, req)` out of the queue of `lock` (it ended
    /// `why`); the waiters it held back may be granted now.
    fn end_wait(&mut self, lock: &str, lease: u64, req: u64, why: WaitEnd, fx: &mut Vec<Effect>) {
        let Some(w) = self.waiters.iter().find(|x| x.lease == lease && x.req == req && x.lock == lock).cloned() else {
            return;
        };
        self.waiters.retain(|x| !(x.lease == lease && x.req == req));
        for n in w.locks() {
            fx.push(Effect::WaitEnded {
                lock: lock_name(&n),
                lease: LeaseId(lease),
                req: RequestId(req),
                why: why.clone(),
            });
        }
        self.grant_from(w.locks(), fx);
    }

    fn time_out(&mut self, lease: u64, req: u64, fx: &mut Vec<Effect>) {
        let w = self.waiters.iter().find(|w| w.lease == lease && w.req == req).unwrap().clone();
        self.end_wait(&w.lock, lease, req, WaitEnd::TimedOut, fx);
        self.remember(lease, req, Memo::TimedOut(w.lock));
    }

    fn apply(&mut self, cmd: &Command, fx: &mut Vec<Effect>) -> Reply {
        let r = match cmd {
            Command::GrantLease { req, ttl_ms, id: None } => self.grant_lease(req.0, *ttl_ms),
            Command::KeepAlive { req, lease } => self.keep_alive(req.0, lease.0),
            Command::Revoke { req, lease } => self.revoke(req.0, lease.0, fx),
            Command::Acquire(a) => self.acquire(a, fx),
            Command::Release { req, lease, lock, token } => self.release(req.0, lease.0, lock, token.0, fx),
            Command::CancelWait { req, lease, lock } => self.cancel(req.0, lease.0, lock, fx),
            Command::SetValue { req, lease, lock, token, value } => {
                self.set_value(req.0, lease.0, lock, token.0, value, fx)
            }
            Command::Downgrade { req, lease, lock, token } => self.downgrade(req.0, lease.0, lock, token.0, fx),
            Command::CompleteSlot { req, lease, lock, token, slot, exit_code } => {
                self.complete_slot((req.0, lease.0), (lock, token.0), (slot, *exit_code), fx)
            }
            Command::ReportRefusal { lock, refused, highest, resource } => {
                self.report(lock, refused.0, highest.0, resource)
            }
            // Lease ownership, proposed ids, the policy and resizes are the
            // engine's unit tests' (engine/tests/owner_tests.rs,
            // policy_tests.rs, resize_tests.rs); the generator makes none of them.
            Command::GrantLease { id: Some(_), .. }
            | Command::As { .. }
            | Command::Policy(_)
            | Command::Resize { .. } => {
                unreachable!("the model's generator makes no proposed lease ids, callers, policy changes or resizes")
            }
        };
        r.unwrap_or_else(Reply::Rejected)
    }

    /// A fence's refusal report: checked, answered, and nothing else (no
    /// lease, lock, queue or token changes).
    fn report(&self, lock: &str, refused: u64, highest: u64, resource: &str) -> Result<Reply, EngineError> {
        LockName::new(lock)?;
        if refused == 0 || highest == 0 {
            return Err(EngineError::InvalidToken);
        }
        if refused >= highest {
            return Err(EngineError::InvalidReport(format!(
                "refused token {refused} is not below the highest token {highest} (a fence refuses only tokens below its mark)"
            )));
        }
        if resource.len() > MAX_RESOURCE_BYTES {
            let n = resource.len();
            return Err(EngineError::InvalidReport(format!(
                "resource is {n} bytes (must be at most {MAX_RESOURCE_BYTES} bytes of UTF-8)"
            )));
        }
        if resource.chars().any(char::is_control) {
            return Err(EngineError::InvalidReport("resource must not contain control characters".into()));
        }
        Ok(Reply::Reported)
    }

    fn grant_lease(&mut self, req: u64, ttl: u64) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl) {
            return Err(EngineError::InvalidTtl { got_ms: ttl, min_ms: MIN_TTL_MS, max_ms: MAX_TTL_MS });
        }
        if let Some(l) = self.leases.iter().find(|l| l.grant_req == req) {
            return Ok(Reply::LeaseGranted { lease: LeaseId(l.id), ttl_ms: l.ttl });
        }
        self.leases_made += 1;
        let id = self.leases_made;
        let deadline = self.now + ttl;
        self.leases.push(MLease { id, ttl, deadline, grant_req: req, memo: vec![], kept: vec![], extended: false });
        Ok(Reply::LeaseGranted { lease: LeaseId(id), ttl_ms: ttl })
    }

    fn keep_alive(&mut self, req: u64, id: u64) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        self.lease(id).ok_or(EngineError::LeaseNotFound(LeaseId(id)))?;
        if let Some(r) = self.memo(id, req) {
            return Ok(r);
        }
        let now = self.now;
        let l = self.leases.iter_mut().find(|l| l.id == id).unwrap();
        l.deadline = now + l.ttl;
        l.extended = false;
        l.kept.push(req);
        if l.kept.len() > KEEPALIVES_PER_LEASE {
            l.kept.remove(0);
        }
        Ok(Reply::LeaseKept { lease: LeaseId(id), ttl_ms: l.ttl })
    }

    fn revoke(&mut self, req: u64, id: u64, fx: &mut Vec<Effect>) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        if self.lease(id).is_none() {
            if self.revoked.contains(&(id, req)) {
                return Ok(Reply::LeaseRevoked { lease: LeaseId(id) });
            }
            return Err(EngineError::LeaseNotFound(LeaseId(id)));
        }
        self.end_lease(id, ReleaseCause::Revoked, fx);
        self.revoked.push((id, req));
        Ok(Reply::LeaseRevoked { lease: LeaseId(id) })
    }

    fn acquire(&mut self, a: &Acquire, fx: &mut Vec<Effect>) -> Result<Reply, EngineError> {
        let (req, lease, lock) = (a.req.0, a.lease.0, a.lock.as_str());
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        LockName::new(lock)?;
        if a.wait_ms > MAX_WAIT_MS {
            return Err(EngineError::InvalidWait { got_ms: a.wait_ms, max_ms: MAX_WAIT_MS });
        }
        if a.lock_delay_ms > MAX_LOCK_DELAY_MS {
            return Err(EngineError::InvalidLockDelay { got_ms: a.lock_delay_ms, max_ms: MAX_LOCK_DELAY_MS });
        }
        if a.hold_at_least_ms > MAX_HOLD_AT_LEAST_MS {
            return Err(EngineError::InvalidHoldAtLeast { got_ms: a.hold_at_least_ms, max_ms: MAX_HOLD_AT_LEAST_MS });
        }
        let max = a.permits.max(1);
        if a.weight == 0 || a.weight > max {
            return Err(EngineError::InvalidWeight { weight: a.weight, max });
        }
        if !a.once_per.is_empty() {
            check_slot(&a.once_per)?;
        }
        if !a.also.is_empty() {
            check_multi(a)?;
        }
        self.lease(lease).ok_or(EngineError::LeaseNotFound(a.lease))?;
        if let Some(w) = self.waiters.iter().find(|w| w.lease == lease && w.req == req) {
            let same_lock = self.waiters.iter().filter(|x| x.lock == w.lock);
            let position = same_lock.take_while(|x| !(x.lease == lease && x.req == req)).count();
            return Ok(Reply::Queued { position: position as u32 });
        }
        if !a.also.is_empty() {
            return self.acquire_all(a, fx);
        }
        if let Some(h) = self.holders.iter().find(|h| h.lease == lease && h.req == req) {
            return Ok(Reply::Acquired(grant(&h.lock, lease, h.token)));
        }
        if let Some(r) = self.memo(lease, req) {
            return Ok(r);
        }
        let lock_has = if self.in_use(lock) { self.permits_of(lock) } else { a.permits };
        if lock_has != a.permits {
            return Err(EngineError::PermitsMismatch { lock_has, asked: a.permits });
        }
        Ok(self.acquire_fresh(a, fx))
    }

    fn acquire_fresh(&mut self, a: &Acquire, fx: &mut Vec<Effect>) -> Reply {
        let (req, lease, lock) = (a.req.0, a.lease.0, a.lock.as_str());
        if let Some(done) = self.done(lock, &a.once_per) {
            self.remember(lease, req, Memo::Said(done.reply()));
            return done.reply();
        }
        if !self.in_use(lock) {
            self.permits.retain(|(l, _)| l != lock);
            self.permits.push((lock.to_string(), a.permits));
        }
        // A semaphore ignores the mode: its holders are exclusive.
        let share = (a.mode == Mode::Shared && a.permits == 0, a.weight);
        let b = self.busy(lock);
        if b.waiters == 0 && self.fits(lock, share.0, share.1) {
            let g = self.make_holder(lock, (lease, req), (a.lock_delay_ms, a.hold_at_least_ms), share);
            self.remember(lease, req, Memo::Said(Reply::Acquired(g.clone())));
            let (tag, mode) = (Tag::new(&a.identity, &a.value), mode_of(share.0));
            fx.push(Effect::Granted { grant: g.clone(), req: a.req, queued: false, waited_ms: 0, tag, mode });
            return Reply::Acquired(g);
        }
        if a.wait_ms == 0 {
            self.remember(lease, req, Memo::Said(Reply::Busy(b.clone())));
            return Reply::Busy(b);
        }
        let (since, until, delay, hold) = (self.now, self.now + a.wait_ms, a.lock_delay_ms, a.hold_at_least_ms);
        let (shared, weight) = share;
        let (lock, slot) = (lock.to_string(), a.once_per.clone());
        self.waiters.push(MWaiter { lock, lease, req, since, until, delay, hold, shared, weight, group: vec![], slot });
        Reply::Queued { position: b.waiters }
    }

    /// A multi-acquire past validation and the queue: its memo, then what it
    /// still holds; else every lock must be read-write (or unused); then all
    /// at once, busy, or queued on each.
    fn acquire_all(&mut self, a: &Acquire, fx: &mut Vec<Effect>) -> Result<Reply, EngineError> {
        let (req, lease) = (a.req.0, a.lease.0);
        if let Some(r) = self.memo(lease, req) {
            return Ok(r);
        }
        let mut held: Vec<&MHolder> = self.holders.iter().filter(|h| h.lease == lease && h.req == req).collect();
        held.sort_by_key(|h| h.token);
        if !held.is_empty() {
            return Ok(Reply::AcquiredAll(held.iter().map(|h| grant(&h.lock, lease, h.token)).collect()));
        }
        let locks: Vec<String> = a.locks().map(str::to_string).collect();
        for lock in &locks {
            let lock_has = if self.in_use(lock) { self.permits_of(lock) } else { 0 };
            if lock_has != 0 {
                return Err(EngineError::PermitsMismatch { lock_has, asked: 0 });
            }
        }
        let unused: Vec<String> = locks.iter().filter(|l| !self.in_use(l)).cloned().collect();
        for lock in unused {
            self.permits.retain(|(l, _)| *l != lock);
            self.permits.push((lock, 0));
        }
        let shared = a.mode == Mode::Shared;
        let blocked = locks.iter().find(|l| self.busy(l).waiters > 0 || !self.fits(l, shared, 1));
        let Some(blocked) = blocked.cloned() else {
            let mut grants = vec![];
            for lock in &locks {
                let g = self.make_holder(lock, (lease, req), (a.lock_delay_ms, a.hold_at_least_ms), (shared, 1));
                let (tag, mode) = (Tag::new(&a.identity, &a.value), mode_of(shared));
                fx.push(Effect::Granted { grant: g.clone(), req: a.req, queued: false, waited_ms: 0, tag, mode });
                grants.push(g);
            }
            self.remember(lease, req, Memo::Said(Reply::AcquiredAll(grants.clone())));
            return Ok(Reply::AcquiredAll(grants));
        };
        if a.wait_ms == 0 {
            let b = self.busy(&blocked);
            self.remember(lease, req, Memo::Said(Reply::Busy(b.clone())));
            return Ok(Reply::Busy(b));
        }
        let position = self.busy(&locks[0]).waiters;
        let (since, until, delay, hold) = (self.now, self.now + a.wait_ms, a.lock_delay_ms, a.hold_at_least_ms);
        for lock in &locks {
            let (lock, group) = (lock.clone(), locks.clone());
            let slot = String::new();
            self.waiters.push(MWaiter { lock, lease, req, since, until, delay, hold, shared, weight: 1, group, slot });
        }
        Ok(Reply::Queued { position })
    }

    /// `CompleteSlot` by the grant (lock, lease, token): checked as a release
    /// is; the first completion of a slot stays. The live waiters of the lock
    /// for that slot are told at once, in queue order.
    fn complete_slot(
        &mut self,
        (req, lease): (u64, u64),
        (lock, token): (&str, u64),
        (slot, exit_code): (&str, i32),
        fx: &mut Vec<Effect>,
    ) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        LockName::new(lock)?;
        if token == 0 {
            return Err(EngineError::InvalidToken);
        }
        check_slot(slot)?;
        if self.lease(lease).is_none() {
            return Ok(Reply::NotHolder);
        }
        if let Some(r) = self.memo(lease, req) {
            return Ok(r);
        }
        if !self.holders.iter().any(|h| h.lock == lock && h.lease == lease && h.token == token) {
            return Ok(Reply::NotHolder);
        }
        if self.done(lock, slot).is_none() {
            let (lock, slot, at) = (lock.to_string(), slot.to_string(), self.now);
            self.slots.push(MSlot { lock, slot, token, lease, exit_code, at });
        }
        self.remember(lease, req, Memo::Said(Reply::SlotCompleted));
        self.end_slot_waiters(lock, slot, fx);
        Ok(Reply::SlotCompleted)
    }

    /// Every live waiter of `lock` for the done `slot` leaves with
    /// `WaitEnd::SlotDone`, in queue order; the queue then moves on.
    fn end_slot_waiters(&mut self, lock: &str, slot: &str, fx: &mut Vec<Effect>) {
        let Some(done) = self.done(lock, slot) else { return };
        let ending: Vec<MWaiter> =
            self.waiters.iter().filter(|w| w.lock == lock && w.slot == slot && self.live(w.lease)).cloned().collect();
        for w in ending {
            self.waiters.retain(|x| !(x.lease == w.lease && x.req == w.req));
            let (lease, req) = (LeaseId(w.lease), RequestId(w.req));
            let why = WaitEnd::SlotDone(Box::new(done.clone()));
            fx.push(Effect::WaitEnded { lock: lock_name(lock), lease, req, why });
            self.remember(w.lease, w.req, Memo::Said(done.reply()));
        }
        self.grant_next(lock, fx);
    }

    /// The completed slots of `lock` at `now` (at least the model's clock),
    /// the most recently recorded first (among equals, by slot name).
    pub fn completed_slots(&self, now: u64, lock: &str) -> Vec<SlotInfo> {
        let now = now.max(self.now);
        let mut out: Vec<SlotInfo> = (self.slots.iter().filter(|s| s.lock == lock))
            .map(|s| SlotInfo {
                slot: s.slot.clone(),
                token: Token(s.token),
                identity: identity_of(s.lease),
                exit_code: s.exit_code,
                age_ms: now - s.at,
            })
            .collect();
        out.sort_by(|a, b| (a.age_ms, &a.slot).cmp(&(b.age_ms, &b.slot)));
        out
    }

    fn release(
        &mut self,
        req: u64,
        lease: u64,
        lock: &str,
        token: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        LockName::new(lock)?;
        if token == 0 {
            return Err(EngineError::InvalidToken);
        }
        if self.lease(lease).is_none() {
            return Ok(Reply::NotHolder);
        }
        if let Some(r) = self.memo(lease, req) {
            return Ok(r);
        }
        if !self.holders.iter().any(|h| h.lock == lock && h.lease == lease && h.token == token) {
            return Ok(Reply::NotHolder);
        }
        self.end_grant(lock, lease, token, ReleaseCause::Released, fx);
        self.remember(lease, req, Memo::Said(Reply::Released));
        Ok(Reply::Released)
    }

    fn set_value(
        &mut self,
        req: u64,
        lease: u64,
        lock: &str,
        token: u64,
        value: &[u8],
        fx: &mut Vec<Effect>,
    ) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        LockName::new(lock)?;
        if token == 0 {
            return Err(EngineError::InvalidToken);
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(EngineError::InvalidValue { got_bytes: value.len(), max_bytes: MAX_VALUE_BYTES });
        }
        if self.lease(lease).is_none() {
            return Ok(Reply::NotHolder);
        }
        if let Some(r) = self.memo(lease, req) {
            return Ok(r);
        }
        let Some(h) = self.holders.iter_mut().find(|h| h.lock == lock && h.lease == lease && h.token == token) else {
            return Ok(Reply::NotHolder);
        };
        h.value = value.to_vec();
        let tag = Tag::new(&identity_of(lease), value);
        fx.push(Effect::ValueChanged { grant: grant(lock, lease, token), tag });
        self.remember(lease, req, Memo::Said(Reply::ValueSet));
        Ok(Reply::ValueSet)
    }

    fn downgrade(
        &mut self,
        req: u64,
        lease: u64,
        lock: &str,
        token: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        LockName::new(lock)?;
        if token == 0 {
            return Err(EngineError::InvalidToken);
        }
        if self.lease(lease).is_none() {
            return Ok(Reply::NotHolder);
        }
        if let Some(r) = self.memo(lease, req) {
            return Ok(r);
        }
        let read_write = self.permits_of(lock) == 0;
        let found = self.holders.iter_mut().find(|h| h.lock == lock && h.lease == lease && h.token == token);
        let Some(h) = found.filter(|h| read_write && !h.shared) else {
            return Ok(Reply::NotHolder);
        };
        h.shared = true;
        let tag = Tag::new(&identity_of(lease), &h.value);
        fx.push(Effect::Downgraded { grant: grant(lock, lease, token), tag });
        self.remember(lease, req, Memo::Said(Reply::Downgraded));
        self.grant_next(lock, fx);
        Ok(Reply::Downgraded)
    }

    fn cancel(&mut self, req: u64, lease: u64, lock: &str, fx: &mut Vec<Effect>) -> Result<Reply, EngineError> {
        if req == 0 {
            return Err(EngineError::InvalidRequestId);
        }
        let name = LockName::new(lock)?;
        if self.lease(lease).is_none() {
            return Ok(Reply::Cancelled { released: false });
        }
        let mut released = false;
        if self.waiters.iter().any(|w| w.lease == lease && w.req == req && w.lock == lock) {
            self.end_wait(name.as_str(), lease, req, WaitEnd::Cancelled, fx);
        } else if self.holders.iter().any(|h| h.lease == lease && h.req == req) {
            // Every grant of the request still held (all those of a
            // multi-acquire, whichever lock the cancel names), in token order.
            let mut held: Vec<MHolder> =
                self.holders.iter().filter(|h| h.lease == lease && h.req == req).cloned().collect();
            held.sort_by_key(|h| h.token);
            for h in held {
                self.end_grant(&h.lock, lease, h.token, ReleaseCause::Cancelled, fx);
            }
            released = true;
        }
        if let Some(l) = self.leases.iter_mut().find(|l| l.id == lease) {
            l.memo.retain(|(r, _)| *r != req);
        }
        Ok(Reply::Cancelled { released })
    }

    // ---- queries, at an instant `now` that may be ahead of the last tick ----

    fn live_at(&self, id: u64, now: u64) -> bool {
        self.lease(id).is_some_and(|l| l.deadline > now)
    }

    pub fn stats(&self) -> Stats {
        Stats {
            leases: self.leases.len() as u64,
            held_locks: self.holders.len() as u64,
            waiters: self.waiters.len() as u64,
            tokens_issued: self.tokens_made,
            token_counter: self.counter,
        }
    }

    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.cluster
    }

    pub fn check(&self, now: u64, lock: &str, token: Token) -> Check {
        let mut live = self.holders.iter().filter(|h| h.lock == lock && self.live_at(h.lease, now));
        if live.clone().any(|h| h.token == token.0) {
            return Check::Current;
        }
        Check::Stale { current: live.next().map(|h| Token(h.token)) }
    }

    pub fn lock_info(&self, now: u64, lock: &str) -> Option<LockInfo> {
        if !self.in_use(lock) {
            return None;
        }
        let holders = self.holders.iter().filter(|h| h.lock == lock && self.live_at(h.lease, now));
        let holders = holders.map(|h| HolderInfo {
            lease: LeaseId(h.lease),
            owner: None,
            token: Token(h.token),
            held_ms: now.saturating_sub(h.since),
            ttl_left_ms: self.lease(h.lease).unwrap().deadline - now,
            lock_delay_ms: h.delay,
            mode: if h.shared { Mode::Shared } else { Mode::Exclusive },
            weight: h.weight,
            identity: identity_of(h.lease),
            value: h.value.clone(),
        });
        let holders: Vec<HolderInfo> = holders.collect();
        let mut reopen: Vec<u64> = self.closed.iter().filter(|c| c.lock == lock).map(|c| c.until).collect();
        for h in self.holders.iter().filter(|h| h.lock == lock && h.delay > 0 && !self.live_at(h.lease, now)) {
            reopen.push(self.lease(h.lease).unwrap().deadline.saturating_add(h.delay));
        }
        let reopens_in_ms = reopen.into_iter().max().filter(|&t| t > now).map(|t| t - now);
        let waiters = self.waiters.iter().filter(|w| w.lock == lock && w.until > now && self.live_at(w.lease, now));
        let waiters = waiters
            .map(|w| WaiterInfo {
                lease: LeaseId(w.lease),
                req: RequestId(w.req),
                waited_ms: now.saturating_sub(w.since),
                wait_left_ms: w.until - now,
                identity: identity_of(w.lease),
            })
            .collect();
        let (holder, permits) = (holders.first().cloned(), self.permits_of(lock));
        Some(LockInfo { name: lock_name(lock), holder, holders, permits, reopens_in_ms, waiters })
    }

    pub fn lease_info(&self, now: u64, id: u64) -> Option<LeaseInfo> {
        let l = self.lease(id).filter(|l| l.deadline > now)?;
        let mut held: Vec<&MHolder> = self.holders.iter().filter(|h| h.lease == id).collect();
        held.sort_by_key(|h| h.token);
        let locks = held.iter().map(|h| grant(&h.lock, id, h.token)).collect();
        Some(LeaseInfo { lease: LeaseId(id), owner: None, ttl_ms: l.ttl, ttl_left_ms: l.deadline - now, locks })
    }
}

/// The rules of a multi-acquire's locks: 2 to 16, read-write only, valid
/// names, no name twice (in this order).
fn check_multi(a: &Acquire) -> Result<(), EngineError> {
    let n = a.also.len() + 1;
    if !(2..=MAX_MULTI_LOCKS).contains(&n) {
        return Err(EngineError::InvalidLocks(format!("{n} locks (a multi-acquire names 2 to {MAX_MULTI_LOCKS})")));
    }
    if a.permits != 0 || a.weight != 1 || !a.once_per.is_empty() {
        let why = "a multi-acquire takes read-write locks only: no permits, no weight, no once-per slot";
        return Err(EngineError::InvalidLocks(why.into()));
    }
    let names: Vec<&str> = a.locks().collect();
    for n in &names {
        LockName::new(*n)?;
    }
    match (1..n).any(|i| names[..i].contains(&names[i])) {
        true => Err(EngineError::InvalidLocks("a lock is named twice".into())),
        false => Ok(()),
    }
}

/// The mode a grant's effect names.
fn mode_of(shared: bool) -> Mode {
    if shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    }
}

/// The identity the model's acquires of `lease` carry.
pub fn identity_of(lease: u64) -> String {
    format!("lease-{lease}")
}
