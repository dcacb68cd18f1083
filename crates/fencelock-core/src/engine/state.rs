//! The records the engine keeps: leases with their request memory, and locks with
//! their holders, FIFO queue and lock-delay.
//!
//! Plain data with small helpers; the rules that change them live in `lease.rs`
//! and `lock.rs`. Every collection is ordered (`VecMap`, [`Small`], `VecDeque`,
//! [`Dedup`]), so iteration order, and therefore every outcome, is the same on
//! every replica. What most records hold one of is kept in place ([`Small`],
//! [`Dedup`]) and what most hold none of is boxed while they have some
//! ([`OnDemand`]); each serializes as the plain collection it replaces.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::dedup::Dedup;
use super::ondemand::{Collection, OnDemand};
use super::small::Small;
use super::vecmap::VecMap;
use crate::{Grant, LeaseId, LockName, Millis, Mode, RequestId, Tag, Token, KEEPALIVES_PER_LEASE};

/// One lease: a TTL, the instant it ends unless kept alive, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    /// Its TTL ([`Lease::ttl`]), in 32 bits: see [`ms32`].
    pub ttl_ms: u32,
    /// The lease expires when `now >= deadline` (INV-8).
    pub deadline: Millis,
    /// The `GrantLease` request that created it; its entry in the engine's
    /// request map is removed when the lease ends.
    pub grant_req: RequestId,
    /// Grants this lease holds, by token (so, in grant order).
    pub holds: VecMap<Token, LockName>,
    /// Acquires of this lease that wait in a queue, by request id (boxed
    /// while there are any: most leases wait for nothing).
    pub waits: OnDemand<Waits>,
    /// Final outcomes of its recent requests, for retries (INV-6).
    pub dedup: Dedup,
    /// Its recent keep-alives, for retries (INV-6); absent until its first
    /// keep-alive, and in states written before keep-alives were kept apart
    /// (theirs are in `dedup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Box<Kept>>,
    /// Set by the `LeaderStart` that gave this lease a fresh TTL; cleared by its
    /// next keep-alive. A lease that already had its fresh TTL gets no second
    /// one from the next leader (INV-12, etcd#9888).
    #[serde(default)]
    pub extended: bool,
    /// The identity that granted it (see [`crate::Command::As`], and
    /// [`Lease::owner`]); `None`: anyone. Boxed twice, so that the record
    /// holds a thin pointer: with it and the 32-bit TTL a record is 128 bytes,
    /// not 144, in its chunk of the lease map (issue 38 §3). An owned lease
    /// pays 16 bytes for the second box.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<Box<Box<str>>>,
}

/// The waits of a lease: the first lock of each queued acquire, by request id.
pub(crate) type Waits = VecMap<RequestId, LockName>;

static NO_WAITS: Waits = VecMap::new();

impl Collection for Waits {
    fn none() -> &'static Self {
        &NO_WAITS
    }

    fn has_none(&self) -> bool {
        self.len() == 0
    }
}

impl Lease {
    pub fn new(ttl_ms: u64, deadline: Millis, grant_req: RequestId, owner: Option<&str>) -> Self {
        Self {
            owner: owner.map(|o| Box::new(Box::from(o))),
            ttl_ms: ms32(ttl_ms),
            deadline,
            grant_req,
            holds: VecMap::default(),
            waits: OnDemand::default(),
            dedup: Dedup::default(),
            kept: None,
            extended: false,
        }
    }

    /// Its TTL, ms.
    pub fn ttl(&self) -> u64 {
        u64::from(self.ttl_ms)
    }

    /// The identity that granted it; `None`: anyone.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref().map(|o| &**o)
    }

    /// Re-bases the deadline onto a new leader's clock, which reads `now` where
    /// the old leader's last read `old_now` (INV-12). A lease kept alive (or
    /// created) since the last leader change gets one fresh full TTL: the time
    /// between the old leader's last entry and `now` is unknown, and the lease
    /// must not end before its holder's own deadline (INV-8). A lease that
    /// already had its fresh TTL keeps only what it had left at `old_now` (at
    /// most its TTL), so that elections alone never keep a lease alive: without
    /// keep-alives it ends within two TTLs of served time after its last one.
    pub fn rebase(&mut self, old_now: Millis, now: Millis) {
        let left = if self.extended { self.deadline.saturating_sub(old_now).min(self.ttl()) } else { self.ttl() };
        self.extended = true;
        self.deadline = now.saturating_add(left);
    }
}

