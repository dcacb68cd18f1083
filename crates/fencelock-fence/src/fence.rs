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

/// A resource's marks and the fencing token of an operation on it.
///
/// A fence keeps, per resource key, two marks ([`Marks`]): `write`, the
/// token of the last admitted write, and `seen`, the highest token admitted
/// by any operation, read or write. [`Fence::admit_as`] atomically judges an
/// operation's token against them by [the rule](Marks::admit), the one rule
/// every fence in this crate keeps:
///
/// * a **read** with token `t` is admitted iff `t >= write`: a reader
///   granted before the last writer acted is stale. It raises `seen` to
///   `max(seen, t)`.
/// * a **write** with token `t` is admitted iff `t >= seen`: no newer grant,
///   reader or writer, has acted. It sets `write = seen = t`.
/// * otherwise the outcome is [`Fenced::Stale`], naming the rule that refused
///   it, and nothing changes.
///
/// **Equal is admitted**: one holder reads and writes the same resource many
/// times with the one token its lock grant gave it, and a writer downgraded
/// to a reader (same token) reads its own writes. With a read-write lock,
/// readers hold tokens granted concurrently and present them in any order:
/// no read is refused for being older than another read, while a writer's
/// token is above every reader's granted before it (fencelock's engine
/// guarantees it), so the rule is exact for shared locks too. With an
/// exclusive lock the two marks behave as the one mark of a plain fence for
/// writes.
///
/// Stale is an *outcome*, not an error: it is the answer the fence exists to
/// give. [`FenceError`] is kept for inputs the fence refuses (an invalid key
/// or token) and for failures of the store that holds the marks; on an error
/// the caller must not act (fail closed).
///
/// # Reads are fenced too
///
/// Call [`Fence::admit_read`] before a **read** and [`Fence::admit`] before a
/// write. In a read-modify-write the read is what the write is based on, so
/// it must raise `seen`:
///
/// 1. holder 5 reads the object (`admit_read(key, 5)`: seen 5), then pauses
///    past its lease;
/// 2. holder 6 gets the lock, reads the object (`admit_read(key, 6)`: seen 6);
/// 3. holder 5 wakes up and writes (`admit(key, 5)`): **stale**, rejected;
/// 4. holder 6 writes its update (`admit(key, 6)`: admitted, write 6).
///
/// Had step 2 not raised `seen`, holder 5's write in step 3 would have been
/// admitted and then silently overwritten by holder 6's write, which was
/// computed from the value read before holder 5 wrote: an acknowledged update
/// lost. After step 4 a read with token 5 is refused too: it would see data
/// its holder's grant no longer covers.
///
/// ```
/// # use fencelock_fence::{Access, Fence, Fenced, MemoryFence};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let fence = MemoryFence::new();
/// assert!(fence.admit_read("report.csv", 5).await?.is_admitted()); // holder 5 reads
/// assert!(fence.admit_read("report.csv", 6).await?.is_admitted()); // holder 6 reads
/// match fence.admit("report.csv", 5).await? {                      // holder 5 writes
///     Fenced::Stale(stale) => assert_eq!((stale.access, stale.highest, stale.got), (Access::Write, 6, 5)),
///     Fenced::Admitted(()) => unreachable!("a stale write must not be admitted"),
/// }
/// assert!(fence.admit("report.csv", 6).await?.is_admitted()); // holder 6 writes
/// assert!(!fence.admit_read("report.csv", 5).await?.is_admitted()); // holder 5 reads: stale
/// assert_eq!(fence.highest("report.csv").await?, Some(6));
/// # Ok(()) }
/// ```
///
/// # Admit, then act: who makes the pair atomic
///
/// An admit is atomic for the marks alone. Where the act that follows it is a
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
/// * Concurrent admits on one key are linearizable: every outcome is the
///   rule's for the marks left by the admits before it, in one order.
/// * A durable fence has made the raised marks durable before an admit
///   returns [`Fenced::Admitted`]; a mark never goes down, across restarts
///   included.
/// * A fence whose store held one number per key before fenced reads reads
///   it as `write = seen = number`.
/// * After a [`FenceError::Storage`]-kind failure a durable fence may refuse
///   every later call ([`FenceError::Poisoned`]) until it is reopened.
#[async_trait]
pub trait Fence: Send + Sync {
    /// Admit an operation of kind `access` with `token` on `key`: apply
    /// [the rule](Marks::admit) and answer [`Fenced::Admitted`], or answer
    /// [`Fenced::Stale`] and change nothing.
    async fn admit_as(&self, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError>;

    /// The marks of `key`, or `None` if no token was ever admitted for it.
    async fn marks(&self, key: &str) -> Result<Option<Marks>, FenceError>;

    /// Admit a **write** (or any operation treated as one):
    /// `admit_as(key, token, Access::Write)`.
    async fn admit(&self, key: &str, token: u64) -> Result<Fenced, FenceError> {
        self.admit_as(key, token, Access::Write).await
    }

    /// Admit a **read**: `admit_as(key, token, Access::Read)`.
    async fn admit_read(&self, key: &str, token: u64) -> Result<Fenced, FenceError> {
        self.admit_as(key, token, Access::Read).await
    }

    /// The highest token admitted for `key` (its `seen` mark), or `None` if
    /// no token was ever admitted for it.
    async fn highest(&self, key: &str) -> Result<Option<u64>, FenceError> {
        Ok(self.marks(key).await?.map(|m| m.seen))
    }
}

#[async_trait]
impl<F: Fence + ?Sized> Fence for std::sync::Arc<F> {
    async fn admit_as(&self, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError> {
        (**self).admit_as(key, token, access).await
    }
    async fn marks(&self, key: &str) -> Result<Option<Marks>, FenceError> {
        (**self).marks(key).await
    }
}

/// The outcome of a fenced operation: admitted (with what the operation
/// returned, `()` for a bare [`Fence::admit`]) or stale.
#[must_use = "a stale operation must not be acted upon"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced<T = ()> {
    /// The rule admitted the token; the marks were raised by it.
    Admitted(T),
    /// The rule refused the token; nothing was changed.
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

/// A rejected token: `got` was below `highest`, the mark the rule holds an
/// operation of kind `access` against (a read: the last write's token; a
/// write: the highest token admitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Stale {
    /// Which rule refused it: the kind of the refused operation.
    pub access: Access,
    /// The mark that refused it.
    pub highest: u64,
    /// The token that was rejected.
    pub got: u64,
}

impl Stale {
    fn describe(&self) -> String {
        let Stale { access, highest, got } = *self;
        match access {
            Access::Read => format!("stale read: token {got} < last write token {highest}"),
            Access::Write => format!("stale write: token {got} < token {highest} already admitted"),
        }
    }
}

/// What an operation does to the resource, which decides the mark its token
/// is judged against ([`Marks::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Reads only: judged against the last write.
    Read,
    /// Changes the resource: judged against every admitted token.
    Write,
}

