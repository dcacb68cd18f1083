//! The advisory-lock mode of the PostgreSQL backend (`?mode=advisory`):
//! PostgreSQL's own lock manager, through a transaction-scoped advisory lock.
//! **Unfenced**: there is no token, and nothing expires a lock whose holder
//! stopped working but whose connection stays open.
//!
//! Where it sits: [`super::PgBackend`] in `mode=advisory`. No schema, no shared
//! connection: each acquire opens its own connection, and a granted lock keeps
//! it (one connection per held or waiting lock: mind `max_connections`).
//!
//! # Recipe
//! The key is a 64-bit hash of the name computed by the server,
//! `hashtextextended(name, 0)` (the hash of hash partitioning, so it does not
//! change between server versions). On the lock's own connection, the setup up
//! to `BEGIN` (and `lock_timeout`) in one round trip:
//!
//! ```sql
//! SET idle_in_transaction_session_timeout = 0;     -- the open transaction is the lock
//! SET client_connection_check_interval = 1000;     -- PostgreSQL 14+: a vanished client's wait ends
//! BEGIN;
//! -- a try (wait zero):
//! SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)), pg_backend_pid();
//! -- or a wait:
//! SET LOCAL lock_timeout = <wait left, ms>;
//! SELECT pg_backend_pid(), pg_advisory_xact_lock(hashtextextended($1, 0));  -- 55P03: timed out
//! SELECT 1;                                        -- after a wait: the lease counts from here
//! ```
//!
//! A reader (`LockOptions::shared`) takes `pg_try_advisory_xact_lock_shared`
//! or `pg_advisory_xact_lock_shared` instead. The lock manager grants a
//! request only if it conflicts with neither the holders nor the requests
//! already waiting, so a waiting writer blocks later readers (strict FIFO
//! across modes), and a try of either mode is refused while a conflicting
//! request waits. No downgrade (a transaction-scoped lock cannot be let go
//! before its transaction ends), no semaphores.
//!
//! The transaction then stays open, idle: it holds the lock until it ends
//! (`ROLLBACK` on release) or the connection does. It has no transaction id and
//! holds no snapshot between statements (READ COMMITTED), so it does not hold
//! back vacuum. The guard's lease id is the server process id holding the lock
//! (`pg_backend_pid()`), which `pg_terminate_backend` takes.
//!
//! A renewal is a `SELECT 1` round trip on that connection: answered, the
//! transaction is still open and the lock held (`Confirmed`); any error from the
//! server aborts the transaction, and a closed connection ended it, so the lock
//! is gone (`Gone`); no answer in time is an error the watchdog retries until the
//! guard's deadline. Release: `SELECT 1` (still held?), then `ROLLBACK`, then
//! close. A dropped waiting acquire sends a cancel request (PostgreSQL's
//! out-of-band cancel, on a connection of its own) and closes the connection, so
//! it leaves the queue at once.
//!
//! # Guarantees, and what is not guaranteed
//! * Mutual exclusion by PostgreSQL's lock manager, among all sessions of the
//!   database that take the same 64-bit key. Two names whose hashes collide are
//!   one lock (they exclude each other: safe, but a spurious contention); other
//!   software using one-key advisory locks in the same database shares the key
//!   space.
//! * FIFO: the lock manager queues waiters in arrival order and grants the lock
//!   to the first of them on release; a new request never overtakes a queued
//!   conflicting one. A waiter is woken by the server (push).
//! * No fencing token ([`Fencing::None`]): [`LockOptions::require_fencing`] is
//!   refused with [`Error::Unsupported`]. A holder that pauses past its deadline
//!   cannot know whether it still holds the lock, and the resource cannot tell.
//! * No expiry by the server (`server_ttl: false`): the lock lasts as long as its
//!   connection. The guard's [`Guard::lost`] still fires when renewals stop
//!   being answered (at its deadline), but the server keeps the lock until the
//!   connection ends: a partitioned holder blocks the lock until TCP gives up on
//!   the connection (or an administrator terminates it), and a paused holder
//!   with a live connection keeps it forever.
//! * A crash of the server ends every lock (the sessions end); nothing is
//!   durable.
//!
//! [`Fencing::None`]: super::super::Fencing::None
//! [`LockOptions::require_fencing`]: crate::LockOptions::require_fencing