/// The request ids of a lease's last [`KEEPALIVES_PER_LEASE`] keep-alives,
/// oldest first (serialized as that list).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Kept(VecDeque<RequestId>);

impl Kept {
    pub fn contains(&self, req: RequestId) -> bool {
        self.0.contains(&req)
    }

    /// Remembers `req`, forgetting the oldest beyond the bound.
    pub fn push(&mut self, req: RequestId) {
        if self.0.len() >= KEEPALIVES_PER_LEASE {
            self.0.pop_front();
        }
        if self.0.capacity() == 0 {
            self.0.reserve_exact(KEEPALIVES_PER_LEASE);
        }
        self.0.push_back(req);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// What a lock admits at once. A read-write lock (the default, and every lock
/// of a state written before the others existed) admits many shared holders or
/// one exclusive holder; a semaphore admits holders whose weights add up to at
/// most its permits, whatever their mode (INV-15).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum LockKind {
    /// A read-write lock. Named `Exclusive` in snapshots written before the
    /// rename (the name still written, so that older binaries read them).
    #[default]
    #[serde(rename = "Exclusive")]
    ReadWrite,
    Semaphore {
        permits: u32,
    },
}

impl LockKind {
    /// The kind an acquire asking for `permits` creates (0: read-write).
    pub fn of_permits(permits: u32) -> Self {
        match permits {
            0 => LockKind::ReadWrite,
            permits => LockKind::Semaphore { permits },
        }
    }

    /// The permits an acquire must name to use this lock (0: read-write).
    pub fn permits(self) -> u32 {
        match self {
            LockKind::ReadWrite => 0,
            LockKind::Semaphore { permits } => permits,
        }
    }
}

/// One lock that is held, has waiters, or is closed by lock-delay. A lock with
/// none of these has no entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lock {
    pub kind: LockKind,
    /// Holders that fit together (INV-1, INV-15), in grant order (the one
    /// most locks have in place).
    pub holders: Small<Holder>,
    /// Waiting acquires, first in line first (INV-3, INV-16); boxed while
    /// there are any (most locks have no waiter).
    pub queue: OnDemand<Queue>,
    /// Set after a holder's lease expired with a lock-delay (INV-7), or a
    /// grant with a hold-at-least ended before its time. Boxed: most locks
    /// are open.
    pub closed: Option<Box<Closed>>,
}

/// The queue of a lock.
pub(crate) type Queue = VecDeque<Waiter>;

static NO_WAITERS: Queue = VecDeque::new();

impl Collection for Queue {
    fn none() -> &'static Self {
        &NO_WAITERS
    }

    fn has_none(&self) -> bool {
        self.is_empty()
    }
}

impl Lock {
    pub fn of_kind(kind: LockKind) -> Self {
        Lock { kind, ..Lock::default() }
    }

    pub fn is_unused(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty() && self.closed.is_none()
    }

    /// Whether a grant of `mode` and `weight` fits beside the current holders
    /// of this open lock (the one place of INV-15; FIFO is the caller's).
    pub fn admits(&self, mode: Mode, weight: u32) -> bool {
        self.closed.is_none() && self.fits(mode, weight)
    }

    /// A semaphore: the weights fit in its permits; a read-write lock: nobody
    /// holds it, or every holder and the newcomer share it.
    fn fits(&self, mode: Mode, weight: u32) -> bool {
        match self.kind {
            LockKind::Semaphore { permits } => u64::from(weight) + self.used() <= u64::from(permits),
            LockKind::ReadWrite => {
                self.holders.is_empty() || (mode == Mode::Shared && self.holders.iter().all(|h| h.mode == Mode::Shared))
            }
        }
    }

    /// Permits in use (the sum of the holders' weights).
    pub fn used(&self) -> u64 {
        self.holders.iter().map(|h| u64::from(h.weight)).sum()
    }

