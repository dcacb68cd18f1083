//! The engine's vocabulary: inputs, replies and effects (its identifiers are
//! in `ids`).
//!
//! Everything here is serializable because inputs are entries of the replicated
//! log, replies travel back through the Raft client-write response, and the whole
//! engine is a snapshot.

use serde::{Deserialize, Serialize};

use crate::{EngineError, LeaseId, LockName, RequestId, Token};

/// A monotonic instant in milliseconds on the leader's clock (not wall-clock time).
/// Values from different leaders are not comparable; [`Input::LeaderStart`] re-bases.
pub type Millis = u64;

/// Shortest lease TTL.
pub const MIN_TTL_MS: u64 = 100;
/// Longest lease TTL (1 h).
pub const MAX_TTL_MS: u64 = 3_600_000;
/// Longest wait for a queued acquire (1 h).
pub const MAX_WAIT_MS: u64 = 3_600_000;
/// Longest lock-delay (Chubby's upper bound: 1 min).
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;
/// Longest hold-at-least ([`Acquire::hold_at_least_ms`]): 24 h.
pub const MAX_HOLD_AT_LEAST_MS: u64 = 86_400_000;
/// Longest slot name ([`Acquire::once_per`], [`Command::CompleteSlot`]), in bytes.
pub const MAX_SLOT_BYTES: usize = 128;
/// How long the engine remembers a completed slot (7 days of engine time).
pub const SLOT_RETENTION_MS: u64 = 7 * 86_400_000;

/// A completed slot of a lock, as [`crate::Engine::completed_slots`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotInfo {
    pub slot: String,
    /// The token of the grant that completed it.
    pub token: Token,
    /// That grant's identity ("" for none).
    pub identity: String,
    pub exit_code: i32,
    /// Milliseconds of engine time since it was recorded.
    pub age_ms: u64,
}

/// The most completed slots kept per lock: recording one more drops the
/// oldest (as its retention would have), so a holder that completes slot
/// after slot of new names cannot grow the state and its snapshots without
/// bound. 7 days of hourly slots are 168.
pub const MAX_SLOTS_PER_LOCK: usize = 1024;
/// Longest holder identity ([`Acquire::identity`]), in bytes of UTF-8.
pub const MAX_IDENTITY_BYTES: usize = 256;
/// Largest holder value ([`Acquire::value`]), in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;
/// Most locks one multi-acquire names ([`Acquire::also`]).
pub const MAX_MULTI_LOCKS: usize = 16;
/// Longest resource a refusal report names ([`Command::ReportRefusal`]), in
/// bytes of UTF-8.
pub const MAX_RESOURCE_BYTES: usize = 256;
/// How many recent request outcomes each lease remembers for retries.
pub const DEDUP_PER_LEASE: usize = 256;
/// How many recent keep-alives each lease remembers for retries, apart from
/// the other outcomes: a keep-alive's answer is the lease's id and TTL, so
/// only its request id is kept, and keep-alives do not push a live lease's
/// other outcomes out (nor fill [`DEDUP_PER_LEASE`] slots of ~56 bytes each).
pub const KEEPALIVES_PER_LEASE: usize = 8;
/// How many recent successful revokes the engine remembers, so that a retried
/// revoke is answered `LeaseRevoked` again rather than `LeaseNotFound`.
pub const REVOKED_MEMORY: usize = 4096;

/// One input to the engine: an entry of the replicated log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// A node became leader at `now` (its own clock). Every live lease kept alive
    /// (or created) since the previous `LeaderStart` gets a fresh full TTL from
    /// `now`; one that was not keeps the time it had left, at most its TTL
    /// (INV-12: elections alone never keep a lease alive). A closed lock-delay
    /// restarts in full; a queued wait keeps the time it had left. This is the one input whose `now` may be smaller than
    /// the engine's current time (another clock).
    ///
    /// `token_floor`: the next token is at least this (INV-2 across groups: see
    /// [`token_floor`]); 0 changes nothing. `cluster_id`: the group's id, adopted
    /// only if the engine has none yet (the first leader's proposal wins and
    /// never changes after). Both default when absent, so entries written before
    /// they existed still decode.
    LeaderStart {
        now: Millis,
        #[serde(default)]
        token_floor: u64,
        #[serde(default)]
        cluster_id: Option<ClusterId>,
    },
    /// Advance time to `now` (expire what is due), then apply `cmds` in order.
    /// An empty batch is a pure tick.
    Batch { now: Millis, cmds: Vec<Command> },
}

