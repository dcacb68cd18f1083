//! Errors of the client library, and how gRPC statuses map onto them.
//!
//! Where it sits: every RPC in [`crate::backend::native::rpc`] and [`crate::backend::native::session`] turns a
//! [`tonic::Status`] into an [`Error`] here. Contention is never an error: a busy
//! lock is [`crate::Outcome::Busy`], a wait that ran out is
//! [`crate::Outcome::TimedOut`]. [`WithLockError`] is the error of
//! [`crate::with_lock`], which adds "not acquired" and "lease lost" to
//! [`Error`].

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Code, Status};

/// Why a client operation failed. The operation's outcome is then unknown only for
/// [`Error::Timeout`], [`Error::Unavailable`] and [`Error::Backend`]; every other
/// variant means the request was refused and nothing changed.
///
/// # Examples
///
/// Contention is an [`Outcome`](crate::Outcome), not an error. An error is a
/// refusal (nothing changed), or, where [`is_transient`](Error::is_transient)
/// is true, a failure whose outcome is unknown.
///
/// ```no_run
/// use fencelock::{Client, Error, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), Error> {
/// match client.lock("orders/42").acquire().await {
///     Ok(Outcome::Acquired(guard)) => {
///         guard.release().await?;
///     }
///     Ok(_) => println!("busy"),
///     // Refused: the same request fails the same way until the token changes.
///     Err(Error::Unauthenticated(m) | Error::PermissionDenied(m)) => eprintln!("check the token: {m}"),
///     Err(e) if e.is_transient() => eprintln!("outcome unknown, try again later: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server rejected an argument: a bad lock name, TTL, wait, lock-delay,
    /// token or request id. Retrying the same request fails the same way.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A watch asked for events older than the oldest the server still holds:
    /// start again from `oldest` (events before it are lost to this watcher).
    #[error("compacted: oldest available revision is {}", oldest)]
    Compacted { oldest: crate::types::Revision },
    /// The lease is gone (never granted, revoked, or expired).
    #[error("lease not found: {0}")]
    LeaseNotFound(String),
    /// The acquire's [`once_per`](crate::LockOptions::once_per) slot is done
    /// (before the acquire came, or while it waited): the grant under `token`
    /// (by `identity`, "" when none) completed it with `exit_code`. Nothing
    /// was taken.
    #[error("the slot is done: {identity:?} ran it (token {token}, exit code {exit_code})")]
    SlotDone { token: u64, identity: String, exit_code: i32 },
    /// The server stayed unavailable (no leader, shutting down, unreachable) until
    /// the operation's deadline, across retries with the same request id. The
    /// request may or may not have taken effect.
    #[error("server unavailable: {0}")]
    Unavailable(String),
    /// The first connection to the service could not be made. `message` names
    /// every server or node tried and why; `source` is the driver's own error
    /// (a `tonic::transport::Error`, `redis::RedisError`,
    /// `tokio_postgres::Error`, `zookeeper_client::Error`, or an etcd
    /// `tonic::Status`) when the failure came from one attempt (for Redlock,
    /// the first failed node's [`Error`], which holds its driver's error),
    /// `None` when several were tried or none answered in time. The
    /// driver's text is left to `source`, not repeated in `message`.
    #[error("cannot connect: {message}")]
    Connect {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The operation's deadline passed without an answer. The request may or may
    /// not have taken effect.
    #[error("timed out waiting for the server")]
    Timeout,
    /// The server answered something this client does not understand (a missing
    /// field, an unknown outcome).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server requires a bearer token and got none, or one it does not
    /// accept (unknown, expired, revoked): gRPC `UNAUTHENTICATED`, HTTP 401.
    /// Set one with [`crate::ClientBuilder::token`] (URL: `token=`). Not
    /// retried: the same request fails the same way until the token changes.
    #[error("not authenticated: {0}")]
    Unauthenticated(String),
    /// The token is valid but does not allow this operation (on this lock):
    /// gRPC `PERMISSION_DENIED`, HTTP 403. Not retried.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A quota or rate limit of the caller (or of the node) is reached: gRPC
    /// `RESOURCE_EXHAUSTED`, HTTP 429 `limit_reached`. Nothing changed; the
    /// same request succeeds once the caller holds less (or waits).
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// Any other gRPC status the server returned (`code: message`).
    #[error("server error: {0}")]
    Server(String),
    /// The backend cannot do what was asked, and nothing was sent: a fenced lock
    /// from a backend without fencing tokens, a lock-delay where the backend has
    /// none, a TTL below the backend's granularity. See
    /// [`crate::backend::Capabilities`].
    #[error("not supported by this backend: {0}")]
    Unsupported(String),
    /// A backend other than the native server (Redis, Redlock, etcd,
    /// ZooKeeper, PostgreSQL) failed or could not be reached. The operation's
    /// outcome is unknown. `source` is the driver's own error (a
    /// `redis::RedisError`, `tokio_postgres::Error`, `zookeeper_client::Error`,
    /// or the `tonic::Status` of an etcd call) where the failure came from one
    /// (for Redlock, the first failed node's [`Error`]); `None` when the
    /// backend answered something the recipe does not allow (a missing row,
    /// a node that vanished) or did not answer in time.
    #[error("backend error: {backend}: {message}")]
    Backend {
        /// The backend, as in its URL scheme (`redis`, `etcd`, `zk`, …).
        backend: &'static str,
        /// What failed (where, which call); the driver's own text is in
        /// `source`, not here.
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// A backend's connection could not be secured or authenticated, and
    /// retrying will not help: a TLS handshake that failed (a certificate not
    /// signed by the CA given, a host name the certificate does not name, a
    /// server that does not speak TLS where TLS was asked, or the reverse), a
    /// user or password the backend refused, a CA, certificate or key file that
    /// cannot be read. The message names the backend and the cause (never a
    /// password); `source` is the underlying error where there is one.
    #[error("{message}")]
    Security {
        message: String,
        #[source]
        source: Option<Cause>,
    },
}

impl Error {
    /// An [`Error::Security`] with `message` and the error that caused it.
    pub(crate) fn security(message: impl Into<String>, source: impl StdError + Send + Sync + 'static) -> Error {
        Error::Security { message: message.into(), source: Some(Cause(Arc::new(source))) }
    }

    /// An [`Error::Connect`] without one underlying error (several servers
    /// tried, or no answer in time).
    pub(crate) fn connect(message: impl Into<String>) -> Error {
        Error::Connect { message: message.into(), source: None }
    }

    /// An [`Error::Connect`] caused by the driver's error `source`.
    pub(crate) fn connect_caused(message: impl Into<String>, source: impl StdError + Send + Sync + 'static) -> Error {
        Error::Connect { message: message.into(), source: Some(Cause(Arc::new(source))) }
    }

    /// This error as it ends a connect: a backend's failure becomes an
    /// [`Error::Connect`] that keeps its text (after the backend's name, and
    /// followed by `hint`) and its source; any other error stays as it is.
    pub(crate) fn while_connecting(self, hint: &str) -> Error {
        match self {
            Error::Backend { backend, message, source } => {
                Error::Connect { message: format!("{backend}: {message}{hint}"), source }
            }
            other => other,
        }
    }

    /// An [`Error::Backend`] of `backend` without an underlying error: the
    /// backend answered something the recipe does not allow.
    pub(crate) fn backend(backend: &'static str, message: impl Into<String>) -> Error {
        Error::Backend { backend, message: message.into(), source: None }
    }

    /// An [`Error::Backend`] of `backend` caused by the driver's error `source`.
    pub(crate) fn backend_caused(
        backend: &'static str,
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Error {
        Error::Backend { backend, message: message.into(), source: Some(Cause(Arc::new(source))) }
    }
}

/// The underlying error of an [`Error::Connect`], [`Error::Security`] or [`Error::Backend`] (the
/// driver's own error), shared so that the error stays `Clone`; two causes are
/// equal when they read the same.
///
/// # Examples
///
/// Look at the driver's own error behind a failed connect (here the Redis
/// driver's, for a `redis://` URL).
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// match fencelock::connect("redis://cache.internal:6379").await {
///     Ok(backend) => { /* ... */ }
///     Err(fencelock::Error::Connect { message, source: Some(cause) }) => {
///         eprintln!("cannot connect: {message}: {cause}");
///         if let Some(e) = cause.get().downcast_ref::<redis::RedisError>() {
///             eprintln!("redis error kind: {:?}", e.kind());
///         }
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Cause(Arc<dyn StdError + Send + Sync>);

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Cause {
    /// The driver's error itself, to downcast (`cause.get().downcast_ref::<redis::RedisError>()`).
    pub fn get(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.0
    }
}

impl StdError for Cause {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// Does `error`'s `source()` chain hold an error of type `T` (the driver's
/// own, as a [`Cause`] holds it, or as its sources hold it)? For the tests
/// that every backend's error keeps its driver error.
#[cfg(test)]
pub(crate) fn caused_by<T: StdError + 'static>(error: &Error) -> bool {
    let mut next: Option<&(dyn StdError + 'static)> = error.source();
    while let Some(e) = next {
        if e.is::<T>() || e.downcast_ref::<Cause>().is_some_and(|c| c.get().is::<T>() || inner_is::<T>(c.get())) {
            return true;
        }
        next = e.source();
    }
    false
}

/// `e` is one of this crate's errors whose chain holds a `T`.
#[cfg(test)]
fn inner_is<T: StdError + 'static>(e: &(dyn StdError + Send + Sync + 'static)) -> bool {
    e.downcast_ref::<Error>().is_some_and(caused_by::<T>)
}

/// A refusal, without the server's own prefix (the error's display adds it).
fn refusal(unauthenticated: bool, message: &str) -> Error {
    if unauthenticated {
        Error::Unauthenticated(message.strip_prefix("not authenticated: ").unwrap_or(message).to_string())
    } else {
        Error::PermissionDenied(message.strip_prefix("permission denied: ").unwrap_or(message).to_string())
    }
}

impl Error {
    /// Maps a final (non-retried) gRPC status to an error.
    pub(crate) fn from_status(status: &Status) -> Error {
        let msg = status.message().to_string();
        match status.code() {
            _ if is_local_timeout(status) => Error::Timeout,
            Code::InvalidArgument => Error::InvalidArgument(msg),
            Code::NotFound => Error::LeaseNotFound(msg),
            Code::Unavailable => Error::Unavailable(msg),
            Code::DeadlineExceeded => Error::Timeout,
            Code::Unauthenticated | Code::PermissionDenied => refusal(status.code() == Code::Unauthenticated, &msg),
            Code::ResourceExhausted => Error::LimitReached(msg),
            code => Error::Server(format!("{code:?}: {msg}")),
        }
    }

    /// An admin port's 401 or 403 as [`Error::Unauthenticated`] or
    /// [`Error::PermissionDenied`]; `None` for any other status.
    pub fn from_http_refusal(status: u16, message: &str) -> Option<Error> {
        match status {
            401 | 403 => Some(refusal(status == 401, message)),
            _ => None,
        }
    }

    /// True when the outcome of the failed request is unknown (it may have been
    /// applied): the caller may retry with the same request id.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::Timeout | Error::Backend { .. })
    }
}

