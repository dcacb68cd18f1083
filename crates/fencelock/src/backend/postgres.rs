//! PostgreSQL as a lock service, in two modes chosen by the URL parameter
//! `mode`:
//!
//! | URL | mode | fencing | expiry |
//! |---|---|---|---|
//! | `postgres://u@h:p/db[?table=fencelock_locks]` | lease table ([`lease`]) | global tokens | the database's clock |
//! | `postgres://u@h:p/db?mode=advisory` | advisory locks ([`advisory`]) | none | none: ends with its connection |
//!
//! Where it sits: one of the backends behind [`super::connect`] (cargo feature
//! `postgres`). [`PgBackend`] serves both modes with one [`LockBackend`]
//! implementation; everything else (guards, watchdog, loss) is the shared
//! machinery of [`super::Guard`] and `KeptLease`. Laid out by concern:
//! `params` (the URL and the checked table name), `conn` (opening a
//! connection, driver errors), `tls`, `listen` (the `LISTEN` connection of
//! the lease mode), and one module per mode, each laid out the same way.
//!
//! # The URL
//! Everything but this backend's own parameters (`mode`, `table`) goes to
//! tokio-postgres unchanged, so its connection options work
//! (`connect_timeout`, `application_name`, `options`, several hosts with
//! `target_session_attrs=read-write`, …), except `sslmode` and `sslrootcert`,
//! which this backend reads itself (libpq's meaning, on rustls: see `tls`;
//! `require` encrypts without checking the server, `verify-full` checks the
//! chain and the host name). A wrong password or a failed handshake at
//! connect is [`Error::Security`] (one extra connection at connect tells).
//! Defaults added when the URL does not set them:
//! `connect_timeout=5s` (it bounds the whole connection handshake, not only
//! the TCP connect) and `application_name=fencelock`.
//!
//! # Lease-table mode (default)
//! A table with one permanent row per lock (holder, token, expiry), a global
//! token sequence drawn only after the lock's row is locked, expiry decided by
//! the database's `clock_timestamp()`, a FIFO queue table, and waiters woken by
//! `LISTEN/NOTIFY`. Tokens are fenced globally and durable. A holder's
//! identity and value are a row of a holders table, and leader election
//! works (the leader is the holder, its term the token; observers are woken
//! by `NOTIFY` and read the holder). Two connections per [`PgBackend`] (one
//! for statements, one listening), whatever the number of locks or
//! observers. See [`lease`] for the SQL. Read-write locks and semaphores:
//! shared holders in a table of their own, admitted from the same queue under
//! the lock row's lock (`lease/shared.rs`).
//!
//! # Advisory mode
//! `pg_advisory_xact_lock` on a 64-bit hash of the name, in an open
//! transaction on a dedicated connection per held or waiting lock. **Unfenced**:
//! no token, and no expiry by the database (a paused holder whose connection
//! stays open keeps the lock forever), no holder identity, no election.
//! Readers take the shared advisory lock; no semaphores. See [`advisory`].
//!
//! # What neither mode gives
//! Fail-over: a lock lives in one primary. With synchronous replication
//! (`synchronous_standby_names` and `synchronous_commit=on` or stronger) a grant
//! of the lease-table mode is on a standby before it is acknowledged, and a
//! promoted standby keeps both the lock and the token sequence; this backend does
//! not check that configuration, so it declares `survives_failover: false`.

pub mod advisory;
mod conn;
pub mod lease;
mod listen;
mod params;
mod tls;

use std::fmt;
use std::time::Duration;

use super::election::{self, leadership_of};
use super::{BackendUrl, BoxFuture, Capabilities, Guard, Leader, LeaderStream, Leadership, LockBackend};
use crate::backend::Outcome;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};
use conn::{backend_error, bounded, describe, open, probe, spawn_detached, AbortOnDrop, OpenFailed};
use params::{Settings, Table};

pub use params::DEFAULT_TABLE;

/// Connection handshake limit when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest any one statement may go unanswered before the caller gets an
/// error (a renewal is bounded by its round instead).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A PostgreSQL lock service, in the mode its URL chose. See the [module
/// docs](self).
pub struct PgBackend {
    mode: Mode,
}

enum Mode {
    Lease(lease::LeaseMode),
    /// Boxed: a connection config is large, the lease mode's is behind an `Arc`.
    Advisory(Box<advisory::AdvisoryMode>),
}