use std::sync::Arc;
use std::time::Duration;

use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{CancelToken, Client, Row};

use super::tls::{PgConfig as Config, PgTls};

use super::{backend_error, bounded, open, spawn_detached, OpenFailed, STATEMENT_TIMEOUT};
use crate::backend::Outcome;
use crate::backend::{BoxFuture, Capabilities, Fencing, Guard, Held, KeptLease, Renew, Renewed};
use crate::error::Error;
use crate::types::{LockMode, LockOptions};

/// What the advisory mode guarantees (see the module docs):
/// * `fencing: None`, `durable_tokens: false`: no token at all;
/// * `fifo: true`, `push_wakeup: true`: PostgreSQL's lock manager queues and
///   wakes waiters in order;
/// * `server_ttl: false`: the lock lasts as long as its connection;
/// * `shared: true`: readers take the shared advisory lock (strict FIFO
///   across modes, by the lock manager); `semaphores: false`;
/// * `survives_failover: false`, `lock_delay: false`, `min_ttl`: 100 ms (the
///   TTL only paces the `SELECT 1` keep-alives and the guard's deadline).
pub const CAPABILITIES: Capabilities = Capabilities {
    fencing: Fencing::None,
    durable_tokens: false,
    fifo: true,
    push_wakeup: true,
    server_ttl: false,
    survives_failover: false,
    lock_delay: false,
    holder_identity: false,
    election: false,
    shared: true,
    semaphores: false,
    hold_at_least: false,
    once_per: false,
    multi_lock: false,
    min_ttl: Duration::from_millis(100),
};

/// How long past the wait the client waits for the server's `lock_timeout` to
/// answer before it cancels the wait itself.
const WAIT_GRACE: Duration = Duration::from_secs(2);

/// The advisory mode of one [`super::PgBackend`]: just the connection config.
pub(super) struct AdvisoryMode {
    config: Config,
    /// The server has `client_connection_check_interval` (PostgreSQL 14+).
    checks_clients: bool,
}

impl AdvisoryMode {
    /// Checks that the database is reachable (one connection, closed again).
    pub async fn connect(config: Config) -> Result<AdvisoryMode, Error> {
        let (client, _driver) = open(&config).await.map_err(|e| e.connect(""))?;
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let sql = "SELECT current_setting('server_version_num')::int";
        let row = bounded("server version", by, client.query_typed_one(sql, &[]))
            .await
            .map_err(|e| e.while_connecting(""))?;
        let version: i32 = column(&row, 0)?;
        Ok(AdvisoryMode { config, checks_clients: version >= 140_000 })
    }

    /// Takes `name` (already admitted) on a connection of its own.
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Outcome<Guard>, Error> {
        let deadline = crate::clock::now() + opts.wait;
        let waiting = !opts.wait.is_zero();
        let session = self.session(waiting.then_some(deadline)).await?;
        let shared = opts.mode == LockMode::Shared;
        if waiting {
            self.wait(session, name, shared, opts.ttl, deadline).await
        } else {
            self.try_once(session, name, shared, opts.ttl).await
        }
    }