impl Access {
    /// `"read"` or `"write"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// A key's two marks. `write <= seen` always.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Marks {
    /// The token of the last admitted write; 0 if only reads were admitted.
    pub write: u64,
    /// The highest token admitted by any operation.
    pub seen: u64,
}

impl Marks {
    /// The marks of a store that kept one number per key (a fence from
    /// before fenced reads, or a reset): `write = seen = token`.
    pub fn single(token: u64) -> Self {
        Marks { write: token, seen: token }
    }

    /// **The fence rule**, the one place it is written: admit an operation
    /// of kind `access` with `token` against these marks (`None`: the key has
    /// none), giving the marks after it, or refuse it.
    ///
    /// * read: admitted iff `token >= write`; `seen = max(seen, token)`.
    /// * write: admitted iff `token >= seen`; `write = seen = token`.
    ///
    /// Every fence applies it: [`crate::MemoryFence`] and
    /// [`crate::FileFence`] call it; the Redis script and the PostgreSQL
    /// statements are its translation, checked against it by the
    /// conformance suite.
    pub fn admit(marks: Option<Marks>, access: Access, token: u64) -> Result<Marks, Stale> {
        let m = marks.unwrap_or_default();
        let (highest, after) = match access {
            Access::Read => (m.write, Marks { write: m.write, seen: m.seen.max(token) }),
            Access::Write => (m.seen, Marks::single(token)),
        };
        if token < highest {
            return Err(Stale { access, highest, got: token });
        }
        Ok(after)
    }
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

/// [`Marks::admit`] as a [`Fenced`] outcome and the marks to store if
/// admitted (`None`: nothing to store, stale or unchanged).
pub(crate) fn judge(marks: Option<Marks>, access: Access, token: u64) -> (Fenced, Option<Marks>) {
    match Marks::admit(marks, access, token) {
        Ok(after) if Some(after) == marks => (Fenced::Admitted(()), None),
        Ok(after) => (Fenced::Admitted(()), Some(after)),
        Err(stale) => (Fenced::Stale(stale), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use Access::{Read, Write};

    fn marks(write: u64, seen: u64) -> Option<Marks> {
        Some(Marks { write, seen })
    }

    fn stale(access: Access, highest: u64, got: u64) -> Result<Marks, Stale> {
        Err(Stale { access, highest, got })
    }

    /// The write rule (`token >= seen`; sets write = seen = token) on its
    /// own is the single-mark rule: equal and higher admitted, lower refused.
    #[test]
    fn a_write_is_judged_against_every_admitted_token() {
        assert_eq!(Marks::admit(None, Write, 1), Ok(Marks::single(1)));
        assert_eq!(Marks::admit(marks(5, 5), Write, 5), Ok(Marks::single(5)));
        assert_eq!(Marks::admit(marks(5, 5), Write, 6), Ok(Marks::single(6)));
        assert_eq!(Marks::admit(marks(5, 5), Write, 4), stale(Write, 5, 4));
        // An old writer after a newer reader read: refused by the reader's token.
        assert_eq!(Marks::admit(marks(3, 8), Write, 5), stale(Write, 8, 5));
        assert_eq!(Marks::admit(marks(3, 8), Write, 8), Ok(Marks::single(8)));
    }

    /// The read rule (`token >= write`; raises seen): a stale reader after a
    /// newer writer wrote is refused, readers in any order are all admitted.
    #[test]
    fn a_read_is_judged_against_the_last_write() {
        assert_eq!(Marks::admit(None, Read, 7), Ok(Marks { write: 0, seen: 7 }));
        assert_eq!(Marks::admit(marks(15, 15), Read, 12), stale(Read, 15, 12));
        // Concurrent readers 10 and 11 after writer 9, presented 11 then 10.
        let after_11 = Marks::admit(marks(9, 9), Read, 11).unwrap();
        assert_eq!(after_11, Marks { write: 9, seen: 11 });
        assert_eq!(Marks::admit(Some(after_11), Read, 10), Ok(after_11), "an older reader is not refused");
        // A writer downgraded to a reader (same token) reads its own write.
        assert_eq!(Marks::admit(marks(12, 12), Read, 12), Ok(Marks::single(12)));
    }

    /// The issue-18 sequence: two readers read, a writer granted after them
    /// writes, then the stale reader is refused and a later reader admitted.
    #[test]
    fn readers_then_a_writer_then_a_stale_and_a_fresh_reader() {
        let mut m = None;
        for (access, token) in [(Read, 4), (Read, 3), (Write, 5)] {
            m = Some(Marks::admit(m, access, token).unwrap());
        }
        assert_eq!(m, marks(5, 5));
        assert_eq!(Marks::admit(m, Read, 3), stale(Read, 5, 3));
        assert_eq!(Marks::admit(m, Read, 6), Ok(Marks { write: 5, seen: 6 }));
    }

    #[test]
    fn stale_says_which_rule_refused() {
        assert_eq!(
            Stale { access: Read, highest: 15, got: 12 }.to_string(),
            "stale read: token 12 < last write token 15"
        );
        assert_eq!(
            Stale { access: Write, highest: 8, got: 5 }.to_string(),
            "stale write: token 5 < token 8 already admitted"
        );
    }

    /// `judge` stores nothing when the marks do not change (an equal write
    /// or a read between the marks), so durable fences write no record.
    #[test]
    fn judge_reports_only_changed_marks() {
        assert_eq!(judge(marks(5, 5), Write, 5), (Fenced::Admitted(()), None));
        assert_eq!(judge(marks(5, 9), Read, 7), (Fenced::Admitted(()), None));
        assert_eq!(judge(marks(5, 9), Write, 9), (Fenced::Admitted(()), marks(9, 9)));
        assert_eq!(judge(marks(5, 9), Read, 4).1, None);
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