impl Input {
    /// A `LeaderStart` at `now` with no token floor and no cluster id.
    pub fn leader_start(now: Millis) -> Self {
        Input::LeaderStart { now, token_floor: 0, cluster_id: None }
    }
}

/// The id of one group (one formation of a Raft group): random, 128 bits, shown
/// as 32 hex digits. It is part of the replicated state (see
/// [`Input::LeaderStart`]), so every member and every snapshot carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClusterId(pub u128);

impl std::fmt::Display for ClusterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// How many bits of a token lie below the wall-clock seconds in [`token_floor`].
pub const TOKEN_FLOOR_SHIFT: u32 = 31;

/// The lowest token a leader that starts at `unix_seconds` (wall-clock seconds
/// since 1970) lets the engine issue next: `unix_seconds << 31`.
///
/// Why: a group started afresh (new data dir, `--force-new-cluster`) must not
/// issue tokens below those an earlier group on the same machine issued, or the
/// fences would refuse it (or worse, a fence that lost its marks would accept an
/// older holder). With this floor, a group whose leader started at second `s`
/// issues tokens from `s·2^31` on, so it stays below a later group's floor as
/// long as it issues fewer than 2^31 tokens per second of its life (counted from
/// its leader's start), and the wall clock of the later start is not behind the
/// earlier start. The floor stays below 2^63 (the largest token the fences
/// take): seconds past 2^32 (the year 2106) count as 2^32 − 1.
pub fn token_floor(unix_seconds: u64) -> u64 {
    unix_seconds.min(u64::from(u32::MAX)) << TOKEN_FLOOR_SHIFT
}

