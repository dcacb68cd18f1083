//! The [`Fence`] trait, its outcome [`Fenced`] and its error [`FenceError`].
//!
//! Every implementation in this crate (memory, file, PostgreSQL, Redis) obeys
//! the one contract written on [`Fence`], and the shared conformance suite in
//! `tests/fence/conformance.rs` checks it against each of them.

use async_trait::async_trait;

/// The largest token a fence accepts: `i64::MAX`, so that every store
/// (PostgreSQL's `bigint` included) holds every token exactly.
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// The longest resource key a fence accepts, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Boxed error from code the fence calls but does not own (a token checker,
/// a caller's closure).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A resource's high-water mark and the fencing token of an operation on it.
///
/// A fence keeps, per resource key, the highest token it has admitted (the
/// *mark*). [`Fence::admit`] atomically compares an operation's token with
/// the mark:
///
/// * `token >= mark` (or no mark yet): the operation is admitted and the mark
///   becomes `token`. **Equal is admitted**: one holder reads and writes the
///   same resource many times with the one token its lock grant gave it.
/// * `token < mark`: the outcome is [`Fenced::Stale`] with the mark and the
///   token, and nothing changes.
///
/// Stale is an *outcome*, not an error: it is the answer the fence exists to
/// give. [`FenceError`] is kept for inputs the fence refuses (an invalid key
/// or token) and for failures of the store that holds the marks; on an error
/// the caller must not act (fail closed).
///
/// # Reads are fenced too
///
/// Call `admit` before a **read** as well as before a write. In a
/// read-modify-write the read is what the write is based on, so it must raise
/// the mark:
///
/// 1. holder 5 reads the object (`admit(key, 5)`: mark 5), then pauses past
///    its lease;
/// 2. holder 6 gets the lock, reads the object (`admit(key, 6)`: mark 6);
/// 3. holder 5 wakes up and writes (`admit(key, 5)`): **stale**, rejected;
/// 4. holder 6 writes its update (`admit(key, 6)`: admitted).
///
/// Had step 2 not raised the mark, holder 5's write in step 3 would have
/// been admitted and then silently overwritten by holder 6's write, which was
/// computed from the value read before holder 5 wrote: an acknowledged update
/// lost.
///
/// ```
/// # use fencelock_fence::{Fence, Fenced, MemoryFence};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let fence = MemoryFence::new();
/// assert!(fence.admit("report.csv", 5).await?.is_admitted()); // holder 5 reads
/// assert!(fence.admit("report.csv", 6).await?.is_admitted()); // holder 6 reads
/// match fence.admit("report.csv", 5).await? {                 // holder 5 writes
///     Fenced::Stale(stale) => assert_eq!((stale.highest, stale.got), (6, 5)),
///     Fenced::Admitted(()) => unreachable!("a stale write must not be admitted"),
/// }
/// assert!(fence.admit("report.csv", 6).await?.is_admitted()); // holder 6 writes
/// assert_eq!(fence.highest("report.csv").await?, Some(6));
/// # Ok(()) }
/// ```
///
/// # Admit, then act: who makes the pair atomic
///
/// `admit` is atomic for the mark alone. Where the act that follows it is a
/// separate step (a file write after [`crate::MemoryFence`] or
/// [`crate::FileFence`] admitted it), the resource must also serialize
/// "admit + act" per key, or an admitted-but-slow write of holder 5 could
/// land after holder 6's: the fenced storage server ([`crate::storage`])
/// holds a per-key lock across both. [`crate::PgFence::run`] and
/// [`crate::RedisFence::write`] need no such lock: they check, raise and act
/// in one transaction or one script.
///
/// # Contract
///
/// * Tokens are `1..=`[`MAX_TOKEN`]; others give [`FenceError::InvalidToken`].
///   Token 0 is never issued by the lock server and means "no token".
/// * Keys are 1..=[`MAX_KEY_LEN`] bytes with no NUL byte; others give
///   [`FenceError::InvalidKey`]. Keys are independent of one another.
/// * Concurrent admits on one key are linearizable: the admitted tokens of a
///   key, in the order the fence admitted them, never decrease.
/// * A durable fence has made the raised mark durable before `admit` returns
///   [`Fenced::Admitted`]; a mark never goes down, across restarts included.
/// * After a [`FenceError::Storage`]-kind failure a durable fence may refuse
///   every later call ([`FenceError::Poisoned`]) until it is reopened.
#[async_trait]
pub trait Fence: Send + Sync {
    /// Admit an operation (a read or a write) with `token` on `key`: raise
    /// the mark and answer [`Fenced::Admitted`], or answer [`Fenced::Stale`]
    /// and change nothing.
    async fn admit(&self, key: &str, token: u64) -> Result<Fenced, FenceError>;

    /// The mark of `key`: the highest token admitted, or `None` if no token
    /// was ever admitted for it.
    async fn highest(&self, key: &str) -> Result<Option<u64>, FenceError>;
}

#[async_trait]
impl<F: Fence + ?Sized> Fence for std::sync::Arc<F> {
    async fn admit(&self, key: &str, token: u64) -> Result<Fenced, FenceError> {
        (**self).admit(key, token).await
    }
    async fn highest(&self, key: &str) -> Result<Option<u64>, FenceError> {
        (**self).highest(key).await
    }
}