/// Should a call that failed with `status` be retried (with the same request id)?
///
/// `UNAVAILABLE` always is. A status that the transport produced locally (it has a
/// source error: a connection reset, a broken HTTP/2 stream) is too, whatever its
/// code, because the server never answered. A status the server sent never has a
/// source. The client's own deadline (tonic's `TimeoutExpired`) is not retried,
/// nor is a refused token (`UNAUTHENTICATED`, `PERMISSION_DENIED`), whatever
/// its origin: another attempt carries the same token and is refused the same
/// way, and a tight retry loop against an auth check helps nobody.
pub(crate) fn is_retryable(status: &Status) -> bool {
    match status.code() {
        _ if is_auth_refusal(status) => false,
        Code::Unavailable => true,
        Code::Unknown | Code::Internal | Code::Cancelled => status.source().is_some() && !is_local_timeout(status),
        _ => false,
    }
}

/// The server refused the token: missing or bad (`UNAUTHENTICATED`), or not
/// allowed this (`PERMISSION_DENIED`).
pub(crate) fn is_auth_refusal(status: &Status) -> bool {
    matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied)
}

/// A deadline ran out: the server's (`DeadlineExceeded`) or tonic's own.
pub(crate) fn is_timeout(status: &Status) -> bool {
    status.code() == Code::DeadlineExceeded || is_local_timeout(status)
}