/// A client command. Every one is validated by the engine; an invalid one is
/// answered with [`Reply::Rejected`] and changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a lease that expires `ttl_ms` after `now` unless kept alive.
    ///
    /// `id`: the id the new lease gets, chosen at random by the server that
    /// proposes the command, so that lease ids cannot be guessed (the engine
    /// never reads a random source, as it never reads a clock). `None` (and
    /// entries written before the field existed) takes the next id of the
    /// engine's counter. An id that is 0 or belongs to a live lease is refused.
    GrantLease {
        req: RequestId,
        ttl_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<LeaseId>,
    },
    /// Move the lease deadline to `now + ttl`.
    KeepAlive { req: RequestId, lease: LeaseId },
    /// End the lease now: release its locks (no lock-delay), drop its waiters.
    Revoke { req: RequestId, lease: LeaseId },
    /// Take `lock` for `lease`. `wait_ms == 0` is a try: [`Reply::Busy`] if taken.
    /// Otherwise the request queues FIFO for up to `wait_ms` ([`Reply::Queued`]) and
    /// its outcome arrives later as an [`Effect`] carrying `req`.
    Acquire(Acquire),
    /// Compare-and-delete: releases only when (lock, lease, token) is the current grant.
    Release { req: RequestId, lease: LeaseId, lock: String, token: Token },
    /// Turn the exclusive grant (lock, lease, token) of a read-write lock into a
    /// shared one, keeping its token; the readers queued at the head of the
    /// lock's queue may then be granted beside it. [`Reply::NotHolder`] (and
    /// nothing changes) when that is not a current exclusive grant of a
    /// read-write lock: a shared grant, a semaphore's, or no grant. There is
    /// no upgrade (two readers that both upgrade wait for each other forever).
    Downgrade { req: RequestId, lease: LeaseId, lock: String, token: Token },
    /// Compare-and-set of the value published with a grant: replaces the value
    /// of (lock, lease, token) only when that is the current grant (the holder
    /// keeps its identity, its token and its place); [`Reply::NotHolder`]
    /// otherwise, and nothing changes. How an elected leader proclaims a new
    /// value without giving up its term.
    SetValue {
        req: RequestId,
        lease: LeaseId,
        lock: String,
        token: Token,
        #[serde(default, skip_serializing_if = "Vec::is_empty", with = "crate::b64")]
        value: Vec<u8>,
    },
    /// The current holder (lock, lease, token) ran the job of `slot` to its
    /// end with `exit_code`: the engine records it (with the token, the
    /// grant's identity and its own `now`) for [`SLOT_RETENTION_MS`], and an
    /// acquire with that `once_per` is answered [`Reply::SlotDone`] (the live
    /// waiters of the lock for that slot leave the queue at once with
    /// [`WaitEnd::SlotDone`]).
    /// [`Reply::NotHolder`] (and nothing changes) when that is not a current
    /// grant: a run that lost its lease never completes its slot. The first
    /// completion of a slot stays; a later one is answered
    /// [`Reply::SlotCompleted`] and changes nothing.
    CompleteSlot { req: RequestId, lease: LeaseId, lock: String, token: Token, slot: String, exit_code: i32 },
    /// The requester of `req` no longer wants that acquire: if it is queued it leaves
    /// the queue; if it was already granted and is still held, it is released (the
    /// grant never reached anyone who will release it). A multi-acquire may be
    /// named by any of its locks: it leaves every queue, or every grant of it
    /// still held is released.
    CancelWait { req: RequestId, lease: LeaseId, lock: String },
    /// `cmd`, sent by the authenticated `caller` (a server with authentication
    /// on wraps every command in this). A lease granted this way belongs to the
    /// caller: the caller's other commands on it are applied, anyone else's are
    /// refused ([`EngineError::NotOwner`]); a revoke by an `admin` caller is
    /// applied too. A lease granted without a caller (authentication off, or
    /// before it was turned on) belongs to nobody and takes commands from
    /// anyone. `cmd` may not itself be an `As`.
    As { caller: Caller, cmd: Box<Command> },
    /// Change who may do what ([`crate::policy`]). Applied only inside an `As`
    /// whose caller is `admin`; refused ([`EngineError::NotAdmin`]) otherwise.
    Policy(crate::PolicyChange),
    /// Give the semaphore `lock` `permits` permits from now on. Inside an
    /// `As`, only an `admin` caller may ([`EngineError::NotAdmin`]); without
    /// one (authentication off) anyone may. Refused when `lock` is not a
    /// semaphore now ([`EngineError::NotASemaphore`]) or when fewer permits
    /// than its holders use, or than one queued acquire asks for, would be
    /// left ([`EngineError::ResizeTooSmall`]): a semaphore never has more in
    /// use than its permits (INV-15), and no waiter is left that could never be
    /// granted. A resize up grants the queue at once. Holders keep their
    /// permits and tokens; later acquires must name the new number
    /// ([`EngineError::PermitsMismatch`] otherwise). Setting the number it
    /// has already changes nothing, so a retry is harmless.
    Resize { lock: String, permits: u32 },
    /// A fence refused a stale write on `lock`: its token `refused` was below
    /// `highest`, the highest token the fence had admitted (the rule of
    /// `fencelock-fence`'s `Marks::admit`: a write is refused when its token
    /// is below the highest admitted, so `refused < highest` always; a read
    /// when below the last write's, which is at most the highest).
    /// `resource` says what the fence protects (a storage key; "" for none, at
    /// most [`MAX_RESOURCE_BYTES`] of UTF-8 without control characters).
    ///
    /// A report changes nothing: no lease, holder, queue, slot or token (the
    /// token counter included). Its answer is [`Reply::Reported`], and its
    /// entry's place in the log is what makes it visible the same way on
    /// every member: the server's watch turns each `Reported` command into one
    /// `write_refused` event of `lock` (with the reporter's identity, the
    /// [`Command::As`] caller around it). No request id: there is no lease to
    /// remember one by, and a report repeated is a second report (the client
    /// sends each once).
    ReportRefusal { lock: String, refused: Token, highest: Token, resource: String },
}

