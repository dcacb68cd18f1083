//! Plain values of the client API: lock options, acquire outcomes, and the
//! read-only views of locks ([`LockInfo`], [`CheckResult`]).
//!
//! Where it sits: these mirror messages of `fencelock.v1` (see `lock.proto`) with
//! [`Duration`]s instead of millisecond counts, so that callers never see the
//! generated protobuf types. The `from_proto` conversions live here too.

use std::time::Duration;

use fencelock_proto::v1 as pb;

/// How to take a lock: `LockOptions::default().ttl(..).wait(..)`. Not
/// constructible by a struct literal outside the crate (`#[non_exhaustive]`),
/// so that a new option breaks no caller.
///
/// # Examples
///
/// One set of options for many acquires, on any backend. Build it with the
/// methods: a struct literal does not compile outside the crate.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{LockBackend, LockOptions, Outcome};
///
/// # async fn demo() -> Result<(), fencelock::Error> {
/// let backend = fencelock::connect("redis://cache.internal:6379").await?;
/// let opts = LockOptions::default()
///     .ttl(Duration::from_secs(20))
///     .wait(Duration::from_secs(60))
///     .require_fencing(true); // refuse a backend without tokens (Redlock)
/// for shard in ["shard/0", "shard/1"] {
///     if let Outcome::Acquired(guard) = backend.acquire(shard, &opts).await? {
///         guard.release().await?;
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease time-to-live (100 ms to 1 h). Locks of one [`crate::Client`] with the
    /// same TTL share one lease and one keep-alive loop.
    pub ttl: Duration,
    /// How long to wait in the server's FIFO queue; zero tries once.
    pub wait: Duration,
    /// If the lease later expires while holding the lock (an unclean loss, not a
    /// release), the lock stays closed to everyone for this long (at most 60 s).
    pub lock_delay: Duration,
    /// Refuse to take the lock through a backend that gives no fencing token
    /// ([`crate::backend::Fencing::None`], e.g. Redlock): the acquire fails with
    /// [`crate::Error::Unsupported`] before anything is sent. Every grant of the
    /// native server is fenced, so it never refuses.
    pub require_fencing: bool,
    /// Who takes the lock, as shown to anyone who describes it (with the
    /// grant, or with the place in the queue): at most 256 bytes of UTF-8
    /// without control characters. `None` takes the client's
    /// [`ClientBuilder::identity`](crate::ClientBuilder::identity), if any. Only
    /// backends with [`Capabilities::holder_identity`](crate::Capabilities::holder_identity)
    /// take one; the others refuse it ([`crate::Error::Unsupported`]).
    pub identity: Option<String>,
    /// Bytes published with the grant (an election's leader address), at most
    /// 4096; empty is none. Same backends as `identity`.
    pub value: Vec<u8>,
    /// [`LockMode::Shared`]: a reader of a read-write lock (many readers or
    /// one writer; strict FIFO across modes). Only backends with
    /// [`Capabilities::shared`](crate::Capabilities::shared) take it.
    pub mode: LockMode,
    /// `N > 0`: the lock is a semaphore of `N` permits, set by its first
    /// acquirer (another `N` is refused). Only backends with
    /// [`Capabilities::semaphores`](crate::Capabilities::semaphores).
    pub permits: u32,
    /// Permits of the semaphore taken at once, all or nothing (1 to
    /// `permits`; 1 otherwise).
    pub weight: u32,
    /// However the grant ends (release, lease loss, cancel), the server keeps
    /// the lock closed to everyone until this long after the grant, timed by
    /// its leader's monotonic clock (no wall clock): a job that ends early
    /// still keeps a second run out until then (at most 24 h; zero is none).
    /// Only backends with
    /// [`Capabilities::hold_at_least`](crate::Capabilities::hold_at_least).
    pub hold_at_least: Duration,
    /// A slot name (a day, an hour; 1 to 128 bytes): when a run of this lock
    /// completed that slot ([`crate::Guard::complete_slot`]) in the last 7
    /// days, the acquire fails with [`crate::Error::SlotDone`] (who ran it)
    /// and takes nothing. With a [`wait`](#structfield.wait) the acquire
    /// queues as any other; if the slot is completed while it waits (by the
    /// run that held the lock), it fails with `SlotDone` when its turn comes,
    /// and is never granted. Empty: none. Only backends with
    /// [`Capabilities::once_per`](crate::Capabilities::once_per).
    pub once_per: String,
}