/// Did the status come from tonic's client-side `grpc-timeout` enforcement?
fn is_local_timeout(status: &Status) -> bool {
    let mut source: Option<&(dyn StdError + 'static)> = status.source();
    while let Some(err) = source {
        if err.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Why [`crate::with_lock`] did not run its closure, or stopped it.
///
/// # Examples
///
/// ```no_run
/// use fencelock::{Client, Guard, WithLockError};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let done = client.lock("migrations").with_lock(async |guard: &Guard| migrate(guard.token()).await).await;
/// match done {
///     Ok(applied) => println!("{applied} migrations applied"),
///     Err(WithLockError::NotAcquired(why)) => println!("not run: {why}"),
///     // The closure was dropped at an await point: the work must be safe to resume.
///     Err(WithLockError::LeaseLost(reason)) => eprintln!("stopped part-way: {reason}"),
///     Err(WithLockError::Client(e)) => return Err(e),
///     Err(other) => eprintln!("{other}"),
/// }
/// # Ok(()) }
/// # async fn migrate(_token: Option<u64>) -> usize { 0 }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WithLockError {
    /// The lock was not acquired: it was busy, or the wait ran out. The closure did
    /// not run.
    #[error("lock not acquired: {0}")]
    NotAcquired(NotAcquired),
    /// The lease was lost while the closure ran: the closure's future was dropped
    /// (cancelled) at its next await point, and its work may be partly done.
    #[error("lease lost while holding the lock: {0}")]
    LeaseLost(LeaseLost),
    /// An RPC failed (acquiring the lock or granting the lease).
    #[error(transparent)]
    Client(#[from] Error),
}

/// The contention outcomes of an acquire, for [`WithLockError::NotAcquired`].
///
/// # Examples
///
/// [`Outcome::acquired`](crate::Outcome::acquired) turns contention into a
/// `Result`, for code that treats "not acquired" as a failure of its own.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, NotAcquired};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// match client.lock("deploy/prod").wait(Duration::from_secs(30)).acquire().await?.acquired() {
///     Ok(guard) => {
///         // ... deploy ...
///         guard.release().await?;
///     }
///     Err(NotAcquired::TimedOut) => println!("a deploy still runs after 30 s"),
///     Err(busy @ NotAcquired::Busy { .. }) => println!("{busy}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAcquired {
    /// `wait` was zero and the lock was held, or closed by lock-delay.
    Busy {
        /// The holder's lease, if the lock is held.
        holder_lease: Option<u64>,
        /// The holder's fencing token, if the lock is held.
        holder_token: Option<u64>,
        /// Time until a lock-delay reopens the lock, if one is running.
        reopens_in: Option<Duration>,
        /// Number of queued requests.
        waiters: u32,
    },
    /// The wait ran out before the lock was granted.
    TimedOut,
}

impl std::fmt::Display for NotAcquired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAcquired::Busy { holder_lease: Some(lease), holder_token: Some(token), .. } => {
                write!(f, "busy (held by lease {lease} under token {token})")
            }
            NotAcquired::Busy { reopens_in: Some(d), .. } => {
                write!(f, "busy (closed by a lock-delay or hold-at-least for {} ms)", d.as_millis())
            }
            NotAcquired::Busy { .. } => write!(f, "busy"),
            NotAcquired::TimedOut => write!(f, "wait timed out"),
        }
    }
}