impl Command {
    /// The lease this command acts on (`None` for a grant).
    pub fn lease(&self) -> Option<LeaseId> {
        match self {
            Command::GrantLease { .. } | Command::Policy(_) | Command::Resize { .. } => None,
            Command::ReportRefusal { .. } => None,
            Command::KeepAlive { lease, .. } | Command::Revoke { lease, .. } => Some(*lease),
            Command::Release { lease, .. } | Command::CancelWait { lease, .. } => Some(*lease),
            Command::SetValue { lease, .. } | Command::Downgrade { lease, .. } => Some(*lease),
            Command::CompleteSlot { lease, .. } => Some(*lease),
            Command::Acquire(a) => Some(a.lease),
            Command::As { cmd, .. } => cmd.lease(),
        }
    }

    /// The command without its caller envelope.
    pub fn inner(&self) -> &Command {
        match self {
            Command::As { cmd, .. } => cmd,
            other => other,
        }
    }
}

/// Who sent a command, as the server authenticated it (see [`Command::As`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Caller {
    /// The identity's name: 1 to [`MAX_CALLER_NAME`](crate::MAX_CALLER_NAME)
    /// bytes of visible ASCII.
    pub name: String,
    /// The identity may revoke anyone's lease.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

/// Arguments of [`Command::Acquire`]. `lock` is validated by the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquire {
    pub req: RequestId,
    pub lease: LeaseId,
    pub lock: String,
    /// 0 = try once; otherwise the longest time to wait in the queue.
    pub wait_ms: u64,
    /// If the lease later *expires* while holding this lock (not a release or
    /// revoke), the lock stays closed to everyone for this long.
    pub lock_delay_ms: u64,
    /// Who the requester says it is (the CLI sends `host:pid`), shown with its
    /// grant or its place in the queue to anyone who may describe the lock; ""
    /// is none. At most [`MAX_IDENTITY_BYTES`] of UTF-8 without control
    /// characters. Informative only: it is not authenticated (that is
    /// [`Command::As`]). A retry of the same request id gets the first
    /// outcome, with the identity and value of the first attempt (INV-6): those
    /// of the retry are not looked at beyond validation. Absent in entries
    /// written before it existed ("").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    /// Opaque bytes published with the grant (an election's leader address, a
    /// config version), at most [`MAX_VALUE_BYTES`]; empty is none. Written as
    /// standard base64 in JSON (log entries, snapshots).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "crate::b64")]
    pub value: Vec<u8>,
    /// [`Mode::Exclusive`] (the default) or [`Mode::Shared`] (a reader of a
    /// read-write lock). Ignored by a semaphore (`permits > 0`), whose holders
    /// are counted by weight only. Absent in entries written before it existed.
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    /// How many permits of a semaphore this acquire takes at once, all or
    /// nothing: 1 to `permits` (1 when the lock is not a semaphore). Absent
    /// in entries written before it existed (1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
    /// `N > 0`: the lock is a semaphore of `N` permits (set by the first
    /// acquirer while the lock has no entry; a later acquire that names
    /// another `N` is refused, [`EngineError::PermitsMismatch`]). 0 (the
    /// default, and entries written before it existed): a read-write lock.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub permits: u32,
    /// However the grant ends (release, revoke, expiry, cancel), the lock
    /// stays closed to everyone until this many milliseconds after the grant,
    /// on the engine's clock (the leader's monotonic clock, never a wall
    /// clock): a job that ends early still keeps a second run out until then.
    /// A longer closure (a lock-delay) wins. At most [`MAX_HOLD_AT_LEAST_MS`];
    /// 0 (the default, and entries written before it existed) is none.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub hold_at_least_ms: u64,
    /// A slot name (a day, an hour: any 1 to [`MAX_SLOT_BYTES`] bytes without
    /// control characters): when [`Command::CompleteSlot`] recorded it for
    /// this lock within [`SLOT_RETENTION_MS`], the acquire is answered
    /// [`Reply::SlotDone`] and grants nothing. A waiter (`wait_ms > 0`)
    /// leaves the queue with [`WaitEnd::SlotDone`] when the slot is
    /// completed, and is looked at again whenever the lock could be granted
    /// to it (it heads the queue and fits), so it is never granted a done
    /// slot. "" (the default, and entries written before it
    /// existed): none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub once_per: String,
    /// The other locks of an atomic multi-acquire: `lock` first, then these,
    /// 2 to [`MAX_MULTI_LOCKS`] distinct names in all, granted all at once or
    /// not at all ([`Reply::AcquiredAll`], INV-18). A multi-acquire takes
    /// read-write locks only (`permits` 0, `weight` 1) and no `once_per`
    /// ([`EngineError::InvalidLocks`] otherwise). Empty (the default, and
    /// entries written before it existed): a single acquire.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
}