/// How a grant of a read-write lock shares it.
///
/// # Examples
///
/// Readers share the lock; a writer (the default) has it alone.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, LockMode};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let reader = client.lock("catalog").shared().wait(Duration::from_secs(30)).acquire().await?;
/// for holder in client.describe("catalog").await?.holders {
///     let mode = match holder.mode {
///         LockMode::Shared => "reader",
///         LockMode::Exclusive => "writer",
///     };
///     println!("lease {}: {mode}, token {}", holder.lease_id, holder.token);
/// }
/// # drop(reader);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// The only holder (a writer). The default.
    #[default]
    Exclusive,
    /// One of any number of readers.
    Shared,
}

impl Default for LockOptions {
    /// A 15 s TTL, no wait (try once), no lock-delay, fencing not required.
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(15),
            wait: Duration::ZERO,
            lock_delay: Duration::ZERO,
            require_fencing: false,
            identity: None,
            value: Vec::new(),
            mode: LockMode::Exclusive,
            permits: 0,
            weight: 1,
            hold_at_least: Duration::ZERO,
            once_per: String::new(),
        }
    }
}

impl LockOptions {
    /// With lease time-to-live `ttl`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Waiting up to `wait` (zero: try once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// With lock-delay `lock_delay` after an unclean loss.
    pub fn lock_delay(mut self, lock_delay: Duration) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// Refusing a backend without fencing tokens if `require` (see
    /// [`LockOptions::require_fencing`](#structfield.require_fencing)).
    pub fn require_fencing(mut self, require: bool) -> Self {
        self.require_fencing = require;
        self
    }

    /// Taken as `identity` (see [`LockOptions::identity`](#structfield.identity)).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Publishing `value` with the grant (see [`LockOptions::value`](#structfield.value)).
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = value.into();
        self
    }

    /// As a reader of a read-write lock (see [`LockOptions::mode`](#structfield.mode)).
    pub fn shared(mut self) -> Self {
        self.mode = LockMode::Shared;
        self
    }

    /// On a semaphore of `permits` permits (see [`LockOptions::permits`](#structfield.permits)).
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Taking `weight` permits at once (see [`LockOptions::weight`](#structfield.weight)).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Keeping the lock closed until `hold` after the grant, however it ends
    /// (see [`LockOptions::hold_at_least`](#structfield.hold_at_least)).
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = hold;
        self
    }

    /// Running once per `slot` (see [`LockOptions::once_per`](#structfield.once_per)).
    pub fn once_per(mut self, slot: impl Into<String>) -> Self {
        self.once_per = slot.into();
        self
    }
}

/// A grant without a guard: what the server answered. Nothing keeps its lease
/// alive or releases it; the caller owns that (e.g. with
/// [`crate::Client::release_raw`] or [`crate::Client::revoke_lease`]).
///
/// # Examples
///
/// A grant handed to another process. Nothing renews it: it ends one TTL after
/// the grant unless released before.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, LockOptions, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let opts = LockOptions::default().ttl(Duration::from_secs(600));
/// if let Outcome::Acquired(grant) = client.acquire_detached("backup/db", opts).await? {
///     run_backup(&grant.lock, grant.lease_id, grant.token).await; // e.g. a child process
///     client.release_raw(&grant.lock, grant.lease_id, grant.token).await?;
/// }
/// # Ok(()) }
/// # async fn run_backup(_lock: &str, _lease_id: u64, _token: u64) {}
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The lock name.
    pub lock: String,
    /// The lease the lock is bound to.
    pub lease_id: u64,
    /// The fencing token of this grant.
    pub token: u64,
    /// Time the request spent in the server's queue.
    pub waited: Duration,
}

/// Answer of [`crate::Client::check`].
///
/// # Examples
///
/// A service that cannot store tokens asks the server before it acts on a
/// request that carries one. Something may still change between the check and
/// the action: a resource that compares tokens itself is safer.
///
/// ```no_run
/// # async fn demo(client: fencelock::Client, token: u64) -> Result<(), fencelock::Error> {
/// let check = client.check("orders/42", token).await?;
/// if !check.current {
///     println!("refused: token {token} is stale (current: {:?})", check.current_token);
///     return Ok(());
/// }
/// // ... act on the request ...
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckResult {
    /// True iff the token is the current grant of the lock and its lease is live.
    pub current: bool,
    /// The current holder's token, if the lock is held.
    pub current_token: Option<u64>,
}

/// One lock as the server sees it. A lock nobody holds or waits for has no holder
/// and no waiters.
///
/// # Examples
///
/// `holder` is only the first holder: a read-write lock or a semaphore may have
/// several, in `holders`.
///
/// ```no_run
/// # async fn demo(client: fencelock::Client) -> Result<(), fencelock::Error> {
/// let info = client.describe("reports/daily").await?;
/// match &info.holder {
///     Some(h) => println!("held under token {} ({:?} left)", h.token, h.ttl_left),
///     None => println!("free"),
/// }
/// println!("{} holder(s), {} waiting", info.holders.len(), info.waiters.len());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The first of [`LockInfo::holders`].
    pub holder: Option<Holder>,
    /// Every holder, in grant order (readers, a semaphore's permit holders).
    pub holders: Vec<Holder>,
    /// A semaphore's permits (0: not a semaphore).
    pub permits: u32,
    /// Time until a lock-delay reopens the lock, if one is running.
    pub reopens_in: Option<Duration>,
    /// Queued requests, first in line first.
    pub waiters: Vec<Waiter>,
}