    /// A fresh connection, set up for holding a transaction open, with the
    /// transaction begun (and, for a wait until `deadline`, its `lock_timeout`
    /// set to the wait left once connected): one round trip after the handshake.
    async fn session(&self, deadline: Option<Instant>) -> Result<Session, Error> {
        let (client, driver) = open(&self.config).await.map_err(OpenFailed::backend)?;
        let session = Session { client, driver };
        let mut setup = String::from("SET idle_in_transaction_session_timeout = 0; ");
        if self.checks_clients {
            setup.push_str("SET client_connection_check_interval = 1000; ");
        }
        setup.push_str("BEGIN");
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(crate::clock::now());
            // Zero would mean "no timeout": wait at least a millisecond.
            let left_ms = left.as_nanos().div_ceil(1_000_000).max(1);
            setup.push_str(&format!("; SET LOCAL lock_timeout = {left_ms}"));
        }
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        bounded("session setup", by, session.client.batch_execute(&setup)).await?;
        Ok(session)
    }

    async fn try_once(
        &self,
        session: Session,
        name: &str,
        shared: bool,
        ttl: Duration,
    ) -> Result<Outcome<Guard>, Error> {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let sql = if shared { TRY_LOCK_SHARED_SQL } else { TRY_LOCK_SQL };
        let sent = crate::clock::now();
        let row = bounded("try lock", by, session.client.query_typed_one(sql, &[(&name, Type::TEXT)])).await?;
        let (got, pid): (bool, i32) = (column(&row, 0)?, column(&row, 1)?);
        if got {
            return Ok(Outcome::Acquired(guard(session, name, pid, ttl, sent)));
        }
        // What the lock manager says about the holder and the queue; a failure
        // here leaves the answer "busy" without details.
        let info = bounded("lock info", by, session.client.query_typed_one(INFO_SQL, &[(&name, Type::TEXT)])).await;
        let (holder, waiters) = match info {
            Ok(row) => (column::<Option<i32>>(&row, 0)?, column::<i64>(&row, 1)?),
            Err(_) => (None, 0),
        };
        Ok(Outcome::Busy {
            holder_lease: holder.and_then(|pid| u64::try_from(pid).ok()),
            holder_token: None,
            reopens_in: None,
            waiters: u32::try_from(waiters).unwrap_or(u32::MAX),
        })
    }

    async fn wait(
        &self,
        session: Session,
        name: &str,
        shared: bool,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Outcome<Guard>, Error> {
        let mut cancel = CancelOnDrop::new(&session, self.config.tls());
        let sql = if shared { LOCK_SHARED_SQL } else { LOCK_SQL };
        let waited =
            tokio::time::timeout_at(deadline + WAIT_GRACE, session.client.query_typed_one(sql, &[(&name, Type::TEXT)]))
                .await;
        let row = match waited {
            Ok(Ok(row)) => row,
            Ok(Err(e)) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                cancel.disarm(); // the server ended the wait
                return Ok(Outcome::TimedOut);
            }
            Ok(Err(e)) => return Err(backend_error("lock", e)),
            Err(_) => return Ok(Outcome::TimedOut), // `cancel` withdraws the wait
        };
        cancel.disarm();
        let pid: i32 = column(&row, 0)?;
        // The wait may have lasted longer than the TTL: the lease counts from a
        // round trip sent after the grant.
        let sent = crate::clock::now();
        bounded("confirm", sent + STATEMENT_TIMEOUT, session.client.batch_execute("SELECT 1")).await?;
        Ok(Outcome::Acquired(guard(session, name, pid, ttl, sent)))
    }
}

// The statements, one `.sql` file each in `advisory/` (no table: nothing is
// spliced in; the lock name is always the bound parameter `$1`).
const TRY_LOCK_SQL: &str = include_str!("advisory/try_lock.sql");
const TRY_LOCK_SHARED_SQL: &str = include_str!("advisory/try_lock_shared.sql");
const LOCK_SQL: &str = include_str!("advisory/lock.sql");
const LOCK_SHARED_SQL: &str = include_str!("advisory/lock_shared.sql");
/// The holder's process id and the number of waiters of `$1`'s key, from
/// `pg_locks`.
const INFO_SQL: &str = include_str!("advisory/holder_info.sql");