/// So that `outcome.acquired()?` works where contention ends the caller
/// (`anyhow`, `Box<dyn Error>`); where it does not, match the [`crate::Outcome`].
impl std::error::Error for NotAcquired {}

/// Why a lease, and every lock bound to it, was lost.
///
/// # Examples
///
/// A lost lease is reported by [`Guard::lost`](crate::Guard::lost), with why.
/// The guard's other methods go on answering (its token included), so select
/// on `lost()` next to the work. The loss is final; take the lock again to go
/// on.
///
/// ```no_run
/// use fencelock::{Client, LeaseLost, Outcome};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let Outcome::Acquired(guard) = client.lock("ingest").acquire().await? else { return Ok(()) };
/// let token = guard.fencing_token()?;
/// tokio::select! {
///     _ = ingest(token) => {}
///     reason = guard.lost() => match reason {
///         LeaseLost::Revoked => eprintln!("an operator revoked the lease: stopping"),
///         other => eprintln!("lock lost ({other}): taking it again"),
///     },
/// }
/// # Ok(()) }
/// # async fn ingest(_token: u64) {}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseLost {
    /// The local deadline passed without a confirmed keep-alive: the client can no
    /// longer prove it holds the lease (the server may or may not have expired it);
    /// or the server pushed that it expired the lease (native backend).
    #[error("the lease expired (no keep-alive confirmed it in time)")]
    Expired,
    /// The server no longer knows the lease: it expired there, or someone revoked it.
    #[error("the server no longer knows the lease (expired or revoked)")]
    NotFound,
    /// The lease was revoked: by this client ([`crate::Client::revoke_lease`]), or
    /// by anyone allowed to (its owner, an admin), as the server pushed it (native
    /// backend).
    #[error("the lease was revoked")]
    Revoked,
    /// The client revoked the lease after the last lock on it was released.
    #[error("the lease was closed after its last lock was released")]
    Closed,
}