    /// Whether the holders fit together (INV-1, INV-15), for a received snapshot.
    pub fn holders_fit(&self) -> bool {
        match self.kind {
            LockKind::Semaphore { permits } => self.used() <= u64::from(permits),
            LockKind::ReadWrite => self.holders.len() <= 1 || self.holders.iter().all(|h| h.mode == Mode::Shared),
        }
    }

    /// A new grant, last in grant order. Most locks have one holder, kept in
    /// the lock itself (see [`Small`]).
    pub fn add_holder(&mut self, holder: Holder) {
        self.holders.push(holder);
    }

    pub fn holder(&self, lease: LeaseId, token: Token) -> Option<usize> {
        self.holders.iter().position(|h| h.lease == lease && h.token == token)
    }

    pub fn holder_for_req(&self, lease: LeaseId, req: RequestId) -> Option<&Holder> {
        self.holders.iter().find(|h| h.lease == lease && h.req == req)
    }

    pub fn waiter(&self, lease: LeaseId, req: RequestId) -> Option<usize> {
        self.queue.iter().position(|w| w.lease == lease && w.req == req)
    }
}

/// A grant of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub lease: LeaseId,
    /// The acquire that was granted (for retries and `CancelWait`).
    pub req: RequestId,
    pub token: Token,
    pub granted_at: Millis,
    /// [`crate::Acquire::lock_delay_ms`], in 32 bits (see [`ms32`]).
    pub lock_delay_ms: u32,
    /// Identity and value of the acquire; absent in state written before they
    /// existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<Box<Tag>>,
    /// Shared or exclusive (always exclusive on a semaphore); a
    /// [`crate::Command::Downgrade`] makes it shared.
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    /// Permits it holds (1 on a read-write lock).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
    /// [`crate::Acquire::hold_at_least_ms`], in 32 bits (see [`ms32`]);
    /// absent in state written before it existed (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_at_least_ms: u32,
}

impl Holder {
    /// Its lock-delay, ms.
    pub fn lock_delay(&self) -> u64 {
        u64::from(self.lock_delay_ms)
    }

    pub fn grant(&self, lock: &LockName) -> Grant {
        Grant { lock: lock.clone(), lease: self.lease, token: self.token }
    }

    /// How long, from `now`, its hold-at-least keeps the lock closed once the
    /// grant ends (0: not at all).
    pub fn hold_left(&self, now: Millis) -> u64 {
        self.granted_at.saturating_add(u64::from(self.hold_at_least_ms)).saturating_sub(now)
    }
}

/// A queued acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiter {
    pub lease: LeaseId,
    pub req: RequestId,
    pub queued_at: Millis,
    /// The wait times out when `now >= deadline`.
    pub deadline: Millis,
    pub lock_delay_ms: u64,
    /// Identity and value of the acquire, handed to the holder it becomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<Box<Tag>>,
    /// As the holder it becomes.
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_at_least_ms: u64,
    /// [`crate::Acquire::once_per`]: looked at again before it is granted.
    /// Empty for none (and in state written before waiters could have one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub once_per: String,
    /// A multi-acquire: every lock it waits for, in the order asked (it sits
    /// in the queue of each, and its lease's `waits` names the first). Empty
    /// for a single acquire (and in state written before multi-acquires).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub all: Vec<LockName>,
}

impl Waiter {
    /// The locks it waits for, found in the queue of `own`.
    pub fn locks(&self, own: &LockName) -> Vec<LockName> {
        match self.all.is_empty() {
            true => vec![own.clone()],
            false => self.all.clone(),
        }
    }

    /// The lock its lease's `waits` names (`own` for a single acquire).
    pub fn first<'a>(&'a self, own: &'a LockName) -> &'a LockName {
        self.all.first().unwrap_or(own)
    }
}

/// What closes a lock after a grant ends, as an acquire asked for it: its
/// lock-delay (after an expiry) and its hold-at-least (however it ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closing {
    pub lock_delay_ms: u64,
    pub hold_at_least_ms: u64,
}

impl Closing {
    pub fn of(a: &crate::Acquire) -> Self {
        Closing { lock_delay_ms: a.lock_delay_ms, hold_at_least_ms: a.hold_at_least_ms }
    }