/// One lock's connection.
struct Session {
    client: Client,
    driver: JoinHandle<()>,
}

/// The guard of a lock held by `session`'s transaction, confirmed by a statement
/// sent at `sent`.
fn guard(session: Session, name: &str, pid: i32, ttl: Duration, sent: Instant) -> Guard {
    let session = Arc::new(session);
    let lease_id = u64::try_from(pid).unwrap_or(0);
    let kept = KeptLease::start(lease_id, ttl, sent, Arc::new(Ping { session: session.clone(), ttl }));
    let watch = kept.watch();
    Guard::new(name.to_string(), None, "postgres", watch, Box::new(AdvisoryHeld { kept, session }))
}

/// While armed, dropping it cancels the statement running on the session (out
/// of band) and closes the connection.
struct CancelOnDrop {
    token: Option<CancelToken>,
    driver: AbortHandle,
    /// The connection's TLS: a cancel request opens a connection of its own.
    tls: PgTls,
}

impl CancelOnDrop {
    fn new(session: &Session, tls: PgTls) -> CancelOnDrop {
        CancelOnDrop { token: Some(session.client.cancel_token()), driver: session.driver.abort_handle(), tls }
    }

    fn disarm(&mut self) {
        self.token = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.driver.abort();
            let tls = self.tls.clone();
            spawn_detached(async move {
                if let Err(e) = token.cancel_query(tls).await {
                    tracing::debug!(error = %super::describe(&e), "fencelock: postgres: cancelling a wait failed");
                }
            });
        }
    }
}

/// The keep-alive: a round trip on the lock's connection.
struct Ping {
    session: Arc<Session>,
    ttl: Duration,
}

impl Renew for Ping {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            match still_held(&self.session, round_end).await? {
                true => Ok(Renewed::Confirmed(Some(self.ttl))),
                false => Ok(Renewed::Gone),
            }
        })
    }
}

/// Is the session's transaction (and so the lock) still there? `Ok(false)` if
/// the connection closed or the server reported an error (which aborts the
/// transaction); an error if there was no answer by `by`.
async fn still_held(session: &Session, by: Instant) -> Result<bool, Error> {
    if session.client.is_closed() {
        return Ok(false);
    }
    match tokio::time::timeout_at(by, session.client.batch_execute("SELECT 1")).await {
        Ok(Ok(())) => Ok(true),
        Ok(Err(e)) if e.is_closed() || e.as_db_error().is_some() => Ok(false),
        Ok(Err(e)) => Err(backend_error("keep-alive", e)),
        Err(_) => Err(Error::backend("postgres", "keep-alive: no answer in time")),
    }
}

/// The `Held` part of an advisory guard: the watchdog and the connection.
struct AdvisoryHeld {
    kept: KeptLease,
    session: Arc<Session>,
}

impl Held for AdvisoryHeld {
    /// `Ok(true)` if the transaction was still open (so the lock held) before
    /// the `ROLLBACK`; the connection is closed either way.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let by = crate::clock::now() + STATEMENT_TIMEOUT;
            let held = still_held(&self.session, by).await?;
            if held {
                // If this fails the connection's end (below) frees the lock.
                let _ = bounded("rollback", by, self.session.client.batch_execute("ROLLBACK")).await;
            }
            drop(self.kept);
            Ok(held)
        })
    }

    fn release_in_background(self: Box<Self>) {
        spawn_detached(async move {
            if let Err(e) = self.release().await {
                tracing::debug!(error = %e, "fencelock: postgres: background release failed");
            }
        });
    }
}

/// Column `i` of `row`, or [`Error::Backend`].
fn column<'r, T: tokio_postgres::types::FromSql<'r>>(row: &'r Row, i: usize) -> Result<T, Error> {
    row.try_get(i).map_err(|e| Error::backend_caused("postgres", format!("unexpected column {i} in the answer"), e))
}
