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
//! machinery of [`super::Guard`] and `KeptLease`.
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
pub mod lease;
mod listen;
mod tls;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, Config};

use self::tls::PgConfig;

use super::election::{self, leadership_of};
use super::{BackendUrl, BoxFuture, Capabilities, Guard, Leader, LeaderStream, Leadership, LockBackend};
use crate::backend::Acquire;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};

/// The table of the lease-table mode when the URL names none.
pub const DEFAULT_TABLE: &str = "fencelock_locks";

/// Longest `table` name: the derived names (`<table>_waiters_id_seq`, the
/// longest) must fit PostgreSQL's 63-byte identifiers.
const MAX_TABLE_LEN: usize = 40;

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

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Acquire<Guard>, Error>> {
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
    ) -> BoxFuture<'a, Result<Acquire<Leadership>, Error>> {
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

/// What the URL says: the connection config for tokio-postgres, and the table
/// of the lease-table mode (`None`: advisory mode).
struct Settings {
    config: PgConfig,
    table: Option<Table>,
}

impl Settings {
    fn from_url(url: &BackendUrl) -> Result<Settings, Error> {
        let advisory = match url.param("mode") {
            None | Some("lease") => false,
            Some("advisory") => true,
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "postgres: mode={other:?} is not a mode (lease or advisory)"
                )))
            }
        };
        let table = match (advisory, url.param("table")) {
            (true, Some(_)) => {
                return Err(Error::InvalidArgument("postgres: table= applies to the lease mode only".into()))
            }
            (true, None) => None,
            (false, table) => Some(Table::new(table.unwrap_or(DEFAULT_TABLE))?),
        };
        let stripped = strip_params(&url.raw, &["mode", "table", tls::PARAMS[0], tls::PARAMS[1]]);
        let config: Config = stripped.parse().map_err(|e| {
            // The driver's message may quote the URL: say it without the password.
            let shown = describe(&e).replace(&url.raw, &url.redacted());
            Error::InvalidArgument(format!("postgres: bad connection url {url}: {shown}"))
        })?;
        let mut config = PgConfig::new(config, url)?;
        let inner = config.inner_mut();
        if inner.get_connect_timeout().is_none() {
            inner.connect_timeout(CONNECT_TIMEOUT);
        }
        if inner.get_application_name().is_none() {
            inner.application_name("fencelock");
        }
        Ok(Settings { config, table })
    }
}

/// The table name of the lease-table mode: a plain lower-case SQL identifier
/// (it is spliced into the DDL and the statements, quoted), at most 40 bytes.
fn check_table(table: &str) -> Result<&str, Error> {
    let mut chars = table.chars();
    let starts_well = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !starts_well || !rest_ok || table.len() > MAX_TABLE_LEN {
        return Err(Error::InvalidArgument(format!(
            "postgres: table={table:?} must be a lower-case identifier ([a-z_][a-z0-9_]*) \
             of at most {MAX_TABLE_LEN} bytes"
        )));
    }
    Ok(table)
}

/// The table of the lease-table mode: a name checked by [`check_table`] (a
/// plain lower-case identifier, `[a-z_][a-z0-9_]*`, at most 40 bytes), the
/// only value ever spliced into SQL. It is spliced in double quotes (and, for
/// the DDL's advisory lock key, in single quotes), which such a name cannot
/// end, and it names no keyword that matters inside quotes; every other value
/// is a bound parameter (`$1`, …). [`Table::new`] is the only way to make one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Table(String);

impl Table {
    /// `name` if it is a valid table name, else [`Error::InvalidArgument`].
    pub(super) fn new(name: &str) -> Result<Table, Error> {
        Ok(Table(check_table(name)?.to_string()))
    }

    pub(super) fn as_str(&self) -> &str {
        &self.0
    }

    /// A statement of a `.sql` file with every `{table}` replaced by this
    /// name (the files use no other placeholder).
    pub(super) fn render(&self, template: &str) -> String {
        template.replace("{table}", &self.0)
    }
}

/// `raw` without the query parameters named in `keys` (tokio-postgres refuses
/// parameters it does not know).
fn strip_params(raw: &str, keys: &[&str]) -> String {
    let Some((base, query)) = raw.split_once('?') else {
        return raw.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && !keys.contains(&pair.split_once('=').map_or(*pair, |(k, _)| k)))
        .collect();
    if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// A connection that could not be opened: what to say, and the driver's error
/// where there was one (none when the handshake did not finish in time).
#[derive(Debug)]
pub(super) struct OpenFailed {
    text: String,
    source: Option<tokio_postgres::Error>,
}

impl OpenFailed {
    /// The driver refused or failed the connection: `e` is the source, and
    /// its text stays there (not in the message).
    pub(super) fn by(e: tokio_postgres::Error) -> OpenFailed {
        OpenFailed { text: "the connection failed".into(), source: Some(e) }
    }

    /// No answer (`what`: " to LISTEN", or "" for the handshake) within `limit`.
    pub(super) fn no_answer(what: &str, limit: Duration) -> OpenFailed {
        OpenFailed { text: format!("no answer{what} within {} ms", limit.as_millis()), source: None }
    }

    /// As [`Error::Connect`] (at connect time), `context` saying which connection.
    pub(super) fn connect(self, context: &str) -> Error {
        let message = format!("postgres: {context}{}", self.text);
        match self.source {
            Some(e) => Error::connect_caused(message, e),
            None => Error::connect(message),
        }
    }

    /// As [`Error::Backend`] (a connection opened later, for an operation).
    pub(super) fn backend(self) -> Error {
        self.backend_while("")
    }

    /// As [`Error::Backend`], `context` saying what the connection was for.
    pub(super) fn backend_while(self, context: &str) -> Error {
        let message = format!("{context}{}", self.text);
        match self.source {
            Some(e) => Error::backend_caused("postgres", message, e),
            None => Error::backend("postgres", message),
        }
    }
}

impl std::fmt::Display for OpenFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Opens one connection (the whole handshake bounded by the config's
/// `connect_timeout`) and spawns the task that drives it.
async fn open(config: &PgConfig) -> Result<(Client, JoinHandle<()>), OpenFailed> {
    let limit = config.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT);
    let (client, connection) = match tokio::time::timeout(limit, config.connect()).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Err(OpenFailed::by(e)),
        Err(_) => return Err(OpenFailed::no_answer("", limit)),
    };
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %describe(&e), "fencelock: postgres connection ended");
        }
    });
    Ok((client, driver))
}