impl PgBackend {
    /// Connects as `url` says: [`Error::InvalidArgument`] for an unknown `mode`,
    /// a bad `table` or a connection string tokio-postgres rejects;
    /// [`Error::Connect`] if the database cannot be reached (within the
    /// `connect_timeout`, 5 s by default); [`Error::Backend`] if the lease-table
    /// schema cannot be created.
    pub async fn connect(url: &BackendUrl) -> Result<Self, Error> {
        let settings = Settings::from_url(url)?;
        probe(&settings.config).await?;
        let mode = match settings.table {
            Some(table) => Mode::Lease(lease::LeaseMode::connect(settings.config, table).await?),
            None => Mode::Advisory(Box::new(advisory::AdvisoryMode::connect(settings.config).await?)),
        };
        Ok(PgBackend { mode })
    }
}

impl fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mode {
            Mode::Lease(m) => f.debug_struct("PgBackend").field("mode", &"lease").field("table", &m.table()).finish(),
            Mode::Advisory(_) => f.debug_struct("PgBackend").field("mode", &"advisory").finish(),
        }
    }
}

impl LockBackend for PgBackend {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    /// Lease-table mode: see [`lease::CAPABILITIES`]; advisory mode: see
    /// [`advisory::CAPABILITIES`].
    fn capabilities(&self) -> Capabilities {
        match &self.mode {
            Mode::Lease(_) => lease::CAPABILITIES,
            Mode::Advisory(_) => advisory::CAPABILITIES,
        }
    }

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>> {
        Box::pin(async move {
            self.capabilities().admit(self.kind(), name, opts)?;
            match &self.mode {
                Mode::Lease(m) => m.acquire(name, opts).await,
                Mode::Advisory(m) => m.acquire(name, opts).await,
            }
        })
    }

    /// Lease-table mode: an acquire that fails with [`Error::LeaseNotFound`]
    /// if its queue entry expires while it waits. Advisory mode has no tokens
    /// to be terms: [`Error::Unsupported`].
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<Leadership>, Error>> {
        Box::pin(async move {
            let Mode::Lease(m) = &self.mode else {
                return Err(election::unsupported(self.kind()));
            };
            self.capabilities().admit(self.kind(), name, opts)?;
            leadership_of(m.campaign(name, opts).await?, &opts.value)
        })
    }

    /// Lease-table mode: the live holder, with its identity and value.
    fn leader<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Leader>, Error>> {
        Box::pin(async move {
            match &self.mode {
                Mode::Lease(m) => m.leader(name).await,
                Mode::Advisory(_) => Err(election::unsupported(self.kind())),
            }
        })
    }

    /// Lease-table mode: notifications and reads of the holder (see
    /// `postgres/lease/election.rs`).
    fn observe<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LeaderStream, Error>> {
        Box::pin(async move {
            match &self.mode {
                Mode::Lease(m) => m.observe(name).await,
                Mode::Advisory(_) => Err(election::unsupported(self.kind())),
            }
        })
    }

    /// Lease-table mode: is `token` the live grant of `name` by the database's
    /// clock? Advisory mode has no tokens: [`Error::Unsupported`].
    fn check<'a>(&'a self, name: &'a str, token: u64) -> BoxFuture<'a, Result<CheckResult, Error>> {
        Box::pin(async move {
            super::check_name(name)?;
            match &self.mode {
                Mode::Lease(m) => m.check(name, token).await,
                Mode::Advisory(_) => Err(Error::Unsupported("postgres advisory mode has no tokens to check".into())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors keep their sources: in both modes (lease table and advisory
    /// locks) no server on the port is an `Error::Connect` whose chain holds
    /// the `tokio_postgres::Error`, and whose message leaves its text to it.
    #[tokio::test]
    async fn a_refused_connection_keeps_the_postgres_error() {
        let port = crate::backend::refused_port();
        for query in ["", "?mode=advisory"] {
            let url = BackendUrl::parse(&format!("postgres://postgres@127.0.0.1:{port}/postgres{query}")).unwrap();
            let err = PgBackend::connect(&url).await.unwrap_err();
            let Error::Connect { message, .. } = &err else { panic!("{query}: {err:?}") };
            assert!(crate::error::caused_by::<tokio_postgres::Error>(&err), "{query}: {err:?}");
            assert!(!message.to_lowercase().contains("refused"), "{query}: {message}");
        }
    }
}