    pub fn of_waiter(w: &Waiter) -> Self {
        Closing { lock_delay_ms: w.lock_delay_ms, hold_at_least_ms: w.hold_at_least_ms }
    }
}

/// What an acquire asks for, as a holder or a waiter keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    pub mode: Mode,
    pub weight: u32,
}

impl Share {
    /// What `a` asks for on a lock of `kind`: a semaphore ignores the mode.
    pub fn of(a: &crate::Acquire, kind: LockKind) -> Self {
        match kind {
            LockKind::ReadWrite => Share { mode: a.mode, weight: a.weight },
            LockKind::Semaphore { .. } => Share { mode: Mode::Exclusive, weight: a.weight },
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// A duration of a record, in milliseconds, kept in 32 bits: a lease's TTL, a
/// holder's lock-delay and hold-at-least. Every bound a request is checked
/// against fits (asserted below), so a checked value is kept as it is; one
/// beyond 32 bits could only come from a record no request made, and
/// saturates. A snapshot's record beyond 32 bits does not decode. A holder is
/// most of a lock's record, and leases are kept in place in chunks: 32 bits
/// make a lock 80 bytes, not 88, and a lease record 128, not 144 (issue 38
/// §3; the footprint test's idle lease with a lock went from 346 to 322 bytes).
pub(crate) fn ms32(ms: u64) -> u32 {
    u32::try_from(ms).unwrap_or(u32::MAX)
}

const _: () = assert!(crate::MAX_TTL_MS <= u32::MAX as u64);
const _: () = assert!(crate::MAX_LOCK_DELAY_MS <= u32::MAX as u64);
const _: () = assert!(crate::MAX_HOLD_AT_LEAST_MS <= u32::MAX as u64);

/// A lock closed by lock-delay or by a hold-at-least: nobody is granted before
/// `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Closed {
    pub until: Millis,
    /// The full delay (for a hold-at-least: what was left of it when the grant
    /// ended), so that a new leader can restart it: a re-base never shortens
    /// a closure, it can only lengthen it.
    pub delay_ms: u64,
}

/// The instant at `new_now` that has the age `instant` had at `old_now`
/// (saturating at 0).
pub(crate) fn rebase(instant: Millis, old_now: Millis, new_now: Millis) -> Millis {
    new_now.saturating_sub(old_now.saturating_sub(instant))
}

impl Lock {
    /// Move every stored instant onto a new leader's clock (see
    /// [`crate::Input::LeaderStart`]).
    pub fn rebase(&mut self, old_now: Millis, new_now: Millis) {
        for h in self.holders.iter_mut() {
            h.granted_at = rebase(h.granted_at, old_now, new_now);
        }
        self.queue.change(|queue| {
            for w in queue {
                w.queued_at = rebase(w.queued_at, old_now, new_now);
                w.deadline = new_now.saturating_add(w.deadline.saturating_sub(old_now));
            }
        });
        if let Some(c) = &mut self.closed {
            c.until = new_now.saturating_add(c.delay_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule (issue 38 §3): a lease record is 128 bytes and a lock 80 (see
    /// [`ms32`]); every idle lease pays for one of each. A field added to
    /// either must find room in it, or move these on purpose.
    #[test]
    fn records_keep_their_sizes() {
        assert_eq!(std::mem::size_of::<Lease>(), 128, "a lease record");
        assert_eq!(std::mem::size_of::<Lock>(), 80, "a lock record");
        assert_eq!(std::mem::size_of::<Holder>(), 56, "a holder, kept in its lock");
    }

    /// Rule: a duration is kept as asked when it fits in 32 bits, and every
    /// bound a request is checked against fits; beyond, it saturates.
    #[test]
    fn durations_narrow_without_wrapping() {
        for ms in [0, 1, crate::MAX_TTL_MS, crate::MAX_LOCK_DELAY_MS, crate::MAX_HOLD_AT_LEAST_MS] {
            assert_eq!(u64::from(ms32(ms)), ms);
        }
        assert_eq!(ms32(u64::from(u32::MAX) + 1), u32::MAX, "saturates, never wraps to 0");
    }
}