/// Opens and closes one connection, so that a refused password or a failed
/// TLS handshake at connect is an [`Error::Security`] that says so, and any
/// other failure an [`Error::Connect`].
async fn probe(config: &PgConfig) -> Result<(), Error> {
    let limit = config.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT);
    match tokio::time::timeout(limit, config.connect()).await {
        Ok(Ok(_closed_on_drop)) => Ok(()),
        Ok(Err(e)) => Err(connect_error(e)),
        Err(_) => Err(Error::connect(format!("postgres: no answer within {} ms", limit.as_millis()))),
    }
}

/// A failed connection attempt as [`Error::Security`] (authentication
/// refused, no `pg_hba.conf` entry for this user or encryption, a failed TLS
/// handshake) or [`Error::Connect`].
fn connect_error(e: tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    if let Some(db) = e.as_db_error() {
        let refused = [SqlState::INVALID_PASSWORD, SqlState::INVALID_AUTHORIZATION_SPECIFICATION];
        if refused.contains(db.code()) {
            return Error::security(format!("postgres: authentication refused: {}", db.message()), db.clone());
        }
    }
    if let Some(cause) = super::tls::rustls_cause(&e) {
        return Error::security(format!("postgres: TLS handshake failed: {cause}"), cause.clone());
    }
    let text = describe(&e);
    if text.contains("TLS") {
        return Error::security(format!("postgres: {text}"), e);
    }
    Error::connect_caused("postgres: the connection failed", e)
}

/// A tokio-postgres error with the server's message, if it sent one.
fn describe(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// [`Error::Backend`] for a failed `what`, caused by the driver's `e` (its
/// text, and the server's message, are in the source chain).
fn backend_error(what: &str, e: tokio_postgres::Error) -> Error {
    Error::backend_caused("postgres", what, e)
}

/// Runs `f` until `by`: [`Error::Backend`] if it has not finished by then (the
/// statement may still run on the server: callers that could leave a grant
/// behind clean up by owner).
async fn bounded<T>(
    what: &str,
    by: Instant,
    f: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout_at(by, f).await {
        Ok(result) => result.map_err(|e| backend_error(what, e)),
        Err(_) => Err(Error::backend("postgres", format!("{what}: no answer in time"))),
    }
}

/// Spawns `f` on the current runtime, if there is one (a guard dropped outside
/// any runtime leaves its lock to expire instead).
fn spawn_detached(f: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(f);
    }
}

/// A task that is aborted when this handle is dropped.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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

    #[test]
    fn own_parameters_are_stripped_and_others_kept() {
        let strip = |raw| strip_params(raw, &["mode", "table"]);
        assert_eq!(strip("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(strip("postgres://u@h/db?mode=advisory"), "postgres://u@h/db");
        assert_eq!(strip("postgres://u@h/db?table=t&connect_timeout=2&mode"), "postgres://u@h/db?connect_timeout=2");
        assert_eq!(strip("postgres://u@h/db?application_name=x&table=t"), "postgres://u@h/db?application_name=x");
    }

    #[test]
    fn settings_pick_the_mode_and_check_the_table() {
        let settings = |raw: &str| Settings::from_url(&BackendUrl::parse(raw).unwrap());
        let lease = settings("postgres://u@h:1/db").unwrap();
        assert_eq!(lease.table.as_ref().map(Table::as_str), Some(DEFAULT_TABLE));
        assert_eq!(lease.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(lease.config.get_application_name(), Some("fencelock"));
        let named = settings("postgres://u@h:1/db?table=jobs_locks&connect_timeout=2&application_name=me").unwrap();
        assert_eq!(named.table.as_ref().map(Table::as_str), Some("jobs_locks"));
        assert_eq!(named.config.get_connect_timeout(), Some(&Duration::from_secs(2)));
        assert_eq!(named.config.get_application_name(), Some("me"));
        assert!(settings("postgres://u@h:1/db?mode=advisory").unwrap().table.is_none());
        for bad in [
            "postgres://u@h/db?mode=session",
            "postgres://u@h/db?mode=advisory&table=t",
            "postgres://u@h/db?table=Locks",
            "postgres://u@h/db?table=a;drop",
            "postgres://u@h/db?table=",
            "postgres://u@h/db?table=1a",
            "postgres://u@h/db?connect_timeout=soon",
        ] {
            assert!(matches!(settings(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
        assert!(check_table(&"t".repeat(MAX_TABLE_LEN)).is_ok());
        assert!(check_table(&"t".repeat(MAX_TABLE_LEN + 1)).is_err());
    }
}