impl Acquire {
    /// The plain acquire: `lock`, exclusive, waiting up to `wait_ms`, with no
    /// lock-delay, identity, value, hold or slot. Others are this with fields
    /// changed (`Acquire { mode: Mode::Shared, ..Acquire::exclusive(…) }`).
    pub fn exclusive(req: RequestId, lease: LeaseId, lock: impl Into<String>, wait_ms: u64) -> Acquire {
        Acquire {
            req,
            lease,
            lock: lock.into(),
            wait_ms,
            lock_delay_ms: 0,
            identity: String::new(),
            value: Vec::new(),
            mode: Mode::Exclusive,
            weight: 1,
            permits: 0,
            hold_at_least_ms: 0,
            once_per: String::new(),
            also: Vec::new(),
        }
    }

    /// Whether this is a multi-acquire (it names [`Acquire::also`]).
    pub fn is_multi(&self) -> bool {
        !self.also.is_empty()
    }

    /// Every lock it names, `lock` first.
    pub fn locks(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.lock.as_str()).chain(self.also.iter().map(String::as_str))
    }
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// How a grant of a read-write lock shares it (INV-15): any number of
/// `Shared` holders, or one `Exclusive` holder and nobody else.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    #[default]
    Exclusive,
    Shared,
}

impl Mode {
    pub fn is_exclusive(&self) -> bool {
        *self == Mode::Exclusive
    }
}

/// What an acquire says about its requester: [`Acquire::identity`] and
/// [`Acquire::value`] (the value later replaced by [`Command::SetValue`]).
/// Holders, waiters and effects keep it boxed and only when one is set, so a
/// plain acquire costs one null pointer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tag {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "crate::b64")]
    pub value: Vec<u8>,
}

impl Tag {
    /// The tag of `identity` and `value`, or `None` when both are empty.
    pub fn new(identity: &str, value: &[u8]) -> Option<Box<Tag>> {
        if identity.is_empty() && value.is_empty() {
            return None;
        }
        Some(Box::new(Tag { identity: identity.to_owned(), value: value.to_vec() }))
    }

    /// The tag of `a`.
    pub fn of(a: &Acquire) -> Option<Box<Tag>> {
        Tag::new(&a.identity, &a.value)
    }

    /// The identity of `tag` ("" for none).
    pub fn identity(tag: Option<&Tag>) -> &str {
        tag.map_or("", |t| t.identity.as_str())
    }

    /// The value of `tag` (empty for none).
    pub fn value(tag: Option<&Tag>) -> &[u8] {
        tag.map_or(&[], |t| t.value.as_slice())
    }
}

/// The current grant of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub lock: LockName,
    pub lease: LeaseId,
    pub token: Token,
}

/// Why a try-acquire did not get the lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Busy {
    /// The current holder (the first, when several share it), if the lock is held.
    pub holder: Option<Grant>,
    /// How many grants hold it (several on a shared lock or a semaphore).
    /// Absent in replies written before it existed (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub holders: u32,
    /// When the lock is closed (a lock-delay, a hold-at-least): milliseconds until it reopens.
    pub reopens_in_ms: Option<u64>,
    /// How many requests are queued.
    pub waiters: u32,
}