/// The current holder of a lock.
///
/// # Examples
///
/// Every holder of the locks under a prefix. `identity` is what the acquire
/// said; `owner` is the identity the server authenticated.
///
/// ```no_run
/// # async fn demo(client: fencelock::Client) -> Result<(), fencelock::Error> {
/// for lock in client.list("jobs/", 0).await? {
///     for h in &lock.holders {
///         let owner = h.owner.as_deref().unwrap_or("-");
///         println!("{}: lease {} token {} for {:?}, {:?} by {owner}", lock.name, h.lease_id, h.token, h.held, h.identity);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The lease the grant is bound to.
    pub lease_id: u64,
    /// The identity that owns the holder's lease, on a server with
    /// authentication on (`None` when it was granted without one).
    pub owner: Option<String>,
    /// The grant's fencing token.
    pub token: u64,
    /// Time since the grant.
    pub held: Duration,
    /// Time until the holder's lease expires unless renewed.
    pub ttl_left: Duration,
    /// Lock-delay that applies if this lease expires while holding.
    pub lock_delay: Duration,
    /// The identity its acquire carried ([`LockOptions::identity`]; `None`
    /// when none). Not authenticated: [`Holder::owner`] is.
    pub identity: Option<String>,
    /// The value its acquire carried ([`LockOptions::value`]; empty when none).
    pub value: Vec<u8>,
    /// Exclusive or shared (a semaphore's holders are exclusive).
    pub mode: LockMode,
    /// Permits of a semaphore it holds (1 otherwise).
    pub weight: u32,
}

/// A queued acquire.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: fencelock::Client) -> Result<(), fencelock::Error> {
/// let info = client.describe("deploy/prod").await?;
/// for (place, w) in info.waiters.iter().enumerate() {
///     println!("{}. lease {} {:?}: waited {:?}, gives up in {:?}", place + 1, w.lease_id, w.identity, w.waited, w.wait_left);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// The lease the waiting request is bound to.
    pub lease_id: u64,
    /// Time in the queue so far.
    pub waited: Duration,
    /// Time until this wait times out.
    pub wait_left: Duration,
    /// The identity its acquire carried (`None` when none).
    pub identity: Option<String>,
}

pub(crate) fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// A duration as whole milliseconds for the wire, rounded up so that a non-zero
/// duration never becomes "zero" (which means "try once" or "none").
pub(crate) fn to_ms(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if d.as_nanos().is_multiple_of(1_000_000) { ms } else { ms + 1 };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl From<pb::Holder> for Holder {
    fn from(h: pb::Holder) -> Self {
        Holder {
            lease_id: h.lease_id,
            owner: (!h.owner.is_empty()).then_some(h.owner),
            token: h.token,
            held: ms(h.held_ms),
            ttl_left: ms(h.ttl_left_ms),
            lock_delay: ms(h.lock_delay_ms),
            identity: (!h.identity.is_empty()).then_some(h.identity),
            value: h.value,
            mode: mode_from_proto(h.mode),
            weight: h.weight.max(1),
        }
    }
}

pub(crate) fn mode_from_proto(mode: i32) -> LockMode {
    match pb::LockMode::try_from(mode) {
        Ok(pb::LockMode::Shared) => LockMode::Shared,
        _ => LockMode::Exclusive,
    }
}

pub(crate) fn mode_to_proto(mode: LockMode) -> i32 {
    match mode {
        LockMode::Exclusive => pb::LockMode::Exclusive as i32,
        LockMode::Shared => pb::LockMode::Shared as i32,
    }
}

impl From<pb::Waiter> for Waiter {
    fn from(w: pb::Waiter) -> Self {
        Waiter {
            lease_id: w.lease_id,
            waited: ms(w.waited_ms),
            wait_left: ms(w.wait_left_ms),
            identity: (!w.identity.is_empty()).then_some(w.identity),
        }
    }
}

impl From<pb::LockInfo> for LockInfo {
    fn from(l: pb::LockInfo) -> Self {
        LockInfo {
            name: l.name,
            holder: l.holder.map(Holder::from),
            holders: l.holders.into_iter().map(Holder::from).collect(),
            permits: l.permits,
            reopens_in: l.reopens_in_ms.map(ms),
            waiters: l.waiters.into_iter().map(Waiter::from).collect(),
        }
    }
}

/// A slot a run once per slot completed (see [`crate::Guard::complete_slot`]),
/// as [`crate::Client::completed_slots`] shows it.
///
/// # Examples
///
/// A job that runs once a day however many hosts start it. Only a run that
/// still holds the lock completes its slot: one that lost it has not, and the
/// next run does the job.
///
/// ```no_run
/// use fencelock::{Client, Error, Outcome};
///
/// # async fn demo(client: Client, day: &str) -> Result<(), Error> {
/// match client.lock("nightly-report").once_per(day).acquire().await {
///     Ok(Outcome::Acquired(run)) => {
///         let exit_code = run_report().await;
///         run.complete_slot(day, exit_code).await?; // Ok(false): lost, not done
///         run.release().await?;
///     }
///     Ok(_) => println!("another host is running it now"),
///     Err(Error::SlotDone { identity, exit_code, .. }) => println!("{identity} ran it (exit {exit_code})"),
///     Err(e) => return Err(e),
/// }
/// for done in client.completed_slots("nightly-report").await? {
///     println!("{}: token {}, exit {}, {:?} ago", done.slot, done.token, done.exit_code, done.age);
/// }
/// # Ok(()) }
/// # async fn run_report() -> i32 { 0 }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedSlot {
    /// The slot's name, as the acquire gave it (the CLI's `--once-per day` names
    /// the UTC day, e.g. `2026-11-23`).
    pub slot: String,
    /// The token of the grant that ran it.
    pub token: u64,
    /// That grant's identity, if it carried one.
    pub identity: Option<String>,
    /// The exit code the run reported.
    pub exit_code: i32,
    /// Time since it was recorded (the server's monotonic clock).
    pub age: Duration,
}