impl LeaseLost {
    pub(crate) fn label(self) -> &'static str {
        match self {
            LeaseLost::Expired => "expired",
            LeaseLost::NotFound => "not_found",
            LeaseLost::Revoked => "revoked",
            LeaseLost::Closed => "closed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Contention ends a caller that uses `?` with a boxed error, saying why.
    #[test]
    fn not_acquired_goes_through_a_question_mark() {
        fn take(outcome: crate::Outcome<()>) -> Result<(), Box<dyn std::error::Error>> {
            outcome.acquired()?;
            Ok(())
        }
        let busy = crate::Outcome::Busy { holder_lease: Some(3), holder_token: Some(9), reopens_in: None, waiters: 0 };
        assert_eq!(take(busy).unwrap_err().to_string(), "busy (held by lease 3 under token 9)");
        assert_eq!(take(crate::Outcome::TimedOut).unwrap_err().to_string(), "wait timed out");
        assert!(take(crate::Outcome::Acquired(())).is_ok());
    }

    #[test]
    fn server_codes_map_to_variants() {
        let cases = [
            (Status::invalid_argument("bad ttl"), Error::InvalidArgument("bad ttl".into())),
            (Status::not_found("lease 7"), Error::LeaseNotFound("lease 7".into())),
            (Status::unavailable("no leader"), Error::Unavailable("no leader".into())),
            (Status::deadline_exceeded("late"), Error::Timeout),
            (Status::internal("boom"), Error::Server("Internal: boom".into())),
            (Status::resource_exhausted("leases quota"), Error::LimitReached("leases quota".into())),
        ];
        for (status, want) in cases {
            assert_eq!(Error::from_status(&status), want, "{status:?}");
        }
    }

    #[test]
    fn only_unavailable_is_retried_when_the_server_answered() {
        assert!(is_retryable(&Status::unavailable("no leader")));
        // Sent by the server (no source): a real answer, not retried.
        assert!(!is_retryable(&Status::internal("boom")));
        assert!(!is_retryable(&Status::unknown("?")));
        assert!(!is_retryable(&Status::not_found("gone")));
        assert!(!is_retryable(&Status::invalid_argument("bad")));
    }

    #[test]
    fn local_transport_failures_are_retried() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let status = Status::from_error(Box::new(io));
        assert_eq!(status.code(), Code::Unknown);
        assert!(is_retryable(&status));
    }

    #[test]
    fn local_deadline_is_a_timeout_and_not_retried() {
        let status = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert!(!is_retryable(&status));
        assert_eq!(Error::from_status(&status), Error::Timeout);
    }

    /// Rule: UNAUTHENTICATED and PERMISSION_DENIED are never retried (not even
    /// with a transport source), and map to their own errors, which say
    /// "not authenticated: <server message>" / "permission denied: <server message>".
    #[test]
    fn auth_refusals_are_not_retried_and_say_what_they_are() {
        let unauth = Status::unauthenticated("token missing");
        let denied = Status::permission_denied("role reader may not acquire");
        assert!(!is_retryable(&unauth));
        assert!(!is_retryable(&denied));
        // A status with a source (made by a local layer) is retried for the
        // codes of a broken transport, but never as an auth refusal.
        for code in [Code::Unauthenticated, Code::PermissionDenied] {
            let mut local = Status::new(code, "from a layer");
            local.set_source(Arc::new(std::io::Error::other("local")));
            assert!(!is_retryable(&local), "{code:?}");
        }
        assert_eq!(Error::from_status(&unauth), Error::Unauthenticated("token missing".into()));
        let twice = Status::permission_denied("permission denied: w may not acquire lock \"x\"");
        assert_eq!(
            Error::from_status(&twice).to_string(),
            "permission denied: w may not acquire lock \"x\"",
            "said once"
        );
        assert_eq!(
            Error::from_http_refusal(401, "not authenticated: bad").unwrap().to_string(),
            "not authenticated: bad"
        );
        assert!(Error::from_http_refusal(500, "x").is_none());
        assert_eq!(Error::from_status(&denied), Error::PermissionDenied("role reader may not acquire".into()));
        assert_eq!(Error::from_status(&unauth).to_string(), "not authenticated: token missing");
        assert_eq!(Error::from_status(&denied).to_string(), "permission denied: role reader may not acquire");
        assert!(!Error::from_status(&unauth).is_transient());
        assert!(!Error::from_status(&denied).is_transient());
    }

    #[test]
    fn transient_errors_are_the_unknown_outcomes() {
        assert!(Error::Timeout.is_transient());
        assert!(Error::Unavailable("x".into()).is_transient());
        assert!(!Error::LeaseNotFound("x".into()).is_transient());
    }
}