/// The immediate answer to one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    LeaseGranted {
        lease: LeaseId,
        ttl_ms: u64,
    },
    /// Keep-alive accepted; the deadline is now `now + ttl_ms`.
    LeaseKept {
        lease: LeaseId,
        ttl_ms: u64,
    },
    LeaseRevoked {
        lease: LeaseId,
    },
    Acquired(Grant),
    /// Answer to a multi-acquire ([`Acquire::also`]): one grant per lock, in
    /// the order asked, with consecutive tokens, all made in one step.
    AcquiredAll(Vec<Grant>),
    Busy(Busy),
    /// Queued at 0-based `position`; the outcome comes as [`Effect::Granted`] or
    /// [`Effect::WaitEnded`] with the same (lease, req). A multi-acquire is
    /// queued on every one of its locks; `position` is the one in the queue of
    /// its first lock, and its outcome is one `Granted` per lock (all in the
    /// same step) or one `WaitEnded` per lock.
    Queued {
        position: u32,
    },
    Released,
    /// Answer to [`Command::SetValue`]: the grant's value is the new one.
    ValueSet,
    /// Answer to [`Command::Downgrade`]: the grant is shared now.
    Downgraded,
    /// (lock, lease, token) is not the current grant; nothing changed.
    NotHolder,
    /// Answer to [`Command::CompleteSlot`]: the slot is recorded as done.
    SlotCompleted,
    /// Answer to an acquire with [`Acquire::once_per`] whose slot is done:
    /// who completed it (its token, its grant's identity) and how it ended.
    SlotDone {
        token: Token,
        identity: String,
        exit_code: i32,
    },
    /// Answer to [`Command::CancelWait`]; `released` when a grant was released.
    Cancelled {
        released: bool,
    },
    /// Answer to [`Command::Resize`]: the semaphore had `was` permits.
    Resized {
        was: u32,
    },
    /// Answer to [`Command::Policy`]: the policy's version after it, and whether
    /// the change changed anything (a retry, or deleting what is absent, does not).
    PolicyChanged {
        version: u64,
        changed: bool,
    },
    /// Answer to [`Command::ReportRefusal`]: the report is in the log; nothing
    /// else changed.
    Reported,
    Rejected(EngineError),
}

/// How a queued acquire ended without a grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitEnd {
    TimedOut,
    /// The waiter's lease expired or was revoked; it is dropped, never granted (INV-4).
    LeaseEnded,
    Cancelled,
    /// The waiter runs once per a slot ([`Acquire::once_per`]) that was
    /// found done when the lock could have been granted to it: it leaves the
    /// queue, never granted, and a retry of its request is answered
    /// [`Reply::SlotDone`] with the same completion.
    SlotDone(Box<SlotCompletion>),
}

/// Who completed a slot and how its job ended, as a waiter for that slot is
/// told ([`WaitEnd::SlotDone`]; an acquire answered at once gets the same in
/// [`Reply::SlotDone`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotCompletion {
    /// The token of the grant that completed it.
    pub token: Token,
    /// That grant's identity ("" for none).
    pub identity: String,
    pub exit_code: i32,
}

impl SlotCompletion {
    /// The [`Reply::SlotDone`] that carries it.
    pub fn reply(&self) -> Reply {
        Reply::SlotDone { token: self.token, identity: self.identity.clone(), exit_code: self.exit_code }
    }
}

/// Why a grant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseCause {
    Released,
    Revoked,
    Expired,
    Cancelled,
}