impl From<pb::CompletedSlot> for CompletedSlot {
    fn from(s: pb::CompletedSlot) -> Self {
        CompletedSlot {
            slot: s.slot,
            token: s.token,
            identity: (!s.identity.is_empty()).then_some(s.identity),
            exit_code: s.exit_code,
            age: ms(s.age_ms),
        }
    }
}

impl From<pb::CheckResponse> for CheckResult {
    fn from(c: pb::CheckResponse) -> Self {
        CheckResult { current: c.current, current_token: c.current_token }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_milliseconds() {
        assert_eq!(to_ms(Duration::ZERO), 0);
        assert_eq!(to_ms(Duration::from_micros(1)), 1);
        assert_eq!(to_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(to_ms(Duration::from_micros(1_500_001)), 1501);
        assert_eq!(to_ms(Duration::MAX), u64::MAX);
    }
}

/// A position in the group's event history: the Raft log index of the entry
/// an event was applied at, and its position among that entry's events.
///
/// # Examples
///
/// Resume a watch where the last run stopped. `from` is inclusive: start at the
/// revision after the last event handled. A revision prints as `INDEX.SEQ` and
/// parses back.
///
/// ```no_run
/// use fencelock::{Client, Revision};
///
/// # async fn demo(client: Client, checkpoint: Option<String>) -> Result<(), fencelock::Error> {
/// let last: Option<Revision> = checkpoint.and_then(|s| s.parse().ok());
/// let mut events = client.watch_from("orders/", last.map(Revision::next));
/// while let Some(event) = events.next_event().await {
///     let event = event?; // Error::Compacted { oldest }: the server no longer holds `from`
///     handle(&event);
///     save_checkpoint(event.revision.to_string());
/// }
/// # Ok(()) }
/// # fn handle(_event: &fencelock::WatchEvent) {}
/// # fn save_checkpoint(_revision: String) {}
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// The log index of the entry the event came from.
    pub index: u64,
    /// The event's place among that entry's events.
    pub seq: u32,
}

impl Revision {
    /// The revision right after this one: where to resume after it.
    pub fn next(self) -> Revision {
        match self.seq.checked_add(1) {
            Some(seq) => Revision { index: self.index, seq },
            None => Revision { index: self.index.saturating_add(1), seq: 0 },
        }
    }
}

impl std::fmt::Display for Revision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.index, self.seq)
    }
}

/// A text that is not a [`Revision`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a revision (INDEX or INDEX.SEQ)")]
pub struct ParseRevisionError(String);

impl std::str::FromStr for Revision {
    type Err = ParseRevisionError;

    /// `INDEX.SEQ`, or `INDEX` (= `INDEX.0`).
    fn from_str(s: &str) -> Result<Revision, ParseRevisionError> {
        let bad = || ParseRevisionError(s.to_string());
        let (index, seq) = s.trim().split_once('.').unwrap_or((s.trim(), "0"));
        Ok(Revision { index: index.parse().map_err(|_| bad())?, seq: seq.parse().map_err(|_| bad())? })
    }
}