/// The outcome of a fenced operation: admitted (with what the operation
/// returned, `()` for a bare [`Fence::admit`]) or stale.
#[must_use = "a stale operation must not be acted upon"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced<T = ()> {
    /// The token was at or above the mark; the mark is now the token.
    Admitted(T),
    /// The token was below the mark; nothing was changed.
    Stale(Stale),
}

impl<T> Fenced<T> {
    /// Whether the operation was admitted.
    pub fn is_admitted(&self) -> bool {
        matches!(self, Fenced::Admitted(_))
    }

    /// `Ok(value)` if admitted, `Err(Stale)` otherwise, so a caller can `?`
    /// a stale outcome into its own error type.
    pub fn into_result(self) -> Result<T, Stale> {
        match self {
            Fenced::Admitted(value) => Ok(value),
            Fenced::Stale(stale) => Err(stale),
        }
    }

    /// Map the admitted value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Fenced<U> {
        match self {
            Fenced::Admitted(value) => Fenced::Admitted(f(value)),
            Fenced::Stale(stale) => Fenced::Stale(stale),
        }
    }

    /// The stale rejection, if this was one.
    pub fn stale(&self) -> Option<Stale> {
        match self {
            Fenced::Admitted(_) => None,
            Fenced::Stale(stale) => Some(*stale),
        }
    }
}

/// A rejected token: `got` was below `highest`, the mark of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {got}: the resource has already admitted token {highest}")]
pub struct Stale {
    /// The mark of the key when the token was rejected.
    pub highest: u64,
    /// The token that was rejected.
    pub got: u64,
}

/// Why a fence could not answer. A stale token is not among these: see
/// [`Fenced::Stale`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The key is empty, longer than [`MAX_KEY_LEN`] or holds a NUL byte.
    #[error("invalid fence key ({reason})")]
    InvalidKey {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The token is 0 or above [`MAX_TOKEN`].
    #[error("invalid fencing token {0} (tokens are 1..={MAX_TOKEN})")]
    InvalidToken(u64),
    /// The store that holds the marks failed (I/O, database, network). The
    /// outcome of the call is unknown: the mark may or may not have been
    /// raised. Do not act.
    #[error("fence storage failed: {0}")]
    Storage(#[source] BoxError),
    /// The durable fence's files are not what it wrote: it refuses to guess
    /// a mark, since a guessed-low mark would admit a stale token.
    #[error("fence data is corrupt: {0}")]
    Corrupt(String),
    /// An earlier storage failure left the fence's durable state unknown; it
    /// refuses every call until it is reopened.
    #[error("fence failed closed after an earlier storage error; reopen it")]
    Poisoned,
    /// The token checker of a [`crate::CheckValidator`] failed.
    #[error("token check failed: {0}")]
    Checker(#[source] BoxError),
}

impl FenceError {
    /// Wrap a store's error as [`FenceError::Storage`].
    pub fn storage(err: impl Into<BoxError>) -> Self {
        FenceError::Storage(err.into())
    }
}

impl From<std::io::Error> for FenceError {
    fn from(err: std::io::Error) -> Self {
        FenceError::Storage(Box::new(err))
    }
}

/// Check a key against the contract on [`Fence`].
pub fn check_key(key: &str) -> Result<(), FenceError> {
    let reason = if key.is_empty() {
        "empty"
    } else if key.len() > MAX_KEY_LEN {
        "longer than 1024 bytes"
    } else if key.contains('\0') {
        "contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(FenceError::InvalidKey { reason })
}

/// Check a token against the contract on [`Fence`].
pub fn check_token(token: u64) -> Result<(), FenceError> {
    if token == 0 || token > MAX_TOKEN {
        return Err(FenceError::InvalidToken(token));
    }
    Ok(())
}

/// Check both; every implementation calls this first.
pub(crate) fn check_input(key: &str, token: u64) -> Result<(), FenceError> {
    check_key(key)?;
    check_token(token)
}

/// The rule itself, in one place: admit `token` against `mark`.
pub(crate) fn judge(mark: Option<u64>, token: u64) -> Fenced {
    match mark {
        Some(highest) if token < highest => Fenced::Stale(Stale { highest, got: token }),
        _ => Fenced::Admitted(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_admits_equal_and_higher() {
        assert_eq!(judge(None, 1), Fenced::Admitted(()));
        assert_eq!(judge(Some(5), 5), Fenced::Admitted(()));
        assert_eq!(judge(Some(5), 6), Fenced::Admitted(()));
        assert_eq!(judge(Some(5), 4), Fenced::Stale(Stale { highest: 5, got: 4 }));
    }

    #[test]
    fn input_checks() {
        assert!(check_token(0).is_err());
        assert!(check_token(1).is_ok());
        assert!(check_token(MAX_TOKEN).is_ok());
        assert!(check_token(MAX_TOKEN + 1).is_err());
        assert!(check_key("").is_err());
        assert!(check_key("a\0b").is_err());
        assert!(check_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(check_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
    }
}