/// Something that happened while applying an input, besides the replies. The
/// driver uses effects to wake waiters and to count metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// A grant was made. `queued` grants are the outcome of an earlier
    /// [`Reply::Queued`] for (lease, req); `waited_ms` is the time in the queue.
    /// `tag`: the identity and value the grant publishes (`None`: neither).
    Granted {
        grant: Grant,
        req: RequestId,
        queued: bool,
        waited_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<Box<Tag>>,
        /// Shared for a reader of a read-write lock; exclusive otherwise (a
        /// writer, a semaphore's permits).
        #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
        mode: Mode,
    },
    /// The exclusive grant `grant` became shared ([`Command::Downgrade`]),
    /// with the same token; `tag` as it publishes.
    Downgraded {
        grant: Grant,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<Box<Tag>>,
    },
    /// A queued acquire ended without a grant.
    WaitEnded { lock: LockName, lease: LeaseId, req: RequestId, why: WaitEnd },
    /// A grant ended after being held `held_ms`; `tag` as it was published.
    Released {
        grant: Grant,
        held_ms: u64,
        cause: ReleaseCause,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<Box<Tag>>,
    },
    /// The holder of `grant` published a new value ([`Command::SetValue`]);
    /// `tag` is its identity and the new value.
    ValueChanged {
        grant: Grant,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<Box<Tag>>,
    },
    /// A lease expired (its deadline passed).
    LeaseExpired { lease: LeaseId },
}

/// Result of one [`Input`]: one reply per command, in order, then the effects, and
/// the earliest deadline the driver must wake up for (a tick at that time).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub replies: Vec<Reply>,
    pub effects: Vec<Effect>,
    pub next_deadline: Option<Millis>,
}

/// Answer of [`crate::Engine::check`] (Chubby's CheckSequencer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Check {
    /// `token` is the current live grant of the lock.
    Current,
    /// The lock is now held under a different token (or free): `current` if held.
    Stale { current: Option<Token> },
}

/// A read-only view of one lock at `now`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub name: LockName,
    /// The first of [`LockInfo::holders`].
    pub holder: Option<HolderInfo>,
    /// Every live holder, in grant order (an exclusive lock has at most one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<HolderInfo>,
    /// A semaphore's permits (0: a read-write lock).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub permits: u32,
    /// Milliseconds until a lock-delay reopens the lock.
    pub reopens_in_ms: Option<u64>,
    /// Queued requests, first in line first.
    pub waiters: Vec<WaiterInfo>,
}

impl LockInfo {
    /// A lock nobody holds, waits for or keeps closed.
    pub fn free(name: LockName) -> LockInfo {
        LockInfo { name, holder: None, holders: vec![], permits: 0, reopens_in_ms: None, waiters: vec![] }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    pub lease: LeaseId,
    /// The identity that owns the holder's lease (`None`: granted without one).
    #[serde(default)]
    pub owner: Option<String>,
    pub token: Token,
    /// Milliseconds since the grant.
    pub held_ms: u64,
    /// Milliseconds until the holder's lease expires unless kept alive.
    pub ttl_left_ms: u64,
    pub lock_delay_ms: u64,
    /// Exclusive or shared (a semaphore's holders are exclusive).
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    /// Permits of a semaphore it holds (1 otherwise).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
    /// The identity its acquire carried ("" when none, see [`Acquire::identity`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    /// The value its acquire carried (empty when none, see [`Acquire::value`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "crate::b64")]
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterInfo {
    pub lease: LeaseId,
    pub req: RequestId,
    pub waited_ms: u64,
    /// Milliseconds until this wait times out.
    pub wait_left_ms: u64,
    /// The identity its acquire carried ("" when none, see [`Acquire::identity`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
}

/// A read-only view of one lease at `now`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub lease: LeaseId,
    /// The identity that owns the lease (`None`: granted without one).
    #[serde(default)]
    pub owner: Option<String>,
    pub ttl_ms: u64,
    pub ttl_left_ms: u64,
    pub locks: Vec<Grant>,
}

/// What one owner's live leases hold (see [`crate::Engine::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub leases: u64,
    /// Locks held.
    pub holds: u64,
    /// Acquires queued.
    pub waits: u64,
}

/// Gauges for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub leases: u64,
    pub held_locks: u64,
    pub waiters: u64,
    /// How many tokens were issued (grants made), since the state began or since
    /// it was last written by a version without this count.
    pub tokens_issued: u64,
    /// The token counter: every token issued so far is at most this and the next
    /// one is greater (0 before any). Not a count: a [`Input::LeaderStart`]
    /// token floor raises it, before any token is issued from it.
    pub token_counter: u64,
}
