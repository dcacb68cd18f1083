//! Errors the engine returns for a command it refuses. Contention is not an error:
//! a busy lock is [`crate::Reply::Busy`], a wait that ran out is an effect.

use serde::{Deserialize, Serialize};

use crate::{LeaseId, NameError};

/// Why the engine refused a command. The command changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The TTL is outside `MIN_TTL_MS..=MAX_TTL_MS`.
    #[error("invalid ttl: {got_ms} ms (must be between {min_ms} ms and {max_ms} ms)")]
    InvalidTtl { got_ms: u64, min_ms: u64, max_ms: u64 },
    /// The wait timeout is above `MAX_WAIT_MS`.
    #[error("invalid wait: {got_ms} ms (must be at most {max_ms} ms)")]
    InvalidWait { got_ms: u64, max_ms: u64 },
    /// The lock-delay is above `MAX_LOCK_DELAY_MS`.
    #[error("invalid lock_delay: {got_ms} ms (must be at most {max_ms} ms)")]
    InvalidLockDelay { got_ms: u64, max_ms: u64 },
    /// The hold-at-least is above `MAX_HOLD_AT_LEAST_MS`.
    #[error("invalid hold_at_least: {got_ms} ms (must be at most {max_ms} ms)")]
    InvalidHoldAtLeast { got_ms: u64, max_ms: u64 },
    /// The slot name is empty (where one is required), too long or has a
    /// control character.
    #[error("invalid slot: {0}")]
    InvalidSlot(String),
    /// The holder identity is too long or has a control character.
    #[error("invalid identity: {0}")]
    InvalidIdentity(String),
    /// The holder value is larger than `MAX_VALUE_BYTES`.
    #[error("invalid value: {got_bytes} bytes (must be at most {max_bytes} bytes)")]
    InvalidValue { got_bytes: usize, max_bytes: usize },
    /// The lock name is not a valid name.
    #[error("invalid lock name: {0}")]
    InvalidName(#[from] NameError),
    /// Request id 0 is reserved; every request carries a non-zero id chosen by the client.
    #[error("invalid request id: 0 (request ids must be non-zero)")]
    InvalidRequestId,
    /// A fencing token of 0 is never issued, so it can never match a grant.
    #[error("invalid token: 0 (tokens start at 1)")]
    InvalidToken,
    /// The weight is 0, or above the permits asked for (1 when not a semaphore).
    #[error("invalid weight: {weight} (must be 1 to {max}, the permits asked for, or 1 when not a semaphore)")]
    InvalidWeight { weight: u32, max: u32 },
    /// The acquire names a number of permits other than the lock's (0 is a
    /// read-write lock, not a semaphore).
    #[error("permits mismatch: the lock has {lock_has} permits, the acquire asked for {asked} (0 = not a semaphore)")]
    PermitsMismatch { lock_has: u32, asked: u32 },
    /// The locks of a multi-acquire are too few, too many or not distinct, or
    /// it asks for what a multi-acquire cannot do (permits, a weight, a slot).
    #[error("invalid locks: {0}")]
    InvalidLocks(String),
    /// The lease does not exist: never granted, revoked, or expired.
    #[error("lease {0} not found (never granted, revoked, or expired)")]
    LeaseNotFound(LeaseId),
    /// The lease belongs to another identity (see [`crate::Command::As`]).
    #[error("lease {lease} belongs to another identity")]
    NotOwner { lease: LeaseId },
    /// The proposed lease id is 0 or belongs to a live lease.
    #[error("lease id {0} is not free")]
    LeaseIdTaken(LeaseId),
    /// The caller's name is empty, too long or not visible ASCII, or the command
    /// inside [`crate::Command::As`] is itself an `As`.
    #[error("invalid caller: {0}")]
    InvalidCaller(String),
    /// A policy change or a semaphore resize needs a caller with the `admin` verb.
    #[error("changing the policy or resizing a semaphore needs the admin verb")]
    NotAdmin,
    /// A resize names a lock that is not a semaphore now: a read-write lock,
    /// or one that nobody holds or waits for (its next acquirer sets its
    /// permits).
    #[error("{lock} is not a semaphore now (a read-write lock, or nobody holds or waits for it: its next acquirer sets the permits)")]
    NotASemaphore { lock: String },
    /// A resize to 0 permits, or to fewer than the holders use or one queued
    /// acquire asks for.
    #[error("cannot resize to {asked} permits: {needed} are needed (by the holders now, or by one queued acquire)")]
    ResizeTooSmall { asked: u32, needed: u64 },
    /// The policy change breaks a rule of [`crate::policy`] (the text says which).
    #[error("invalid policy change: {0}")]
    InvalidPolicy(String),
    /// A refusal report whose tokens cannot be a fence's refusal (the refused
    /// token not below the highest) or whose resource is too long or has a
    /// control character (the text says which).
    #[error("invalid report: {0}")]
    InvalidReport(String),
}
